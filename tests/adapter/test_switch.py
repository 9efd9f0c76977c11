"""Two or more Switches over in-memory transports (mconn.testing) on one Clock.

Covers routing to the owning reactor, the reactor call order, the peer-set rules
(duplicates, self, dialed id, inbound limit), reactor failures, broadcast and shutdown
(specs/reactor-api.md).
"""

import pytest
from zope.interface.verify import verifyObject
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock

from helpers import (
    RawPeer,
    RecordingReactor,
    close_packets_in,
    hello_packet,
    msg_packet,
    new_node_id,
    open_switch_connection,
)
from mconn import (
    ChannelDescriptor,
    Config,
    ConnectionClosed,
    PeerClosed,
    PeerIdMismatch,
    PeerRejected,
    Reactor,
    Switch,
)
from mconn.net.owner import ICarriedSession
from mconn.testing import MemoryNetwork

BLOCKS = [
    ChannelDescriptor(0x20, priority=5, send_queue_capacity=8),
    ChannelDescriptor(0x21, priority=1, send_queue_capacity=8),
]
VOTES = [ChannelDescriptor(0x30, priority=10, send_queue_capacity=8)]
ALL_CHANNELS = BLOCKS + VOTES


class Node:
    """A Switch with two recording reactors: one owns 0x20 and 0x21, the other 0x30."""

    def __init__(self, network, config=None):
        self.blocks = RecordingReactor(BLOCKS)
        self.votes = RecordingReactor(VOTES)
        self.switch = network.switch([self.blocks, self.votes], config=config)

    @property
    def reactors(self):
        return [self.blocks, self.votes]


@pytest.fixture
def network():
    return MemoryNetwork()


def check(*nodes):
    for node in nodes:
        node.switch._check_invariants()


def test_messages_on_three_channels_reach_the_owning_reactor(network):
    """Both directions, three channels of different priorities: each message reaches the
    reactor owning its channel, in order per channel, and no other reactor."""
    a, b = Node(network), Node(network)
    link = network.connect(a.switch, b.switch)
    a_to_b, b_to_a = link.peer_of(a.switch), link.peer_of(b.switch)
    sent = {
        0x20: [b"block %d" % i for i in range(5)],
        0x21: [(b"part %d " % i) * 300 for i in range(5)],  # several packets each
        0x30: [b"vote %d" % i for i in range(5)],
    }
    for i in range(5):
        for channel_id, messages in sent.items():
            assert a_to_b.try_send(channel_id, messages[i])
            assert b_to_a.try_send(channel_id, messages[i][::-1])
    network.flush()
    for node, peer_id in ((b, a.switch.node_id), (a, b.switch.node_id)):
        reverse = node is a
        for channel_id, messages in sent.items():
            owner = node.votes if channel_id == 0x30 else node.blocks
            expected = [m[::-1] for m in messages] if reverse else messages
            assert owner.received(channel_id) == expected
            assert all(c[2].node_id == peer_id for c in owner.calls if c[0] == "receive")
        assert node.blocks.received(0x30) == [] and node.votes.received(0x20) == node.votes.received(0x21) == []
    check(a, b)


def test_a_multi_packet_message_is_reassembled(network):
    """A message many packets long arrives whole."""
    a, b = Node(network), Node(network)
    link = network.connect(a.switch, b.switch)
    big = bytes(range(256)) * 400  # 100 KiB, 100 packets
    assert link.peer_of(a.switch).try_send(0x21, big)
    network.flush()
    assert b.blocks.received(0x21) == [big]


def test_two_reactors_claiming_one_channel_is_refused():
    """Switch construction fails with ValueError naming the channel and both reactors."""

    class Mempool(RecordingReactor):
        pass

    class Evidence(RecordingReactor):
        pass

    with pytest.raises(ValueError, match=r"0x30.*Mempool.*Evidence"):
        Switch([Mempool(VOTES), Evidence([ChannelDescriptor(0x30)])], clock=MemoryReactorClock())


