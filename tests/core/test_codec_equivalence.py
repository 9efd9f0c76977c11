"""The hand-written hot path is the construct declaration, proved with hypothesis.

frame_buffer.FrameBuffer (decoding) and channel.msg_header / Channel.emit / Scheduler
(encoding) are written for speed; wire.py's declarations are the format (specs/wire.md
section 1). These properties say they agree, on valid and on malformed input.
"""

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import wire
from mconn.core.channel import KEEP_VIEW_MIN, Channel, ChannelDescriptor, Scheduler, msg_header
from mconn.errors import MalformedPacket, PacketTooLarge
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.wire import PacketType
from tests.helpers_core import decode_stream, edited, feed_whole, merge_not_last

#: Modest example counts keep tests/core fast; no deadline (CI machines vary).
CORE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Limits out of reach, for properties where only the format may decide.
UNLIMITED = 1 << 64


def _uvarint(value: int, size: int) -> bytes:
    """``value`` as a go-wire uvarint of exactly ``size`` bytes (non-minimal if larger)."""
    return bytes([size]) + value.to_bytes(size, "big")


@st.composite
def uvarint_bytes(draw, value: int) -> bytes:
    minimal = (value.bit_length() + 7) // 8
    return _uvarint(value, draw(st.integers(minimal, 8)))


@st.composite
def msg_packets(draw, max_data: int = 3000) -> tuple[bytes, tuple]:
    """(bytes, decoded) of a msg packet, its length sometimes written non-minimally."""
    channel_id = draw(st.integers(0, 255))
    eof = draw(st.booleans())
    data = draw(st.binary(max_size=max_data))
    raw = bytes([PacketType.MSG, channel_id, eof]) + draw(uvarint_bytes(len(data))) + data
    return raw, (PacketType.MSG, (channel_id, eof, data))


@st.composite
def any_packets(draw, max_data: int = 12) -> bytes:
    kind = draw(st.sampled_from(["ping", "pong", "msg", "extension"]))
    if kind == "ping":
        return b"\x01"
    if kind == "pong":
        return b"\x02"
    if kind == "msg":
        return draw(msg_packets(max_data=max_data))[0]
    body = draw(st.binary(max_size=max_data))
    packet_type = draw(st.integers(wire.FIRST_EXTENSION_TYPE, 255))
    return bytes([packet_type]) + draw(uvarint_bytes(len(body))) + body


