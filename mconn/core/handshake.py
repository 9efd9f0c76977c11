"""The hello exchange, pure: what we announce and whether the peer's hello can work.

specs/handshake.md is the prose form. Each side sends its hello as its first packet,
without waiting for the other's; the connection opens when the peer's hello arrives and
passes ``check_hello``. Who the peer is allowed to be (duplicates, self, limits, the id
that was dialed, the node info's compatibility rule of ``mconn.core.node_info``) is the
Switch's decision, made on the HelloReceived event.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from mconn.core.channel import ChannelDescriptor
from mconn.config import MIN_PACKET_PAYLOAD, MIN_RECV_RATE
from mconn.errors import IncompatiblePeer, MalformedPacket, PacketPayloadTooSmall, RecvRateTooSmall
from mconn.core.node_info import NodeInfo, node_info_field, node_info_of
from mconn.core.wire import (
    PROTOCOL_VERSION,
    SESSION_ID_BYTES,
    ChannelInfo,
    Hello,
    HelloTag,
    PacketType,
    RecvRateBody,
    SessionAnswer,
    encode_extension,
    encode_hello,
    encode_session_answer,
)
from mconn.core.wire_primitives import MAX_UVARINT_SIZE, parse, read_uvarint, uvarint_bytes

_SESSION_TAG = HelloTag.SESSION
_RECV_RATE_TAG = HelloTag.RECV_RATE
#: The largest rate the field can carry (a uvarint): a Config's larger one announces this.
MAX_ANNOUNCED_RATE = (1 << (8 * MAX_UVARINT_SIZE)) - 1


def make_hello(
    *,
    node_id: str,
    channels: list[ChannelDescriptor],
    max_packet_payload: int,
    listen_address: str = "",
    fields: tuple[tuple[int, bytes], ...] = (),
    node_info: NodeInfo | None = None,
) -> Hello:
    """Our hello: the protocol version, who we are and the channels we offer; with
    ``node_info``, its field follows ``fields`` (specs/handshake.md section 6)."""
    if node_info is not None:
        fields = (*fields, node_info_field(node_info))
    return Hello(
        version=PROTOCOL_VERSION,
        node_id=node_id,
        max_packet_payload=max_packet_payload,
        channels=tuple(
            ChannelInfo(id=c.id, priority=c.priority, recv_message_capacity=c.recv_message_capacity) for c in channels
        ),
        listen_address=listen_address,
        fields=fields,
    )


def check_hello(ours: Hello, theirs: Hello) -> int:
    """Raise IncompatiblePeer if ``theirs`` cannot work with ``ours``: another protocol
    version, (PacketPayloadTooSmall) a max_packet_payload below ``MIN_PACKET_PAYLOAD``,
    which would have everything we send cut into packets that small, or
    (RecvRateTooSmall) a receive rate below ``MIN_RECV_RATE``, which would have us hold
    what we send it in our queues for nothing.

    Returns the negotiated max_packet_payload: the smaller of the two, so at least
    ``MIN_PACKET_PAYLOAD`` (a Config cannot announce less).

    :raises MalformedPacket: if their node info field or receive rate field does not
        decode (specs/handshake.md sections 6.1 and 7): the connection fails like on any
        malformed packet. Whether the node info is compatible is the Switch's decision
        (``node_info.check_compatible``).
    """
    if theirs.version != ours.version:
        raise IncompatiblePeer(
            f"peer {theirs.node_id} speaks protocol version {theirs.version}; we speak {ours.version}"
        )
    node_info_of(theirs)
    if theirs.max_packet_payload < MIN_PACKET_PAYLOAD:
        raise PacketPayloadTooSmall(
            f"peer {theirs.node_id} announces max_packet_payload {theirs.max_packet_payload}; "
            f"the floor is {MIN_PACKET_PAYLOAD} bytes (CometBFT's packet size)"
        )
    rate = recv_rate_of(theirs)
    if rate is not None and rate < MIN_RECV_RATE:
        raise RecvRateTooSmall(
            f"peer {theirs.node_id} announces recv_rate {rate} bytes per second; "
            f"the floor is {MIN_RECV_RATE} (what we send it would wait in our queues)"
        )
    return min(ours.max_packet_payload, theirs.max_packet_payload)


def recv_rate_field(rate: float) -> tuple[int, bytes]:
    """The hello field announcing that we read at most ``rate`` bytes per second from a
    peer (tag ``03``, specs/handshake.md section 7): whole bytes, rounded down, so that a
    sender pacing at it never sends faster than we read."""
    return (_RECV_RATE_TAG, uvarint_bytes(min(int(rate), MAX_ANNOUNCED_RATE)))


def recv_rate_of(hello: Hello) -> int | None:
    """The receive rate ``hello`` announces, bytes per second; None when it announces
    none (an older node, or one without ``Config.recv_rate``): no limit.

    :raises MalformedPacket: if the field's value is not one uvarint, or the hello
        carries the field twice.
    """
    found = None
    for tag, value in hello.fields:
        if tag == _RECV_RATE_TAG:
            if found is not None:
                raise MalformedPacket("hello announces recv_rate twice")
            found = value
    if found is None:
        return None
    try:
        rate, end = read_uvarint(found, 0)
        if end == len(found):
            return rate
    except IndexError:
        pass
    try:
        parsed: int = parse(RecvRateBody, found, "recv_rate field").rate  # raises, naming why
    except MalformedPacket as e:
        if "recv_rate" in str(e):
            raise
        raise MalformedPacket(f"malformed recv_rate field ({len(found)} bytes): {e}") from None
    return parsed


def announcing_recv_rate(hello: Hello, rate: float | None) -> Hello:
    """``hello`` with the receive rate field for ``rate`` after its other fields (itself
    when ``rate`` is None or it carries the field already). The last one is remembered
    by identity: a listener announces the same hello to every peer."""
    if rate is None:
        return hello
    last = _last_announced
    if last[0] is hello and last[1] == rate:
        announced: Hello = last[2]
        return announced
    if any(tag == _RECV_RATE_TAG for tag, _ in hello.fields):
        announced = hello
    else:
        announced = dataclasses.replace(hello, fields=(*hello.fields, recv_rate_field(rate)))
    _last_announced[:] = (hello, rate, announced)
    return announced


#: The Hello ``announcing_recv_rate`` was last given, the rate, and what it returned.
_last_announced: list[Any] = [None, None, None]


def hello_packet(hello: Hello) -> bytes:
    """Our hello packet. A listener's is the same for every connection: encoded once, it
    costs a connection flood nothing (a dialer's carries a fresh session id each time).
    The last one is found by identity first: a Hello's hash walks all its fields."""
    last = _last_hello
    if last[0] is hello:
        packet: bytes = last[1]
        return packet
    packet = _hello_packet(hello)
    _last_hello[:] = (hello, packet)
    return packet


#: The Hello ``hello_packet`` encoded last, and its packet.
_last_hello: list[Any] = [None, b""]


@functools.lru_cache(maxsize=16)
def _hello_packet(hello: Hello) -> bytes:
    return encode_extension(PacketType.HELLO, encode_hello(hello))


def session_field(hello: Hello) -> bytes | None:
    """The value of ``hello``'s session request field (tag ``01``: a dialer's hello has
    one), undecoded; None when it has none."""
    for tag, value in hello.fields:
        if tag == _SESSION_TAG:
            return value
    return None


def asks_for_session(hello: Hello) -> bool:
    """Whether ``hello`` carries a session request (tag ``01``: a dialer's does)."""
    return session_field(hello) is not None


@functools.lru_cache(maxsize=16)
def fresh_answer_parts(reason: str) -> tuple[bytes, bytes]:
    """A fresh session's answer packet (not resumed, no counts; specs/wire.md section
    3.5) before and after its session id: the same for every new dialer answered with
    ``reason``, so encoded once. ``head + session_id + tail`` is the packet of
    ``SessionAnswer(session_id=session_id, resumed=False, reason=reason)`` for any
    16-byte id (tests/core/test_handshake_shared.py)."""
    body = encode_session_answer(SessionAnswer(session_id=bytes(SESSION_ID_BYTES), resumed=False, reason=reason))
    packet = encode_extension(PacketType.SESSION, body)
    at = len(packet) - len(body)  # the body starts with the session id
    return packet[:at], packet[at + SESSION_ID_BYTES :]
