"""mconn.testing: the public test doubles behave like the real Peer and Switch."""

import pytest
from twisted.internet.task import Clock

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, Reactor
from mconn.testing import FakePeer, MemoryNetwork, connected_switches

CHANNELS = [ChannelDescriptor(0x40, recv_message_capacity=10), ChannelDescriptor(0x41)]
CLOSE_LINGER = Config().close_linger


class Echo(Reactor):
    """Answers every message on 0x40 with the same bytes reversed."""

    def get_channels(self):
        return CHANNELS[:1]

    def receive(self, channel_id, peer, message):
        peer.try_send(channel_id, message[::-1])


def test_fake_peer_records_what_a_reactor_sends():
    """A reactor unit test: call receive with a FakePeer, look at peer.sent."""
    peer = FakePeer(channels=CHANNELS)
    Echo().receive(0x40, peer, b"abc")
    assert peer.sent == [(0x40, b"cba")]
    assert peer.sent_on(0x40) == [b"cba"] and peer.sent_on(0x41) == []


def test_fake_peer_follows_the_peer_contract():
    """False for unannounced or full channels and after close; ValueError when oversized."""
    peer = FakePeer(channels=CHANNELS)
    assert peer.try_send(0x99, b"x") is False
    with pytest.raises(ValueError, match="recv_message_capacity 10"):
        peer.try_send(0x40, b"x" * 11)
    peer.full_channels.add(0x41)
    assert peer.try_send(0x41, b"x") is False
    assert peer.send(0x41, b"x").result is False
    assert peer.send(0x40, b"ok").result is True
    peer.close("bye")
    assert peer.state == "closed" and peer.close_reason.code == "closed"
    assert peer.try_send(0x40, b"late") is False
    assert peer.sent == [(0x40, b"ok")]


def test_fake_peer_try_send_many_records_a_prefix():
    """FakePeer.try_send_many records messages until one is refused and says how many."""
    peer = FakePeer(channels=CHANNELS)
    assert peer.try_send_many(0x40, [b"a", b"b"]) == 2
    assert peer.try_send_many(0x99, [b"x"]) == 0
    assert peer.sent_on(0x40) == [b"a", b"b"]


def test_fake_peer_without_channels_accepts_anything():
    """A FakePeer made without channels has a node id and accepts any message on any channel."""
    peer = FakePeer()
    assert len(peer.node_id) == 40
    assert peer.try_send(7, b"x" * 100_000)


def test_connected_switches_talk_in_memory():
    """connected_switches gives two handshaken Switches; flush delivers messages."""
    a, b, network = connected_switches([Echo()], [RecordingReactor(CHANNELS[:1])])
    [link] = network.links
    assert link.peer_of(a).node_id == b.node_id and link.peer_of(b).node_id == a.node_id
    link.peer_of(b).try_send(0x40, b"ping")
    network.flush()
    assert b.reactors[0].received(0x40) == [b"gnip"]
    a._check_invariants()
    b._check_invariants()


def test_memory_network_advance_runs_timers():
    """advance moves the shared clock and delivers what the timers wrote (pings and pongs)."""
    clock = Clock()
    network = MemoryNetwork(clock)
    a = network.switch([RecordingReactor(CHANNELS)])
    b = network.switch([RecordingReactor(CHANNELS)])
    link = network.connect(a, b)
    network.advance(300, step=30)
    assert clock.seconds() == 300
    assert link.peer_of(a).round_trip is not None or link.peer_of(b).round_trip is not None
    assert link.peer_of(a).state == "connected"


def test_memory_link_disconnect_is_connection_lost():
    """link.disconnect drops the connection without a close packet."""
    from mconn import ConnectionLost

    ra, rb = RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    a, b, network = connected_switches([ra], [rb], config=Config(resume_grace=0))
    network.links[0].disconnect()
    assert [type(r) for _, r in ra.removed()] == [ConnectionLost]
    assert [type(r) for _, r in rb.removed()] == [ConnectionLost]


# -- the network and its faults ------------------------------------------------------

FAST = Config(ping_interval=2.0, pong_timeout=1.0, resume_grace=0, stats_interval=0)


def pair(config=FAST, **network_options):
    """Switches a and b on a fresh network, b listening and a dialing it (handshake done)."""
    network = MemoryNetwork(**network_options)
    ra, rb = RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    a = network.switch([ra], config=config)
    b = network.switch([rb], config=config)
    b.listen("tcp:26656")
    dialed = []
    a.dial(network.dial_address(b)).addBoth(dialed.append)
    network.flush()
    [peer] = dialed
    assert peer is a.peers[b.node_id], peer
    [link] = network.links_between(a, b)
    return network, a, b, ra, rb, link


