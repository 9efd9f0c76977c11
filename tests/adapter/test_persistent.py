"""Dialing over time: persistent peers, address pools, retry_initial_dial, duplicate
connections and simultaneous dials (specs/resume.md section 7), on the in-memory network
with a MemoryReactorClock that records every dial."""

import pytest
from twisted.internet.testing import MemoryReactorClock

from helpers import RecordingReactor
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionRefusedError
from twisted.test import iosim

from mconn import ChannelDescriptor, Config, DialGaveUp, SessionRejected
from mconn.net.protocol import MConnectionFactory
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=5, send_queue_capacity=16), ChannelDescriptor(0x21, priority=1)]
CONFIG = Config(stats_interval=0, duplicate_probe_timeout=1.0)


class Node:
    def __init__(self, network, port, config=CONFIG, **kwargs):
        self.reactor = RecordingReactor(CHANNELS)
        self.switch = network.switch([self.reactor], config=config, **kwargs)
        self.port = port
        self.switch.startService()
        if port is not None:
            self.switch.listen(f"tcp:{port}:interface=127.0.0.1")

    @property
    def address(self):
        return f"{self.switch.node_id}@127.0.0.1:{self.port}"

    def calls(self, *names):
        return [c[0] for c in self.reactor.calls if c[0] in names]


@pytest.fixture
def network():
    return MemoryNetwork(MemoryReactorClock())


def settle(network, seconds=0.0, rounds=6):
    """Let dials complete and bytes flow: clock steps, dial completion, flushing."""
    for _ in range(rounds):
        network.clock.advance(seconds / rounds if seconds else 0.35)
        network.complete_dials()
        network.flush()


def results_of(d):
    out = []
    d.addBoth(out.append)
    return out


def check(*nodes):
    for node in nodes:
        node.switch._check_invariants()


def test_a_persistent_peer_gets_a_fresh_session_after_its_session_ends(network):
    """persistent=True: after the session ends (the peer closed it), the dialer dials
    again and a fresh session starts, with add_peer on both sides."""
    a, b = Node(network, None), Node(network, 26656)
    got = results_of(a.switch.dial(b.address, persistent=True))
    settle(network)
    [first] = got
    assert first.state == "connected"
    b.switch.peers[a.switch.node_id].close("go away")
    settle(network)
    second = a.switch.peers[b.switch.node_id]
    assert second is not first and second.state == "connected" and first.state == "closed"
    assert a.calls("add_peer", "remove_peer") == ["add_peer", "remove_peer", "add_peer"]
    assert b.calls("add_peer", "remove_peer") == ["add_peer", "remove_peer", "add_peer"]
    check(a, b)


def test_a_non_persistent_peer_is_not_dialed_after_its_session_ends(network):
    """A peer dialed without persistent is not dialed again once the other side closes its session."""
    a, b = Node(network, None), Node(network, 26656)
    got = results_of(a.switch.dial(b.address))
    settle(network)
    assert got[0].state == "connected"
    b.switch.peers[a.switch.node_id].close("go away")
    settle(network, 10)
    assert a.switch.peers == {} and a.calls("add_peer", "remove_peer") == ["add_peer", "remove_peer"]


def test_a_persistent_dial_needs_the_node_id(network):
    """A persistent dial of an address without a node id fails with a ValueError."""
    a = Node(network, None)
    [failure] = results_of(a.switch.dial("127.0.0.1:26656", persistent=True))
    assert failure.check(ValueError) and "needs its node id" in str(failure.value)


def test_retry_initial_dial_keeps_trying_until_the_node_listens(network):
    """With retry_initial_dial the first dial rides out refused connections."""
    a, b = Node(network, None), Node(network, None)
    b.port = 26656
    got = results_of(a.switch.dial(b.address, retry_initial_dial=True))
    settle(network, 2)
    assert got == [], "gave up although retry_initial_dial is set"
    b.switch.listen("tcp:26656:interface=127.0.0.1")
    settle(network, 20)
    [peer] = got
    assert peer.node_id == b.switch.node_id and peer.state == "connected"
    check(a, b)


