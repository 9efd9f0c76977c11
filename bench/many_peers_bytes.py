"""The bytes of bench/many_peers.py's storms: a dialer's hello (with a session request) and
the raw round's bytes (what the listener's Switch sends a new dialer), built by the mconn
under test."""

from __future__ import annotations

CHANNEL = 0x20


def hello_template() -> bytes:
    """A dialer's hello packet with a session request (node id ab.., session id cd..)."""
    from mconn import ChannelDescriptor
    from mconn.core import wire
    from mconn.core.handshake import make_hello
    from mconn.core.wire import HelloTag, PacketType, SessionRequest

    request = wire.encode_session_request(SessionRequest(session_id=b"\xcd" * 16, resume=False))
    body = wire.encode_hello(
        make_hello(
            node_id="ab" * 20,
            channels=[ChannelDescriptor(CHANNEL, priority=1)],
            max_packet_payload=1024,
            fields=((HelloTag.SESSION, request),),
        )
    )
    return wire.encode_extension(PacketType.HELLO, body)


def round_sizes(switch) -> dict:
    """The raw round's bytes: the listener's hello packet and a fresh session's answer
    packet (what the Switch sends a new dialer), and the size of a dialer's hello."""
    from mconn.core import wire
    from mconn.core.handshake import make_hello
    from mconn.core.wire import PacketType, SessionAnswer

    hello = make_hello(
        node_id=switch.node_id,
        channels=switch.channels,
        max_packet_payload=switch.config.max_packet_payload,
        listen_address=switch.listen_address,
        node_info=switch.node_info,
    )
    answer = wire.encode_session_answer(SessionAnswer(session_id=b"\x00" * 16, resumed=False))
    return {
        "hello_bytes": wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello)),
        "answer_bytes": wire.encode_extension(PacketType.SESSION, answer),
        "request": len(hello_template()),
    }
