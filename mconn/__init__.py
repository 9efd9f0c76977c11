"""mconn: many prioritized channels over one connection per peer, for Twisted.

The public API (specs/reactor-api.md)::

    from mconn import ChannelDescriptor, Config, NodeKey, Peer, Reactor, Switch
"""

from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.errors import (
    AckError,
    AuthenticationError,
    CertificateMismatch,
    ConnectionClosed,
    ConnectionLost,
    DecodeError,
    DeliveryNotConfirmed,
    DialGaveUp,
    HandshakeError,
    HandshakeTimeout,
    IncompatibleNode,
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
    ControlFlood,
    ProtocolError,
    ReactorError,
    RemoteProtocolError,
    SessionExpired,
    SessionRejected,
    TLSError,
    UnexpectedPacket,
    UnknownChannel,
    UnknownPacketType,
)
from mconn.core.node_info import NodeInfo, ProtocolVersion
from mconn.core.node_key import NodeKey
from mconn.switch.reactor import MessageCounter, Reactor
from mconn.core.session_table import PeerState

# The Twisted layer is imported on first use, so that importing the pure core
# (mconn.core.wire, mconn.core.connection, ...) never imports Twisted: the core is sans-I/O.
_LAZY = {"Peer": "mconn.switch.peer", "Switch": "mconn.switch.switch", "TLSOptions": "mconn.net.tls"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mconn' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ChannelDescriptor",
    "Config",
    "NodeKey",
    "NodeInfo",
    "ProtocolVersion",
    "Peer",
    "PeerState",
    "Reactor",
    "MessageCounter",
    "Switch",
    "TLSOptions",
    "MConnError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "MalformedPacket",
    "UnknownPacketType",
    "PacketTooLarge",
    "UnexpectedPacket",
    "UnknownChannel",
    "DecodeError",
    "MessageTooLarge",
    "AckError",
    "HandshakeError",
    "HandshakeTimeout",
    "IncompatiblePeer",
    "IncompatibleNode",
    "PongTimeout",
    "ControlFlood",
    "PeerRejected",
    "PeerIdMismatch",
    "CertificateMismatch",
    "AuthenticationError",
    "PeerClosed",
    "ConnectionLost",
    "TLSError",
    "ConnectionClosed",
    "ReactorError",
    "SessionExpired",
    "SessionRejected",
    "DeliveryNotConfirmed",
    "DialGaveUp",
]
