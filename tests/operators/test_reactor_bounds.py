"""What a peer can make the blocksync and mempool reactors (reactors/blocksync.py,
reactors/mempool.py) hold and do: bounded by the reactor's own limits, never by a
number or a count the peer sends.

The reactors are driven directly with ``mconn.testing.FakePeer`` and a ``task.Clock``;
tests/integration/test_reactor_attacks.py runs the same attacks over real loopback
Switches.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet import defer, task

from mconn.testing import FakePeer
from reactors.blocksync import (
    BLOCKSYNC_CHANNEL,
    BlocksyncReactor,
    BlocksyncType,
    ImplausibleStatus,
    MalformedBlocksyncMessage,
    decode,
    encode,
)
from reactors.lru import LRUSet
from reactors.mempool import MempoolReactor, tx_key

#: The attack's message: 17 bytes, unsolicited.
WEDGE = encode(BlocksyncType.STATUS_RESPONSE, base=2**62, height=2**63 - 1)


def attach(reactor):
    """Give ``reactor`` the little of a Switch it uses: a clock and try_broadcast."""
    reactor.switch = SimpleNamespace(clock=task.Clock(), try_broadcast=lambda channel_id, message: {})
    return reactor


def status(base: int, height: int) -> bytes:
    return encode(BlocksyncType.STATUS_RESPONSE, base=base, height=height)


def requested(peer) -> list[int]:
    return [decode(m)[1].height for m in peer.sent_on(BLOCKSYNC_CHANNEL) if m[0] == BlocksyncType.BLOCK_REQUEST]


# -- blocksync -------------------------------------------------------------------------------


@pytest.mark.timeout(30)  # before the fix, this receive walked 2**62 heights: a hang
def test_the_wedge_status_is_refused_at_once_naming_its_values():
    """The unsolicited 17-byte StatusResponse(base=2**62, height=2**63-1) raises
    ImplausibleStatus from receive (so mconn drops its sender), naming both numbers;
    nothing is requested and the peer's range is not kept."""
    assert len(WEDGE) == 17
    reactor = attach(BlocksyncReactor())
    good, hostile = FakePeer(), FakePeer()
    for peer in (good, hostile):
        reactor.add_peer(peer)
    with pytest.raises(ImplausibleStatus, match=f"base {2**62}, height {2**63 - 1}: past the largest height {2**42}"):
        reactor.receive(BLOCKSYNC_CHANNEL, hostile, WEDGE)
    assert hostile.node_id not in reactor.peer_status and reactor.pending == {}
    reactor.receive(BLOCKSYNC_CHANNEL, good, status(1, 5))
    assert requested(good) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "base, height, why",
    [
        (7, 6, "the base is above the height"),
        (2**62, 2**62, "past the largest height"),
        (1, 2**42 + 1, "past the largest height"),
        (2**64 - 1, 2**64 - 1, "past the largest height"),
    ],
)
def test_an_implausible_status_is_refused_naming_the_problem(base, height, why):
    reactor = attach(BlocksyncReactor())
    peer = FakePeer()
    reactor.add_peer(peer)
    with pytest.raises(ImplausibleStatus, match=f"status of base {base}, height {height}: {why}"):
        reactor.receive(BLOCKSYNC_CHANNEL, peer, status(base, height))
    assert reactor.dropped == 1 and reactor.peer_status == {}


@pytest.mark.timeout(30)
def test_requests_stay_in_the_window_and_within_the_per_peer_and_total_bounds():
    """Peers that report the largest plausible height get at most max_pending_per_peer
    requests each and max_pending in all, every one within max_pending heights of ours;
    a peer whose base lies past the window is asked nothing."""
    reactor = attach(BlocksyncReactor(max_pending=50, max_pending_per_peer=20))
    peers = [FakePeer() for _ in range(4)]
    far = FakePeer()
    for peer in peers + [far]:
        reactor.add_peer(peer)
    reactor.receive(BLOCKSYNC_CHANNEL, far, status(2**42 - 10, 2**42))
    for peer in peers:
        reactor.receive(BLOCKSYNC_CHANNEL, peer, status(1, 2**42))
    counts = [len(requested(peer)) for peer in peers]
    assert sum(counts) == len(reactor.pending) == 50 and max(counts) <= 20, counts
    assert sorted(reactor.pending) == list(range(1, 51)) and requested(far) == []


