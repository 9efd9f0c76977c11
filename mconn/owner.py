"""What a connection knows and whom it asks: ``IConnectionOwner`` and ``ConnectionContext``.

``mconn.protocol.MConnectionProtocol`` calls the owner's declared methods and nothing
else of it; the owner of a Switch's connections is ``mconn.connections.ConnectionSet``.
A connection's facts known before it exists come in one frozen ``ConnectionContext``.
Both are re-exported by ``mconn.protocol``.
"""

from __future__ import annotations

import dataclasses

from zope.interface import Attribute, Interface


class IConnectionOwner(Interface):
    """What a connection asks of its owner: every decision about the peer on it.

    A Switch provides it through ``mconn.connections.ConnectionSet`` (``IConnectionOwner(
    switch)`` adapts a Switch to it). The protocol calls these methods and nothing else
    of its owner; the owner changes the protocol only through the protocol's public
    methods (``carry``, ``abort``, ``close``, ``ended_beneath``, ``watch_bytes``, ``decide``,
    ``pump``).
    """

    clock = Attribute("The IReactorTime every timer of the connection runs on.")
    config = Attribute("The mconn Config: socket options, send_rate, close_linger.")

    def admit(protocol, host):
        """May this connection (from ``host``, None if the transport has no host) start
        its handshake? Asked in connectionMade before a Connection is built; an inbound
        connection admitted counts against ``host`` until ``connection_lost``.

        :returns: None to go on, or the PeerRejected the connection is refused with
            (the protocol sends it as a close packet and reads nothing more).
        """

    def new_core(protocol, now):
        """The sans-I/O Connection for this connection, and the session request our
        hello carries (None for inbound connections).

        :returns: ``(Connection, SessionRequest | None)``.
        """

    def connection_made(protocol):
        """The connection is up and its core built; our hello is on its way."""

    def hello_received(protocol, event):
        """The peer's hello (a HelloReceived): who it is, whether it may join, and (on
        the listening side) its session.

        :returns: None once decided, or a Deferred while an asynchronous decision is
            pending (the protocol holds the events that follow until it fires).
        :raises PeerRejected: the peer is refused (close packet with its reason).
        :raises RemoteProtocolError: the peer broke the protocol (connection failed).
        """

    def session_answered(protocol, answer):
        """The listener's session answer (a SessionAnswer) on our outbound connection.

        :raises PeerRejected: or RemoteProtocolError, as ``hello_received``.
        """

    def peer_rejected(protocol, hello, rejection):
        """A decision refused the peer (``rejection`` is a PeerRejected); count and log it."""

    def protocol_error(protocol, error):
        """The peer broke the protocol with ``error`` (a RemoteProtocolError); log it."""

    def loop_stalled(protocol, late):
        """A timer of this connection fired ``late`` seconds after it was due."""

    def connection_lost(protocol, reason):
        """The transport is gone, for ``reason`` (an mconn error). The last call."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectionContext:
    """What is known of a connection before it exists, built by its factory.

    :param is_outbound: we dialed it.
    :param expected_node_id: the node id dialed, if known (a hello with another is
        PeerIdMismatch).
    :param resuming: the suspended Peer this outbound connection tries to resume, if any.
    :param address: the PeerAddress dialed, kept by the session for re-dialing.
    """

    is_outbound: bool
    expected_node_id: str | None = None
    resuming: object = None
    address: object = None