def test_without_retry_initial_dial_a_plain_dial_fails_at_the_first_error_and_ends_dialing(network, telemetry):
    """A non-persistent dial without retry_initial_dial fails at the first refused
    attempt, and nothing dials that node again (NATS without retry_on_failed_connect)."""
    a = Node(network, None)
    node_id = "ab" * 20
    got = results_of(a.switch.dial(f"{node_id}@127.0.0.1:26656"))
    settle(network)
    [failure] = got
    assert failure.check(ConnectionRefusedError)
    assert a.switch.address_pool(node_id) is None
    network.clock.advance(20)
    assert network.clock.tcpClients == [], "the node was dialed again"
    assert telemetry.named("dial_attempt") == []  # a plain dial has no dialer


def test_a_persistent_dial_keeps_trying_without_retry_initial_dial(network, telemetry):
    """A persistent dial with Config.retry_initial_dial False (the default) of a node that
    does not listen yet rides out refused connections and fires with the Peer once the
    node listens: persistent peers are always retried (specs/resume.md section 7.1)."""
    assert not CONFIG.retry_initial_dial
    a, b = Node(network, None), Node(network, None)
    b.port = 26656
    got = results_of(a.switch.dial(b.address, persistent=True))
    settle(network, 20, rounds=200)
    assert got == [], "a persistent dial failed at a refused connection"
    assert a.switch.address_pool(b.switch.node_id) is not None and a.switch.peers == {}
    assert len(telemetry.named("dial_attempt")) > 3
    b.switch.listen("tcp:26656:interface=127.0.0.1")
    settle(network, 10)
    [peer] = got
    assert peer.node_id == b.switch.node_id and peer.state == "connected"
    assert a.switch.peers[b.switch.node_id] is peer and peer.is_persistent
    check(a, b)


def test_max_reconnects_gives_up_with_dial_gave_up(network, telemetry):
    """max_reconnects bounds a persistent dial too: after that many failed attempts it
    fails with DialGaveUp, logged, the pool is dropped and the node is no longer persistent."""
    config = CONFIG.replace(max_reconnects=3)
    a = Node(network, None, config=config)
    node_id = "ab" * 20
    got = results_of(a.switch.dial(f"{node_id}@127.0.0.1:26656", persistent=True))
    settle(network, 5)
    [failure] = got
    assert failure.check(DialGaveUp) and "max_reconnects=3" in str(failure.value)
    assert [e["result"] for e in telemetry.named("dial_attempt")] == ["failed"] * 3
    [gave_up] = telemetry.named("dial_gave_up")
    assert gave_up["peer_id"] == node_id and "3 failed attempts" in gave_up["reason"]
    assert a.switch.address_pool(node_id) is None


def test_a_suspended_session_is_resumed_through_the_persistent_dialer(network):
    """A transport break suspends; the persistent peer's own dialer re-dials and the
    same Peer resumes (no remove_peer)."""
    a, b = Node(network, None), Node(network, 26656)
    [peer] = results_of(a.switch.dial(b.address, persistent=True)) or [None]
    settle(network)
    peer = a.switch.peers[b.switch.node_id]
    network.links[-1].disconnect()
    settle(network)
    assert a.switch.peers[b.switch.node_id] is peer and peer.state == "connected" and peer.resumes == 1
    assert a.calls("add_peer", "remove_peer") == ["add_peer"]
    check(a, b)


