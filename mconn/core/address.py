"""PeerAddress: where a peer listens, and which node id it must prove it has.

The text form is CometBFT's (its ``p2p/netaddress.go``, ``IDAddressString``):
``<id>@<host>:<port>``, optionally prefixed with ``tcp://``; the id is 40 hex characters
(see :func:`mconn.core.node_key.node_id_from_public_key`). Here the id may be left out
(``host:port``) for a peer whose identity is not known in advance. An IPv6 host is written
in brackets: ``<id>@[::1]:26656``. Host names are not resolved here.

A WebSocket address names its scheme and path (specs/websocket.md section 1):
``<id>@ws://<host>:<port>/<path>`` or ``<id>@wss://...``; ``ws://<id>@<host>:<port>/<path>``
is read too. The path is ``/`` when left out.

:func:`discovered_problem` says whether an address learnt from a peer (a PEX reply, a
hello's listen address) may be dialed (specs/pex.md section 3.5): the scope of its host
(:func:`host_scope`), where the peer that told us connects from, and our own listeners.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import string
from collections.abc import Iterable
from typing import Any, NoReturn

_HEX_DIGITS = frozenset(string.hexdigits)
_NODE_ID_LENGTH = 40
_SCHEME = "tcp://"
#: The schemes of a peer address: raw TCP (the default) and WebSocket (specs/websocket.md).
SCHEMES = ("tcp", "ws", "wss")
#: The default port of a WebSocket scheme, when an address leaves it out (RFC 6455).
_WS_DEFAULT_PORTS = {"ws": 80, "wss": 443}
#: Longest WebSocket path accepted, and the characters it may have (RFC 3986 path and
#: query characters, no fragment, no whitespace).
MAX_PATH_LENGTH = 255
_PATH_CHARS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/%?")
#: Characters that can never be part of a host; finding one means the text is mangled.
_BAD_HOST_CHARS = frozenset(string.whitespace + "@/[]")

#: The scopes of :func:`host_scope`.
PUBLIC, PRIVATE, LOOPBACK, NAME, FORBIDDEN = "public", "private", "loopback", "name", "forbidden"
#: Cloud metadata services outside the link-local ranges (169.254.169.254, used by AWS,
#: GCP, Azure and others, is link-local already): Alibaba Cloud's, Azure's wire server,
#: and AWS's IPv6 endpoint.
METADATA_HOSTS = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "168.63.129.16", "fd00:ec2::254"))
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def is_valid_node_id(text: object) -> bool:
    """Whether ``text`` is a node id: exactly 40 hex characters, in either case."""
    return isinstance(text, str) and len(text) == _NODE_ID_LENGTH and _HEX_DIGITS.issuperset(text)


@dataclasses.dataclass(frozen=True)
class PeerAddress:
    """A peer's listening address, with the node id it is expected to have (or None).

    Fields are checked on construction; ``node_id`` is stored in lowercase and an IPv6
    ``host`` without brackets.
    """

    node_id: str | None
    host: str
    port: int
    #: ``tcp``, ``ws`` or ``wss``.
    scheme: str = "tcp"
    #: The WebSocket path (``/`` if none was given); empty for tcp.
    path: str = ""

    def __post_init__(self) -> None:
        problem = _field_problem(self.node_id, self.host, self.port) or _scheme_problem(self.scheme, self.path)
        if problem is not None:
            raise ValueError(
                f"PeerAddress({self.node_id!r}, {self.host!r}, {self.port!r}, {self.scheme!r}, {self.path!r}): {problem}"
            )
        if self.node_id is not None:
            object.__setattr__(self, "node_id", self.node_id.lower())
        if self.scheme != "tcp" and not self.path:
            object.__setattr__(self, "path", "/")

    def __str__(self) -> str:
        prefix = f"{self.node_id}@" if self.node_id is not None else ""
        if self.scheme == "tcp":
            return f"{prefix}{self.host_port}"
        return f"{prefix}{self.url}"

    @property
    def host_port(self) -> str:
        """``host:port``, an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """``ws://host:port/path`` (or ``wss://``); ``tcp://host:port`` for tcp."""
        return f"{self.scheme}://{self.host_port}{self.path}"


