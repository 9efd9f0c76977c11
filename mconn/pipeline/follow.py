"""``mconn-pipeline --follow DIR``: the links, reconnects and delivery_audit tables kept
current while the fleet runs, and a page that shows them (specs/pipeline.md section 9).

Theory of operation. Spark's fixed cost (a JVM, a session, code paths warmed up) is paid
once by a program that keeps running. Two Structured Streaming queries read the
**closed** telemetry files of DIR (``inputs.CLOSED_GLOB``: a node closes its file under a
name that never changes, specs/telemetry.md section 2.1; the live ``PATH`` is left out,
its records come when it is closed), each new file once, with Spark's text source (its
schema is fixed: a line and its file):

* ``events``: each micro-batch's lines are parsed as the batch run parses them
  (``ingest.classify``, the fast path, then ``ingest.records`` and ``ingest.parse``, the
  general path, for the other lines: the explicit schema of schema.py, never inferred),
  appended to the follower's events table (Parquet under its state directory), and the
  three tables are rebuilt from that whole table with the batch run's own code
  (links.py, reconnects.py, audit.py), written under the state directory and summarised
  for the page (``foreachBatch``). Streaming aggregation cannot express them: a session
  end is the argmax of its counters over an unbounded time, links and reconnects order a
  pair's events with window functions (not supported on a stream), and the audit is a
  full outer join of the two ends' final counters, which no watermark can close (a
  session may last for days). Recomputing from the stored events gives, once the fleet
  has stopped and every file is closed, exactly the batch run's tables.
* ``activity``: the same lines, parsed for ``event``, ``node_id`` and ``log_time`` (an
  explicit schema too), with an **event-time watermark** (``--watermark`` seconds behind
  the latest record seen) and counted per ``WINDOW_SECONDS`` window of event time and
  event: the fleet's breaks, resumes and new sessions as they happen. Its state is
  bounded by the watermark (older windows are finalised and dropped); the page keeps the
  last ``WINDOWS_SHOWN``. A late file's records older than the watermark are left out of
  this count (Spark drops them), never out of the three tables.

The page (follow_page.py) is plain HTML that reloads itself every trigger, served by
Twisted on 127.0.0.1 with ``/state.json`` beside it. The Twisted reactor runs in the main
thread; the queries' batches run in Spark's threads and hand the page a new snapshot
under a lock. SIGTERM or SIGINT stops both queries, then Spark, then the reactor.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, cast

from mconn.pipeline.follow_page import ACTIVITY_EVENTS, WINDOW_SECONDS, WINDOWS_SHOWN
from mconn.pipeline.inputs import CLOSED_GLOB
from mconn.pipeline.spark import parse_conf

#: Rows of a table the page shows at most (the newest links, the latest reconnects, the
#: audit's problem rows).
ROWS_SHOWN = 200
#: Micro-batches appended to the events table between two compactions into one file.
COMPACT_EVERY = 50
#: Default seconds between micro-batches.
DEFAULT_TRIGGER = 5.0
#: Default watermark delay: how far behind the latest record seen a record may come and
#: still be counted in its activity window (a node's file closes at most
#: ``--telemetry-rotate-seconds`` after its first record, and node clocks differ).
DEFAULT_WATERMARK = 60.0
#: Default page port.
DEFAULT_PORT = 8090
#: The follower's Spark settings (over spark.py's for a small local input): adaptive
#: execution off (its extra jobs cost more than they save on a batch's few MB), and
#: a code cache large enough for a program that keeps running (the quick JIT tier's
#: default 48 MB filled within minutes, and the JVM stopped compiling: batches 2x slower).
SESSION_CONF = {"spark.sql.adaptive.enabled": "false"}
JAVA_OPTIONS = "-XX:ReservedCodeCacheSize=256m"
#: Spark's file source forgets (and never reads) a file whose modification time is this
#: much older than the newest file it has seen; the list of files it has seen is bounded
#: by it.
MAX_FILE_AGE = "1h"


@dataclasses.dataclass
class Snapshot:
    """What the page shows: the last batch's summary of the three tables, and activity."""

    directory: str
    trigger: float
    started: float
    batches: int = 0
    files: int = 0
    events: int = 0
    malformed: int = 0
    last_batch_at: float | None = None
    last_batch_seconds: float | None = None
    #: Seconds from a file's modification (its close) to the end of the batch that read
    #: it: the newest batch's largest, and the largest of the run.
    lag_seconds: float | None = None
    max_lag_seconds: float | None = None
    audit: dict = dataclasses.field(default_factory=dict)
    problems: list = dataclasses.field(default_factory=list)
    links: list = dataclasses.field(default_factory=list)
    link_count: int = 0
    reconnects: list = dataclasses.field(default_factory=list)
    reconnect_count: int = 0
    #: {window start (seconds): {event: count}}, the newest WINDOWS_SHOWN.
    activity: dict = dataclasses.field(default_factory=dict)
    watermark: str | None = None
    error: str | None = None

    def as_json(self) -> dict:
        document = dataclasses.asdict(self)
        document["activity"] = [
            {"window_start": start, "counts": counts} for start, counts in sorted(self.activity.items())
        ]
        return document


