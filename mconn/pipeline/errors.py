"""The ``errors`` table: every event logged above ``info`` level (specs/pipeline.md section 4.5).

Protocol errors, refused peers and connections, dialers that gave up, event-loop
stalls and reactor failures (``schema.WARNINGS``), grouped by source event, kind (the
error class, the refusal reason, the failing reactor method, or the event name), remote
host and peer: how often, on how many nodes, first and last time, and one example
message. The remote *host* is the key, not ``host:port``: the port of an inbound
connection is an ephemeral one that says nothing.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, functions as F

from mconn.pipeline.schema import WARNINGS
from mconn.pipeline.sessions import of

#: ``host:port`` or ``[host]:port`` -> host.
_HOST = r"^\[?([^\]]*?)\]?:\d+$"


def kinds() -> dict:
    """event -> (kind, example message), as column expressions; one entry per WARNINGS event."""
    return {
        "protocol_error": (F.col("error_type"), F.col("error")),
        "peer_rejected": (F.col("reason"), F.col("message")),
        "connection_refused": (F.col("reason"), F.col("message")),
        "dial_gave_up": (F.lit("gave_up"), F.col("reason")),
        "loop_stalled": (F.lit("loop_stalled"), F.format_string("late %.3f s", F.col("late"))),
        "reactor_error": (F.concat_ws(".", "reactor", "method"), F.lit(None).cast("string")),
    }


def build(events: DataFrame) -> DataFrame:
    kind: Column | None = None
    message: Column | None = None
    for event, (k, m) in kinds().items():
        kind = F.when(F.col("event") == event, k) if kind is None else kind.when(F.col("event") == event, k)
        message = F.when(F.col("event") == event, m) if message is None else message.when(F.col("event") == event, m)
    assert kind is not None and message is not None  # kinds() has an entry per WARNINGS event
    rows = of(events, *WARNINGS).select(
        "event", "node_id", "peer_id", "remote_address", "log_time", kind.alias("kind"), message.alias("message")
    )
    host = F.regexp_extract("remote_address", _HOST, 1)
    rows = rows.withColumn("remote_host", F.when(host != "", host).otherwise(F.col("remote_address")))
    grouped = rows.groupBy(F.col("event").alias("source"), "kind", "remote_host", "peer_id")
    return grouped.agg(
        F.count("*").alias("count"),
        F.countDistinct("node_id").alias("nodes"),
        F.timestamp_seconds(F.min("log_time")).alias("first_time"),
        F.timestamp_seconds(F.max("log_time")).alias("last_time"),
        F.max_by("message", "log_time").alias("example"),
    )
