"""Session state (mconn.core.session) and its packets (ack 06, session answer 07, hello field 01)."""

import pathlib
import re

import pytest

from mconn.core import wire
from mconn.errors import MalformedPacket
from mconn.core.session import MESSAGE_OVERHEAD, AckError, Session

SPEC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "wire.md"


def session(**kwargs):
    kwargs.setdefault("recovery_buffer_bytes", 1000)
    kwargs.setdefault("ack_every_messages", 3)
    kwargs.setdefault("ack_every_bytes", 10_000)
    kwargs.setdefault("channel_reserve_bytes", 100)
    return Session(b"\x11" * 16, [0x20, 0x21], **kwargs)


def test_ack_example_in_the_spec_is_what_the_declaration_builds():
    """The ack example in specs/wire.md is what encode_ack builds, and it decodes back to its counts."""
    example = re.search(r"`(06 01 09 [0-9a-f ]+)`", SPEC.read_text()).group(1)
    packet = wire.encode_extension(wire.PacketType.ACK, wire.encode_ack({0x20: 5, 0x21: 300}))
    assert packet.hex(" ") == example
    kind, body = wire.decode_packet(packet)
    assert kind == wire.PacketType.ACK and wire.decode_ack(body) == {0x20: 5, 0x21: 300}


def test_session_request_and_answer_round_trip_and_refuse_bad_bytes():
    """Session request and answer round-trip; a resume flag of 02 and a channel acked twice are MalformedPacket."""
    request = wire.SessionRequest(session_id=b"\x01" * 16, resume=True, delivered={0x20: 7})
    assert wire.decode_session_request(wire.encode_session_request(request)) == request
    answer = wire.SessionAnswer(session_id=b"\x02" * 16, resumed=False, reason="unknown session")
    assert wire.decode_session_answer(wire.encode_session_answer(answer)) == answer
    with pytest.raises(MalformedPacket):
        wire.decode_session_request(b"\x01" * 16 + b"\x02\x00")  # resume flag 02
    with pytest.raises(MalformedPacket, match="twice"):
        wire.decode_ack(bytes.fromhex("01 02 20 01 01 20 01 02"))


def test_acks_drop_confirmed_messages_in_order():
    """An ack drops the confirmed messages from the recovery buffer in order; a repeated
    ack changes nothing. Each message counts its length plus MESSAGE_OVERHEAD."""
    s = session()
    for i in range(4):
        assert s.record_sent(0x20, b"m%d" % i) == i
    assert s.accepted(0x20) == 4 and s.unacked_bytes == 4 * (2 + MESSAGE_OVERHEAD)
    assert s.on_ack({0x20: 3}) == [(0x20, 0, 3)]
    assert s.acked(0x20) == 3 and s.unacked_bytes == 2 + MESSAGE_OVERHEAD
    assert s.unconfirmed() == {0x20: 1}
    assert s.on_ack({0x20: 3}) == []  # repeated: no change


def test_impossible_acks_are_protocol_errors_naming_the_values():
    """An ack beyond what was sent, going backwards, or on an unknown channel is an AckError naming the values."""
    s = session()
    s.record_sent(0x20, b"x")
    with pytest.raises(AckError, match="says 2 messages delivered on channel 0x20, but only 1 were sent"):
        s.on_ack({0x20: 2})
    s.on_ack({0x20: 1})
    with pytest.raises(AckError, match="went backwards: 0 after 1"):
        s.on_ack({0x20: 0})
    with pytest.raises(AckError, match="channel 0x30"):
        s.on_ack({0x30: 0})


def test_resume_resends_exactly_what_the_peer_lacks():
    """On resume, exactly the messages past the peer's delivered counts are resent, on every channel."""
    s = session()
    for i in range(5):
        s.record_sent(0x20, b"a%d" % i)
    s.record_sent(0x21, b"b0")
    resend = s.to_resend({0x20: 2})  # the peer delivered a0, a1; the rest never arrived whole
    assert resend == {0x20: [b"a2", b"a3", b"a4"], 0x21: [b"b0"]}
    assert s.resent == 4


def test_recovery_buffer_is_bounded_but_each_channel_keeps_a_reserve():
    """The recovery buffer is bounded overall, but a full buffer still leaves each channel its reserve."""
    s = session(recovery_buffer_bytes=1000, channel_reserve_bytes=300)
    s.record_sent(0x20, b"x" * (990 - MESSAGE_OVERHEAD))  # bulk fills the shared bound
    assert not s.has_room(0x20, 20)  # over the bound and over 0x20's reserve
    assert s.has_room(0x21, 20)  # another channel is not starved: its reserve
    s.record_sent(0x21, b"y" * 60)
    room = 300 - (60 + MESSAGE_OVERHEAD) - MESSAGE_OVERHEAD
    assert s.has_room(0x21, room) and not s.has_room(0x21, room + 1)
    assert session().has_room(0x20, 10**9)  # an empty channel always takes one message


def test_empty_messages_are_not_free_a_peer_that_never_acknowledges_holds_a_bounded_number():
    """Counted by payload alone, empty messages would fit the reserve for ever; each costs
    MESSAGE_OVERHEAD, so the buffer takes reserve / overhead of them on a channel, and the
    recovery buffer bound stops the rest."""
    s = session(recovery_buffer_bytes=10 * MESSAGE_OVERHEAD, channel_reserve_bytes=4 * MESSAGE_OVERHEAD)
    taken = [s.admit(0x20, b"") for _ in range(100)]
    assert taken.count(None) == 100 - 10 and taken[:10] == list(range(10))
    assert s.unacked_bytes == 10 * MESSAGE_OVERHEAD
    assert [s.admit(0x21, b"") for _ in range(5)] == [0, 1, 2, 3, None]  # 0x21 keeps its reserve
    assert s.admit_many(0x21, [b""] * 2, 0) is None
    s.on_ack({0x20: 10})
    assert s.unacked_bytes == 4 * MESSAGE_OVERHEAD and s.admit_many(0x21, [b""] * 2, 0) == 4


def test_acks_are_due_after_n_messages_or_b_bytes():
    """An ack is due after ack_every_messages messages or ack_every_bytes bytes, whichever comes first;
    proves() accepts only the session's own id."""
    s = session(ack_every_messages=3, ack_every_bytes=100)
    assert not s.record_delivered(0x20, 10)
    assert not s.record_delivered(0x21, 10)
    assert s.record_delivered(0x20, 10)  # third message
    assert s.take_ack() == {0x20: 2, 0x21: 1} and not s.ack_pending
    assert s.record_delivered(0x20, 100)  # bytes
    assert s.proves(b"\x11" * 16) and not s.proves(b"\x12" * 16)
