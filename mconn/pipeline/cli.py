"""``mconn-pipeline``: the command line of the fleet telemetry pipeline.

    mconn-pipeline LOGS... --out DIR [--master URL] [--since T] [--until T]
                   [--report FILE] [--conf KEY=VALUE]... [--check] [--json] [--quiet]
                   [--max-walk-entries N]
    mconn-pipeline --follow DIR [--port P] [--trigger SECONDS] [--watermark SECONDS]
                   [--out STATE] [--master URL] [--conf KEY=VALUE]...

LOGS are files, directories, globs (rotated files come along), or any URI Spark reads;
local ones are resolved to telemetry files before Spark starts (inputs.py: a missing
path is one line, a file that is not telemetry, or not a regular file, is skipped and
named; the walk follows no directory link and looks at ``--max-walk-entries`` entries
at most). Tables go to DIR
as Parquet, the report to DIR/report.html (or FILE). Progress lines and warnings go to
stderr, the summary table and the audit's findings to stdout. Exit status: 0 done, 1
the run failed, 2 bad usage, 3 with ``--check`` when the audit found a lost or
duplicated message.

With ``--follow DIR`` it keeps running instead (follow.py): the links, reconnects and
delivery_audit tables are kept current from DIR's closed telemetry files, on a page
served on 127.0.0.1.

On a cluster, ``mconn-pipeline-submit`` (submit.py) submits this file with the installed
pyspark's spark-submit; the master then comes from it::

    mconn-pipeline-submit --master spark://host:7077 --driver-memory 2g -- \\
        hdfs:///fleet/logs --out hdfs:///fleet/tables --report fleet.html
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from mconn.pipeline.inputs import MAX_WALK_ENTRIES
from mconn.pipeline.spark import parse_conf as parse_conf  # the --conf of both commands


def parse_time(text: str) -> float:
    """Seconds since the epoch, or an ISO 8601 date and time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither seconds since the epoch nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mconn-pipeline",
        description="Fleet telemetry of mconn nodes: link, reconnect, delivery-audit, channel, latency and "
        "error tables (Parquet) and an HTML report, on Spark.",
    )
    p.add_argument("logs", nargs="+", metavar="LOGS", help="telemetry files, directories, globs or URIs")
    p.add_argument("--out", required=True, metavar="DIR", help="where the tables go (any URI Spark writes)")
    p.add_argument("--master", metavar="URL", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--since", type=parse_time, metavar="T", help="only events at or after T")
    p.add_argument("--until", type=parse_time, metavar="T", help="only events before T")
    p.add_argument("--report", metavar="FILE", help="the HTML report (default: DIR/report.html for a local DIR)")
    p.add_argument(
        "--conf",
        type=parse_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.memory=1g (repeatable)",
    )
    p.add_argument("--check", action="store_true", help="exit with status 3 if a message was lost or duplicated")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--max-walk-entries",
        type=positive_int,
        metavar="N",
        default=MAX_WALK_ENTRIES,
        help=f"directory entries looked at, at most, to find the local LOGS' files (default: {MAX_WALK_ENTRIES})",
    )
    return p


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least 1, got {text!r}")
    return value


def resolve(args):
    """``inputs.resolve`` of the parsed ``args``' LOGS, within their ``--max-walk-entries``."""
    from mconn.pipeline import inputs

    return inputs.resolve(args.logs, args.max_walk_entries)


def main(argv=None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--follow" or a.startswith("--follow=") for a in arguments):
        from mconn.pipeline import follow  # a program that keeps running: follow.py

        return follow.main(arguments)
    args = parser().parse_args(argv)
    if args.since is not None and args.until is not None and args.since >= args.until:
        print("mconn-pipeline: error: --since must be before --until", file=sys.stderr)
        return 2
    from mconn.pipeline import inputs

    try:  # before Spark starts: a missing path costs one line, not a JVM and a stack trace
        selected = resolve(args)
    except inputs.InputError as error:
        print(f"mconn-pipeline: error: {error}", file=sys.stderr)
        return 1
    for line in selected.warnings:
        print(f"mconn-pipeline: warning: {line}", file=sys.stderr)
    from pyspark import SparkContext

    from mconn.pipeline import console, job
    from mconn.pipeline.spark import Progress, build_session, input_bytes

    progress = Progress(len(job.STAGES), enabled=not args.quiet)
    ours = SparkContext._active_spark_context is None  # else a caller's session: leave it running
    spark = build_session(args.master, dict(args.conf), input_size=input_bytes(selected.paths))
    try:
        result = job.run(
            spark,
            selected.paths,
            args.out,
            since=args.since,
            until=args.until,
            report_path=args.report,
            progress=progress,
        )
        found = result.console_findings(args.since)
    except Exception as error:  # an unwritable DIR, a lost cluster...
        print(f"mconn-pipeline: error: {console.describe(error)}", file=sys.stderr)
        return 1
    finally:
        if ours:
            spark.stop()
    if args.json:
        record = {
            "summary": result.summary,
            "timings": result.timings,
            "report": result.report,
            "findings": console.finding_lines(found),
            "warnings": selected.warnings,
        }
        print(json.dumps(record, default=str))
    else:
        print(console.summary_table(result.summary, result.report, args.out, found))
    if args.check and (result.summary["lost"] or result.summary["duplicated"]):
        return 3
    return 0


if __name__ == "__main__":  # spark-submit runs this file
    sys.exit(main())
