"""The ``latency`` table: round-trip percentiles per link, per node and fleet-wide (section 4.4).

The telemetry has no ping round trip yet (``Peer.round_trip`` is not logged; see
specs/pipeline.md section 8). Until it has, the samples are *handshake round trips*, on
the dialing side: from ``connection_made`` (the TCP connection is up, our hello goes
out) to ``handshake_done`` (the listener's hello has arrived) on the same outbound
connection. The listener sends its hello when its side of the connection is made, so
this is one network round trip plus the time both nodes took to react: an upper bound
of the round trip, measured on every (re)connection.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, functions as F

from mconn.pipeline.sessions import of

PERCENTILES = (0.5, 0.9, 0.99)
SOURCE = "handshake"


def handshake_samples(events: DataFrame) -> DataFrame:
    """One row per outbound handshake: node_id, peer_id, remote_address, log_time, rtt."""
    e = of(events, "connection_made", "handshake_done").where(F.col("direction") == "outbound")
    conn = Window.partitionBy("node_id", "remote_address").orderBy("log_time", "seq")
    e = e.select(
        "node_id", "peer_id", "remote_address", "log_time", "event",
        F.lag("event").over(conn).alias("previous"),
        (F.col("log_time") - F.lag("log_time").over(conn)).alias("rtt"),
    )
    done = (F.col("event") == "handshake_done") & (F.col("previous") == "connection_made")
    return e.where(done).select("node_id", "peer_id", "remote_address", "log_time", "rtt")


def _percentiles(grouped) -> DataFrame:
    return grouped.agg(
        F.count("rtt").alias("samples"),
        F.percentile_approx("rtt", list(PERCENTILES)).alias("_p"),
        F.max("rtt").alias("max_seconds"),
    )


def build(samples: DataFrame) -> DataFrame:
    links = _percentiles(samples.groupBy("node_id", "peer_id")).withColumn("scope", F.lit("link"))
    nodes = _percentiles(samples.groupBy("node_id")).withColumn("scope", F.lit("node"))
    nodes = nodes.withColumn("peer_id", F.lit(None).cast("string"))
    fleet = _percentiles(samples.groupBy()).withColumn("scope", F.lit("fleet"))
    fleet = fleet.where(F.col("samples") > 0)
    fleet = fleet.withColumn("node_id", F.lit(None).cast("string")).withColumn("peer_id", F.lit(None).cast("string"))
    rows = links.unionByName(nodes).unionByName(fleet)
    return rows.select(
        "scope", "node_id", "peer_id", "samples",
        *[F.col("_p")[i].alias(f"p{round(q * 100)}_seconds") for i, q in enumerate(PERCENTILES)],
        "max_seconds", F.lit(SOURCE).alias("source"),
    )