@st.composite
def malformed_bytes(draw) -> bytes:
    """Mostly packet-shaped bytes with a few edits (flip, cut, insert), or pure noise."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(min_size=1, max_size=24))
    packets = b"".join(draw(st.lists(any_packets(), min_size=1, max_size=2)))
    return draw(edited(packets, (0, 3), [0, 1, 2, 3, 4, 5, 8, 9, 0x7F, 0x80, 0xF1, 0xFF])) or b"\x00"


#: Payload sizes where a run's pieces change kind (frame_buffer._run): copied below
#: KEEP_VIEW_MIN, views from it on.
AROUND_KEEP_VIEW_MIN = [KEEP_VIEW_MIN - 1, KEEP_VIEW_MIN, KEEP_VIEW_MIN + 1, 5000]


@st.composite
def run_packets(draw, max_data: int = 40, large: bool = True) -> list[bytes]:
    """The packets of runs: msg packets of two channels, mostly not-last, small (up to
    ``max_data`` bytes) and with ``large`` some around KEEP_VIEW_MIN, lengths sometimes
    written non-minimally, with last packets (a message's end in the middle of a run),
    pings and an extension among them."""
    out = []
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["not_last"] * 6 + ["last", "last", "ping", "extension"]))
        channel_id = draw(st.sampled_from([0x20, 0x21]))
        if kind == "ping":
            out.append(b"\x01")
        elif kind == "extension":
            out.append(bytes([0x80, 1, 2, 0xAB, 0xCD]))
        else:
            sizes = st.integers(0, max_data)
            if large:
                sizes = sizes | st.sampled_from(AROUND_KEEP_VIEW_MIN)
            size = draw(sizes)
            body = bytes([len(out) % 251]) * size  # distinct per packet, cheap to draw
            out.append(bytes([PacketType.MSG, channel_id, kind == "last"]) + draw(uvarint_bytes(size)) + body)
    return out


@st.composite
def run_streams(draw, broken: bool = False):
    """Runs of not-last packets of two channels (frame_buffer._run), small and around
    KEEP_VIEW_MIN, with last packets and pings among them; ``broken``: then bad bytes
    (a bad eof or size byte, an unknown type, a too-long length) after a run."""
    stream = b"".join(draw(run_packets(large=draw(st.booleans()))))
    if broken:
        stream += draw(
            st.sampled_from(
                [b"\x03\x20\x02\x01\x01", b"\x03\x20\x00\x09", b"\x00", b"\x03\x21\x00\x08" + b"\xff" * 8, b"\x03\x20"]
            )
        )
        stream += b"".join(draw(run_packets(max_data=8, large=False)))
    return stream


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# -- (a) valid msg packets: FrameBuffer output == decode_packet --------------------------


@CORE
@given(packet=msg_packets(), max_payload=st.integers(1, 4096), cuts=st.lists(st.integers(0, 4000), max_size=4))
def test_frame_buffer_equals_declaration_on_msg_packets(packet, max_payload, cuts):
    """However cut, a msg packet decodes as the declaration says; data over max_payload is PacketTooLarge."""
    raw, decoded = packet
    assert wire.decode_packet(raw) == decoded
    buffer = FrameBuffer(max_payload=max_payload, default_extension_limit=1024)
    out: list = []
    error = None
    for chunk in _split(raw, cuts):
        packets, error = feed_whole(buffer, chunk)
        out += packets
        if error is not None:
            break
    data_len = len(decoded[1][2])
    if data_len <= max_payload:
        assert (out, error, buffer.buffered) == ([decoded], None, 0)
    else:
        # The declaration has no limits; the stream refuses the length before the body.
        assert out == []
        assert isinstance(error, PacketTooLarge)
        assert f"{data_len}" in str(error) or "at least" in str(error)


@CORE
@given(
    packets=st.lists(any_packets(max_data=40), min_size=1, max_size=8), cuts=st.lists(st.integers(0, 400), max_size=6)
)
def test_frame_buffer_equals_declaration_on_packet_streams(packets, cuts):
    """Streams of pings, pongs, msgs and extensions, cut anywhere, decode packet by packet as declared."""
    stream = b"".join(packets)
    buffer = FrameBuffer(max_payload=UNLIMITED, default_extension_limit=UNLIMITED)
    out: list = []
    for chunk in _split(stream, cuts):
        got, error = feed_whole(buffer, chunk)
        assert error is None
        out += got
    # Consecutive not-last packets of a channel are one run, their small payloads one piece.
    assert merge_not_last(out) == merge_not_last([wire.decode_packet(p) for p in packets])
    assert buffer.buffered == 0


@CORE
@given(
    packets=run_packets(),
    max_payload=st.sampled_from([24, KEEP_VIEW_MIN, 65536, UNLIMITED]),
    cuts=st.lists(st.integers(0, 30000), max_size=6),
)
def test_frame_buffer_equals_declaration_on_runs(packets, max_payload, cuts):
    """Runs of not-last packets of a channel, of any sizes (small ones joined into one
    piece, large ones views), cut anywhere: the declaration's packets up to the first
    one over max_payload (their not-last payloads merged as runs merge them), and
    PacketTooLarge naming that one."""
    good = []
    for packet in packets:
        decoded = wire.decode_packet(packet)
        if decoded[0] == PacketType.MSG and len(decoded[1][2]) > max_payload:
            break
        good.append(decoded)
    buffer = FrameBuffer(max_payload=max_payload, default_extension_limit=1024)
    out: list = []
    error = None
    for chunk in _split(b"".join(packets), cuts):
        got, error = feed_whole(buffer, chunk)
        out += got
        if error is not None:
            break
    assert merge_not_last(out) == merge_not_last(good)
    if len(good) == len(packets):
        assert error is None and buffer.buffered == 0
    else:
        assert isinstance(error, PacketTooLarge), error
        assert f"over max_packet_payload {max_payload}" in str(error) or f"over its limit {max_payload}" in str(error)


# -- (b) the hand-written header == the declaration --------------------------------------


@CORE
@given(channel_id=st.integers(0, 255), eof=st.booleans(), data=st.binary(max_size=3000))
def test_msg_header_plus_data_equals_encode_packet(channel_id, eof, data):
    """msg_header followed by the data is exactly the declaration's encoded msg packet."""
    built = wire.encode_packet(PacketType.MSG, channel_id=channel_id, eof=eof, data=data)
    assert msg_header(channel_id, eof, len(data)) + data == built


@CORE
@given(channel_id=st.integers(0, 255), eof=st.booleans(), length=st.integers(0, (1 << 64) - 1))
def test_msg_header_length_is_the_declared_uvarint(channel_id, eof, length):
    """The length in msg_header is the declared uvarint, for any 64-bit length."""
    header = msg_header(channel_id, eof, length)
    assert header == bytes([PacketType.MSG, channel_id, int(eof)]) + wire.encode_uvarint(length)
    assert wire.uvarint.parse(header[3:]) == length


# -- (c) malformed input: both accept or both reject -------------------------------------


@CORE
@given(data=malformed_bytes())
def test_frame_buffer_and_declaration_agree_on_arbitrary_bytes(data):
    """Accept/reject agreement for single packets, prefix by prefix.

    FrameBuffer is incremental: an incomplete packet is "need more", not an error, and
    after one packet it reads the next. decode_packet judges exactly one whole packet. So
    the comparison is on every prefix ``data[:j]``: decode_packet accepts it if and only
    if the FrameBuffer, fed the same bytes one at a time, completes its first packet on
    exactly byte j, and then both produce the same packet. When the FrameBuffer raises
    before completing a packet, the declaration rejects every prefix that contains the
    bad byte (the bad byte cannot be repaired by more input). Limits are out of reach
    here: limit checks are the stream's own rule (test_frame_buffer.py).
    """
    buffer = FrameBuffer(max_payload=UNLIMITED, default_extension_limit=UNLIMITED)
    first_end = first = error_at = None
    for i in range(len(data)):
        packets, error = feed_whole(buffer, data[i : i + 1])
        if packets and first_end is None:
            first_end, first = i + 1, packets[0]
        if error is not None:
            assert isinstance(error, MalformedPacket)
            error_at = i
            break
    for j in range(1, len(data) + 1):
        try:
            decoded = wire.decode_packet(data[:j])
        except MalformedPacket:
            assert j != first_end, f"declaration rejects {data[:j].hex()}, stream accepted it"
        else:
            assert j == first_end, f"declaration accepts {data[:j].hex()}, stream did not emit it there"
            assert decoded == first
    if error_at is not None and first_end is None:
        assert all(_rejects(data[:j]) for j in range(error_at + 1, len(data) + 1))


@CORE
@given(data=malformed_bytes(), suffix=st.binary(max_size=16))
def test_stream_error_cannot_be_repaired_by_more_bytes(data, suffix):
    """An error reported before any packet means no continuation is a valid packet."""
    packets, error = feed_whole(FrameBuffer(max_payload=UNLIMITED, default_extension_limit=UNLIMITED), data)
    if error is not None and not packets:
        assert _rejects(data + suffix)


def _rejects(data: bytes) -> bool:
    try:
        wire.decode_packet(data)
    except MalformedPacket:
        return True
    return False


# -- (d) Channel.emit / Scheduler output decodes back into the messages ---------------------


@st.composite
def schedules(draw):
    count = draw(st.integers(1, 5))
    ids = draw(st.lists(st.integers(0, 255), min_size=count, max_size=count, unique=True))
    priorities = draw(st.lists(st.integers(1, 10), min_size=count, max_size=count))
    messages = draw(st.lists(st.tuples(st.integers(0, count - 1), st.binary(max_size=3000)), max_size=12))
    payload = draw(st.integers(1, 2048))
    budgets = draw(st.lists(st.integers(1, 8000), min_size=1, max_size=8))
    refill_every = draw(st.integers(1, 4))
    return ids, priorities, messages, payload, budgets, refill_every


@settings(CORE, max_examples=150)
@given(case=schedules())
def test_scheduler_output_reassembles_into_the_messages(case):
    """Under any priorities and budgets the scheduler's bytes reassemble into each channel's messages, in order."""
    ids, priorities, messages, payload, budgets, refill_every = case
    descriptors = [
        ChannelDescriptor(i, priority=p, send_queue_capacity=64) for i, p in zip(ids, priorities, strict=True)
    ]
    channels = [Channel(d) for d in descriptors]
    scheduler = Scheduler(channels, now=0.0)
    to_queue = [(ids[c], m) for c, m in messages]
    stream = bytearray()
    now = 0.0
    step = 0
    while to_queue or scheduler.pending():
        # Queue a few messages between scheduler runs, so channels come and go.
        for channel_id, message in to_queue[:refill_every]:
            assert channels[ids.index(channel_id)].enqueue(message)
        del to_queue[:refill_every]
        parts, sent = scheduler.next_packets(now, payload, budgets[step % len(budgets)])
        chunk = b"".join(parts)
        assert sent == len(chunk)
        stream += chunk
        now += 0.37
        step += 1

    received: dict[int, list[bytes]] = {i: [] for i in ids}
    partial: dict[int, list[bytes]] = {i: [] for i in ids}
    for kind, (channel_id, eof, data) in decode_stream(bytes(stream)):
        assert kind == PacketType.MSG
        partial[channel_id].append(data)
        if eof:
            chunks = partial[channel_id]
            # Every packet of a message but its last carries exactly the payload size.
            assert all(len(c) == payload for c in chunks[:-1])
            assert len(chunks[-1]) <= payload and (len(chunks[-1]) > 0 or len(chunks) == 1)
            received[channel_id].append(b"".join(chunks))
            partial[channel_id] = []
    assert all(not chunks for chunks in partial.values()), "a message was left unfinished"
    expected: dict[int, list[bytes]] = {i: [] for i in ids}
    for index, message in messages:
        expected[ids[index]].append(message)
    assert received == expected


@settings(CORE, max_examples=150)
@given(
    payload=st.integers(1, 1500),
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 40000), max_size=8),
)
def test_frame_buffer_reads_scheduler_output_like_the_declaration(payload, sizes, cuts):
    """Full-size chunks are FrameBuffer's fast path; its limit is the chunk size itself."""
    channels = [Channel(ChannelDescriptor(i, send_queue_capacity=8)) for i in (0x03, 0x20)]
    for n, size in enumerate(sizes):
        assert channels[n % 2].enqueue(bytes([n]) * size)
    parts, _ = Scheduler(channels, now=0.0).next_packets(0.0, payload, budget=1 << 30)
    stream = b"".join(parts)
    buffer = FrameBuffer(max_payload=payload, default_extension_limit=1024)
    out: list = []
    for chunk in _split(stream, cuts):
        got, error = feed_whole(buffer, chunk)
        assert error is None
        out += got
    assert merge_not_last(out) == merge_not_last(decode_stream(stream))
    assert buffer.buffered == 0


