"""Made-up identities share their network group's part of the PEX book, whatever the
transport says the host is (specs/pex.md section 3.4).

A peer's source group comes from its transport's host (``peer.remote_host``), never from
the node id it claims. Before, the host was parsed back from ``remote_address`` text,
which failed for an IPv6 host (``::1:4242``, no brackets) and for a WebSocket client
behind a trusted proxy (port 0), and the group fell back to one per node id: 400 made-up
identities from ``::1`` booked 400 entries where a group may hold
``new_buckets_per_group * bucket_size`` (128).

Real Switches with a PexReactor on the real reactor; the identities are raw sockets
speaking mconn bytes (over TCP from ``::1``; over WebSocket from 127.0.0.1, the trusted
proxy, each naming its client in X-Forwarded-For). Each announces a public listen
address, and over TCP the identities the victim asks for addresses answer with 20 more.
The victim never dials (``target_outbound=0``, and its dials are refused where the
Switch makes its endpoint). And over each of tcp, tls, ws and wss, by IPv4 and IPv6, a
Switch's Peer carries the host its transport names. Every wait is bounded; everything
started is stopped.
"""

from __future__ import annotations

import ipaddress
import random

import pytest
import pytest_twisted
from twisted.internet import defer, endpoints

from helpers import RawPeer, hello_packet, msg_packet, parse_packets, record_dials, the_reactor, until
from integration.test_websocket import client_frame, upgrade_request
from mconn import Config, NodeKey, Switch, TLSOptions
from mconn.core.address import parse_address
from mconn.testing import FakePeer, MemoryNetwork
from reactors.addrbook import NO_HOST_GROUP
from reactors.pex import PexReactor
from reactors.pex_wire import PEX_CHANNEL, PexType, decode_message, encode_addrs
from operators.test_pex import CONFIG as MEMORY_CONFIG
from operators.test_pex import fake_address

pytestmark = pytest.mark.integration

#: Made-up identities over TCP from ::1 (the report's figure), and over WebSocket.
IDENTITIES = 400
WS_IDENTITIES = 160
#: Identities connected at once (below max_connections_per_ip and the handshake limits).
CONCURRENCY = 4
#: The first identities over TCP wait to be asked for addresses and answer with this many.
REPLIERS, REPLY_SIZE = 12, 20
#: Broken sessions end at once: the identities' sessions end as they hang up.
CONFIG = Config(stats_interval=0, resume_grace=0)
PATH = "/mconn"


def public_address(i: int, node_seed: int) -> str:
    """``ID@HOST:26656`` with a public IPv4 host (first octet 20 to 79) and a made-up id."""
    node_id = random.Random(node_seed).randbytes(20).hex()
    return f"{node_id}@{20 + i % 60}.{(i // 60) % 250}.{node_seed % 250}.1:26656"


async def victim(listen: str, config: Config = CONFIG):
    pex = PexReactor(rng=random.Random(7), request_interval=0.05, target_outbound=0)
    switch = Switch([pex], config=config, clock=the_reactor())
    switch.startService()
    record_dials(switch, passthrough=False)  # never leaves the process, whatever is booked
    port = (await switch.listen(listen)).getHost().port
    return switch, pex, port


def capacity(pex) -> int:
    """The most entries one source group can reach: its new buckets, full."""
    return pex.address_book.new_buckets_per_group * pex.address_book.bucket_size


def pex_requests(raw: RawPeer) -> int:
    """PEX requests in what ``raw`` received so far (whole packets only)."""
    data = bytes(raw.data)
    for end in range(len(data), 0, -1):  # the longest prefix of whole packets
        try:
            found = parse_packets(data[:end])
        except AssertionError:
            continue
        return sum(
            1
            for p in found
            if p[0] == 0x03 and p[1] == PEX_CHANNEL and decode_message(p[3], limit=1 << 16)[0] == PexType.REQUEST
        )
    return 0


