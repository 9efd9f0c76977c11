"""The golden vectors of specs/vectors/resume.json through every codec of the core.

Ack (06) and session answer (07) packets go through the construct declaration
(``wire.decode_packet`` / ``encode_extension`` and the body codecs), through the
hand-written FrameBuffer (whole and one byte at a time) and through an open Connection
(whole and one byte at a time); session request values (hello field 01) through their
codec and, inside a hello packet, through a handshaking Connection. Each invalid vector
is refused by exactly the layers it names (see "invalid_comment" in resume.json), with
exactly the error class it names. The "ack_checks" drive ``mconn.core.session.Session.on_ack``
(specs/resume.md section 2.3).
"""

import re

import pytest

from mconn import errors
from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.core.events import AckReceived, ConnectionFailed, HelloReceived, SessionAnswered
from mconn.core.session import AckError, Session
from mconn.core.wire import PacketType
from tests.helpers_core import (
    expand,
    check_frames,
    check_invalid_frames,
    feed_bytewise,
    load_vectors,
    make_connection,
    open_connection,
    vector_frame_buffer,
)

RESUME = load_vectors("resume")
LIMITS = RESUME["limits"]
OPEN_CHANNELS = [ChannelDescriptor(0x20), ChannelDescriptor(0x30)]
PACKET_TYPE = {"ack": PacketType.ACK, "session_answer": PacketType.SESSION}
LAYERS = {"decode_body", "decode_packet", "stream", "connection", "switch"}


def _of_kind(vectors, *kinds):
    return [v for v in vectors if v["kind"] in kinds]


def _ids(vectors):
    return [v["name"] for v in vectors]


def _counts(items) -> dict[int, int]:
    return {item["channel_id"]: item["count"] for item in items}


def _value(kind: str, decoded: dict):
    """A vector's "decoded" as the Python value the body codec returns."""
    if kind == "ack":
        return _counts(decoded["delivered"])
    if kind == "session_answer":
        return wire.SessionAnswer(
            session_id=bytes.fromhex(decoded["session_id"]),
            resumed=decoded["resumed"],
            reason=decoded["reason"],
            delivered=_counts(decoded["delivered"]),
        )
    return wire.SessionRequest(
        session_id=bytes.fromhex(decoded["session_id"]),
        resume=decoded["resume"],
        delivered=_counts(decoded["delivered"]),
    )


DECODE = {
    "ack": wire.decode_ack,
    "session_answer": wire.decode_session_answer,
    "session_request": wire.decode_session_request,
}
ENCODE = {
    "ack": wire.encode_ack,
    "session_answer": wire.encode_session_answer,
    "session_request": wire.encode_session_request,
}

PACKETS = _of_kind(RESUME["valid"], "ack", "session_answer")
REQUESTS = _of_kind(RESUME["valid"], "session_request")


def _event(vector):
    """The event an open Connection reports for a valid ack or session answer packet."""
    value = _value(vector["kind"], vector["decoded"])
    return AckReceived(delivered=value) if vector["kind"] == "ack" else SessionAnswered(answer=value)


def test_vector_file_is_well_formed():
    """resume.json is consistent: unique names, every kind valid and invalid, coherent rejected_by layers."""
    for vectors in (RESUME["valid"], RESUME["invalid"], RESUME["ack_checks"]):
        names = _ids(vectors)
        assert len(names) == len(set(names)), "vector names must be unique"
    for kind in ("ack", "session_answer", "session_request"):
        assert _of_kind(RESUME["valid"], kind), f"no valid {kind} vector"
        assert _of_kind(RESUME["invalid"], kind), f"no invalid {kind} vector"
    for v in RESUME["invalid"]:
        layers = set(v["rejected_by"])
        assert layers and layers <= LAYERS, v["name"]
        assert ("fails_at" in v) == ("stream" in layers), v["name"]
        assert "stream" not in layers or "connection" in layers, v["name"]
        assert ("switch" in layers) == (v["kind"] == "session_request"), v["name"]
    for v in REQUESTS:  # field_hex is tag 01 | ByteSlice(hex)
        value = expand(v["hex"])
        assert expand(v["field_hex"]) == bytes([wire.HelloTag.SESSION]) + wire.encode_uvarint(len(value)) + value


# -- valid ack and session answer packets ------------------------------------------------


