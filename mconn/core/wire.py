"""The wire format, declared once with construct (specs/wire.md is its prose form).

This module is the single source of truth for the bytes on the wire. The hot path
(frame_buffer.py for decoding, channel.py for encoding msg packets) is hand-written for
speed; tests/core/test_codec_equivalence.py proves it byte-identical to these
declarations with hypothesis, on valid and malformed input.

Packet types (specs/wire.md section 2)::

    01                                   ping
    02                                   pong
    03 | ch (1) | eof (1) | uvarint len | data          msg packet (Tendermint go-wire)
    TT | uvarint len | body              extension packet, TT >= 04

Extension types 04..7F are critical (an unknown one is a protocol error); 80..FF are
optional (an unknown one is stepped over). Every parse failure becomes MalformedPacket.
The go-wire primitives the declarations are built of (uvarint, byte slice, string) are
mconn/core/wire_primitives.py's; the pre-hello sent before TLS is mconn/core/pre_hello.py's.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from construct import (
    Bytes,
    Error,
    GreedyRange,
    Int8ub,
    OneOf,
    Pass,
    PrefixedArray,
    Struct,
    Switch,
    Terminated,
    this,
)

from mconn.errors import MalformedPacket
from mconn.core.wire_primitives import (  # also this module's names: wire.uvarint, wire._parse, ...
    MAX_UVARINT_SIZE,
    BoolByte,
    ByteSlice,
    String,
    read_uvarint,
    uvarint,
    uvarint_bytes,
)
from mconn.core.wire_primitives import parse as _parse

PROTOCOL_VERSION = 1
NODE_ID_BYTES = 20
MAX_CHANNELS = 256


class PacketType(enum.IntEnum):
    """The type byte that starts every packet (specs/wire.md section 2)."""

    PING = 0x01
    PONG = 0x02
    MSG = 0x03
    HELLO = 0x04
    CLOSE = 0x05
    ACK = 0x06
    SESSION = 0x07


class HelloTag(enum.IntEnum):
    """Tags of the optional hello fields (specs/handshake.md section 2)."""

    #: The dialer's session request (specs/resume.md section 2).
    SESSION = 0x01
    #: The node info: network, protocol versions, moniker, other (specs/handshake.md section 6).
    NODE_INFO = 0x02
    #: The rate the sender reads at, bytes per second (specs/handshake.md section 7).
    RECV_RATE = 0x03


SESSION_ID_BYTES = 16


FIRST_EXTENSION_TYPE = 0x04
FIRST_OPTIONAL_TYPE = 0x80


# 03 | channel id (1 byte) | eof (1 byte: 01 ends the message, 00 more follow) | ByteSlice
MsgPacket = Struct(
    "channel_id" / Int8ub,
    "eof" / BoolByte(OneOf(Int8ub, [0, 1])),
    "data" / ByteSlice,
)

# TT | uvarint length | body   (TT >= 04; the body's layout depends on TT)
ExtensionBody = Struct("body" / ByteSlice)

# One whole packet, and nothing after it.
Packet = Struct(
    "type" / Int8ub,
    "payload"
    / Switch(
        this.type,
        {PacketType.PING: Pass, PacketType.PONG: Pass, PacketType.MSG: MsgPacket},
        default=Switch(this.type >= FIRST_EXTENSION_TYPE, {True: ExtensionBody}, default=Error),
    ),
    Terminated,
)

# Hello body (specs/handshake.md section 2):
#   uvarint version | 20 bytes node id | uvarint max_packet_payload |
#   uvarint n_channels | n x (id (1) | uvarint priority | uvarint recv_message_capacity) |
#   String listen address | fields: repeated (tag (1) | ByteSlice value) until the end
ChannelEntry = Struct(
    "id" / Int8ub,
    "priority" / uvarint,
    "recv_message_capacity" / uvarint,
)
HelloField = Struct("tag" / Int8ub, "value" / ByteSlice)
HelloBody = Struct(
    "version" / uvarint,
    "node_id" / Bytes(NODE_ID_BYTES),
    "max_packet_payload" / uvarint,
    "channels" / PrefixedArray(uvarint, ChannelEntry),
    "listen_address" / String,
    "fields" / GreedyRange(HelloField),
    Terminated,
)

# Close body (specs/wire.md section 3.2): String code | String text
CloseBody = Struct("code" / String, "text" / String, Terminated)

# Per-channel counts of whole messages delivered to the reactor (specs/resume.md):
#   uvarint n | n x (channel id (1) | uvarint count)
Counts = PrefixedArray(uvarint, Struct("channel_id" / Int8ub, "count" / uvarint))

# Ack body (specs/resume.md section 2): Counts
AckBody = Struct("delivered" / Counts, Terminated)

# Hello field SESSION (the dialer's request, specs/resume.md section 2):
#   16 bytes session id | resume (1 byte: 00 fresh, 01 resume) | Counts (empty when fresh)
SessionRequestBody = Struct(
    "session_id" / Bytes(SESSION_ID_BYTES),
    "resume" / BoolByte(OneOf(Int8ub, [0, 1])),
    "delivered" / Counts,
    Terminated,
)

# Hello field NODE_INFO (specs/handshake.md section 6; limits in mconn/core/node_info.py):
#   uvarint p2p | uvarint block | uvarint app        the protocol versions
#   String network | String version | String moniker
#   uvarint n_other | n_other x (String key | String value)
NodeInfoBody = Struct(
    "p2p" / uvarint,
    "block" / uvarint,
    "app" / uvarint,
    "network" / String,
    "version" / String,
    "moniker" / String,
    "other" / PrefixedArray(uvarint, Struct("key" / String, "value" / String)),
    Terminated,
)

# Hello field RECV_RATE (specs/handshake.md section 7): uvarint bytes per second, the
# most the sender of the hello reads from one peer (its Config.recv_rate, rounded down).
RecvRateBody = Struct("rate" / uvarint, Terminated)

# Session packet (the listener's answer, specs/resume.md section 2):
#   16 bytes session id | resumed (1 byte: 00 fresh, 01 resumed) | String reason | Counts
SessionAnswerBody = Struct(
    "session_id" / Bytes(SESSION_ID_BYTES),
    "resumed" / BoolByte(OneOf(Int8ub, [0, 1])),
    "reason" / String,
    "delivered" / Counts,
    Terminated,
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SessionRequest:
    """The dialer's hello field: start ``session_id`` fresh, or resume it."""

    session_id: bytes
    resume: bool
    delivered: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SessionAnswer:
    """The listener's answer: the session resumed (with its delivered counts) or fresh."""

    session_id: bytes
    resumed: bool
    reason: str = ""
    delivered: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ChannelInfo:
    """One channel as a peer announces it in its hello."""

    id: int
    priority: int
    recv_message_capacity: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Hello:
    """A decoded hello: what a peer says about itself (specs/handshake.md)."""

    version: int
    node_id: str
    max_packet_payload: int
    channels: tuple[ChannelInfo, ...]
    listen_address: str = ""
    #: Optional fields by tag; unknown tags are kept and ignored (room for resumption).
    fields: tuple[tuple[int, bytes], ...] = ()


