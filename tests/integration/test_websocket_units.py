"""The WebSocket transport's settings, one rule at a time (specs/websocket.md sections 1, 4, 6).

Which HTTP proxy a dial uses (Config.http_proxy, the environment, no_proxy, loopback),
the Config fields' checks, and on real loopback sockets: X-Forwarded-For believed only
from a trusted proxy, the origin check when it is configured, a proxy that never answers
CONNECT, and an upgrade that never comes. Every wait is bounded.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory

from helpers import RawPeer, the_reactor, until
from mconn import Config, NodeKey
from mconn.core.address import parse_address
from mconn.errors import WebSocketError
from mconn.errors import ProxyError
from mconn.net.websocket_endpoints import _no_proxy, proxy_for

from .test_loopback import bounded, stop
from .test_websocket import PATH, node, upgrade_request, ws_listen, raw_client

ID = "ab" * 20
WSS = parse_address(f"{ID}@wss://node.example:443/mconn")
WS = parse_address(f"{ID}@ws://node.example:80/mconn")
TCP = parse_address(f"{ID}@node.example:26656")
LOOP = parse_address(f"{ID}@wss://127.0.0.1:443/mconn")
ENV = {"https_proxy": "http://secure-proxy:3128", "http_proxy": "http://plain-proxy:8080"}


@pytest.mark.parametrize(
    "address, config, environ, expected",
    [
        (WSS, Config(), ENV, ("secure-proxy", 3128)),
        (WS, Config(), ENV, ("plain-proxy", 8080)),
        (WSS, Config(), {"HTTPS_PROXY": "proxy:1"}, ("proxy", 1)),
        (TCP, Config(), ENV, None),
        (LOOP, Config(), ENV, None),
        (parse_address(f"{ID}@ws://localhost:80/"), Config(), ENV, None),
        (WSS, Config(), {**ENV, "no_proxy": "other.org, .example"}, None),
        (WSS, Config(), {**ENV, "NO_PROXY": "*"}, None),
        (WSS, Config(), {**ENV, "no_proxy": "other.com,.example.org"}, ("secure-proxy", 3128)),
        (WSS, Config(http_proxy="http://explicit:9"), ENV, ("explicit", 9)),
        (LOOP, Config(http_proxy="http://explicit:9"), {}, ("explicit", 9)),
        (WSS, Config(http_proxy=""), ENV, None),
        (WSS, Config(), {}, None),
        (TCP, Config(http_proxy="http://explicit:9"), {}, None),
    ],
    ids=[
        "wss-https_proxy",
        "ws-http_proxy",
        "upper-case",
        "tcp-never",
        "loopback-never-from-env",
        "localhost",
        "no_proxy-domain",
        "no_proxy-star",
        "no_proxy-other",
        "config-wins",
        "config-even-loopback",
        "empty-disables",
        "nothing-set",
        "tcp-never-even-configured",
    ],
)
def test_which_proxy_a_dial_goes_through(address, config, environ, expected):
    """Config.http_proxy for every ws/wss dial, else the environment's as curl and Go read
    it (https_proxy for wss, http_proxy for ws, no_proxy, never loopback); never for tcp."""
    assert proxy_for(address, config, environ) == expected


@pytest.mark.parametrize(
    "host, port, no_proxy, exempt",
    [
        ("10.1.2.3", 443, "10.0.0.0/8", True),
        ("11.1.2.3", 443, "10.0.0.0/8", False),
        ("2001:db8::5", 443, "2001:db8::/32", True),
        ("2001:db9::5", 443, "2001:db8::/32", False),
        ("2001:db8::9", 443, "2001:db8::9/128", True),
        ("2001:db8::a", 443, "2001:db8::9/128", False),
        ("node.example", 443, "10.0.0.0/8", False),
        ("192.0.2.7", 443, "192.0.2.7", True),
        ("192.0.2.8", 443, "192.0.2.7", False),
        ("2001:db8::7", 443, "2001:DB8::7", True),
        ("192.0.2.7", 443, "192.0.2.7:443", True),
        ("192.0.2.7", 80, "192.0.2.7:443", False),
        ("2001:db8::7", 443, "[2001:db8::7]:443", True),
        ("node.example", 443, "node.example:443", True),
        ("node.example", 80, "node.example:443", False),
        ("node.example", 443, "example", True),
        ("example", 443, "example", True),
        ("example", 443, ".example", False),
        ("a.b.example", 443, ".example", True),
        ("example", 443, "*.example", False),
        ("a.example", 443, "*.example", True),
        ("badexample", 443, "example", False),
        ("NODE.Example", 443, " other.org , EXAMPLE ", True),
        ("10.1.2.3", 443, "10.0.0.0/33,*", True),
        ("10.1.2.3", 443, "10.0.0.0/33", False),
    ],
)
def test_no_proxy_follows_gos_rules(host, port, no_proxy, exempt):
    """no_proxy as Go's httpproxy reads it: CIDR networks and IP addresses (an IP host),
    host:port (that port only), a domain and its subdomains, with a leading '.' or '*.'
    its subdomains only, '*'; case and spaces do not matter; a bad entry matches nothing."""
    shown = f"[{host}]" if ":" in host else host
    target = parse_address(f"{ID}@wss://{shown}:{port}/mconn")
    expected = None if exempt else ("secure-proxy", 3128)
    assert proxy_for(target, Config(), {**ENV, "no_proxy": no_proxy}) == expected
    assert _no_proxy(host, port, no_proxy) is exempt


def test_no_proxy_takes_loopback_networks_too():
    """A loopback host never goes through the environment's proxy anyway; its CIDR entry matches it."""
    assert _no_proxy("::1", 80, "::1/128") and _no_proxy("127.0.0.5", 80, "127.0.0.0/8")


