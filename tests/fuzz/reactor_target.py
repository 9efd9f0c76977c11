"""The blocksync, mempool and bulk reactors as fuzz targets: their decoders, and the reactors
themselves fed whole conversations, with checks.

Shared by the hypothesis tests (tests/adapter/test_fuzz_reactors.py) and the atheris
harnesses (fuzz_blocksync.py, fuzz_mempool.py, fuzz_bulk.py). The other decoders of
reactors/ (pex_wire, chat_wire, which the fleet's reactors use too) are
tests/fuzz/message_target.py's.

* ``check_blocksync``: one message to ``reactors.blocksync.decode``: a failure is
  ``MalformedBlocksyncMessage`` and nothing else; a success encodes back to the very
  same bytes (every field has one encoding); time and memory bounded by the input
  (``message_target.bounded``).
* ``blocksync_session``: a BlocksyncReactor (small bounds) and three FakePeers; each step
  one peer sends a message (built from ``blocksync.MESSAGE``'s declaration, its heights
  chosen among the boundaries, those of the requests pending to it included, or raw), or
  the clock ticks. ``receive`` raises only the reactor's own errors (``BlocksyncError``);
  a peer that made it raise is removed as mconn's default policy would, and a new one
  comes. After every step: requests in flight within ``max_pending`` in all and
  ``max_pending_per_peer`` each, every one of them in the window above our height; every
  kept status plausible; block requests waiting for an answer within
  ``max_pending_per_peer`` per peer; each step in bounded time.
* ``mempool_session``: a MempoolReactor (small bounds) and three FakePeers whose sends
  are accepted or not; each step a peer sends a transaction (from a small pool, so that
  duplicates happen, or raw bytes, too large or refused by ``check_tx``), the node adds
  or removes transactions, the clock moves, or a peer leaves and another comes.
  ``receive`` raises nothing: an invalid transaction is counted (``invalid_txs``) and
  not kept, and its peer stays (as in CometBFT). After every step: the mempool within
  ``max_txs``, each peer's charge within ``max_peer_txs`` and all charges within the
  mempool, each seen set within ``seen_capacity`` and only for connected peers, the
  order within twice the mempool and consistent with it.
* ``check_bulk``: one message to ``reactors.bulk.check``: ``BulkStreamError`` or the
  expected sequence number, bounded.

Imports no hypothesis; Twisted only for the reactors' Clock.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

from construct import GreedyBytes
from twisted.internet import defer, task

from mconn.testing import FakePeer
from reactors import blocksync, bulk
from reactors.blocksync import (
    MESSAGE,
    BlocksyncError,
    BlocksyncReactor,
    BlocksyncType,
    MalformedBlocksyncMessage,
)
from reactors.mempool import MEMPOOL_CHANNEL, MempoolReactor, tx_key

from tests.fuzz.declared import RAW, Chooser, Reader, build_struct, draw_edits, mutate, value
from tests.fuzz.message_target import bounded

#: The body declaration of each blocksync type.
BLOCKSYNC_BODIES = MESSAGE.subcons[1].subcon.cases
UNKNOWN_TYPES = (0x00, 0x06, 0xFF)
#: A height a request pending to the sending peer has (resolved when the message is drawn).
PENDING = object()
HEIGHTS = (PENDING, 1, 0, 2, 3, 40, 2**42, 2**42 + 1, 2**62, 2**63 - 1, 2**64 - 1, RAW)
#: A status's fields: an honest range first.
STATUS_FIELDS = {"base": (1, *HEIGHTS), "height": (40, *HEIGHTS)}
BLOCKS = (b"block", b"", bytes(300), RAW)
#: Steps of one session (the atheris input may run out earlier).
MAX_STEPS = 16


def attach(reactor, clock: task.Clock):
    """The little of a Switch the reactors use: a clock and try_broadcast."""
    reactor.switch = SimpleNamespace(clock=clock, try_broadcast=lambda channel_id, message: {})
    return reactor


# -- blocksync ----------------------------------------------------------------------------------


def check_blocksync(message: bytes):
    """Decode ``message`` with every check; returns ``(kind, fields)`` or the error."""
    outcome = bounded(lambda: blocksync.decode(message), len(message))
    if isinstance(outcome, Exception):
        if type(outcome) is not MalformedBlocksyncMessage:
            raise outcome
        return outcome
    kind, body = outcome
    fields = {name: v for name, v in body.items() if not name.startswith("_")}
    again = blocksync.encode(kind, **fields)
    assert again == message, f"{message.hex()} decodes to {kind!r} {fields}, which encodes to {again.hex()}"
    return kind, fields


def draw_blocksync(chooser: Chooser, pending=()) -> bytes:
    """A blocksync message built from MESSAGE's declaration, each field valid or not;
    ``pending``: heights requested of the sender (a PENDING height is one of them)."""
    known = chooser.number(7) != 7
    kind = chooser.pick(sorted(BLOCKSYNC_BODIES)) if known else chooser.pick(UNKNOWN_TYPES)
    declaration = BLOCKSYNC_BODIES.get(kind, BLOCKSYNC_BODIES[BlocksyncType.BLOCK_RESPONSE])
    fields = {}
    for sub in declaration.subcons:
        if sub.subcon is GreedyBytes:
            fields[sub.name] = value(chooser, BLOCKS, raw_size=40)
        else:
            options = STATUS_FIELDS[sub.name] if kind == BlocksyncType.STATUS_RESPONSE else HEIGHTS
            height = value(chooser, options, raw_size=9)
            if height is PENDING:
                height = chooser.pick(sorted(pending)) if pending else 1
            fields[sub.name] = height
    extra = chooser.blob(2) if chooser.number(7) == 7 else b""
    return mutate(bytes([kind]) + build_struct(declaration, **fields) + extra, draw_edits(chooser))


class BlocksyncSession:
    """A BlocksyncReactor and three peers, driven step by step (see the module docstring)."""

    def __init__(self) -> None:
        self.clock = task.Clock()
        self.reactor = attach(
            BlocksyncReactor(
                {1: b"one"},
                max_pending=12,
                max_pending_per_peer=5,
                max_height=2**42,
                request_timeout=2.0,
                status_interval=0.5,
            ),
            self.clock,
        )
        self.peers = [self._join() for _ in range(3)]
        self.errors = collections.Counter()

    def _join(self) -> FakePeer:
        peer = FakePeer()
        self.reactor.add_peer(peer)
        return peer

    def step(self, chooser: Chooser, raw: bool) -> None:
        index = chooser.pick((0, 0, 0, 1, 2))  # mostly one peer: a conversation, not only openings
        if chooser.number(7) == 7:
            self.clock.advance(chooser.pick((0.5, 2.5, 0.1)))
            bounded(self.reactor._tick, 0)
        else:
            peer = self.peers[index]
            mine = [h for h, (node_id, _) in self.reactor.pending.items() if node_id == peer.node_id]
            message = chooser.blob(40) if raw else draw_blocksync(chooser, mine)
            outcome = bounded(lambda: self.reactor.receive(blocksync.BLOCKSYNC_CHANNEL, peer, message), len(message))
            if isinstance(outcome, Exception):
                if not isinstance(outcome, BlocksyncError):
                    raise outcome
                self.errors[type(outcome).__name__] += 1
                self._drop(index, outcome)
            elif peer.state == "closed":  # stop_for_error: a block not asked for, or a bad one
                self._drop(index, peer.close_reason)
        self.check()

    def _drop(self, index: int, reason) -> None:
        """What the Switch does with a peer whose receive raised: remove it; a new one comes."""
        self.reactor.remove_peer(self.peers[index], reason)
        self.peers[index] = self._join()

    def check(self) -> None:
        reactor = self.reactor
        height = reactor.height
        assert len(reactor.pending) <= reactor.max_pending, reactor.pending
        per_peer = collections.Counter(node_id for node_id, _ in reactor.pending.values())
        assert max(per_peer.values(), default=0) <= reactor.max_pending_per_peer, per_peer
        assert all(height < h <= height + reactor.max_pending for h in reactor.pending), (height, reactor.pending)
        assert set(per_peer) <= {p.node_id for p in self.peers}, "a request pending to a peer that left"
        for _, base, top in reactor.peer_status.values():
            assert base <= top <= reactor.max_height, (base, top)
        assert set(reactor._serving) == {p.node_id for p in self.peers}
        assert all(len(s.waiting) <= reactor.max_pending_per_peer for s in reactor._serving.values())


def blocksync_session(data: bytes) -> BlocksyncSession:
    """Play a session from fuzzer bytes: byte 0, bit 0: raw messages, else built ones."""
    raw = bool(data[:1]) and bool(data[0] & 1)
    chooser = Reader(data[1:])
    session = BlocksyncSession()
    for _ in range(MAX_STEPS):
        if chooser.at >= len(chooser.data):
            break
        session.step(chooser, raw)
    return session


def fuzz_blocksync(data: bytes) -> None:
    """The atheris target: byte 0, bit 1: the rest is one message for the decoder alone;
    else a session (``blocksync_session``)."""
    if data[:1] and data[0] & 2:
        check_blocksync(data[1:])
    else:
        blocksync_session(data)


# -- mempool ------------------------------------------------------------------------------------


def check_tx(tx: bytes) -> None:
    if tx.startswith(b"bad"):
        raise ValueError(f"a bad transaction: {tx[:8]!r}")


class MempoolSession:
    """A MempoolReactor and three peers, driven step by step (see the module docstring)."""

    def __init__(self) -> None:
        self.clock = task.Clock()
        self.reactor = attach(
            MempoolReactor(check_tx=check_tx, max_txs=24, max_tx_bytes=64, max_peer_txs=4, seen_capacity=8),
            self.clock,
        )
        self.peers = [self._join(True) for _ in range(3)]
        self.invalid = 0

    def _join(self, accepting: bool) -> FakePeer:
        peer = FakePeer()
        if accepting:  # a peer with room: each send is accepted at once

            def send(channel_id, message, peer=peer):
                return defer.succeed(peer.try_send(channel_id, message))

            peer.send = send
        self.reactor.add_peer(peer)
        return peer

    def step(self, chooser: Chooser) -> None:
        action = chooser.number(7)
        index = chooser.number(2)
        if action <= 3:
            peer = self.peers[index]
            tx = self._tx(chooser)
            before = self.reactor.invalid_txs
            outcome = bounded(lambda: self.reactor.receive(MEMPOOL_CHANNEL, peer, tx), len(tx))
            if isinstance(outcome, Exception):
                raise outcome  # an invalid transaction is counted, never raised: the peer stays
            if self.reactor.invalid_txs != before:
                self.invalid += 1
                assert self.reactor.invalid_txs == before + 1 and tx_key(tx) not in self.reactor.txs
        elif action == 4:
            tx = b"tx-%d" % chooser.number(40)
            self.reactor.add_tx(tx)
        elif action == 5:
            self.reactor.remove_txs([b"tx-%d" % chooser.number(40) for _ in range(chooser.number(12))])
        elif action == 6:
            self.clock.advance(chooser.pick((0.5, 0.1, 2.0)))
        else:
            self._leave(index, chooser)
        self.check()

    def _tx(self, chooser: Chooser) -> bytes:
        kind = chooser.number(7)
        if kind <= 4:
            return b"tx-%d" % chooser.number(40)  # a small pool: duplicates, shares filling
        if kind == 5:
            return b"bad" + chooser.blob(4)
        return chooser.blob(80)  # raw: empty and too large included

    def _leave(self, index: int, chooser: Chooser) -> None:
        peer = self.peers[index]
        peer.close("left")
        self.reactor.remove_peer(peer, "left")
        self.peers[index] = self._join(chooser.number(1) == 0)

    def check(self) -> None:
        reactor = self.reactor
        footprint = reactor.footprint()
        assert footprint["txs"] <= reactor.max_txs, footprint
        assert footprint["largest_share"] <= reactor.max_peer_txs, footprint
        assert sum(reactor.charged(p) for p in reactor._charged) <= footprint["txs"], footprint
        assert footprint["largest_seen"] <= reactor.seen_capacity, footprint
        assert set(reactor._seen) == set(reactor._routines) == {p.node_id for p in self.peers}
        assert footprint["order"] <= 2 * footprint["txs"] + 1, footprint
        live = [key for key in reactor._order if key is not None]
        assert sorted(live) == sorted(reactor.txs), "the order and the mempool disagree"
        assert all(reactor._order[at] == key for key, at in reactor._position.items())
        assert set(reactor._charged_to) <= set(reactor.txs)


def mempool_session(data: bytes) -> MempoolSession:
    chooser = Reader(data)
    session = MempoolSession()
    for _ in range(MAX_STEPS * 2):
        if chooser.at >= len(chooser.data):
            break
        session.step(chooser)
    return session


def fuzz_mempool(data: bytes) -> None:
    """The atheris target: the whole input is the session's choices."""
    mempool_session(data)


