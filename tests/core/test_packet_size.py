"""Packets that follow the link (specs/wire.md section 4, specs/connection.md section 7):
the payload a sender cuts is a quarter of the write-ahead's measured drain rate times
``write_ahead_time``, at least 1024, at most the negotiated ``max_packet_payload``.

Sans-I/O: the write-ahead is driven with a fake clock and a fake acknowledged-bytes
counter, the Connection with explicit ``now``; no sockets.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core import packet_size
from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.frame_buffer import RUN, FrameBuffer
from mconn.net.write_ahead import WINDOW, WriteAhead
from tests.helpers_core import CorePair, hello_packet, make_connection, msg, msg_payloads, open_connection

BULK, PROBE = 0x10, 0x30
CHANNELS = [
    ChannelDescriptor(BULK, priority=1, send_queue_capacity=8),
    ChannelDescriptor(PROBE, priority=10, send_queue_capacity=8),
]
AHEAD = 0.001  # Config().write_ahead_time


def measured(rate: float, ahead_time: float = AHEAD) -> WriteAhead:
    """A WriteAhead that has measured a link of ``rate`` bytes/s: full write cycles on a
    fake clock, the peer acknowledging ``rate`` bytes per second."""
    ahead = WriteAhead(ahead_time, 65536)
    now = 0.0
    acked = 0
    step = ahead_time
    for _ in range(4 * WINDOW):
        ahead.wrote(ahead.budget(), True)
        now += step
        acked += rate * step
        ahead.resumed(now, lambda acked=acked: int(acked))
    return ahead


def payload_at(rate: float) -> int:
    return packet_size.payload_for_rate(measured(rate).rate, AHEAD)


def cut(conn, now: float, budget: int, payload: int) -> bytes:
    """``data_to_send`` with packets cut at ``payload`` (as the adapter sets it)."""
    conn.set_packet_payload(payload)
    return conn.data_to_send(now, budget)


def bulk_connection(peer_payload: int = 65536):
    conn = open_connection(peer_payload=peer_payload, channels=CHANNELS)
    for _ in range(8):
        assert conn.queue_message(BULK, bytes(1 << 20))
    return conn


def test_the_write_ahead_measures_the_rate_the_tests_play():
    """The fake link is measured as the rate it plays (within 1%)."""
    for rate in (250_000, 2_500_000, 500_000_000):
        assert measured(rate).rate == pytest.approx(rate, rel=0.01)


@pytest.mark.parametrize(
    "rate, payload",
    [
        (250_000, 1024),  # 2 Mbit/s: a quarter of 250 bytes per ms, floored at 1024
        (2_500_000, 1024),  # 20 Mbit/s: 625, floored
        (20_000_000, 5000),  # 160 Mbit/s: a quarter of write_ahead_time of it
        (125_000_000, 31250),  # 1 Gbit/s
        (500_000_000, 65536),  # loopback: capped by the negotiated 64 KiB
    ],
)
def test_packets_follow_the_measured_rate_floored_and_capped(rate, payload):
    """Cut at a measured rate, every packet but a message's last carries
    min(negotiated, max(1024, rate * write_ahead_time / 4)) bytes."""
    conn = bulk_connection()
    sent = cut(conn, 1.0, 1 << 20, payload_at(rate))
    (size,) = {len(data) for _, eof, data in msg_payloads(sent) if not eof}
    assert size == pytest.approx(payload, rel=0.001)
    assert 1024 <= size <= 65536


def test_a_peer_announcing_1024_gets_1024_whatever_the_rate():
    """The negotiated maximum (the smaller hello value) caps the rate's choice."""
    conn = bulk_connection(peer_payload=1024)
    assert conn.max_packet_payload == 1024
    sent = cut(conn, 1.0, 1 << 20, payload_at(500_000_000))
    assert max(len(data) for _, _, data in msg_payloads(sent)) == 1024


def test_an_unmeasured_link_gets_16_kib_packets():
    """Without a rate (TLS, WebSocket, before the first sample) packets are 16 KiB."""
    assert packet_size.payload_for_rate(None, AHEAD) == packet_size.UNMEASURED == 16384
    assert packet_size.payload_for_rate(5e8, None) == 16384
    assert WriteAhead(AHEAD, 65536).rate is None
    conn = bulk_connection()
    sent = cut(conn, 1.0, 1 << 20, packet_size.payload_for_rate(None, AHEAD))
    assert {len(data) for _, eof, data in msg_payloads(sent) if not eof} == {16384}


def test_without_a_payload_the_core_cuts_at_the_negotiated_maximum():
    """A core whose driver does not size packets (no set_packet_payload, or None) cuts
    at the negotiated max_packet_payload."""
    conn = bulk_connection()
    sent = conn.data_to_send(1.0, 1 << 20)
    assert {len(data) for _, eof, data in msg_payloads(sent) if not eof} == {65536}
    conn.set_packet_payload(2000)
    conn.set_packet_payload(None)
    sent = conn.data_to_send(2.0, 1 << 20)
    assert {len(data) for _, eof, data in msg_payloads(sent) if not eof} == {65536}


def test_a_payload_set_before_the_hello_is_capped_once_the_peer_announces_less():
    """The adapter sets the payload when the transport connects, before the hellos:
    the negotiated size, known only then, still caps it."""
    conn = make_connection(channels=CHANNELS)
    conn.set_packet_payload(16384)
    conn.data_to_send(0.0)
    conn.receive_data(hello_packet(channels=CHANNELS, max_packet_payload=1024), 0.0)
    assert conn.queue_message(BULK, bytes(5000))
    assert {len(d) for _, _, d in msg_payloads(conn.data_to_send(0.1))} == {1024, 904}


