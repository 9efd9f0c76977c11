"""The priority scheduler (specs/connection.md section 4).

Lowest ``recently_sent / priority`` goes next, ties to the channel declared first,
``recently_sent`` decays continuously with tau = 2 / ln(1.25) s.
"""

import math

import pytest

from mconn.core.channel import DECAY_TAU, Channel, ChannelDescriptor, Scheduler
from tests.helpers_core import msg_payloads


def _channels(*specs):
    """Channels from (id, priority) pairs, with room for a few queued messages each."""
    return [Channel(ChannelDescriptor(i, priority=p, send_queue_capacity=4)) for i, p in specs]


def _fill(channels, size=4096):
    for channel in channels:
        while channel.enqueue(b"m" * size):
            pass


def _first_channel(parts) -> int:
    return msg_payloads(b"".join(parts))[0][0]


def test_decay_constant_is_point_eight_per_two_seconds():
    """DECAY_TAU makes recently_sent decay by a factor of 0.8 every 2 seconds."""
    assert DECAY_TAU == pytest.approx(2 / math.log(1.25))
    assert math.exp(-2 / DECAY_TAU) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "priorities, shares",
    [
        ((1, 3), (0.25, 0.75)),
        ((1, 2, 5), (0.125, 0.25, 0.625)),
        ((4, 4), (0.5, 0.5)),
    ],
)
def test_saturated_channels_share_bytes_by_priority(priorities, shares):
    """Channels that always have data share the bytes sent in proportion to their priorities."""
    channels = _channels(*[(0x10 + i, p) for i, p in enumerate(priorities)])
    scheduler = Scheduler(channels, now=0.0)
    now = 0.0
    for _ in range(1500):
        _fill(channels)
        scheduler.next_packets(now, payload=1024, budget=8192)
        now += 0.005
    total = sum(c.stats.bytes_sent for c in channels)
    assert total >= 1500 * 8192
    for channel, share in zip(channels, shares, strict=True):
        assert channel.stats.bytes_sent / total == pytest.approx(share, abs=0.01)


def test_shares_hold_packet_by_packet_too():
    """With one packet per call, the priority shares still hold to within 1%."""
    channels = _channels((0x01, 1), (0x02, 3))
    scheduler = Scheduler(channels, now=0.0)
    sent = {0x01: 0, 0x02: 0}
    for step in range(4000):
        _fill(channels)
        parts, _ = scheduler.next_packets(step * 0.001, payload=1024, budget=1)
        for channel_id, _, data in msg_payloads(b"".join(parts)):
            sent[channel_id] += len(data)
    assert sent[0x01] / (sent[0x01] + sent[0x02]) == pytest.approx(0.25, abs=0.01)


def test_idle_channel_new_message_goes_out_next():
    """A new message on an idle low-priority channel goes out before a busy high-priority one."""
    busy, idle = _channels((0x40, 10), (0x20, 1))
    scheduler = Scheduler([busy, idle], now=0.0)
    now = 0.0
    for _ in range(200):
        _fill([busy])
        parts, _ = scheduler.next_packets(now, payload=1024, budget=4096)
        assert {ch for ch, _, _ in msg_payloads(b"".join(parts))} == {0x40}
        now += 0.01
    idle.enqueue(b"urgent")
    _fill([busy])
    parts, _ = scheduler.next_packets(now, payload=1024, budget=1)
    assert msg_payloads(b"".join(parts)) == [(0x20, True, b"urgent")]


def test_channel_idle_for_long_goes_first_even_after_a_big_burst():
    """recently_sent decays: a big burst long ago weighs less than a small one just now."""
    old, recent = _channels((0x01, 1), (0x02, 1))
    scheduler = Scheduler([old, recent], now=0.0)
    old.enqueue(b"o" * 10000)
    scheduler.next_packets(0.0, payload=1024, budget=1 << 20)
    recent.enqueue(b"r" * 1000)
    scheduler.next_packets(30.0, payload=1024, budget=1 << 20)
    assert scheduler.recently_sent(old, 30.0) < scheduler.recently_sent(recent, 30.0)
    # Without decay the old channel (about 10000 bytes) would wait for the recent one (1000).
    old.enqueue(b"o2")
    recent.enqueue(b"r2")
    parts, _ = scheduler.next_packets(30.0, payload=1024, budget=1)
    assert _first_channel(parts) == 0x01


