"""Endpoints for the WebSocket transport (specs/websocket.md): listening (``ws:`` and
``wss:`` endpoint strings, twisted/plugins/mconn_websocket.py), dialing a PeerAddress of
any scheme (``dial_endpoint``, used by the Switch), and the HTTP proxy a dial may go
through (``proxy_for``, ``TunnelEndpoint``: HTTP CONNECT).

What is stacked, from the socket up (specs/websocket.md section 2):

* ``tcp``: TCP, [mconn's TLS], mconn;
* ``ws``: TCP, WebSocket, [mconn's TLS], mconn: a Switch with TLS options runs its TLS
  inside the WebSocket, end to end through any proxy;
* ``wss``: TCP, TLS, WebSocket, mconn. With TLS options the TLS is mconn's (the same
  identity and CA modes; the certificate proves the node id). Without, a dialer checks
  the listener's certificate against ``Config.wss_ca_file`` (or the system's roots) and
  its host name, as a browser would: what a TLS-terminating reverse proxy presents
  (specs/tls.md section 8).

An HTTP proxy (``Config.http_proxy``, or the environment's) carries ws and wss dials
through CONNECT; it sits below everything else.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.parse

from twisted.internet import defer, protocol
from twisted.internet.protocol import connectionDone
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocol,
    IStreamClientEndpoint,
    IStreamServerEndpoint,
    ITCPTransport,
)
from twisted.internet.ssl import Certificate, optionsForClientTLS, platformTrust, trustRootFromCertificates
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from mconn.core.address import LOOPBACK, PeerAddress, host_scope
from mconn.config import Config
from mconn.config import MAX_HTTP_HEAD_BYTES
from mconn.errors import ProxyError
from mconn.net.tls_transport import tls_client_endpoint

log = Logger(namespace="mconn.websocket")


def transport_kind(transport) -> str:
    """What carries a connection, as telemetry and the status page name it: ``tcp``,
    ``tls``, ``ws``, ``wss`` or ``ws+tls`` (mconn's TLS inside a ``ws://`` WebSocket)."""
    if isinstance(transport, TLSMemoryBIOProtocol):  # asked first: it forwards unknown attributes
        return "ws+tls" if getattr(transport.transport, "websocket_scheme", None) else "tls"
    return getattr(transport, "websocket_scheme", None) or "tcp"


# -- listening -------------------------------------------------------------------------


@implementer(IStreamServerEndpoint)
class WebSocketServerEndpoint:
    """Listens on ``endpoint`` (any stream server endpoint) and upgrades connections to
    WebSocket at ``path``; with ``secure``, TLS comes first (``wss``).

    The factory it is given is a Switch's: its Config gives the limits. A ``wss``
    listener needs the Switch's TLS options: the factory is mconn's TLS factory, and the
    WebSocket goes between its TLS and mconn.
    """

    def __init__(self, clock, endpoint, *, path: str = "/", secure: bool = False) -> None:
        if not path.startswith("/"):
            raise ValueError(f"a WebSocket path starts with '/', got {path!r}")
        self.clock = clock
        self.endpoint = endpoint
        self.path = path
        self.secure = secure

    def listen(self, factory):
        from mconn.net.websocket import WebSocketServerCarrierFactory  # autobahn, imported when first used

        config = _config_of(factory)
        if not self.secure:
            return self._listen(
                WebSocketServerCarrierFactory(factory, path=self.path, secure=False, config=config, clock=self.clock)
            )
        if not isinstance(factory, TLSMemoryBIOFactory):
            return defer.fail(
                ValueError(
                    f"a wss listener (path {self.path!r}) needs TLS options: Switch(tls=TLSOptions...) or "
                    "twistd mconn --tls; without them listen on ws: behind a proxy that terminates TLS"
                )
            )
        factory.wrappedFactory = WebSocketServerCarrierFactory(
            factory.wrappedFactory, path=self.path, secure=True, config=config, clock=self.clock
        )
        factory.on_plaintext = _plaintext_on_wss
        return self._listen(factory)

    def _listen(self, factory):
        scheme = "wss" if self.secure else "ws"
        return self.endpoint.listen(factory).addCallback(lambda port: WebSocketPort(port, scheme, self.path))


@implementer(IListeningPort)
class WebSocketPort:
    """The listening port of a WebSocket endpoint; ``peer_address`` is what a hello
    announces (``ws://host:port/path``)."""

    def __init__(self, port, scheme: str, path: str) -> None:
        self.port = port
        self.scheme = scheme
        self.path = path

    @property
    def peer_address(self) -> str:
        host = self.port.getHost()
        shown = f"[{host.host}]" if ":" in host.host else host.host
        return f"{self.scheme}://{shown}:{host.port}{self.path}"

    def getHost(self):
        return self.port.getHost()

    def startListening(self):
        return self.port.startListening()

    def stopListening(self):
        return self.port.stopListening()


def _plaintext_on_wss(carrier, rejection) -> None:
    """A wss listener's TLS saw no ClientHello (plain HTTP, plaintext mconn): the carrier
    never started; the refusal is logged."""
    log.info("wss listener refused a connection before TLS: {why}", why=str(rejection))


def _config_of(factory) -> Config:
    """The Config of the Switch whose factory this is (through any wrapping factories)."""
    for _ in range(8):
        owner = getattr(factory, "owner", None)
        if owner is not None and isinstance(getattr(owner, "config", None), Config):
            return owner.config
        factory = getattr(factory, "wrappedFactory", None)
        if factory is None:
            break
    return Config()


# -- dialing ---------------------------------------------------------------------------


def dial_endpoint(target: PeerAddress, *, clock, config: Config, tls, environ=None):
    """The client endpoint of one dial attempt to ``target``, whatever its scheme."""
    proxy = proxy_for(target, config, os.environ if environ is None else environ)
    bind = (config.local_address, 0) if config.local_address else None
    tcp: IStreamClientEndpoint
    if proxy is not None:
        to_proxy = HostnameEndpoint(clock, proxy[0], proxy[1], timeout=config.dial_timeout, bindAddress=bind)
        tcp = TunnelEndpoint(to_proxy, target.host, target.port, clock=clock, timeout=config.ws_handshake_timeout)
    else:
        tcp = HostnameEndpoint(clock, target.host, target.port, timeout=config.dial_timeout, bindAddress=bind)
    linger = config.close_linger
    if target.scheme == "tcp":
        return tcp if tls is None else tls_client_endpoint(tls, tcp, target.host, clock=clock, close_linger=linger)
    if target.scheme == "wss":
        if tls is not None:
            secured = tls_client_endpoint(tls, tcp, target.host, clock=clock, close_linger=linger)
        else:
            secured = wrapClientTLS(optionsForClientTLS(target.host, trustRoot=_trust_root(config)), tcp)
        return WebSocketClientEndpoint(secured, target, config=config, clock=clock)
    ws = WebSocketClientEndpoint(tcp, target, config=config, clock=clock)
    return ws if tls is None else tls_client_endpoint(tls, ws, target.host, clock=clock, close_linger=linger)


def _trust_root(config: Config):
    if config.wss_ca_file is None:
        return platformTrust()
    with open(config.wss_ca_file, "rb") as f:
        pem = f.read()
    blocks = [b"-----BEGIN CERTIFICATE-----" + part for part in pem.split(b"-----BEGIN CERTIFICATE-----")[1:]]
    if not blocks:
        raise ValueError(f"Config.wss_ca_file {config.wss_ca_file!r} holds no PEM certificate")
    return trustRootFromCertificates([Certificate.loadPEM(block) for block in blocks])


@implementer(IStreamClientEndpoint)
class WebSocketClientEndpoint:
    """Dials ``endpoint`` and upgrades to WebSocket at ``target``'s path; ``connect``
    fires with the protocol above once the upgrade succeeded."""

    def __init__(self, endpoint, target: PeerAddress, *, config: Config, clock) -> None:
        self.endpoint = endpoint
        self.url = target.url
        self.config = config
        self.clock = clock

    def connect(self, factory):
        from mconn.net.websocket import WebSocketClientCarrierFactory  # autobahn, imported when first used

        carriers = WebSocketClientCarrierFactory(factory, url=self.url, config=self.config, clock=self.clock)
        return self.endpoint.connect(carriers).addCallback(lambda carrier: carrier.opened)


# -- HTTP proxies ----------------------------------------------------------------------


def proxy_for(target: PeerAddress, config: Config, environ) -> tuple[str, int] | None:
    """``(host, port)`` of the HTTP proxy a dial to ``target`` goes through, or None.

    ``Config.http_proxy`` ("http://host:port") is used for every ws and wss dial; ""
    means none. Left None, the environment's is used as curl and Go's net/http use it:
    ``https_proxy`` (or ``HTTPS_PROXY``) for wss, ``http_proxy`` (``HTTP_PROXY``) for
    ws, not for hosts that ``no_proxy`` (``NO_PROXY``) names (Go's rules, ``_no_proxy``), and never for loopback
    hosts (as Go's ``httpproxy``). Plain tcp dials never use a proxy.

    :raises ValueError: naming a proxy setting that is not ``http://host:port``.
    """
    if target.scheme == "tcp":
        return None
    if config.http_proxy is not None:
        return _proxy_address(config.http_proxy, "Config.http_proxy") if config.http_proxy else None
    if host_scope(target.host) == LOOPBACK or target.host.lower() == "localhost":
        return None
    names = ("https_proxy", "HTTPS_PROXY") if target.scheme == "wss" else ("http_proxy", "HTTP_PROXY")
    name = next((n for n in names if environ.get(n)), None)
    exempt = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    if name is None or _no_proxy(target.host, target.port, exempt):
        return None
    return _proxy_address(environ[name], f"the environment's {name}")


def _proxy_address(text: str, where: str) -> tuple[str, int]:
    url = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = url.port or 80
    except ValueError:
        port = None
    if url.scheme != "http" or not url.hostname or port is None or url.path not in ("", "/"):
        raise ValueError(f"{where} {text!r} must be an HTTP proxy as http://host:port")
    return url.hostname, port


def _no_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``no_proxy`` exempts ``host:port`` from the proxy, by the rules of Go's
    golang.org/x/net/http/httpproxy: entries separated by commas, each ``*`` (every
    host), an IP address or a CIDR network (an IP host in it), a domain (that name and
    its subdomains; with a leading ``.`` or ``*.``, its subdomains only), any of them
    but a CIDR network with ``:port`` (that port only; an IPv6 address then in brackets).
    Case does not matter; an entry that is none of these matches nothing."""
    host = host.lower().strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry and _no_proxy_entry_matches(entry, host, ip, port):
            return True
    return False


def _no_proxy_entry_matches(entry: str, host: str, ip, port: int) -> bool:
    if entry == "*":
        return True
    if "/" in entry:
        try:
            return ip is not None and ip in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    entry_host, entry_port = entry, None
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        name, sep, tail = entry.rpartition(":")
        if sep and tail.isdigit() and name:
            entry_host, entry_port = name.strip("[]"), int(tail)
    if entry_port is not None and entry_port != port:
        return False
    try:
        entry_ip = ipaddress.ip_address(entry_host)
    except ValueError:
        entry_ip = None
    if entry_ip is not None:
        return ip == entry_ip
    if entry_host.startswith("*."):
        entry_host = entry_host[1:]
    if entry_host.startswith("."):
        return host.endswith(entry_host)
    return host == entry_host or host.endswith("." + entry_host)


@implementer(IStreamClientEndpoint)
class TunnelEndpoint:
    """Connects through an HTTP proxy: ``CONNECT host:port``, then the protocol runs in
    the tunnel. The proxy's answer is read up to MAX_HTTP_HEAD_BYTES within ``timeout``."""

    def __init__(self, proxy_endpoint, host: str, port: int, *, clock, timeout: float) -> None:
        self.proxy_endpoint = proxy_endpoint
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.clock = clock
        self.timeout = timeout

    def connect(self, factory):
        tunnels = _TunnelFactory(factory, self)
        return self.proxy_endpoint.connect(tunnels).addCallback(lambda tunnel: tunnel.ready)


class _TunnelFactory(protocol.Factory):
    noisy = False

    def __init__(self, wrapped_factory, endpoint: TunnelEndpoint) -> None:
        self.wrapped_factory = wrapped_factory
        self.endpoint = endpoint

    def buildProtocol(self, addr):
        return _TunnelProtocol(self.wrapped_factory, self.endpoint, addr)


class _TunnelProtocol(protocol.Protocol):
    """Asks the proxy for the tunnel; once it answers 200, the wrapped protocol is
    connected to the same transport and every byte after goes to it."""

    #: The TCP connection to the proxy (None until makeConnection).
    transport: ITCPTransport | None

    def __init__(self, wrapped_factory, endpoint: TunnelEndpoint, addr) -> None:
        self.wrapped_factory = wrapped_factory
        self.endpoint = endpoint
        self.addr = addr
        self.wrapped: IProtocol | None = None
        self.ready: defer.Deferred[IProtocol] = defer.Deferred()
        self._answer = b""
        self._timer = None

    def connectionMade(self) -> None:
        authority = self.endpoint.authority
        assert self.transport is not None  # connectionMade follows makeConnection
        self.transport.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii"))
        self._timer = self.endpoint.clock.callLater(self.endpoint.timeout, self._timed_out)

    def dataReceived(self, data: bytes) -> None:
        if self.wrapped is not None:
            self.wrapped.dataReceived(data)
            return
        self._answer += data
        end = self._answer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._answer) > MAX_HTTP_HEAD_BYTES:
                self._fail(f"its answer to CONNECT is over {MAX_HTTP_HEAD_BYTES} bytes without an end")
            return
        status = self._answer[: self._answer.find(b"\r\n")].decode("latin-1")
        parts = status.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or parts[1] != "200":
            self._fail(f"it answered CONNECT with {status[:200]!r}")
            return
        self._cancel_timer()
        rest, self._answer = self._answer[end + 4 :], b""
        self.wrapped = self.wrapped_factory.buildProtocol(self.addr)
        assert self.transport is not None  # bytes arrive only on a connected transport
        self.wrapped.makeConnection(self.transport)
        self.ready.callback(self.wrapped)
        if rest:
            self.wrapped.dataReceived(rest)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_timer()
        if self.wrapped is not None:
            self.wrapped.connectionLost(reason)
        elif not self.ready.called:
            self.ready.errback(
                ProxyError(
                    f"HTTP proxy {self._proxy()} closed the connection before opening the tunnel to "
                    f"{self.endpoint.authority}: {reason.getErrorMessage()}"
                )
            )

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(f"no answer to CONNECT within {self.endpoint.timeout} s")

    def _fail(self, why: str) -> None:
        self._cancel_timer()
        if not self.ready.called:
            self.ready.errback(
                ProxyError(f"HTTP proxy {self._proxy()} did not open a tunnel to {self.endpoint.authority}: {why}")
            )
        assert self.transport is not None  # only a connected tunnel fails
        self.transport.abortConnection()

    def _proxy(self) -> str:
        assert self.transport is not None  # asked while connected, or in connectionLost
        peer = self.transport.getPeer()
        return f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
