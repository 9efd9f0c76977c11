"""mconn.testing.FakePeer follows Peer for node info and typed channels (specs/reactor-api.md
sections 8, 10 and 11), so a reactor using them can be unit-tested without a network."""

import pytest

from mconn import ChannelDescriptor, NodeInfo
from mconn.testing import FakePeer
from typed_messages import Tx


def test_fake_peer_carries_node_info():
    """FakePeer(node_info=...) is peer.node_info; None by default, as a peer without one."""
    info = NodeInfo(network="chain-a", moniker="fake")
    assert FakePeer(node_info=info).node_info is info
    assert FakePeer().node_info is None


def test_fake_peer_encodes_typed_messages():
    """On a typed channel the fake encodes objects as Peer does and records the bytes; a
    wrong type is the same TypeError; raw channels still take bytes only."""
    peer = FakePeer(channels=[ChannelDescriptor(0x40, message_type=Tx), ChannelDescriptor(0x41)])
    assert peer.try_send(0x40, Tx(nonce=3))
    assert peer.sent_on(0x40) == [Tx(nonce=3).SerializeToString()]
    assert Tx.FromString(peer.sent_on(0x40)[0]) == Tx(nonce=3)
    with pytest.raises(TypeError, match="channel 0x40 carries Tx messages, got dict"):
        peer.try_send(0x40, {"nonce": 3})
    with pytest.raises(TypeError, match="messages are bytes"):
        peer.try_send(0x41, Tx(nonce=3))
