"""Node info: what a node says it is, and whether two nodes can work together. Pure.

specs/handshake.md section 6 is the prose form; the bytes are ``wire.NodeInfoBody``, the
value of the hello field ``NODE_INFO`` (tag 02). A node that sets a ``NodeInfo``
(``Switch(..., node_info=...)``) announces it in every hello and applies
``check_compatible`` to every peer's hello, as CometBFT's ``NodeInfo.CompatibleWith``:
the same network, the same block protocol version, and at least one channel in common.
A node without one announces nothing and checks nothing, as before this field existed;
a hello without the field (an older node's) still parses, and its node info is None.

Every text and count has a limit (the ``MAX_*`` constants), checked when a NodeInfo is
built and when one is decoded; a whole node info is at most ``MAX_NODE_INFO_BYTES``,
checked before it is parsed (the hello around it is bounded by ``Config.max_hello_size``
before a byte of it is buffered).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Iterable, Mapping

from mconn.errors import IncompatibleNode, MalformedPacket
from mconn.core.wire import Hello, HelloTag, NodeInfoBody
from mconn.core.wire_primitives import MAX_UVARINT_SIZE, parse

#: ``HelloTag.NODE_INFO`` as a module constant (an Enum member lookup is a descriptor
#: call on Python 3.11; a handshake looks for the field twice).
_NODE_INFO_TAG = HelloTag.NODE_INFO

#: The network (chain id): 1..50 bytes (CometBFT's MaxChainIDLen), printable ASCII, no space.
MAX_NETWORK_BYTES = 50
#: The software version and the moniker: at most 64 bytes of printable UTF-8 each.
MAX_VERSION_BYTES = 64
MAX_MONIKER_BYTES = 64
#: ``other``: at most 16 entries; keys 1..32 bytes of [a-z0-9_.-] (starting with a letter
#: or digit), values at most 256 bytes of printable UTF-8.
MAX_OTHER = 16
MAX_OTHER_KEY_BYTES = 32
MAX_OTHER_VALUE_BYTES = 256
#: The encoded node info as a whole (the hello field's value).
MAX_NODE_INFO_BYTES = 1024

_NETWORK = re.compile(r"[\x21-\x7e]+")
_KEY = re.compile(r"[a-z0-9][a-z0-9_.\-]*")
_UINT64 = 1 << (8 * MAX_UVARINT_SIZE)

#: The close codes (``PeerRejected.reason``) of a refusal by the compatibility rule.
NODE_INFO_MISSING = "node_info_missing"
NETWORK_MISMATCH = "network_mismatch"
VERSION_MISMATCH = "version_mismatch"
NO_COMMON_CHANNEL = "no_common_channel"
REFUSALS = frozenset({NODE_INFO_MISSING, NETWORK_MISMATCH, VERSION_MISMATCH, NO_COMMON_CHANNEL})


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ProtocolVersion:
    """The protocol versions a node runs, as CometBFT's ``ProtocolVersion``.

    :param p2p: the version of the node's own p2p messages (informational: mconn's wire
        version is the hello's, checked separately).
    :param block: the version of the block data and its processing: two nodes must agree.
    :param app: the application's version (informational).
    """

    p2p: int = 0
    block: int = 0
    app: int = 0

    def __post_init__(self) -> None:
        for name in ("p2p", "block", "app"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _UINT64:
                raise ValueError(f"ProtocolVersion.{name} must be an integer in 0..2**64-1, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """What a node announces about itself in its hello (specs/handshake.md section 6).

    Its node id, listen address and channels are the hello's own fields (``peer.node_id``,
    ``peer.listen_address``, ``peer.channels``).

    :param network: the network (chain id) the node is on; peers must be on the same one.
    :param protocol: the protocol versions; peers must have the same ``block`` version.
    :param version: the node software's version, for people (not compared).
    :param moniker: a human-readable name (not compared, not unique).
    :param other: application-defined fields, text to text (CometBFT's ``tx_index``,
        ``rpc_address``...), kept in key order.
    :raises ValueError: naming the field and the value, for anything over its limit.
    """

    network: str
    protocol: ProtocolVersion = ProtocolVersion()
    version: str = ""
    moniker: str = ""
    other: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.network, str) or not _NETWORK.fullmatch(self.network):
            raise ValueError(f"NodeInfo.network must be printable ASCII without spaces, got {self.network!r}")
        if len(self.network) > MAX_NETWORK_BYTES:
            raise ValueError(f"NodeInfo.network is {len(self.network)} bytes; at most {MAX_NETWORK_BYTES}")
        if not isinstance(self.protocol, ProtocolVersion):
            raise ValueError(f"NodeInfo.protocol must be a ProtocolVersion, got {self.protocol!r}")
        _check_text("NodeInfo.version", self.version, MAX_VERSION_BYTES)
        _check_text("NodeInfo.moniker", self.moniker, MAX_MONIKER_BYTES)
        if not isinstance(self.other, Mapping):
            raise ValueError(f"NodeInfo.other must be a mapping of text to text, got {self.other!r}")
        if len(self.other) > MAX_OTHER:
            raise ValueError(f"NodeInfo.other has {len(self.other)} entries; at most {MAX_OTHER}")
        for key, value in self.other.items():
            if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > MAX_OTHER_KEY_BYTES:
                raise ValueError(
                    f"NodeInfo.other key {key!r} must be 1..{MAX_OTHER_KEY_BYTES} characters of [a-z0-9_.-]"
                )
            _check_text(f"NodeInfo.other[{key!r}]", value, MAX_OTHER_VALUE_BYTES)
        object.__setattr__(self, "other", types.MappingProxyType(dict(sorted(self.other.items()))))
        size = self.encoded_size()
        if size > MAX_NODE_INFO_BYTES:
            raise ValueError(f"NodeInfo encodes to {size} bytes; at most {MAX_NODE_INFO_BYTES}")

    def __hash__(self) -> int:
        return hash((self.network, self.protocol, self.version, self.moniker, tuple(self.other.items())))

    def encoded_size(self) -> int:
        """``len(self.encode())``, computed without encoding (uvarints are minimal)."""
        p = self.protocol
        texts = [self.network, self.version, self.moniker, *(t for kv in self.other.items() for t in kv)]
        return sum(map(_uvarint_size, (p.p2p, p.block, p.app, len(self.other)))) + sum(
            _uvarint_size(n) + n for n in (len(t.encode()) for t in texts)
        )

    def encode(self) -> bytes:
        """The hello field's value (``wire.NodeInfoBody``); ``other`` in key order."""
        p = self.protocol
        built: bytes = NodeInfoBody.build(
            dict(
                p2p=p.p2p,
                block=p.block,
                app=p.app,
                network=self.network,
                version=self.version,
                moniker=self.moniker,
                other=[dict(key=k, value=v) for k, v in self.other.items()],
            )
        )
        return built

    @classmethod
    def decode(cls, value: bytes) -> NodeInfo:
        """The NodeInfo a hello field holds.

        :raises MalformedPacket: naming what is wrong: over ``MAX_NODE_INFO_BYTES`` (before
            parsing), bytes that do not follow ``NodeInfoBody``, a key twice, a field
            over its limit.
        """
        if len(value) > MAX_NODE_INFO_BYTES:
            raise MalformedPacket(f"hello node info is {len(value)} bytes; at most {MAX_NODE_INFO_BYTES}")
        c = parse(NodeInfoBody, value, "hello node info")
        other = {}
        for entry in c.other:
            if entry.key in other:
                raise MalformedPacket(f"hello node info lists other key {entry.key!r} twice")
            other[entry.key] = entry.value
        try:
            return cls(
                network=c.network,
                protocol=ProtocolVersion(p2p=c.p2p, block=c.block, app=c.app),
                version=c.version,
                moniker=c.moniker,
                other=other,
            )
        except ValueError as e:
            raise MalformedPacket(f"hello node info: {e}") from None


