"""mconn.net.websocket_frames.FrameReader, the hot path of reading an open WebSocket, fed bytes.

No sockets: frames are built here (RFC 6455 section 5.2) and fed whole, split at every
point, and one byte at a time; the payloads must come out unmasked and in order, and
everything the reader does not take must stop it where it starts, or be refused from its
header (too large, a binary frame inside a fragmented message).
"""

from __future__ import annotations

import itertools
import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.net.websocket_frames import SMALL_MASKING, FrameReader, MaskKeys, binary_frames, mask_in_place

LIMIT = 1 << 20


def frame(
    opcode: int, payload: bytes, *, masked: bool, fin: bool = True, rsv: int = 0, length=None, key: bytes | None = None
) -> bytes:
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | rsv | opcode
    bit = 0x80 if masked else 0
    if n < 126:
        header = struct.pack("!BB", first, bit | n)
    elif n < 65536:
        header = struct.pack("!BBH", first, bit | 126, n)
    else:
        header = struct.pack("!BBQ", first, bit | 127, n)
    if not masked:
        return header + payload
    key = os.urandom(4) if key is None else key
    return header + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_all(reader: FrameReader, parts) -> tuple[bytes, list]:
    """Feed ``parts``; the joined payloads and every stop met."""
    out, stops = [], []
    for part in parts:
        payloads, stop, rest = reader.read(part)
        out += payloads
        if stop is not None:
            stops.append((stop, rest))
    return b"".join(out), stops


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_binary_frames_of_every_length_encoding_come_out_whole_split_anywhere(masked):
    """Frames of 7-bit, 16-bit and 64-bit lengths (and an empty one), masked or not, give
    their payloads in order, whether fed whole, in two parts at any point, or one byte at a
    time (a small one: every split of the big ones would be slow)."""
    payloads = [b"", b"a" * 5, os.urandom(300), os.urandom(70_000)]
    stream = b"".join(frame(0x2, p, masked=masked) for p in payloads)
    want = b"".join(payloads)
    assert read_all(FrameReader(masked=masked, max_message=LIMIT), [stream]) == (want, [])
    for cut in list(range(0, 40)) + [len(stream) // 2, len(stream) - 1]:
        got = read_all(FrameReader(masked=masked, max_message=LIMIT), [stream[:cut], stream[cut:]])
        assert got == (want, []), cut
    small = b"".join(frame(0x2, p, masked=masked) for p in payloads[:3])
    reader = FrameReader(masked=masked, max_message=LIMIT)
    assert read_all(reader, [small[i : i + 1] for i in range(len(small))]) == (b"".join(payloads[:3]), [])
    assert reader.idle


def test_a_fragmented_message_is_read_as_its_frames_come():
    """A binary message in three frames (FIN on the last) gives its bytes as they come."""
    stream = frame(0x2, b"one ", masked=True, fin=False) + frame(0x0, b"two ", masked=True, fin=False)
    stream += frame(0x0, b"three", masked=True)
    assert read_all(FrameReader(masked=True, max_message=LIMIT), [stream]) == (b"one two three", [])


def test_a_control_frame_stops_the_reader_after_the_data_before_it():
    """A ping between two data frames: the first payload, then a stop handing over exactly
    the ping frame, and the rest after it to read next."""
    ping = frame(0x9, b"hi", masked=True)
    stream = frame(0x2, b"before", masked=True) + ping + frame(0x2, b"after", masked=True)
    reader = FrameReader(masked=True, max_message=LIMIT)
    payloads, stop, rest = reader.read(stream)
    assert payloads == [b"before"] and stop == ("control", ping)
    payloads, stop, rest = reader.read(rest)
    assert payloads == [b"after"] and stop is None and rest == b""


def test_a_control_frame_split_across_reads_is_kept_until_whole():
    """A ping whose bytes come in two reads is handed over once whole."""
    ping = frame(0x9, b"x" * 100, masked=True)
    reader = FrameReader(masked=True, max_message=LIMIT)
    assert reader.read(ping[:50]) == ([], None, b"") and not reader.idle
    assert reader.read(ping[50:]) == ([], ("control", ping), b"")


@pytest.mark.parametrize(
    "bad",
    [
        frame(0x1, b"text", masked=True),
        frame(0x2, b"x", masked=True, rsv=0x40),
        frame(0x2, b"x", masked=False),
        frame(0x3, b"x", masked=True),
        frame(0x0, b"x", masked=True),
        frame(0x9, b"x" * 126, masked=True),
        frame(0x9, b"x", masked=True, fin=False),
    ],
    ids=[
        "text",
        "rsv1",
        "unmasked-from-a-dialer",
        "reserved-opcode",
        "continuation-first",
        "long-ping",
        "fragmented-ping",
    ],
)
def test_a_frame_the_reader_does_not_take_is_handed_over_from_its_header(bad):
    """Text, reserved bits, a dialer's unmasked frame, a reserved opcode, a continuation
    with no message, a control frame over 125 bytes or without FIN: the reader stops at
    its first byte and hands the rest over (autobahn refuses each of them)."""
    before = frame(0x2, b"ok", masked=True)
    payloads, stop, rest = FrameReader(masked=True, max_message=LIMIT).read(before + bad + b"tail")
    assert payloads == [b"ok"] and stop == ("handoff", None) and rest == bad + b"tail"


def test_a_frame_over_the_limit_is_refused_from_its_header_before_its_payload():
    """A frame (or a fragmented message) declaring more than max_message is refused as
    soon as its header is complete, though none of its payload has come."""
    header_only = frame(0x2, b"", masked=True, length=LIMIT + 1)[:14]
    assert FrameReader(masked=True, max_message=LIMIT).read(header_only) == ([], ("too_large", (LIMIT + 1, LIMIT)), b"")
    first = frame(0x2, b"a" * 600, masked=False, fin=False)
    second = frame(0x0, b"", masked=False, length=LIMIT - 599)[:10]
    got = FrameReader(masked=False, max_message=LIMIT).read(first + second)
    assert got == ([b"a" * 600], ("too_large", (LIMIT + 1, LIMIT)), b"")


def test_a_new_binary_frame_inside_a_fragmented_message_is_a_protocol_error():
    """A binary frame where a continuation must come is refused with a reason."""
    stream = frame(0x2, b"a", masked=True, fin=False) + frame(0x2, b"b", masked=True)
    assert FrameReader(masked=True, max_message=LIMIT).read(stream) == (
        [b"a"],
        ("protocol", "a binary frame inside a fragmented message"),
        b"",
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=600), min_size=1, max_size=6), st.lists(st.integers(0, 4000), max_size=8), st.booleans()
)
def test_any_frames_split_at_any_points_give_the_same_bytes(payloads, cuts, masked):
    """Any binary frames, fed in parts cut anywhere, give the concatenation of their payloads."""
    stream = b"".join(frame(0x2, p, masked=masked) for p in payloads)
    points = sorted({min(c, len(stream)) for c in cuts})
    parts = [stream[a:b] for a, b in itertools.pairwise([0, *points, len(stream)])]
    assert read_all(FrameReader(masked=masked, max_message=LIMIT), parts) == (b"".join(payloads), [])


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1000, SMALL_MASKING - 1, SMALL_MASKING, 20_000])
@pytest.mark.parametrize("phase", [0, 1, 2, 3, 6])
def test_masking_in_place_matches_rfc_6455_on_either_side_of_the_small_size_and_in_parts(n, phase):
    """Masking is the XOR with the key repeated, from key byte ``phase % 4``, whichever
    way the size picks (integers or the native routine), only inside the given range;
    and the same when the payload comes in three parts, each from where the last ended."""
    data, key = os.urandom(n), os.urandom(4)
    expected = bytes(b ^ key[(phase + i) % 4] for i, b in enumerate(data))
    buffer = bytearray(b"<<" + data + b">>")
    mask_in_place(buffer, 2, n, key, phase)
    assert buffer == b"<<" + expected + b">>"
    buffer = bytearray(data)
    for a, b in ((0, n // 3), (n // 3, n // 2), (n // 2, n)):
        mask_in_place(buffer, a, b - a, key, phase + a)
    assert buffer == expected


class _Keys:
    """A stand-in for ``os.urandom`` that hands out given bytes and records each call."""

    def __init__(self, pool: bytes) -> None:
        self.pool = pool
        self.calls = []

    def __call__(self, n: int) -> bytes:
        self.calls.append(n)
        return (self.pool * (n // len(self.pool) + 1))[:n]


_SIZES = st.one_of(
    st.integers(0, 300),
    st.sampled_from([SMALL_MASKING - 1, SMALL_MASKING, SMALL_MASKING + 5, 70_000]),
    st.integers(0, 3 * SMALL_MASKING),
)


@settings(max_examples=150, deadline=None)
@given(
    _SIZES,
    st.sampled_from([1, 125, 126, 200, SMALL_MASKING, 65536]),
    st.binary(min_size=4, max_size=64),
    st.booleans(),
    st.integers(0, 2**32),
)
def test_binary_frames_are_byte_identical_to_frames_built_one_at_a_time(n, limit, pool, masked, seed):
    """binary_frames (one buffer, payloads masked in place, by the native routine from
    SMALL_MASKING bytes on) gives exactly the bytes of the frames built one by one the plain
    RFC 6455 way (header, key, payload XOR the key repeated), each with the next 4 key
    bytes, split at ``limit``; it asks for all the keys in one call, 4 per frame."""
    data = random.Random(seed).randbytes(n)  # drawn outside hypothesis: its buffer refuses large data
    keys = _Keys(pool) if masked else None
    got = binary_frames(data, limit=limit, keys=keys)
    chunks = [data[i : i + limit] for i in range(0, n, limit)] or [b""]
    all_keys = keys(4 * len(chunks)) if masked else None
    want = b"".join(
        frame(0x2, chunk, masked=masked, key=all_keys[4 * k : 4 * k + 4] if masked else None)
        for k, chunk in enumerate(chunks)
    )
    assert got == want
    if masked:
        assert keys.calls == [4 * len(chunks), 4 * len(chunks)]  # binary_frames', then ours


@settings(max_examples=100, deadline=None)
@given(
    st.lists(_SIZES, min_size=1, max_size=4),
    st.lists(st.integers(0, 80_000), max_size=6),
    st.booleans(),
    st.integers(0, 2**32),
)
def test_frames_of_any_size_read_back_as_one_payload_per_read(sizes, cuts, masked, seed):
    """Frames built the plain way, cut anywhere, read back by a FrameReader: the payload
    bytes come out in order, as at most one bytes object per read, whichever way each
    frame is unmasked (the native routine from SMALL_MASKING on) and however a frame spans
    reads."""
    rnd = random.Random(seed)
    payloads = [rnd.randbytes(n) for n in sizes]
    stream = b"".join(frame(0x2, p, masked=masked, key=rnd.randbytes(4)) for p in payloads)
    points = sorted({min(c, len(stream)) for c in cuts})
    reader = FrameReader(masked=masked, max_message=LIMIT)
    out = []
    for a, b in itertools.pairwise([0, *points, len(stream)]):
        got, stop, rest = reader.read(stream[a:b])
        assert stop is None and rest == b"" and len(got) <= 1
        assert all(type(p) is bytes for p in got)
        out += got
    assert b"".join(out) == b"".join(payloads) and reader.idle


def test_a_write_over_the_message_size_is_several_whole_messages():
    """70,000 bytes with the 64 KiB limit: two binary messages of one frame each (FIN set,
    opcode 2), 65,536 and 4,464 bytes, each with its own masking key."""
    data = os.urandom(70_000)
    keys = _Keys(bytes(range(8)))
    wire = binary_frames(data, limit=65536, keys=keys)
    assert wire[:2] == bytes((0x82, 0x80 | 127)) and struct.unpack("!Q", wire[2:10])[0] == 65536
    assert wire[10:14] == bytes(range(4))
    second = 14 + 65536
    assert wire[second : second + 4] == bytes((0x82, 0x80 | 126)) + struct.pack("!H", 4464)
    assert wire[second + 4 : second + 8] == bytes(range(4, 8)) and len(wire) == second + 8 + 4464
    reader = FrameReader(masked=True, max_message=LIMIT)
    assert reader.read(wire) == ([data], None, b"")


def test_mask_keys_hand_out_each_drawn_byte_once_and_draw_a_pool_at_a_time(monkeypatch):
    """A dialer's keys come from os.urandom a pool at a time: consecutive calls return
    consecutive bytes of it, never the same ones twice, and a call past its end draws a
    new pool (one larger if asked for more); ``forget`` (a forked child) drops the rest."""
    draws = []

    def urandom(n):
        draws.append(n)
        return bytes((len(draws) + i) % 256 for i in range(n))

    monkeypatch.setattr(os, "urandom", urandom)
    keys = MaskKeys()
    first = [keys(4) for _ in range(MaskKeys.POOL // 4)]
    assert draws == [MaskKeys.POOL]
    assert b"".join(first) == urandom_pool(1, MaskKeys.POOL)
    assert keys(8) == urandom_pool(2, MaskKeys.POOL)[:8] and draws == [MaskKeys.POOL] * 2
    assert keys(3 * MaskKeys.POOL) == urandom_pool(3, 3 * MaskKeys.POOL)
    keys.forget()
    assert keys(4) == urandom_pool(4, MaskKeys.POOL)[:4]
    assert draws == [MaskKeys.POOL, MaskKeys.POOL, 3 * MaskKeys.POOL, MaskKeys.POOL]


def urandom_pool(draw: int, n: int) -> bytes:
    """What the fake os.urandom above returns on its ``draw``-th call for ``n`` bytes."""
    return bytes((draw + i) % 256 for i in range(n))


def test_frames_masked_with_the_pooled_keys_read_back_each_with_its_own_key():
    """binary_frames with the process's pooled keys: three frames, three different keys
    (the bytes after each header), and the reader unmasks them back to the data."""
    data = os.urandom(3 * 65536)
    wire = binary_frames(data, limit=65536, keys=MaskKeys())
    step = 10 + 4 + 65536
    assert len({wire[k * step + 10 : k * step + 14] for k in range(3)}) == 3
    assert FrameReader(masked=True, max_message=LIMIT).read(wire) == ([data], None, b"")
