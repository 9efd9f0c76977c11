"""Sessions as the logs show them: intervals, breaks, and per-channel counters.

The building blocks that the ``links``, ``reconnects`` and ``delivery_audit`` tables
share (specs/pipeline.md section 3). A session is seen by each of its two nodes; every
frame here has one row per *end*: (node_id, peer_id, session_id).

Theory of operation. ``channel_stats`` and ``connection_lost`` name their session
(``session_id``) in the logs of current nodes: they are attributed by lookup. Older
nodes' logs lack the field, and then the tiling rule applies: a node has at most one
session with a given peer at a time (the Switch's peer table is keyed by node id, and a
new session ends the old one first), so the sessions of one (node, peer) pair tile time:
session k owns the events of that pair from its start up to the start of session k + 1.

A session with no ``session_ended`` was lost without an end when its node logged a
``node_started`` after the session's start (the node restarted: crash, kill), or, in
logs without ``node_started``, when its pair has a later session.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, functions as F

SESSION_EVENTS = ("session_started", "session_suspended", "session_resumed", "session_ended")
END = ["node_id", "peer_id", "session_id"]
PAIR = ["node_id", "peer_id"]


def of(events: DataFrame, *names: str) -> DataFrame:
    """The events with one of these names."""
    return events.where(F.col("event").isin(list(names)))


def _when(event: str, column: str):
    return F.when(F.col("event") == event, F.col(column))


def node_times(events: DataFrame) -> DataFrame:
    """One row per node: its first and last event times (``first_time``, ``last_time``)
    and the times of its ``node_started`` records (``started``): one scan of the events
    serves the sessions' ``observed_until`` and the summary's nodes, span and restarts."""
    started = F.when(F.col("event") == "node_started", F.col("log_time"))
    return events.groupBy("node_id").agg(
        F.min("log_time").alias("first_time"),
        F.max("log_time").alias("last_time"),
        F.collect_list(started).alias("started"),
    )


def sessions(events: DataFrame, nodes: DataFrame | None = None) -> DataFrame:
    """One row per session end with its start, end, and the next session's start.

    ``start`` is the ``session_started`` time (or the first event seen of the session,
    ``start_seen`` false); ``next_start`` the start of the pair's next session;
    ``restart_at`` the node's first ``node_started`` after the start, for an end without
    ``session_ended`` (its node restarted with the session open); ``observed_until`` when
    the logs stop telling about it: its end, else the next session's start or the
    restart, whichever came first, else the node's last event. ``nodes``: the events'
    ``node_times``, if the caller has them (else computed here).
    """
    nodes = node_times(events) if nodes is None else nodes
    last_event = nodes.select("node_id", F.col("last_time").alias("node_last_time"))
    s = (
        of(events, *SESSION_EVENTS)
        .groupBy(*END)
        .agg(
            F.min(_when("session_started", "log_time")).alias("started_at"),
            F.min("log_time").alias("first_seen"),
            F.first(_when("session_started", "direction"), ignorenulls=True).alias("direction"),
            F.first(_when("session_started", "remote_address"), ignorenulls=True).alias("remote_address"),
            F.first(_when("session_started", "resume_refused"), ignorenulls=True).alias("resume_refused"),
            F.min(_when("session_ended", "log_time")).alias("end"),
            F.first(_when("session_ended", "reason_type"), ignorenulls=True).alias("end_reason_type"),
            F.first(_when("session_ended", "reason"), ignorenulls=True).alias("end_reason"),
            F.count(_when("session_suspended", "log_time")).alias("suspensions"),
            F.count(_when("session_resumed", "log_time")).alias("resumes_seen"),
            F.max(_when("session_ended", "resumes")).alias("resumes_reported"),
            F.coalesce(F.sum(_when("session_resumed", "resent")), F.lit(0)).alias("resent"),
        )
    )
    # A resume before --since is missing from the events, not from session_ended's count.
    s = s.withColumn("resumes", F.greatest("resumes_seen", F.coalesce("resumes_reported", F.lit(0))))
    s = s.drop("resumes_seen", "resumes_reported")
    s = s.withColumn("start", F.coalesce("started_at", "first_seen"))
    s = s.withColumn("start_seen", F.col("started_at").isNotNull()).drop("started_at", "first_seen")
    pair = Window.partitionBy(*PAIR).orderBy("start", "session_id")
    s = s.withColumn("next_start", F.lead("start").over(pair))
    s = s.join(F.broadcast(last_event), "node_id", "left")
    s = s.join(_restarts(events, s), END, "left")
    until = F.coalesce("end", F.least("next_start", "restart_at"), "node_last_time")
    return s.withColumn("observed_until", F.greatest(until, F.col("start"))).drop("node_last_time")


def _restarts(events: DataFrame, s: DataFrame) -> DataFrame:
    """Per session end without ``session_ended``: its node's first ``node_started`` after its start."""
    starts = of(events, "node_started").select("node_id", F.col("log_time").alias("_started"))
    unended = s.where(F.col("end").isNull()).select(*END, "start")
    after = unended.join(starts, "node_id").where(F.col("_started") > F.col("start"))
    return after.groupBy(*END).agg(F.min("_started").alias("restart_at"))


