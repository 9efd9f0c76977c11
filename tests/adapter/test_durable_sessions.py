"""Durable sessions wired into the Switch (specs/resume.md section 9), on the in-memory
network and one clock.

The store here is ``CrashableStore``: the session store's API (``begin``, ``accepted``,
``acked``, ``delivered``, ``end``, ``durable``, ``load``, ``close``) over a dict, whose
``commit`` copies what was recorded into what a crash keeps. ``network.kill`` is the
SIGKILL: what was recorded and not committed is gone, and the restarted node's Switch
opens the committed copy. So these tests see exactly what the Switch writes and when it
waits for a commit; the sqlite store itself is tested on its own, and a real crash of
real processes is tests/integration/test_crash_resume.py.
"""

from __future__ import annotations

import copy

import pytest
from twisted.internet import defer

from helpers import ThreadClock
from mconn import ChannelDescriptor, Config, Reactor, Switch
from mconn.core.node_key import NodeKey
from mconn.switch import durable
from mconn.errors import StoreOwnedByOtherNode
from mconn.switch.session_store import SessionStore, StoredSession, StoredStream
from mconn.testing import MemoryNetwork

CH, OTHER = 0x20, 0x21
CONFIG = Config(
    session_store="/nonexistent/sessions.db",  # replaced per test by the fixture's path
    max_reconnect_delay=0.05,
    ping_interval=2.0,
    pong_timeout=1.0,
    resume_grace=30.0,
    ack_interval=0.01,
    stats_interval=0,
)
COMMIT_DELAY = 0.002


class CrashableStore:
    """The session store's API in memory; ``commit`` makes what was recorded survive a
    crash (``committed``, shared by the stores opened at one path)."""

    def __init__(self, path: str, node_id: str, clock, committed: dict, *, auto: bool) -> None:
        self.path, self.node_id, self.clock, self.auto = path, node_id, clock, auto
        self.committed = committed  # path -> (node_id, sessions): survives the "process"
        held = committed.get(path)
        if held is not None and held[0] != node_id:
            raise ValueError(f"session store {path} belongs to node {held[0]}, not {node_id}")
        #: session id -> {"peer", "outbound", "channels", "streams": {ch: [acked, [unacked], delivered]}}
        self.sessions: dict = copy.deepcopy(held[1]) if held is not None else {}
        self.loaded = copy.deepcopy(self.sessions)
        self.waiters: list[defer.Deferred] = []
        self.records = 0
        self.timer = None

    def load(self) -> list[StoredSession]:
        return [
            StoredSession(
                session_id=sid,
                peer_id=s["peer"],
                outbound=s["outbound"],
                channel_ids=s["channels"],
                streams={c: StoredStream(a, tuple(u), d) for c, (a, u, d) in s["streams"].items()},
            )
            for sid, s in self.loaded.items()
        ]

    def _recorded(self) -> None:
        self.records += 1
        if self.auto and self.timer is None:
            self.timer = self.clock.callLater(COMMIT_DELAY, self.commit)

    def begin(self, session_id, peer_id, outbound, channel_ids) -> None:
        channels = tuple(channel_ids)
        streams = {c: [0, [], 0] for c in channels}
        self.sessions[session_id] = {"peer": peer_id, "outbound": outbound, "channels": channels, "streams": streams}
        self._recorded()

    def accepted(self, session_id, channel_id, seq, message) -> None:
        acked, unacked, _ = self.sessions[session_id]["streams"][channel_id]
        assert seq == acked + len(unacked), f"sequence {seq} after {acked} acked, {len(unacked)} held"
        unacked.append(message)
        self._recorded()

    def acked(self, session_id, channel_id, count) -> None:
        stream = self.sessions[session_id]["streams"][channel_id]
        assert stream[0] <= count <= stream[0] + len(stream[1]), (stream[0], len(stream[1]), count)
        del stream[1][: count - stream[0]]
        stream[0] = count
        self._recorded()

    def delivered(self, session_id, channel_id, count) -> None:
        stream = self.sessions[session_id]["streams"][channel_id]
        assert count >= stream[2]
        stream[2] = count
        self._recorded()

    def end(self, session_id) -> None:
        del self.sessions[session_id]
        self._recorded()

    def durable(self) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.waiters.append(d)
        if self.auto and self.timer is None:
            self.timer = self.clock.callLater(COMMIT_DELAY, self.commit)
        return d

    def commit(self) -> None:
        self.timer = None
        self.committed[self.path] = (self.node_id, copy.deepcopy(self.sessions))
        waiters, self.waiters = self.waiters, []
        for d in waiters:
            d.callback(None)

    def close(self) -> defer.Deferred:
        self.commit()
        return defer.succeed(None)