def test_a_later_status_waits_for_the_tick_and_the_tick_uses_it():
    """Only a peer's first status walks the window at once: a stream of statuses costs
    no walks (the CPU of a 17-byte message is constant); the next tick sees the new range."""
    reactor = attach(BlocksyncReactor(max_pending=10, max_pending_per_peer=10))
    peer = FakePeer()
    reactor.add_peer(peer)
    reactor.receive(BLOCKSYNC_CHANNEL, peer, status(0, 0))
    for height in range(1, 200):
        reactor.receive(BLOCKSYNC_CHANNEL, peer, status(1, height))
    assert requested(peer) == []
    reactor._tick()
    assert requested(peer) == list(range(1, 11))


def test_the_height_is_kept_as_blocks_arrive():
    """Each block is looked at once: after a block arrives out of order the height jumps
    over the run it completes, and our own status never has its base above its height."""
    reactor = attach(BlocksyncReactor(max_pending=4, max_pending_per_peer=4))
    peer = FakePeer()
    reactor.add_peer(peer)
    reactor.receive(BLOCKSYNC_CHANNEL, peer, status(1, 3))
    assert requested(peer) == [1, 2, 3]
    for height in (3, 2):
        reactor.receive(BLOCKSYNC_CHANNEL, peer, encode(BlocksyncType.BLOCK_RESPONSE, height=height, block=b"b"))
    assert reactor.height == 0
    assert our_status(reactor) == (0, 0)  # blocks 2 and 3 alone: no run from 1, and no base 1 over height 0
    reactor.receive(BLOCKSYNC_CHANNEL, peer, encode(BlocksyncType.BLOCK_RESPONSE, height=1, block=b"b"))
    assert reactor.height == 3 and our_status(reactor) == (1, 3)


def our_status(reactor) -> tuple[int, int]:
    body = decode(reactor._status())[1]
    return body.base, body.height


def test_a_flood_of_block_requests_costs_one_encoded_block_until_the_channel_takes_it():
    """1000 BlockRequests while the channel has no room: one block is encoded and waits in
    peer.send, max_pending_per_peer requests wait, the other 979 get NoBlockResponse (9
    bytes, no copy of the block). Each time the channel takes a block the next is sent."""
    block = bytes(100_000)
    reactor = attach(BlocksyncReactor({h: block for h in range(1, 30)}, max_pending_per_peer=20))
    peer = FakePeer()
    waiting = []
    peer.send = lambda channel_id, message: (waiting.append(defer.Deferred()), waiting[-1])[1]
    reactor.add_peer(peer)
    for i in range(1000):
        reactor.receive(BLOCKSYNC_CHANNEL, peer, encode(BlocksyncType.BLOCK_REQUEST, height=1 + i % 29))
    assert len(waiting) == 1 and reactor.requests_refused == 979
    refusals = [m for m in peer.sent_on(BLOCKSYNC_CHANNEL) if m[0] == BlocksyncType.NO_BLOCK_RESPONSE]
    assert len(refusals) == 979
    waiting[0].callback(True)
    assert len(waiting) == 2
    reactor.remove_peer(peer, None)
    waiting[1].callback(False)  # the session ended: nothing more is sent
    assert len(waiting) == 2 and reactor._serving == {}


def test_malformed_messages_raise_the_reactors_error():
    reactor = attach(BlocksyncReactor())
    peer = FakePeer()
    reactor.add_peer(peer)
    for message in (b"", b"\x02" + bytes(15), b"\x06", WEDGE + b"\x00"):
        with pytest.raises(MalformedBlocksyncMessage, match=f"blocksync message of {len(message)} bytes"):
            reactor.receive(BLOCKSYNC_CHANNEL, peer, message)