def test_listen_addresses_from_hellos_join_the_pool_unless_ignored(network):
    """The listen address in a peer's hello joins its pool as discovered, unless ignore_discovered_addresses."""
    a, b = Node(network, None), Node(network, 26656)
    b.switch.listen_address = "127.0.0.1:26999"  # what b announces in its hellos
    a.switch.dial(b.address, persistent=True)
    settle(network)
    pool = a.switch.address_pool(b.switch.node_id)
    assert [(str(s.address), s.discovered) for s in pool] == [
        (b.address, False),
        (f"{b.switch.node_id}@127.0.0.1:26999", True),
    ]
    c, d = Node(network, None, config=CONFIG.replace(ignore_discovered_addresses=True)), Node(network, 26657)
    d.switch.listen_address = "127.0.0.1:26998"
    c.switch.dial(d.address, persistent=True)
    settle(network)
    assert [str(s.address) for s in c.switch.address_pool(d.switch.node_id)] == [d.address]


def test_a_peer_announcing_our_own_listen_address_does_not_put_it_in_the_pool(network):
    """A persistent peer whose hello announces this node's own listen address as its own:
    that address never joins its pool (a re-dial there would only reach ourselves)."""
    a, b = Node(network, None), Node(network, 26656)
    a.switch.listen_address = "127.0.0.1:26999"  # a's own listener
    b.switch.listen_address = "127.0.0.1:26999"  # b claims a's address as its own
    a.switch.dial(b.address, persistent=True)
    settle(network)
    pool = a.switch.address_pool(b.switch.node_id)
    assert [(str(s.address), s.discovered) for s in pool] == [(b.address, False)]


def test_set_address_pool_replaces_the_pool_and_keeps_known_state(network):
    """set_address_pool replaces a persistent peer's pool keeping known addresses' state; another node's
    address or an unknown peer is refused."""
    a, b = Node(network, None), Node(network, 26656)
    a.switch.dial(b.address, persistent=True)
    settle(network)
    node_id = b.switch.node_id
    before = a.switch.address_pool(node_id).get(b.address)
    assert before.did_connect
    a.switch.set_address_pool(node_id, ["127.0.0.1:27000", b.address])
    pool = a.switch.address_pool(node_id)
    assert pool.get(b.address) is before
    assert pool.get(f"{node_id}@127.0.0.1:27000") is not None
    with pytest.raises(ValueError, match="names node"):
        a.switch.set_address_pool(node_id, [f"{'cd' * 20}@127.0.0.1:1"])
    with pytest.raises(KeyError, match="not a persistent peer"):
        a.switch.set_address_pool("cd" * 20, ["127.0.0.1:1"])


def test_the_dialer_walks_the_pool_to_an_address_that_answers(network, telemetry):
    """The configured address is dead; a second one added with set_address_pool works."""
    a, b = Node(network, None), Node(network, 26656)
    node_id = b.switch.node_id
    got = results_of(a.switch.dial(f"{node_id}@127.0.0.1:26001", persistent=True))
    settle(network, 1)
    assert got == []
    a.switch.set_address_pool(node_id, ["127.0.0.1:26001", "127.0.0.1:26656"])
    settle(network, 10)
    [peer] = got
    assert peer.state == "connected"
    tried = [e["address"] for e in telemetry.named("dial_attempt")]
    assert tried[-1] == b.address and f"{node_id}@127.0.0.1:26001" in tried


def test_a_duplicate_whose_old_connection_is_dead_replaces_it(network, telemetry):
    """The old connection of a session is a black hole (its link no longer delivers); a
    new connection from the same node, not proving the session, replaces it after the
    probe times out: the old session ends (SessionRejected with its undelivered counts)
    and a fresh one starts."""
    a, b = Node(network, None), Node(network, 26656)
    old = network.connect(a.switch, b.switch)
    network.links.remove(old)  # a's process died without a word: nothing crosses any more
    old_peer = b.switch.peers[a.switch.node_id]
    assert old_peer.try_send(0x20, b"lost in the black hole")
    restarted = Node(network, None, node_key=a.switch.node_key)  # same node, fresh process
    new = network.connect(restarted.switch, b.switch)
    assert new.inbound.peer is None, "decided before the probe"
    settle(network, CONFIG.duplicate_probe_timeout + 0.5)
    fresh = b.switch.peers[a.switch.node_id]
    assert fresh is not old_peer and new.inbound.peer is fresh and fresh.state == "connected"
    assert new.outbound.peer is restarted.switch.peers[b.switch.node_id]
    assert old_peer.state == "closed"
    [(_, removed, reason)] = [c for c in b.reactor.calls if c[0] == "remove_peer"]
    assert removed is old_peer and isinstance(reason, SessionRejected)
    assert "did not answer a probe" in str(reason) and reason.unconfirmed == {0x20: 1}
    assert [e["outcome"] for e in telemetry.named("duplicate_connection")] == ["replaced"]
    assert b.switch.node_counters[a.switch.node_id]["duplicates_replaced"] == 1
    stats = fresh.stats
    assert (stats.duplicates_replaced, stats.resume_rejections, stats.duplicates_refused) == (1, 1, 0)