@pytest.mark.parametrize("bad", ["socks5://p:1", "http://p:1/path", "http://:1", "http://p:99999"])
def test_a_proxy_that_is_not_http_host_port_is_refused_naming_it(bad):
    """A proxy setting other than http://host:port is a ValueError naming where it came from."""
    with pytest.raises(ValueError, match="Config.http_proxy .* must be an HTTP proxy as http://host:port"):
        proxy_for(WSS, Config(http_proxy=bad), {})
    with pytest.raises(ValueError, match="the environment's https_proxy"):
        proxy_for(WSS, Config(), {"https_proxy": bad})


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("ws_max_message_bytes", 65535, "an integer >= 65536"),
        ("ws_handshake_timeout", 0, "a positive finite number"),
        ("ws_allowed_origins", "https://a", "a set of strings"),
        ("ws_trusted_proxies", [1], "a set of strings"),
        ("http_proxy", 3128, "a string or None"),
        ("wss_ca_file", b"ca.pem", "a string or None"),
    ],
)
def test_websocket_config_fields_are_checked(field, value, problem):
    """Each WebSocket Config field refuses a bad value with a ValueError naming it."""
    with pytest.raises(ValueError, match=f"Config.{field} must be {problem}"):
        Config(**{field: value})


@pytest.mark.parametrize(
    "trusted, expected_host", [(frozenset({"127.0.0.1"}), "203.0.113.7"), (frozenset(), "127.0.0.1")]
)
@pytest_twisted.ensureDeferred
async def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(trusted, expected_host, telemetry):
    """With the TCP peer in ws_trusted_proxies, the connection comes from the last address
    X-Forwarded-For names; without, from the TCP peer (the header is only text)."""
    a, _ = node(config=Config(stats_interval=0, ws_trusted_proxies=trusted))
    try:
        port = await ws_listen(a)
        request = upgrade_request(port).replace(b"\r\n\r\n", b"\r\nX-Forwarded-For: 198.51.100.1, 203.0.113.7\r\n\r\n")
        raw = await raw_client(port, request)
        await until(lambda: telemetry.named("connection_made"), "the listener's connection_made")
        [made] = telemetry.named("connection_made")
        assert made["remote_address"].rpartition(":")[0] == expected_host and made["transport"] == "ws"
        raw.transport.loseConnection()
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_an_origin_check_when_configured_refuses_other_origins_and_accepts_none():
    """With ws_allowed_origins, an upgrade naming another Origin gets 403 saying so; one naming an
    allowed origin, or none (a node), is upgraded."""
    a, _ = node(config=Config(stats_interval=0, ws_allowed_origins={"https://*.example"}))
    try:
        port = await ws_listen(a)
        answers = {}
        for origin in ("https://evil.example.com", "https://ok.example", None):
            request = upgrade_request(port)
            if origin is not None:
                request = request.replace(b"\r\n\r\n", f"\r\nOrigin: {origin}\r\n\r\n".encode())
            raw = await raw_client(port, request)
            await until(lambda raw=raw: b"\r\n\r\n" in raw.data, "the answer")
            answers[origin] = bytes(raw.data).split(b"\r\n", 1)[0]
            raw.transport.abortConnection()
        assert answers["https://evil.example.com"] == b"HTTP/1.1 403 origin 'https://evil.example.com' is not allowed"
        assert answers["https://ok.example"].startswith(b"HTTP/1.1 101")
        assert answers[None].startswith(b"HTTP/1.1 101")
    finally:
        await stop(a)


