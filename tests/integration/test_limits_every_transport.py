"""The limits of specs/security.md on every transport a stranger can reach them by.

One listening Switch per cell of tcp, tls, ws, wss by IPv4 (127.0.0.1) and IPv6 (::1);
its strangers are raw peers that speak mconn bytes over the same transport (the
dialer endpoints mconn itself uses carry them: TLS with a key of their own, WebSocket
upgraded), or bare TCP sockets that never say a word, not even a TLS ClientHello or an
HTTP upgrade. Each test asserts the refusal the table names (by its close code, or the
Switch's refusal count where nothing can be read back), and that an honest Switch
dialing over the same transport afterwards still gets a session: a bound that holds
by shutting everybody out would not do.

Loopback has one IPv6 address, so a second IPv6 address group cannot be shown here; the
/64 grouping is proven in a network namespace (tests/integration/test_ipv6_prefix.py).
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.protocol import Factory

from helpers import RawPeer, bounded, close_packets_in, dialer_hello, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeKey, Reactor, Switch, TLSOptions
from mconn.core.address import PeerAddress
from mconn.core.session import MESSAGE_OVERHEAD
from mconn.core.session_table import PeerState
from mconn.errors import WebSocketError
from mconn.net.websocket_endpoints import dial_endpoint
from mconn.core.wire import PacketType, encode_uvarint

pytestmark = pytest.mark.integration

TRANSPORTS = ("tcp", "tls", "ws", "wss")
FAMILIES = ("127.0.0.1", "::1")
PATH = "/mconn"
BASE = Config(stats_interval=0, handshake_timeout=5.0, ws_handshake_timeout=5.0, max_reconnect_delay=0.05)


class Quiet(Reactor):
    def get_channels(self):
        return [ChannelDescriptor(0x20)]

    def receive(self, channel_id, peer, message):
        pass


class Pusher(Reactor):
    """Sends every new peer empty messages until one is refused (at most LIMIT)."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self.accepted: dict[str, int] = {}

    def get_channels(self):
        return [ChannelDescriptor(0x20, send_queue_capacity=self.LIMIT)]

    def add_peer(self, peer):
        count = 0
        while count < self.LIMIT and peer.try_send(0x20, b""):
            count += 1
        self.accepted[peer.node_id] = count

    def receive(self, channel_id, peer, message):
        pass


class Cell:
    """A listening Switch on one transport and address family, and ways to reach it."""

    def __init__(self, transport: str, host: str, config: Config, reactor: Reactor | None = None) -> None:
        self.transport, self.host = transport, host
        self.secure = transport in ("tls", "wss")
        self.switch = Switch(
            [reactor or Quiet()],
            clock=the_reactor(),
            config=config,
            tls=TLSOptions.identity(NodeKey.generate()) if self.secure else None,
        )
        self.switch.startService()
        self.port = 0

    async def listen(self) -> None:
        interface = self.host.replace(":", "\\:")
        tcp = f"{'tcp6' if ':' in self.host else 'tcp'}:0:interface={interface}"
        if self.transport in ("ws", "wss"):
            port = await self.switch.listen(f"{self.transport}:{tcp}:path={PATH}")
        else:
            port = await self.switch.listen(tcp)
        self.port = port.getHost().port

    def target(self) -> PeerAddress:
        scheme = self.transport if self.transport in ("ws", "wss") else "tcp"
        return PeerAddress(self.switch.node_id, self.host, self.port, scheme, PATH if scheme != "tcp" else "")

    async def stranger(self, *, greeting: bytes | None = None, key: NodeKey | None = None) -> tuple[RawPeer, NodeKey]:
        """A raw peer connected over the whole transport (TLS done, upgrade done); it
        sends ``greeting``, by default a dialer's hello with the node id of its own key."""
        key = key or NodeKey.generate()
        tls = TLSOptions.identity(key) if self.secure else None
        endpoint = dial_endpoint(self.target(), clock=the_reactor(), config=BASE.replace(http_proxy=""), tls=tls)
        hello = dialer_hello(node_id=key.node_id) if greeting is None else greeting
        raw = RawPeer(hello)
        await bounded(endpoint.connect(Factory.forProtocol(lambda: raw)))
        return raw, key

    async def silent_socket(self) -> RawPeer:
        """A bare TCP connection that never sends a byte (no ClientHello, no upgrade)."""
        kind = TCP6ClientEndpoint if ":" in self.host else TCP4ClientEndpoint
        raw = RawPeer()
        await bounded(kind(the_reactor(), self.host, self.port).connect(Factory.forProtocol(lambda: raw)))
        return raw

    async def honest_session(self) -> None:
        """An honest Switch dials over the same transport and gets a session."""
        tls = TLSOptions.identity(NodeKey.generate()) if self.secure else None
        honest = Switch([Quiet()], clock=the_reactor(), config=BASE.replace(http_proxy=""), tls=tls)
        honest.startService()
        try:
            address = self.target()
            text = address.url if address.scheme != "tcp" else f"{address.host}:{address.port}"
            if address.scheme == "tcp" and ":" in address.host:
                text = f"[{address.host}]:{address.port}"
            peer = await bounded(honest.dial(f"{self.switch.node_id}@{text}"))
            assert peer.node_id == self.switch.node_id
        finally:
            await stop_switches(honest)


