"""The ``channels`` table: per link, channel and minute (specs/pipeline.md section 4.3).

Theory of operation. ``channel_stats`` comes every ``stats_interval`` seconds for every
channel of every connected peer, all channels of one peer in one go: a *tick*. Ticks
are found per (node, peer) as runs of stats events less than ``TICK_GAP`` seconds apart.
The byte and message counters count since the connection was made, so an interval's
traffic is the difference between two consecutive samples of a channel, or the sample
itself when the sample is on another connection than the previous one (its ``session_id``
or ``connection`` changed: a resume or a new session). A counter that went down on the
same connection is a suspended session (no transport, counters 0): no traffic. Older
nodes log neither field; then a counter that went down marks a new connection, and a new
connection that outgrew the old one between two samples reads as growth.

A tick is *contended* when at least two channels of the link were pending (messages
queued at either end of the interval). Over the contended ticks of a minute, a channel's
``bandwidth_share`` is its bytes over the link's bytes, and its ``priority_share`` is
what the scheduler promises: its priority over the priorities of the pending channels
(0 when it was not pending), weighted by the bytes of each tick. A fair scheduler keeps
the two close.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, functions as F

from mconn.pipeline.sessions import PAIR, of

#: Stats events of one peer closer than this (seconds) belong to the same tick.
TICK_GAP = 0.5
#: The counters of channel_stats that count since the connection was made.
COUNTERS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")


def _delta(column: str, window) -> F.Column:
    previous, value = F.lag(column).over(window), F.col(column)
    # Null (never true) when the fields are absent: older nodes.
    other_connection = (F.lag("session_id").over(window) != F.col("session_id")) | (
        F.lag("connection").over(window) != F.col("connection")
    )
    went_down = F.when(F.col("connection").isNotNull(), F.lit(0)).otherwise(value)
    return (
        F.when(previous.isNull() | other_connection, value)
        .when(value < previous, went_down)
        .otherwise(value - previous)
    )


def samples(events: DataFrame) -> DataFrame:
    """One row per channel_stats with its interval's deltas, tick and pending flag."""
    stats = of(events, "channel_stats").select(
        *PAIR,
        "channel_id",
        "log_time",
        "seq",
        "priority",
        "queue_depth",
        "bytes_sent",
        "bytes_received",
        "messages_sent",
        "messages_received",
        "session_id",
        "connection",
    )
    by_pair = Window.partitionBy(*PAIR).orderBy("log_time", "seq")
    new_tick = F.coalesce(F.col("log_time") - F.lag("log_time").over(by_pair) > TICK_GAP, F.lit(True))
    stats = stats.withColumn("tick", F.sum(new_tick.cast("long")).over(by_pair))
    by_channel = Window.partitionBy(*PAIR, "channel_id").orderBy("log_time", "seq")
    return stats.select(
        *PAIR,
        "channel_id",
        "log_time",
        "tick",
        "priority",
        "queue_depth",
        *[_delta(c, by_channel).alias(c) for c in COUNTERS],
        ((F.col("queue_depth") > 0) | (F.lag("queue_depth", 1, 0).over(by_channel) > 0)).alias("pending"),
    )


def build(events: DataFrame) -> DataFrame:
    s = samples(events)
    # Per tick, over the rows of one (node, peer): clustered like the samples, no shuffle.
    tick = Window.partitionBy(*PAIR, "tick")
    s = s.select(
        "*",
        F.sum(F.col("pending").cast("int")).over(tick).alias("pending_channels"),
        F.sum(F.when(F.col("pending"), F.col("priority")).otherwise(0)).over(tick).alias("pending_priority"),
        F.sum("bytes_sent").over(tick).alias("tick_bytes"),
    )
    contended = F.col("pending_channels") >= 2
    promised = F.when(F.col("pending"), F.col("priority") / F.col("pending_priority")).otherwise(0.0)
    minute = F.date_trunc("minute", F.timestamp_seconds("log_time")).alias("minute")
    per_minute = s.groupBy(*PAIR, "channel_id", minute)
    m = per_minute.agg(
        F.max("priority").alias("priority"),
        F.count("*").alias("samples"),
        F.sum("bytes_sent").alias("bytes_sent"),
        F.sum("bytes_received").alias("bytes_received"),
        F.sum("messages_sent").alias("messages_sent"),
        F.sum("messages_received").alias("messages_received"),
        F.avg("queue_depth").alias("queue_depth_avg"),
        F.max("queue_depth").alias("queue_depth_max"),
        F.sum(contended.cast("int")).alias("contended_samples"),
        F.sum(F.when(contended, F.col("bytes_sent")).otherwise(0)).alias("contended_bytes"),
        F.sum(F.when(contended, F.col("tick_bytes")).otherwise(0)).alias("link_contended_bytes"),
        F.sum(F.when(contended, promised * F.col("tick_bytes")).otherwise(0.0)).alias("_promised_bytes"),
    )
    link_bytes = F.col("link_contended_bytes")
    return m.select(
        *PAIR,
        "channel_id",
        "minute",
        "priority",
        "samples",
        "bytes_sent",
        "bytes_received",
        "messages_sent",
        "messages_received",
        (F.col("bytes_sent") / 60.0).alias("bytes_per_second"),
        "queue_depth_avg",
        "queue_depth_max",
        "contended_samples",
        "contended_bytes",
        "link_contended_bytes",
        F.when(link_bytes > 0, F.col("contended_bytes") / link_bytes).alias("bandwidth_share"),
        F.when(link_bytes > 0, F.col("_promised_bytes") / link_bytes).alias("priority_share"),
    )
