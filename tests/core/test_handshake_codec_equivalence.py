"""The handshake's hand-written codecs are the construct declarations.

``wire.decode_hello`` reads a hello by hand (``_hello_parts``), and falls back to
``HelloBody`` for anything it does not take; ``decode_session_request`` and
``encode_session_answer`` likewise. These properties say the hand-written readers and
writer agree with the declarations (specs/handshake.md section 2, specs/resume.md
section 2), on valid and on malformed bytes, so the errors a peer gets stay the
declaration's.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import wire
from mconn.errors import MalformedPacket
from tests.helpers_core import edited

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

counts = st.dictionaries(st.integers(0, 255), st.integers(0, (1 << 64) - 1), max_size=4)


@st.composite
def hellos(draw) -> bytes:
    """A hello body built with the declaration, from random parts."""
    hello = wire.Hello(
        version=draw(st.integers(0, 1 << 40)),
        node_id=draw(st.binary(min_size=20, max_size=20)).hex(),
        max_packet_payload=draw(st.integers(0, 1 << 40)),
        channels=tuple(
            wire.ChannelInfo(
                id=i, priority=draw(st.integers(0, 300)), recv_message_capacity=draw(st.integers(0, 1 << 30))
            )
            for i in draw(st.lists(st.integers(0, 255), max_size=5))
        ),
        listen_address=draw(st.text(max_size=12)),
        fields=tuple(draw(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=12)), max_size=3))),
    )
    return wire.encode_hello(hello)


@st.composite
def mutated(draw, valid) -> bytes:
    """A valid body with a few bytes set, cut off, inserted, or a length made non-minimal."""
    return draw(edited(draw(valid), (1, 3), [0, 1, 2, 8, 9, 0x14, 0x7F, 0x80, 0xC3, 0xFF]))


def _declared(parse, body):
    """What a declaration-based decoder returns, or the (type, message) it raises."""
    try:
        return parse(body)
    except MalformedPacket as e:
        return (type(e), str(e))


@FAST
@given(body=st.one_of(hellos(), mutated(hellos()), st.binary(max_size=60)))
def test_hello_read_by_hand_is_the_declaration(body):
    """Where the hand-written reader takes a body, it reads what HelloBody reads; every
    body HelloBody refuses it leaves to HelloBody (so decode_hello raises its error)."""
    fast = wire._hello_parts(body)
    declared = _declared(wire.hello_parts_declared, body)
    if fast is not None:
        assert fast == declared
    else:
        assert declared[0] is MalformedPacket or len(declared[3]) > wire.MAX_CHANNELS


def test_a_hello_the_reader_leaves_gets_the_declarations_error():
    """A cut hello is refused with HelloBody's message, naming the hello and its size."""
    body = wire.encode_hello(wire.Hello(version=1, node_id="ab" * 20, max_packet_payload=1024, channels=()))
    assert wire._hello_parts(body[:-1]) is None
    with pytest.raises(MalformedPacket, match=rf"malformed hello \({len(body) - 1} bytes\)"):
        wire.decode_hello(body[:-1])


@st.composite
def session_requests(draw) -> bytes:
    return wire.encode_session_request(
        wire.SessionRequest(
            session_id=draw(st.binary(min_size=16, max_size=16)), resume=draw(st.booleans()), delivered=draw(counts)
        )
    )


def _request_declared(value):
    c = wire._parse(wire.SessionRequestBody, value, "session request")
    return wire.SessionRequest(session_id=c.session_id, resume=c.resume, delivered=wire._counts(c.delivered))


@FAST
@given(value=st.one_of(session_requests(), mutated(session_requests()), st.binary(max_size=40)))
def test_session_request_read_by_hand_is_the_declaration(value):
    """decode_session_request returns what SessionRequestBody parses, or raises its error
    (a count listed twice included)."""
    assert _declared(wire.decode_session_request, value) == _declared(_request_declared, value)


@FAST
@given(
    session_id=st.binary(min_size=16, max_size=16),
    resumed=st.booleans(),
    reason=st.text(max_size=20),
    delivered=counts,
)
def test_session_answer_written_by_hand_is_the_declaration(session_id, resumed, reason, delivered):
    """encode_session_answer's bytes are SessionAnswerBody's, and decode back to the answer."""
    answer = wire.SessionAnswer(session_id=session_id, resumed=resumed, reason=reason, delivered=delivered)
    body = wire.encode_session_answer(answer)
    assert body == wire.SessionAnswerBody.build(
        dict(session_id=session_id, resumed=resumed, reason=reason, delivered=wire._count_list(delivered))
    )
    assert wire.decode_session_answer(body) == answer


@pytest.mark.parametrize("session_id", [b"short", bytes(17)])
def test_an_answer_the_writer_cannot_take_gets_the_declarations_error(session_id):
    """A session id of the wrong size is left to SessionAnswerBody, which refuses it."""
    answer = wire.SessionAnswer(session_id=session_id, resumed=False)
    with pytest.raises(Exception) as hand:
        wire.encode_session_answer(answer)
    with pytest.raises(Exception) as declared:
        wire.SessionAnswerBody.build(dict(session_id=session_id, resumed=False, reason="", delivered=[]))
    assert type(hand.value) is type(declared.value) and str(hand.value) == str(declared.value)


@pytest.mark.parametrize("tweak", ["resume 02", "count twice", "trailing byte"])
def test_session_requests_the_reader_refuses_get_the_declarations_error(tweak):
    """A resume byte other than 00/01, a channel counted twice and a trailing byte are
    refused exactly as SessionRequestBody (and _counts) refuse them."""
    value = bytearray(bytes(16) + b"\x01" + b"\x01\x02" + b"\x20\x01\x05" + b"\x20\x01\x06")  # 0x20 twice
    if tweak == "resume 02":
        value[16] = 2
        del value[17:]
        value += b"\x00"
    elif tweak == "trailing byte":
        value = bytearray(bytes(16) + b"\x00\x00\x00")
    declared = _declared(_request_declared, bytes(value))
    assert declared[0] is MalformedPacket
    assert _declared(wire.decode_session_request, bytes(value)) == declared
