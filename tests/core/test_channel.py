"""ChannelDescriptor validation, Channel queues, chunking and reassembly (specs/wire.md 4, 5)."""

import pytest

from mconn.core.channel import DEFAULT_RECV_MESSAGE_CAPACITY, Channel, ChannelDescriptor, msg_header
from mconn.errors import MessageTooLarge
from tests.helpers_core import msg_payloads, split_packets

# -- ChannelDescriptor ----------------------------------------------------------------------


def test_descriptor_defaults_follow_the_reference():
    """ChannelDescriptor defaults match the reference: priority 1, queue 1, 22020096-byte messages."""
    d = ChannelDescriptor(0x20)
    assert (d.priority, d.send_queue_capacity, d.recv_message_capacity) == (1, 1, 22020096)
    assert DEFAULT_RECV_MESSAGE_CAPACITY == 22020096


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(id=256), ["channel id", "256"]),
        (dict(id=-1), ["channel id", "-1"]),
        (dict(id="a"), ["channel id", "'a'"]),
        (dict(id=1.0), ["channel id", "1.0"]),
        (dict(id=0x20, priority=0), ["0x20", "priority", "0"]),
        (dict(id=0x20, priority=1.5), ["0x20", "priority", "1.5"]),
        (dict(id=0x21, send_queue_capacity=0), ["0x21", "send_queue_capacity", "0"]),
        (dict(id=0x22, recv_message_capacity=-1), ["0x22", "recv_message_capacity", "-1"]),
    ],
)
def test_descriptor_validation_names_field_and_value(kwargs, words):
    """A bad id, priority or capacity is a ValueError naming the channel, the field and the value."""
    with pytest.raises(ValueError) as info:
        ChannelDescriptor(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_descriptor_extremes_are_accepted():
    """Channel ids 0 and 255, a large priority and recv_message_capacity 0 are all valid."""
    assert ChannelDescriptor(0).id == 0
    assert ChannelDescriptor(255, priority=1000, recv_message_capacity=0).id == 255


# -- msg_header -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "channel_id, eof, length, expected",
    [
        (0x20, True, 5, "03 20 01 01 05"),
        (0x20, True, 0, "03 20 01 00"),
        (0x20, True, 300, "03 20 01 02 01 2c"),
        (0x20, False, 1024, "03 20 00 02 04 00"),
        (0x20, True, 976, "03 20 01 02 03 d0"),
        (0xFF, False, 65536, "03 ff 00 03 01 00 00"),
    ],
)
def test_msg_header(channel_id, eof, length, expected):
    """msg_header encodes channel, eof and length as in the wire spec, length as a minimal varint."""
    assert msg_header(channel_id, eof, length) == bytes.fromhex(expected)


# -- send queue -----------------------------------------------------------------------------


def test_send_queue_capacity_counts_waiting_messages_not_the_one_being_sent():
    """send_queue_capacity bounds the messages waiting; once one goes out, a new one fits."""
    channel = Channel(ChannelDescriptor(0x20, send_queue_capacity=2))
    assert channel.enqueue(b"1") and channel.enqueue(b"2")
    assert not channel.enqueue(b"3")
    assert channel.queue_depth == 2

    channel.emit([], payload=1, budget=1)  # message "1" goes out whole; "2" still waits
    assert channel.queue_depth == 1
    assert channel.enqueue(b"3")
    assert not channel.enqueue(b"4")


def test_message_being_cut_is_not_counted_against_the_queue():
    """A message partly sent no longer counts against send_queue_capacity."""
    channel = Channel(ChannelDescriptor(0x20, send_queue_capacity=1))
    assert channel.enqueue(b"a" * 100)
    channel.emit([], payload=10, budget=1)  # first packet of the message; the rest is pending
    assert channel.sending is not None and channel.queue_depth == 1
    assert channel.enqueue(b"b")
    assert not channel.enqueue(b"c")
    assert channel.queue_depth == 2


# -- chunking -------------------------------------------------------------------------------


def _emit_all(channel: Channel, payload: int) -> bytes:
    parts: list = []
    while channel.is_pending:
        channel.emit(parts, payload, budget=1 << 30)
    return b"".join(parts)


