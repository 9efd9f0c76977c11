"""mconn.testing: the public test doubles behave like the real Peer and Switch."""

import pytest
from twisted.internet.task import Clock

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, Reactor
from mconn.testing import FakePeer, MemoryNetwork, connected_switches

CHANNELS = [ChannelDescriptor(0x40, recv_message_capacity=10), ChannelDescriptor(0x41)]


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


def test_fake_peer_without_channels_accepts_anything():
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