def _uvarint_size(value: int) -> int:
    return 1 + (value.bit_length() + 7) // 8


def _check_text(name: str, value: object, limit: int) -> None:
    if not isinstance(value, str) or not (value.isprintable()):
        raise ValueError(f"{name} must be printable text, got {value!r}")
    size = len(value.encode())
    if size > limit:
        raise ValueError(f"{name} is {size} bytes; at most {limit}")


#: How many hex digits of a node id ``display_name`` shows after a moniker.
SHORT_ID_DIGITS = 8


def display_name(node_id: str, node_info: NodeInfo | str | None = None) -> str:
    """How logs, ``mconn status`` and the status page name a node: ``moniker (abcd1234)``,
    its moniker and the first 8 hex digits of its id; its whole id when it has no moniker.

    A moniker is chosen by the node itself and is not unique, so the id's digits always
    follow it. ``node_info`` is the node's NodeInfo, or its moniker as text (as
    ``/status.json`` carries it), or None. A moniker is printable text (``NodeInfo``
    checks it), so the name is one line without control characters.
    """
    moniker = node_info.moniker if isinstance(node_info, NodeInfo) else node_info
    return f"{moniker} ({node_id[:SHORT_ID_DIGITS]})" if moniker else node_id


def node_info_field(info: NodeInfo) -> tuple[int, bytes]:
    """The hello field that carries ``info``."""
    return (HelloTag.NODE_INFO, info.encode())