class Follower:
    """The two streaming queries over the closed files of ``directory``; the state
    (events table, tables, checkpoints) under ``state``.

    :param spark: a SparkSession.
    :param on_snapshot: called (from a Spark thread) with a new :class:`Snapshot` after
        each batch.
    """

    def __init__(
        self,
        spark,
        directory: str,
        state: str,
        *,
        trigger: float = DEFAULT_TRIGGER,
        watermark: float = DEFAULT_WATERMARK,
        on_snapshot=None,
    ) -> None:
        self.spark = spark
        self.directory = os.path.abspath(directory)
        self.state = os.path.abspath(state)
        self.trigger = trigger
        self.watermark = watermark
        self.on_snapshot = on_snapshot
        self.snapshot = Snapshot(self.directory, trigger, time.time())
        self._lock = threading.Lock()
        self._queries: list = []
        self._files: set[str] = set()
        #: Added to each batch's line ids: ``seq`` increases along each file and across
        #: batches (a batch's ids are below ``partitions << 33``).
        self._line_base = 0
        self._generation = 0
        self._since_compaction = 0

    # -- where things are --------------------------------------------------------

    def table(self, name: str) -> str:
        """Where the follower keeps a table (``links``, ``reconnects``, ``delivery_audit``)."""
        return os.path.join(self.state, "tables", name)

    @property
    def events_path(self) -> str:
        return os.path.join(self.state, f"events-{self._generation}")

    # -- the queries -------------------------------------------------------------

    def lines(self):
        """The closed files' lines, as a stream: ``line``, ``source_file``."""
        from pyspark.sql import functions as F

        stream = (
            self.spark.readStream.format("text")
            .option("maxFileAge", MAX_FILE_AGE)
            .load(os.path.join(self.directory, CLOSED_GLOB))
        )
        return stream.select(F.col("value").alias("line"), F.col("_metadata.file_path").alias("source_file"))

    def start(self) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import DoubleType, StringType, StructField, StructType

        trigger = f"{self.trigger:g} seconds"
        events = (
            self.lines()
            .writeStream.queryName("mconn_follow_events")
            .foreachBatch(self._events_batch)
            .option("checkpointLocation", os.path.join(self.state, "checkpoints", "events"))
            .trigger(processingTime=trigger)
            .start()
        )
        self._queries.append(events)
        envelope = StructType(
            [
                StructField("event", StringType()),
                StructField("node_id", StringType()),
                StructField("log_time", DoubleType()),
            ]
        )
        record = F.from_json(F.regexp_replace("line", "^\\x1e", ""), envelope)
        activity = (
            self.lines()
            .select(record.alias("r"))
            .where(F.col("r.event").isin(list(ACTIVITY_EVENTS)) & F.col("r.log_time").isNotNull())
            .select(F.timestamp_seconds("r.log_time").alias("time"), F.col("r.event").alias("event"))
            .withWatermark("time", f"{self.watermark:g} seconds")
            .groupBy(F.window("time", f"{WINDOW_SECONDS} seconds"), "event")
            .count()
        )
        self._queries.append(
            activity.writeStream.queryName("mconn_follow_activity")
            .outputMode("update")
            .foreachBatch(self._activity_batch)
            .option("checkpointLocation", os.path.join(self.state, "checkpoints", "activity"))
            .trigger(processingTime=trigger)
            .start()
        )

    def stop(self) -> None:
        """Stop both queries (each waits for its batch to end)."""
        for query in self._queries:
            try:
                query.stop()
            except Exception:  # the session is going away: nothing left to stop
                pass
        self._queries.clear()

    def failure(self) -> str | None:
        """Why a query stopped, if one did."""
        for query in self._queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
        return None

    # -- the events batch: parse, append, rebuild the tables ---------------------------

    def _events_batch(self, batch, batch_id: int) -> None:
        started = time.time()
        try:
            self._append(batch)
            self._rebuild(started)
        except Exception as error:  # shown on the page; the query goes on
            with self._lock:
                self.snapshot.error = f"batch {batch_id}: {type(error).__name__}: {error}"
            self._publish()
            raise

    def _append(self, batch) -> None:
        from pyspark.sql import functions as F

        from mconn.pipeline import ingest

        spark = self.spark
        spark.sparkContext.setJobDescription("follow: read telemetry")
        # ingest.read_lines' columns: the line, its file, an id that increases along the file.
        lines = batch.select(
            "line", "source_file", (F.lit(self._line_base) + F.monotonically_increasing_id()).alias("_line_id")
        )
        self._line_base += max(1, batch.rdd.getNumPartitions()) << 33
        lines = lines.persist()
        try:
            classified = ingest.classify(lines)
            fast = classified.where(F.col("event") != ingest.RECHECK)
            rest = classified.where(F.col("event") == ingest.RECHECK).select(
                F.col("record").alias("line"),
                "source_file",
                F.shiftrightunsigned("seq", ingest.SEQ_BITS).alias("_line_id"),
            )
            rows = fast.unionByName(ingest.parse(ingest.records(rest)))
            rows.coalesce(1).write.mode("append").parquet(self.events_path)
            files = [r["source_file"] for r in lines.select("source_file").distinct().collect()]
        finally:
            lines.unpersist()
        self._files.update(files)
        self._since_compaction += 1
        if self._since_compaction >= COMPACT_EVERY:
            self._compact()
        now = time.time()
        lag = [now - os.path.getmtime(_local(f)) for f in files if os.path.exists(_local(f))]
        with self._lock:
            if lag:
                self.snapshot.lag_seconds = max(lag)
                self.snapshot.max_lag_seconds = max(self.snapshot.max_lag_seconds or 0.0, max(lag))

    def _compact(self) -> None:
        """Rewrite the events table as one file (a batch appends one), then drop the old."""
        old = self.events_path
        self._generation += 1
        self.spark.read.parquet(old).coalesce(1).write.mode("overwrite").parquet(self.events_path)
        shutil.rmtree(old, ignore_errors=True)
        self._since_compaction = 0

    def _rebuild(self, started: float) -> None:
        from pyspark.sql import functions as F

        from mconn.pipeline import audit, ingest, links, reconnects, sessions

        spark = self.spark
        everything = spark.read.parquet(self.events_path)
        events = everything.where(~F.col("event").isin(ingest.MALFORMED, ingest.UNKNOWN))
        # The frames the three tables share, cached for this rebuild (as job.py does for a run).
        spans = sessions.sessions(events).cache()
        breaks = sessions.suspensions(events).cache()
        counters = sessions.counters(events, spans).cache()
        builders = {
            "links": lambda: links.build(spans, breaks, counters, events),
            "reconnects": lambda: reconnects.build(events, breaks, spans),
            "delivery_audit": lambda: audit.build(counters),
        }
        written = {}
        try:
            for name, build in builders.items():
                spark.sparkContext.setJobDescription(f"follow: {name}")
                build().write.mode("overwrite").parquet(self.table(name))
                written[name] = spark.read.parquet(self.table(name))
        finally:
            for frame in (spans, breaks, counters):
                frame.unpersist()
            spark.sparkContext.setJobDescription(None)
        counts = {r["event"]: r["count"] for r in everything.groupBy("event").count().collect()}
        view = _summarise(written)
        with self._lock:
            s = self.snapshot
            s.batches += 1
            s.files = len(self._files)
            s.events = sum(n for e, n in counts.items() if e not in (ingest.MALFORMED, ingest.UNKNOWN))
            s.malformed = counts.get(ingest.MALFORMED, 0)
            s.audit, s.problems = view["audit"], view["problems"]
            s.links, s.link_count = view["links"], view["link_count"]
            s.reconnects, s.reconnect_count = view["reconnects"], view["reconnect_count"]
            s.last_batch_at = time.time()
            s.last_batch_seconds = s.last_batch_at - started
            s.error = None
        self._publish()

    # -- the activity batch ----------------------------------------------------------

    def _activity_batch(self, batch, batch_id: int) -> None:
        rows = batch.collect()  # the windows this batch changed: a few per event
        with self._lock:
            activity = self.snapshot.activity
            for row in rows:
                start = row["window"]["start"].timestamp()
                activity.setdefault(start, {})[row["event"]] = row["count"]
            for start in sorted(activity)[:-WINDOWS_SHOWN]:
                del activity[start]
            progress = self._queries[1].lastProgress if len(self._queries) > 1 else None
            if progress:
                self.snapshot.watermark = (progress.get("eventTime") or {}).get("watermark")
        self._publish()

    def _publish(self) -> None:
        if self.on_snapshot is not None:
            with self._lock:
                snapshot = dataclasses.replace(self.snapshot, activity=dict(self.snapshot.activity))
            self.on_snapshot(snapshot)


