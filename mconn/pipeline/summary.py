"""The ``summary`` table: one row of fleet headline numbers (specs/pipeline.md section 4.6).

Built from the other tables as one-row aggregates joined side by side: one Spark query,
collected once, which also counts the events table's records per event name and the
audit's findings (``EXTRA``); the table is written from the collected row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, functions as F

from mconn.pipeline import reasons
from mconn.pipeline.audit import finding_counts
from mconn.pipeline.ingest import MALFORMED, UNKNOWN

#: Column order of the summary row, as the console and the report show it.
COLUMNS = (
    "nodes",
    "restarts",
    "events",
    "malformed_records",
    "unknown_events",
    "first_time",
    "last_time",
    "sessions",
    "links",
    "resumes",
    "fresh_starts",
    "expired_sessions",
    "rejected_sessions",
    "restarted_sessions",
    "dial_attempts",
    "failed_dials",
    "recovery_p50_seconds",
    "recovery_max_seconds",
    "messages_audited",
    "lost",
    "duplicated",
    "unconfirmed",
    "unconfirmed_receiver_killed",
    "in_doubt",
    "unsettled",
    "one_sided_rows",
    "protocol_errors",
    "link_failures",
    "refused_connections",
    "gave_up_dials",
    "loop_stalls",
    "reactor_errors",
    "rtt_p50_seconds",
    "rtt_p99_seconds",
    "rtt_source",
)


#: Summary column -> the error sources it adds up. ``protocol_errors`` counts peer
#: misbehaviour only: a ``protocol_error`` whose class is a link failure (an older
#: node's ``PongTimeout``, before ``link_failed`` existed) is left out
#: (``reasons.LINK_TYPES``); the connection it broke counts in ``link_failures``.
ERROR_COLUMNS = {
    "protocol_errors": ("protocol_error",),
    "refused_connections": ("peer_rejected", "connection_refused"),
    "gave_up_dials": ("dial_gave_up",),
    "loop_stalls": ("loop_stalled",),
    "reactor_errors": ("reactor_error",),
}


#: Columns of the summary query beside ``COLUMNS``, not written: the events table's
#: records per event name, the audit's finding counts (``audit.finding_counts``) and the
#: round-trip samples (what the report's histogram samples from).
EXTRA = ("event_counts", "problem_rows", "one_sided_killed", "one_sided_missing", "skewed_sessions", "rtt_samples")


def query(everything: DataFrame, nodes: DataFrame, *, links, reconnects, audit, errors, latency) -> DataFrame:
    """The summary row (``COLUMNS``) and ``EXTRA``, as one Spark query of one-row
    aggregates side by side: collected once, the row is the headline, the table (written
    from the collected row), the event counts and the findings' counts.

    ``everything``: the events table, malformed and unknown records included (their
    counts are its partitions' row counts: no column is read); ``nodes``: the events'
    ``sessions.node_times``."""
    by_event = everything.groupBy("event").count()
    name = F.col("event")
    base = by_event.agg(
        F.coalesce(F.sum(F.when(~name.isin(MALFORMED, UNKNOWN), F.col("count"))), F.lit(0)).alias("events"),
        F.coalesce(F.sum(F.when(name == MALFORMED, F.col("count"))), F.lit(0)).alias("malformed_records"),
        F.coalesce(F.sum(F.when(name == UNKNOWN, F.col("count"))), F.lit(0)).alias("unknown_events"),
        F.map_from_entries(F.collect_list(F.struct("event", "count"))).alias("event_counts"),
    )
    # A restart: a node_started after an earlier event of the same node (a previous run).
    restarted = F.size(F.filter("started", lambda t: t > F.col("_first")))
    fleet = nodes.select(F.col("first_time").alias("_first"), F.col("last_time").alias("_last"), "started").agg(
        F.count("*").alias("nodes"),
        F.timestamp_seconds(F.min("_first")).alias("first_time"),
        F.timestamp_seconds(F.max("_last")).alias("last_time"),
        F.coalesce(F.sum(restarted).cast("long"), F.lit(0).cast("long")).alias("restarts"),
    )
    per_session = links.groupBy("session_id").agg(
        F.max("resumes").alias("resumes"),
        F.max(F.coalesce(F.col("resume_refused"), F.lit("")) != "").alias("fresh"),
        F.max(F.col("outcome") == "expired").alias("expired"),
        F.max(F.col("outcome") == "rejected").alias("rejected"),
    )
    sessions = per_session.agg(
        F.count("*").alias("sessions"),
        F.coalesce(F.sum("resumes"), F.lit(0)).alias("resumes"),
        F.count(F.when(F.col("fresh"), 1)).alias("fresh_starts"),
        F.count(F.when(F.col("expired"), 1)).alias("expired_sessions"),
        F.count(F.when(F.col("rejected"), 1)).alias("rejected_sessions"),
    )
    pairs = links.select(F.least("node_id", "peer_id").alias("a"), F.greatest("node_id", "peer_id").alias("b"))
    link_rows = links.agg(F.count(F.when(F.col("outcome") == "restarted", 1)).alias("restarted_sessions")).crossJoin(
        pairs.agg(F.countDistinct("a", "b").alias("links"))
    )
    breaks = reconnects.where(F.col("break_time").isNotNull()).dropDuplicates(["node_id", "peer_id", "break_time"])
    dials = reconnects.agg(
        F.count("*").alias("dial_attempts"), F.count(F.when(F.col("result") != "connected", 1)).alias("failed_dials")
    ).crossJoin(
        breaks.agg(
            F.percentile_approx("recovery_seconds", 0.5).alias("recovery_p50_seconds"),
            F.max("recovery_seconds").alias("recovery_max_seconds"),
        )
    )
    audited = audit.agg(
        F.coalesce(F.sum(F.when(F.col("verdict") != "one_sided", F.col("accepted"))), F.lit(0)).alias(
            "messages_audited"
        ),
        *[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in ("lost", "duplicated", "in_doubt", "unsettled")],
        # The API's word for the senders' ``undelivered``; the part whose receiver end has no
        # final counters (its node was killed, or its logs stop or are missing).
        F.coalesce(F.sum("undelivered"), F.lit(0)).alias("unconfirmed"),
        F.coalesce(F.sum(F.when(~F.coalesce("receiver_final", F.lit(False)), F.col("undelivered"))), F.lit(0)).alias(
            "unconfirmed_receiver_killed"
        ),
        F.count(F.when(F.col("verdict") == "one_sided", 1)).alias("one_sided_rows"),
    )
    a_link_failure = (F.col("source") == "protocol_error") & F.col("kind").isin(*reasons.LINK_TYPES)
    by_source = errors.agg(
        *[
            F.coalesce(F.sum(F.when(F.col("source").isin(*sources) & ~a_link_failure, F.col("count"))), F.lit(0)).alias(
                name
            )
            for name, sources in ERROR_COLUMNS.items()
        ]
    )
    # Connections lost to a link failure (a timeout, a reset: not the peer's fault), at the
    # end that logged it: reason_kind "link", or its reason_type's kind in older logs.
    lost = everything.where(name == "connection_lost")
    link_failures = lost.agg(F.count(F.when(reasons.reason_kind() == reasons.LINK, 1)).alias("link_failures"))
    fleet_rtt = latency.where(F.col("scope") == "fleet")
    rtt = fleet_rtt.agg(
        F.first("p50_seconds").alias("rtt_p50_seconds"),
        F.first("p99_seconds").alias("rtt_p99_seconds"),
        F.first("source").alias("rtt_source"),
        F.coalesce(F.sum("samples"), F.lit(0)).alias("rtt_samples"),
    )
    row = base
    parts = (fleet, sessions, link_rows, dials, audited, by_source, link_failures, rtt, finding_counts(audit, links))
    for part in parts:
        row = row.crossJoin(part)
    return row.select(*COLUMNS, *EXTRA)