def test_one_reactor_declaring_a_channel_twice_is_refused():
    """Even within one reactor, a channel id may appear only once."""
    with pytest.raises(ValueError, match="0x20"):
        Switch([RecordingReactor([ChannelDescriptor(0x20), ChannelDescriptor(0x20)])], clock=MemoryReactorClock())


class SendOnAdd(RecordingReactor):
    """Sends a greeting on every channel it owns as soon as a peer is added."""

    def add_peer(self, peer):
        super().add_peer(peer)
        for desc in self.channels:
            peer.try_send(desc.id, b"hello from add_peer")


def test_add_peer_comes_before_any_receive(network):
    """A message the peer sends from its own add_peer reaches our receive after our add_peer."""
    a_reactor = SendOnAdd(VOTES)
    b_reactor = RecordingReactor(VOTES)
    a = network.switch([a_reactor])
    b = network.switch([b_reactor])
    network.connect(a, b)
    [peer] = b.peers.values()
    assert b_reactor.methods_for(peer) == ["add_peer", "receive"]
    assert b_reactor.received(0x30) == [b"hello from add_peer"]


def test_add_peer_comes_before_messages_read_with_the_hello(network):
    """Messages in the same read as the hello are delivered, after add_peer on every reactor."""
    node = Node(network)
    raw = RawPeer(hello_packet(new_node_id(), ALL_CHANNELS) + msg_packet(0x30, b"v") + msg_packet(0x20, b"b"))
    network.connect_raw(raw, node.switch)
    [peer] = node.switch.peers.values()
    assert node.blocks.methods_for(peer) == ["add_peer", "receive"]
    assert node.votes.methods_for(peer) == ["add_peer", "receive"]
    assert node.votes.received(0x30) == [b"v"] and node.blocks.received(0x20) == [b"b"]


def test_remove_peer_comes_after_the_last_receive(network):
    """Messages read together with the close packet are delivered, then remove_peer, once."""
    a, b = Node(network), Node(network)
    link = network.connect(a.switch, b.switch)
    peer_at_b = link.peer_of(b.switch)
    a_to_b = link.peer_of(a.switch)
    for i in range(3):
        a_to_b.try_send(0x20, b"m%d" % i)
        a_to_b.try_send(0x30, b"v%d" % i)
    a_to_b.close()  # the close packet is written right behind the messages
    network.flush()
    assert b.blocks.methods_for(peer_at_b) == ["add_peer"] + ["receive"] * 3 + ["remove_peer"]
    assert b.votes.methods_for(peer_at_b) == ["add_peer"] + ["receive"] * 3 + ["remove_peer"]
    [(removed, reason)] = b.blocks.removed()
    assert removed is peer_at_b and isinstance(reason, PeerClosed) and reason.code == "closed"
    [(_, own_reason)] = a.blocks.removed()
    assert isinstance(own_reason, ConnectionClosed) and own_reason.code == "closed"
    assert a.switch.peers == {} and b.switch.peers == {}
    check(a, b)


class CheckingReactor(RecordingReactor):
    """Calls the Switch's _check_invariants inside every callback."""

    def __init__(self, channels):
        super().__init__(channels)
        self.violations = []

    def _check(self, where):
        try:
            self.switch._check_invariants()
        except AssertionError as e:
            self.violations.append((where, str(e)))

    def add_peer(self, peer):
        super().add_peer(peer)
        self._check("add_peer")

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        self._check("receive")

    def remove_peer(self, peer, reason):
        super().remove_peer(peer, reason)
        self._check("remove_peer")


def test_invariants_hold_whenever_a_reactor_is_called(network):
    """A reactor may look at the Switch from any callback and find its collections agreeing."""
    a_reactor, b_reactor = CheckingReactor(VOTES), CheckingReactor(VOTES)
    a, b = network.switch([a_reactor]), network.switch([b_reactor])
    link = network.connect(a, b)
    link.peer_of(a).try_send(0x30, b"x")
    network.flush()
    link.peer_of(a).close()
    network.flush()
    assert [c[0] for c in b_reactor.calls] == ["add_peer", "receive", "remove_peer"]
    assert a_reactor.violations == [] and b_reactor.violations == []


