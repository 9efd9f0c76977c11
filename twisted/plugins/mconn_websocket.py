"""twistd/endpoint plugin: the ``ws:`` and ``wss:`` server endpoint strings (specs/websocket.md).

``ws:tcp:26656:interface=127.0.0.1:path=/mconn`` listens as ``tcp:26656:interface=127.0.0.1``
would and upgrades each connection to WebSocket at ``/mconn`` (``/`` if no ``path=``);
``wss:`` puts the Switch's TLS beneath the WebSocket. Everything but ``path=`` is the
description of the endpoint beneath, given to ``serverFromString``; a ``:`` or ``=`` in
it is escaped with ``\\`` as in any endpoint string. A bare port (``ws:26656``) means
``tcp:26656``.
"""

from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IStreamServerEndpointStringParser
from twisted.plugin import IPlugin
from zope.interface import implementer

from mconn.net.websocket_endpoints import WebSocketServerEndpoint


@implementer(IPlugin, IStreamServerEndpointStringParser)
class _WebSocketParser:
    def __init__(self, prefix: str, secure: bool) -> None:
        self.prefix = prefix
        self.secure = secure

    def parseStreamServer(self, reactor, *args, **kwargs):
        path = kwargs.pop("path", "/")
        if not args:
            raise ValueError(f"{self.prefix}: needs the endpoint beneath, e.g. {self.prefix}:tcp:26656:path=/mconn")
        if args[0].isdigit():
            args = ("tcp",) + args
        inner = ":".join([_escape(a) for a in args] + [f"{_escape(k)}={_escape(v)}" for k, v in kwargs.items()])
        return WebSocketServerEndpoint(reactor, serverFromString(reactor, inner), path=path, secure=self.secure)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


ws = _WebSocketParser("ws", secure=False)
wss = _WebSocketParser("wss", secure=True)
