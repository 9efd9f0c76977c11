"""Backpressure and rate limits over a StringTransport and a Clock (every buffer bounded, backpressure explicit).

The protocol is the transport's streaming IPushProducer: while paused it pulls nothing
from the channel queues, so full queues make try_send return False instead of growing a
buffer. send_rate paces writes with a timer; recv_rate pauses reading.
"""

from helpers import AutoPausingTransport, message_packets, messages_in, msg_packet, open_switch_connection
from mconn import ChannelDescriptor, Config


def depth(peer, channel_id):
    return {c.channel_id: c.queue_depth for c in peer.stats.channels}[channel_id]


def test_paused_protocol_pulls_nothing_from_the_queues():
    """While paused, queued messages stay queued and nothing is written."""
    h = open_switch_connection()
    h.proto.pauseProducing()
    assert h.peer.try_send(0x21, b"one")
    assert h.peer.try_send(0x21, b"two")
    assert h.transport.value() == b""
    assert depth(h.peer, 0x21) == 2
    h.clock.advance(1)
    assert h.transport.value() == b""
    assert depth(h.peer, 0x21) == 2


def test_try_send_returns_false_when_the_queue_is_full():
    """A channel holds send_queue_capacity messages while paused; one more is refused."""
    h = open_switch_connection()  # 0x20 capacity 1, 0x21 capacity 2
    h.proto.pauseProducing()
    assert h.peer.try_send(0x20, b"a")
    assert not h.peer.try_send(0x20, b"b")
    assert h.peer.try_send(0x21, b"c")
    assert h.peer.try_send(0x21, b"d")
    assert not h.peer.try_send(0x21, b"e")
    assert depth(h.peer, 0x20) == 1 and depth(h.peer, 0x21) == 2


def test_resume_producing_writes_the_rest():
    """resumeProducing writes everything that was queued while paused, in order per channel."""
    h = open_switch_connection()
    h.proto.pauseProducing()
    h.peer.try_send(0x20, b"a")
    h.peer.try_send(0x21, b"c")
    h.peer.try_send(0x21, b"d")
    h.proto.resumeProducing()
    got = messages_in(h.take())
    assert sorted(got) == [(0x20, b"a"), (0x21, b"c"), (0x21, b"d")]
    assert [m for ch, m in got if ch == 0x21] == [b"c", b"d"]
    assert depth(h.peer, 0x20) == 0 and depth(h.peer, 0x21) == 0


def test_resume_producing_also_writes_sends_that_were_waiting():
    """A send() that waited for room is written by the resumeProducing that made room.

    Without this the message sits in the queue until some unrelated event (a packet from
    the peer, the keepalive timer) pumps again: up to ping_interval later.
    """
    h = open_switch_connection()
    h.proto.pauseProducing()
    assert h.peer.try_send(0x20, b"first")
    d = h.peer.send(0x20, b"second")
    assert not d.called
    h.proto.resumeProducing()
    assert d.result is True
    assert messages_in(h.take()) == [(0x20, b"first"), (0x20, b"second")]
    assert depth(h.peer, 0x20) == 0


def test_auto_pausing_transport_stops_the_scheduler():
    """A transport that pauses when its buffer passes N bytes gets a bounded write; the rest waits."""
    transport = AutoPausingTransport(limit=4096)
    channels = [ChannelDescriptor(0x30, send_queue_capacity=4)]
    h = open_switch_connection(
        channels=channels, transport=transport, config=Config(write_batch_bytes=2048, max_packet_payload=1024)
    )
    big = bytes(range(256)) * 64  # 16 KiB
    assert h.peer.try_send(0x30, big)
    first = transport.value()
    assert 4096 < len(first) <= 4096 + 2048 + 1100  # stopped soon after the limit
    assert transport.producerState == "paused"
    assert depth(h.peer, 0x30) == 1  # still being sent
    h.clock.advance(5)
    assert transport.value() == first  # no timer sneaks data out while paused
    data = b""
    for _ in range(100):
        data += transport.drain()  # takes what was written, then resumes the producer
        if depth(h.peer, 0x30) == 0 and transport.producerState == "producing":
            break
    data += transport.value()
    assert messages_in(data) == [(0x30, big)]


def test_queues_fill_while_the_transport_is_paused():
    """With the transport paused mid-message, try_send fills the queue and then refuses."""
    transport = AutoPausingTransport(limit=1000)
    channels = [ChannelDescriptor(0x30, send_queue_capacity=2)]
    h = open_switch_connection(channels=channels, transport=transport, config=Config(write_batch_bytes=1024))
    assert h.peer.try_send(0x30, b"x" * 20000)
    assert h.peer.try_send(0x30, b"y")
    assert h.peer.try_send(0x30, b"z")
    assert not h.peer.try_send(0x30, b"refused")
    assert depth(h.peer, 0x30) == 3


def test_recv_rate_pauses_reading():
    """Bytes beyond recv_rate's burst pause the transport until the rate allows more."""
    h = open_switch_connection(config=Config(recv_rate=1000))
    h.feed(message_packets(0x20, bytes(4970)))  # 5000 bytes: 5 msg packets (pings would be a flood)
    assert h.transport.producerState == "paused"
    # 5000 bytes against a 2068-byte burst at 1000 B/s: about 2.9 s of debt.
    h.clock.advance(2.8)
    assert h.transport.producerState == "paused"
    h.clock.advance(0.2)
    assert h.transport.producerState == "producing"


def test_recv_rate_does_not_pause_within_the_burst():
    """A read within the recv_rate burst leaves the transport producing."""
    h = open_switch_connection(config=Config(recv_rate=1000))
    h.feed(msg_packet(0x20, bytes(94)))  # 100 bytes
    assert h.transport.producerState == "producing"


def write_log(h):
    """Record (time, bytes) of every transport write."""
    log = []
    write = h.transport.write

    def logging_write(data):
        log.append((h.clock.seconds(), len(data)))
        write(data)

    h.transport.write = logging_write
    return log


def test_send_rate_limits_bytes_per_second_smoothly():
    """send_rate holds in every 100 ms window, from the first one on, without stalls or lumps."""
    rate = 100_000
    channels = [ChannelDescriptor(0x30, send_queue_capacity=10)]
    h = open_switch_connection(channels=channels, config=Config(send_rate=rate, max_packet_payload=1024))
    log = write_log(h)
    for _ in range(5):
        assert h.peer.try_send(0x30, b"m" * 40_000)  # 200 kB: 2 s at the rate
    h.clock.pump([0.001] * 1000)  # one second in 1 ms steps
    windows = [sum(n for t, n in log if k / 10 <= t < (k + 1) / 10) for k in range(10)]
    packet = 1024 + 6
    burst = 2068
    # The first window may add the initial burst; none may be short (a stall) or long (a lump).
    assert rate / 10 - 2 * packet <= windows[0] <= rate / 10 + burst + 2 * packet, windows
    for got in windows[1:]:
        assert rate / 10 - 2 * packet <= got <= rate / 10 + 2 * packet, windows
    total = sum(n for t, n in log)
    assert abs(total - (rate + burst)) <= 2 * packet


def test_send_rate_without_contention_keeps_latency_low():
    """A small message under send_rate, with an empty bucket, goes out at once."""
    channels = [ChannelDescriptor(0x30, send_queue_capacity=10)]
    h = open_switch_connection(channels=channels, config=Config(send_rate=100_000))
    assert h.peer.try_send(0x30, b"quick")
    assert messages_in(h.take()) == [(0x30, b"quick")]