async def swarm(count: int, identity) -> None:
    """Run ``identity(i)`` for i in range(count), CONCURRENCY at a time."""
    pending = list(range(count))

    async def worker():
        while pending:
            await identity(pending.pop(0))

    workers = [defer.ensureDeferred(worker()) for _ in range(CONCURRENCY)]
    try:
        await defer.gatherResults(workers, consumeErrors=True)
    finally:
        pending.clear()  # one failed: the others stop after their current identity


def assert_within_one_group(pex, group: str) -> None:
    entries = list(pex.book.values())
    assert not [e for e in entries if e.source_group.startswith("source:")], "a group made of a node id"
    flooded = [e for e in entries if e.source_group == group]
    assert len(flooded) == len(entries), {e.source_group for e in entries}
    assert 0 < len(flooded) <= capacity(pex), (len(flooded), capacity(pex))
    pex.address_book.check_invariants()


@pytest_twisted.ensureDeferred
async def test_made_up_identities_from_ipv6_loopback_share_the_loopback_groups_buckets():
    """400 made-up identities connect from ::1, each announcing a public listen address; the first
    ones asked for addresses answer with 20 public addresses each. Every entry they brought is in the
    loopback group, and the group holds at most new_buckets_per_group * bucket_size entries (128)."""
    switch, pex, port = await victim("tcp6:0:interface=\\:\\:1")
    try:

        async def identity(i: int) -> None:
            node_id = random.Random(i).randbytes(20).hex()
            listen = public_address(i, i).partition("@")[2]
            greeting = hello_packet(node_id, pex.get_channels(), listen_address=listen)
            endpoint = endpoints.TCP6ClientEndpoint(the_reactor(), "::1", port)
            raw = await endpoints.connectProtocol(endpoint, RawPeer(greeting))
            try:
                await until(
                    lambda: node_id in switch.peers or raw.lost is not None, "the identity taken in", 5.0, 0.005
                )
                if i < REPLIERS and raw.lost is None:
                    await until(lambda: pex_requests(raw) or raw.lost is not None, "a PEX request", 5.0, 0.01)
                    replied = pex.counters["replies_received"]
                    addresses = [
                        public_address(i * REPLY_SIZE + k, 10_000 + i * REPLY_SIZE + k) for k in range(REPLY_SIZE)
                    ]
                    raw.send(msg_packet(PEX_CHANNEL, encode_addrs([parse_address(a) for a in addresses])))
                    await until(lambda: pex.counters["replies_received"] > replied, "the reply taken", 5.0, 0.005)
            finally:
                raw.transport.abortConnection()

        await swarm(IDENTITIES, identity)
        assert pex.counters["replies_received"] == REPLIERS and pex.penalties == {}
        assert pex.counters["addresses_added"] > capacity(pex) // 2
        assert_within_one_group(pex, "loopback")
        switch._check_invariants()
    finally:
        await defer.maybeDeferred(switch.stopService).addTimeout(10, the_reactor())


@pytest.mark.parametrize(
    "client, group",
    [(lambda i: f"2a01:4f8:{i:x}::1", "2a01:4f8::/32"), (lambda i: f"81.2.{i % 250}.{1 + i // 250}", "81.2.0.0/16")],
    ids=["ipv6-clients", "ipv4-clients"],
)
@pytest_twisted.ensureDeferred
async def test_identities_behind_a_trusted_ws_proxy_share_their_clients_group(client, group):
    """160 made-up identities over ws from the trusted proxy (127.0.0.1), each named by
    X-Forwarded-For as a client of one group (one IPv6 /32 in 160 /64s, or one IPv4 /16): the
    proxied peers have port 0; every entry they announced is in their clients' group, within its
    128 entries."""
    config = CONFIG.replace(ws_trusted_proxies={"127.0.0.1"})
    switch, pex, port = await victim(f"ws:tcp:0:interface=127.0.0.1:path={PATH}", config)
    try:

        async def identity(i: int) -> None:
            node_id = random.Random(20_000 + i).randbytes(20).hex()
            listen = public_address(i, 20_000 + i).partition("@")[2]
            request = upgrade_request(port, PATH).replace(
                b"\r\n\r\n", f"\r\nX-Forwarded-For: {client(i)}\r\n\r\n".encode()
            )
            endpoint = endpoints.TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
            raw = await endpoints.connectProtocol(endpoint, RawPeer(request))
            try:
                await until(lambda: b"\r\n\r\n" in raw.data or raw.lost is not None, "the 101 answer", 5.0, 0.005)
                assert raw.data.startswith(b"HTTP/1.1 101"), bytes(raw.data[:200])
                raw.send(client_frame(0x2, hello_packet(node_id, pex.get_channels(), listen_address=listen)))
                await until(
                    lambda: node_id in switch.peers or raw.lost is not None, "the identity taken in", 5.0, 0.005
                )
                peer = switch.peers.get(node_id)
                assert peer is not None and peer.remote_address.endswith(":0"), peer
                assert ipaddress.ip_address(peer.remote_host) == ipaddress.ip_address(client(i))
            finally:
                raw.transport.abortConnection()

        await swarm(WS_IDENTITIES, identity)
        assert_within_one_group(pex, group)
        switch._check_invariants()
    finally:
        await defer.maybeDeferred(switch.stopService).addTimeout(10, the_reactor())