# -- bulk ---------------------------------------------------------------------------------------


def check_bulk(message: bytes, expected: int = 0):
    """``bulk.check`` with every check; returns the sequence number or the BulkStreamError."""
    outcome = bounded(lambda: bulk.check("a" * 40, expected, message), len(message))
    if isinstance(outcome, Exception):
        if type(outcome) is not bulk.BulkStreamError:
            raise outcome
        return outcome
    assert outcome == expected and message == bulk.encode(expected, len(message) - bulk.HEADER.size)
    return outcome


def draw_bulk(chooser: Chooser) -> tuple[bytes, int]:
    """A bulk message, valid or not, and the sequence number the receiver expects."""
    expected = chooser.pick((0, 1, 255, 256, 2**64 - 1))
    seq = expected if chooser.number(3) != 3 else chooser.pick((expected + 1, 0, 2**63))
    size = chooser.pick((16, 0, 1, 300))
    message = bulk.HEADER.pack(seq % 2**64) + bulk.payload(seq, size)
    return mutate(message, draw_edits(chooser)), expected


def fuzz_bulk(data: bytes) -> None:
    """The atheris target: byte 0, bit 0: the rest is the message (expected 0); else the
    choices of one built by ``draw_bulk``."""
    if data[:1] and data[0] & 1:
        check_bulk(data[1:])
    else:
        check_bulk(*draw_bulk(Reader(data[1:])))