def test_second_connection_from_a_connected_node_is_refused(network, telemetry):
    """A raw connection claiming a connected node's id gets a close packet 'duplicate';
    the first connection keeps working."""
    a, b = Node(network), Node(network)
    link = network.connect(a.switch, b.switch)
    impostor = RawPeer(hello_packet(a.switch.node_id, ALL_CHANNELS))
    raw_link = network.connect_raw(impostor, b.switch)
    network.flush()
    [(code, text)] = close_packets_in(impostor.data)
    assert code == "duplicate" and a.switch.node_id in text
    assert impostor.lost is not None
    [rejected] = telemetry.named("peer_rejected")
    assert rejected["reason"] == "duplicate" and rejected["peer_id"] == a.switch.node_id
    assert raw_link.inbound.peer is None
    # The first connection is untouched.
    assert list(b.switch.peers) == [a.switch.node_id]
    assert link.peer_of(a.switch).try_send(0x30, b"still here")
    network.flush()
    assert b.votes.received(0x30) == [b"still here"]
    assert [c[0] for c in b.blocks.calls] == ["add_peer"]
    check(a, b)


def test_two_switches_connecting_twice_keep_the_first_connection(network):
    """When a connects to b a second time (a fresh session, not a resume), b probes the
    first connection; it answers, so b refuses the second with a 'duplicate' close
    packet, and the first connection carries on."""
    a, b = Node(network), Node(network)
    first = network.connect(a.switch, b.switch)
    second = network.connect(a.switch, b.switch)
    assert second.inbound.end_reason is None, "refused before the probe was answered"
    network.flush()  # the probe's ping and pong travel over the first connection
    assert b.switch.node_counters[a.switch.node_id]["duplicates_refused"] == 1
    assert second.outbound.peer is None and second.inbound.peer is None
    assert isinstance(second.inbound.end_reason, PeerRejected) and second.inbound.end_reason.reason == "duplicate"
    assert isinstance(second.outbound.end_reason, PeerClosed) and second.outbound.end_reason.code == "duplicate"
    assert first.peer_of(a.switch).try_send(0x20, b"after")
    network.flush()
    assert b.blocks.received(0x20) == [b"after"]
    assert len(a.switch.peers) == len(b.switch.peers) == 1
    assert len(a.switch.connections) == len(b.switch.connections) == 1
    check(a, b)


@pytest.fixture
def dial_network():
    """A MemoryNetwork whose clock records listenTCP/connectTCP, so dial() works in memory."""
    return MemoryNetwork(MemoryReactorClock())


def dial(network, switch, address):
    results = []
    switch.dial(address).addBoth(results.append)
    network.complete_dials()
    network.flush()
    [result] = results
    return result


def test_dial_by_id_and_address(dial_network):
    """dial('ID@host:port') fires with the Peer once the handshake is accepted."""
    a, b = Node(dial_network), Node(dial_network)
    b.switch.listen("tcp:26656:interface=127.0.0.1")
    peer = dial(dial_network, a.switch, f"{b.switch.node_id}@127.0.0.1:26656")
    assert peer is a.switch.peers[b.switch.node_id]
    assert peer.is_outbound and peer.state == "connected"
    check(a, b)


def test_dialing_yourself_by_id_is_refused_at_once(dial_network):
    """dial with our own node id fails with PeerRejected('self') before connecting."""
    a = Node(dial_network)
    failure = dial(dial_network, a.switch, f"{a.switch.node_id}@127.0.0.1:26656")
    assert failure.check(PeerRejected) and failure.value.reason == "self"
    assert a.switch.connections == set()