def silent_listener():
    """A listening port on 127.0.0.1 (a Deferred of it) that accepts connections and never says a word."""
    return TCP4ServerEndpoint(the_reactor(), 0, interface="127.0.0.1").listen(Factory.forProtocol(RawPeer))


@pytest_twisted.ensureDeferred
async def test_a_proxy_that_never_answers_connect_fails_the_dial_at_ws_handshake_timeout():
    """A 'proxy' that accepts and says nothing: the dial fails with a ProxyError naming the
    timeout, after ws_handshake_timeout."""
    silent = await silent_listener()
    dialer, _ = node(
        config=Config(
            stats_interval=0, http_proxy=f"http://127.0.0.1:{silent.getHost().port}", ws_handshake_timeout=0.3
        )
    )
    try:
        with pytest.raises(ProxyError, match="no answer to CONNECT within 0.3 s"):
            await bounded(dialer.dial(f"{NodeKey.generate().node_id}@ws://192.0.2.1:80{PATH}"))
    finally:
        await stop(dialer)
        await silent.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_upgrade_that_never_comes_is_dropped_at_ws_handshake_timeout():
    """A client that connects and sends nothing is dropped after ws_handshake_timeout; a
    dial to a 'listener' that never answers the upgrade fails with a WebSocketError."""
    a, _ = node(config=Config(stats_interval=0, ws_handshake_timeout=0.3))
    silent = await silent_listener()
    try:
        port = await ws_listen(a)
        raw = await raw_client(port, b"")
        await until(lambda: raw.lost is not None, "the listener to drop the silent client", seconds=5)
        with pytest.raises(WebSocketError, match="no WebSocket upgrade within"):
            await bounded(a.dial(f"{NodeKey.generate().node_id}@ws://127.0.0.1:{silent.getHost().port}{PATH}"))
    finally:
        await stop(a)
        await silent.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_wss_listener_without_tls_options_is_refused_naming_what_is_missing():
    """A Switch without TLS options cannot listen on wss: (it has no certificate to
    present): the listen fails with a ValueError that says so and what to do instead."""
    a, _ = node()
    try:
        with pytest.raises(ValueError, match="a wss listener .* needs TLS options.* listen on ws: behind a proxy"):
            await bounded(a.listen(f"wss:tcp:0:interface=127.0.0.1:path={PATH}"))
    finally:
        await stop(a)
