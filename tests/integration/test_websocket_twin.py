"""The compiled twin of the WebSocket copies (mconn/net/_wsframe.pyx) does what the pure
functions of mconn.net.websocket_frames do, exactly.

``binary_frames``, ``binary_frames_of``, ``unmasked_payloads`` and ``FrameReader`` are the reference; the
extension's of the same names must give the same bytes, stops and reader state, and raise
the same errors (type and message), on valid and malformed frames cut anywhere.
Both are called directly, so these run whatever MCONN_PURE says; they are skipped only
when the extension is not built (``make`` builds it).
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.net import websocket_frames
from mconn.net.websocket_frames import FrameReader, binary_frames, binary_frames_of, unmasked_payloads
from tests.integration.test_websocket_frames import frame

try:
    compiled = importlib.import_module("mconn.net._wsframe")
except ImportError as e:  # pragma: no cover - the build skipped it
    pytest.skip(f"the compiled twin mconn.net._wsframe is not built ({e}); `make` builds it", allow_module_level=True)

TWIN = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _outcome(function, *args, **kwargs):
    """What a call gives: its value, or its error's type and message."""
    try:
        return ("value", function(*args, **kwargs))
    except Exception as e:
        return ("error", type(e).__name__, str(e))


class _Keys:
    """Masking keys from a seed: the same bytes for the twin and the reference."""

    def __init__(self, seed: int, short: int = 0) -> None:
        self.seed, self.short = seed, short

    def __call__(self, n: int) -> bytes:
        return random.Random(self.seed).randbytes(max(0, n - self.short))


def test_the_twin_is_current():
    assert compiled.INTERFACE == websocket_frames.WSFRAME_INTERFACE


@TWIN
@given(
    st.one_of(st.integers(0, 300), st.sampled_from([125, 126, 127, 65535, 65536, 65537, 140_000])),
    st.one_of(st.sampled_from([1, 3, 4, 125, 126, 127, 65535, 65536, 65537, 2**62, 2**63 - 1]), st.integers(1, 70_000)),
    st.booleans(),
    st.integers(0, 2**32),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_binary_frames_are_byte_identical(n, limit, masked, seed, kind):
    """Every length encoding (7, 16, 64 bits), frames split at any limit, masked or not,
    from bytes, a bytearray or a memoryview: the same bytes, as bytes."""
    data = kind(random.Random(seed).randbytes(n))  # drawn outside hypothesis: its buffer refuses large data
    keys = _Keys(seed) if masked else None
    want = binary_frames(data, limit=limit, keys=keys)
    got = compiled.binary_frames(data, limit=limit, keys=keys)
    assert type(got) is bytes and got == want


@pytest.mark.parametrize("limit", [0, -1, -(2**40)])
def test_a_limit_below_one_byte_is_the_same_error(limit):
    assert _outcome(compiled.binary_frames, b"abc", limit=limit) == _outcome(binary_frames, b"abc", limit=limit)
    assert _outcome(compiled.binary_frames, b"abc", limit=limit)[0] == "error"


@pytest.mark.parametrize("n, limit, short", [(10, 4, 1), (10, 4, 12), (0, 4, 4), (70_000, 65536, 3)])
def test_keys_of_the_wrong_length_are_the_same_error(n, limit, short):
    """keys(4 * count) must give 4 bytes a frame: fewer is refused before anything is
    masked (the compiled twin must not read past them)."""
    data = bytes(n)
    want = _outcome(binary_frames, data, limit=limit, keys=_Keys(1, short))
    assert want[0] == "error" and "4 are needed for each of" in want[2]
    assert _outcome(compiled.binary_frames, data, limit=limit, keys=_Keys(1, short)) == want
    too_many = _outcome(binary_frames, data, limit=limit, keys=_Keys(1, -4))
    assert too_many[0] == "error"
    assert _outcome(compiled.binary_frames, data, limit=limit, keys=_Keys(1, -4)) == too_many


@TWIN
@given(
    st.lists(st.one_of(st.integers(0, 300), st.sampled_from([0, 40, 65535, 65536, 65537, 140_000])), max_size=8),
    st.one_of(st.sampled_from([1, 3, 4, 125, 126, 65535, 65536, 2**63 - 1]), st.integers(1, 70_000)),
    st.booleans(),
    st.integers(0, 2**32),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_frames_of_parts_are_the_frames_of_the_parts_joined(sizes, limit, masked, seed, kind):
    """A bulk write's buffers (packet headers, payload views, empty ones too), framed
    unjoined by the twin: the same bytes as the reference's frames of them joined, frames
    crossing parts anywhere, masked or not."""
    rng = random.Random(seed)
    parts = [kind(rng.randbytes(n)) for n in sizes]
    keys = _Keys(seed) if masked else None
    want = binary_frames_of(parts, limit=limit, keys=keys)
    assert want == binary_frames(b"".join(parts), limit=limit, keys=keys)
    got = compiled.binary_frames_of(parts, limit=limit, keys=keys)
    assert type(got) is bytes and got == want


@pytest.mark.parametrize(
    "parts, limit, short", [([b"ab", b"", b"cdefgh"], 4, 1), ([b"x" * 70_000], 65536, 3), ([], 4, 4)]
)
def test_frames_of_parts_refuse_what_binary_frames_refuses(parts, limit, short):
    """Keys of the wrong length, a limit below one byte, a part that is not a buffer:
    the same error from both."""
    for kwargs in ({"keys": _Keys(1, short)}, {"keys": _Keys(1, -4)}, {"limit": 0}):
        call = {"limit": limit, **kwargs}
        want = _outcome(binary_frames_of, parts, **call)
        assert want[0] == "error"
        assert _outcome(compiled.binary_frames_of, parts, **call) == want
    assert _outcome(compiled.binary_frames_of, [b"a", "text"], limit=4)[0] == "error"


@st.composite
def regions(draw, n: int):
    """Regions of ``n`` bytes as a FrameReader makes them, in order, and sometimes one
    that is not (outside the data, a key not 4 bytes long)."""
    points = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=8)))
    out = []
    for start, end in zip(points[::2], points[1::2], strict=False):  # an odd last point starts no region
        key = draw(st.one_of(st.none(), st.binary(min_size=4, max_size=4)))
        out.append((start, end, key, draw(st.integers(0, 70_000))))
    if draw(st.integers(0, 4)) == 0:
        start = draw(st.integers(-3, n + 3))
        bad = draw(
            st.sampled_from(
                [
                    (start, start - 1, None, 0),
                    (-1, 2, b"abcd", 0),
                    (0, n + 1, None, 0),
                    (0, min(n, 4), b"abc", 0),
                    (0, 0, b"abcde", 1),
                ]
            )
        )
        out.insert(draw(st.integers(0, len(out))), bad)
    return out


