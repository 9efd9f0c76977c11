"""How a large message's pieces are kept until it is whole (mconn/core/channel.py, "Receiving"):
a piece that is a large part of the read it came in is kept as a view of that read and
the pieces are joined once at eof; small pieces are copied, so that a partial message
never keeps much more alive than its own bytes.

Sans-I/O: a Connection fed reads with an explicit ``now``.
"""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core.channel import KEEP_VIEW_MIN, Channel, ChannelDescriptor
from mconn.core.events import ConnectionFailed, MessageReceived
from mconn.errors import MessageTooLarge
from tests.helpers_core import msg, open_connection

CH, OTHER = 0x20, 0x21
CHANNELS = [ChannelDescriptor(CH), ChannelDescriptor(OTHER)]


def _stream(message: bytes, payload: int) -> bytes:
    """``message`` as msg packets of ``payload`` bytes on channel CH."""
    return b"".join(
        msg(CH, message[start : start + payload], eof=start + payload >= len(message))
        for start in range(0, len(message), payload)
    )


def test_large_pieces_are_kept_as_views_of_the_reads_they_came_in():
    """A 1 MiB message in 64 KiB packets read 64 KiB at a time: until it is whole, the
    channel holds views of the very read objects (no copy yet), and the message that comes
    out equals what was sent. (A BytesIO copied every piece, and grew by reallocating.)"""
    conn = open_connection(peer_payload=65536)
    message = bytes(range(256)) * 4096
    data = _stream(message, 65536)
    reads = [data[start : start + 65536] for start in range(0, len(data), 65536)]
    events = []
    for read in reads[:-1]:
        events += conn.receive_data(read, 1.0)
    pieces = conn.channels[CH].receiving
    assert events == [] and pieces
    views = [p for p in pieces if type(p) is memoryview]
    # The few bytes of a packet that end a read are copied; everything else is a view.
    assert sum(map(len, views)) > 0.99 * conn.channels[CH].receiving_size
    assert all(any(v.obj is r for r in reads) for v in views)
    assert sum(map(len, pieces)) == conn.channels[CH].receiving_size
    events += conn.receive_data(reads[-1], 1.0)
    assert [e.message for e in events] == [message]
    assert conn.channels[CH].receiving is None


def test_small_pieces_are_copied_so_a_read_is_not_kept_for_a_few_bytes():
    """Packets of 100 bytes of one message, each in a read with 8 KB of another
    channel's message: no view is kept (a 100-byte view would keep the whole read
    alive); the pieces are copied into one bytearray, and the message arrives whole."""
    conn = open_connection(peer_payload=65536, channels=CHANNELS)
    message = bytes(range(100)) * 30
    events = []
    for start in range(0, len(message), 100):
        piece = message[start : start + 100]
        other = msg(OTHER, bytes(8000))
        events += conn.receive_data(msg(CH, piece, eof=start + 100 >= len(message)) + other, 1.0)
        pieces = conn.channels[CH].receiving
        if pieces is not None:
            assert [type(p) for p in pieces] == [bytearray]
    assert [e.message for e in events if e.channel_id == CH] == [message]


@pytest.mark.parametrize(
    "size, read_size, kept",
    [
        (KEEP_VIEW_MIN, 2 * KEEP_VIEW_MIN, True),  # half of its read: a view
        (KEEP_VIEW_MIN, 2 * KEEP_VIEW_MIN + 1, False),  # under half: copied
        (KEEP_VIEW_MIN - 1, KEEP_VIEW_MIN - 1, False),  # the whole read, but small: copied
    ],
)
def test_a_piece_is_kept_as_a_view_only_when_large_and_at_least_half_its_read(size, read_size, kept):
    """The rule's two thresholds, on a Channel directly: a kept view never holds more
    than twice its own bytes, and pieces under KEEP_VIEW_MIN are always copied."""
    channel = Channel(ChannelDescriptor(CH))
    read = bytes(read_size)
    channel.reassemble_run([memoryview(read)[:size]])
    (piece,) = channel.receiving
    assert (type(piece) is memoryview and piece.obj is read) is kept
    assert channel.reassemble(1, memoryview(b"end")) == bytes(size) + b"end"


def test_a_view_of_a_mutable_buffer_is_copied():
    """A piece of a bytearray (a caller that reuses its buffer) is copied at once, so a
    later change of that buffer does not change the message."""
    channel = Channel(ChannelDescriptor(CH))
    buffer = bytearray(b"a" * 2 * KEEP_VIEW_MIN)
    channel.reassemble_run([memoryview(buffer)])
    buffer[:] = b"b" * len(buffer)
    assert channel.reassemble(1, memoryview(b"!")) == b"a" * 2 * KEEP_VIEW_MIN + b"!"


def test_the_packets_of_one_large_read_are_kept_as_views():
    """A whole 1 MiB message in one read (16 packets of 64 KiB): every piece is a view of
    that read (together far more than half of it), none is copied before the join."""
    conn = open_connection(peer_payload=65536)
    message = bytes(range(256)) * 4096
    data = _stream(message, 65536)
    events = conn.receive_data(data[:-100], 1.0)
    pieces = conn.channels[CH].receiving
    assert events == [] and pieces and all(type(p) is memoryview and p.obj is not None for p in pieces)
    assert conn.receive_data(data[-100:], 1.0)[0].message == message


