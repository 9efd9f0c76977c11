"""mconn over WebSocket between real Switches on 127.0.0.1 (specs/websocket.md).

ws and wss (identity-mode TLS beneath the WebSocket), mconn's TLS inside ws, one Switch
listening on TCP and ws at once, and what a listener does with bad upgrades and frames
(a raw TCP client speaks the bytes): each closes only that connection with a specific
error while a good peer carries on. Every wait is bounded; every Switch is stopped.
"""

from __future__ import annotations

import base64
import os
import socket
import struct

import pytest
import pytest_twisted
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory

from helpers import RawPeer, sleep, the_reactor, until
from mconn import CertificateMismatch, Config, NodeKey, PeerIdMismatch, Switch
from mconn.net.tls import TLSOptions
from mconn.net.websocket import MAX_UPGRADE_BYTES
from mconn.errors import WebSocketError
from mconn.net.websocket_endpoints import transport_kind

from .test_loopback import CHANNELS, Collector, bounded, stop

pytestmark = pytest.mark.integration

CONFIG = Config(stats_interval=0, max_reconnect_delay=0.05)
PATH = "/mconn"


def node(tls=None, config=CONFIG):
    reactor = Collector(CHANNELS)
    switch = Switch([reactor], tls=tls, clock=the_reactor(), config=config)
    switch.startService()
    return switch, reactor


async def ws_listen(switch, scheme="ws", path=PATH):
    port = await switch.listen(f"{scheme}:tcp:0:interface=127.0.0.1:path={path}")
    return port.getHost().port


def identity():
    return TLSOptions.identity(NodeKey.generate())


async def exchange(a, b, ra, rb, address):
    """b dials ``address`` (a's); a message each way; returns (b's Peer of a, a's Peer of b)."""
    peer = await bounded(b.dial(address))
    peer_a = await bounded(ra.added)
    big = os.urandom(200_000)  # several WebSocket messages, cut anywhere by TCP
    assert peer.try_send(0x20, big) and peer_a.try_send(0x30, b"back")
    await ra.until(1)
    await rb.until(1)
    assert ra.received() == [big] and rb.received() == [b"back"]
    return peer, peer_a


