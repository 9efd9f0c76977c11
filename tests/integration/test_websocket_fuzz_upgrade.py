"""Fuzzing the WebSocket upgrade of a ws listener with hypothesis (specs/websocket.md 4, 6.1).

Upgrade requests, valid and mutated (headers added from a list of the interesting ones:
X-Forwarded-For forms, Origin, bytes that other parsers take for line breaks; then bytes
flipped, inserted, deleted, cut, repeated), followed sometimes by WebSocket frames, in
arbitrary chunks at arbitrary times, from a stranger or a trusted proxy, over IPv4 or
IPv6 (the target and its checks: tests/fuzz/upgrade_target.py). For every input:

* nothing escapes ``dataReceived`` or a timer, and nothing is logged as a failure;
* whatever the listener writes is an HTTP answer, 101 or 4xx/5xx;
* the admission counts agree with the live connections after every step;
* once every timer has run out the listener has closed the connection, and once it is
  gone no pending handshake and no address is counted.

tests/fuzz/fuzz_upgrade.py runs the same target under atheris for long runs. The example
count keeps this file under 15 s on a loaded CI machine.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.strategies import mutated
from tests.fuzz.upgrade_target import WAITS, request, run, schedule_from_bytes, seeds

HEADERS = [
    b"X-Forwarded-For: 203.0.113.7\r\n",
    b"X-Forwarded-For: 198.51.100.1, 2001:db8::7\r\n",
    b"X-Forwarded-For: 203.0.113.7:80\r\n",
    b"X-Forwarded-For: \r\n",
    b"X-Note: a\x85X-Forwarded-For: 203.0.113.66\r\n",
    b"X-Note: a\x0bb\r\n",
    b" folded: x\r\n",
    b"Origin: https://ok.example\r\n",
    b"Origin: http://evil.example\r\n",
    b"Origin: null\r\n",
    b"Host: other\r\n",
    b"Sec-WebSocket-Protocol: other\r\n",
    b"Sec-WebSocket-Extensions: permessage-deflate\r\n",
]
#: A client's frames after the upgrade: a small binary one (the start of an mconn hello's
#: header), a ping, a close, a text frame, one whose header claims 4 GiB.
FRAMES = [
    bytes([0x82, 0x84]) + b"\0\0\0\0" + b"\x06\x01\x00\x00",
    bytes([0x89, 0x80]) + b"\0\0\0\0",
    bytes([0x88, 0x82]) + b"\0\0\0\0" + b"\x03\xe8",
    bytes([0x81, 0x81]) + b"\0\0\0\0" + b"x",
    bytes([0x82, 0xFF]) + (1 << 32).to_bytes(8, "big") + b"\0\0\0\0",
]


@st.composite
def requests(draw) -> bytes:
    path = draw(st.sampled_from(["/mconn", "/mconn", "/other", "/mconn?x=1", "/mconn#f"]))
    headers = b"".join(draw(st.lists(st.sampled_from(HEADERS), max_size=3)))
    frames = b"".join(draw(st.lists(st.sampled_from(FRAMES), max_size=3)))
    return request(path, headers) + frames


streams = st.one_of(
    st.binary(max_size=300), requests(), mutated(requests()), st.sampled_from(seeds()).map(lambda s: s[2:])
)


@st.composite
def schedules(draw):
    data = draw(streams)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=5)))
    bounds = [0, *cuts, len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    waits = draw(st.lists(st.sampled_from(WAITS), min_size=len(chunks), max_size=len(chunks)))
    return list(zip(chunks, waits, strict=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=st.integers(0, 7), schedule=schedules())
def test_any_bytes_at_a_ws_listener_end_in_an_answer_or_a_close_and_leave_nothing_counted(world, schedule):
    """Any upgrade bytes, from a stranger or a trusted proxy, over IPv4 or IPv6: an HTTP answer
    (101 or 4xx/5xx) or a close, never an exception, never a connection left open, and every
    admission count back to zero once it is gone."""
    run(world, schedule)


def test_every_seed_passes_fed_whole_and_one_byte_at_a_time():
    """The seed corpus (valid upgrades and the attacks of specs/websocket.md 4 and 6.1), each
    world, whole and byte by byte: the same first answer line."""
    for seed in seeds():
        world, whole = schedule_from_bytes(seed)
        first = run(world, whole).transport.value().split(b"\r\n", 1)[0]
        stream = seed[2:]
        byte_by_byte = run(world, [(stream[i : i + 1], 0.0) for i in range(len(stream))])
        assert byte_by_byte.transport.value().split(b"\r\n", 1)[0] == first, seed
