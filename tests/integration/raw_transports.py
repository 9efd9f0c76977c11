"""A listening Switch on any transport and address family, and raw peers that reach it
over the whole transport (TLS done with a key of their own, WebSocket upgraded) and then
speak scripted mconn bytes. For the tests of one bound on every transport a stranger can
reach it by (tests/integration/test_packet_floor.py, test_reactor_backlog.py).
"""

from __future__ import annotations

from twisted.internet.protocol import Factory

from helpers import RawPeer, bounded, the_reactor
from mconn import ChannelDescriptor, Config, NodeKey, Switch, TLSOptions
from mconn.core.address import PeerAddress
from mconn.core.handshake import make_hello
from mconn.net.websocket_endpoints import dial_endpoint
from mconn.core.wire import HelloTag, PacketType, SessionRequest, encode_extension, encode_hello, encode_session_request

PATH = "/mconn"
#: (transport, host) of every cell: tcp, tls, ws, wss by IPv4 and IPv6 loopback.
CELLS = [(t, h) for t in ("tcp", "tls", "ws", "wss") for h in ("127.0.0.1", "::1")]
CELL_IDS = [f"{t}-{'v6' if ':' in h else 'v4'}" for t, h in CELLS]


def dialer_hello_announcing(node_id: str, *, payload: int = 1024, channels=(ChannelDescriptor(0x20),)) -> bytes:
    """A dialer's whole hello packet (a fresh session request), announcing ``payload``."""
    request = SessionRequest(session_id=b"\xab" * 16, resume=False)
    hello = make_hello(
        node_id=node_id,
        channels=list(channels),
        max_packet_payload=payload,
        fields=((HelloTag.SESSION, encode_session_request(request)),),
    )
    return encode_extension(PacketType.HELLO, encode_hello(hello))


class Cell:
    """A started Switch of ``reactors`` listening on ``transport`` at ``host``."""

    def __init__(self, transport: str, host: str, reactors, config: Config) -> None:
        self.transport, self.host, self.config = transport, host, config
        self.secure = transport in ("tls", "wss")
        self.switch = Switch(
            reactors,
            clock=the_reactor(),
            config=config,
            tls=TLSOptions.identity(NodeKey.generate()) if self.secure else None,
        )
        self.switch.startService()
        self.address: PeerAddress | None = None

    async def listen(self) -> Cell:
        tcp = f"{'tcp6' if ':' in self.host else 'tcp'}:0:interface={self.host.replace(':', chr(92) + ':')}"
        ws = self.transport in ("ws", "wss")
        port = await self.switch.listen(f"{self.transport}:{tcp}:path={PATH}" if ws else tcp)
        scheme = self.transport if ws else "tcp"
        self.address = PeerAddress(self.switch.node_id, self.host, port.getHost().port, scheme, PATH if ws else "")
        return self

    async def raw_peer(self, greeting_for) -> tuple[RawPeer, str]:
        """A raw peer with a key of its own, connected over the whole transport; it sends
        ``greeting_for(node_id)`` first. Returns it and its node id."""
        key = NodeKey.generate()
        tls = TLSOptions.identity(key) if self.secure else None
        endpoint = dial_endpoint(self.address, clock=the_reactor(), config=self.config.replace(http_proxy=""), tls=tls)
        raw = RawPeer(greeting_for(key.node_id))
        await bounded(endpoint.connect(Factory.forProtocol(lambda: raw)))
        return raw, key.node_id