def encode_hello(hello: Hello) -> bytes:
    """The hello body (without the extension header)."""
    built: bytes = HelloBody.build(
        dict(
            version=hello.version,
            node_id=bytes.fromhex(hello.node_id),
            max_packet_payload=hello.max_packet_payload,
            channels=[
                dict(id=c.id, priority=c.priority, recv_message_capacity=c.recv_message_capacity)
                for c in hello.channels
            ],
            listen_address=hello.listen_address,
            fields=[dict(tag=t, value=v) for t, v in hello.fields],
        )
    )
    return built


def decode_hello(body: bytes) -> Hello:
    """Decode a hello body; raises MalformedPacket naming what is wrong.

    Beyond the layout, a hello must announce max_packet_payload >= 1 and at most 256
    channels, each once, each with priority >= 1 (specs/handshake.md section 2).

    Read by hand (``_hello_parts``: construct took ~0.45 ms per hello, a handshake's
    largest cost in a connect storm); a body the hand-written reader does not take is
    parsed with ``HelloBody``, so every error (and its message) is the declaration's.
    tests/core/test_handshake_codec_equivalence.py proves the two identical on valid and malformed bodies.
    """
    parts = _hello_parts(body)
    if parts is None:
        parts = hello_parts_declared(body)
    version, node_id, max_packet_payload, channels, listen_address, fields = parts
    if max_packet_payload < 1:
        raise MalformedPacket(f"hello announces max_packet_payload {max_packet_payload}; it must be >= 1")
    announced = tuple(channels)
    infos = _CHANNEL_INFOS.get(announced)
    if infos is None:
        infos = _channel_infos(announced)
        if len(_CHANNEL_INFOS) < CHANNEL_INFOS_KEPT:
            _CHANNEL_INFOS[announced] = infos
    return Hello(
        version=version,
        node_id=node_id.hex(),
        max_packet_payload=max_packet_payload,
        channels=infos,
        listen_address=listen_address,
        fields=tuple(fields),
    )