@pytest.fixture(
    params=[(t, h) for t in TRANSPORTS for h in FAMILIES], ids=lambda p: f"{p[0]}-{'v6' if ':' in p[1] else 'v4'}"
)
def cell_params(request):
    return request.param


async def open_cell(params, reactor: Reactor | None = None, **limits) -> Cell:
    cell = Cell(params[0], params[1], BASE.replace(**limits), reactor)
    await cell.listen()
    return cell


async def lost(raw: RawPeer, what: str) -> None:
    await until(lambda: raw.lost is not None, what)


def closed_with(raw: RawPeer) -> list[str]:
    return [code for code, _ in close_packets_in(raw.data)]


@pytest_twisted.ensureDeferred
async def test_connections_per_address_are_bounded(cell_params):
    """Past ``max_connections_per_ip`` a stranger's next connection is refused ``ip_limit``."""
    cell = await open_cell(cell_params, max_connections_per_ip=2, max_pending_per_group=16)
    try:
        kept = [await cell.stranger(greeting=b"") for _ in range(2)]
        if cell.transport in ("ws", "wss"):  # refused at the upgrade, with an HTTP status
            with pytest.raises(WebSocketError, match=r"\[429\]: ip_limit: 2 connections from"):
                await cell.stranger(greeting=b"")
        else:  # refused with a close packet
            refused, _ = await cell.stranger(greeting=b"")
            await lost(refused, "the third connection from one address to be closed")
            assert closed_with(refused) == ["ip_limit"], close_packets_in(refused.data)
        assert cell.switch.refusals.get("ip_limit") == 1, cell.switch.refusals
        assert all(raw.lost is None for raw, _ in kept)
        for raw, _ in kept:
            raw.transport.loseConnection()
        await until(lambda: not cell.switch.connections, "the kept connections to go")
        await cell.honest_session()
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_silent_sockets_count_as_pending_from_accept_whatever_they_will_carry(cell_params):
    """Bare sockets that never start TLS nor an upgrade are pending handshakes of their
    address group from the TCP accept: past ``max_pending_per_group`` the next one is
    refused ``pending_group_limit``, before any byte is read."""
    cell = await open_cell(cell_params, max_pending_per_group=3, max_connections_per_ip=32)
    try:
        silent = [await cell.silent_socket() for _ in range(3)]
        refused = await cell.silent_socket()
        await lost(refused, "the fourth silent socket of one group to be closed")
        assert cell.switch.refusals.get("pending_group_limit") == 1, cell.switch.refusals
        assert all(raw.lost is None for raw in silent)
        for raw in silent:
            raw.transport.loseConnection()
        await until(lambda: not cell.switch.connections, "the silent sockets to go")
        await cell.honest_session()
    finally:
        await stop_switches(cell.switch)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest_twisted.ensureDeferred
