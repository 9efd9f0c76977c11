"""What the WebSocket modules share (specs/websocket.md): the error of the WebSocket
layer and the bound on an HTTP head. A leaf module, so that mconn.websocket (autobahn)
and mconn.websocket_endpoints (no autobahn until a WebSocket is used) need not import
each other."""

from __future__ import annotations

from mconn.errors import ConnectionLost

#: Largest HTTP head (an upgrade request or answer, a proxy's answer to CONNECT) read
#: before its end: nginx's default header buffers are 8 KiB; a node's own upgrade is a
#: few hundred bytes.
MAX_HTTP_HEAD_BYTES = 16384


class WebSocketError(ConnectionLost):
    """The WebSocket layer ended a connection; the message says which rule and values."""