@pytest.fixture
def stores(monkeypatch):
    """The stores opened, by path (the last one opened there), each in auto-commit mode
    unless ``manual`` names its path."""
    opened: dict[str, CrashableStore] = {}
    committed: dict = {}
    manual: set[str] = set()

    def open_store(config, node_id, channels, clock):
        store = CrashableStore(config.session_store, node_id, clock, committed, auto=config.session_store not in manual)
        opened[config.session_store] = store
        return store

    monkeypatch.setattr(durable, "open_store", open_store)
    opened_and_manual = opened, manual
    return opened_and_manual


class Recorder(Reactor):
    """Records (channel, message, delivery sequence) for each delivery. With ``ledger``
    (a dict that outlives the "process"), it commits each delivery's sequence with its
    effect and answers ``committed_deliveries`` from it."""

    def __init__(self, ledger: dict | None = None) -> None:
        self.got: list[tuple[int, bytes, int]] = []
        self.sessions: list[bytes] = []
        self.ledger = ledger
        self.peers: list = []

    def get_channels(self):
        return [ChannelDescriptor(CH, priority=1), ChannelDescriptor(OTHER, priority=2)]

    def add_peer(self, peer) -> None:
        self.peers.append(peer)

    def receive(self, channel_id, peer, message):
        session_id, seq = peer.delivery_seq(channel_id)
        self.got.append((channel_id, message, seq))
        self.sessions.append(session_id)
        if self.ledger is not None:  # the reactor's own transaction: effect and count together
            self.ledger[(peer.node_id, session_id, channel_id)] = seq

    def committed_deliveries(self, peer_id, session_id):
        if self.ledger is None:
            return None
        return {c: n for (p, s, c), n in self.ledger.items() if p == peer_id and s == session_id}


def pair(stores, *, manual_b: bool = False):
    """a dials b (persistent); both keep their sessions in a store."""
    opened, manual = stores
    network = MemoryNetwork()
    key_a, key_b = NodeKey.generate(), NodeKey.generate()
    if manual_b:
        manual.add("b.db")
    ra, rb = Recorder(), Recorder(ledger={})
    a = network.switch([ra], node_key=key_a, config=CONFIG.replace(session_store="a.db"))
    b = network.switch([rb], node_key=key_b, config=CONFIG.replace(session_store="b.db"))
    a.startService()
    b.startService()
    b.listen("tcp:26656")
    a.dial(network.dial_address(b), persistent=True)
    network.run(0.5)
    assert a.peers[b.node_id].state == "connected"
    return network, a, b, ra, rb


def payloads(recorder: Recorder, channel_id: int = CH) -> list[bytes]:
    return [m for c, m, _ in recorder.got if c == channel_id]


def test_a_killed_sender_restores_its_dormant_session_and_the_receiver_gets_each_message_once(stores):
    network, a, b, ra, rb = pair(stores)
    peer = a.peers[b.node_id]
    for i in range(10):
        assert peer.try_send(CH, b"m%d" % i)
    network.run(0.5)
    assert payloads(rb) == [b"m%d" % i for i in range(10)]
    network.blackhole(a, b)
    for i in range(10, 20):  # accepted and committed; the link loses them
        assert peer.try_send(CH, b"m%d" % i)
    network.run(0.1)
    assert payloads(rb) == [b"m%d" % i for i in range(10)]
    network.kill(a)
    network.heal()
    network.run(0.1)  # b hears the reset: its session is dormant now
    assert b.peers[a.node_id].state == "suspended"

    ra2 = Recorder()
    a2 = network.restart(a, [ra2])
    restored = a2.peers[b.node_id]
    assert restored.state == "suspended" and restored.is_outbound
    assert [p.node_id for p in ra2.peers] == [b.node_id]  # add_peer, before any receive
    assert restored.session.accepted(CH) == 20 and restored.session.acked(CH) == 10
    a2.dial(network.dial_address(b), persistent=True)  # the dial carries the resume
    network.run(1.0)

    assert restored.state == "connected" and restored.resumes == 1
    assert b.peers[a.node_id].resumes == 1  # the same session, not a fresh one
    assert payloads(rb) == [b"m%d" % i for i in range(20)]
    assert [seq for c, _, seq in rb.got] == list(range(1, 21))
    a2._check_invariants()
    b._check_invariants()