def _local(uri: str) -> str:
    """The local path of a ``file:`` URI as Spark names a file."""
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def _summarise(tables: dict) -> dict:
    """The bounded part of the tables the page shows (collected on the driver)."""
    from pyspark.sql import functions as F

    audit_df, links_df, reconnects_df = tables["delivery_audit"], tables["links"], tables["reconnects"]
    row = audit_df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(F.col("sender_final") & F.col("receiver_final"), F.col("accepted"))), F.lit(0)).alias(
            "messages_audited"
        ),
        *[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in ("lost", "duplicated", "in_doubt", "unsettled")],
        *[F.count(F.when(F.col("verdict") == v, 1)).alias(v + "_rows") for v in ("one_sided", "ok")],
    ).first()
    assert row is not None  # an aggregate without grouping has one row
    audit = row.asDict()
    audit["verdict"] = "lost" if audit["lost"] else "duplicated" if audit["duplicated"] else "ok"
    problems = [
        r.asDict()
        for r in audit_df.where(F.col("verdict") != "ok")
        .orderBy(F.desc("lost"), F.desc("duplicated"), "sender", "receiver", "session_id", "channel_id")
        .limit(ROWS_SHOWN)
        .collect()
    ]
    link_rows = links_df.orderBy(F.desc("start"), "node_id", "peer_id").limit(ROWS_SHOWN).collect()
    dial_rows = reconnects_df.orderBy(F.desc("time"), "node_id", "peer_id").limit(ROWS_SHOWN).collect()
    return {
        "audit": audit,
        "problems": problems,
        "links": [_plain(r.asDict()) for r in link_rows],
        "link_count": links_df.count(),
        "reconnects": [_plain(r.asDict()) for r in dial_rows],
        "reconnect_count": reconnects_df.count(),
    }


