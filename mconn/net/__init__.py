"""mconn's Twisted adapter and the transports beneath it.

The rule: this layer drives the core (mconn.core) and talks up to the switch only
through the interfaces declared in ``owner``. The modules, in reading order:

* ``owner``: ``IConnectionOwner`` and ``ConnectionContext``, what a connection asks its owner;
  ``ICarriedSession``, what it hands the session it carries; and
  ``IUpgradeAdmission``, how a WebSocket connection is admitted from TCP accept;
* ``protocol``: ``MConnectionProtocol``, the thin Protocol around a core Connection;
* ``timers``: every connection's timer on one DelayedCall per clock;
* ``write_ahead``: how many bytes are written ahead of the scheduler;
* ``write_through``: a read's reply sent at once; the read at accept;
* ``socket_options``: TCP_NODELAY, keepalive, user timeout, notsent lowat;
* ``tls``: certificates, contexts and the node id a certificate proves (specs/tls.md);
* ``tls_transport``: TLS beneath the protocol, and the pre-hello start;
* ``websocket_frames``: RFC 6455 frames, sans I/O;
* ``http_upgrade``: a WebSocket upgrade's head checked, the client behind a trusted proxy;
* ``websocket``: the WebSocket carriers and their factories (specs/websocket.md);
* ``websocket_endpoints``: ws:// and wss:// endpoints, HTTP proxies.
"""
