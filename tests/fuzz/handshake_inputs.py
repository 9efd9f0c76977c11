"""Inputs of the handshake target (tests/fuzz/switch_target.py): scenarios, hellos, answers.

A listening Switch gets a peer hello whose fields are drawn from mconn/core/wire.py's
``HelloBody`` declaration, with a session request (hello field 01, ``SessionRequestBody``)
among its fields; a dialing Switch gets a session answer (packet 07,
``SessionAnswerBody``) after a valid hello. Each field is a valid value, a boundary or
wrong value, or raw bytes (tests/fuzz/declared.py); the bytes are then edited.

Values that depend on the world are symbols, resolved when the bytes are built
(``Names``): ``CLAIMED`` is the node whose session the world holds (or the node dialed),
``HELD`` that session's id (or else the one asked for), ``ASKED`` the id our session
request asked for. Imports no Twisted and no hypothesis.
"""

from __future__ import annotations

import dataclasses

from mconn.core import wire
from mconn.core.wire import PROTOCOL_VERSION, HelloTag, PacketType

from tests.fuzz.declared import RAW, Chooser, Raw, build_struct, draw_edits, mutate, value

CLAIMED, STRANGER, SELF = "claimed", "stranger", "self"
HELD, ASKED, OTHER = "held", "asked", "other"
#: A session answer's ``resumed``: what our request asked for.
EXPECTED = "expected"
#: A node id no world uses, and a session id no world holds.
STRANGER_ID = "5a" * 20
OTHER_SESSION = bytes(range(100, 116))

VERSIONS = (PROTOCOL_VERSION, 0, 2, 2**64 - 1, RAW)
NODES = (CLAIMED, STRANGER, SELF, RAW)
PAYLOADS = (1024, 1, 1023, 65536, 0, 2**64 - 1, RAW)  # the floor first: a default hello is accepted
CHANNEL_SETS = (
    "same",
    "reordered",
    "priority changed",
    "one more",
    "one less",
    "none",
    "duplicate",
    "priority 0",
    "257 channels",
    RAW,
)
LISTEN_ADDRESSES = ("", "10.0.0.9:26656", "nœud:1", "x" * 200, RAW)
REQUESTS = ("resume", "fresh", "absent", "twice", RAW)
SESSIONS = (HELD, ASKED, OTHER, RAW)
FLAGS = (True, False, Raw(b"\x02"), Raw(b"\xff"))
RESUMED = (EXPECTED, *FLAGS)
CHANNEL_IDS = (0x20, 0x21, 0x22, 0x00, 0xFF)
COUNTS = (0, 1, 2, 3, 5, 2**32, 2**64 - 1, RAW)
DECLARED = ("exact", "one more", 2**32, 2**64 - 1)
FIELD_TAGS = (0x7E, HelloTag.SESSION, 0x00, 0xFF)
REASONS = ("", "unknown session", "é" * 10, RAW)
#: The entries of per-channel counts (``wire.Counts``): channel id | uvarint count.
COUNT_ENTRY = wire.Counts.subcons[1].subcon.subcon
assert [s.name for s in COUNT_ENTRY.subcons] == ["channel_id", "count"]

#: What our Switch holds before the fuzzed connection (tests/fuzz/switch_target.py).
HELDS = ("none", "connected", "suspended")
#: Chunk sizes a stream is cut into.
SIZES = (1, 2, 7, 64, 1000)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One input of the handshake target. ``held`` is one of HELDS; ``low``: the node a
    dialer dials has the smaller node id. ``first`` is a HelloSpec (listener), an
    AnswerSpec (dialer) or None (the stream is ``rest`` alone); ``steps`` are (chunk
    size, seconds to wait before it, whether the peer reads what we send after it)."""

    dialer: bool
    held: str
    low: bool
    first: object
    rest: bytes
    steps: tuple


@dataclasses.dataclass(frozen=True)
class Names:
    """What the symbols stand for in one world."""

    claimed: str
    ours: str
    channels: tuple  # ChannelDescriptors of the Switch
    held: bytes | None = None
    asked: bytes | None = None
    resuming: bool = False  # our session request asked to resume

    def session(self, symbol) -> bytes | Raw:
        if isinstance(symbol, Raw):
            return symbol
        found = {HELD: self.held or self.asked, ASKED: self.asked}.get(symbol)
        return found if found is not None else OTHER_SESSION

    def node(self, symbol) -> bytes | Raw:
        if isinstance(symbol, Raw):
            return symbol
        return bytes.fromhex({CLAIMED: self.claimed, SELF: self.ours}.get(symbol, STRANGER_ID))


@dataclasses.dataclass(frozen=True)
class CountsSpec:
    declared: object  # "exact", "one more" or a number
    entries: tuple  # (channel id, count or Raw)

    def encode(self) -> bytes:
        n = {"exact": len(self.entries), "one more": len(self.entries) + 1}.get(self.declared, self.declared)
        return wire.encode_uvarint(n) + b"".join(
            build_struct(COUNT_ENTRY, channel_id=c, count=count) for c, count in self.entries
        )


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """The dialer's session request (hello field 01)."""

    session: object
    resume: object
    delivered: CountsSpec

    def encode(self, names: Names) -> bytes:
        return build_struct(
            wire.SessionRequestBody,
            session_id=names.session(self.session),
            resume=self.resume,
            delivered=Raw(self.delivered.encode()),
        )


