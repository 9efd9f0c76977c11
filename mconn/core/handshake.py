"""The hello exchange, pure: what we announce and whether the peer's hello can work.

specs/handshake.md is the prose form. Each side sends its hello as its first packet,
without waiting for the other's; the connection opens when the peer's hello arrives and
passes ``check_hello``. Who the peer is allowed to be (duplicates, self, limits, the id
that was dialed, the node info's compatibility rule of ``mconn.core.node_info``) is the
Switch's decision, made on the HelloReceived event.
"""

from __future__ import annotations

import functools
from typing import Any

from mconn.core.channel import ChannelDescriptor
from mconn.config import MIN_PACKET_PAYLOAD
from mconn.errors import IncompatiblePeer, PacketPayloadTooSmall
from mconn.core.node_info import NodeInfo, node_info_field, node_info_of
from mconn.core.wire import (
    PROTOCOL_VERSION,
    SESSION_ID_BYTES,
    ChannelInfo,
    Hello,
    HelloTag,
    PacketType,
    SessionAnswer,
    encode_extension,
    encode_hello,
    encode_session_answer,
)

_SESSION_TAG = HelloTag.SESSION


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
    version, or (PacketPayloadTooSmall) a max_packet_payload below ``MIN_PACKET_PAYLOAD``,
    which would have everything we send cut into packets that small.

    Returns the negotiated max_packet_payload: the smaller of the two, so at least
    ``MIN_PACKET_PAYLOAD`` (a Config cannot announce less).

    :raises MalformedPacket: if their node info field does not decode (specs/handshake.md
        section 6.1): the connection fails like on any malformed packet. Whether the node
        info is compatible is the Switch's decision (``node_info.check_compatible``).
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
    return min(ours.max_packet_payload, theirs.max_packet_payload)


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
