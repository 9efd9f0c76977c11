"""The ``errors`` table: every event logged above ``info`` level (specs/pipeline.md section 4.5).

Protocol errors, refused peers and connections, dialers that gave up, event-loop
stalls and reactor failures (``schema.WARNINGS``), grouped by source event, kind (the
error class, the refusal reason, the failing reactor method, or the event name), scope,
node, remote host and peer: how often, on how many nodes, first and last time, and one
example message. The remote *host* is the key, not ``host:port``: the port of an inbound
connection is an ephemeral one that says nothing.

Theory of operation: whom a row names (``scope``).

* ``node``: the event is about the node that logged it (``NODE_EVENTS``: its own event
  loop stalled). ``node_id`` is that node; ``peer_id`` is null, since the peer whose
  timer noticed the stall is not at fault.
* ``link``: both ends of a link logged the same source and kind about each other within
  ``LINK_WINDOW`` seconds (a silent link times out at both ends: two ``PongTimeout``).
  That is one break of the link, not an error of each peer: it counts once, and the row
  names the end that logged it first (``node_id``) and the other end (``peer_id``).
  Per link, source and kind, records in time order that alternate ends within the window
  form runs, paired first with second, third with fourth: the second of each pair is the
  echo, not counted.
* ``peer``: anything else, about the peer or remote host the logging node names,
  grouped over the nodes that logged it (``node_id`` null, ``nodes`` counts them).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, functions as F

from mconn.pipeline.schema import WARNINGS
from mconn.pipeline.sessions import of

#: ``host:port`` or ``[host]:port`` -> host.
_HOST = r"^\[?([^\]]*?)\]?:\d+$"
#: Events about the node that logged them, not about its peer.
NODE_EVENTS = ("loop_stalled",)
#: Seconds between the two ends' records of one link event at most: Config.ping_interval's
#: default. Both ends of a silent link each ping after being idle for ping_interval and
#: give up pong_timeout later, so their two verdicts on one silence are at most about a
#: ping interval apart.
LINK_WINDOW = 60.0
SCOPES = ("node", "link", "peer")


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


def records(events: DataFrame) -> DataFrame:
    """One row per WARNINGS event: source, kind, logger, peer, remote host, time, message."""
    kind: Column | None = None
    message: Column | None = None
    for event, (k, m) in kinds().items():
        kind = F.when(F.col("event") == event, k) if kind is None else kind.when(F.col("event") == event, k)
        message = F.when(F.col("event") == event, m) if message is None else message.when(F.col("event") == event, m)
    assert kind is not None and message is not None  # kinds() has an entry per WARNINGS event
    host = F.regexp_extract("remote_address", _HOST, 1)
    return of(events, *WARNINGS).select(
        F.col("event").alias("source"),
        kind.alias("kind"),
        F.col("node_id").alias("logger"),
        "peer_id",
        F.when(host != "", host).otherwise(F.col("remote_address")).alias("remote_host"),
        "log_time",
        "seq",
        message.alias("message"),
    )


def scoped(rows: DataFrame) -> DataFrame:
    """``records`` with ``scope``, the ``node_id`` and ``peer_id`` a row names, and
    ``counted`` (false for the echo of a link event): the module's theory of operation."""
    logger, peer = F.col("logger"), F.col("peer_id")
    about_node = F.col("source").isin(*NODE_EVENTS)
    link = [F.least(logger, peer).alias("_a"), F.greatest(logger, peer).alias("_b"), "source", "kind"]
    peers = rows.where(~about_node & peer.isNotNull()).select("*", *link)
    order = ("log_time", "logger", "seq")
    by_link = Window.partitionBy("_a", "_b", "source", "kind").orderBy(*order)
    previous = F.lag("logger").over(by_link)
    starts = (
        previous.isNull() | (previous == logger) | (F.col("log_time") - F.lag("log_time").over(by_link) > LINK_WINDOW)
    )
    peers = peers.withColumn("_run", F.sum(starts.cast("long")).over(by_link))
    in_run = Window.partitionBy("_a", "_b", "source", "kind", "_run").orderBy(*order)
    peers = peers.withColumn("_pair", F.floor((F.row_number().over(in_run) + 1) / 2))
    pair = Window.partitionBy("_a", "_b", "source", "kind", "_run", "_pair")
    first = pair.orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    peers = peers.select(
        "*",
        F.count("*").over(pair).alias("_ends"),
        F.first("logger").over(first).alias("_first"),
        F.first("remote_host").over(first).alias("_first_host"),
    )
    is_link = F.col("_ends") == 2
    first_end = F.col("_first")
    peers = peers.select(
        "source",
        "kind",
        F.when(is_link, F.lit("link")).otherwise(F.lit("peer")).alias("scope"),
        F.when(is_link, first_end).alias("node_id"),
        F.when(is_link & (logger == first_end), peer).when(is_link, logger).otherwise(peer).alias("peer_id"),
        F.when(is_link, F.col("_first_host")).otherwise(F.col("remote_host")).alias("remote_host"),
        "logger",
        "log_time",
        "message",
        (~is_link | (logger == first_end)).alias("counted"),
    )
    others = rows.where(about_node | peer.isNull()).select(
        "source",
        "kind",
        F.when(about_node, F.lit("node")).otherwise(F.lit("peer")).alias("scope"),
        F.when(about_node, logger).alias("node_id"),
        F.when(about_node, F.lit(None).cast("string")).otherwise(peer).alias("peer_id"),
        "remote_host",
        "logger",
        "log_time",
        "message",
        F.lit(True).alias("counted"),
    )
    return peers.unionByName(others)


def build(events: DataFrame) -> DataFrame:
    rows = scoped(records(events))
    grouped = rows.groupBy("source", "kind", "scope", "node_id", "remote_host", "peer_id")
    return grouped.agg(
        F.count(F.when(F.col("counted"), 1)).alias("count"),
        F.countDistinct("logger").alias("nodes"),
        F.timestamp_seconds(F.min("log_time")).alias("first_time"),
        F.timestamp_seconds(F.max("log_time")).alias("last_time"),
        F.max_by(F.when(F.col("counted"), F.col("message")), F.when(F.col("counted"), F.col("log_time"))).alias(
            "example"
        ),
    )