#: The channel lists of the hellos decoded so far, (id, priority, capacity) triples ->
#: their ChannelInfos (frozen, so shared): the nodes of one network announce a handful
#: of lists, and a connect storm decodes the same one thousands of times. At most
#: CHANNEL_INFOS_KEPT lists are kept; the others are decoded each time.
_CHANNEL_INFOS: dict[tuple[tuple[int, int, int], ...], tuple[ChannelInfo, ...]] = {}
CHANNEL_INFOS_KEPT = 64


def _channel_infos(channels: tuple[tuple[int, int, int], ...]) -> tuple[ChannelInfo, ...]:
    """The ChannelInfos of a hello's ``(id, priority, capacity)`` triples, checked: at
    most MAX_CHANNELS, each id once, each priority >= 1."""
    if len(channels) > MAX_CHANNELS:
        raise MalformedPacket(f"hello lists {len(channels)} channels; at most {MAX_CHANNELS} exist")
    seen = set()
    for channel_id, priority, _ in channels:
        if channel_id in seen:
            raise MalformedPacket(f"hello lists channel {channel_id:#04x} twice")
        seen.add(channel_id)
        if priority < 1:
            raise MalformedPacket(f"hello gives channel {channel_id:#04x} priority {priority}; priorities are >= 1")
    return tuple(ChannelInfo(id=i, priority=p, recv_message_capacity=r) for i, p, r in channels)


#: A hello body's parts: version, node id bytes, max_packet_payload, the channels'
#: (id, priority, recv_message_capacity), listen address, the (tag, value) fields.
_HelloParts = tuple[int, bytes, int, list[tuple[int, int, int]], str, list[tuple[int, bytes]]]


def hello_parts_declared(body: bytes) -> _HelloParts:
    """``HelloBody``'s parse of a hello body, as the tuple ``_hello_parts`` returns."""
    c = _parse(HelloBody, body, "hello")
    return (
        c.version,
        c.node_id,
        c.max_packet_payload,
        [(e.id, e.priority, e.recv_message_capacity) for e in c.channels],
        c.listen_address,
        [(f.tag, f.value) for f in c.fields],
    )


def _hello_parts(body: bytes) -> _HelloParts | None:
    """A hello body read by hand, as ``(version, node id bytes, max_packet_payload,
    [(id, priority, recv_message_capacity)], listen address, [(tag, value)])``; None
    for anything ``HelloBody`` might refuse (or list more than MAX_CHANNELS channels):
    the declaration then decides and says why.

    The uvarints are read inline (``read_uvarint``'s rule: a size byte of at most
    MAX_UVARINT_SIZE, then that many big-endian bytes, all within the body): a call
    each was a fifth of the reader's time, and a connect storm reads one hello per
    connection."""
    end = len(body)
    limit = MAX_UVARINT_SIZE
    try:
        size = body[0]  # version
        at = 1 + size
        if size > limit or at > end:
            return None
        version = int.from_bytes(body[1:at], "big")
        if at + NODE_ID_BYTES > end:
            return None
        node_id = body[at : at + NODE_ID_BYTES]
        at += NODE_ID_BYTES
        size = body[at]  # max_packet_payload
        start, at = at + 1, at + 1 + size
        if size > limit or at > end:
            return None
        max_packet_payload = int.from_bytes(body[start:at], "big")
        size = body[at]  # the channel count
        start, at = at + 1, at + 1 + size
        if size > limit or at > end:
            return None
        count = int.from_bytes(body[start:at], "big")
        if count > MAX_CHANNELS:
            return None
        channels = []
        for _ in range(count):  # bounded by MAX_CHANNELS
            channel_id = body[at]
            size = body[at + 1]  # priority
            start, at = at + 2, at + 2 + size
            if size > limit or at > end:
                return None
            priority = int.from_bytes(body[start:at], "big")
            size = body[at]  # recv_message_capacity
            start, at = at + 1, at + 1 + size
            if size > limit or at > end:
                return None
            channels.append((channel_id, priority, int.from_bytes(body[start:at], "big")))
        size = body[at]  # the listen address's length
        start, at = at + 1, at + 1 + size
        if size > limit or at > end:
            return None
        size = int.from_bytes(body[start:at], "big")
        if at + size > end:
            return None
        listen_address = body[at : at + size].decode("utf8")
        at += size
        fields = []
        while at < end:  # bounded: each turn moves ``at`` on by 2 bytes at least
            tag = body[at]
            size = body[at + 1]  # the value's length
            start, at = at + 2, at + 2 + size
            if size > limit or at > end:
                return None
            size = int.from_bytes(body[start:at], "big")
            if at + size > end:
                return None
            fields.append((tag, bytes(body[at : at + size])))
            at += size
    except (IndexError, UnicodeDecodeError):
        return None
    return version, bytes(node_id), max_packet_payload, channels, listen_address, fields


