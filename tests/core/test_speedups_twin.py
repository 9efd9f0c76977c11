"""The compiled twin (mconn/core/_speedups.pyx) does what the pure functions do, exactly.

``frame_buffer.decode_packets`` and ``channel.msg_header`` are the reference; the
extension's functions of the same names must give the same bytes, the same packets (of
the same types: bytes or memoryview), the same positions, pause and streaming state, and
the same errors (type and message), on valid streams cut anywhere and on malformed bytes.
Both are called directly, so these run whatever MCONN_PURE says; they are skipped only
when the extension is not built (``make`` builds it; CI runs them).
"""

from __future__ import annotations

import importlib
import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import channel, frame_buffer, speedups, wire, wire_primitives
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.wire import PacketType
from tests.core.test_codec_equivalence import any_packets, malformed_bytes, run_streams

try:
    compiled = importlib.import_module("mconn.core._speedups")
except ImportError as e:  # pragma: no cover - the build skipped it
    pytest.skip(f"the compiled twin mconn.core._speedups is not built ({e}); `make` builds it", allow_module_level=True)

TWIN = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UNLIMITED = 1 << 64


def _shape(value):
    """A comparable form of decoder output that keeps bytes and memoryview apart."""
    if type(value) is memoryview:
        return ("view", bytes(value))
    if type(value) in (list, tuple):
        return (type(value).__name__, [_shape(v) for v in value])
    if isinstance(value, Exception):
        return ("error", type(value).__name__, str(value))
    return value


def test_the_twin_is_current_and_its_constants_are_the_wire_constants():
    assert compiled.INTERFACE == speedups.INTERFACE
    assert (compiled.PING, compiled.PONG, compiled.MSG) == (PacketType.PING, PacketType.PONG, PacketType.MSG)
    assert compiled.FIRST_EXTENSION_TYPE == wire.FIRST_EXTENSION_TYPE
    assert compiled.MAX_UVARINT_SIZE == wire_primitives.MAX_UVARINT_SIZE
    assert compiled.RUN == frame_buffer.RUN
    assert compiled.KEEP_VIEW_MIN == channel.KEEP_VIEW_MIN


@st.composite
def decoder_calls(draw, data):
    """The arguments FrameBuffer passes decode_packets, drawn around ``data``."""
    max_payload = draw(st.sampled_from([1, 2, 7, 16, 255, 256, 1024, 65536, UNLIMITED]))
    size = (max_payload.bit_length() + 7) // 8
    full_tail = bytes((0, size)) + max_payload.to_bytes(size, "big")
    pos = draw(st.integers(0, len(data)))
    stop = draw(st.integers(pos, len(data)))
    return (
        data,
        pos,
        stop,
        draw(st.booleans()),  # stop_after_extension
        draw(st.integers(0, 10)),  # base
        max_payload,
        full_tail,
        draw(st.sampled_from([-1, 0, 1, 4, 4096])),  # stream_min
        draw(st.sampled_from([{}, {PacketType.HELLO: 3, PacketType.ACK: UNLIMITED, 0x90: 0}])),
        draw(st.sampled_from([0, 2, 12, 1024, UNLIMITED])),  # default_extension_limit
    )


def _full_packets(draw, max_payload: int) -> bytes:
    """Valid msg packets with full, not-last ones among them (the run path)."""
    out = b""
    for _ in range(draw(st.integers(1, 6))):
        ch = draw(st.sampled_from([0x10, 0x11]))
        if draw(st.booleans()):
            out += channel.msg_header(ch, False, max_payload) + draw(
                st.binary(min_size=max_payload, max_size=max_payload)
            )
        else:
            body = draw(st.binary(max_size=max_payload))
            out += channel.msg_header(ch, draw(st.booleans()), len(body)) + body
    return out


@st.composite
def streams(draw):
    kind = draw(st.sampled_from(["packets", "malformed", "full", "runs", "broken runs"]))
    if kind == "packets":
        return b"".join(draw(st.lists(any_packets(max_data=40), max_size=6)))
    if kind == "malformed":
        return draw(malformed_bytes())
    if kind == "full":
        return _full_packets(draw, draw(st.sampled_from([1, 7, 16])))
    return draw(run_streams(broken=kind == "broken runs"))


@TWIN
@given(st.data())
def test_decode_packets_twin_on_valid_and_malformed_bytes(data):
    """The same packets, position, pause, streaming state and error, argument for argument."""
    stream = data.draw(streams())
    args = data.draw(decoder_calls(stream))
    assert _shape(compiled.decode_packets(*args)) == _shape(frame_buffer.decode_packets(*args))