@pytest.mark.parametrize("vector", PACKETS, ids=_ids(PACKETS))
def test_packet_vector_decodes_to_its_values(vector):
    """Each valid ack or session answer vector decodes to the values the file gives."""
    kind, body = wire.decode_packet(expand(vector["hex"]))
    assert kind == PACKET_TYPE[vector["kind"]]
    assert DECODE[vector["kind"]](body) == _value(vector["kind"], vector["decoded"])


@pytest.mark.parametrize("vector", PACKETS, ids=_ids(PACKETS))
def test_packet_vector_is_what_the_encoder_builds(vector):
    """Encoding a vector's values gives its canonical bytes."""
    value = _value(vector["kind"], vector["decoded"])
    built = wire.encode_extension(PACKET_TYPE[vector["kind"]], ENCODE[vector["kind"]](value))
    assert built.hex(" ") == expand(vector.get("canonical_hex", vector["hex"])).hex(" ")


@pytest.mark.parametrize("vector", PACKETS, ids=_ids(PACKETS))
def test_packet_vector_through_frame_buffer(vector):
    """Each valid packet vector comes out of the FrameBuffer, fed whole or byte by byte."""
    data = expand(vector["hex"])
    _, body = wire.decode_packet(data)
    expected = [(PACKET_TYPE[vector["kind"]], body)]

    check_frames(LIMITS, data, expected)


def test_packet_vectors_concatenated_through_frame_buffer():
    """All valid packet vectors back to back come out of the FrameBuffer one by one."""
    data = b"".join(expand(v["hex"]) for v in PACKETS)
    expected = [(PACKET_TYPE[v["kind"]], wire.decode_packet(expand(v["hex"]))[1]) for v in PACKETS]
    check_frames(LIMITS, data, expected)


@pytest.mark.parametrize("vector", PACKETS, ids=_ids(PACKETS))
def test_packet_vector_through_an_open_connection(vector):
    """An open Connection turns each valid vector, whole or byte by byte, into its one event and sends nothing."""
    data = expand(vector["hex"])
    conn = open_connection(channels=OPEN_CHANNELS)
    assert conn.receive_data(data, 1.0) == [_event(vector)]
    assert conn.error is None

    conn = open_connection(channels=OPEN_CHANNELS)
    events = []
    for i in range(len(data)):
        events += conn.receive_data(data[i : i + 1], 1.0)
    assert events == [_event(vector)]
    assert conn.error is None
    assert conn.data_to_send(1.0) == b""  # nothing is answered at the connection layer


def test_ack_example_of_the_wire_spec_is_the_first_vector():
    """specs/wire.md section 3.4 quotes the first ack vector."""
    assert expand(PACKETS[0]["hex"]).hex(" ") == "06 01 09 01 02 20 01 05 21 02 01 2c"


# -- valid session requests (hello field 01) --------------------------------------------


@pytest.mark.parametrize("vector", REQUESTS, ids=_ids(REQUESTS))
def test_session_request_vector_decodes_and_encodes(vector):
    """Each session request vector decodes to its values and encodes back to its bytes."""
    value = _value("session_request", vector["decoded"])
    assert wire.decode_session_request(expand(vector["hex"])) == value
    assert wire.encode_session_request(value).hex(" ") == expand(vector["hex"]).hex(" ")


@pytest.mark.parametrize("vector", REQUESTS, ids=_ids(REQUESTS))
def test_session_request_vector_is_a_hello_field(vector):
    """Appended to a hello's fields, the value comes back as field (01, value), bytes as in
    field_hex."""
    hello = wire.decode_hello(expand(load_vectors("hello")["valid"][0]["hex"]))
    assert hello.fields == ()
    with_field = wire.Hello(**{**_fields(hello), "fields": ((wire.HelloTag.SESSION, expand(vector["hex"])),)})
    body = wire.encode_hello(with_field)
    assert body == wire.encode_hello(hello) + expand(vector["field_hex"])
    assert wire.decode_hello(body).fields == ((wire.HelloTag.SESSION, expand(vector["hex"])),)


@pytest.mark.parametrize("vector", [v for v in REQUESTS if "hello_packet_hex" in v])
def test_hello_packet_with_a_session_request_opens_a_connection(vector):
    """Whole and byte by byte: the hello is accepted and carries the request as field 01."""
    packet = expand(vector["hello_packet_hex"])
    expected_field = (wire.HelloTag.SESSION, expand(vector["hex"]))
    kind, body = wire.decode_packet(packet)
    assert kind == PacketType.HELLO and wire.decode_hello(body).fields == (expected_field,)
    assert feed_bytewise(vector_frame_buffer(LIMITS), packet) == ([(PacketType.HELLO, body)], None, None)
    for chunks in ([packet], [packet[i : i + 1] for i in range(len(packet))]):
        conn = make_connection()
        events = []
        for chunk in chunks:
            events += conn.receive_data(chunk, 0.5)
        [event] = events
        assert isinstance(event, HelloReceived) and event.hello.fields == (expected_field,)
        assert wire.decode_session_request(event.hello.fields[0][1]) == _value("session_request", vector["decoded"])