def encode_close(code: str, text: str = "") -> bytes:
    """The close body (without the extension header)."""
    built: bytes = CloseBody.build(dict(code=code, text=text))
    return built


def decode_close(body: bytes) -> tuple[str, str]:
    """Decode a close body into (code, text)."""
    c = _parse(CloseBody, body, "close")
    return c.code, c.text


def _counts(parsed: Any) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in parsed:
        if entry.channel_id in counts:
            raise MalformedPacket(f"counts list channel {entry.channel_id:#04x} twice")
        counts[entry.channel_id] = entry.count
    return counts


def _count_list(counts: dict[int, int]) -> list[dict[str, int]]:
    return [dict(channel_id=c, count=n) for c, n in sorted(counts.items())]


def encode_ack(delivered: dict[int, int]) -> bytes:
    """The ack body: per-channel delivered counts.

    Hand-written (acks are on the data path: the construct build costs ~80 us);
    tests/core/test_codec_equivalence.py proves it byte-identical to ``AckBody``.
    """
    parts = [uvarint_bytes(len(delivered))]
    for channel_id, count in sorted(delivered.items()):
        if not 0 <= channel_id <= 0xFF or not 0 <= count < 1 << (8 * MAX_UVARINT_SIZE):
            built: bytes = AckBody.build(dict(delivered=_count_list(delivered)))  # its error says why
            return built
        parts.append(bytes((channel_id,)))
        parts.append(uvarint_bytes(count))
    return b"".join(parts)


def decode_ack(body: bytes) -> dict[int, int]:
    """Per-channel counts from an ack body; MalformedPacket if it does not follow AckBody.

    Hand-written like encode_ack; any failure is re-parsed with the declaration, so the
    error raised (and its message) is the declaration's.
    """
    try:
        n, at = read_uvarint(body, 0)
        counts: dict[int, int] = {}
        for _ in range(n):
            channel_id = body[at]
            count, at = read_uvarint(body, at + 1)
            if channel_id in counts:
                break
            counts[channel_id] = count
        else:
            if at == len(body):
                return counts
    except IndexError:
        pass
    return _counts(_parse(AckBody, body, "ack").delivered)


def encode_session_request(request: SessionRequest) -> bytes:
    built: bytes = SessionRequestBody.build(
        dict(session_id=request.session_id, resume=request.resume, delivered=_count_list(request.delivered))
    )
    return built