# -- the hand-written ack and extension codecs (wire.encode_ack, decode_ack, encode_extension)

ack_counts = st.dictionaries(st.integers(0, 255), st.integers(0, (1 << 64) - 1), max_size=40)


@given(delivered=ack_counts)
def test_encode_ack_equals_the_declaration(delivered):
    """encode_ack builds the declared ack body, and decode_ack reads it back."""
    reference = wire.AckBody.build(dict(delivered=wire._count_list(delivered)))
    assert wire.encode_ack(delivered) == reference
    assert wire.decode_ack(reference) == delivered


def _reference_ack(body):
    try:
        return wire._counts(wire._parse(wire.AckBody, body, "ack").delivered)
    except MalformedPacket as e:
        return type(e)


@given(
    body=st.one_of(st.binary(max_size=60), ack_counts.map(wire.encode_ack)),
    cut=st.integers(0, 60),
    extra=st.binary(max_size=3),
)
def test_decode_ack_equals_the_declaration_on_arbitrary_bytes(body, cut, extra):
    """Whole, truncated, extended or random bodies: the same counts or the same error."""
    for data in (body, body[:cut], body + extra, body.replace(b"\x01", b"\x09", 1)):
        expected = _reference_ack(data)
        try:
            got = wire.decode_ack(data)
        except MalformedPacket as e:
            got = type(e)
        assert got == expected, data.hex()


@given(packet_type=st.integers(wire.FIRST_EXTENSION_TYPE, 255), body=st.binary(max_size=600))
def test_encode_extension_equals_the_declaration(packet_type, body):
    """encode_extension builds the declared extension packet for any type >= 0x80 and body."""
    reference = wire.Packet.build(dict(type=packet_type, payload=dict(body=body)))
    assert wire.encode_extension(packet_type, body) == reference