def test_dialing_your_own_address_is_refused(dial_network, telemetry):
    """dial('host:port') that reaches our own listener fails with PeerRejected('self')."""
    a = Node(dial_network)
    a.switch.listen("tcp:26656:interface=127.0.0.1")
    failure = dial(dial_network, a.switch, "127.0.0.1:26656")
    assert failure.check(PeerRejected) and failure.value.reason == "self"
    assert a.switch.peers == {} and a.switch.connections == set()
    assert {e["reason"] for e in telemetry.named("peer_rejected")} == {"self"}
    assert [c[0] for c in a.blocks.calls] == []
    check(a)


def test_dialing_a_connected_id_is_refused_at_once(dial_network):
    """dial('ID@...') for a node already connected fails with PeerRejected('duplicate')."""
    a, b = Node(dial_network), Node(dial_network)
    dial_network.connect(a.switch, b.switch)
    failure = dial(dial_network, a.switch, f"{b.switch.node_id}@127.0.0.1:26656")
    assert failure.check(PeerRejected) and failure.value.reason == "duplicate"


def test_wrong_id_is_peer_id_mismatch_naming_both_ids(dial_network):
    """The node at the address has another id: PeerIdMismatch names expected and actual."""
    a, b = Node(dial_network), Node(dial_network)
    b.switch.listen("tcp:26656:interface=127.0.0.1")
    wrong = new_node_id()
    failure = dial(dial_network, a.switch, f"{wrong}@127.0.0.1:26656")
    assert failure.check(PeerIdMismatch)
    error = failure.value
    assert (error.expected, error.actual) == (wrong, b.switch.node_id)
    assert wrong in str(error) and b.switch.node_id in str(error)
    assert error.reason == "id_mismatch"
    assert a.switch.peers == {} and b.switch.peers == {}
    assert [c[0] for c in a.blocks.calls] == []
    check(a, b)


def test_dial_to_a_closed_port_fails(dial_network):
    """A refused TCP connection fails the dial with the connection error."""
    a = Node(dial_network)
    results = []
    a.switch.dial("127.0.0.1:9").addBoth(results.append)
    dial_network.complete_dials()
    dial_network.clock.advance(1)  # HostnameEndpoint reports after its attempt delay
    [failure] = results
    assert failure.check(ConnectionRefusedError)


def test_dial_with_a_malformed_address_fails_with_value_error():
    """An address that does not parse fails the Deferred with ValueError."""
    a = Switch([], clock=MemoryReactorClock())
    failures = []
    a.dial("not an address").addErrback(failures.append)
    [failure] = failures
    assert failure.check(ValueError)


def test_max_inbound_peers_is_enforced(network, telemetry):
    """Past max_inbound_peers an inbound peer is refused with 'inbound_limit'; room reopens."""
    hub = Node(network, config=Config(max_inbound_peers=2))
    spokes = [Node(network) for _ in range(4)]
    links = [network.connect(s.switch, hub.switch) for s in spokes[:3]]
    assert set(hub.switch.peers) == {s.switch.node_id for s in spokes[:2]}
    refused = links[2]
    assert refused.inbound.peer is None
    assert isinstance(refused.outbound.end_reason, PeerClosed) and refused.outbound.end_reason.code == "inbound_limit"
    assert [e["reason"] for e in telemetry.named("peer_rejected")] == ["inbound_limit"]
    # The refused spoke never had a session (the listener refuses before answering its
    # session request): its reactors saw nothing, and its dial failed with the reason.
    assert spokes[2].blocks.calls == []
    assert refused.outbound.handshake.called
    refused.outbound.handshake.addErrback(lambda f: f.trap(PeerClosed))
    # A peer leaving makes room for the next.
    links[0].peer_of(spokes[0].switch).close()
    network.flush()
    network.connect(spokes[3].switch, hub.switch)
    assert set(hub.switch.peers) == {spokes[1].switch.node_id, spokes[3].switch.node_id}
    check(hub, *spokes)