def parse_address(text: str) -> PeerAddress:
    """Parse ``[tcp://][<id>@]<host>:<port>``, ``[<id>@]ws://<host>[:<port>][/<path>]``
    or ``[<id>@]wss://...`` (also ``ws://<id>@...``), where an IPv6 host is in brackets.

    :param text: the address, with no surrounding whitespace.
    :raises ValueError: naming ``text`` and what is wrong with it.
    """
    if not isinstance(text, str):
        raise TypeError(f"a peer address is a str, got {type(text).__name__}")
    node_id: str | None = None
    scheme, rest = "tcp", text
    head, sep, tail = text.partition("://")
    if sep:
        if "@" in head:  # <id>@<scheme>://...
            node_id, _, head = head.partition("@")
        scheme, rest = head.lower(), tail
        if scheme not in SCHEMES:
            _fail(text, f"scheme {head + sep!r} is not supported; use tcp://, ws://, wss:// or none")
        nested = rest.partition("/")[0]
        if rest.startswith(nested + "//") and nested.endswith(":"):
            _fail(text, f"scheme {nested + '//'!r} is not supported after {head + sep!r}")
    if "@" in rest.partition("/")[0]:
        if node_id is not None:
            _fail(text, "two node ids")
        node_id, _, rest = rest.partition("@")
    path = ""
    if scheme != "tcp":
        rest, slash, path = rest.partition("/")
        path = slash + path if slash else "/"
        if not _has_port(rest):
            rest = f"{rest}:{_WS_DEFAULT_PORTS[scheme]}"
    host, port_text = _split_host_port(text, rest)
    if not (port_text.isascii() and port_text.isdigit()):
        _fail(text, f"port {port_text!r} must be a number from 1 to 65535")
    port = int(port_text)
    problem = _field_problem(node_id, host, port) or _scheme_problem(scheme, path)
    if problem is not None:
        _fail(text, problem)
    return PeerAddress(node_id, host, port, scheme, path)


def _has_port(host_port: str) -> bool:
    """Whether ``host[:port]`` (an IPv6 host in brackets) names a port."""
    if host_port.startswith("["):
        return "]:" in host_port
    return ":" in host_port


def _scheme_problem(scheme: object, path: object) -> str | None:
    """What is wrong with a scheme and path, or None."""
    if scheme not in SCHEMES:
        return f"scheme {scheme!r} must be one of {', '.join(SCHEMES)}"
    if not isinstance(path, str):
        return f"path {path!r} must be a string"
    if scheme == "tcp":
        return f"a tcp address has no path, got {path!r}" if path else None
    if path and not path.startswith("/"):
        return f"path {path!r} must start with '/'"
    if len(path) > MAX_PATH_LENGTH:
        return f"path of {len(path)} characters; at most {MAX_PATH_LENGTH}"
    if not _PATH_CHARS.issuperset(path):
        bad = sorted(set(path) - _PATH_CHARS)[:3]
        return f"path {path!r} has characters a URL path cannot have: {bad!r}"
    return None


def _split_host_port(text: str, rest: str) -> tuple[str, str]:
    """``rest`` (the part after any id) split into host and port text."""
    if rest.startswith("["):
        host, close, after = rest[1:].partition("]")
        if not close:
            _fail(text, "IPv6 host has no closing ']'")
        if not after.startswith(":"):
            _fail(text, f"expected ':<port>' after '[{host}]', found {after!r}")
        if ":" not in host:
            _fail(text, f"brackets are only for IPv6 hosts, found '[{host}]'")
        return host, after[1:]
    host, colon, port_text = rest.rpartition(":")
    if not colon:
        _fail(text, "missing ':<port>'")
    if ":" in host:
        _fail(text, f"IPv6 host {host!r} must be in brackets, like '[::1]:26656'")
    return host, port_text


def _field_problem(node_id: object, host: object, port: object) -> str | None:
    """What is wrong with these PeerAddress fields, or None if nothing is."""
    if node_id is not None and not is_valid_node_id(node_id):
        return f"node id {node_id!r} must be {_NODE_ID_LENGTH} hex characters"
    if not isinstance(host, str) or not host:
        return f"host {host!r} must be a non-empty string"
    if _BAD_HOST_CHARS.intersection(host):
        return f"host {host!r} contains characters a host cannot have (whitespace or '@/[]')"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"host {host!r} is not a valid IPv6 address"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return f"port {port!r} must be a number from 1 to 65535"
    return None


def _fail(text: str, problem: str) -> NoReturn:
    raise ValueError(f"peer address {text!r}: {problem}")


# -- which learnt addresses may be dialed (specs/pex.md section 3.5) -------------------------


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address (an IPv4-mapped one as IPv4), or None for a name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped is not None else ip


