"""The Switch's stats tick (specs/telemetry.md ``channel_stats``, specs/connection.md section 3).

A peer logs ``channel_stats`` when its sample changed since its last one; an idle link
is neither logged again nor pinged by the tick (the keepalive pings it); a link that
carried messages is logged and pinged; a tick over many peers is spread over reactor
turns, STATS_SLICE peers at a time; a connected peer is sampled without its
``peer.stats`` snapshot.
"""

from twisted.internet.testing import MemoryReactorClock

from helpers import RecordingReactor, Telemetry
from mconn import ChannelDescriptor, Config
from mconn.switch import switch as switch_module
from mconn.switch import telemetry
from mconn.switch.peer import Peer
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=5), ChannelDescriptor(0x21, priority=1)]
#: Ticks every 2 s; the keepalive (60 s) stays out of the way.
CONFIG = Config(stats_interval=2)


def pair():
    network = MemoryNetwork(MemoryReactorClock())
    a = network.switch([RecordingReactor(CHANNELS)], config=CONFIG)
    b = network.switch([RecordingReactor(CHANNELS)], config=CONFIG)
    a.startService()
    b.startService()
    link = network.connect(a, b)
    return network, a, b, link


def stats_of(capture, switch):
    return [e for e in capture.named("channel_stats") if e["node_id"] == switch.node_id]


def pings_sent(peer) -> int:
    """Bytes the peer's connection sent: with no message sent, its pings and pongs."""
    return peer._protocol.core.bytes_sent


def test_an_idle_link_logs_its_first_sample_and_its_round_trip_then_nothing_and_is_not_pinged_again():
    """The first tick logs every channel and pings; the next logs the new round trip on
    the first channel alone (the other channels' records would repeat their last
    ones); then nothing, and no more pings from the tick."""
    capture = Telemetry().start()
    try:
        network, a, b, link = pair()
        to_b = link.peer_of(a)
        network.advance(2)  # first tick: logged, and pinged (no round trip yet)
        assert len(stats_of(capture, a)) == len(CHANNELS)
        assert to_b.round_trip is not None
        network.advance(2)  # the round trip is new: logged again, no ping (no traffic)
        [again] = stats_of(capture, a)[len(CHANNELS) :]
        assert again["channel_id"] == CHANNELS[0].id and again["round_trip"] == to_b.round_trip
        sent = pings_sent(to_b)
        network.advance(2 * 5)  # five idle ticks
        assert len(stats_of(capture, a)) == len(CHANNELS) + 1
        assert pings_sent(to_b) == sent
    finally:
        capture.stop()


def test_a_link_that_carried_messages_is_logged_and_pinged_at_the_next_tick():
    capture = Telemetry().start()
    try:
        network, a, b, link = pair()
        to_b = link.peer_of(a)
        network.advance(2 * 3)  # idle from the third tick on
        logged = len(stats_of(capture, a))
        assert to_b.try_send(0x20, b"block")
        network.flush()
        sent = pings_sent(to_b)
        network.advance(2)
        assert pings_sent(to_b) == sent + 2  # a's ping, and its pong to b's (b's end carried it too)
        new = stats_of(capture, a)[logged:]
        assert [e["channel_id"] for e in new] == [0x20, 0x21]
        assert new[0]["messages_sent"] == 1 and new[0]["accepted"] == 1 and new[0]["acked"] == 0
        network.advance(2)  # the ack that arrived after that tick is logged (and pinged) at this one
        assert [e["acked"] for e in stats_of(capture, a)[logged:]] == [0, 0, 1, 0]
        sent = pings_sent(to_b)
        network.advance(2 * 3)  # then nothing moves: no log, no ping
        assert len(stats_of(capture, a)) == logged + 2 * len(CHANNELS)
        assert pings_sent(to_b) == sent
    finally:
        capture.stop()


def test_a_tick_over_many_peers_is_spread_over_reactor_turns(monkeypatch):
    monkeypatch.setattr(switch_module, "STATS_SLICE", 2)
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        hub = network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0, max_connections_per_ip=16))
        for _ in range(5):
            network.connect(network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0)), hub)
        assert len(hub.peers) == 5
        hub._emit_stats()
        assert len({e["peer_id"] for e in stats_of(capture, hub)}) == 2  # the first slice, this turn
        network.flush()
        assert len({e["peer_id"] for e in stats_of(capture, hub)}) == 5
        hub._check_invariants()
    finally:
        capture.stop()


def test_stopping_the_switch_cancels_a_tick_under_way(monkeypatch):
    monkeypatch.setattr(switch_module, "STATS_SLICE", 1)
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        hub = network.switch([RecordingReactor(CHANNELS)], config=CONFIG.replace(max_connections_per_ip=16))
        hub.startService()
        for _ in range(3):
            network.connect(network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0)), hub)
        hub._emit_stats()
        hub.stopService()
        network.advance(1)
        assert len({e["peer_id"] for e in stats_of(capture, hub)}) == 1
        assert hub._stats_call is None or not hub._stats_call.active()
    finally:
        capture.stop()


def test_a_message_accepted_while_suspended_is_logged_at_the_next_tick():
    """No byte moves on a suspended session, but its accepted count and queue do."""
    capture = Telemetry().start()
    try:
        network, a, b, link = pair()
        to_b = link.peer_of(a)
        network.advance(2 * 2)
        link.disconnect()
        network.flush()
        assert to_b.state == "suspended"
        network.advance(2)  # the suspension is logged: counters of no connection
        logged = len(stats_of(capture, a))
        network.advance(2)
        assert len(stats_of(capture, a)) == logged
        assert to_b.try_send(0x21, b"")
        network.advance(2)
        [_, late] = stats_of(capture, a)[logged:][:2]
        assert late["channel_id"] == 0x21 and late["accepted"] == 1 and late["queue_depth"] == 1
    finally:
        capture.stop()


def test_a_tick_reads_a_connected_peers_counters_without_its_stats_snapshot(monkeypatch):
    """The tick samples a connected peer straight from its connection's channels and its
    session: the values ``peer.stats`` has, without building that snapshot (a keepalive
    round trip moves an idle peer's sample every ping_interval, so with 10,000 peers
    the snapshot was built 167 times a second)."""
    network, a, b, link = pair()
    to_b, to_a = link.peer_of(a), link.peer_of(b)
    for i in range(3):
        assert to_b.try_send(0x20, b"to b %d" % i) and to_a.try_send(0x21, b"to a %d" % i)
    network.flush()
    assert to_b.try_send(0x21, b"x" * 100_000)  # under way: queued, unacknowledged
    snapshots = []
    stats = Peer.stats.fget
    monkeypatch.setattr(Peer, "stats", property(lambda peer: (snapshots.append(peer), stats(peer))[1]))
    expected = telemetry.channel_samples(to_b)  # from peer.stats
    assert [s[8:11] for s in expected] == [(3, 0, 0), (1, 0, 3)]  # accepted, acked, delivered
    del snapshots[:]
    capture = Telemetry().start()
    try:
        a._emit_stats()
    finally:
        capture.stop()
    assert snapshots == []
    assert telemetry.channel_samples(to_b, a.channels) == expected
    logged = [tuple(e[f] for f in telemetry.SAMPLE_FIELDS[:11]) for e in stats_of(capture, a)]
    assert logged == [s[:11] for s in expected]