@pytest.mark.parametrize(
    "length, payload, sizes",
    [
        (0, 1024, [0]),
        (1, 1024, [1]),
        (1024, 1024, [1024]),
        (1025, 1024, [1024, 1]),
        (2048, 1024, [1024, 1024]),
        (2000, 1024, [1024, 976]),
        (10, 3, [3, 3, 3, 1]),
    ],
)
def test_every_packet_but_the_last_carries_exactly_the_payload(length, payload, sizes):
    """A message is cut into full-payload packets and a shorter last one with eof; the pieces rejoin to it."""
    channel = Channel(ChannelDescriptor(0x20))
    message = bytes(range(256)) * (length // 256) + bytes(range(length % 256))
    channel.enqueue(message)
    packets = msg_payloads(_emit_all(channel, payload))
    assert [len(data) for _, _, data in packets] == sizes
    assert [eof for _, eof, _ in packets] == [False] * (len(sizes) - 1) + [True]
    assert {ch for ch, _, _ in packets} == {0x20}
    assert b"".join(data for _, _, data in packets) == message


def test_emit_respects_the_budget_and_resumes_where_it_stopped():
    """emit stops once the byte budget is reached (always at least one packet) and the next call resumes."""
    channel = Channel(ChannelDescriptor(0x20))
    channel.enqueue(b"x" * 5000)
    parts: list = []
    wire, finished = channel.emit(parts, payload=1000, budget=1500)
    # 1006 bytes per full packet: two packets reach the budget of 1500.
    assert (wire, finished) == (2012, 0)
    assert [len(d) for _, _, d in msg_payloads(b"".join(parts))] == [1000, 1000]
    parts = []
    wire, finished = channel.emit(parts, payload=1000, budget=1)
    assert (wire, finished) == (1006, 0)  # at least one packet, however small the budget
    parts = []
    wire, finished = channel.emit(parts, payload=1000, budget=1 << 20)
    assert finished == 1
    assert [(len(d), eof) for _, eof, d in msg_payloads(b"".join(parts))] == [(1000, False), (1000, True)]
    assert not channel.is_pending


def test_emit_goes_on_to_the_next_message_within_the_budget():
    """Within one budget, emit sends several queued messages back to back and counts them in stats."""
    channel = Channel(ChannelDescriptor(0x20, send_queue_capacity=3))
    for m in (b"one", b"two", b""):
        channel.enqueue(m)
    parts: list = []
    wire, finished = channel.emit(parts, payload=1024, budget=1 << 20)
    data = b"".join(parts)
    assert (wire, finished) == (len(data), 3)
    assert data == bytes.fromhex("03 20 01 01 03") + b"one" + bytes.fromhex("03 20 01 01 03") + b"two" + bytes.fromhex(
        "03 20 01 00"
    )
    assert (channel.stats.messages_sent, channel.stats.bytes_sent) == (3, 6)  # message bytes, not the headers


def test_emitted_bytes_are_whole_packets_for_the_declaration():
    """Whatever the message sizes, emitted bytes split into whole packets by the declaration."""
    channel = Channel(ChannelDescriptor(0x7F, send_queue_capacity=5))
    for size in (0, 1, 700, 1400, 3001):
        channel.enqueue(b"q" * size)
    data = _emit_all(channel, payload=700)
    assert b"".join(split_packets(data)) == data


# -- reassembly -----------------------------------------------------------------------------


def test_reassembly_delivers_on_eof_only():
    """Packets are joined until one with eof; only then is the message delivered and counted."""
    channel = Channel(ChannelDescriptor(0x20))
    assert channel.reassemble(0, memoryview(b"hel")) is None
    assert channel.reassemble(0, memoryview(b"")) is None
    assert channel.reassemble(1, memoryview(b"lo")) == b"hello"
    assert channel.reassemble(1, memoryview(b"")) == b""
    assert channel.reassemble(1, memoryview(b"x")) == b"x"
    assert (channel.stats.messages_received, channel.stats.bytes_received) == (3, 6)


def test_reassembled_message_is_a_copy_of_the_payload():
    """A delivered message is its own bytes, unaffected by later changes to the receive buffer."""
    channel = Channel(ChannelDescriptor(0x20))
    source = bytearray(b"abc")
    message = channel.reassemble(1, memoryview(source))
    source[:] = b"zzz"
    assert message == b"abc" and isinstance(message, bytes)


def test_message_of_exactly_recv_message_capacity_is_accepted():
    """A message of exactly recv_message_capacity bytes is delivered."""
    channel = Channel(ChannelDescriptor(0x20, recv_message_capacity=10))
    assert channel.reassemble(0, memoryview(b"12345")) is None
    assert channel.reassemble(1, memoryview(b"67890")) == b"1234567890"


def test_message_over_recv_message_capacity_is_refused_before_it_is_kept():
    """MessageTooLarge as soon as the parts exceed the capacity, naming both; nothing of it is kept."""
    channel = Channel(ChannelDescriptor(0x20, recv_message_capacity=10))
    channel.reassemble(0, memoryview(b"123456"))
    with pytest.raises(MessageTooLarge) as info:
        channel.reassemble(0, memoryview(b"789012"))
    message = str(info.value)
    assert "0x20" in message and "12" in message and "recv_message_capacity 10" in message
    # Nothing of the refused message was kept: the next message starts from scratch.
    assert channel.reassemble(1, memoryview(b"ok")) == b"ok"


def test_single_packet_over_capacity_is_refused():
    """A single eof packet over recv_message_capacity is MessageTooLarge; an empty one is fine."""
    channel = Channel(ChannelDescriptor(0x21, recv_message_capacity=0))
    assert channel.reassemble(1, memoryview(b"")) == b""
    with pytest.raises(MessageTooLarge, match="0x21.* 1 bytes"):
        channel.reassemble(1, memoryview(b"x"))
