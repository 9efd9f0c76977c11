"""What the WebSocket modules share (specs/websocket.md): the error of the WebSocket
layer, the bound on an HTTP head, and ``IUpgradeAdmission``, through which a listener's
WebSocket connection is admitted from TCP accept. A leaf module, so that mconn.websocket
(autobahn), mconn.websocket_endpoints (no autobahn until a WebSocket is used) and
mconn.connections need not import each other."""

from __future__ import annotations

from zope.interface import Interface

from mconn.errors import ConnectionLost

#: Largest HTTP head (an upgrade request or answer, a proxy's answer to CONNECT) read
#: before its end: nginx's default header buffers are 8 KiB; a node's own upgrade is a
#: few hundred bytes.
MAX_HTTP_HEAD_BYTES = 16384


class WebSocketError(ConnectionLost):
    """The WebSocket layer ended a connection; the message says which rule and values."""


class IUpgradeAdmission(Interface):
    """Admission of a listener's WebSocket connections from TCP accept (specs/websocket.md
    section 4): the owner of the connections above (``mconn.connections.ConnectionSet``)
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
