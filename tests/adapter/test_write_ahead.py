"""The write-ahead (specs/connection.md section 7): what the protocol has written into the
transport and not yet seen taken stays within one write, sized to the drain rate.

A ``SocketLikeTransport`` buffers and pauses as Twisted's TCP transport does (pause past
``bufferSize``, resume once a drain has emptied it); a Clock and ``drain`` play a link of
a given rate, with no kernel queue in between.
"""

import pytest
from twisted.internet.testing import StringTransport

from helpers import open_switch_connection
from mconn import ChannelDescriptor, Config

BULK, PROBE = 0x10, 0x30
CHANNELS = [
    ChannelDescriptor(BULK, priority=1, send_queue_capacity=8),
    ChannelDescriptor(PROBE, priority=10, send_queue_capacity=8),
]
#: A msg packet of 1024 bytes (the smallest adaptive payload), header included, is under this.
PACKET = 1024 + 16


def packet_at(rate: float, config: Config) -> float:
    """The largest msg packet, header included, cut at a measured drain rate: payloads
    follow the rate (``mconn.core.packet_size``: a quarter of write_ahead_time of it, at
    least 1024)."""
    return max(1024, rate * config.write_ahead_time / 4) + 16


STEP = 0.001


class SocketLikeTransport(StringTransport):
    """A StringTransport that pauses and resumes its producer the way Twisted's
    FileDescriptor does, and records the most bytes it ever held."""

    bufferSize = 65536
    producerPaused = False

    def __init__(self) -> None:
        super().__init__()
        self.most_held = 0
        self.taken = b""

    def write(self, data) -> None:
        super().write(data)
        self.most_held = max(self.most_held, len(self.value()))
        if self.producer is not None and len(self.value()) > self.bufferSize and not self.producerPaused:
            self.producerPaused = True
            self.producer.pauseProducing()

    def drain(self, count: int) -> None:
        """The link takes up to ``count`` bytes; once the buffer is empty a paused
        producer is resumed."""
        data = self.value()
        self.taken += data[:count]
        self.clear()
        self.io.write(data[count:])
        if not data[count:] and self.producerPaused:
            self.producerPaused = False
            self.producer.resumeProducing()


def run_link(h, transport, rate: float, seconds: float) -> None:
    """``seconds`` of a link of ``rate`` bytes/s, with the bulk channel kept full."""
    for _ in range(round(seconds / STEP)):
        while h.peer.try_send(BULK, bytes(65536)):
            pass
        h.clock.advance(STEP)
        transport.drain(round(rate * STEP))


def saturated(config: Config):
    transport = SocketLikeTransport()
    h = open_switch_connection(channels=CHANNELS, transport=transport, config=config)
    for _ in range(8):
        assert h.peer.try_send(BULK, bytes(65536))
    transport.drain(len(transport.value()))  # the handshake's bytes: the bulk goes next
    return h, transport


@pytest.mark.parametrize("rate", [250_000, 2_500_000])  # 2 and 20 Mbit/s
def test_the_transport_holds_one_write_sized_to_the_drain_rate(rate):
    """Once the rate is measured, the transport never holds more than write_ahead_time
    of it (at least one packet) plus the packet that crosses the budget."""
    config = Config()
    h, transport = saturated(config)
    assert transport.most_held > 60000  # before any measurement: write_batch_bytes
    run_link(h, transport, rate, 0.5)
    transport.most_held = 0
    run_link(h, transport, rate, 1.0)
    assert 0 < transport.most_held <= max(1, rate * config.write_ahead_time) + packet_at(rate, config)


def test_a_probe_waits_behind_at_most_one_write():
    """A high-priority message queued mid-transfer follows the write already in the
    transport, not 64 KiB of bulk data."""
    rate = 2_500_000
    h, transport = saturated(Config())
    run_link(h, transport, rate, 0.5)
    probe = b"probe!" * 10
    taken_before = len(transport.taken)
    assert h.peer.try_send(PROBE, probe)
    run_link(h, transport, rate, 0.05)
    ahead = transport.taken.index(probe) - taken_before
    assert 0 <= ahead <= rate * Config().write_ahead_time + 2 * packet_at(rate, Config())


def test_a_message_at_a_time_is_written_without_a_pause_until_a_write_ahead_adds_up():
    """A write short of its budget (one small message) leaves the protocol producing, so
    a round trip costs no pause and resume; once such writes since the last resume add
    up to the write-ahead size, the protocol pauses, and the transport never holds more."""
    transport = SocketLikeTransport()
    h = open_switch_connection(channels=CHANNELS, transport=transport, config=Config(write_batch_bytes=4096))
    transport.drain(len(transport.value()))
    assert h.peer.try_send(PROBE, bytes(100))
    assert transport.producerPaused is False and len(transport.value()) > 100
    transport.most_held = 0
    for _ in range(100):
        h.peer.try_send(PROBE, bytes(100))
    assert transport.producerPaused is True  # 100 small writes passed 4096 bytes: paused
    # (the count since the last resume includes the handshake's bytes, hence no exact floor)
    assert 2048 < transport.most_held <= 4096 + PACKET
    transport.drain(len(transport.value()))
    assert transport.producerPaused is False and transport.value()  # resumed: the rest goes on


def test_without_write_ahead_time_the_transport_holds_a_whole_batch():
    """write_ahead_time=None keeps the old write path: write_batch_bytes at a time, and
    the transport pauses us only past its bufferSize."""
    h, transport = saturated(Config(write_ahead_time=None))
    run_link(h, transport, 250_000, 1.0)
    transport.most_held = 0
    run_link(h, transport, 250_000, 1.0)
    assert transport.most_held > 65536


def test_a_transport_that_does_not_pause_like_twisted_gets_whole_batches():
    """A transport without producerPaused (a StringTransport) is written in whole batches,
    with no write-ahead pauses."""
    transport = StringTransport()
    h = open_switch_connection(channels=CHANNELS, transport=transport, config=Config(write_batch_bytes=8192))
    assert h.peer.try_send(BULK, bytes(65536))
    assert 65536 < len(transport.value()) < 65536 + 64 * 16


@pytest.mark.parametrize("value", [0, -0.001, "1", True, float("inf")])
def test_write_ahead_time_must_be_a_positive_number_or_none(value):
    with pytest.raises(ValueError, match="write_ahead_time"):
        Config(write_ahead_time=value)