# -- every transport: the host comes from the transport -------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["v4", "v6"])
@pytest.mark.parametrize("transport", ["tcp", "tls", "ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_a_peers_host_and_source_group_come_from_its_transport(transport, host):
    """Over tcp, tls, ws and wss, by IPv4 and IPv6, the listener's Peer has the dialer's host
    as ``remote_host`` (an IPv6 one without brackets), and an address the dialer tells is booked
    in the group of that host (loopback), not in a group of its node id."""
    secure = transport in ("tls", "wss")
    switches = []
    for _ in range(2):
        pex = PexReactor(rng=random.Random(5), request_interval=60.0, target_outbound=0)
        tls = TLSOptions.identity(NodeKey.generate()) if secure else None
        switch = Switch([pex], config=CONFIG.replace(http_proxy=""), clock=the_reactor(), tls=tls)
        switch.startService()
        switches.append((switch, pex))
    (listener, pex), (dialer, _) = switches
    try:
        tcp = f"{'tcp6' if ':' in host else 'tcp'}:0:interface={host.replace(':', chr(92) + ':')}"
        ws = transport in ("ws", "wss")
        port = (await listener.listen(f"{transport}:{tcp}:path={PATH}" if ws else tcp)).getHost().port
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        target = f"{transport}://{hostport}{PATH}" if ws else hostport
        await defer.ensureDeferred(dialer.dial(f"{listener.node_id}@{target}")).addTimeout(10, the_reactor())
        await until(lambda: dialer.node_id in listener.peers, "the listener's session")
        peer = listener.peers[dialer.node_id]
        assert peer.remote_host == host and host in peer.remote_address, (peer.remote_host, peer.remote_address)
        told = parse_address(public_address(1, 1))
        assert pex.add_address(told, source=dialer.node_id)
        assert pex.book[told.node_id].source_group == "loopback"
    finally:
        for switch, _ in switches:
            await defer.maybeDeferred(switch.stopService).addTimeout(10, the_reactor())


# -- a peer without a host ------------------------------------------------------------------


def test_sources_without_a_host_share_one_group_not_one_each():
    """Peers whose transport has no host (remote_host None) are all in the one no-host group."""
    network = MemoryNetwork()
    pex = PexReactor(request_interval=1.0, rng=random.Random(3), target_outbound=0)
    switch = network.switch([pex], config=MEMORY_CONFIG)
    switch.startService()
    # An address added by hand from a source that is not connected has no host either.
    assert pex.add_address(fake_address(1, host="8.8.4.4"), source="cd" * 20)
    assert pex.book[fake_address(1).node_id].source_group == NO_HOST_GROUP
    for i in range(IDENTITIES):
        peer = FakePeer(channels=pex.get_channels(), listen_address=public_address(i, i).partition("@")[2])
        peer.remote_host = None  # as a Peer over a transport without a host
        pex.add_peer(peer)
    assert {e.source_group for e in pex.book.values()} == {NO_HOST_GROUP}
    assert capacity(pex) // 2 < len(pex.book) <= capacity(pex)