def test_dial_goes_through_the_switchs_own_endpoint():
    """Switch.listen and Switch.dial work on a plain Clock: the network routes by host."""
    network, a, b, ra, rb, link = pair()
    assert b.listen_address == f"{network.host_of(b)}:26656"
    assert link.transports[0].getPeer().host == network.host_of(b)
    assert [c[0] for c in rb.calls] == ["add_peer"]
    a._check_invariants()
    b._check_invariants()


def test_dial_to_a_closed_port_is_refused_and_through_a_black_hole_times_out():
    """A dial to a host that does not listen is refused; one through a black hole times out at dial_timeout."""
    from twisted.internet.error import ConnectionRefusedError, TimeoutError

    network, a, b, *_ = pair()
    c = network.switch([RecordingReactor(CHANNELS)], config=FAST)
    refused, timed_out = [], []
    c.dial(f"{network.host_of(a)}:26656").addErrback(refused.append)  # a does not listen
    network.blackhole(c, b)
    c.dial(network.dial_address(b)).addErrback(timed_out.append)
    network.run(FAST.dial_timeout + 1)
    assert refused[0].check(ConnectionRefusedError)
    assert timed_out[0].check(TimeoutError)


def test_reset_loses_what_was_written_but_not_delivered():
    """Both ends lose the connection at once; bytes on their way are gone."""
    from mconn import ConnectionLost

    network, a, b, ra, rb, link = pair()
    assert a.peers[b.node_id].try_send(0x41, b"never arrives")
    in_flight = link.in_flight
    assert in_flight > 0
    link.reset()
    network.flush()
    assert rb.received() == [] and link.lost_bytes == in_flight
    assert [type(r) for _, r in ra.removed()] == [ConnectionLost]
    assert [type(r) for _, r in rb.removed()] == [ConnectionLost]


def test_a_black_hole_is_noticed_only_by_the_keepalive():
    """Nothing moves and nobody is told, until a ping goes unanswered."""
    from mconn import PongTimeout

    network, a, b, ra, rb, link = pair()
    network.blackhole(a, b)
    assert a.peers[b.node_id].try_send(0x41, b"into the hole")
    network.run(FAST.ping_interval)
    assert rb.received() == [] and ra.removed() == [] and rb.removed() == []
    network.run(FAST.pong_timeout + CLOSE_LINGER + 0.1)  # its close packet is lost too
    assert [type(r) for _, r in ra.removed()] == [PongTimeout]
    assert [type(r) for _, r in rb.removed()] == [PongTimeout]
    assert rb.received() == []


def test_a_black_hole_healed_in_time_delivers_late_and_in_order():
    """Healed before the keepalive gives up: the connection carries on (TCP retransmits)."""
    network, a, b, ra, rb, link = pair()
    network.blackhole(a, b)
    peer = a.peers[b.node_id]
    for i in range(3):
        assert peer.try_send(0x41, b"%d" % i)
    network.run(FAST.ping_interval / 2)
    assert rb.received() == []
    network.heal()
    network.flush()
    assert rb.received() == [b"0", b"1", b"2"] and peer.state == "connected"


def test_heal_resets_the_end_that_did_not_give_up():
    """One end aborted during the black hole; its reset was lost; healing delivers it."""
    from mconn import ConnectionLost

    network, a, b, ra, rb, link = pair()
    network.blackhole(a, b)
    link.transports[0].abortConnection()  # a gives up on its own (no close packet)
    network.flush()
    assert [type(r) for _, r in ra.removed()] == [ConnectionLost] and rb.removed() == []
    network.heal(a, b)
    network.flush()
    assert [type(r) for _, r in rb.removed()] == [ConnectionLost]


def test_delay_delivers_after_the_delay():
    """A delayed link delivers a message only once the delay has passed; a negative delay is a ValueError."""
    network, a, b, ra, rb, link = pair()
    network.delay(a, b, 0.5)
    assert a.peers[b.node_id].try_send(0x41, b"slow")
    network.run(0.49)
    assert rb.received() == []
    network.run(0.02)
    assert rb.received() == [b"slow"]
    with pytest.raises(ValueError, match="delay"):
        network.delay(a, b, -1)


def test_a_window_pauses_the_producer_until_the_bytes_arrive():
    """With window set, a transport with that much on its way pauses mconn's writing."""
    network, a, b, ra, rb, link = pair(window=1000)
    network.blackhole(a, b)
    peer = a.peers[b.node_id]
    sent = [i for i in range(20) if peer.try_send(0x41, bytes([i]) * 300)]
    assert link.outbound._paused
    assert 1000 < link.transports[0].in_flight <= 1000 + a.config.write_batch_bytes
    network.heal()
    network.flush()
    assert rb.received(0x41) == [bytes([i]) * 300 for i in sent]


