"""PeerAddress: where a peer listens, and which node id it must prove it has.

The text form is CometBFT's (its ``p2p/netaddress.go``, ``IDAddressString``):
``<id>@<host>:<port>``, optionally prefixed with ``tcp://``; the id is 40 hex characters
(see :func:`mconn.node_key.node_id_from_public_key`). Here the id may be left out
(``host:port``) for a peer whose identity is not known in advance. An IPv6 host is written
in brackets: ``<id>@[::1]:26656``. Host names are not resolved here.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import string
from typing import NoReturn

_HEX_DIGITS = frozenset(string.hexdigits)
_NODE_ID_LENGTH = 40
_SCHEME = "tcp://"
#: Characters that can never be part of a host; finding one means the text is mangled.
_BAD_HOST_CHARS = frozenset(string.whitespace + "@/[]")


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

    def __post_init__(self) -> None:
        problem = _field_problem(self.node_id, self.host, self.port)
        if problem is not None:
            raise ValueError(f"PeerAddress({self.node_id!r}, {self.host!r}, {self.port!r}): {problem}")
        if self.node_id is not None:
            object.__setattr__(self, "node_id", self.node_id.lower())

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        prefix = f"{self.node_id}@" if self.node_id is not None else ""
        return f"{prefix}{host}:{self.port}"


def parse_address(text: str) -> PeerAddress:
    """Parse ``[tcp://][<id>@]<host>:<port>``, where an IPv6 host is in brackets.

    :param text: the address, with no surrounding whitespace.
    :raises ValueError: naming ``text`` and what is wrong with it.
    """
    if not isinstance(text, str):
        raise TypeError(f"a peer address is a str, got {type(text).__name__}")
    rest = text[len(_SCHEME):] if text.lower().startswith(_SCHEME) else text
    scheme, sep, _ = rest.partition("://")
    if sep:
        _fail(text, f"scheme {scheme + sep!r} is not supported; use {_SCHEME!r} or none")
    node_id: str | None = None
    if "@" in rest:
        node_id, _, rest = rest.partition("@")
    host, port_text = _split_host_port(text, rest)
    if not (port_text.isascii() and port_text.isdigit()):
        _fail(text, f"port {port_text!r} must be a number from 1 to 65535")
    port = int(port_text)
    problem = _field_problem(node_id, host, port)
    if problem is not None:
        _fail(text, problem)
    return PeerAddress(node_id, host, port)


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
