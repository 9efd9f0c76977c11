"""The pipeline's stages, in order (specs/pipeline.md section 1).

``run`` reads the telemetry once into the ``events`` table (Parquet, one partition per
event name), then builds each output table from it and writes it under ``out``, then
the summary and the report. Each stage prints one progress line. The few small frames
several tables share (sessions, breaks, counters, round-trip samples) are cached for the run.

Fixed costs. At ``make run``'s size most of a run's CPU is the driver's (analysis,
planning, the JVM compiling both), paid per Spark query, so a run has few: the read, one
write per table, one summary query and one report query (specs/pipeline.md section 6).
No query reads a table back for its schema (each is read with the schema it was written
with), none counts a table (its rows are counted while it is written: ``Observation``),
and the event counts, the findings' counts and every bounded top-N the report shows come
with the summary and report queries, each collected once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

from pyspark.sql import DataFrame, Observation, functions as F
from pyspark.sql.types import StructType

from mconn.pipeline import audit, channels, errors, ingest, latency, links, names, reconnects, sessions, summary
from mconn.pipeline.spark import Progress
from mconn.pipeline.tables import STAGES, local_path, table_path


@dataclasses.dataclass
class Result:
    """What a run made: the summary row, where the tables and the report are, timings."""

    out: str
    summary: dict
    event_counts: dict
    report: str | None
    timings: dict
    #: The audit's findings (``audit.Findings``), sessions seen without their start
    #: counted whether or not ``since`` was given (``console_findings`` tells them apart).
    findings: audit.Findings | None = None

    def console_findings(self, since=None) -> audit.Findings | None:
        """The findings as the console states them: with ``since``, sessions seen without
        their start are not counted (their start may be before it)."""
        if since is None or self.findings is None:
            return self.findings
        return dataclasses.replace(self.findings, starts_cut=True, unstarted={})

    def table(self, name: str) -> str:
        return table_path(self.out, name)


def run(spark, inputs, out: str, *, since=None, until=None, report_path: str | None = None, progress=None) -> Result:
    """Run every stage; ``report_path`` defaults to ``out/report.html`` for a local ``out``."""
    progress = progress or Progress(len(STAGES))
    everything, channel_ids = _read(spark, list(inputs), out, since, until, progress)
    events = everything.where(~F.col("event").isin(ingest.MALFORMED, ingest.UNKNOWN))
    shared = _Shared(events, channel_ids)
    try:
        written, rows = _tables(spark, events, shared, out, progress)
        with _stage(spark, progress, "summary") as stage:
            query = summary.query(
                everything,
                shared.nodes,
                links=written["links"],
                reconnects=written["reconnects"],
                audit=written["delivery_audit"],
                errors=written["errors"],
                latency=written["latency"],
            )
            collected = query.first()
            assert collected is not None  # aggregates without grouping: exactly one row
            extra = collected.asDict()
            headline = {c: extra[c] for c in summary.COLUMNS}
            counts = dict(extra["event_counts"] or {})
            # The table from the collected row: a local relation, no second pass over the inputs.
            columns = StructType([f for f in query.schema.fields if f.name in summary.COLUMNS])
            row = spark.createDataFrame([tuple(headline[c] for c in summary.COLUMNS)], columns)
            # One part file: the local relation would be cut into the session's default
            # parallelism, a task and an empty file for each slice past the first.
            row.coalesce(1).write.mode("overwrite").parquet(table_path(out, "summary"))
            stage.detail = (
                f"{headline['events']:,} events, {headline['malformed_records']:,} malformed, "
                f"{headline['unknown_events']:,} unknown; lost {headline['lost']}, duplicated {headline['duplicated']}"
            )
        with _stage(spark, progress, "report") as stage:
            report_path = report_path or _default_report(out)
            parts = audit.finding_parts(written["delivery_audit"], written["links"], starts_cut=False)
            parts += names.parts(events)  # how the findings and the report name nodes and channels
            if report_path is not None:
                from mconn.pipeline import report  # matplotlib: only when a report is made

                parts += report.parts(written, rows, shared, counts, extra["rtt_samples"], everything)
            # Every bounded top-N and sample the findings and the report show: one query.
            gathered = parts[0]
            for part in parts[1:]:
                gathered = gathered.crossJoin(part)
            got = gathered.first()
            assert got is not None
            found = audit.assemble(extra, got.asDict(), starts_cut=False)
            if report_path is not None:
                report.write(report_path, headline, got.asDict(), counts, found)
                stage.detail = report_path
            else:
                stage.detail = "skipped: no local --report path for a remote --out"
    finally:
        shared.release()
    return Result(
        out=out,
        summary=headline,
        event_counts=counts,
        report=report_path,
        timings=dict(progress.timings),
        findings=found,
    )


def _read(spark, inputs: list[str], out: str, since, until, progress):
    """The read stage: the events table written, and read with the schema it was written
    with (no job reads it back for its schema), and the channel ids of its channel_stats
    (``ingest.Written``). Its records per event are counted by the summary query
    (Parquet's row counts of each partition, no column read)."""
    with _stage(spark, progress, "read telemetry") as stage:
        events_path = table_path(out, "events")
        written = ingest.write_events(spark, inputs, events_path, since, until)
        everything = ingest.load_events(spark, events_path, written.schema)
        stage.detail = f"events table written from {len(inputs):,} input paths"
    return everything, written.channel_ids


def _tables(spark, events, shared, out: str, progress) -> tuple[dict, dict]:
    """One stage per table: built, written (its rows counted on the way), read back with
    the schema it was built with (no job reads a footer); returns the tables and their sizes."""
    builders = {
        "links": lambda: links.build(shared.sessions, shared.breaks, shared.counters, events),
        "reconnects": lambda: reconnects.build(events, shared.breaks, shared.sessions),
        "delivery_audit": lambda: audit.build(shared.counters),
        "channels": lambda: channels.table(shared.channel_minutes),
        "latency": lambda: latency.build(shared.rtt_samples),
        "errors": lambda: errors.build(events),
    }
    written, rows = {}, {}
    for name, build in builders.items():
        with _stage(spark, progress, name) as stage:
            size = Observation(name)
            table = build()
            table.observe(size, F.count(F.lit(1)).alias("rows")).write.mode("overwrite").parquet(table_path(out, name))
            written[name] = spark.read.schema(table.schema).parquet(table_path(out, name))
            rows[name] = size.get["rows"]
            stage.detail = f"{rows[name]:,} rows"
    return written, rows


@contextlib.contextmanager
def _stage(spark, progress, name: str):
    """A progress stage whose Spark jobs carry its name as their description (the Spark
    UI and event log group the work by stage: bench/pipeline_bench.py --event-log)."""
    spark.sparkContext.setJobDescription(name)
    try:
        with progress.stage(name) as stage:
            yield stage
    finally:
        spark.sparkContext.setJobDescription(None)


def _default_report(out: str) -> str | None:
    local = local_path(out)
    return os.path.join(local, "report.html") if local is not None else None


class _Shared:
    """Frames several stages use, built on first use and cached for the run."""

    def __init__(self, events, channel_ids: list | None = None) -> None:
        self.events = events
        #: Every channel id of the events' channel_stats (``ingest.Written``), if known.
        self.channel_ids = channel_ids
        self._cached: list[DataFrame] = []

    def _keep(self, df):
        self._cached.append(df.cache())
        return self._cached[-1]

    @property
    def nodes(self):
        # Not cached: a cached frame used twice in one plan (sessions joins it for the
        # last event time and again through its restarts) is computed by two concurrent
        # stages, and its task binary grows to megabytes. Two narrow scans of the events
        # table (node_id, log_time, event) for the sessions and the summary instead of
        # three.
        return sessions.node_times(self.events)

    @functools.cached_property
    def sessions(self):
        return self._keep(sessions.sessions(self.events, self.nodes))

    @functools.cached_property
    def breaks(self):
        return self._keep(sessions.suspensions(self.events))

    @functools.cached_property
    def counters(self):
        return self._keep(sessions.counters(self.events, self.sessions))

    @functools.cached_property
    def channel_minutes(self):
        # The channels table's rows with the report's contention sums: the channels
        # stage builds them, the report aggregates them (no second pass over the samples).
        return self._keep(channels.per_minute(self.events, self.channel_ids))

    @functools.cached_property
    def rtt_samples(self):
        return self._keep(latency.samples(self.events))

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()
