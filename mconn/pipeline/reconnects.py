"""The ``reconnects`` table: one row per ``dial_attempt`` (specs/pipeline.md section 4.2).

Theory of operation. A dial attempt re-dials a suspended session, keeps a persistent peer
connected, or retries a first dial. It belongs to a break (``session_suspended``) when it
comes after that break and before anything settled it (failed attempts), or is the
``connected`` attempt that settled it: the dialer reports that attempt right after the
session resumed (``session_resumed``), or after the old session ended and a fresh one
started (``session_ended``, ``session_started``). Attempts of persistent peers and first
dials belong to no break. Per (node, peer), in time order, the settling events are
counted; an attempt belongs to the last break if none came since (or, for a connected
attempt, at most the two of a fresh start).

The break is settled by a resume, by a fresh session, or by the session's end (expired,
rejected, closed); ``recovery_seconds`` is the time from the break until data could flow
again: the resume, or the start of the fresh session.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, functions as F

from mconn.pipeline.links import end_kind
from mconn.pipeline.sessions import END, PAIR, of

_SETTLING = ("session_resumed", "session_ended", "session_started")


def resolution() -> F.Column:
    return (
        F.when(F.col("break_at").isNull(), F.lit(None).cast("string"))
        .when(F.col("resolved_by") == "session_resumed", F.lit("resumed"))
        .when(F.col("resolved_by").isNull(), F.lit("unresolved"))
        .otherwise(end_kind())
    )


def attempts_with_breaks(events: DataFrame) -> DataFrame:
    """Each dial_attempt with the break it belongs to (``break_at``, ``session_id``), or nulls."""
    e = of(events, "session_suspended", "dial_attempt", *_SETTLING).select(
        *PAIR, "event", "log_time", "seq", "session_id", "address", "attempt", "delay", "result", "error"
    )
    upto = Window.partitionBy(*PAIR).orderBy("log_time", "seq").rowsBetween(Window.unboundedPreceding, 0)
    is_break = F.col("event") == "session_suspended"
    e = e.withColumn("settled", F.sum(F.col("event").isin(*_SETTLING).cast("int")).over(upto))
    e = e.select(
        "*",
        F.last(F.when(is_break, F.col("log_time")), ignorenulls=True).over(upto).alias("_break_at"),
        F.last(F.when(is_break, F.col("session_id")), ignorenulls=True).over(upto).alias("_break_session"),
        F.last(F.when(is_break, F.col("settled")), ignorenulls=True).over(upto).alias("_settled_at_break"),
    )
    since = F.col("settled") - F.col("_settled_at_break")
    belongs = (since == 0) | ((F.col("result") == "connected") & (since <= 2))
    return e.where(F.col("event") == "dial_attempt").select(
        *PAIR,
        "log_time",
        "address",
        "attempt",
        "delay",
        "result",
        "error",
        F.when(belongs, F.col("_break_at")).alias("break_at"),
        F.when(belongs, F.col("_break_session")).alias("session_id"),
    )


def build(events: DataFrame, breaks: DataFrame, sessions_df: DataFrame) -> DataFrame:
    settled = breaks.join(sessions_df.select(*END, "end_reason_type", "end", "next_start"), END, "left")
    rows = attempts_with_breaks(events).join(settled, END + ["break_at"], "left")
    ended = F.col("resolved_by") == "session_ended"
    recovered = F.when(F.col("resolved_by") == "session_resumed", F.col("resolved_at")).when(
        ended & (end_kind() == "fresh"), F.col("next_start")
    )
    return rows.select(
        *PAIR,
        "session_id",
        F.timestamp_seconds("log_time").alias("time"),
        "address",
        "attempt",
        "delay",
        "result",
        "error",
        F.timestamp_seconds("break_at").alias("break_time"),
        "break_reason_type",
        (F.col("log_time") - F.col("break_at")).alias("seconds_since_break"),
        resolution().alias("resolution"),
        (recovered - F.col("break_at")).alias("recovery_seconds"),
    )