@TWIN
@given(st.data(), st.one_of(st.integers(0, 300), st.sampled_from([65536, 140_000])), st.integers(0, 2**32))
def test_unmasked_payloads_are_byte_identical_and_refuse_the_same_regions(data, n, seed):
    """Any regions, masked with any key from any phase, or not: the same bytes, one bytes
    object; a region outside the read or a key not 4 bytes: the same error."""
    read = random.Random(seed).randbytes(n)
    chosen = data.draw(regions(n))
    want = _outcome(unmasked_payloads, read, chosen)
    got = _outcome(compiled.unmasked_payloads, read, chosen)
    assert got == want
    if want[0] == "value":
        assert [type(p) for p in got[1]] == [type(p) for p in want[1]]


@st.composite
def frame_streams(draw):
    """Valid frames (binary, continuation, control) and malformed ones (reserved bits,
    unknown opcodes, the wrong masking, control frames too long or fragmented, frames
    over the limit), masked or not, and sometimes plain random bytes."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    masked = draw(st.booleans())
    if draw(st.integers(0, 6)) == 0:
        return masked, rnd.randbytes(draw(st.integers(0, 400)))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["binary", "binary", "fragment", "control", "bad_rsv", "opcode", "mask", "long"]))
        n = draw(st.one_of(st.integers(0, 200), st.sampled_from([125, 126, 65536, 70_000])))
        payload = rnd.randbytes(n)
        if kind == "binary":
            out.append(frame(0x2, payload, masked=masked))
        elif kind == "fragment":
            out.append(frame(0x2, payload, masked=masked, fin=False) + frame(0x0, payload[:50], masked=masked))
        elif kind == "control":
            out.append(frame(draw(st.sampled_from([0x8, 0x9, 0xA])), payload[:130], masked=masked))
        elif kind == "bad_rsv":
            out.append(frame(0x2, payload, masked=masked, rsv=draw(st.sampled_from([0x10, 0x20, 0x40]))))
        elif kind == "opcode":
            out.append(frame(draw(st.sampled_from([0x1, 0x3, 0x7, 0xB, 0xF])), payload[:200], masked=masked))
        elif kind == "mask":
            out.append(frame(0x2, payload, masked=not masked))
        else:
            out.append(frame(0x2, b"", masked=masked, length=draw(st.sampled_from([70_000, 2**40, 2**63]))))
    return masked, b"".join(out)


def _read_through(reader: FrameReader, parts) -> list:
    """Every turn of the reader over ``parts``, as the carrier drives it: what each read
    gives, and the reader's state after each part; after a control frame the reader goes
    on with the rest, after any other stop that part is done (the carrier hands the rest
    to autobahn)."""
    turns = []
    for part in parts:
        data = part
        for _ in range(len(part) + 1):
            payloads, stop, data = reader.read(data)
            turns.append((payloads, stop, data))
            if stop is None or stop[0] != "control" or not data:
                break
        turns.append(_state(reader))
    return turns


def _state(reader) -> tuple:
    return (reader.idle, reader._head, reader._left, reader._key, reader._phase, reader._fragmented, reader._message)


@TWIN
@given(
    frame_streams(),
    st.lists(st.integers(0, 150_000), max_size=6),
    st.sampled_from([0, 125, 65536, 1 << 20, 2**63 - 1, 2**64]),
)
def test_the_compiled_reader_reads_what_the_reference_reads(masked_stream, cuts, limit):
    """The compiled FrameReader, and the reference one copying payloads with the compiled
    ``unmasked_payloads``, read any frames, valid or malformed, cut anywhere, exactly as
    the reference: the same payloads, stops, rests, and state after each part."""
    masked, stream = masked_stream
    points = sorted({min(c, len(stream)) for c in cuts})
    parts = [stream[a:b] for a, b in zip([0] + points, points + [len(stream)], strict=True)]
    turns = {}
    for name, reader, copy in (
        ("reference", FrameReader, unmasked_payloads),
        ("twin payloads", FrameReader, compiled.unmasked_payloads),
        ("twin reader", compiled.FrameReader, unmasked_payloads),
    ):
        original = websocket_frames._payloads
        websocket_frames._payloads = copy
        try:
            turns[name] = _read_through(reader(masked=masked, max_message=limit), parts)
        finally:
            websocket_frames._payloads = original
    assert turns["twin payloads"] == turns["reference"]
    assert turns["twin reader"] == turns["reference"]


def test_the_compiled_reader_streams_a_frame_one_byte_at_a_time():
    """Fed one byte at a time (every header split at every point, a frame spanning a
    thousand reads), the compiled reader gives the reference's payloads and state."""
    sizes = (0, 5, 126, 300, 1000)
    frames = [frame(0x2, bytes(n), masked=True, fin=n != 300) for n in sizes]
    frames.insert(4, frame(0x0, b"tail", masked=True))  # ends the message of 300
    stream = b"".join(frames) + frame(0x9, b"ping", masked=True)
    parts = [stream[i : i + 1] for i in range(len(stream))]
    want = _read_through(FrameReader(masked=True, max_message=1 << 20), parts)
    assert _read_through(compiled.FrameReader(masked=True, max_message=1 << 20), parts) == want
    stops = [turn[1][0] for turn in want if len(turn) == 3 and turn[1] is not None]
    assert stops == ["control"]


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_a_message_over_the_limit_only_in_sum_is_refused_by_both(masked):
    """Each frame within the limit, their message over it: refused from the header of the
    continuation that passes it, naming the message's size so far, by both readers."""
    stream = (
        frame(0x2, bytes(40_000), masked=masked, fin=False)
        + frame(0x0, bytes(20_000), masked=masked, fin=False)
        + frame(0x0, bytes(10_000), masked=masked)
    )
    want = _read_through(FrameReader(masked=masked, max_message=65536), [stream])
    assert want[0][1] == ("too_large", (70_000, 65536))
    assert _read_through(compiled.FrameReader(masked=masked, max_message=65536), [stream]) == want


@pytest.mark.parametrize("limit", [-1, -(2**70)])
def test_a_negative_limit_is_the_same_error(limit):
    want = _outcome(FrameReader, masked=True, max_message=limit)
    assert want[0] == "error"
    assert _outcome(compiled.FrameReader, masked=True, max_message=limit) == want


def test_the_twin_is_what_runs_unless_mconn_pure_is_set():
    """Built and current, the twin frames the carrier's writes and copies the reader's
    payloads; MCONN_PURE=1 (read when mconn is first imported) chooses the reference, and
    ``describe`` says which and why."""
    code = (
        "from mconn.net import websocket_frames as w\n"
        "print(w.describe(), w.frames_of is w.binary_frames, w.reader_type is w.FrameReader,"
        " w._payloads is w.unmasked_payloads)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MCONN_PURE"}
    runs = {}
    for pure in ("", "1"):
        if pure:
            env["MCONN_PURE"] = pure
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
        runs[pure] = out.stdout.strip()
    assert runs[""] == "accelerated False False False"
    assert runs["1"] == "pure Python (MCONN_PURE=1) True True True"
