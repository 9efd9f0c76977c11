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

One sort per pair. The samples of a (node, peer) pair are sorted once, by time; the ticks
come from that order, and so does each sample's previous sample of its own channel: per
channel id a running "last sample" over the rows before (the read stage observes the
fleet's channel ids, ``ingest.Written``). Only a tick's sums need a second sort (by
tick). Without the ids, or with more than ``TRACKED_CHANNELS``, a sort per channel
finds the previous samples; the rows are the same.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec, functions as F

from mconn.pipeline.sessions import PAIR, of

#: Stats events of one peer closer than this (seconds) belong to the same tick.
TICK_GAP = 0.5
#: The counters of channel_stats that count since the connection was made.
COUNTERS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")


def _delta(column: str, previous_row: Column) -> Column:
    """The interval's traffic of a counter, given the channel's previous sample (a struct
    of ``PREVIOUS_FIELDS``, null for the channel's first sample of the pair)."""
    previous, value = previous_row[column], F.col(column)
    # Null (never true) when the fields are absent: older nodes.
    other_connection = (previous_row["session_id"] != F.col("session_id")) | (
        previous_row["connection"] != F.col("connection")
    )
    went_down = F.when(F.col("connection").isNotNull(), F.lit(0)).otherwise(value)
    return (
        F.when(previous.isNull() | other_connection, value)
        .when(value < previous, went_down)
        .otherwise(value - previous)
    )


#: What a sample needs of its channel's previous sample.
PREVIOUS_FIELDS = ("session_id", "connection", "queue_depth", *COUNTERS)
#: Channel ids up to which ``samples`` reads each channel's previous sample in the pair's
#: time order (one running value per channel id); beyond, a window per channel does.
TRACKED_CHANNELS = 16


def _previous_in_pair_order(channel_ids: list, by_pair: WindowSpec, fields: list[str]) -> Column:
    """Each row's previous sample of its own channel, found in its pair's time order: per
    channel id, the last sample of that channel among the rows before (a running value,
    no sort of its own); the row picks its channel's."""
    before = by_pair.rowsBetween(Window.unboundedPreceding, -1)
    sample = F.struct(*fields)
    picked = None
    for channel_id in channel_ids:
        mine = F.col("channel_id").eqNullSafe(F.lit(channel_id))
        last = F.last(F.when(mine, sample), ignorenulls=True).over(before)
        picked = F.when(mine, last) if picked is None else picked.when(mine, last)
    return picked if picked is not None else F.when(F.lit(False), sample)


def samples(events: DataFrame, channel_ids: list | None = None, counters: tuple = COUNTERS) -> DataFrame:
    """One row per channel_stats with its interval's deltas, tick, pending and backlogged
    flags, and its tick's sums.

    ``channel_ids``: every ``channel_id`` of the events' channel_stats (None: not known).
    With at most ``TRACKED_CHANNELS`` of them, one sort serves the ticks and the deltas
    (the pair's time order, each channel's previous sample carried as a running value);
    otherwise a second sort by channel serves the deltas. The rows are the same.
    ``counters``: the deltas wanted (of ``COUNTERS``; the others are left out, and so are
    their columns from the shuffle).
    """
    if "bytes_sent" not in counters or not set(counters) <= set(COUNTERS):
        raise ValueError(f"counters must be of {COUNTERS} and hold bytes_sent (the tick's bytes), got {counters}")
    fields = [f for f in PREVIOUS_FIELDS if f not in COUNTERS or f in counters]
    stats = of(events, "channel_stats").select(
        *PAIR,
        "channel_id",
        "log_time",
        "seq",
        "priority",
        "queue_depth",
        *counters,
        "session_id",
        "connection",
    )
    by_pair = Window.partitionBy(*PAIR).orderBy("log_time", "seq")
    if channel_ids is not None and len(channel_ids) <= TRACKED_CHANNELS:
        previous = _previous_in_pair_order(sorted(channel_ids, key=lambda c: (c is None, c)), by_pair, fields)
    else:
        by_channel = Window.partitionBy(*PAIR, "channel_id").orderBy("log_time", "seq")
        previous = F.when(
            F.row_number().over(by_channel) > 1,
            F.struct(*[F.lag(c).over(by_channel).alias(c) for c in fields]),
        )
    # Shuffled by pair and sorted by time before anything is added to the rows: the
    # window's inputs (a struct per channel id, mostly null) are computed after the
    # exchange and the sort, not carried through them.
    stats = stats.repartition(*PAIR).sortWithinPartitions(*PAIR, "log_time", "seq")
    # One select: the pair's lag and the channels' running values are one window operator.
    stats = stats.select("*", F.lag("log_time").over(by_pair).alias("_previous_time"), previous.alias("_previous"))
    new_tick = F.coalesce(F.col("log_time") - F.col("_previous_time") > TICK_GAP, F.lit(True))
    stats = stats.withColumn("tick", F.sum(new_tick.cast("long")).over(by_pair))
    previous_depth = F.when(F.col("_previous").isNull(), F.lit(0)).otherwise(F.col("_previous.queue_depth"))
    rows = stats.select(
        *PAIR,
        "channel_id",
        "log_time",
        "tick",
        "priority",
        "queue_depth",
        *[_delta(c, F.col("_previous")).alias(c) for c in counters],
        ((F.col("queue_depth") > 0) | (previous_depth > 0)).alias("pending"),
        ((F.col("queue_depth") > 0) & (previous_depth > 0)).alias("backlogged"),
    )
    # Per tick, over the rows of one (node, peer): clustered like the samples, no shuffle.
    tick = Window.partitionBy(*PAIR, "tick")
    pending, backlogged = F.col("pending"), F.col("backlogged")
    return rows.select(
        "*",
        F.sum(pending.cast("int")).over(tick).alias("pending_channels"),
        F.sum(F.when(pending, F.col("priority")).otherwise(0)).over(tick).alias("pending_priority"),
        F.sum("bytes_sent").over(tick).alias("tick_bytes"),
        F.sum(backlogged.cast("int")).over(tick).alias("backlogged_channels"),
        F.sum(F.when(backlogged, F.col("priority")).otherwise(0)).over(tick).alias("backlogged_priority"),
    )


def per_minute(events: DataFrame, channel_ids: list | None = None) -> DataFrame:
    """The table's rows before its last select, with the report's contention sums per
    minute beside them (``BACKLOG_COLUMNS``: over the samples whose tick had at least two
    channels backlogged, the report's contention points, specs/pipeline.md section 7):
    one pass over the samples serves the table and the report. ``channel_ids`` as for
    ``samples``."""
    s = samples(events, channel_ids)
    contended = F.col("pending_channels") >= 2
    promised = F.when(F.col("pending"), F.col("priority") / F.col("pending_priority")).otherwise(0.0)
    backlog = F.col("backlogged_channels") >= 2
    backlog_promised = F.when(F.col("backlogged"), F.col("priority") / F.col("backlogged_priority")).otherwise(0.0)
    minute = F.date_trunc("minute", F.timestamp_seconds("log_time")).alias("minute")
    per_minute = s.groupBy(*PAIR, "channel_id", minute)
    return per_minute.agg(
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
        # Null for a minute without such a sample: the report's per-channel sums skip it.
        F.max(F.when(backlog, F.col("priority"))).alias("_backlog_priority"),
        F.sum(F.when(backlog, F.col("bytes_sent"))).alias("_backlog_bytes"),
        F.sum(F.when(backlog, F.col("tick_bytes"))).alias("_backlog_link"),
        F.sum(F.when(backlog, backlog_promised * F.col("tick_bytes"))).alias("_backlog_promised"),
    )


#: The report's contention sums per minute that ``per_minute`` adds to the table's rows.
BACKLOG_COLUMNS = ("_backlog_priority", "_backlog_bytes", "_backlog_link", "_backlog_promised")


def table(m: DataFrame) -> DataFrame:
    """The table from ``per_minute``'s rows."""
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


def build(events: DataFrame, channel_ids: list | None = None) -> DataFrame:
    """The table; ``channel_ids`` as for ``samples``."""
    return table(per_minute(events, channel_ids))
