"""A Peer costs little memory until used (bench/history/2026-11-24-night.md, "Connect storm": lighter
peers): slotted, its receiving side built at the first message it receives, our channels' capacities and codecs
shared by every Peer of a Switch (mconn.switch.channel_shape). Over mconn.testing's in-memory network.
"""

import pytest

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config
from mconn.switch.peer_delivery import PeerDelivery
from mconn.switch.channel_shape import ChannelShape
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x30, send_queue_capacity=3, recv_message_capacity=5000)]
CONFIG = Config(stats_interval=0, ack_every_messages=2)


def _pair(network, listener_reactor, dialer_channels=CHANNELS):
    listener = network.switch([listener_reactor], config=CONFIG)
    dialer = network.switch([RecordingReactor(dialer_channels)], config=CONFIG)
    listener.listen("tcp:26656")
    dialed = dialer.dial(network.dial_address(listener))
    network.flush()
    return listener, dialed.result


def test_the_receiving_side_is_built_at_the_first_message_and_delivers_every_message_in_order():
    """A new session's Peer has no __dict__, no PeerDelivery and no dict of the peer's
    channels until read; the first message builds the receiving side and is delivered, later ones go straight to it, in order, and are acknowledged
    (ack_every_messages 2: the sender's recovery buffer empties)."""
    reactor = RecordingReactor(CHANNELS)
    network = MemoryNetwork()
    listener, sender = _pair(network, reactor)
    here = next(iter(listener.peers.values()))
    assert not hasattr(here, "__dict__")
    assert here._receiving is None
    assert here._channels is None  # built when first read, then kept
    assert list(here.channels) == [0x30] and here.channels[0x30].recv_message_capacity == 5000
    assert here.channels is here.channels
    assert sender.try_send(0x30, b"one")
    network.flush()
    first = here._receiving
    assert isinstance(first, PeerDelivery)
    assert sender.try_send(0x30, b"two") and sender.try_send(0x30, b"three")
    network.flush()
    assert here._receiving is first  # built once, kept for the session
    received = [call[3] for call in reactor.calls if call[0] == "receive"]
    assert received == [b"one", b"two", b"three"]
    assert here._receiving.backlog_bytes == 0 and here._receiving.busy == {}
    assert here.session.delivered(0x30) == 3
    network.clock.advance(CONFIG.ack_interval + 0.01)
    network.flush()
    assert sender.session.unconfirmed() == {}


def test_a_session_that_ends_before_receiving_anything_never_builds_the_receiving_side():
    """Suspend and end with no message received: detach and end have nothing to stop, and
    the reactors still get remove_peer."""
    reactor = RecordingReactor(CHANNELS)
    network = MemoryNetwork()
    listener, sender = _pair(network, reactor)
    here = next(iter(listener.peers.values()))
    sender.close("bye")
    network.flush()
    assert here.state == "closed" and here._receiving is None
    assert [call[0] for call in reactor.calls] == ["add_peer", "remove_peer"]


def test_every_peer_of_a_switch_shares_one_channel_shape_and_keeps_its_own_limits():
    """Two sessions on one listener refer to the same ChannelShape (our capacities and
    codecs); each keeps its own limits, the smaller recv_message_capacity of both sides,
    and a message above it is refused with both sizes named."""
    network = MemoryNetwork()
    reactor = RecordingReactor(CHANNELS)
    listener, first = _pair(network, reactor, [ChannelDescriptor(0x30, recv_message_capacity=100)])
    other = network.switch([RecordingReactor(CHANNELS)], config=CONFIG)
    other.dial(network.dial_address(listener))
    network.flush()
    peers = list(listener.peers.values())
    assert len(peers) == 2
    assert peers[0]._shape is peers[1]._shape is listener._sessions.shape
    shape = peers[0]._shape
    assert isinstance(shape, ChannelShape)
    assert shape.send_capacity == {0x30: 3} and shape.recv_capacity == {0x30: 5000} and shape.codecs == {}
    limits = sorted(p._limits[0x30] for p in peers)
    assert limits == [100, 5000]
    small = next(p for p in peers if p._limits[0x30] == 100)
    with pytest.raises(ValueError, match=r"101 bytes .* recv_message_capacity 100 \(ours 5000, peer's 100\)"):
        small.try_send(0x30, b"x" * 101)
    with pytest.raises(TypeError, match="messages are bytes, got str"):
        small.try_send(0x30, "text")
    assert small.try_send(0x30, bytearray(b"fits"))