def same_connection(a, b):
    """The one connection each of a and b has is the same link."""
    [pa], [pb] = a.switch.connections, b.switch.connections
    return pa.transport.getPeer() == pb.transport.getHost() and pb.transport.getPeer() == pa.transport.getHost()


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_nodes_dialing_each_other_end_with_one_connection(network, first):
    """Both dial; the dials complete one after the other: the second connection is the
    duplicate (the first answers the probe), and both dials fire with the one Peer."""
    a, b = Node(network, 26656), Node(network, 26657)
    one, other = (a, b) if first == "a" else (b, a)
    got_one = results_of(one.switch.dial(other.address))
    got_other = results_of(other.switch.dial(one.address))
    settle(network, 3)
    [peer_one], [peer_other] = got_one, got_other
    assert peer_one is one.switch.peers[other.switch.node_id] and peer_one.state == "connected"
    assert peer_other is other.switch.peers[one.switch.node_id] and peer_other.state == "connected"
    assert same_connection(a, b)
    assert peer_one.try_send(0x20, b"over the survivor")
    settle(network)
    assert other.reactor.received(0x20) == [b"over the survivor"]
    check(a, b)


def racing_link(network, dialer, listener):
    """A connection made but not pumped: each side has written its hello, nothing moved."""
    out = MConnectionFactory(dialer.switch, is_outbound=True, expected_node_id=listener.switch.node_id).buildProtocol(
        None
    )
    inn = MConnectionFactory(listener.switch, is_outbound=False).buildProtocol(None)
    out_address = IPv4Address("TCP", f"10.1.0.{dialer.port % 250}", 40000 + len(network.links))
    in_address = IPv4Address("TCP", "127.0.0.1", listener.port)
    out_io = iosim.FakeTransport(out, False, hostAddress=out_address, peerAddress=in_address)
    in_io = iosim.FakeTransport(inn, True, hostAddress=in_address, peerAddress=out_address)
    pump = iosim.connect(inn, in_io, out, out_io, greet=False, clock=network.clock)
    return out, inn, out_io, pump


def deliver(io, protocol):
    data, io.stream = b"".join(io.stream), []
    protocol.dataReceived(data)


@pytest.mark.parametrize("seed", range(4))
def test_simultaneous_dial_keeps_the_connection_dialed_by_the_smaller_node_id(network, seed):
    """A true race: each listener reads the other's hello before either dialer has an
    answer. Both sides keep the connection dialed by the smaller node id, with one
    session between them (add_peer once, nothing removed)."""
    a, b = Node(network, 26656), Node(network, 26657)
    a_out, b_in, a_io, pump_ab = racing_link(network, a, b)
    b_out, a_in, b_io, pump_ba = racing_link(network, b, a)
    # Each listener decides on the other's hello first (in an order set by the seed).
    order = [(a_io, b_in), (b_io, a_in)]
    if seed % 2:
        order.reverse()
    for io, listener_side in order:
        deliver(io, listener_side)
    for _ in range(10):
        for pump in (pump_ab, pump_ba) if seed < 2 else (pump_ba, pump_ab):
            pump.flush()
    smaller = min((a, b), key=lambda n: n.switch.node_id)
    kept_out = a_out if smaller is a else b_out
    assert kept_out.peer is not None and kept_out.peer.state == "connected"
    for node, other in ((a, b), (b, a)):
        [peer] = node.switch.peers.values()
        assert peer.node_id == other.switch.node_id and peer.state == "connected"
        assert node.calls("add_peer", "remove_peer") == ["add_peer"]
        assert [p for p in node.switch.connections if p.end_reason is None] == [peer._protocol]
    assert (a.switch.peers[b.switch.node_id].is_outbound) == (smaller is a)
    assert a.switch.peers[b.switch.node_id].session.id == b.switch.peers[a.switch.node_id].session.id