def _fields(hello: wire.Hello) -> dict:
    return {name: getattr(hello, name) for name in hello.__dataclass_fields__}


# -- invalid vectors -----------------------------------------------------------------------

INVALID = RESUME["invalid"]
INVALID_PACKETS = _of_kind(INVALID, "ack", "session_answer")


@pytest.mark.parametrize("vector", INVALID, ids=_ids(INVALID))
def test_invalid_vector_with_its_body_decoder(vector):
    """The body decoder refuses exactly the invalid vectors naming decode_body, with the named error."""
    data = expand(vector["hex"])
    decode = DECODE[vector["kind"]]
    if vector["kind"] != "session_request":
        try:
            _, data = wire.decode_packet(data)
        except errors.MalformedPacket:
            assert "decode_body" not in vector["rejected_by"], "a body vector must be a whole packet"
            return
    if "decode_body" in vector["rejected_by"]:
        with pytest.raises(errors.MalformedPacket) as caught:
            decode(data)
        assert type(caught.value) is getattr(errors, vector["error"])
    else:
        decode(data)


@pytest.mark.parametrize("vector", INVALID_PACKETS, ids=_ids(INVALID_PACKETS))
def test_invalid_vector_with_decode_packet(vector):
    """decode_packet refuses exactly the invalid vectors naming it, and reads the others."""
    data = expand(vector["hex"])
    if "decode_packet" in vector["rejected_by"]:
        with pytest.raises(errors.MalformedPacket):  # every failure, whatever the vector's error
            wire.decode_packet(data)
    else:
        assert wire.decode_packet(data)[0] == PACKET_TYPE[vector["kind"]]


@pytest.mark.parametrize("vector", INVALID_PACKETS, ids=_ids(INVALID_PACKETS))
def test_invalid_vector_with_frame_buffer(vector):
    """The FrameBuffer refuses just the vectors naming stream, with the named error at the named byte."""
    check_invalid_frames(LIMITS, vector, getattr(errors, vector["error"]))


@pytest.mark.parametrize("vector", INVALID_PACKETS, ids=_ids(INVALID_PACKETS))
def test_invalid_vector_with_a_connection(vector):
    """An open Connection fails on exactly the vectors naming it, sending a close with the error's name."""
    data = expand(vector["hex"])
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        conn = open_connection(channels=OPEN_CHANNELS)
        events = []
        for chunk in chunks:
            events += conn.receive_data(chunk, 1.0)
        if "connection" in vector["rejected_by"]:
            assert [type(e) for e in events] == [ConnectionFailed]
            assert type(events[0].error) is getattr(errors, vector["error"])
            assert conn.error is events[0].error
            # The close packet that goes out names the error class (specs/wire.md section 3.2).
            kind, body = wire.decode_packet(conn.data_to_send(1.0))
            assert kind == PacketType.CLOSE and wire.decode_close(body)[0] == vector["error"]
        else:
            assert events == [] and conn.error is None


# -- what the receiver of an ack checks -------------------------------------------------


@pytest.mark.parametrize("case", RESUME["ack_checks"], ids=_ids(RESUME["ack_checks"]))
def test_ack_check(case):
    """Each ack check leaves the acked and undelivered counts it gives, or raises its AckError."""
    session = Session(
        b"\x01" * 16, case["channels"], recovery_buffer_bytes=1 << 20, ack_every_messages=1, ack_every_bytes=1 << 20
    )
    for channel_id, count in _counts(case["accepted"]).items():
        for i in range(count):
            session.record_sent(channel_id, b"m%d" % i)
    session.on_ack(_counts(case["acked"]))
    ack = _counts(case["ack"])
    if case["error"] is None:
        session.on_ack(ack)
        assert {c: session.acked(c) for c in case["channels"]} == _counts(case["acked_after"])
        assert session.unconfirmed() == _counts(case["undelivered_after"])
    else:
        assert case["error"] == AckError.__name__
        with pytest.raises(AckError, match=re.escape(case["message"])):
            session.on_ack(ack)
        assert issubclass(AckError, errors.RemoteProtocolError)  # the connection is dropped