def suspensions(events: DataFrame) -> DataFrame:
    """One row per ``session_suspended``: when, why, and what settled it.

    ``resolved_at`` is the first ``session_resumed`` or ``session_ended`` of the same
    session end after the break, ``resolved_by`` which of the two (null: neither in the
    logs).
    """
    e = of(events, "session_suspended", "session_resumed", "session_ended")
    after = Window.partitionBy(*END).orderBy("log_time", "seq").rowsBetween(1, Window.unboundedFollowing)
    settles = F.col("event") != "session_suspended"
    e = e.select(
        *END,
        "event",
        "log_time",
        "seq",
        "reason_type",
        F.first(F.when(settles, F.col("log_time")), ignorenulls=True).over(after).alias("resolved_at"),
        F.first(F.when(settles, F.col("event")), ignorenulls=True).over(after).alias("resolved_by"),
    )
    return e.where(F.col("event") == "session_suspended").select(
        *END,
        F.col("log_time").alias("break_at"),
        F.col("reason_type").alias("break_reason_type"),
        "resolved_at",
        "resolved_by",
    )


def attribute(df: DataFrame, sessions_df: DataFrame) -> DataFrame:
    """Give each row of ``df`` (with node_id, peer_id, session_id, log_time) its session.

    A row that names its session keeps it, if the logs show that session (a lookup). A
    row without one (an older node) belongs to the pair's session whose interval
    [start, next_start) holds its time. Other rows are dropped.
    """
    named = df.where(F.col("session_id").isNotNull()).join(sessions_df.select(*END), END, "left_semi")
    s = sessions_df.select(*PAIR, "session_id", F.col("start").alias("_s"), F.col("next_start").alias("_n"))
    inside = (F.col("log_time") >= F.col("_s")) & (F.col("_n").isNull() | (F.col("log_time") < F.col("_n")))
    tiled = df.where(F.col("session_id").isNull()).drop("session_id").join(s, PAIR).where(inside).drop("_s", "_n")
    return named.unionByName(tiled)


def counters(events: DataFrame, sessions_df: DataFrame) -> DataFrame:
    """Per session end and channel: accepted, acked, delivered, undelivered, and source.

    From ``session_ended`` when the node logged it (``final`` true, ``undelivered`` its
    report); otherwise from the last ``channel_stats`` of the session (``final`` false,
    ``undelivered`` null).
    """
    ended = of(events, "session_ended")
    final = ended.select(*END, F.explode("session_channels").alias("c")).select(
        *END, "c.channel_id", "c.accepted", "c.acked", "c.delivered"
    )
    reported = ended.select(*END, F.explode("undelivered").alias("u")).select(
        *END, "u.channel_id", F.col("u.count").alias("undelivered")
    )
    final = final.join(reported, END + ["channel_id"], "left").fillna(0, ["undelivered"])
    final = final.withColumn("final", F.lit(True))
    # Only the pairs with a session that did not end need their stats (few, in a healthy fleet).
    unended = sessions_df.where(F.col("end").isNull()).select(*PAIR).distinct()
    stats = of(events, "channel_stats").join(F.broadcast(unended), PAIR, "left_semi")
    stats = attribute(stats, sessions_df)
    last = stats.groupBy(*END, "channel_id").agg(
        F.max_by(F.struct("accepted", "acked", "delivered"), F.struct("log_time", "seq")).alias("c")
    )
    last = last.join(ended.select(*END), END, "left_anti").select(
        *END,
        "channel_id",
        "c.accepted",
        "c.acked",
        "c.delivered",
        F.lit(None).cast("long").alias("undelivered"),
        F.lit(False).alias("final"),
    )
    return final.unionByName(last)
