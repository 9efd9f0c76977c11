"""Peer exchange (PEX): nodes tell each other where the nodes they know listen (specs/pex.md).

One reactor class, ``PexReactor``: requests, answers, their rate limits and the dialing
they lead to share one per-peer state; the address book is reactors/addrbook.py.

The peer-to-peer counterpart of the NATS client's discovered servers: a node that knows
one seed asks it for addresses, dials what it learns, asks its new peers in turn, and so
finds the rest of the fleet. Learnt addresses are kept in a bounded address book and fed
to the Switch's address pools (``Switch.address_pool(node_id).add_discovered``).
The module is one reactor, ``PexReactor``; the book is reactors/addrbook.py, the wire
reactors/pex_wire.py, the dial rounds reactors/pex_dial.py.

Theory of operation
-------------------
Channel 0x00 (Tendermint's PEX channel) carries two messages, declared with construct
in reactors/pex_wire.py: a *request* naming how many addresses the asker accepts, and a
*reply* (``addrs``) with at most that many. The bounds are those CometBFT learnt
(its ``p2p/pex/pex_reactor.go`` and address book):

* *Asking.* Every ``request_interval`` (the first round after a random part of it) a
  round dials book entries until the node has ``target_outbound`` outbound peers
  (reactors/pex_dial.py), then asks one random peer for addresses. A new outbound peer is asked at once. A peer is
  never asked while a request to it is unanswered, nor within half an interval of the
  last request to it or of its reply (so a request delayed by a resume cannot make the
  next one look like a flood).
* *Answering.* A peer's request that comes within ``min_request_interval`` of its
  previous one (the first is free) is a flood. The reply is a random selection of the
  book, never the asker's own address nor an address whose last dial failed.
* *Judging replies.* A reply nobody asked for, one larger than the channel allows, one
  that does not parse, one with more addresses than asked for, or one naming a host that
  cannot be dialed (unspecified, multicast, broadcast) is dropped whole; its sender is
  penalised: closed with a ``PexMisbehaved`` naming the reason, counted, banned from PEX
  for ``ban_time`` (never dialed, its PEX messages ignored, its address not shared).
* *The book* (reactors/addrbook.py): a new and a tried table of buckets, placed by
  the network group of the connection that brought each address, so made-up identities
  behind one group share a bounded part of the book; addresses of nodes we completed an
  outbound session with move to the tried table, where new ones cannot evict them. A
  source may own at most ``per_source_cap`` entries. A failed dial backs off
  exponentially; after ``max_dial_failures`` the entry is forgotten.
* *What may be dialed* (``mconn.core.address.discovered_problem``): never our own listen
  address, a forbidden host (link-local, metadata, unspecified, multicast...) or a DNS
  name; a loopback address only from a peer that connects over loopback; a private one
  only with ``Config.allow_discovered_private``. Dials are rate-bounded by a token
  bucket (``dial_rate``, ``dial_burst``) and bans are bounded (``max_bans``). Node ids
  the Switch banned (``Switch.mark_bad``) are not dialed.
* *Public networks* (CometBFT's p2p/pex options): ``addrbook_file`` keeps the book across
  restarts (reactors/addrbook_file.py: saved every ``save_interval`` and when the Switch
  stops, read when it starts); ``private_peer_ids`` are never booked nor shared;
  ``seed_mode`` crawls the book (dials its entries, asks each for addresses, then
  disconnects it), answers whoever connects once and disconnects them, and holds no
  peer longer than ``seed_hold``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import secrets
import types
from collections.abc import Iterable

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mconn import ChannelDescriptor, Reactor
from mconn.core.address import PUBLIC, PeerAddress, announced_address, discovered_problem, host_of, host_scope
from mconn.core.address import parse_address
from reactors.addrbook import AddressBook, BanTable, BookEntry, network_group
from reactors.addrbook_file import MAX_SAVED_ANCHORS, BookFileError, read_book, save_book
from reactors.pex_dial import PexDialer
from reactors.pex_wire import MAX_WIRE_ADDRESSES, PEX_CHANNEL, PEX_SCHEMES_CHANNEL, PexMisbehaved, PexType
from reactors.pex_wire import decode_message
from reactors.pex_wire import encode_addrs, encode_request, max_message_bytes

__all__ = ["BookEntry", "PexReactor"]

log = Logger(namespace="reactors.pex")

#: The sender's own rule: never ask one peer twice within this part of request_interval.
SEND_GAP = 0.5
#: A loopback host standing for the source of a saved entry of the ``loopback`` group
#: (the rules of specs/pex.md section 3.5 need a source host; the file keeps its group).
_LOOPBACK_SOURCE = "127.0.0.1"
_NODE_ID = re.compile(r"[0-9a-f]{40}")


@dataclasses.dataclass
class _PeerState:
    """What PEX tracks per connected peer; dropped in ``remove_peer``."""

    peer: object
    #: A request to it is unanswered (only then is a reply from it solicited).
    asked: bool = False
    asked_for: int = 0
    #: When we last asked it, or got its reply if that came later.
    last_sent: float | None = None
    last_received: float | None = None
    #: seed_mode: the timer that disconnects it after seed_hold.
    hold: object = None


class PexReactor(Reactor):
    """Peer exchange on channel 0x00. Every argument is optional (``twistd mconn
    --reactor reactors.pex:PexReactor`` builds it with none).

    :param request_interval: seconds between rounds (dial, then ask one peer).
    :param min_request_interval: a peer's requests closer than this are a flood
        (``request_interval / 3`` if None, as CometBFT).
    :param max_addresses: addresses asked for per request and sent per reply at most.
    :param per_source_cap: book entries one source may own.
    :param new_buckets: buckets of the book's new table.
    :param tried_buckets: buckets of the book's tried table.
    :param bucket_size: entries per bucket.
    :param new_buckets_per_group: new buckets the addresses told over one network group
        (IPv4 /16, IPv6 /32, loopback) can reach.
    :param target_outbound: outbound peers the rounds dial up to (the Switch's
        ``max_outbound_peers`` if None).
    :param dial_rate: dials per second at most, on average (a token bucket)...
    :param dial_burst: ...with this many at once.
    :param ban_time: seconds a penalised node is ignored.
    :param max_bans: banned node ids kept at most; past it the ban that ends first goes.
    :param dial_backoff: seconds before re-dialing an address that failed once; doubles
        with each failure up to ``max_dial_backoff``.
    :param max_dial_failures: failures in a row after which an entry is forgotten.
    :param routable_only: keep only publicly routable IPs (CometBFT's ``addr_book_strict``),
        whatever ``Config.allow_discovered_private`` says.
    :param rng: a ``random.Random`` (seeded in tests); it also makes the book's key then.
    :param addrbook_file: keep the book in this JSON file (CometBFT's ``addrbook.json``):
        read when the Switch starts, saved every ``save_interval`` seconds and when it
        stops. A file that cannot be used is logged, kept as ``FILE.refused``, and the
        node starts with an empty book (``book_file_error``).
    :param save_interval: seconds between saves of ``addrbook_file``.
    :param seed_mode: crawl and hand out addresses, holding no peer for long (CometBFT's
        ``seed_mode``): an inbound peer is answered once and disconnected, a dialed one
        is asked and disconnected once it answers, any peer at ``seed_hold`` at most.
    :param seed_hold: seconds a seed keeps any peer at most.
    :param crawl_interval: seconds before a seed dials a node it crawled again.
    :param private_peer_ids: node ids never booked, never shared (CometBFT's
        ``private_peer_ids``): a sentry's validator, say.
    :param anchors: outbound peers named in ``addrbook_file`` when it is saved (the
        longest held first), dialed first when the node starts again with it, their
        slots kept for them (Bitcoin Core's anchor connections: two).
    :param held_wait: seconds a node that refused us as ``session_held`` keeps its
        outbound slot, dialed again every ``HELD_RETRY`` seconds (twice the Switch's
        ``Config.resume_grace`` if None).
    """

    def __init__(
        self,
        *,
        request_interval: float = 10.0,
        min_request_interval: float | None = None,
        max_addresses: int = 100,
        per_source_cap: int = 100,
        new_buckets: int = 64,
        tried_buckets: int = 16,
        bucket_size: int = 16,
        new_buckets_per_group: int = 8,
        target_outbound: int | None = None,
        dial_rate: float = 0.5,
        dial_burst: int = 4,
        ban_time: float = 24 * 3600.0,
        max_bans: int = 128,
        dial_backoff: float = 1.0,
        max_dial_backoff: float = 300.0,
        max_dial_failures: int = 8,
        routable_only: bool = False,
        rng: random.Random | None = None,
        addrbook_file: str | None = None,
        save_interval: float = 120.0,
        seed_mode: bool = False,
        seed_hold: float = 30.0,
        crawl_interval: float = 120.0,
        private_peer_ids: Iterable[str] = (),
        anchors: int = 2,
        held_wait: float | None = None,
    ) -> None:
        if not request_interval > 0:
            raise ValueError(f"request_interval {request_interval!r} must be > 0")
        if not 1 <= max_addresses <= MAX_WIRE_ADDRESSES:
            raise ValueError(f"max_addresses {max_addresses!r} must be from 1 to {MAX_WIRE_ADDRESSES}")
        if max_dial_failures < 1 or max_bans < 1 or dial_burst < 1 or not dial_rate > 0:
            raise ValueError(
                f"max_dial_failures {max_dial_failures!r}, max_bans {max_bans!r}, dial_burst {dial_burst!r} "
                f"and dial_rate {dial_rate!r} must be >= 1 (dial_rate > 0)"
            )
        self.request_interval = request_interval
        self.min_request_interval = request_interval / 3 if min_request_interval is None else min_request_interval
        self.max_addresses = max_addresses
        self.target_outbound = target_outbound
        self.dial_rate, self.dial_burst = dial_rate, dial_burst
        self.ban_time = ban_time
        self.dial_backoff = dial_backoff
        self.max_dial_backoff = max_dial_backoff
        self.max_dial_failures = max_dial_failures
        self.routable_only = routable_only
        self.max_message_bytes = max_message_bytes(max_addresses)
        for name, value in (("save_interval", save_interval), ("seed_hold", seed_hold)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} {value!r} must be a number of seconds > 0")
        if isinstance(anchors, bool) or not isinstance(anchors, int) or not 0 <= anchors <= MAX_SAVED_ANCHORS:
            raise ValueError(f"anchors {anchors!r} must be an integer from 0 to {MAX_SAVED_ANCHORS}")
        if held_wait is not None and (
            isinstance(held_wait, bool) or not isinstance(held_wait, (int, float)) or not held_wait >= 0
        ):
            raise ValueError(f"held_wait {held_wait!r} must be a number of seconds >= 0, or None")
        self.anchors, self.held_wait = anchors, held_wait
        #: Our outbound peers (node id -> when the session started), the anchors' candidates;
        #: kept while the Switch stops, so that the save at stop names them.
        self._outbound_since: dict[str, float] = {}
        self.save_interval = save_interval
        self.seed_hold = seed_hold
        self.crawl_interval = crawl_interval
        self.addrbook_file: str | None = None
        self.seed_mode = False
        self.private_peer_ids: frozenset[str] = frozenset()
        self.configure_pex(addrbook_file=addrbook_file, seed_mode=seed_mode, private_peer_ids=private_peer_ids)
        #: Why the book file was refused at start (the node started with an empty book), or None.
        self.book_file_error: str | None = None
        self._rng = rng if rng is not None else random.Random()
        key = self._rng.randbytes(32) if rng is not None else secrets.token_bytes(32)
        self._book_sizes = dict(
            new_buckets=new_buckets,
            tried_buckets=tried_buckets,
            bucket_size=bucket_size,
            new_buckets_per_group=new_buckets_per_group,
            per_source_cap=per_source_cap,
        )
        self._book = AddressBook(key=key, **self._book_sizes)
        self._peers: dict[str, _PeerState] = {}
        self._bans = BanTable(max_bans)
        self._dialer = PexDialer(self, self._book, self._rng)
        #: _problem's judgements, for the rules' inputs of ``_problems_for``.
        self._problems: dict[tuple, str | None] = {}
        self._problems_for: tuple = ()
        self._timer = None
        self._save_loop: LoopingCall | None = None
        #: Rounds run so far.
        self.rounds = 0
        #: requests_sent/received, replies_sent/received/dropped/unsent, penalties,
        #: addresses_added/replaced/capped/dropped/skipped/forgotten/private/loaded, dials,
        #: dials_deferred, dial_failures, ignored, book_saves, book_save_failures,
        #: seed_disconnects.
        self.counters: collections.Counter = collections.Counter()
        #: Penalties by reason (PexMisbehaved.reason).
        self.penalties: collections.Counter = collections.Counter()
        #: Addresses skipped by rule (forbidden, name, own, loopback, private, not_public).
        self.skipped: collections.Counter = collections.Counter()

    def configure_pex(
        self,
        *,
        addrbook_file: str | None = None,
        seed_mode: bool | None = None,
        private_peer_ids: Iterable[str] | None = None,
    ) -> None:
        """Set the public-network options before the Switch starts (``twistd mconn``'s
        ``--addrbook-file``, ``--seed-mode``, ``--private-peer-ids`` come this way);
        an argument left None keeps its value.

        :raises ValueError: for a private peer id that is not 40 lowercase hex digits.
        """
        if addrbook_file is not None:
            self.addrbook_file = os.fspath(addrbook_file)
        if seed_mode is not None:
            if not isinstance(seed_mode, bool):
                raise ValueError(f"seed_mode {seed_mode!r} must be True or False")
            self.seed_mode = seed_mode
        if private_peer_ids is not None:
            if isinstance(private_peer_ids, str):
                raise ValueError(
                    f"private_peer_ids must be a collection of node ids, got the text {private_peer_ids!r}"
                )
            ids = frozenset(private_peer_ids)
            bad = sorted(i for i in ids if not isinstance(i, str) or not _NODE_ID.fullmatch(i))
            if bad:
                raise ValueError(f"private peer id {bad[0]!r} is not a node id (40 lowercase hex digits)")
            self.private_peer_ids = ids

    # -- the read-only view ---------------------------------------------------------

    @property
    def book(self) -> types.MappingProxyType:
        """Known addresses by node id (BookEntry); read-only."""
        return self._book.entries

    @property
    def address_book(self) -> AddressBook:
        """The AddressBook itself (its tables, ``counts()``, ``check_invariants()``)."""
        return self._book

    @property
    def banned(self) -> types.MappingProxyType:
        """Banned node ids, with the clock time each ban ends; read-only."""
        return self._bans.view

    def status(self) -> dict:
        """A JSON-ready summary for a status page."""
        return {
            "book": [
                {
                    "address": str(e.address),
                    "source": e.source,
                    "failures": e.failures,
                    "did_connect": e.did_connect,
                    "table": "tried" if e.tried else "new",
                }
                for e in self._book.entries.values()
            ],
            "tables": self._book.counts(),
            "banned": sorted(self._bans.view),
            "bans_evicted": self._bans.evicted,
            "seed_mode": self.seed_mode,
            "addrbook_file": self.addrbook_file,
            "book_file_error": self.book_file_error,
            "rounds": self.rounds,
            "anchors_pending": list(self._dialer.anchors),
            "held": sorted(self._dialer.held),
            "counters": dict(self.counters),
            "penalties": dict(self.penalties),
            "skipped": dict(self.skipped),
        }

    # -- the Reactor contract -------------------------------------------------------

    def get_channels(self):
        return [
            ChannelDescriptor(
                PEX_CHANNEL, priority=1, send_queue_capacity=10, recv_message_capacity=self.max_message_bytes
            ),
            # Carries nothing: listed in our hello, it says we read addrs_schemes replies (specs/pex.md 2.1).
            ChannelDescriptor(PEX_SCHEMES_CHANNEL, priority=1, send_queue_capacity=1, recv_message_capacity=1),
        ]

    def add_peer(self, peer) -> None:
        if self._is_banned(peer.node_id):
            self.counters["ignored"] += 1
            return
        self._peers[peer.node_id] = _PeerState(peer)
        address = self._address_of(peer)
        if address is not None:
            self.add_address(address, source=peer.node_id, source_host=remote_host_of(peer))
        entry = self._book.get(peer.node_id)
        if peer.is_outbound and getattr(self.switch, "running", False):
            self._outbound_since.setdefault(peer.node_id, self.switch.clock.seconds())
        if peer.is_outbound and entry is not None and entry.address == address:
            self._book.mark_good(peer.node_id, self.switch.clock.seconds(), connected=self.switch.peers)
        else:
            self._book.mark_connected(peer.node_id)
        if getattr(self.switch, "running", False):
            self.start()
        state = self._peers[peer.node_id]
        if self.seed_mode:  # a seed holds no peer for long (CometBFT's seed disconnects)
            state.hold = self.switch.clock.callLater(self.seed_hold, self._seed_close, state, "held seed_hold")
        if peer.is_outbound and (self.seed_mode or self._needs_addresses()):
            self._request(state)

    def mark_good(self, peer) -> None:
        """``switch.mark_good(peer)``: another reactor vouches for it; its address moves
        to the book's tried table (CometBFT's MarkGood)."""
        self._book.mark_good(peer.node_id, self.switch.clock.seconds(), connected=self.switch.peers)

    def remove_peer(self, peer, reason) -> None:
        state = self._peers.get(peer.node_id)
        if state is not None and state.peer is peer:
            del self._peers[peer.node_id]
            _cancel(state.hold)
        if not getattr(self.switch, "running", False):
            self.stop()
        elif peer.node_id not in self._peers:  # while stopping, kept for the last save's anchors
            self._outbound_since.pop(peer.node_id, None)

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        state = self._peers.get(peer.node_id)
        if state is None or state.peer is not peer or self._is_banned(peer.node_id):
            self.counters["ignored"] += 1
            return
        try:
            if channel_id == PEX_SCHEMES_CHANNEL:
                raise PexMisbehaved(
                    "malformed", f"a message of {len(message)} bytes on channel 0x01, which carries none"
                )
            kind, value = decode_message(message, limit=self.max_message_bytes)
        except PexMisbehaved as e:
            self._penalise(state, e)
            return
        if kind == PexType.REQUEST:
            self._answer(state, value)
        else:
            self._take_reply(state, value)

    def start_reactor(self) -> None:
        """The Switch starts: read ``addrbook_file`` and save it every ``save_interval``;
        a seed, or a node whose book holds entries, starts its rounds now (it has
        addresses to dial before any peer comes), or, if the Switch is not running yet
        (a ``listen`` before ``startService`` starts the reactors), as soon as it runs."""
        if self.addrbook_file is not None:
            self._load_book()
            self._save_loop = LoopingCall(self.save_book)
            self._save_loop.clock = self.switch.clock
            self._save_loop.start(self.save_interval, now=False)
        if self.seed_mode or len(self._book):
            if getattr(self.switch, "running", False):
                self.start()
            else:
                self.switch.clock.callLater(0, self._start_if_running)

    def _start_if_running(self) -> None:
        if getattr(self.switch, "running", False):
            self.start()

    def stop_reactor(self) -> None:
        """The Switch stopped (every session ended): save the book one last time."""
        self.stop()
        if self._save_loop is not None and self._save_loop.running:
            self._save_loop.stop()
        self._save_loop = None
        self.save_book()

    # -- the book file --------------------------------------------------------------

    def save_book(self) -> bool:
        """Write the book to ``addrbook_file`` now (atomically; reactors/addrbook_file.py).

        :returns: whether it was written (False without a file, or on an error, which is
            logged and counted as ``book_save_failures``).
        """
        if self.addrbook_file is None:
            return False
        try:
            save_book(self.addrbook_file, self._book, anchors=self.anchor_ids())
        except OSError as e:
            self.counters["book_save_failures"] += 1
            log.error("pex cannot save {path}: {error}", path=self.addrbook_file, error=e.strerror or str(e))
            return False
        self.counters["book_saves"] += 1
        return True

    def anchor_ids(self) -> list[str]:
        """The node ids a save names as anchors: up to ``anchors`` of our outbound peers
        with a book entry, those held longest first."""
        held = sorted(self._outbound_since.items(), key=lambda item: (item[1], item[0]))
        return [n for n, _ in held if n in self._book][: self.anchors]

    def held_wait_for(self, switch) -> float:
        """Seconds a node that refused us as ``session_held`` keeps its slot (``held_wait``)."""
        if self.held_wait is not None:
            return self.held_wait
        return 2 * float(getattr(switch.config, "resume_grace", 0.0))

    def _load_book(self) -> None:
        """Replace the (empty) book with ``addrbook_file``'s; a file that cannot be used
        leaves the book empty, is kept as ``FILE.refused`` and named in ``book_file_error``."""
        path = self.addrbook_file
        assert path is not None
        try:
            saved = read_book(path, capacity=self._book.capacity)
        except BookFileError as e:
            self.book_file_error = str(e)
            log.error("pex: {error}; starting with an empty address book", error=str(e))
            try:
                os.replace(path, path + ".refused")
            except OSError:
                pass
            return
        if saved is None:
            return
        self._book = AddressBook(key=saved.key, **self._book_sizes)
        self._dialer = PexDialer(self, self._book, self._rng)
        for entry in saved.entries:
            address, node_id = entry.address, entry.address.node_id
            source_host = _LOOPBACK_SOURCE if entry.source_group == "loopback" else None
            if node_id == self.switch.node_id or node_id in self.private_peer_ids:
                continue
            if self._problem(address, source_host) is not None:
                self.counters["addresses_skipped"] += 1
                continue
            result = self._book.add(address, source=entry.source, source_group=entry.source_group, now=entry.added)
            booked = self._book.get(node_id)
            if result not in ("added", "replaced") or booked is None:
                continue
            if entry.tried:
                self._book.mark_good(node_id, entry.last_success if entry.last_success is not None else entry.added)
            booked.did_connect, booked.failures = entry.did_connect, entry.failures
            self.counters["addresses_loaded"] += 1
        self._dialer.anchors = [n for n in saved.anchors if n in self._book][: self.anchors]

    # -- seed mode ------------------------------------------------------------------

    def _seed_close(self, state: _PeerState, why: str, *, flush: bool = False) -> None:
        """A seed is done with a peer: disconnect it; one it dialed (crawled) is dialed
        again only after ``crawl_interval``."""
        _cancel(state.hold)
        state.hold = None
        if self._peers.get(state.peer.node_id) is not state:
            return
        entry = self._book.get(state.peer.node_id)
        if entry is not None and state.peer.is_outbound:
            entry.next_dial = max(entry.next_dial, self.switch.clock.seconds() + self.crawl_interval)
        self.counters["seed_disconnects"] += 1
        state.peer.close(f"seed node: {why}", flush=flush)

    # -- rounds ---------------------------------------------------------------------

    def start(self) -> None:
        """Run rounds (add_peer does this once the Switch runs); the first comes after a
        random part of ``request_interval``, so a fleet does not ask in lockstep."""
        if self._timer is None:
            self._timer = self.switch.clock.callLater(self._rng.random() * self.request_interval, self._round)

    def stop(self) -> None:
        """Stop the rounds (remove_peer does this once the Switch stops)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _round(self) -> None:
        self._timer = None
        if not getattr(self.switch, "running", False):
            return
        self.rounds += 1
        now = self.switch.clock.seconds()
        self._bans.lift_ended(now)
        self._dialer.dial_more(now)
        if self._needs_addresses():
            ready = [s for s in self._peers.values() if self._may_ask(s, now)]
            if ready:
                self._request(self._rng.choice(ready))
        self._timer = self.switch.clock.callLater(self.request_interval, self._round)

    def _may_ask(self, state: _PeerState, now: float) -> bool:
        channels = state.peer.channels  # a FakePeer's may be None: any channel
        if state.asked or (channels is not None and PEX_CHANNEL not in channels):
            return False
        return state.last_sent is None or now - state.last_sent >= SEND_GAP * self.request_interval

    def _needs_addresses(self) -> bool:
        return len(self._book) < self._book.capacity

    def _request(self, state: _PeerState) -> None:
        if state.peer.try_send(PEX_CHANNEL, encode_request(self.max_addresses)):
            state.asked, state.asked_for = True, self.max_addresses
            state.last_sent = self.switch.clock.seconds()
            self.counters["requests_sent"] += 1

    # -- the book -------------------------------------------------------------------

    def add_address(self, address, *, source: str, source_host: str | None = None) -> bool:
        """Learn ``address`` (``ID@HOST:PORT`` or a PeerAddress) from ``source``.

        :param source_host: the host ``source``'s connection comes from (its network
            group places the address in the book; a loopback address needs a loopback
            source); if None, that of the connected peer ``source``, if any. An address
            whose source has no host is placed in the one group ``addrbook.NO_HOST_GROUP``, never
            in a group of the source's node id (anyone can make up node ids).
        :returns: True if the book changed.
        :raises ValueError: for an address that does not parse or has no node id.
        """
        address = address if isinstance(address, PeerAddress) else parse_address(address)
        node_id = address.node_id
        if node_id is None:
            raise ValueError(f"a book address needs its node id (ID@host:port), got {address}")
        if node_id == self.switch.node_id or self._is_banned(node_id) or self._is_banned(source):
            return False
        if node_id in self.private_peer_ids:  # never booked, so never shared (CometBFT's private_peer_ids)
            self.counters["addresses_private"] += 1
            return False
        if source_host is None and source in self._peers:
            source_host = remote_host_of(self._peers[source].peer)
        problem = self._problem(address, source_host)
        if problem is not None:
            self.counters["addresses_skipped"] += 1
            self.skipped[problem] += 1
            return False
        pool = self.switch.address_pool(node_id)
        if pool is not None:
            pool.add_discovered(address)  # AddressPool heeds ignore_discovered_addresses
        group = network_group(source_host)
        now = self.switch.clock.seconds()
        result = self._book.add(address, source=source, source_group=group, now=now, connected=self.switch.peers)
        if result != "known":
            self.counters[_RESULT_COUNTERS[result]] += 1
        return result in ("added", "replaced")

    def _problem(self, address: PeerAddress, source_host: str | None) -> str | None:
        """The rule of specs/pex.md section 3.5 that ``address`` breaks, or None.

        Remembered per (host, port, whether the source is loopback: all the rules ask of
        it) while the rules' other inputs (our listen addresses,
        ``allow_discovered_private``, ``routable_only``) stay the same: every reply
        repeats addresses already judged, and judging parses each IP again. At most twice
        the book's capacity are remembered; past it the memory starts again."""
        allow_private = getattr(self.switch.config, "allow_discovered_private", False)
        listening = self._dialer.listen_addresses()
        rules = (allow_private, self.routable_only, tuple(listening))
        if rules != self._problems_for or len(self._problems) > 2 * self._book.capacity:
            self._problems, self._problems_for = {}, rules
        key = (address.host, address.port, network_group(source_host) == "loopback")
        if key in self._problems:
            return self._problems[key]
        problem = discovered_problem(
            address, source_host=source_host, allow_private=allow_private, listen_addresses=listening
        )
        if problem is None and self.routable_only and host_scope(address.host) != PUBLIC:
            problem = "not_public"
        self._problems[key] = problem
        return problem

    def _address_of(self, peer) -> PeerAddress | None:
        """Where ``peer`` can be dialed: the address we dialed, or the one it announced
        (an unspecified host, as from ``--listen tcp:26656``, is its remote host)."""
        dialed = getattr(peer, "address", None)
        if peer.is_outbound and dialed is not None and dialed.node_id == peer.node_id:
            return dialed
        return announced_address(peer.node_id, peer.listen_address, remote_host=remote_host_of(peer))

    def _is_banned(self, node_id: str) -> bool:
        return self._bans.is_banned(node_id, self.switch.clock.seconds())

    # -- answering and judging ------------------------------------------------------

    def _answer(self, state: _PeerState, wanted: int) -> None:
        now = self.switch.clock.seconds()
        self.counters["requests_received"] += 1
        last, state.last_received = state.last_received, now
        if last is not None and now - last < self.min_request_interval:
            error = PexMisbehaved(
                "request_flood",
                f"a request {now - last:.3f}s after the previous one; at most one per {self.min_request_interval}s",
            )
            self._penalise(state, error)
            return
        requester, private = state.peer.node_id, self.private_peer_ids
        shared = [
            e.address for n, e in self._book.entries.items() if n != requester and not e.failures and n not in private
        ]
        channels = state.peer.channels  # a peer without PEX_SCHEMES_CHANNEL reads tcp addresses only
        if channels is not None and PEX_SCHEMES_CHANNEL not in channels:
            shared = [a for a in shared if a.scheme == "tcp"]
        chosen = self._rng.sample(shared, min(len(shared), wanted, self.max_addresses))
        if state.peer.try_send(PEX_CHANNEL, encode_addrs(chosen)):
            self.counters["replies_sent"] += 1
        else:
            self.counters["replies_unsent"] += 1
        if self.seed_mode and not state.peer.is_outbound:  # answered once: done (CometBFT's seed)
            self._seed_close(state, "addresses sent", flush=True)

    def _take_reply(self, state: _PeerState, addresses) -> None:
        if not state.asked:
            self._penalise(
                state, PexMisbehaved("unsolicited_reply", f"a reply of {len(addresses)} addresses we did not ask for")
            )
            return
        if len(addresses) > state.asked_for:
            error = PexMisbehaved(
                "too_many_addresses", f"{len(addresses)} addresses; we asked for at most {state.asked_for}"
            )
            self._penalise(state, error)
            return
        state.asked = False
        state.last_sent = self.switch.clock.seconds()  # the gap runs from the reply too (specs/pex.md 3.2)
        self.counters["replies_received"] += 1
        source, source_host = state.peer.node_id, remote_host_of(state.peer)
        for address in addresses:
            self.add_address(address, source=source, source_host=source_host)
        if self.seed_mode:  # crawled: its addresses are what a seed wanted of it
            self._seed_close(state, "crawled")
        self._dialer.dial_more(self.switch.clock.seconds())

    def _penalise(self, state: _PeerState, error: PexMisbehaved) -> None:
        """Drop the message, close the peer with ``error``, count it, ban the node."""
        node_id = state.peer.node_id
        self.penalties[error.reason] += 1
        self.counters["penalties"] += 1
        self.counters["requests_dropped" if error.reason == "request_flood" else "replies_dropped"] += 1
        now = self.switch.clock.seconds()
        self._bans.ban(node_id, now + self.ban_time, now)
        self._book.remove(node_id)
        log.warn("pex penalises {peer_id}: {error}", peer_id=node_id, reason=error.reason, error=str(error))
        state.peer.close(error)


def _cancel(timer) -> None:
    if timer is not None and timer.active():
        timer.cancel()


def remote_host_of(peer) -> str | None:
    """The host ``peer``'s connection comes from: its ``remote_host``, taken from the
    transport (a Peer of a Switch); for a stand-in without one (``mconn.testing.FakePeer``),
    the host of its ``remote_address`` text. None if it has none."""
    host = getattr(peer, "remote_host", _NO_FIELD)
    return host_of(peer.remote_address) if host is _NO_FIELD else host


_NO_FIELD = object()

#: The counter of each outcome of AddressBook.add ("known" counts nothing).
_RESULT_COUNTERS = {
    "added": "addresses_added",
    "replaced": "addresses_replaced",
    "capped": "addresses_capped",
    "full": "addresses_dropped",
}
