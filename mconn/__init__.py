"""mconn: many prioritized channels over one connection per peer, for Twisted.

The public API (specs/reactor-api.md)::

    from mconn import ChannelDescriptor, Config, NodeKey, Peer, Reactor, Switch
"""

from mconn.channel import ChannelDescriptor
from mconn.config import Config
from mconn.errors import (
    ConnectionClosed,
    ConnectionLost,
    HandshakeError,
    HandshakeTimeout,
    IncompatiblePeer,
    LocalProtocolError,
    MalformedPacket,
    MConnError,
    MessageTooLarge,
    PacketTooLarge,
    PeerClosed,
    PeerIdMismatch,
    PeerRejected,
    PongTimeout,
    ProtocolError,
    RemoteProtocolError,
    UnexpectedPacket,
    UnknownChannel,
    UnknownPacketType,
)
from mconn.node_key import NodeKey
from mconn.peer import Peer
from mconn.reactor import Reactor
from mconn.switch import Switch

__all__ = [
    "ChannelDescriptor",
    "Config",
    "NodeKey",
    "Peer",
    "Reactor",
    "Switch",
    "MConnError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "MalformedPacket",
    "UnknownPacketType",
    "PacketTooLarge",
    "UnexpectedPacket",
    "UnknownChannel",
    "MessageTooLarge",
    "HandshakeError",
    "HandshakeTimeout",
    "IncompatiblePeer",
    "PongTimeout",
    "PeerRejected",
    "PeerIdMismatch",
    "PeerClosed",
    "ConnectionLost",
    "ConnectionClosed",
]