def test_choose_address_picks_the_next_address(network):
    """A choose_address hook steers the persistent dialer away from a dead address to the live one."""
    picked = []

    def choose(pool, last_info):
        state = pool.get(f"{b.switch.node_id}@127.0.0.1:26656")
        picked.append(last_info)
        return state, 0.0

    a, b = Node(network, None, choose_address=choose), Node(network, 26656)
    got = results_of(a.switch.dial(f"{b.switch.node_id}@127.0.0.1:26001", persistent=True))
    a.switch.set_address_pool(b.switch.node_id, ["127.0.0.1:26001", "127.0.0.1:26656"])
    settle(network)
    [peer] = got
    assert peer.state == "connected" and picked


def test_a_custom_reconnect_delay_is_used(network, telemetry):
    """A reconnect_delay function gets each attempt number and its delays are the ones waited and logged."""
    delays = []

    def reconnect_delay(attempt):
        delays.append(attempt)
        return 0.25 * attempt

    a = Node(network, None, config=CONFIG.replace(max_reconnects=3), reconnect_delay=reconnect_delay)
    a.switch.dial(f"{'ab' * 20}@127.0.0.1:26656", retry_initial_dial=True).addErrback(lambda f: None)
    settle(network, 5, rounds=20)
    assert delays == [1, 2, 3]
    assert [e["delay"] for e in telemetry.named("dial_attempt")] == [0.25, 0.5, 0.75]


def test_node_counters_stay_bounded_when_strangers_come_and_go(network, monkeypatch):
    """Counters of nodes with no session and no dialer are dropped, oldest first, once
    the table is full; those of known nodes are kept."""
    import mconn.switch.node_counters

    monkeypatch.setattr(mconn.switch.node_counters, "NODE_COUNTERS_KEPT", 8)
    a, b = Node(network, None), Node(network, 26656)
    network.connect(a.switch, b.switch)
    b.switch._sessions.count(a.switch.node_id, "duplicates_refused")  # a known node, counted first
    for i in range(50):
        b.switch._sessions.count(f"{i:040x}", "grace_expiries")
    assert len(b.switch.node_counters) <= 8
    assert b.switch.node_counters[a.switch.node_id]["duplicates_refused"] == 1
    assert f"{49:040x}" in b.switch.node_counters and f"{0:040x}" not in b.switch.node_counters


def test_dialing_a_persistent_node_again_adds_the_address_as_configured(network):
    """Dialing a persistent node again adds the address to its pool as configured, even one discovered."""
    a, b = Node(network, None), Node(network, 26656)
    b.switch.listen_address = "127.0.0.1:26999"
    a.switch.dial(b.address, persistent=True)
    settle(network)
    node_id = b.switch.node_id
    a.switch.dial(f"{node_id}@127.0.0.1:26999", persistent=True)  # was discovered
    a.switch.dial(f"{node_id}@127.0.0.1:27001", persistent=True)  # new
    pool = a.switch.address_pool(node_id)
    assert [(str(s.address), s.discovered) for s in pool] == [
        (b.address, False),
        (f"{node_id}@127.0.0.1:26999", False),
        (f"{node_id}@127.0.0.1:27001", False),
    ]
