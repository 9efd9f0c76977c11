"""X-Forwarded-For from a trusted proxy, the HTTP head's bytes, and the Origin check, on
real loopback sockets (specs/websocket.md sections 4 and 6.1).

A raw client on 127.0.0.1 plays the trusted proxy (``ws_trusted_proxies``): the address
its upgrade names is believed only as one header line, ASCII only, whose last hop is an
IP address; anything else is refused with a 400 naming the problem, and the per-address
limits count the named address. An upgrade with an Origin that ``ws_allowed_origins``
does not allow (by default, any) is refused with 403. Every wait is bounded; every
Switch is stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from helpers import until
from mconn import Config

from .test_loopback import stop
from .test_websocket import node, raw_client, upgrade_request, ws_listen

pytestmark = pytest.mark.integration

PROXY = frozenset({"127.0.0.1"})
CONFIG = Config(stats_interval=0, ws_trusted_proxies=PROXY, max_connections_per_ip=2)


def with_headers(request: bytes, headers: bytes) -> bytes:
    """``request`` with ``headers`` (whole lines) before its end."""
    return request[:-2] + headers + b"\r\n"


async def answer(port: int, request: bytes):
    """The status line the listener answers ``request`` with, and the raw client (open)."""
    raw = await raw_client(port, request)
    await until(lambda: b"\r\n\r\n" in raw.data or raw.lost is not None, "the answer")
    return bytes(raw.data).split(b"\r\n", 1)[0], raw


@pytest.mark.parametrize(
    "smuggled, problem",
    [
        (b"X-Note: a\x85X-Forwarded-For: 203.0.113.66\r\n", b"a non-ASCII byte (0x85) at offset "),
        (b"X-Note: a\x0bX-Forwarded-For: 203.0.113.66\r\n", b"a control byte (0x0b) at offset "),
        (b"X-Note: a\x0cX-Forwarded-For: 203.0.113.66\r\n", b"a control byte (0x0c) at offset "),
        (b"X-Note: a\x1eX-Forwarded-For: 203.0.113.66\r\n", b"a control byte (0x1e) at offset "),
        (b"X-Note: a\nX-Forwarded-For: 203.0.113.66\r\n", b"an LF without CR (0x0a) at offset "),
        (b"X-Note: a\rX-Forwarded-For: 203.0.113.66\r\n", b"a CR without LF (0x0d) at offset "),
        (b"X-Note: \xc3\xa9\r\n", b"a non-ASCII byte (0xc3) at offset "),
        (b" X-Forwarded-For: 203.0.113.66\r\n", b"header line 9 is not NAME: VALUE: ' X-Forwarded-For: 203.0.113.66'"),
        (b"X-Forwarded-For : 203.0.113.66\r\n", b"header line 9 is not NAME: VALUE"),
        (b"x-forwarded-for: 203.0.113.66\r\n", b"2 X-Forwarded-For header lines; a proxy writes one"),
    ],
    ids=["0x85", "vt", "ff", "rs", "bare-lf", "bare-cr", "utf-8", "folded", "space-before-colon", "second-line"],
)
@pytest_twisted.ensureDeferred
async def test_a_header_a_client_smuggles_past_the_trusted_proxy_is_refused_with_400(smuggled, problem, telemetry):
    """The proxy writes one X-Forwarded-For line and passes the client's headers on after it: a
    byte that another parser takes for a line break (0x85, VT, FF, RS, a bare CR or LF), any other
    non-ASCII byte, a folded or malformed line, or a second X-Forwarded-For line gets a 400 naming
    the problem; no connection above is made and nothing stays counted."""
    a, _ = node(config=CONFIG)
    try:
        port = await ws_listen(a)
        request = with_headers(upgrade_request(port), b"X-Forwarded-For: 127.0.0.1\r\n" + smuggled)
        status, raw = await answer(port, request)
        assert status.startswith(b"HTTP/1.1 400 ") and problem in status, status
        await until(lambda: raw.lost is not None, "the listener to close it")
        await until(lambda: a._admission.pending == 0, "nothing pending")
        assert a._admission.per_ip == {} and not telemetry.named("connection_made")
        a._check_invariants()
    finally:
        await stop(a)


@pytest.mark.parametrize(
    "value", [b"198.51.100.1, evil", b"203.0.113.7:4000", b"[2001:db8::1]", b"fe80::1%eth0", b"203.0.113.7, ", b"x"]
)
@pytest_twisted.ensureDeferred
async def test_a_last_hop_that_is_not_an_ip_address_is_refused_with_400_naming_it(value):
    """The trusted proxy's last hop must be an IP address and nothing else (no port, brackets,
    zone or name): else 400 naming the hop."""
    a, _ = node(config=CONFIG)
    try:
        port = await ws_listen(a)
        status, _ = await answer(port, with_headers(upgrade_request(port), b"X-Forwarded-For: " + value + b"\r\n"))
        hop = value.rpartition(b",")[2].strip().decode()
        assert status == f"HTTP/1.1 400 X-Forwarded-For's last hop {hop!r} is not an IP address".encode(), status
        a._check_invariants()
    finally:
        await stop(a)


@pytest.mark.parametrize("client, other", [("203.0.113.7", "203.0.113.8"), ("2001:db8:1::7", "2001:db8:2::8")])
@pytest_twisted.ensureDeferred
async def test_the_per_address_limit_counts_the_address_the_trusted_proxy_names(client, other):
    """With max_connections_per_ip 2, a third upgrade the proxy forwards for the same client
    is refused (429 ip_limit, naming the client: its IPv6 /64); one for another client is upgraded. Before
    its upgrade is read, a proxied connection counts as pending in no address."""
    a, _ = node(config=CONFIG)
    raws = []
    try:
        port = await ws_listen(a)
        header = f"X-Forwarded-For: 198.51.100.9, {client}\r\n".encode()
        for _ in range(2):
            status, raw = await answer(port, with_headers(upgrade_request(port), header))
            raws.append(raw)
            assert status.startswith(b"HTTP/1.1 101"), status
        status, raw = await answer(port, with_headers(upgrade_request(port), header))
        raws.append(raw)
        key, other_key = a._admission.key_of(client), a._admission.key_of(other)  # an IPv6 /64 is one address
        assert status == f"HTTP/1.1 429 ip_limit: 2 connections from {key} (max_connections_per_ip 2)".encode()
        status, raw = await answer(port, with_headers(upgrade_request(port), f"X-Forwarded-For: {other}\r\n".encode()))
        raws.append(raw)
        assert status.startswith(b"HTTP/1.1 101"), status
        assert a._admission.per_ip == {key: 2, other_key: 1}
        waiting = await raw_client(port, b"")  # the proxy's connection before its upgrade
        raws.append(waiting)
        await until(lambda: a._admission.pending == 4, "the waiting connection pending")
        assert a._admission.per_ip == {key: 2, other_key: 1}
        assert len(a._admission.pending_groups[None]) == 1
        a._check_invariants()
    finally:
        for raw in raws:
            raw.transport.abortConnection()
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_from_a_trusted_proxy_an_upgrade_without_x_forwarded_for_comes_from_the_proxy(telemetry):
    """No header: the proxy itself (a health check, a local node) is the peer."""
    a, _ = node(config=CONFIG)
    try:
        port = await ws_listen(a)
        status, raw = await answer(port, upgrade_request(port))
        assert status.startswith(b"HTTP/1.1 101"), status
        assert a._admission.per_ip == {"127.0.0.1": 1}
        a._check_invariants()
        raw.transport.abortConnection()
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_by_default_an_upgrade_with_an_origin_is_refused_and_one_without_is_accepted():
    """Nodes send no Origin; a web page in the operator's browser does: with the default
    ws_allowed_origins (empty), `Origin: http://evil.example` gets 403 saying why, and the same
    upgrade without it is upgraded."""
    a, _ = node()
    try:
        port = await ws_listen(a)
        status, _ = await answer(port, with_headers(upgrade_request(port), b"Origin: http://evil.example\r\n"))
        assert status == (
            b"HTTP/1.1 403 origin 'http://evil.example' is not allowed (ws_allowed_origins is empty: nodes send "
            b"no Origin)"
        )
        status, raw = await answer(port, upgrade_request(port))
        assert status.startswith(b"HTTP/1.1 101"), status
        raw.transport.abortConnection()
        a._check_invariants()
    finally:
        await stop(a)