@dataclasses.dataclass(frozen=True)
class HelloSpec:
    """A peer hello: every field of ``wire.HelloBody``, then byte edits of the body."""

    version: object
    node: object
    max_packet_payload: object
    channels: object
    listen_address: object
    request: object  # "absent", a RequestSpec, ("twice", RequestSpec) or Raw (the field's value)
    extra_fields: tuple
    edits: tuple = ()

    def packet(self, names: Names) -> bytes:
        fields = [dict(tag=tag, value=v) for tag, v in self.extra_fields]
        request = self.request
        if isinstance(request, Raw):
            fields.insert(0, dict(tag=HelloTag.SESSION, value=request.data))
        elif isinstance(request, RequestSpec):
            fields.insert(0, dict(tag=HelloTag.SESSION, value=request.encode(names)))
        elif isinstance(request, tuple):  # the field twice: the first one counts
            fields[:0] = [dict(tag=HelloTag.SESSION, value=request[1].encode(names))] * 2
        body = build_struct(
            wire.HelloBody,
            version=self.version,
            node_id=names.node(self.node),
            max_packet_payload=self.max_packet_payload,
            channels=_channels(self.channels, names.channels),
            listen_address=self.listen_address,
            fields=fields,
        )
        return wire.encode_extension(PacketType.HELLO, mutate(body, self.edits))


@dataclasses.dataclass(frozen=True)
class AnswerSpec:
    """A listener's session answer: every field of ``wire.SessionAnswerBody``, then edits."""

    session: object
    resumed: object
    reason: object
    delivered: CountsSpec
    edits: tuple = ()

    def packet(self, names: Names) -> bytes:
        body = build_struct(
            wire.SessionAnswerBody,
            session_id=names.session(self.session),
            resumed=names.resuming if self.resumed == EXPECTED else self.resumed,
            reason=self.reason,
            delivered=Raw(self.delivered.encode()),
        )
        return wire.encode_extension(PacketType.SESSION, mutate(body, self.edits))


def _channels(kind, ours) -> list | Raw:
    """The channel list a hello announces, from the Switch's own (``ours``)."""
    if isinstance(kind, Raw):
        return kind
    same = [dict(id=c.id, priority=c.priority, recv_message_capacity=c.recv_message_capacity) for c in ours]
    first = same[0]
    return {
        "same": same,
        "reordered": same[::-1],
        "priority changed": [{**first, "priority": first["priority"] + 1}, *same[1:]],
        "one more": [*same, dict(id=0x22, priority=1, recv_message_capacity=100)],
        "one less": same[1:],
        "none": [],
        "duplicate": [*same, first],
        "priority 0": [{**first, "priority": 0}, *same[1:]],
        "257 channels": [dict(id=i % 256, priority=1, recv_message_capacity=0) for i in range(257)],
    }[kind]


# -- drawing (any chooser: tests/fuzz/declared.py's Reader, or hypothesis) --------------------


def draw_counts(chooser: Chooser) -> CountsSpec:
    entries = tuple(
        (value(chooser, (CHANNEL_IDS[i], *CHANNEL_IDS)), value(chooser, COUNTS, raw_size=10))
        for i in range(chooser.number(3))
    )
    return CountsSpec(value(chooser, DECLARED), entries)


def draw_request(chooser: Chooser):
    kind = value(chooser, REQUESTS)
    if kind == "absent" or isinstance(kind, Raw):
        return kind
    spec = RequestSpec(
        session=value(chooser, SESSIONS, raw_size=20),
        resume=value(chooser, FLAGS) if kind != "fresh" else False,
        delivered=draw_counts(chooser),
    )
    return ("twice", spec) if kind == "twice" else spec


def draw_hello(chooser: Chooser) -> HelloSpec:
    """A hello; an exhausted chooser gives a valid one that resumes the held session."""
    return HelloSpec(
        version=value(chooser, VERSIONS, raw_size=10),
        node=value(chooser, NODES),
        max_packet_payload=value(chooser, PAYLOADS, raw_size=10),
        channels=value(chooser, CHANNEL_SETS),
        listen_address=value(chooser, LISTEN_ADDRESSES),
        request=draw_request(chooser),
        extra_fields=tuple((chooser.pick(FIELD_TAGS), chooser.blob(8)) for _ in range(chooser.number(2))),
        edits=draw_edits(chooser),
    )


def draw_answer(chooser: Chooser) -> AnswerSpec:
    """A session answer; an exhausted chooser gives a valid one: resumed if we asked to
    resume the held session, else fresh under the id we asked for."""
    return AnswerSpec(
        session=value(chooser, SESSIONS, raw_size=20),
        resumed=value(chooser, RESUMED),
        reason=value(chooser, REASONS),
        delivered=draw_counts(chooser),
        edits=draw_edits(chooser),
    )