async def test_an_honest_peer_of_another_group_gets_in_past_silent_sockets_filling_the_budget(transport):
    """Silent sockets from 127.0.0.2 hold every pending slot; an honest Switch dialing
    from 127.0.0.3 over the same transport gets in, an old silent socket giving way."""
    cell = await open_cell((transport, "127.0.0.1"), max_pending_handshakes=6, max_pending_per_group=6)
    try:
        silent = []
        for _ in range(6):
            raw = RawPeer()
            endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", cell.port, bindAddress=("127.0.0.2", 0))
            await bounded(endpoint.connect(Factory.forProtocol(lambda raw=raw: raw)))
            silent.append(raw)
        tls = TLSOptions.identity(NodeKey.generate()) if cell.secure else None
        honest = Switch(
            [Quiet()], clock=the_reactor(), tls=tls, config=BASE.replace(http_proxy="", local_address="127.0.0.3")
        )
        honest.startService()
        try:
            address = cell.target()
            text = address.url if address.scheme != "tcp" else f"127.0.0.1:{cell.port}"
            await bounded(honest.dial(f"{cell.switch.node_id}@{text}"))
        finally:
            await stop_switches(honest)
        assert cell.switch.refusals.get("pending_evicted", 0) >= 1, cell.switch.refusals
        # The evicted one is closed at once, or close_linger later if its close packet
        # waits for a TLS handshake that never comes.
        await until(lambda: any(raw.lost is not None for raw in silent), "the evicted socket to be closed")
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_an_oversized_hello_is_refused_at_its_header(cell_params):
    """A hello header claiming more than ``max_hello_size`` closes the connection with
    ``PacketTooLarge`` before its body is buffered."""
    cell = await open_cell(cell_params)
    try:
        header = bytes([PacketType.HELLO]) + encode_uvarint(cell.switch.config.max_hello_size + 1)
        raw, _ = await cell.stranger(greeting=header + b"\x00" * 64)
        await lost(raw, "the oversized hello's connection to close")
        assert "PacketTooLarge" in closed_with(raw), close_packets_in(raw.data)
        assert cell.switch.peers == {}
        await cell.honest_session()
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_a_ping_flood_is_dropped(cell_params):
    """More than ``max_pings_per_interval`` pings in one window end the session with ``ControlFlood``."""
    cell = await open_cell(cell_params, max_pings_per_interval=5)
    try:
        raw, key = await cell.stranger()
        await until(lambda: key.node_id in cell.switch.peers, "the stranger's session")
        raw.send(bytes([PacketType.PING]) * 6)
        await lost(raw, "the flooding connection to close")
        assert "ControlFlood" in closed_with(raw), close_packets_in(raw.data)
        await until(lambda: key.node_id not in cell.switch.peers, "the flooder's session to end")
        await cell.honest_session()
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_strangers_connections_release_every_count(cell_params):
    """After strangers of every kind come and go, the admission counts are back to zero."""
    cell = await open_cell(cell_params)
    try:
        strangers = [await cell.stranger() for _ in range(3)] + [(await cell.silent_socket(), None)]
        for raw, _ in strangers:
            raw.transport.abortConnection()
        await until(lambda: not cell.switch.connections, "every stranger's connection to go")
        cell.switch._check_invariants()
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_dormant_sessions_of_one_address_make_room_instead_of_piling_up(cell_params):
    """Strangers from one address open sessions and break them: at most
    ``max_connections_per_ip`` sessions of that address stay suspended, the oldest giving
    way to each newcomer, which is never refused."""
    cell = await open_cell(cell_params, max_connections_per_ip=3, resume_grace=30.0)
    try:
        for n in range(5):
            raw, key = await cell.stranger()
            await until(lambda key=key: key.node_id in cell.switch.peers, f"stranger {n}'s session")
            raw.transport.abortConnection()
            await until(
                lambda key=key: cell.switch.peers[key.node_id].state is PeerState.SUSPENDED, f"session {n} suspended"
            )
            assert len(cell.switch.peers) <= 3, len(cell.switch.peers)
        assert len(cell.switch.peers) == 3 and "ip_limit" not in cell.switch.refusals, cell.switch.refusals
        cell.switch._check_invariants()
    finally:
        await stop_switches(cell.switch)


@pytest_twisted.ensureDeferred
async def test_a_stranger_that_never_acknowledges_is_sent_a_bounded_number_of_empty_messages(cell_params):
    """A stranger that reads but never acknowledges: the node accepts empty messages for
    it only while their cost (each message 64 bytes) fits its recovery buffer and reserve."""
    pusher = Pusher()
    cell = await open_cell(cell_params, pusher, recovery_buffer_bytes=65536)
    try:
        raw, key = await cell.stranger()
        await until(lambda: key.node_id in pusher.accepted, "the stranger's session")
        accepted = pusher.accepted[key.node_id]
        bound = (65536 + 65536) // MESSAGE_OVERHEAD + 1  # the recovery buffer, the channel's reserve, one
        assert 0 < accepted <= bound < Pusher.LIMIT, accepted
        assert cell.switch.peers[key.node_id].session.unacked_bytes <= 65536 + 65536 + MESSAGE_OVERHEAD
    finally:
        await stop_switches(cell.switch)