def test_a_killed_receiver_keeps_its_delivered_counts_and_nothing_is_delivered_twice(stores):
    network, a, b, ra, rb = pair(stores)
    to_b = a.peers[b.node_id]
    for i in range(30):
        assert to_b.try_send(OTHER, b"x%d" % i)
    network.run(0.5)
    assert len(payloads(rb, OTHER)) == 30
    network.kill(b)
    for i in range(30, 40):  # held for the resume while b is down
        assert to_b.try_send(OTHER, b"x%d" % i)
    network.run(0.2)

    rb2 = Recorder()
    b2 = network.restart(b, [rb2])
    assert b2.peers[a.node_id].session.delivered(OTHER) == 30  # restored from the store
    network.run(2.0)  # a re-dials; b2 answers from its restored session

    assert a.peers[b.node_id].resumes == 1
    assert payloads(rb2, OTHER) == [b"x%d" % i for i in range(30, 40)]
    assert [seq for _, _, seq in rb2.got] == list(range(31, 41))


def test_send_fires_only_once_the_store_commits_and_the_message_waits_for_it(stores):
    opened, manual = stores
    manual.add("a.db")
    network, a, b, ra, rb = pair(stores)
    store = opened["a.db"]
    store.commit()
    network.run(0.1)
    fired: list = []
    a.peers[b.node_id].send(CH, b"one").addCallback(fired.append)
    assert a.peers[b.node_id].try_send(CH, b"two")
    network.run(0.5)
    assert fired == [] and payloads(rb) == []  # nothing leaves before the commit
    store.commit()
    assert fired == [True]
    network.run(0.5)
    assert payloads(rb) == [b"one", b"two"]


def test_an_ack_goes_out_only_once_the_store_holds_the_delivered_counts_it_covers(stores):
    opened, manual = stores
    network, a, b, ra, rb = pair(stores, manual_b=True)
    opened["b.db"].commit()
    to_b = a.peers[b.node_id]
    assert to_b.try_send(CH, b"m")
    network.run(0.5)
    assert payloads(rb) == [b"m"] and to_b.session.acked(CH) == 0
    opened["b.db"].commit()
    network.run(0.5)
    assert to_b.session.acked(CH) == 1


def test_the_reactors_committed_count_wins_over_the_stores_and_no_message_comes_twice(stores):
    opened, manual = stores
    network, a, b, ra, rb = pair(stores, manual_b=True)
    opened["b.db"].commit()  # the session's begin is on disk; its deliveries will not be
    to_b = a.peers[b.node_id]
    for i in range(5):
        assert to_b.try_send(CH, b"m%d" % i)
    network.run(0.5)
    assert payloads(rb) == [b"m%d" % i for i in range(5)]
    network.kill(b)  # the delivered counts were never committed by the store

    rb2 = Recorder(ledger=rb.ledger)  # the reactor's own committed ledger survives
    manual.discard("b.db")  # the new process's store commits as it should
    b2 = network.restart(b, [rb2])
    assert b2.peers[a.node_id].session.delivered(CH) == 5  # the hook's 5, not the store's 0
    network.run(2.0)
    assert a.peers[b.node_id].resumes == 1
    assert rb2.got == []  # nothing came again
    assert to_b.try_send(CH, b"m5")
    network.run(0.5)
    assert rb2.got == [(CH, b"m5", 6)]


def test_without_the_hook_a_message_whose_count_was_not_committed_comes_again_with_its_sequence(stores):
    opened, manual = stores
    network, a, b, ra, rb = pair(stores, manual_b=True)
    opened["b.db"].commit()
    to_b = a.peers[b.node_id]
    for i in range(3):
        assert to_b.try_send(CH, b"m%d" % i)
    network.run(0.5)
    first = list(rb.got)
    network.kill(b)

    rb2 = Recorder()  # keeps nothing: at-least-once
    manual.discard("b.db")
    network.restart(b, [rb2])
    network.run(2.0)
    assert a.peers[b.node_id].resumes == 1
    assert rb2.got == first  # the same messages, each with the sequence it had
    assert set(rb2.sessions) == set(rb.sessions)