def test_redial_resumes_a_session_after_a_reset():
    """The dialer's real redial path reaches the listener again: the session resumes and
    what was on its way is re-sent, once."""
    network, a, b, ra, rb, link = pair(config=FAST.replace(resume_grace=10))
    peer = a.peers[b.node_id]
    assert peer.try_send(0x41, b"lost with the connection")
    link.reset()
    assert peer.state == "suspended"
    assert peer.try_send(0x41, b"sent while suspended")
    network.run(1)
    assert peer.state == "connected" and peer.resumes == 1
    assert rb.received(0x41) == [b"lost with the connection", b"sent while suspended"]
    assert len(network.links_between(a, b)) == 1


def test_kill_silences_a_node_and_restart_brings_it_back_with_its_key():
    """A killed node hears nothing more; its peers see a reset; the restarted node at the
    same address has the same node id and a new session."""
    from mconn import SessionRejected

    network, a, b, ra, rb, link = pair(config=FAST.replace(resume_grace=10))
    calls_before = list(rb.calls)
    assert a.peers[b.node_id].try_send(0x41, b"to the old process")
    network.kill(b)
    assert not network.is_alive(b)
    network.run(0.01)
    assert a.peers[b.node_id].state in ("suspended", "connecting")
    rb2 = RecordingReactor(CHANNELS)
    b2 = network.restart(b, [rb2])
    assert b2.node_id == b.node_id and b2.listen_address == b.listen_address
    network.run(5)
    assert rb.calls == calls_before  # the dead process saw nothing, timers included
    [(old, reason)] = ra.removed()
    assert isinstance(reason, SessionRejected) and reason.unconfirmed == {0x41: 1}
    assert a.peers[b.node_id] is not old and a.peers[b.node_id].state == "connected"
    assert [c[0] for c in rb2.calls] == ["add_peer"]


def test_a_silent_kill_is_found_by_the_keepalive():
    """The host went down too: no reset; the survivor's keepalive finds out."""
    from mconn import PongTimeout

    network, a, b, ra, rb, link = pair()
    network.kill(b, silently=True)
    network.flush()
    assert ra.removed() == []
    network.run(FAST.ping_interval + FAST.pong_timeout + CLOSE_LINGER + 0.1)
    assert [type(r) for _, r in ra.removed()] == [PongTimeout]


def test_run_fires_every_timer_on_time():
    """run stops at each scheduled call; advance runs them at the end of its step."""
    network = MemoryNetwork()
    seen = []
    network.clock.callLater(1, lambda: seen.append(network.clock.seconds()))
    network.clock.callLater(2, lambda: seen.append(network.clock.seconds()))
    network.run(5)
    assert seen == [1, 2] and network.clock.seconds() == 5


def test_a_node_that_never_lets_time_move_fails_loudly():
    """Endless zero-delay calls would hang a simulated clock: callLater raises instead."""
    network = MemoryNetwork(max_calls_per_instant=100)
    a = network.switch([Reactor()])

    def spin():
        a.clock.callLater(0, spin)

    a.clock.callLater(0, spin)
    with pytest.raises(RuntimeError, match="livelock on 10.0.0.1: 101 calls"):
        network.flush()


def test_a_network_that_does_not_keep_closed_links_drops_them_and_still_counts_their_bytes():
    """With ``keep_closed_links=False`` a link neither end has leaves ``network.links`` (a network of many
    nodes holds no memory for its past connections); its delivered bytes still count. By default every link
    stays (tests read a closed link's figures)."""
    for keep in (True, False):
        network, a, b, ra, rb, link = pair(keep_closed_links=keep)
        assert a.peers[b.node_id].try_send(0x41, b"x" * 100)
        network.flush()
        delivered = link.delivered_bytes
        assert delivered > 100 and network.delivered_bytes() == delivered
        link.reset()
        network.flush()
        assert (link in network.links) is keep and network.links_opened == 1
        assert network.delivered_bytes() == delivered
        network.kill(b)  # iterating the links while a kill drops them is safe
        a.dial(network.dial_address(b), retry_initial_dial=False).addErrback(lambda failure: None)
        network.run(5.0)
        assert network.links_opened == 1 and len(network.links) == (1 if keep else 0)


def test_the_links_know_in_constant_time_what_they_hold_and_refuse_changes_they_cannot_count():
    """``link in network.links`` goes by identity (a removed link is detached: the clock moves nothing on it);
    the list changes by append, remove, pop, del and clear, and refuses the rest by name."""
    network, a, b, ra, rb, link = pair()
    links = network.links
    assert link in links and object() not in links
    links.remove(link)
    assert link not in links and len(links) == 0
    assert a.peers[b.node_id].try_send(0x41, b"held")
    network.run(1.0)
    assert rb.received() == [] and link.in_flight > 0  # detached
    with pytest.raises(ValueError, match="is not in the links"):
        links.remove(link)
    links.append(link)
    assert links.pop() is link and link not in links
    links.append(link)
    del links[0]
    assert link not in links
    for change in (lambda: links.insert(0, link), lambda: links.extend([link]), lambda: links.__setitem__(0, link)):
        with pytest.raises(TypeError, match="append, remove, pop, del and clear only"):
            change()
