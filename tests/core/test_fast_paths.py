"""The per-message fast paths give the same packets and bytes as the plain ones.

* ``FrameBuffer.feed`` with an incomplete packet kept completes it from a bounded prefix
  of the new bytes and decodes the rest in place (``SPLICE_MIN``); it must decode, and
  fail, exactly as joining the two would (specs/wire.md sections 2 and 5).
* A run of full msg packets is checked many headers at a time (``_run_length``); any
  packet in it that differs must still come out as itself.
* ``Channel.emit`` sends a message that fits one packet without a view of it; its bytes
  must be the declaration's (wire.encode_packet), packet by packet.
* ``WriteAhead``: a write short of its budget does not pause, and the writes between two
  resumes never add up to more than the write-ahead size and one write.
"""

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import wire
from mconn.core.channel import Channel, ChannelDescriptor
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.wire import PacketType
from mconn.net.write_ahead import WriteAhead
from tests.core.test_codec_equivalence import any_packets, malformed_bytes
from tests.helpers_core import decode_stream, feed_whole, merge_not_last

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_in_chunks(data: bytes, cuts: list[int], splice_min: int, max_payload: int = 64):
    """Feed ``data`` cut at ``cuts``; the decoded packets, the error (type and text)
    and what stays buffered."""
    buffer = FrameBuffer(max_payload=max_payload, default_extension_limit=48, extension_limits={PacketType.HELLO: 200})
    buffer.SPLICE_MIN = splice_min
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    out: list = []
    for a, b in itertools.pairwise(bounds):
        packets, error = feed_whole(buffer, data[a:b])
        out += packets
        if error is not None:
            return merge_not_last(out), (type(error), str(error)), None
    # A run's small payloads come as one piece, cut where the reads cut the run.
    return merge_not_last(out), None, buffer.buffered


@st.composite
def full_packet_runs(draw) -> list[bytes]:
    """Full msg packets (max_payload 64) of one or two channels, with other packets
    (a last packet, a ping, another channel) among them; the packets, one by one."""
    parts = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["full", "full", "full", "full", "last", "ping", "other"]))
        channel = draw(st.sampled_from([0x20, 0x21]))
        if kind == "full":
            parts.append(
                wire.encode_packet(PacketType.MSG, channel_id=channel, eof=False, data=bytes([len(parts)]) * 64)
            )
        elif kind == "last":
            parts.append(wire.encode_packet(PacketType.MSG, channel_id=channel, eof=True, data=bytes(64)))
        elif kind == "ping":
            parts.append(b"\x01")
        else:
            size = draw(st.integers(0, 70))  # over 64: PacketTooLarge
            parts.append(bytes([3, channel, 0, 1, size]) + bytes(size))
    return parts


@FAST
@given(
    stream=st.one_of(
        st.lists(any_packets(max_data=60), min_size=1, max_size=12).map(b"".join),
        malformed_bytes(),
        full_packet_runs().map(b"".join),
    ),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_spliced_feed_decodes_and_fails_like_a_joined_feed(stream, cuts):
    """Whatever the stream (valid, malformed, runs of full packets) and wherever it is
    cut, completing the kept packet from a prefix of the next bytes gives the packets,
    the error (class and message) and the buffered bytes that joining them gives."""
    spliced = _decode_in_chunks(stream, cuts, splice_min=0)
    joined = _decode_in_chunks(stream, cuts, splice_min=1 << 30)
    assert spliced == joined


@FAST
@given(packets=full_packet_runs())
def test_runs_of_full_packets_decode_packet_by_packet_as_declared(packets):
    """Checking a run's headers many at a time never swallows a packet that differs:
    the output is the declaration's decode of the packets up to the first one over
    max_payload (64), and that one is PacketTooLarge."""
    out, error, _ = _decode_in_chunks(b"".join(packets), [], splice_min=1 << 30)
    good = list(itertools.takewhile(lambda p: p[0] != PacketType.MSG or p[4] <= 64, packets))
    assert out == merge_not_last(decode_stream(b"".join(good)))
    if len(good) == len(packets):
        assert error is None
    else:
        assert error is not None and error[0].__name__ == "PacketTooLarge"
        assert f"declares {packets[len(good)][4]} payload bytes" in error[1]


@FAST
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    payload=st.integers(1, 120),
    budget=st.integers(1, 2000),
)
def test_emit_is_the_declaration_packet_by_packet(sizes, payload, budget):
    """However the budget cuts the calls, emit's bytes are each message cut into
    payload-sized packets, each encoded as wire.encode_packet declares."""
    channel = Channel(ChannelDescriptor(0x42, send_queue_capacity=100))
    messages = [bytes([i]) * size for i, size in enumerate(sizes)]
    for message in messages:
        assert channel.enqueue(message)
    out = b""
    finished = 0
    for _ in range(10_000):
        if not channel.is_pending:
            break
        parts: list = []
        wire_bytes, done = channel.emit(parts, payload, budget)
        chunk = b"".join(parts)
        assert wire_bytes == len(chunk)
        out += chunk
        finished += done
    expected = b""
    for message in messages:
        pieces = [message[i : i + payload] for i in range(0, len(message), payload)] or [b""]
        for n, piece in enumerate(pieces):
            expected += wire.encode_packet(PacketType.MSG, channel_id=0x42, eof=n == len(pieces) - 1, data=piece)
    assert out == expected
    assert finished == len(messages) == channel.stats.messages_sent
    assert channel.stats.bytes_sent == sum(map(len, messages))  # message bytes, not the headers


@FAST
@given(writes=st.lists(st.tuples(st.integers(1, 5000), st.booleans(), st.booleans()), max_size=60))
def test_write_ahead_pauses_once_the_writes_since_a_resume_reach_its_size(writes):
    """A write short of its budget does not pause; one that fills it does; what is
    written between two resumes stays within the size plus one write, and every budget
    is what is left of the size (at least 1)."""
    ahead = WriteAhead(0.001, 8192)
    since_resume = 0
    paused = False
    for count, full, resume in writes:
        if paused or resume:
            ahead.resumed(0.0, lambda: None)
            since_resume, paused = 0, False
        budget = ahead.budget()
        assert budget == max(1, ahead.size - since_resume)
        count = min(count, budget + 1040)  # a write carries its budget and one packet at most
        paused = ahead.wrote(count, full)
        since_resume += count
        assert paused == (full or since_resume >= ahead.size)
        assert since_resume < 2 * ahead.size + 1040


def test_an_idle_channel_holds_no_deque_until_its_first_message():
    """Memory per peer: an empty deque costs ~760 bytes, so a channel
    makes its queue on its first message; enqueue, requeue and emit work from there."""
    channel = Channel(ChannelDescriptor(0x42, send_queue_capacity=2))
    assert channel.queue == () and not channel.is_pending and channel.queue_depth == 0
    assert channel.enqueue(b"a") and channel.enqueue(b"b") and not channel.enqueue(b"c")
    assert list(channel.queue) == [b"a", b"b"]
    other = Channel(ChannelDescriptor(0x43))
    other.writable_queue().extend([b"x", b"y"])  # Connection.requeue: past the capacity
    parts: list = []
    other.emit(parts, 64, 1 << 20)
    assert b"".join(parts) == b"".join(
        wire.encode_packet(PacketType.MSG, channel_id=0x43, eof=True, data=m) for m in (b"x", b"y")
    )
