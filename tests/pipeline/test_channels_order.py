"""The channels table from one time order per pair equals the table from a sort per channel.

``channels.samples`` reads each channel's previous sample from the pair's time order when
it knows the fleet's channel ids (``ingest.Written.channel_ids``), and from a window per
channel otherwise. Here a pair's channels do not all report every tick: one skips ticks,
one starts late, one has no id; counters restart on a new connection and a new session,
and go down on a suspended one. Both ways must give the same rows, and the report's
contention points too. The report takes its points from the channels stage's per-minute
sums (``channels.per_minute``); they equal the points summed over the samples themselves.
The read stage observes the channel ids as bit masks: every byte id is found, and an id
outside a byte makes them unknown (the sort per channel then).
"""

import json
import random

import pytest
from pyspark.sql import functions as F

from mconn.pipeline import channels, ingest, report
from mconn.pipeline.sessions import PAIR

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


def _points_from_samples(events) -> dict:
    """The contention points by their definition (report.share_points' docstring), summed
    over the samples themselves: the intervals in which at least two of the link's
    channels were backlogged."""
    s = channels.samples(events, None)
    promised = F.when(F.col("backlogged"), F.col("priority") / F.col("backlogged_priority")).otherwise(0.0)
    per_channel = (
        s.where(F.col("backlogged_channels") >= 2)
        .groupBy(*PAIR, "channel_id")
        .agg(
            F.max("priority").alias("priority"),
            F.sum("bytes_sent").alias("contended"),
            F.sum("tick_bytes").alias("link"),
            F.sum(promised * F.col("tick_bytes")).alias("promised"),
        )
        .where(F.col("link") > 0)
    )
    return {(r["node_id"], r["peer_id"], r["channel_id"]): r.asDict() for r in per_channel.collect()}


def test_contention_points_from_the_minutes_equal_the_samples(events):
    """Per-minute sums of the backlogged intervals, summed per link channel, are the sums
    over the samples: the same channels, bytes, priority and promised share."""
    expected = _points_from_samples(events)
    got = {(p["node_id"], p["peer_id"], p["channel_id"]): p for p in report.share_points(events, IDS)}
    assert len(expected) >= 3
    assert got.keys() == expected.keys()
    for key, point in got.items():
        want = expected[key]
        assert point["priority"] == want["priority"]
        assert point["bytes"] == want["contended"]
        assert point["bandwidth_share"] == want["contended"] / want["link"]
        assert point["priority_share"] == pytest.approx(want["promised"] / want["link"], rel=1e-12)


def _stats_line(channel_id, t: float) -> str:
    record = {"v": 2, "event": "channel_stats", "node_id": "n1", "log_time": t, "peer_id": "p1"}
    if channel_id is not None:
        record["channel_id"] = channel_id
    return json.dumps(record, separators=(",", ":"))


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        # Each end of each of the four masks, and a sample without an id.
        ([0, 63, 64, 127, 128, 191, 192, 255, None, 64], [0, 63, 64, 127, 128, 191, 192, 255, None]),
        # An id that is not a byte: not known (the channels stage sorts per channel).
        ([0x20, 256], None),
        ([0x20, -1], None),
    ],
)
def test_the_read_observes_every_byte_channel_id(spark, tmp_path, ids, expected):
    lines = [_stats_line(c, 1800000000.0 + i) for i, c in enumerate(ids)]
    # A version 1 record goes by the general path: its ids are observed there.
    legacy = {"event": "channel_stats", "node_id": "n2", "log_time": 1800000100.0, "peer_id": "p1", "channel_id": 7}
    lines.append(ingest.RECORD_SEPARATOR + json.dumps(legacy))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "node.json").write_text("\n".join(lines) + "\n")
    written = ingest.write_events(spark, [str(tmp_path / "in")], str(tmp_path / "events"))
    want = None if expected is None else sorted([*expected, 7], key=lambda c: (c is None, c))
    assert written.channel_ids == want
