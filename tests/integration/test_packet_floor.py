"""The floor on max_packet_payload on every transport (specs/handshake.md section 3).

A peer announcing a tiny ``max_packet_payload`` would have everything sent to it cut
into packets that small, each costing the sender a packet's work. Over tcp, tls, ws and
wss, by IPv4 and IPv6, a raw peer whose hello announces 1 or 1023 is refused with a
close packet ``PacketPayloadTooSmall`` naming its value and the floor, and no session
starts; one announcing 1024 gets its session. The raw peers ride on the dialer
endpoints mconn itself uses (TLS with a key of their own, WebSocket upgraded), so the
hello is the only thing wrong with them. Every wait is bounded; every Switch stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.protocol import Factory

from helpers import RawPeer, bounded, close_packets_in, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeKey, Reactor, Switch, TLSOptions
from mconn.address import PeerAddress
from mconn.config import MIN_PACKET_PAYLOAD
from mconn.handshake import make_hello
from mconn.websocket_endpoints import dial_endpoint
from mconn.wire import HelloTag, PacketType, SessionRequest, encode_extension, encode_hello, encode_session_request

pytestmark = pytest.mark.integration

PATH = "/mconn"
CONFIG = Config(stats_interval=0, handshake_timeout=5.0, ws_handshake_timeout=5.0)
CELLS = [(t, h) for t in ("tcp", "tls", "ws", "wss") for h in ("127.0.0.1", "::1")]


class Quiet(Reactor):
    def get_channels(self):
        return [ChannelDescriptor(0x20)]


def hello_announcing(payload: int, node_id: str) -> bytes:
    """A dialer's whole hello packet, well-formed, announcing ``payload``."""
    request = SessionRequest(session_id=b"\xab" * 16, resume=False)
    hello = make_hello(
        node_id=node_id, channels=[ChannelDescriptor(0x20)], max_packet_payload=payload,
        fields=((HelloTag.SESSION, encode_session_request(request)),),
    )
    return encode_extension(PacketType.HELLO, encode_hello(hello))


async def listening(transport: str, host: str) -> tuple[Switch, PeerAddress]:
    secure = transport in ("tls", "wss")
    switch = Switch([Quiet()], clock=the_reactor(), config=CONFIG,
                    tls=TLSOptions.identity(NodeKey.generate()) if secure else None)
    switch.startService()
    tcp = f"{'tcp6' if ':' in host else 'tcp'}:0:interface={host.replace(':', chr(92) + ':')}"
    port = await switch.listen(f"{transport}:{tcp}:path={PATH}" if transport in ("ws", "wss") else tcp)
    scheme = transport if transport in ("ws", "wss") else "tcp"
    return switch, PeerAddress(switch.node_id, host, port.getHost().port, scheme, PATH if scheme != "tcp" else "")


async def raw_peer(address: PeerAddress, payload: int, secure: bool) -> tuple[RawPeer, str]:
    """A raw peer over the whole transport, sending a hello that announces ``payload``."""
    key = NodeKey.generate()
    tls = TLSOptions.identity(key) if secure else None
    endpoint = dial_endpoint(address, clock=the_reactor(), config=CONFIG.replace(http_proxy=""), tls=tls)
    raw = RawPeer(hello_announcing(payload, key.node_id))
    await bounded(endpoint.connect(Factory.forProtocol(lambda: raw)))
    return raw, key.node_id


@pytest.mark.parametrize("transport, host", CELLS, ids=[f"{t}-{'v6' if ':' in h else 'v4'}" for t, h in CELLS])
@pytest_twisted.ensureDeferred
async def test_a_hello_below_the_floor_is_refused_and_one_at_it_is_accepted(transport, host):
    """Hellos announcing 1 and 1023 are refused ``PacketPayloadTooSmall`` naming the value
    and 1024, with no session; a hello announcing 1024 gets a session."""
    switch, address = await listening(transport, host)
    secure = transport in ("tls", "wss")
    try:
        for payload in (1, MIN_PACKET_PAYLOAD - 1):
            raw, node_id = await raw_peer(address, payload, secure)
            await until(lambda: raw.lost is not None, f"the peer announcing {payload} to be dropped")
            [(code, text)] = close_packets_in(bytes(raw.data))
            assert code == "PacketPayloadTooSmall"
            assert f"max_packet_payload {payload};" in text and str(MIN_PACKET_PAYLOAD) in text
            assert node_id not in switch.peers
        raw, node_id = await raw_peer(address, MIN_PACKET_PAYLOAD, secure)
        await until(lambda: switch.peers.get(node_id) is not None, "the peer announcing 1024 to get a session")
        assert raw.lost is None and not close_packets_in(bytes(raw.data))
        raw.transport.loseConnection()
    finally:
        await stop_switches(switch)