def _plain(row: dict) -> dict:
    """A row with its timestamps as seconds since the epoch (JSON, the page)."""
    return {k: (v.timestamp() if hasattr(v, "timestamp") else v) for k, v in row.items()}


# -- the command ---------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mconn-pipeline --follow",
        description="Follow a fleet's telemetry directory while it runs: the links, reconnects and "
        "delivery_audit tables kept current from its closed files, on a page served on 127.0.0.1.",
    )
    p.add_argument("--follow", required=True, metavar="DIR", help="the directory the nodes' telemetry files are in")
    p.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"the page's port on 127.0.0.1 (0: any free one; default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--trigger",
        type=positive_seconds,
        default=DEFAULT_TRIGGER,
        metavar="SECONDS",
        help=f"seconds between micro-batches (default {DEFAULT_TRIGGER:g})",
    )
    p.add_argument(
        "--watermark",
        type=positive_seconds,
        default=DEFAULT_WATERMARK,
        metavar="SECONDS",
        help=f"how late a record may come and still count in its activity window (default {DEFAULT_WATERMARK:g})",
    )
    p.add_argument(
        "--out",
        metavar="STATE",
        help="keep the follower's state here (events, tables, checkpoints); default: a temporary "
        "directory removed at exit",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (default local[2])")
    p.add_argument(
        "--conf", type=parse_conf, action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    return p


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"wants a port number from 0 to 65535, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"wants a positive number of seconds, got {text!r}")
    return value


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if not os.path.isdir(args.follow):
        print(f"mconn-pipeline: error: {args.follow}: not a directory", file=sys.stderr)
        return 1
    state = args.out or tempfile.mkdtemp(prefix="mconn-follow-")
    os.makedirs(state, exist_ok=True)
    try:
        return _serve(args, state)
    finally:
        if args.out is None:
            shutil.rmtree(state, ignore_errors=True)


def _serve(args, state: str) -> int:
    from twisted.internet import reactor as _reactor

    reactor = cast(Any, _reactor)  # the global reactor: IReactorTCP, IReactorThreads, run and stop

    from mconn.pipeline.follow_page import PageHolder, listen
    from mconn.pipeline.spark import build_session

    spark = build_session(
        args.master or "local[2]",
        {**SESSION_CONF, **dict(args.conf)},
        app_name="mconn-pipeline-follow",
        java_options=JAVA_OPTIONS,
        input_size=0,
    )
    follower = Follower(spark, args.follow, state, trigger=args.trigger, watermark=args.watermark)
    holder = PageHolder(follower.snapshot)
    follower.on_snapshot = lambda snapshot: reactor.callFromThread(holder.update, snapshot)
    try:
        port = listen(reactor, holder, args.port)
    except Exception as error:
        spark.stop()
        print(f"mconn-pipeline: error: cannot listen on 127.0.0.1:{args.port}: {error}", file=sys.stderr)
        return 1
    follower.start()
    url = f"http://127.0.0.1:{port.getHost().port}/"
    print(f"mconn-pipeline: following {follower.directory}; the page is {url}", flush=True)

    def shut_down() -> None:
        port.stopListening()
        follower.stop()
        spark.stop()

    def watch() -> None:
        failure = follower.failure()
        if failure is not None:
            print(f"mconn-pipeline: error: {failure}", file=sys.stderr, flush=True)
            outcome.append(1)
            reactor.stop()

    from twisted.internet import task

    outcome: list[int] = []
    checker = task.LoopingCall(watch)
    checker.start(max(args.trigger, 1.0), now=False)
    reactor.addSystemEventTrigger("before", "shutdown", shut_down)
    reactor.run()
    return outcome[0] if outcome else 0
