"""The ``links`` table: one row per node, peer and session (specs/pipeline.md section 4.1)."""

from __future__ import annotations

from pyspark.sql import DataFrame, functions as F

from mconn.pipeline.sessions import END, attribute, of

#: specs/pipeline.md section 4.1: how a session end is graded, worst first.
OUTCOMES = ("expired", "rejected", "fresh", "restarted", "resumed", "closed", "open")
#: A fresh session that starts this soon (seconds) after a SessionRejected end replaced it.
FRESH_WITHIN = 1.0


def end_kind() -> F.Column:
    """How an ended session ended: expired, fresh (a new session replaced it at once),
    rejected (refused or given up, nothing replaced it), or closed (anything else)."""
    rejected = F.col("end_reason_type") == "SessionRejected"
    replaced = F.col("next_start").isNotNull() & (F.abs(F.col("next_start") - F.col("end")) <= FRESH_WITHIN)
    return (
        F.when(F.col("end_reason_type") == "SessionExpired", F.lit("expired"))
        .when(rejected & replaced, F.lit("fresh"))
        .when(rejected, F.lit("rejected"))
        .otherwise(F.lit("closed"))
    )


def outcome() -> F.Column:
    ended = F.col("end").isNotNull()
    kind = end_kind()
    return (
        F.when(ended & (kind != "closed"), kind)
        .when(~ended & (F.col("next_start").isNotNull() | F.col("restart_at").isNotNull()), F.lit("restarted"))
        .when(F.col("resumes") > 0, F.lit("resumed"))
        .when(ended, F.lit("closed"))
        .otherwise(F.lit("open"))
    )


def suspended_time(breaks: DataFrame, sessions_df: DataFrame) -> DataFrame:
    """Seconds each session end spent suspended: each break until it was settled."""
    b = breaks.join(sessions_df.select(*END, "observed_until"), END)
    until = F.coalesce("resolved_at", "observed_until")
    return b.groupBy(*END).agg(F.sum(F.greatest(until - F.col("break_at"), F.lit(0.0))).alias("suspended_seconds"))


def traffic(events: DataFrame, sessions_df: DataFrame) -> DataFrame:
    """Wire bytes of the connections each session end used (their ``connection_lost``).

    A ``connection_lost`` that logged a null ``session_id`` carried no session (a refused
    peer); one without the field (an older node) is attributed by time.
    """
    lost = of(events, "connection_lost").where(F.col("peer_id").isNotNull())
    lost = lost.where(~(F.coalesce("session_id_logged", F.lit(False)) & F.col("session_id").isNull()))
    lost = attribute(lost, sessions_df)
    return lost.groupBy(*END).agg(
        F.count("*").alias("connections"),
        F.sum("bytes_sent").alias("bytes_sent"),
        F.sum("bytes_received").alias("bytes_received"),
    )


def build(sessions_df: DataFrame, breaks: DataFrame, counters_df: DataFrame, events: DataFrame) -> DataFrame:
    messages = counters_df.groupBy(*END).agg(
        F.sum("accepted").alias("messages_sent"),
        F.sum("delivered").alias("messages_received"),
        F.first("final").alias("counters_final"),
    )
    links = (
        sessions_df.join(suspended_time(breaks, sessions_df), END, "left")
        .join(traffic(events, sessions_df), END, "left")
        .join(messages, END, "left")
        .fillna(0, ["suspended_seconds", "connections", "bytes_sent", "bytes_received"])
    )
    duration = F.col("observed_until") - F.col("start")
    return links.select(
        *END,
        "direction",
        "remote_address",
        F.timestamp_seconds("start").alias("start"),
        F.timestamp_seconds("end").alias("end"),
        F.timestamp_seconds("observed_until").alias("observed_until"),
        "end_reason_type",
        "end_reason",
        outcome().alias("outcome"),
        "resume_refused",
        "start_seen",
        duration.alias("duration_seconds"),
        (duration - F.col("suspended_seconds")).alias("connected_seconds"),
        "suspended_seconds",
        "suspensions",
        "resumes",
        "resent",
        "connections",
        "bytes_sent",
        "bytes_received",
        "messages_sent",
        "messages_received",
        "counters_final",
    )
