"""What any Spark pipeline costs at least on a fleet's telemetry, against the Python audit.

    .venv/bin/python bench/spark_floor.py [--events 1000000,3000000] [--nodes 100] [--degree 8]
        [--master local[2]] [--data DIR] [--keep]

The pipeline's target is at least the Python baseline's speed (bench/pipeline_baseline.py,
one process, ``json.loads`` of every line, the delivery audit only) at 1 M events and above.
This bench measures the floor under that target: on the same files, in the same run, each
in a fresh process, with the pipeline's own session settings (``build_session``):

* ``start``: a SparkSession on ``--master`` started and stopped, no job;
* ``text``: + ``spark.read.text`` of every file, counted (the bytes read, split into lines);
* ``audit``: + the least Spark program that computes the baseline's result: Spark's JSON
  source with an explicit schema of the ``session_ended`` fields, the two ends of every
  session joined, the lost and duplicated counts summed and collected (one action).

No pipeline can be faster than ``audit`` and still compute the audit, let alone every table
and the report. Each row prints wall seconds, CPU seconds of the process tree (the JVM
included) and the baseline's time over it. The fleet comes from bench/pipeline_bench.py's
generator (version 2 records, ``--lost`` 5 and ``--duplicated`` 5 injected); ``audit``
must find them, as the baseline does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import pipeline_bench  # noqa: E402  (the generator and the process-tree timer)

PROGRAMS = ("start", "text", "audit")


def program(kind: str, data: str, master: str) -> dict:
    """Run one floor program in this process (called in a fresh process by ``measure``)."""
    sys.path.insert(0, REPO)
    from mconn.pipeline.spark import build_session, input_bytes

    spark = build_session(master, {"spark.driver.memory": "1g"}, input_size=input_bytes([data]))
    result: dict = {}
    if kind == "text":
        result["lines"] = spark.read.text(data).count()
    elif kind == "audit":
        result.update(audit(spark, data))
    spark.stop()
    return result


def audit(spark, data: str) -> dict:
    """The baseline's delivery audit in Spark, the least it takes: one read, one join."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    counter = T.StructType([T.StructField(n, T.LongType()) for n in ("channel_id", "accepted", "acked", "delivered")])
    left = T.StructType([T.StructField(n, T.LongType()) for n in ("channel_id", "count")])
    fields = [T.StructField(n, T.StringType()) for n in ("event", "node_id", "peer_id", "session_id")]
    schema = T.StructType(
        fields + [T.StructField("channels", T.ArrayType(counter)), T.StructField("undelivered", T.ArrayType(left))]
    )
    ends = spark.read.schema(schema).json(data).where(F.col("event") == "session_ended")
    sent = ends.select("node_id", "peer_id", "session_id", "undelivered", F.explode("channels").alias("c"))
    sent = sent.select(
        "node_id",
        "peer_id",
        "session_id",
        F.col("c.channel_id").alias("channel"),
        F.col("c.accepted").alias("accepted"),
        F.coalesce(
            F.aggregate(
                F.filter("undelivered", lambda u: u.channel_id == F.col("c.channel_id")),
                F.lit(0).cast("long"),
                lambda acc, u: acc + u["count"],
            ),
            F.lit(0),
        ).alias("undelivered"),
    )
    got = ends.select(
        F.col("node_id").alias("receiver"),
        F.col("peer_id").alias("sender"),
        "session_id",
        F.explode("channels").alias("c"),
    )
    got = got.select(
        "receiver",
        "sender",
        "session_id",
        F.col("c.channel_id").alias("channel"),
        F.col("c.delivered").alias("delivered"),
    )
    rows = sent.join(
        got,
        (sent.node_id == got.sender)
        & (sent.peer_id == got.receiver)
        & (sent.session_id == got.session_id)
        & (sent.channel == got.channel),
    )
    lost = F.greatest(F.lit(0), F.col("accepted") - F.col("delivered") - F.col("undelivered"))
    duplicated = F.greatest(F.lit(0), F.col("delivered") - F.col("accepted"))
    row = rows.agg(
        F.count(F.lit(1)).alias("rows"), F.sum(lost).alias("lost"), F.sum(duplicated).alias("duplicated")
    ).collect()[0]
    return {"rows": row["rows"], "lost": row["lost"], "duplicated": row["duplicated"]}


def measure(kind: str, data: str, master: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--run", kind, "--data", data, "--master", master]
    load = os.getloadavg()[0]
    seconds, stdout, _, _, cpu = pipeline_bench.timed(command, cwd=REPO)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "load": (load, os.getloadavg()[0]),
        **json.loads(stdout.strip().splitlines()[-1]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", default="1000000,3000000")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--degree", type=int, default=8)
    parser.add_argument("--lost", type=int, default=5)
    parser.add_argument("--duplicated", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--run", choices=PROGRAMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        print(json.dumps(program(args.run, args.data, args.master)))
        return 0
    root = args.data or tempfile.mkdtemp(prefix="spark-floor-")
    print(f"{'events':>12} {'program':>9} {'wall s':>8} {'cpu s':>8} {'base/it':>8}  result, load")
    try:
        for size in (int(float(s)) for s in args.events.split(",")):
            args.events_target = size
            data = os.path.join(root, f"fleet-{size}")
            if not os.path.isdir(data):
                pipeline_bench.generate(args, data)
            base = pipeline_bench.run_baseline(data)
            print(
                f"{base['events']:>12,} {'python':>9} {base['seconds']:>8.1f} {base['cpu_seconds']:>8.1f} "
                f"{1.0:>8.2f}  lost {base['lost']} duplicated {base['duplicated']}",
                flush=True,
            )
            for kind in PROGRAMS:
                run = measure(kind, data, args.master)
                extra = {k: v for k, v in run.items() if k not in ("seconds", "cpu_seconds", "load")}
                print(
                    f"{base['events']:>12,} {kind:>9} {run['seconds']:>8.1f} {run['cpu_seconds']:>8.1f} "
                    f"{base['seconds'] / run['seconds']:>8.2f}  {extra or ''} load {run['load'][0]:.1f}"
                    f"->{run['load'][1]:.1f}",
                    flush=True,
                )
    finally:
        if not args.keep and not args.data:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