def test_max_outbound_peers_is_enforced(network):
    """Past max_outbound_peers an outbound connection is refused with 'outbound_limit'."""
    dialer = Node(network, config=Config(max_outbound_peers=1))
    others = [Node(network), Node(network)]
    network.connect(dialer.switch, others[0].switch)
    second = network.connect(dialer.switch, others[1].switch)
    assert isinstance(second.outbound.end_reason, PeerRejected)
    assert second.outbound.end_reason.reason == "outbound_limit"
    assert list(dialer.switch.peers) == [others[0].switch.node_id]


class Exploding(RecordingReactor):
    """Raises from the methods named in ``explode``."""

    def __init__(self, channels, explode):
        super().__init__(channels)
        self.explode = explode

    def add_peer(self, peer):
        super().add_peer(peer)
        if "add_peer" in self.explode:
            raise RuntimeError("add_peer blew up")

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        if "receive" in self.explode:
            raise RuntimeError("receive blew up")

    def remove_peer(self, peer, reason):
        super().remove_peer(peer, reason)
        if "remove_peer" in self.explode:
            raise RuntimeError("remove_peer blew up")


def test_a_raising_reactor_does_not_kill_the_node(network, telemetry):
    """Under Config.reactor_errors "log", exceptions from add_peer, receive and remove_peer
    are logged as reactor_error; the connection, the other reactors and later messages
    carry on (the default, "drop", is tests/integration/test_reactor_policy.py's)."""
    bad = Exploding(BLOCKS, {"add_peer", "receive", "remove_peer"})
    good = RecordingReactor(VOTES)
    b = network.switch([bad, good], config=Config(reactor_errors="log"))
    a = Node(network)
    link = network.connect(a.switch, b)
    sender = link.peer_of(a.switch)
    for i in range(3):
        sender.try_send(0x20, b"b%d" % i)
        sender.try_send(0x30, b"v%d" % i)
    network.flush()
    assert bad.received(0x20) == [b"b0", b"b1", b"b2"]  # every message still delivered
    assert good.received(0x30) == [b"v0", b"v1", b"v2"]
    assert link.peer_of(b).state == "connected"
    sender.close()
    network.flush()
    assert [c[0] for c in good.calls][-1] == "remove_peer"
    errors = telemetry.named("reactor_error")
    assert [e["method"] for e in errors] == ["add_peer", "receive", "receive", "receive", "remove_peer"]
    assert {e["reactor"] for e in errors} == {"Exploding"}
    assert {e["peer_id"] for e in errors} == {a.switch.node_id}
    assert all(e["log_failure"].check(RuntimeError) for e in errors)
    b._check_invariants()


def test_broadcast_sends_to_every_peer(network):
    """broadcast fires with {node_id: True} and each peer's reactor receives the message."""
    hub = Node(network)
    spokes = [Node(network) for _ in range(3)]
    for s in spokes:
        network.connect(s.switch, hub.switch)
    results = []
    hub.switch.broadcast(0x30, b"to all").addCallback(results.append)
    network.flush()
    assert results == [{s.switch.node_id: True for s in spokes}]
    for s in spokes:
        assert s.votes.received(0x30) == [b"to all"]


def test_stop_service_closes_every_connection(network):
    """stopService sends close packets; the other side's remove_peer gets PeerClosed('shutdown'),
    our own reactors get ConnectionClosed('shutdown'), and the Deferred fires when all are gone."""
    hub = Node(network)
    spokes = [Node(network) for _ in range(2)]
    for s in spokes:
        network.connect(s.switch, hub.switch)
    hub.switch.startService()
    done = []
    hub.switch.stopService().addCallback(done.append)
    network.flush()
    assert done == [None]
    for s in spokes:
        [(_, reason)] = s.blocks.removed()
        assert isinstance(reason, PeerClosed) and reason.code == "shutdown"
        assert s.switch.peers == {}
    reasons = [r for _, r in hub.blocks.removed()]
    assert len(reasons) == 2 and all(isinstance(r, ConnectionClosed) and r.code == "shutdown" for r in reasons)
    assert hub.switch.peers == {} and hub.switch.connections == set()
    check(hub, *spokes)