def decode_session_request(value: bytes) -> SessionRequest:
    """Hand-written like decode_ack (a handshake's cost); anything it does not take is
    parsed with ``SessionRequestBody``, whose error is raised."""
    if len(value) == SESSION_ID_BYTES + 2 and value[-1] == 0 and value[-2] <= 1:
        # A dialer's usual request: no counts (the uvarint 0 is its size byte alone).
        return SessionRequest(session_id=bytes(value[:SESSION_ID_BYTES]), resume=bool(value[-2]), delivered={})
    try:
        resume = value[SESSION_ID_BYTES]
        delivered, at = _read_counts(value, SESSION_ID_BYTES + 1)
        if resume <= 1 and delivered is not None and at == len(value):
            return SessionRequest(session_id=bytes(value[:SESSION_ID_BYTES]), resume=bool(resume), delivered=delivered)
    except IndexError:
        pass
    c = _parse(SessionRequestBody, value, "session request")
    return SessionRequest(session_id=c.session_id, resume=c.resume, delivered=_counts(c.delivered))


def _read_counts(data: bytes, at: int) -> tuple[dict[int, int] | None, int]:
    """``Counts`` read by hand from ``at``: (counts, next offset); None for a channel
    listed twice (``_counts`` then says so); IndexError if they do not fit."""
    n, at = read_uvarint(data, at)
    counts: dict[int, int] = {}
    for _ in range(n):
        channel_id = data[at]
        count, at = read_uvarint(data, at + 1)
        if channel_id in counts:
            return None, at
        counts[channel_id] = count
    return counts, at


def encode_session_answer(answer: SessionAnswer) -> bytes:
    """Hand-written like encode_ack (a handshake's cost); proven byte-identical to
    ``SessionAnswerBody`` (tests/core/test_handshake_codec_equivalence.py); whatever it cannot encode is
    built with the declaration, whose error is raised."""
    session_id, reason, delivered = answer.session_id, answer.reason, answer.delivered
    if (
        type(session_id) is bytes
        and len(session_id) == SESSION_ID_BYTES
        and type(reason) is str
        and all(type(c) is int and 0 <= c <= 0xFF and type(n) is int and 0 <= n < 1 << 64 for c, n in delivered.items())
    ):
        text = reason.encode("utf8")
        return b"".join(
            (
                session_id,
                b"\x01" if answer.resumed else b"\x00",
                uvarint_bytes(len(text)),
                text,
                encode_ack(delivered),
            )
        )
    built: bytes = SessionAnswerBody.build(
        dict(
            session_id=answer.session_id,
            resumed=answer.resumed,
            reason=answer.reason,
            delivered=_count_list(answer.delivered),
        )
    )
    return built


def decode_session_answer(body: bytes) -> SessionAnswer:
    c = _parse(SessionAnswerBody, body, "session answer")
    return SessionAnswer(session_id=c.session_id, resumed=c.resumed, reason=c.reason, delivered=_counts(c.delivered))


def encode_extension(packet_type: int, body: bytes) -> bytes:
    """A whole extension packet: type byte, uvarint length, body.

    Hand-written (acks go through it); byte-identical to ``Packet`` for extension types
    (tests/core/test_codec_equivalence.py).
    """
    if not FIRST_EXTENSION_TYPE <= packet_type <= 0xFF:
        built: bytes = Packet.build(dict(type=packet_type, payload=dict(body=body)))  # its error says why
        return built
    return bytes((packet_type,)) + uvarint_bytes(len(body)) + body


def encode_packet(packet_type: int, **payload: Any) -> bytes:
    """Build any packet from the declaration (the reference encoder; not the hot path)."""
    if packet_type in (PacketType.PING, PacketType.PONG):
        built: bytes = Packet.build(dict(type=packet_type, payload=None))
        return built
    if packet_type == PacketType.MSG:
        built = Packet.build(dict(type=packet_type, payload=payload))
        return built
    return encode_extension(packet_type, payload["body"])


def decode_packet(data: bytes) -> tuple[int, Any]:
    """Parse exactly one whole packet with the declaration (the reference decoder).

    Returns ``(type, payload)`` where payload is None for ping/pong, a
    ``(channel_id, eof, data)`` tuple for a msg packet, and the body bytes for an
    extension packet.
    """
    c = _parse(Packet, data, "packet")
    if c.type == PacketType.MSG:
        return c.type, (c.payload.channel_id, c.payload.eof, c.payload.data)
    if c.type >= FIRST_EXTENSION_TYPE:
        return c.type, c.payload.body
    return c.type, None


def encode_uvarint(value: int) -> bytes:
    """go-wire uvarint bytes for ``value``."""
    built: bytes = uvarint.build(value)
    return built
