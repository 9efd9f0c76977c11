"""The ``latency`` table: round-trip percentiles per link, per node and fleet-wide (section 4.4).

Two kinds of samples, per node (specs/pipeline.md section 4.4):

* *ping round trips* (``source`` ``ping``): ``channel_stats.round_trip``, the last ping
  round trip the node measured with the peer (``Peer.round_trip``). Ticks repeat it until
  the next pong (on every channel that changed, or on the peer's first channel when only
  the round trip did), so each distinct value of a session end counts once.
  Both ends of a link measure their own.
* *handshake round trips* (``source`` ``handshake``), for the nodes whose logs have no
  ping round trip (older nodes, or runs shorter than a ping interval): on the dialing
  side, from ``connection_made`` (the TCP connection is up, our hello goes out) to
  ``handshake_done`` (the listener's hello has arrived) on the same outbound connection.
  The listener sends its hello when its side of the connection is made, so this is one
  network round trip plus the time both nodes took to react: an upper bound of the round
  trip, measured on every (re)connection.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, functions as F

from mconn.pipeline.sessions import of

PERCENTILES = (0.5, 0.9, 0.99)
PING, HANDSHAKE = "ping", "handshake"
SAMPLE_COLUMNS = ("node_id", "peer_id", "log_time", "rtt", "source")


def handshake_samples(events: DataFrame) -> DataFrame:
    """One row per outbound handshake: node_id, peer_id, remote_address, log_time, rtt."""
    e = of(events, "connection_made", "handshake_done").where(F.col("direction") == "outbound")
    conn = Window.partitionBy("node_id", "remote_address").orderBy("log_time", "seq")
    e = e.select(
        "node_id",
        "peer_id",
        "remote_address",
        "log_time",
        "event",
        F.lag("event").over(conn).alias("previous"),
        (F.col("log_time") - F.lag("log_time").over(conn)).alias("rtt"),
    )
    done = (F.col("event") == "handshake_done") & (F.col("previous") == "connection_made")
    return e.where(done).select("node_id", "peer_id", "remote_address", "log_time", "rtt")


def ping_samples(events: DataFrame) -> DataFrame:
    """One row per measured ping round trip: node_id, peer_id, log_time (first logged), rtt."""
    stats = of(events, "channel_stats").where(F.col("round_trip").isNotNull())
    return stats.groupBy("node_id", "peer_id", "session_id", F.col("round_trip").alias("rtt")).agg(
        F.min("log_time").alias("log_time")
    )


def samples(events: DataFrame) -> DataFrame:
    """Ping round trips; handshake round trips of the nodes that logged none."""
    ping = ping_samples(events).withColumn("source", F.lit(PING))
    measured = ping.select("node_id").distinct()
    handshakes = handshake_samples(events).join(F.broadcast(measured), "node_id", "left_anti")
    handshakes = handshakes.withColumn("source", F.lit(HANDSHAKE))
    return ping.select(*SAMPLE_COLUMNS).unionByName(handshakes.select(*SAMPLE_COLUMNS))


def _percentiles(grouped) -> DataFrame:
    return grouped.agg(
        F.count("rtt").alias("samples"),
        F.percentile_approx("rtt", list(PERCENTILES)).alias("_p"),
        F.max("rtt").alias("max_seconds"),
        # One source per node; the fleet row names each it mixes: "handshake+ping".
        F.array_join(F.array_sort(F.collect_set("source")), "+").alias("source"),
    )


def build(samples_df: DataFrame) -> DataFrame:
    links = _percentiles(samples_df.groupBy("node_id", "peer_id")).withColumn("scope", F.lit("link"))
    nodes = _percentiles(samples_df.groupBy("node_id")).withColumn("scope", F.lit("node"))
    nodes = nodes.withColumn("peer_id", F.lit(None).cast("string"))
    fleet = _percentiles(samples_df.groupBy()).withColumn("scope", F.lit("fleet"))
    fleet = fleet.where(F.col("samples") > 0)
    fleet = fleet.withColumn("node_id", F.lit(None).cast("string")).withColumn("peer_id", F.lit(None).cast("string"))
    rows = links.unionByName(nodes).unionByName(fleet)
    return rows.select(
        "scope",
        "node_id",
        "peer_id",
        "samples",
        *[F.col("_p")[i].alias(f"p{round(q * 100)}_seconds") for i, q in enumerate(PERCENTILES)],
        "max_seconds",
        "source",
    )