@pytest.mark.parametrize("scheme", ["ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_two_nodes_talk_over_ws_and_wss(scheme):
    """Two Switches exchange messages over ws:// (plaintext) or wss:// (identity-mode TLS
    beneath the WebSocket); both sides name the transport, and with wss each node id is
    proven by the certificate, as over TLS."""
    tls = scheme == "wss"
    (a, ra), (b, rb) = node(identity() if tls else None), node(identity() if tls else None)
    try:
        port = await ws_listen(a, scheme)
        assert a.listen_address == f"{scheme}://127.0.0.1:{port}{PATH}"
        peer, peer_a = await exchange(a, b, ra, rb, f"{a.node_id}@{scheme}://127.0.0.1:{port}{PATH}")
        assert transport_kind(peer._protocol.transport) == scheme
        assert transport_kind(peer_a._protocol.transport) == scheme
        if tls:
            certificate = a.tls.peer_certificate(peer_a._protocol.transport, b.node_id, inbound=True)
            assert certificate is not None
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_wss_refuses_a_listener_whose_certificate_is_another_nodes():
    """A wss dial that expects one node id and meets a listener whose certificate proves
    another fails with PeerIdMismatch or CertificateMismatch: the certificate beneath
    the WebSocket proves the id."""
    (a, _), (b, _) = node(identity()), node(identity())
    try:
        port = await ws_listen(a, "wss")
        other = NodeKey.generate().node_id
        with pytest.raises((PeerIdMismatch, CertificateMismatch)):
            await bounded(b.dial(f"{other}@wss://127.0.0.1:{port}{PATH}"))
        assert not b.peers
        await until(lambda: not a.peers, "the listener's side to hear the dialer's refusal")
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_mconn_tls_runs_inside_a_ws_websocket_end_to_end():
    """On Switches with TLS options, ws:// carries mconn's TLS inside the WebSocket
    (ws+tls), so a proxy that forwards the WebSocket cannot read or alter the session and
    the node ids are proven end to end."""
    (a, ra), (b, rb) = node(identity()), node(identity())
    try:
        port = await ws_listen(a, "ws")
        peer, peer_a = await exchange(a, b, ra, rb, f"{a.node_id}@ws://127.0.0.1:{port}{PATH}")
        assert transport_kind(peer._protocol.transport) == "ws+tls"
        assert transport_kind(peer_a._protocol.transport) == "ws+tls"
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_one_switch_listens_on_tcp_and_ws_at_once():
    """A listener on tcp and on ws takes one peer over each; both sessions live side by side."""
    (a, ra), (b, _), (c, _) = node(), node(), node()
    try:
        tcp_port = (await a.listen("tcp:0:interface=127.0.0.1")).getHost().port
        ws_port = await ws_listen(a)
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{tcp_port}"))
        await bounded(c.dial(f"{a.node_id}@ws://127.0.0.1:{ws_port}{PATH}"))
        kinds = {p.node_id: transport_kind(p._protocol.transport) for p in a.peers.values()}
        assert kinds == {b.node_id: "tcp", c.node_id: "ws"}
        assert b.peers[a.node_id].try_send(0x21, b"by tcp") and c.peers[a.node_id].try_send(0x21, b"by ws")
        await ra.until(2)
        assert sorted(ra.received()) == [b"by tcp", b"by ws"]
    finally:
        await stop(a, b, c)


@pytest_twisted.ensureDeferred
async def test_a_dial_to_the_wrong_path_fails_with_a_websocket_error_naming_it():
    """The listener answers 404 to an upgrade at another path; the dial fails with a
    WebSocketError that says so, and no session starts."""
    (a, _), (b, _) = node(), node()
    try:
        port = await ws_listen(a)
        with pytest.raises(WebSocketError, match="404") as info:
            await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{port}/elsewhere"))
        assert "/elsewhere" in str(info.value)
        assert not a.peers and not b.peers
    finally:
        await stop(a, b)


# -- bad input from a raw client ---------------------------------------------------------


def upgrade_request(port: int, path: str = PATH) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mconn\r\n\r\n"
    ).encode()


def client_frame(opcode: int, payload: bytes, *, length: int | None = None) -> bytes:
    """A masked client frame (FIN set); ``length`` may claim another payload length."""
    n = len(payload) if length is None else length
    mask = os.urandom(4)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_frame_in(data: bytes):
    """(code, reason) of the first close frame the server sent after its 101, or None."""
    body = data[data.find(b"\r\n\r\n") + 4 :]
    while len(body) >= 2:
        opcode, n = body[0] & 0x0F, body[1] & 0x7F
        offset = 2
        if n == 126:
            n, offset = struct.unpack("!H", body[2:4])[0], 4
        elif n == 127:
            n, offset = struct.unpack("!Q", body[2:10])[0], 10
        payload = body[offset : offset + n]
        if opcode == 0x8:
            return struct.unpack("!H", payload[:2])[0], payload[2:].decode()
        body = body[offset + n :]
    return None


async def raw_client(port: int, greeting: bytes) -> RawPeer:
    endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
    return await bounded(endpoint.connect(Factory.forProtocol(lambda: RawPeer(greeting))))


async def upgraded(port: int) -> RawPeer:
    raw = await raw_client(port, upgrade_request(port))
    await until(lambda: b"\r\n\r\n" in raw.data, "the 101 answer")
    assert raw.data.startswith(b"HTTP/1.1 101"), bytes(raw.data[:100])
    return raw


async def a_good_peer_carries_on(a, ra, good_peer):
    """The good peer's session is untouched: a message still arrives."""
    before = len(ra.received())
    assert good_peer.try_send(0x21, b"still here")
    await ra.until(before + 1)


@pytest.mark.parametrize(
    "request_bytes, status, problem",
    [
        (b"GET /mconn HTTP/1.0\r\nHost: x\r\n\r\n", b"505", b"Unsupported HTTP version"),
        (b"POST /mconn HTTP/1.1\r\nHost: x\r\n\r\n", b"405", b"not allowed"),
        (
            b"GET /mconn HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
            b"400",
            b"Sec-WebSocket-Key header missing",
        ),
        (b"GET /mconn HTTP/1.1\r\n" + b"X-Junk: " + b"a" * MAX_UPGRADE_BYTES, b"431", b"over 16384 bytes"),
    ],
    ids=["http-1.0", "post", "no-key", "endless-header"],
)
@pytest_twisted.ensureDeferred
async def test_a_malformed_upgrade_closes_only_that_connection_with_an_http_error(request_bytes, status, problem):
    """Each malformed HTTP upgrade gets an HTTP error naming the problem and its
    connection closed; a peer already connected over ws carries on."""
    (a, ra), (b, _) = node(), node()
    try:
        port = await ws_listen(a)
        good = await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{port}{PATH}"))
        raw = await raw_client(port, request_bytes)
        await until(lambda: raw.lost is not None, "the listener to close the bad connection")
        status_line = bytes(raw.data).split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 " + status), status_line
        assert problem in status_line, status_line
        await a_good_peer_carries_on(a, ra, good)
        assert list(a.peers) == [b.node_id]
    finally:
        await stop(a, b)


@pytest.mark.parametrize(
    "frame, code, problem",
    [
        (client_frame(0x1, b"hello"), 1003, "text message"),
        (client_frame(0x2, b"", length=(1 << 20) + 1), 1009, "exceeds payload limit of 1048576"),
        (bytes([0x82 | 0x40, 0x80 | 1]) + b"\0\0\0\0x", 1002, "RSV"),
    ],
    ids=["text", "too-large", "compressed"],
)
@pytest_twisted.ensureDeferred
async def test_a_bad_frame_closes_only_that_connection_with_a_specific_close(frame, code, problem, telemetry):
    """After a good upgrade, a text message, a frame over ws_max_message_bytes (refused
    from its header, before its payload) or a compressed frame gets a close frame with
    the RFC 6455 code and a reason naming the problem; the connection ends with a
    WebSocketError saying the same (telemetry's connection_lost), and a peer already
    connected carries on."""
    (a, ra), (b, _) = node(), node()
    try:
        port = await ws_listen(a)
        good = await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{port}{PATH}"))
        raw = await upgraded(port)
        raw.send(frame)
        await until(lambda: raw.lost is not None, "the listener to close the bad connection")
        closing = close_frame_in(bytes(raw.data))
        assert closing is not None and closing[0] == code, closing
        assert problem.lower() in closing[1].lower(), closing
        await until(
            lambda: any(e["reason_type"] == "WebSocketError" for e in telemetry.named("connection_lost")),
            "the listener's connection_lost",
        )
        [lost] = [e for e in telemetry.named("connection_lost") if e["reason_type"] == "WebSocketError"]
        assert f"close {code}" in lost["reason"] and problem.lower() in lost["reason"].lower(), lost
        await a_good_peer_carries_on(a, ra, good)
        assert list(a.peers) == [b.node_id]
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_websocket_pings_are_answered_and_a_ping_flood_is_closed():
    """A WebSocket ping gets its pong (mconn does not rely on them, but answers), and
    pings past max_pings_per_interval within ping_interval close the connection (1008)."""
    config = CONFIG.replace(max_pings_per_interval=5)
    (a, ra) = node(config=config)
    try:
        port = await ws_listen(a)
        raw = await upgraded(port)
        raw.send(client_frame(0x9, b"are you there"))
        await until(lambda: b"are you there" in raw.data, "the pong")
        pong_at = bytes(raw.data).find(b"are you there")
        assert raw.data[pong_at - 2] == 0x8A  # FIN | pong, unmasked, echoing the payload
        raw.send(b"".join(client_frame(0x9, b"%d" % i) for i in range(10)))
        await until(lambda: raw.lost is not None, "the flood to be closed")
        closing = close_frame_in(bytes(raw.data))
        assert closing is not None and closing[0] == 1008 and "pings" in closing[1], closing
    finally:
        await stop(a)


async def fill_until_paused(peer, sender, sent, chunk):
    """try_send numbered messages, waiting for room, until the transport pauses ``sender``."""
    for i in range(2000):  # bounded: the kernel buffers a few MiB at most
        message = b"%06d" % i + chunk
        for _ in range(500):
            if peer.try_send(0x20, message):
                sent.append(message)
                break
            if sender._paused:
                return
            await sleep(0.01)
        else:
            raise AssertionError("neither room in the queue nor a pause within 5 s")
    raise AssertionError("2000 messages of 60 KB went out and the transport never paused")


@pytest_twisted.ensureDeferred
async def test_backpressure_flows_through_the_websocket_layer_which_buffers_nothing():
    """A receiver that stops reading: the sender's TCP buffer fills, pauses the mconn
    protocol through the WebSocket layer, its channel queue fills (try_send refuses);
    the WebSocket layer holds no bytes of its own and the TCP transport's buffer stays
    within one write past its 64 KiB. Once reading resumes, everything arrives in order."""
    (a, ra), (b, rb) = node(), node()
    try:
        port = await ws_listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{port}{PATH}"))
        peer_a = await bounded(ra.added)
        peer._protocol.transport.pauseProducing()  # b stops reading: its socket fills
        sender = peer_a._protocol
        sent, chunk = [], b"x" * 60_000
        await fill_until_paused(peer_a, sender, sent, chunk)
        await until(lambda: sender._paused, "the TCP transport to pause the mconn protocol")
        carrier, tcp = sender.transport, sender.transport.transport
        assert transport_kind(carrier) == "ws"
        assert len(carrier.send_queue) == 0 and carrier.data == b""
        buffered = len(tcp.dataBuffer) + tcp._tempDataLen
        assert buffered <= tcp.bufferSize + 65536 + 14, buffered
        assert not peer_a.try_send(0x20, b"no room"), "the channel queue should be full"
        peer._protocol.transport.resumeProducing()
        await rb.until(len(sent))
        assert rb.received(0x20) == sent
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_scheme_mismatch_fails_at_once_saying_what_the_other_side_speaks():
    """A ws:// dial to a tcp listener fails with a WebSocketError saying the answer is not
    HTTP; a tcp dial to a ws listener is answered 400 at once (not after a timeout)."""
    (a, _), (b, _) = node(), node()
    try:
        tcp_port = (await a.listen("tcp:0:interface=127.0.0.1")).getHost().port
        ws_port = await ws_listen(a)
        with pytest.raises(WebSocketError, match=r"not HTTP: the first byte is 0x.. \(a tcp mconn listener"):
            await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{tcp_port}{PATH}"), 5)
        raw = await raw_client(ws_port, bytes([0x04]) + b"an mconn hello")
        await until(lambda: raw.lost is not None, "the ws listener to refuse the tcp start", seconds=5)
        assert bytes(raw.data).startswith(b"HTTP/1.1 400 not HTTP: the first byte is 0x04"), bytes(raw.data[:80])
        assert not a.peers and not b.peers
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_an_address_pool_may_mix_tcp_and_ws_addresses():
    """A persistent peer whose pool holds a dead tcp address and a live ws one is reached
    over ws; the pool keeps both, each with its scheme."""
    (a, _), (b, _) = node(), node()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nothing listens there
    try:
        ws_port = await ws_listen(a)
        tcp_address = f"{a.node_id}@127.0.0.1:{dead}"
        ws_address = f"{a.node_id}@ws://127.0.0.1:{ws_port}{PATH}"
        dialing = b.dial(tcp_address, persistent=True, retry_initial_dial=True)
        b.set_address_pool(a.node_id, [tcp_address, ws_address])
        peer = await bounded(dialing)
        assert transport_kind(peer._protocol.transport) == "ws"
        assert sorted(str(s.address) for s in b.address_pool(a.node_id)) == sorted([tcp_address, ws_address])
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_wss_in_ca_mode_proves_node_ids_and_refuses_a_certificate_for_another_host(tmp_path):
    """wss with CA-mode TLS options: two nodes with certificates from one CA connect, the
    listener's certificate (beneath the WebSocket) is the CA's; a listener whose
    certificate does not name 127.0.0.1 is refused with a TLSError saying so, as over TLS."""
    from mconn import TLSError

    from .test_tls import CA, ca_options

    ca = CA()
    (a, ra), (b, rb) = node(ca_options(tmp_path, ca, "a")), node(ca_options(tmp_path, ca, "b"))
    (c, _) = node(ca_options(tmp_path, ca, "c", hosts=("node-c.example",)))
    try:
        port = await ws_listen(a, "wss")
        peer, peer_a = await exchange(a, b, ra, rb, f"{a.node_id}@wss://127.0.0.1:{port}{PATH}")
        certificate = b.tls.peer_certificate(peer._protocol.transport, a.node_id, inbound=False)
        assert certificate.issuer == ca.certificate.subject
        c_port = await ws_listen(c, "wss")
        with pytest.raises(TLSError, match="does not name the IP address '127.0.0.1'"):
            await bounded(b.dial(f"{c.node_id}@wss://127.0.0.1:{c_port}{PATH}"))
    finally:
        await stop(a, b, c)


@pytest_twisted.ensureDeferred
async def test_a_frame_begun_before_the_listener_closes_is_read_whole_during_the_closing_handshake():
    """The listener starts its closing handshake (the node stops) while half a binary
    frame has arrived; the other half and the close reply follow: the frame is read as a
    frame, not as garbage, and the closing handshake ends cleanly (close 1000, no
    WebSocket error recorded)."""
    (a, _) = node()
    try:
        port = await ws_listen(a)
        raw = await upgraded(port)
        await until(lambda: len(a.connections) == 1, "the listener's mconn connection")
        carrier = next(iter(a.connections)).transport
        frame = client_frame(0x2, b"p" * 100)
        raw.send(frame[:60])
        await until(lambda: carrier.data == b"" and not carrier._reader.idle, "the first half to be read")
        stopping = a.stopService()
        await until(lambda: close_frame_in(bytes(raw.data)) is not None, "the listener's close frame")
        assert close_frame_in(bytes(raw.data))[0] == 1000
        raw.send(frame[60:] + client_frame(0x8, struct.pack("!H", 1000)))
        await until(lambda: raw.lost is not None, "the end of the closing handshake")
        await bounded(stopping)
        assert carrier.error is None, carrier.error
    finally:
        await stop(a)