def node_info_of(hello: Hello) -> NodeInfo | None:
    """The node info a hello carries, or None if it has none (an older node's hello).

    :raises MalformedPacket: if the field does not decode, or appears twice.
    """
    found = None
    for tag, value in hello.fields:
        if tag == _NODE_INFO_TAG:
            if found is not None:
                raise MalformedPacket("hello carries node info twice")
            found = value
    return None if found is None else _decode(found)


@functools.lru_cache(maxsize=256)
def _decode(value: bytes) -> NodeInfo:
    """``NodeInfo.decode``, remembered: a handshake asks for the same hello's node info
    three times (the core's check, the Switch's rule, the Peer), and construct's parse
    costs a few hundred microseconds. A value that fails is not remembered."""
    return NodeInfo.decode(value)


def check_compatible(
    ours: NodeInfo | None,
    our_channels: Iterable[int],
    theirs: NodeInfo | None,
    their_channels: Iterable[int],
    *,
    peer_id: str,
) -> None:
    """The compatibility rule (specs/handshake.md section 6.2), as CometBFT's
    ``CompatibleWith``. Nothing is required of a peer while ``ours`` is None.

    :raises IncompatibleNode: ``node_info_missing``, ``network_mismatch``,
        ``version_mismatch`` or ``no_common_channel``, naming the values. An empty
        ``our_channels`` has nothing to share and skips the channel check (as in CometBFT:
        a node without channels is a test or a bare listener).
    """
    if ours is None:
        return
    if theirs is None:
        raise IncompatibleNode(
            NODE_INFO_MISSING,
            f"peer {peer_id} sent no node info; this node is on network {ours.network!r} and requires it",
        )
    if theirs.network != ours.network:
        raise IncompatibleNode(
            NETWORK_MISMATCH, f"peer {peer_id} is on network {theirs.network!r}; this node is on {ours.network!r}"
        )
    if theirs.protocol.block != ours.protocol.block:
        raise IncompatibleNode(
            VERSION_MISMATCH,
            f"peer {peer_id} runs block protocol version {theirs.protocol.block}; this node runs {ours.protocol.block}",
        )
    mine, others = set(our_channels), set(their_channels)
    if mine and not mine & others:
        raise IncompatibleNode(
            NO_COMMON_CHANNEL,
            f"peer {peer_id} has no channel in common with this node: ours {_hex(mine)}, theirs {_hex(others)}",
        )


def _hex(channels: set[int]) -> str:
    return ", ".join(f"{c:#04x}" for c in sorted(channels)) or "none"
