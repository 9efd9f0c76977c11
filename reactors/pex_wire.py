"""The PEX wire format: the messages of channel 0x00, declared with construct (specs/pex.md section 2).

``encode_request`` and ``encode_addrs`` build the messages (``addrs``, or ``addrs_schemes``
when an address is ws:// or wss://, for peers that announce PEX_SCHEMES_CHANNEL);
``decode_message`` checks a
message's size before it parses a byte, parses it against the declarations below, and
judges the addresses of a reply (duplicates, hosts that can never be dialed). Every
failure is a ``PexMisbehaved`` whose ``reason`` names the rule broken; reactors/pex.py
penalises the sender with it. The golden vectors of specs/vectors/pex.json pin the bytes.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re

from construct import (
    Adapter,
    Array,
    Bytes,
    ConstructError,
    Error,
    Int8ub,
    Int16ub,
    PascalString,
    Struct,
    Switch,
    Terminated,
    ValidationError,
    this,
)

from mconn import MalformedPacket, RemoteProtocolError
from mconn.core.address import PeerAddress
from mconn.core.node_key import NODE_ID_SIZE as NODE_ID_BYTES
from mconn.core.wire_primitives import uvarint

#: Tendermint's PEX channel id (``PexChannel`` in its ``p2p/pex/pex_reactor.go``).
PEX_CHANNEL = 0x00
#: A channel nothing is sent on: a node that lists it in its hello reads ``addrs_schemes``
#: replies (scheme-qualified addresses, specs/pex.md section 2.1). Old nodes do not list
#: it, so they are only ever sent ``addrs`` (tcp addresses).
PEX_SCHEMES_CHANNEL = 0x01
#: The scheme byte of an ``addrs_schemes`` address, and back.
SCHEME_CODES = {"tcp": 0, "ws": 1, "wss": 2}
_SCHEME_NAMES = {code: name for name, code in SCHEME_CODES.items()}
#: The wire bound on the addresses of one reply (CometBFT's largest selection).
MAX_WIRE_ADDRESSES = 250
#: Largest encoded address: id (20) | host length (1) | host (<= 255) | port (2).
MAX_ADDRESS_BYTES = NODE_ID_BYTES + 1 + 255 + 2
#: Largest address of ``addrs_schemes``: scheme (1) and path length (1) | path (<= 255) more.
MAX_SCHEME_ADDRESS_BYTES = MAX_ADDRESS_BYTES + 1 + 1 + 255

_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


class PexType(enum.IntEnum):
    """The first byte of a PEX message (Tendermint v0.18's go-wire type bytes)."""

    REQUEST = 0x01
    ADDRS = 0x02
    #: Addresses with their scheme and path (decoded as ADDRS: a tuple of PeerAddress).
    ADDRS_SCHEMES = 0x03


class _AtMost(Adapter):
    """An unsigned integer that must not exceed ``limit`` (checked before it sizes anything)."""

    def __init__(self, subcon, limit: int, what: str) -> None:
        super().__init__(subcon)
        self.limit, self.what = limit, what

    def _decode(self, obj, context, path):
        if obj > self.limit:
            raise ValidationError(f"{self.what} {obj} is over {self.limit}", path=path)
        return obj

    def _encode(self, obj, context, path):
        return self._decode(obj, context, path)


# One address: node id (20 bytes) | host length (1) | host (UTF-8) | port (2, big-endian)
PexAddress = Struct(
    "node_id" / Bytes(NODE_ID_BYTES),
    "host" / PascalString(Int8ub, "utf8"),
    "port" / Int16ub,
)
# One address with its scheme: node id (20) | scheme (1: 0 tcp, 1 ws, 2 wss) | host length (1) |
# host (UTF-8) | port (2, big-endian) | path length (1) | path (ASCII; empty for tcp)
PexSchemeAddress = Struct(
    "node_id" / Bytes(NODE_ID_BYTES),
    "scheme" / _AtMost(Int8ub, max(SCHEME_CODES.values()), "scheme"),
    "host" / PascalString(Int8ub, "utf8"),
    "port" / Int16ub,
    "path" / PascalString(Int8ub, "ascii"),
)
# 01 | uvarint max_addresses (<= 250): "send me at most this many"
RequestBody = Struct("max_addresses" / _AtMost(uvarint, MAX_WIRE_ADDRESSES, "max_addresses"))
# 02 | uvarint count (<= 250, checked before the entries are read) | count x PexAddress
AddrsBody = Struct(
    "count" / _AtMost(uvarint, MAX_WIRE_ADDRESSES, "address count"),
    "addresses" / Array(this.count, PexAddress),
)
# 03 | uvarint count (<= 250, checked before the entries are read) | count x PexSchemeAddress
AddrsSchemesBody = Struct(
    "count" / _AtMost(uvarint, MAX_WIRE_ADDRESSES, "address count"),
    "addresses" / Array(this.count, PexSchemeAddress),
)
PexMessage = Struct(
    "type" / Int8ub,
    "body"
    / Switch(
        this.type,
        {PexType.REQUEST: RequestBody, PexType.ADDRS: AddrsBody, PexType.ADDRS_SCHEMES: AddrsSchemesBody},
        default=Error,
    ),
    Terminated,
)


def max_message_bytes(max_addresses: int) -> int:
    """The largest reply carrying ``max_addresses`` addresses (the channel's capacity):
    an ``addrs_schemes`` reply of addresses with the longest hosts and paths."""
    return 1 + 2 + max_addresses * MAX_SCHEME_ADDRESS_BYTES


class PexMisbehaved(RemoteProtocolError):
    """A peer broke the PEX rules; ``reason`` is a short stable word (specs/pex.md section 4):
    ``malformed``, ``oversized``, ``unsolicited_reply``, ``too_many_addresses``,
    ``unroutable_address`` or ``request_flood``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"pex {reason}: {message}")
        self.reason = reason


def encode_request(max_addresses: int) -> bytes:
    return PexMessage.build(dict(type=PexType.REQUEST, body=dict(max_addresses=max_addresses)))


def encode_addrs(addresses) -> bytes:
    """A reply listing ``addresses`` (PeerAddress objects with node ids): ``addrs`` if they
    are all tcp, else ``addrs_schemes`` (send that only to a peer that announced
    PEX_SCHEMES_CHANNEL; reactors/pex.py filters for the others)."""
    if all(a.scheme == "tcp" for a in addresses):
        entries = [dict(node_id=bytes.fromhex(a.node_id), host=a.host, port=a.port) for a in addresses]
        return PexMessage.build(dict(type=PexType.ADDRS, body=dict(count=len(entries), addresses=entries)))
    entries = [
        dict(node_id=bytes.fromhex(a.node_id), scheme=SCHEME_CODES[a.scheme], host=a.host, port=a.port, path=a.path)
        for a in addresses
    ]
    return PexMessage.build(dict(type=PexType.ADDRS_SCHEMES, body=dict(count=len(entries), addresses=entries)))


def decode_message(message: bytes, *, limit: int | None = None):
    """``(PexType.REQUEST, max_addresses)`` or ``(PexType.ADDRS, (PeerAddress, ...))``.

    :param limit: the largest message accepted, checked before a byte is parsed.
    :raises PexMisbehaved: ``oversized`` past ``limit``, ``malformed`` for bytes that do
        not follow specs/pex.md or an address that cannot be one, ``unroutable_address``
        for a host that can never be dialed.
    """
    if limit is not None and len(message) > limit:
        raise PexMisbehaved("oversized", f"a PEX message of {len(message)} bytes; the limit is {limit}")
    try:
        parsed = PexMessage.parse(message)
    except (ConstructError, MalformedPacket, IndexError, ValueError, UnicodeDecodeError) as e:
        first = f"{message[0]:#04x}" if message else "none"
        why = " ".join(str(e).split())
        raise PexMisbehaved("malformed", f"{len(message)} bytes, type byte {first}: {why}") from None
    if parsed.type == PexType.REQUEST:
        return PexType.REQUEST, parsed.body.max_addresses
    addresses = tuple(_address(entry) for entry in parsed.body.addresses)
    seen = set()
    for address in addresses:
        if address.node_id in seen:
            raise PexMisbehaved("malformed", f"the reply lists node {address.node_id} twice")
        seen.add(address.node_id)
    return PexType.ADDRS, addresses


#: Addresses (and hosts) of replies remembered: a node hears the same addresses over and
#: over, and making a PeerAddress checks its fields, judging a host parses it.
ADDRESS_CACHE = 8192


def _address(entry) -> PeerAddress:
    scheme = _SCHEME_NAMES[entry.scheme] if "scheme" in entry else "tcp"
    return _checked_address(entry.node_id, entry.host, entry.port, scheme, entry.get("path", ""))


@functools.lru_cache(maxsize=ADDRESS_CACHE)
def _checked_address(node_id: bytes, host: str, port: int, scheme: str, path: str) -> PeerAddress:
    """The PeerAddress of one decoded entry (PeerAddress is frozen: one can be shared);
    an entry that cannot be one raises, and is not remembered."""
    try:
        if scheme != "tcp" and not path:
            raise ValueError(f"a {scheme} address of node {node_id.hex()} has no path (at least '/')")
        address = PeerAddress(node_id.hex(), host, port, scheme, path)
    except ValueError as e:
        raise PexMisbehaved("malformed", str(e)) from None
    problem = host_problem(address.host)
    if problem is not None:
        kind = "unroutable_address" if problem.startswith("unroutable") else "malformed"
        raise PexMisbehaved(kind, f"address {address}: {problem}")
    return address


@functools.lru_cache(maxsize=ADDRESS_CACHE)
def host_problem(host: str) -> str | None:
    """Why ``host`` can never be dialed, or None: an IP literal or a DNS name is needed,
    and an IP must not be unspecified, multicast or broadcast."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None if _HOSTNAME.fullmatch(host) else f"host {host!r} is neither an IP address nor a DNS name"
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        return f"unroutable host {host} (unspecified, multicast or broadcast)"
    return None