def test_stop_service_with_waiting_sends(network):
    """stopService with a send waiting for room closes cleanly; the send fires False."""
    hub = Node(network)
    spoke = Node(network)
    link = network.connect(spoke.switch, hub.switch)
    peer = link.peer_of(hub.switch)
    link.inbound.pauseProducing()  # the transport is full
    while peer.try_send(0x30, b"filler"):
        pass
    waiting = peer.send(0x30, b"waiting")
    done = []
    hub.switch.stopService().addCallback(done.append)
    network.flush()
    assert done == [None]
    assert waiting.result is False


def test_stop_service_stops_listening(dial_network):
    """stopService stops the listening ports it opened."""
    a = Node(dial_network)
    a.switch.listen("tcp:26656:interface=127.0.0.1")
    [port] = a.switch._ports
    stopped = []
    port.stopListening = lambda: stopped.append(port)
    a.switch.stopService()
    assert stopped == [port]


def test_reactor_base_class_is_a_no_op():
    """The Reactor base class can be used as is: no channels, every callback does nothing."""
    r = Reactor()
    assert r.get_channels() == []
    assert r.add_peer(object()) is None
    assert r.remove_peer(object(), Exception()) is None
    assert r.receive(1, object(), b"") is None


def test_reactors_know_their_switch(network):
    """A Switch sets .switch on every reactor it is given."""
    node = Node(network)
    assert node.blocks.switch is node.switch and node.votes.switch is node.switch


def test_stop_service_reports_each_sessions_own_undelivered_counts(network):
    """Stopping ends every session with its own reason and its own undelivered counts."""
    hub, left, right = Node(network), Node(network), Node(network)
    to_left = network.connect(hub.switch, left.switch).peer_of(hub.switch)
    to_right = network.connect(hub.switch, right.switch).peer_of(hub.switch)
    for _ in range(2):
        assert to_left.try_send(0x20, b"to left")
    assert to_right.try_send(0x20, b"to right")
    network.flush()  # delivered, but no ack yet (the clock has not moved)
    hub.switch.stopService()
    network.flush()
    reasons = {peer.node_id: reason for peer, reason in hub.blocks.removed()}
    assert reasons[left.switch.node_id] is not reasons[right.switch.node_id]
    assert reasons[left.switch.node_id].unconfirmed == {0x20: 2}
    assert reasons[right.switch.node_id].unconfirmed == {0x20: 1}


def accepted_until_refused(h, size: int = 4000, at_most: int = 200) -> int:
    """try_send ``size``-byte messages on 0x20 until one is refused: how many were taken."""
    for count in range(at_most):
        if not h.peer.try_send(0x20, bytes(size)):
            return count
    return at_most


def test_a_new_config_reaches_the_node_wide_budget_of_unacknowledged_bytes():
    """``switch.config = ...`` applies at once to the budget every session shares: past
    the channel's reserve, a node whose max_unacked_bytes was lowered after it was made
    refuses where one made with that limit does, and a node with the old limit does not."""
    channels = [ChannelDescriptor(0x20, send_queue_capacity=256, recv_message_capacity=1 << 20)]
    roomy = Config(max_unacked_bytes=1 << 30, recovery_buffer_bytes=1 << 30)
    tight = roomy.replace(max_unacked_bytes=5_000)
    changed = open_switch_connection(channels=channels, config=roomy)
    changed.switch.config = tight
    made_tight = open_switch_connection(channels=channels, config=tight)
    left_roomy = open_switch_connection(channels=channels, config=roomy)
    limit = accepted_until_refused(made_tight)
    assert accepted_until_refused(changed) == limit
    assert accepted_until_refused(left_roomy) > limit


def test_a_peer_provides_what_its_connection_hands_it():
    """The connection talks to the Peer it carries only through ICarriedSession."""
    h = open_switch_connection()
    assert verifyObject(ICarriedSession, h.peer)