def test_recently_sent_decays_continuously():
    """recently_sent decays continuously with time, and new bytes add at full weight."""
    channel = Channel(ChannelDescriptor(0x20))
    scheduler = Scheduler([channel], now=100.0)
    channel.enqueue(b"x" * 1000)
    _, wire = scheduler.next_packets(100.0, payload=1024, budget=1 << 20)
    assert wire == 1006  # 03 20 01 02 03 e8 + 1000
    assert scheduler.recently_sent(channel, 100.0) == pytest.approx(1006)
    assert scheduler.recently_sent(channel, 101.0) == pytest.approx(1006 * 0.8**0.5)
    assert scheduler.recently_sent(channel, 102.0) == pytest.approx(1006 * 0.8)
    assert scheduler.recently_sent(channel, 110.0) == pytest.approx(1006 * 0.8**5)
    # Bytes sent later add at full weight on top of the decayed count.
    channel.enqueue(b"y" * 95)
    _, wire = scheduler.next_packets(102.0, payload=1024, budget=1 << 20)
    assert wire == 100
    assert scheduler.recently_sent(channel, 102.0) == pytest.approx(1006 * 0.8 + 100)


def test_recently_sent_counts_header_bytes():
    """recently_sent counts the packet header too, even for an empty message."""
    channel = Channel(ChannelDescriptor(0x20))
    scheduler = Scheduler([channel], now=0.0)
    channel.enqueue(b"")
    scheduler.next_packets(0.0, payload=1024, budget=1)
    assert scheduler.recently_sent(channel, 0.0) == pytest.approx(4)  # 03 20 01 00


@pytest.mark.parametrize("order", [(0x40, 0x20), (0x20, 0x40)])
def test_ties_go_to_the_channel_declared_first(order):
    """Between equal channels with equal history, the one declared first goes first."""
    channels = _channels(*[(i, 2) for i in order])
    scheduler = Scheduler(channels, now=0.0)
    _fill(channels)
    parts, _ = scheduler.next_packets(0.0, payload=1024, budget=1)
    assert _first_channel(parts) == order[0]


def test_equal_priorities_alternate_packet_by_packet():
    """Two saturated channels of equal priority alternate packet by packet."""
    channels = _channels((0x01, 1), (0x02, 1))
    scheduler = Scheduler(channels, now=0.0)
    _fill(channels)
    order = []
    for _ in range(6):
        parts, _ = scheduler.next_packets(0.0, payload=1024, budget=1)
        order.append(_first_channel(parts))
    assert order == [0x01, 0x02, 0x01, 0x02, 0x01, 0x02]


def test_nothing_pending_sends_nothing():
    """With nothing queued, pending() is False and next_packets returns nothing."""
    channels = _channels((0x01, 1))
    scheduler = Scheduler(channels, now=0.0)
    assert not scheduler.pending()
    assert scheduler.next_packets(1.0, payload=1024, budget=1000) == ([], 0)


def test_budget_bounds_a_call_to_within_one_packet():
    """One next_packets call sends at least the budget and at most one packet more."""
    channels = _channels((0x01, 1), (0x02, 5))
    scheduler = Scheduler(channels, now=0.0)
    _fill(channels)
    for budget in (1, 500, 1030, 5000, 20000):
        parts, sent = scheduler.next_packets(0.0, payload=1024, budget=budget)
        assert sent == len(b"".join(parts))
        assert budget <= sent < budget + 1030


def test_scheduler_works_after_hours_without_a_call():
    """Long idle periods happen (ping_interval is configurable); the decay must not overflow."""
    channel = Channel(ChannelDescriptor(0x20))
    scheduler = Scheduler([channel], now=0.0)
    channel.enqueue(b"after a long sleep")
    parts, sent = scheduler.next_packets(7200.0, payload=1024, budget=1000)
    assert msg_payloads(b"".join(parts)) == [(0x20, True, b"after a long sleep")]


def test_scheduler_keeps_decaying_over_a_long_busy_run():
    """Hours of steady traffic: the stored counts are rescaled and stay correct."""
    low, high = _channels((0x01, 1), (0x02, 3))
    scheduler = Scheduler([low, high], now=0.0)
    now = 0.0
    while now < 4 * 3600:
        _fill([low, high])
        scheduler.next_packets(now, payload=1024, budget=8192)
        now += 30.0
    start = {c.id: c.stats.bytes_sent for c in (low, high)}
    for _ in range(500):
        _fill([low, high])
        scheduler.next_packets(now, payload=1024, budget=8192)
        now += 0.01
    low_bytes = low.stats.bytes_sent - start[0x01]
    high_bytes = high.stats.bytes_sent - start[0x02]
    assert low_bytes / (low_bytes + high_bytes) == pytest.approx(0.25, abs=0.02)
    assert math.isfinite(scheduler.recently_sent(low, now))