def _run_buffer(stream, cuts, max_payload, stream_payloads, splice, decode):
    """Feed ``stream`` cut at ``cuts`` through a FrameBuffer that decodes with ``decode``;
    everything it said, in order, and its state after each feed."""
    with mock.patch.object(frame_buffer, "_decode_packets", decode):
        buffer = FrameBuffer(
            max_payload=max_payload,
            default_extension_limit=24,
            extension_limits={PacketType.HELLO: 64},
            stream_payloads=stream_payloads,
        )
        buffer.SPLICE_MIN = splice
        buffer.STREAM_MIN = 8
        said = []
        points = sorted({c % (len(stream) + 1) for c in cuts})
        bounds = [0, *points, len(stream)]
        for a, b in itertools.pairwise(bounds):
            packets, error = buffer.feed(stream[a:b])
            said.append((_shape(packets), _shape(error), buffer.paused, buffer.buffered))
            while error is None and buffer.paused:
                packets, error = buffer.feed(b"")
                said.append((_shape(packets), _shape(error), buffer.paused, buffer.buffered))
            if error is not None:
                break
        return said


@TWIN
@given(
    st.data(),
    st.lists(st.integers(0, 400), max_size=6),
    st.sampled_from([7, 16, 64]),
    st.booleans(),
    st.sampled_from([0, 4096]),
)
def test_frame_buffer_twin_on_streams_cut_anywhere(data, cuts, max_payload, stream_payloads, splice):
    """A FrameBuffer on the twin says what one on the reference says, feed for feed
    (spliced tails, streamed payloads and pauses after extensions included)."""
    kind = data.draw(st.sampled_from(["packets", "malformed", "full"]))
    if kind == "full":
        stream = _full_packets(data.draw, max_payload) * data.draw(st.integers(1, 3))
    elif kind == "packets":
        stream = b"".join(data.draw(st.lists(any_packets(max_data=80), max_size=8)))
    else:
        stream = data.draw(malformed_bytes())
    pure = _run_buffer(stream, cuts, max_payload, stream_payloads, splice, frame_buffer.decode_packets)
    twin = _run_buffer(stream, cuts, max_payload, stream_payloads, splice, compiled.decode_packets)
    assert twin == pure


@TWIN
@given(
    run_streams(broken=False) | run_streams(broken=True),
    st.lists(st.integers(0, 30000), max_size=6),
    st.sampled_from([24, 4096, 4097, 65536]),
    st.booleans(),
    st.sampled_from([0, 4096]),
)
def test_frame_buffer_twin_on_runs_cut_anywhere(stream, cuts, max_payload, stream_payloads, splice):
    """Streams of mixed small and large not-last packets of several channels, eof in the
    middle, pings between, bad bytes after a run, cut anywhere: the twin's FrameBuffer
    says what the reference's says, feed for feed (the same pieces, copies and views)."""
    pure = _run_buffer(stream, cuts, max_payload, stream_payloads, splice, frame_buffer.decode_packets)
    twin = _run_buffer(stream, cuts, max_payload, stream_payloads, splice, compiled.decode_packets)
    assert twin == pure


@TWIN
@given(st.integers(0, 255), st.booleans(), st.integers(0, (1 << 63) - 1) | st.integers(0, 70000))
def test_msg_header_twin(channel_id, eof, length):
    expected = channel.msg_header.__wrapped__(channel_id, eof, length)
    got = compiled.msg_header(channel_id, eof, length)
    assert type(got) is bytes and got == expected


def test_the_twin_is_what_the_frame_buffer_uses_unless_mconn_pure():
    """With the extension built and MCONN_PURE unset, FrameBuffer decodes with the twin;
    with MCONN_PURE=1 (the second run of tests/core in `make test`), with the reference."""
    if speedups.SPEEDUPS is None:
        assert speedups.IMPLEMENTATION == "pure Python"
        assert frame_buffer._decode_packets is frame_buffer.decode_packets
    else:
        assert speedups.IMPLEMENTATION == "accelerated"
        assert frame_buffer._decode_packets is compiled.decode_packets


@TWIN
@given(
    st.sampled_from([b"\x03\x10\x00", b"\x03\x10\x01", b"\x05"]),
    st.integers(1 << 63, (1 << 64) - 1) | st.integers((1 << 64) - 64, (1 << 64) - 1),
    st.binary(max_size=20),
    st.sampled_from([-1, 0, 4096]),
)
def test_decode_packets_twin_on_lengths_past_a_signed_c_integer(head, length, rest, stream_min):
    """A declared length of 2**63 or more under unlimited limits is "not all here" (or a
    streamed payload's start), as in the reference: it must not wrap a C sum and read
    before the buffer."""
    data = head + b"\x08" + length.to_bytes(8, "big") + rest
    full_tail = b"\x00\x09\x01" + bytes(8)
    args = (data, 0, len(data), False, 0, UNLIMITED, full_tail, stream_min, {}, UNLIMITED)
    assert _shape(compiled.decode_packets(*args)) == _shape(frame_buffer.decode_packets(*args))