def test_a_run_of_small_packets_is_copied_once_into_one_piece():
    """Packets of 1024 bytes fill a read, but a view object per KiB would cost more than
    a copy, and a step per packet more than one per read: the frame buffer copies the
    read's small payloads into one bytes object, which the channel keeps as it is (not
    copied again) until the message is whole."""
    conn = open_connection(peer_payload=1024)
    message = bytes(range(256)) * 64
    data = _stream(message, 1024)
    conn.receive_data(data[:-100], 1.0)
    pieces = conn.channels[CH].receiving
    assert [type(p) for p in pieces] == [bytes]
    assert len(pieces[0]) == conn.channels[CH].receiving_size == len(message) - 1024
    assert conn.receive_data(data[-100:], 1.0)[0].message == message


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.tuples(st.sampled_from([CH, OTHER]), st.integers(0, 4500)), min_size=1, max_size=5),
    payloads=st.lists(st.integers(1, 4200), min_size=1, max_size=4),
    order=st.randoms(use_true_random=False),
    cuts=st.lists(st.integers(0, 40000), max_size=8),
)
def test_small_packets_of_several_channels_cut_anywhere_reassemble_as_sent(messages, payloads, order, cuts):
    """Messages of two channels in packets of changing sizes (a sender's packet size
    may change between messages), interleaved a few packets at a time with pings
    between, fed in reads cut anywhere: each message arrives whole and in order, the
    same events as when the bytes are fed one at a time."""
    sent = [(channel_id, bytes([i % 251]) * size) for i, (channel_id, size) in enumerate(messages)]
    queues: dict[int, list[bytes]] = {CH: [], OTHER: []}
    for i, (channel_id, message) in enumerate(sent):
        payload = payloads[i % len(payloads)]
        starts = range(0, len(message), payload) if message else [0]
        for start in starts:
            queues[channel_id].append(
                msg(channel_id, message[start : start + payload], start + payload >= len(message))
            )
    stream = b""
    pings = 0
    while queues[CH] or queues[OTHER]:
        channel_id = order.choice([c for c in queues if queues[c]])
        take = order.randint(1, 3)
        stream += b"".join(queues[channel_id][:take])
        del queues[channel_id][:take]
        if pings < 4 and order.random() < 0.2:  # within max_pings_per_interval
            stream += b"\x01"
            pings += 1
    conn = open_connection(peer_payload=65536, channels=CHANNELS)
    events = []
    points = sorted({c % (len(stream) + 1) for c in cuts})
    for start, end in itertools.pairwise([0, *points, len(stream)]):
        events += conn.receive_data(stream[start:end], 1.0)
    bytewise = open_connection(peer_payload=65536, channels=CHANNELS)
    one_at_a_time = [e for i in range(len(stream)) for e in bytewise.receive_data(stream[i : i + 1], 1.0)]
    assert [type(e) for e in events] == [MessageReceived] * len(sent), events[-1]
    assert events == one_at_a_time
    for channel_id in (CH, OTHER):
        assert [e.message for e in events if e.channel_id == channel_id] == [m for c, m in sent if c == channel_id]


def test_a_run_past_recv_message_capacity_names_the_size_after_the_run():
    """The capacity is checked once for a read's run of a channel's packets, before it
    is kept: MessageTooLarge names the size the message would reach with the whole run
    (4000 here, where the packet that first crossed 2500 would say 3000), and the
    message another channel completed before it in the read is delivered."""
    conn = open_connection(
        peer_payload=65536, channels=[ChannelDescriptor(CH, recv_message_capacity=2500), ChannelDescriptor(OTHER)]
    )
    stream = msg(OTHER, b"first") + b"".join(msg(CH, bytes(1000), eof=False) for _ in range(4)) + msg(CH, b"end")
    events = conn.receive_data(stream, 1.0)
    assert [type(e) for e in events] == [MessageReceived, ConnectionFailed]
    assert events[0].message == b"first"
    assert type(events[1].error) is MessageTooLarge
    assert "reached 4000 bytes, over its recv_message_capacity 2500" in str(events[1].error)
    assert conn.channels[CH].receiving is None


def test_a_read_splitting_two_packets_keeps_both_parts_as_views():
    """Reads of 50,000 bytes across 64 KiB packets: a read holds the end of one packet
    and the start of the next, each often under half of the read; the frame buffer
    hands them on as one run, so together they are kept as views (a copy of the first
    part was about a quarter of the bytes), and the message arrives whole."""
    conn = open_connection(peer_payload=65536)
    message = bytes(range(256)) * 4096
    data = _stream(message, 65536)
    copied = 0
    events = []
    for start in range(0, len(data), 50_000):
        pieces = conn.channels[CH].receiving or []
        events += conn.receive_data(data[start : start + 50_000], 1.0)
        copied = max(copied, sum(len(p) for p in pieces if type(p) is not memoryview))
    assert copied < 200
    assert [e.message for e in events] == [message]