def test_a_hook_answering_for_a_channel_it_does_not_own_stops_the_start_naming_it(stores):
    class Liar(Recorder):
        def committed_deliveries(self, peer_id, session_id):
            return {0x55: 3}

    network, a, b, ra, rb = pair(stores)
    network.kill(a)
    with pytest.raises(ValueError, match="names channel 85, which it does not own"):
        network.restart(a, [Liar()])


def test_a_dormant_session_stays_in_the_store_across_a_clean_stop(stores):
    opened, _ = stores
    network, a, b, ra, rb = pair(stores)
    network.kill(b)
    network.run(0.2)
    assert a.peers[b.node_id].state in ("suspended", "connecting")
    a.stopService()
    network.run(0.1)
    assert len(opened["a.db"].committed["a.db"][1]) == 1  # kept: b holds it too


def test_the_store_is_bounded_by_what_memory_holds():
    config = Config(max_unacked_bytes=1 << 20, max_inbound_peers=2, max_outbound_peers=1, max_suspended_sessions=1)
    channels = Recorder().get_channels()
    per_session = sum(65536 + d.recv_message_capacity + 64 for d in channels)
    assert durable.max_bytes(config, channels) == (1 << 20) + 4 * per_session
    assert durable.CHANNEL_RESERVE_BYTES == 65536  # Session's default reserve, which the Switch keeps


def test_a_store_of_another_node_key_refuses_to_start_the_switch(tmp_path):
    path = str(tmp_path / "sessions.db")
    other = NodeKey.generate()
    clock = ThreadClock()
    closed = SessionStore.open(path, other.node_id, max_bytes=1 << 20, reactor=clock).close()
    for _ in range(3):  # the writer thread's report of the close
        if not closed.called:
            clock.pump()
    assert closed.called
    switch = Switch([Recorder()], node_key=NodeKey.generate(), config=CONFIG.replace(session_store=path), clock=clock)
    with pytest.raises(StoreOwnedByOtherNode, match=other.node_id):
        switch.startService()


def test_a_store_that_failed_does_not_stop_a_session_from_ending(stores):
    opened, _ = stores
    network, a, b, ra, rb = pair(stores)
    from mconn.errors import StoreError

    def failed(session_id):
        raise StoreError("session store a.db: commit failed: disk I/O error")

    opened["a.db"].end = failed
    removed: list = []
    ra.remove_peer = lambda peer, reason: removed.append(reason)
    old = a.peers[b.node_id]
    old.close("done")
    network.run(0.5)
    assert len(removed) == 1 and old.state == "closed"
    assert a.peers[b.node_id] is not old  # the persistent dial's fresh session
    a._check_invariants()


def test_a_restored_session_that_gives_way_to_the_limits_was_added_before_it_is_removed(stores):
    network, a, b, ra, rb = pair(stores)
    network.blackhole(a, b)
    for _ in range(10):  # held unacknowledged: 10 x (1000 + 64) bytes
        assert a.peers[b.node_id].try_send(CH, bytes(1000))
    network.run(0.1)
    network.kill(a)

    calls: list[tuple[str, str]] = []

    class Order(Recorder):
        def add_peer(self, peer) -> None:
            calls.append(("add_peer", peer.node_id))

        def remove_peer(self, peer, reason) -> None:
            calls.append(("remove_peer", type(reason).__name__))

    a2 = network.restart(a, [Order()], config=a.config.replace(max_suspended_bytes=5000))
    assert calls == [("add_peer", b.node_id), ("remove_peer", "SessionRejected")]  # evicted: over the bytes
    assert b.node_id not in a2.peers
    a2._check_invariants()


def test_a_resume_announces_delivered_counts_only_once_they_are_committed(stores):
    opened, manual = stores
    manual.add("a.db")
    network, a, b, ra, rb = pair(stores, manual_b=True)
    opened["a.db"].commit()
    opened["b.db"].commit()
    network.run(0.1)
    to_a, to_b = b.peers[a.node_id], a.peers[b.node_id]
    network.reset(a, b)
    network.run(0.5)
    # The dialer re-dials only once the counts its resume request carries are on disk.
    assert to_b.state == "suspended" and to_a.state == "suspended"
    opened["a.db"].commit()
    network.run(0.5)
    # The listener answers only once the counts of its answer are on disk.
    assert to_b.state == "connecting" and to_b.resumes == 0
    opened["b.db"].commit()
    network.run(0.5)
    assert to_b.state == "connected" and to_b.resumes == 1 and to_a.resumes == 1
