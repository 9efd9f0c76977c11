"""Send-queue delay samples of a channel (mconn/core/channel.py, ``SendDelay``).

A channel with a SendDelay stamps one queued message in ``every`` while none of its
stamps is in flight, and observes the time from the stamp to the ``emit`` that hands the
message's last packet on. The clock is a plain function the test moves by hand.
"""

import pytest

from mconn.core.channel import (
    SEND_DELAY_BUCKETS,
    Channel,
    ChannelDescriptor,
    Scheduler,
    SendDelay,
    send_delay_of,
    watch_send_delay,
)

PAYLOAD = 1024


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def channel_with(delay, capacity=64):
    channel = Channel(ChannelDescriptor(0x20, send_queue_capacity=capacity))
    channel.set_send_delay(delay)
    return channel


def drain(channel, budget=PAYLOAD * 4):
    """Emit until the channel has nothing pending; the number of emit calls."""
    calls = 0
    while channel.is_pending:
        channel.emit([], PAYLOAD, budget)
        calls += 1
        assert calls < 10_000
    return calls


def test_a_sampled_message_is_observed_when_its_last_packet_is_emitted_not_before():
    """A message of three packets queued at t=100 and cut over emits at 100.5 and 102.25 is
    observed once, 2.25 s, in the 2.5 s bucket."""
    clock = Clock()
    delay = SendDelay(clock, every=1)
    channel = channel_with(delay)
    assert channel.enqueue(b"m" * (PAYLOAD * 2 + 10))
    clock.now = 100.5
    channel.emit([], PAYLOAD, PAYLOAD)  # one packet: not finished
    assert delay.count == 0
    clock.now = 102.25
    channel.emit([], PAYLOAD, PAYLOAD * 4)
    assert (delay.count, delay.total) == (1, pytest.approx(2.25))
    index = SEND_DELAY_BUCKETS.index(2.5)
    assert delay.counts[index] == 1 and sum(delay.counts) == 1
    assert delay.cumulative()[index - 1][1] == 0 and delay.cumulative()[-1] == (float("inf"), 1)


def test_the_stamp_follows_its_message_behind_those_queued_before_it():
    """With two messages waiting (one half sent), the third queued is the one stamped: it
    is observed when it is finished, not when the first two are."""
    clock = Clock()
    delay = SendDelay(clock, every=1)
    channel = channel_with(None)
    channel.enqueue(b"a" * (PAYLOAD * 2))
    channel.enqueue(b"b" * 10)
    channel.emit([], PAYLOAD, PAYLOAD)  # "a" is being sent, "b" waits
    channel.set_send_delay(delay)
    clock.now = 101.0
    channel.enqueue(b"c" * 10)  # stamped at 101
    clock.now = 103.0
    channel.emit([], PAYLOAD, PAYLOAD + 20)  # finishes "a", then "b": not yet "c"
    assert channel.queue_depth == 1 and delay.count == 0
    clock.now = 104.0
    drain(channel)
    assert (delay.count, delay.total) == (1, pytest.approx(3.0))


def test_one_message_in_every_is_stamped_and_never_two_in_flight():
    """every=4: of 40 messages queued one at a time and each sent at once, 10 are observed;
    of 40 queued before any is sent, only the first (one stamp in flight at a time)."""
    clock = Clock()
    delay = SendDelay(clock, every=4)
    channel = channel_with(delay)
    for _ in range(40):
        channel.enqueue(b"x" * 100)
        drain(channel)
    assert delay.count == 10
    burst = SendDelay(clock, every=4)
    channel = channel_with(burst)
    for _ in range(40):
        assert channel.enqueue(b"x" * 100)
    drain(channel)
    assert burst.count == 1


def test_a_channel_without_a_send_delay_never_reads_the_clock():
    """Channels made from a descriptor nobody watches have no SendDelay; set_send_delay(None)
    drops a stamp in flight, and the clock is not read again."""
    reads = []

    def clock():
        reads.append(1)
        return 0.0

    channel = channel_with(SendDelay(clock, every=1))
    channel.enqueue(b"x")
    assert len(reads) == 1
    channel.set_send_delay(None)
    channel.enqueue(b"y")
    drain(channel)
    assert len(reads) == 1
    assert Channel(ChannelDescriptor(0x21)).send_delay is None


def test_channels_made_from_a_watched_descriptor_take_its_send_delay_until_unwatched():
    """watch_send_delay(desc, delay): Channels made from that very descriptor sample into
    delay; an equal descriptor of another Switch does not; None stops it for new ones."""
    desc, twin = ChannelDescriptor(0x30, priority=5), ChannelDescriptor(0x30, priority=5)
    delay = SendDelay(Clock())
    watch_send_delay(desc, delay)
    try:
        assert send_delay_of(desc) is delay and send_delay_of(twin) is None
        assert Channel(desc).send_delay is delay and Channel(twin).send_delay is None
    finally:
        watch_send_delay(desc, None)
    assert Channel(desc).send_delay is None


def test_the_scheduler_path_observes_each_channel_into_its_own_histogram():
    """Two channels under the Scheduler: each sampled message lands in its channel's
    SendDelay, with the time the test moved the clock by."""
    clock = Clock()
    delays = [SendDelay(clock, every=1), SendDelay(clock, every=1)]
    channels = [channel_with(d, capacity=4) for d in delays]
    for channel in channels:
        channel.enqueue(b"q" * 3000)
    clock.now = 100.125
    scheduler = Scheduler(channels, clock.now)
    for _ in range(100):
        parts, _ = scheduler.next_packets(clock.now, PAYLOAD, 64 * 1024)
        if not parts:
            break
    assert [d.count for d in delays] == [1, 1]
    assert [d.total for d in delays] == [pytest.approx(0.125)] * 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"every": 0}, "every must be an integer >= 1, got 0"),
        ({"every": True}, "every must be an integer >= 1, got True"),
        ({"buckets": ()}, "buckets must be positive and increasing, got ()"),
        ({"buckets": (1.0, 0.5)}, "buckets must be positive and increasing, got (1.0, 0.5)"),
        ({"buckets": (0.0, 1.0)}, "buckets must be positive and increasing, got (0.0, 1.0)"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as error:
        SendDelay(Clock(), **kwargs)
    assert message in str(error.value)


def test_a_clock_set_back_counts_as_no_delay():
    clock = Clock()
    delay = SendDelay(clock, every=1)
    channel = channel_with(delay)
    channel.enqueue(b"x")
    clock.now = 50.0
    drain(channel)
    assert (delay.count, delay.total, delay.counts[0]) == (1, 0.0, 1)


def test_messages_queued_one_by_one_through_the_connection_are_sampled():
    """``Connection.queue_message`` (the per-message send path of ``Peer.try_send``) stamps
    samples as ``Channel.enqueue`` does: of 40 messages each queued and sent at once, one
    in ``every`` is observed."""
    from tests.helpers_core import open_connection

    clock = Clock()
    delay = SendDelay(clock, every=4)
    conn = open_connection(channels=[ChannelDescriptor(0x20, send_queue_capacity=8)])
    conn.channels[0x20].set_send_delay(delay)
    for i in range(40):
        assert conn.queue_message(0x20, b"x" * 100)
        clock.now += 0.001
        assert conn.data_to_send(float(i))
    assert delay.count == 10
