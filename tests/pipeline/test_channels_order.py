"""The channels table from one time order per pair equals the table from a sort per channel.

``channels.samples`` reads each channel's previous sample from the pair's time order when
it knows the fleet's channel ids (``ingest.Written.channel_ids``), and from a window per
channel otherwise. Here a pair's channels do not all report every tick: one skips ticks,
one starts late, one has no id; counters restart on a new connection and a new session,
and go down on a suspended one. Both ways must give the same rows, and the report's
contention points too.
"""

import random

import pytest

from mconn.pipeline import channels, report

COLUMNS = (
    "event string, node_id string, peer_id string, channel_id long, log_time double, seq long, "
    "priority long, queue_depth long, bytes_sent long, bytes_received long, messages_sent long, "
    "messages_received long, session_id string, connection long"
)


def _rows() -> list[tuple]:
    rng = random.Random(5)
    rows, seq = [], 0
    for node, peer in (("a", "b"), ("b", "a"), ("a", "c")):
        counters: dict = {}
        for tick in range(40):
            t = 1000.0 + 10 * tick
            session, connection = ("s1", 1) if tick < 15 else ("s1", 2) if tick < 30 else ("s2", 1)
            for channel in (0x20, 0x21, 0x30, None):
                if channel == 0x21 and tick % 3 == 1:  # skips ticks
                    continue
                if channel == 0x30 and tick < 8:  # starts late
                    continue
                if channel is None and tick % 5:  # no id (a malformed node), now and then
                    continue
                key = (channel, session, connection)
                sent = counters.get(key, 0) + rng.randint(0, 5000)
                counters[key] = sent
                if tick == 20:  # suspended: no transport, counters 0
                    sent = 0
                seq += 1
                rows.append(
                    (
                        "channel_stats",
                        node,
                        peer,
                        channel,
                        t + rng.uniform(0, 0.01),
                        seq,
                        {0x20: 1, 0x21: 5, 0x30: 10, None: 3}[channel],
                        rng.choice((0, 0, 1, 3)),
                        sent,
                        sent // 2,
                        sent // 100,
                        sent // 200,
                        session,
                        connection,
                    )
                )
    rows.append(("node_started", "a", None, None, 999.0, 0, None, None, None, None, None, None, None, None))
    return rows


@pytest.fixture(scope="module")
def events(spark):
    return spark.createDataFrame(_rows(), COLUMNS).cache()


IDS = [0x20, 0x21, 0x30, None]


def test_one_order_equals_a_sort_per_channel(events):
    one = channels.build(events, IDS)
    per_channel = channels.build(events, None)
    assert one.count() == per_channel.count() > 0
    assert one.exceptAll(per_channel).count() == 0
    assert per_channel.exceptAll(one).count() == 0


def test_samples_equal_both_ways(events):
    one = channels.samples(events, IDS)
    per_channel = channels.samples(events, None)
    assert one.exceptAll(per_channel).count() == 0
    assert per_channel.exceptAll(one).count() == 0
    # The deltas are intervals, not the cumulative counters: the suspended sample is 0.
    suspended = [r["bytes_sent"] for r in one.where("log_time >= 1200 and log_time < 1201").collect()]
    assert suspended and all(b == 0 for b in suspended)


def test_more_channels_than_tracked_use_a_sort_per_channel(events):
    many = IDS[:-1] + list(range(100, 100 + channels.TRACKED_CHANNELS))
    assert channels.build(events, many).exceptAll(channels.build(events, None)).count() == 0


def test_contention_points_equal_both_ways(events):
    assert report.share_points(events, IDS) == report.share_points(events, None)
    assert report.share_points(events, IDS)
