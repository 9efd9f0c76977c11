"""What a connection knows and whom it asks: ``IConnectionOwner`` and ``ConnectionContext``.

``mconn.net.protocol.MConnectionProtocol`` calls the owner's declared methods and nothing
else of it; the owner of a Switch's connections is ``mconn.switch.connection_set.ConnectionSet``.
A connection's facts known before it exists come in one frozen ``ConnectionContext``.
Both are re-exported by ``mconn.net.protocol``.
"""

from __future__ import annotations

import dataclasses

from zope.interface import Attribute, Interface


class IConnectionOwner(Interface):
    """What a connection asks of its owner: every decision about the peer on it.

    A Switch provides it through ``mconn.switch.connection_set.ConnectionSet`` (``IConnectionOwner(
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
        :raises PeerRejected: the peer is refused (a close packet with its close code).
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


class IUpgradeAdmission(Interface):
    """Admission of a listener's WebSocket connections from TCP accept (specs/websocket.md
    section 4): the owner of the connections above (``mconn.switch.connection_set.ConnectionSet``)
    counts one in its address group while its upgrade is under way, as a pending
    handshake, so that pending upgrades give way like pending handshakes.

    ``protocol`` is the mconn protocol the WebSocket will carry (built at accept, connected
    once the upgrade succeeds). Its own ``admit`` then finds it admitted already: it is
    counted once, from accept until its handshake ends or it is gone.
    """

    def admit_upgrade(protocol, host, remote_address, give_way):
        """Admit a connection from ``host`` (the TCP peer; None: counted in no address
        and in the group None: a trusted proxy's, whose client is not known yet) at accept.
        ``give_way(rejection)`` drops it if a newcomer evicts it before the upgrade is done.

        :returns: None, or the PeerRejected it is refused with (it is counted nowhere).
        """

    def upgrade_addressed(protocol, host):
        """The upgrade named the client behind a trusted proxy: ``host`` counts from now
        on instead (per address and group), if its limits allow.

        :returns: None, or the PeerRejected it is refused with (it is counted nowhere
            any more; ``upgrade_gone`` is still called when it is gone).
        """

    def upgrade_gone(protocol):
        """The connection is gone; if the protocol above never connected, its counts are
        released here (else by the protocol's own ``connection_lost``)."""


class ICarriedSession(Interface):
    """What a connection hands the session it carries (a Switch's ``Peer``): the calls of
    the read path up, the one way a connection talks to its Peer. Not for reactors."""

    def deliver(channel_id, message):
        """A whole message arrived on ``channel_id``: hand it to the reactors (counted
        delivered once they have it; specs/reactor-api.md section 4.1)."""

    def deliver_run(connection, events, start):
        """``deliver`` each ``MessageReceived`` of ``events`` (a read's events) from index
        ``start`` on, in order, while ``connection`` carries this session and has no
        ``end_reason``; returns the index of the first event it did not handle."""

    def acknowledged(delivered):
        """The peer's ack: ``delivered`` maps channel ids to how many messages its
        reactors have, cumulatively (specs/resume.md section 2.3)."""

    def room_made():
        """The scheduler took messages from the queues: move waiting sends in. Returns
        True if any were moved (the connection pumps again)."""