@pytest.mark.parametrize("name, value", [("max_pending", 0), ("max_pending_per_peer", -1), ("max_height", True)])
def test_the_bounds_must_be_positive_integers(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {value!r}"):
        BlocksyncReactor(**{name: value})


# -- mempool ----------------------------------------------------------------------------------


def test_one_peer_flooding_gets_its_share_and_an_honest_peer_is_still_admitted():
    """A peer sending 20,000 distinct transactions fills only its share (max_peer_txs)
    of the mempool; the rest are refused without an error; the honest peer's
    transactions are all admitted, and its seen set holds only keys in the mempool."""
    reactor = attach(MempoolReactor(max_txs=1000, max_peer_txs=100, seen_capacity=300))
    flooder, honest = FakePeer(), FakePeer()
    for peer in (flooder, honest):
        reactor.add_peer(peer)
    for i in range(20_000):
        reactor.receive(0x30, flooder, b"flood-%d" % i)
    for i in range(50):
        reactor.receive(0x30, honest, b"honest-%d" % i)
    assert all(tx_key(b"honest-%d" % i) in reactor.txs for i in range(50))
    assert reactor.charged(flooder.node_id) == 100 and reactor.charged(honest.node_id) == 50
    assert reactor.refused_share == 20_000 - 100 and reactor.refused_full == 0
    footprint = reactor.footprint()
    assert footprint["txs"] == 150 and footprint["largest_seen"] <= 300, footprint
    assert footprint["seen_sets"] == 2 and footprint["largest_share"] == 100


def test_a_seen_set_never_grows_past_its_capacity():
    """Even when every key a peer sends is one the mempool keeps (a large share), its
    seen set stays at seen_capacity: the oldest keys are forgotten."""
    reactor = attach(MempoolReactor(max_txs=5000, max_peer_txs=5000, seen_capacity=64))
    peer = FakePeer()
    reactor.add_peer(peer)
    for i in range(1000):
        reactor.receive(0x30, peer, b"tx-%d" % i)
    assert reactor.footprint()["largest_seen"] == 64 and len(reactor.txs) == 1000
    reactor.remove_peer(peer, None)
    assert reactor.footprint()["seen_sets"] == 0


def test_removing_transactions_gives_the_share_back_and_compacts_the_order():
    """remove_txs (a block committed them) frees the sender's share, and _order stays
    within twice the mempool however many transactions came and went."""
    reactor = attach(MempoolReactor(max_txs=100, max_peer_txs=10))
    peer = FakePeer()
    reactor.add_peer(peer)
    for round_ in range(50):
        txs = [b"tx-%d-%d" % (round_, i) for i in range(10)]
        for tx in txs:
            reactor.receive(0x30, peer, tx)
        assert reactor.charged(peer.node_id) == 10
        assert not reactor.add_tx(b"one too many %d" % round_, sender=peer)
        assert reactor.remove_txs(txs) == 10
        assert reactor.charged(peer.node_id) == 0 and reactor.footprint()["charged_peers"] == 0
        assert len(reactor._order) <= 2 * 10 + 1
    assert reactor.txs == {}


def test_a_routine_moves_with_the_compaction():
    """A peer's sender routine keeps its place across a compaction: what it has not been
    sent yet is still sent, what it was sent is not sent again."""
    reactor = attach(MempoolReactor())
    peer = FakePeer()
    sends = []
    peer.send = lambda channel_id, message: (sends.append(message), defer.succeed(True))[1]
    for i in range(6):
        reactor.add_tx(b"old-%d" % i)
    reactor.add_peer(peer)
    assert sends == [b"old-%d" % i for i in range(6)]
    reactor.remove_txs([b"old-%d" % i for i in range(5)])
    assert reactor._order == [tx_key(b"old-5")]
    reactor.add_tx(b"new")
    assert sends[6:] == [b"new"]


def test_local_transactions_are_charged_to_nobody():
    reactor = attach(MempoolReactor(max_txs=10, max_peer_txs=1))
    for i in range(10):
        assert reactor.add_tx(b"local-%d" % i)
    assert not reactor.add_tx(b"local-10") and reactor.refused_full == 1
    assert reactor.footprint()["charged_peers"] == 0


def test_an_lru_set_forgets_the_oldest_first():
    seen = LRUSet(3)
    for member in "abc":
        seen.add(member)
    seen.add("a")  # a use: b is now the oldest
    seen.add("d")
    assert "b" not in seen and all(m in seen for m in "acd") and len(seen) == 3 and seen.evicted == 1
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        LRUSet(0)


# -- the demo reactor -------------------------------------------------------------------------


def test_the_demo_reactor_keeps_only_its_last_messages():
    """reactors/demo.py recorded every message for good; it keeps the last ``keep`` of a
    channel and counts the rest."""
    from reactors.demo import BULK, CHAT, DemoReactor

    reactor = DemoReactor(keep=4)
    peer = FakePeer()
    reactor.add_peer(peer)
    for i in range(1000):
        reactor.receive(CHAT, peer, b"line %d" % i)
    assert list(reactor.received[CHAT]) == [b"line %d" % i for i in range(996, 1000)]
    assert reactor.counts[CHAT] == 1000 and reactor.counts[BULK] == 0