def host_scope(host: str) -> str:
    """Where ``host`` leads: ``public`` (a globally routable IP), ``private`` (RFC 1918,
    100.64.0.0/10, IPv6 unique local, and every other range that is not global),
    ``loopback``, ``name`` (a DNS name: where it leads is known only once resolved) or
    ``forbidden`` (unspecified, "this network" 0.0.0.0/8, link-local, which holds the
    metadata service 169.254.169.254, a host of METADATA_HOSTS, multicast, reserved,
    broadcast). An IPv4-mapped IPv6 address is judged as its IPv4 address.
    """
    ip = _ip(host)
    if ip is None:
        return NAME
    if ip in METADATA_HOSTS or ip.is_unspecified or ip.is_link_local or ip.is_multicast:
        return FORBIDDEN
    if ip.is_loopback:
        return LOOPBACK
    if ip.is_reserved or (ip.version == 4 and ip in _THIS_NETWORK):
        return FORBIDDEN
    return PUBLIC if ip.is_global else PRIVATE


def is_own_address(address: PeerAddress, listen_addresses: Iterable[str | PeerAddress]) -> bool:
    """Whether ``address`` leads to one of our listeners (``host:port`` texts or
    PeerAddress objects): the same IP and port, or, for a wildcard listener (``0.0.0.0``,
    ``::``), a loopback or unspecified IP with its port."""
    ip = _ip(address.host)
    for listen in listen_addresses:
        try:
            listen = listen if isinstance(listen, PeerAddress) else parse_address(listen)
        except ValueError:
            continue
        if listen.port != address.port:
            continue
        own = _ip(listen.host)
        if ip is None:
            if address.host.lower() == listen.host.lower():
                return True
        elif ip == own or (own is not None and own.is_unspecified and (ip.is_loopback or ip.is_unspecified)):
            return True
    return False


def transport_host(transport: Any) -> str | None:
    """The host a Twisted transport's peer connects from (``getPeer().host``: for a
    WebSocket listener's connection from a trusted proxy, the client the proxy names),
    or None if it has none (a UNIX socket, an in-memory transport without one)."""
    peer = transport.getPeer() if transport is not None else None
    host = getattr(peer, "host", None)
    return host if isinstance(host, str) and host else None


def host_of(text: str) -> str | None:
    """The host of a connection's remote address as the transport's ``host:port`` text
    writes it (``198.51.100.7:40000``, an IPv6 host with or without brackets,
    ``::1:40000``; port 0 for a client a proxy names), or None if it is not one.

    For objects that give only that text; a Peer's ``remote_host`` comes from its
    transport (``transport_host``) and is the one to use.
    """
    if not isinstance(text, str):
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()):
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or _BAD_HOST_CHARS.intersection(host):
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return host


def announced_address(
    node_id: str, listen_address: str, remote_address: str = "", *, remote_host: str | None = None
) -> PeerAddress | None:
    """Where a peer says it listens (the listen address of its hello), as an address of
    ``node_id``; an unspecified host (``0.0.0.0:26656``, from ``--listen tcp:26656``) is
    replaced by the host its connection comes from (``remote_host``, else that of the
    ``remote_address`` text); a ws:// or wss:// one keeps its scheme and path. None if
    nothing usable was announced."""
    if not listen_address:
        return None
    try:
        announced = parse_address(listen_address)
        host = announced.host
        ip = _ip(host)
        if ip is not None and ip.is_unspecified:
            seen = remote_host if remote_host is not None else host_of(remote_address)
            if seen is None:
                return None
            host = seen
        return PeerAddress(node_id, host, announced.port, announced.scheme, announced.path)
    except ValueError:
        return None


def discovered_problem(
    address: PeerAddress,
    *,
    source_host: str | None,
    allow_private: bool,
    listen_addresses: Iterable[str | PeerAddress] = (),
) -> str | None:
    """Why ``address``, learnt from a peer whose connection comes from ``source_host``,
    must not be dialed, as one word, or None if it may be (specs/pex.md section 3.5):

    * ``forbidden``: its host's scope is forbidden (see :func:`host_scope`);
    * ``name``: a DNS name, which could lead anywhere, the forbidden ranges included;
    * ``own``: it leads to one of ``listen_addresses``;
    * ``loopback``: a loopback address told by a peer that does not connect over
      loopback (only a process of this host may point us at this host);
    * ``private``: a private address, unless ``allow_private``
      (``Config.allow_discovered_private``).
    """
    scope = host_scope(address.host)
    if scope in (FORBIDDEN, NAME):
        return scope
    if is_own_address(address, listen_addresses):
        return "own"
    if scope == LOOPBACK and (source_host is None or host_scope(source_host) != LOOPBACK):
        return LOOPBACK
    if scope == PRIVATE and not allow_private:
        return PRIVATE
    return None