def test_the_packet_size_follows_the_rate_as_it_changes():
    """A link that slows down gets smaller packets from the next write on: the payload
    is chosen per write, so one message's packets may differ in size."""
    conn = bulk_connection()
    fast = cut(conn, 1.0, 200_000, payload_at(500_000_000))
    slow = cut(conn, 1.1, 10_000, payload_at(250_000))
    assert {len(d) for _, _, d in msg_payloads(fast)} == {65536}
    assert {len(d) for _, _, d in msg_payloads(slow)} == {1024}


@pytest.mark.parametrize("rate", [250_000, 2_500_000, 125_000_000, 500_000_000])
def test_a_priority_message_goes_out_within_one_packet_of_bulk(rate):
    """Under a saturating bulk transfer, a write of the write-ahead's budget carries bulk
    packets of the rate's size and crosses its budget by less than one of them; a probe
    queued then is the next packet out, so it waits behind at most what was written."""
    conn = bulk_connection()
    ahead = measured(rate)
    payload = min(packet_size.payload_for_rate(ahead.rate, AHEAD), 65536)
    for turn in range(5):
        budget = ahead.budget()
        written = cut(conn, 1.0 + turn, budget, payload)
        assert {len(d) for _, _, d in msg_payloads(written)} == {payload}
        assert len(written) < budget + payload + 8  # the budget plus the packet that crosses it
    assert conn.queue_message(PROBE, b"probe")
    after = msg_payloads(cut(conn, 7.0, ahead.budget(), payload))
    assert after[0] == (PROBE, True, b"probe")


def test_two_default_cores_carry_a_large_message_in_large_packets():
    """Two default Configs negotiate 64 KiB; a 1 MiB message crosses in 16 packets and
    arrives whole; one configured with 1024 makes both sides use 1024."""
    pair = CorePair.make()
    pair.pump(0.0)
    message = bytes(range(256)) * 4096
    assert pair.a.queue_message(0x20, message)
    _, events_b = pair.pump(0.1)
    assert [e.message for e in events_b] == [message]
    packets = msg_payloads(b"".join(pair.sent_by_a[1:]))
    assert [len(d) for _, _, d in packets] == [65536] * 16
    small = CorePair.make(config_b=Config(max_packet_payload=1024))
    small.pump(0.0)
    assert small.a.queue_message(0x20, message)
    _, events_b = small.pump(0.1)
    assert [e.message for e in events_b] == [message]
    assert {len(d) for _, _, d in msg_payloads(b"".join(small.sent_by_a[1:]))} == {1024}


# -- the receiving side: large payloads streamed into reassembly -----------------------


def _messages(buffer: FrameBuffer, chunks: list[bytes]) -> list[tuple[int, bytes]]:
    """Feed ``chunks``; the whole messages per channel the packets add up to."""
    partial: dict[int, bytes] = {}
    done = []
    for chunk in chunks:
        packets, error = buffer.feed(chunk)
        assert error is None
        for p in packets:
            if p[0] == RUN:
                partial[p[1]] = partial.get(p[1], b"") + b"".join(bytes(v) for v in p[2])
            else:
                data = partial.pop(p[1], b"") + bytes(p[3])
                if p[2]:
                    done.append((p[1], data))
                else:
                    partial[p[1]] = data
    return done


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=6),
    payload=st.sampled_from([1024, 5000, 16384]),
    cuts=st.lists(st.integers(1, 70_000), max_size=8),
    stream_min=st.sampled_from([0, 1, 4096]),
)
def test_streamed_payloads_add_up_to_the_same_messages(sizes, payload, cuts, stream_min):
    """Cut anywhere, a stream of packets of any payload size, two channels' packets
    interleaved, read with streaming gives the same messages per channel as the
    declared packets do, and keeps nothing once the stream is whole."""
    messages = [(0x20 + i % 2, bytes([i]) * size) for i, size in enumerate(sizes)]
    packets: dict[int, list[bytes]] = {0x20: [], 0x21: []}
    for channel, message in messages:
        for start in range(0, max(len(message), 1), payload):
            part = message[start : start + payload]
            packets[channel].append(msg(channel, part, eof=start + payload >= len(message)))
    stream = b""
    while packets[0x20] or packets[0x21]:
        for channel in (0x20, 0x21):
            if packets[channel]:
                stream += packets[channel].pop(0)
    buffer = FrameBuffer(max_payload=16384, default_extension_limit=1024, stream_payloads=True)
    buffer.STREAM_MIN = stream_min
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    got = _messages(buffer, chunks)
    for channel in (0x20, 0x21):
        assert [m for c, m in got if c == channel] == [m for c, m in messages if c == channel]
    assert buffer.buffered == 0


def test_a_connection_keeps_only_a_header_of_a_large_packet_split_by_reads():
    """A 64 KiB msg packet fed in 1000-byte reads: the frame buffer never holds its
    payload (it goes into the channel's reassembly as it comes), and the message
    arrives whole once the last byte does."""
    conn = open_connection(peer_payload=65536)
    message = bytes(range(256)) * 256
    data = msg(0x20, message)
    events = []
    for start in range(0, len(data), 1000):
        events += conn.receive_data(data[start : start + 1000], 1.0)
        assert conn._buffer.buffered <= 12
    assert [e.message for e in events] == [message]
