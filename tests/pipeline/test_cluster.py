"""The pipeline on a real Spark standalone cluster, and what the audit must never do.

One hand-made fleet (fleetlog.py) sits in a directory beside a node's private key: node A
restarted and its first run is in the rotated file ``A.json.1``, one message of A to B
was lost, C's clock is 5 s ahead, and D was killed before it logged any counters. The
command runs on it twice:

* locally, in this process (the session's local Spark), like ``mconn-pipeline``;
* through ``mconn-pipeline-submit --master spark://127.0.0.1:PORT`` on a standalone
  cluster of a master and two workers started here from the installed pyspark (loopback
  only, one core and 1 GiB each), with an environment that has no venv in it.

The cluster's tables and console must equal the local ones. The local run's console and
report show what the audit reads, names and never echoes. Every process started here is
stopped by its PID's process group (executors are children of the workers) at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pyspark
import pytest

from mconn.core.node_key import NodeKey
from mconn.pipeline.tables import TABLES

from .fleetlog import FleetLog, Link

SPARK_HOME = os.path.dirname(pyspark.__file__)
SUBMIT = os.path.join(os.path.dirname(sys.executable), "mconn-pipeline-submit")
#: Bounds of the waits: a JVM starting on a loaded machine, the whole submitted run.
START_TIMEOUT = 90
RUN_TIMEOUT = 420
SKEW = 5.0

# Two Spark runs at once beside a cluster's five JVMs: minutes on a loaded two-core machine.
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 2 * START_TIMEOUT + 120)


def build_fleet() -> FleetLog:
    """A and B lose one message; B and C's session shows C's clock 5 s ahead; D is killed; A restarts."""
    fleet = FleetLog()
    a, b, c, d = (fleet.node(n, current=True) for n in "ABCD")
    for node in (a, b, c, d):
        node.start(0)
        node.listen(0)
    ab = Link(a, b, "s-ab", 1)
    ab.send(a, 0x20, 10)
    ab.lose(a, 0x20)
    ab.send(b, 0x21, 4)
    ab.stats(a, 5)
    ab.end(20)
    bc = Link(b, c, "s-bc", 30)
    bc.send(b, 0x20, 3)
    bc.end(40)
    ad = Link(a, d, "s-ad", 50)  # D is killed (SIGKILL) at 55: it logs nothing more
    ad.send(a, 0x20, 5)
    ad.end(90, reason_type="SessionExpired", ends=(a,))
    a.start(100)  # A restarts: its first run is rotated out to A.json.1
    a.listen(100)
    return fleet


def write_fleet(directory) -> None:
    """The fleet's files, A's first run in ``A.json.1``, C's clock ahead, a private key beside them."""
    paths = build_fleet().write(directory)
    lines = [line + "\n" for line in paths["A"].read_text().split("\n") if line]  # not splitlines: RS splits
    times = [json.loads(line.lstrip("\x1e"))["log_time"] for line in lines]
    restart = max(t for t, line in zip(times, lines, strict=True) if '"node_started"' in line)
    paths["A"].with_name("A.json.1").write_text("".join(ln for t, ln in zip(times, lines, strict=True) if t < restart))
    paths["A"].write_text("".join(ln for t, ln in zip(times, lines, strict=True) if t >= restart))
    skewed = []
    for line in filter(None, paths["C"].read_text().split("\n")):
        record = json.loads(line.lstrip("\x1e"))
        record["log_time"] += SKEW
        skewed.append("\x1e" + json.dumps(record) + "\n")
    paths["C"].write_text("".join(skewed))
    NodeKey.generate().save(directory / "n0.key")


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fleet") / "run"
    write_fleet(directory)
    return directory


def _args(fleet_dir, out) -> list[str]:
    return [str(fleet_dir), "--out", str(out), "--quiet"]


@pytest.fixture(scope="module")
def local(fleet_dir, spark):
    """``mconn-pipeline RUN_DIR --out OUT`` on the session's local Spark: (status, stdout, stderr, out)."""
    from mconn.pipeline import cli

    out = fleet_dir.parent / "local"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(_args(fleet_dir, out))
    return status, stdout.getvalue(), stderr.getvalue(), out


class Cluster:
    """A standalone master and two workers from the installed pyspark, on 127.0.0.1 only."""

    def __init__(self, directory) -> None:
        self.directory = directory
        self.env = dict(
            os.environ,
            SPARK_HOME=SPARK_HOME,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        self.procs: list[subprocess.Popen] = []
        self._url = None
        self.master_log = directory / "master.log"
        self._start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"
        )

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def _wait_for(self, name: str, pattern: str) -> re.Match:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(pattern, (self.directory / f"{name}.log").read_text(errors="replace"))
            if found:
                return found
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        raise AssertionError(f"spark {name} did not log {pattern!r}: {(self.directory / f'{name}.log').read_text()}")

    def url(self) -> str:
        """The master's URL once both workers registered with it."""
        if self._url is None:
            self._url = self._wait_for("master", r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
            for n in (1, 2):
                work = self.directory / f"work{n}"
                work.mkdir()
                self._start(
                    f"worker{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work),
                    self._url,
                )
            for n in (1, 2):
                self._wait_for(f"worker{n}", "Successfully registered with master")
        return self._url

    def stop(self) -> None:
        """SIGTERM to each process group started here (workers take their executors), SIGKILL after 20 s."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        for proc in self.procs:  # nothing left in the groups (an executor outliving its worker)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running cluster (its JVMs start while the local run goes on); stopped by PID at the end."""
    cluster = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def submitted(cluster, fleet_dir, request):
    """The same command through ``mconn-pipeline-submit`` on the cluster, from an environment without the venv
    (no VIRTUAL_ENV, no SPARK_HOME, the venv not on PATH), while the local run goes on in this process:
    (status, stdout, stderr, out). Under spark-submit the driver's stderr comes out on stdout (Spark's
    PythonRunner merges them)."""
    out = fleet_dir.parent / "cluster"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "LANG": "C.UTF-8",
    }
    # A small input: the settings a local master gets for one (specs/pipeline.md section 6).
    small = [
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.sql.codegen.wholeStage=false",
        "--conf",
        "spark.sql.codegen.factoryMode=NO_CODEGEN",
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf",
        "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf",
        "spark.locality.wait=0",
    ]  # no 3 s wait per task for the executor holding a cached block
    command = [
        SUBMIT,
        "--master",
        cluster.url(),
        "--executor-memory",
        "512m",
        "--total-executor-cores",
        "2",
        *small,
        "--",
        *_args(fleet_dir, out),
    ]
    logs = fleet_dir.parent / "submitted.out", fleet_dir.parent / "submitted.err"
    with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
        proc = subprocess.Popen(
            command, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        request.getfixturevalue("local")  # both runs at once: the machine has two cores
        status = proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
    return status, logs[0].read_text(), logs[1].read_text(), out


def _rows(spark, out, name: str) -> list[dict]:
    """A table's rows, sorted, floats to 1e-9 (sums of doubles may add up in another order); the events
    table without ``seq`` (its numbering depends on the partitioning)."""

    def clean(value):
        return round(value, 9) if isinstance(value, float) else value

    rows = [
        {k: clean(v) for k, v in r.asDict(recursive=True).items() if k != "seq"}
        for r in spark.read.parquet(f"{out}/{name}").collect()
    ]
    return sorted(rows, key=repr)


def _console(text: str) -> list[str]:
    """The summary and findings lines, without the paths and the lines the driver wrote on stderr."""
    return [ln for ln in text.splitlines() if not ln.startswith(("report:", "tables:", "mconn-pipeline: "))]


def test_the_cluster_run_equals_the_local_run(spark, submitted, local, cluster):
    """spark-submit on a master and two workers makes the same tables (events included), the same audit and
    the same console summary as the local run; the job really ran on the cluster's executors."""
    status, stdout, stderr, out = submitted
    assert status == local[0] == 0, stderr
    for name in (*TABLES, "events"):
        assert _rows(spark, out, name) == _rows(spark, local[3], name), name
    assert _console(stdout) == _console(local[1])
    master_log = cluster.master_log.read_text()
    assert "Registered app mconn-pipeline" in master_log
    assert len(re.findall(r"Launching executor \S+ on worker", master_log)) == 2


def test_the_submitted_run_is_quiet_before_the_job_starts(submitted):
    """Without a venv on PATH the command finds Spark and Python itself (no "Could not find valid SPARK_HOME")
    and prints no Spark INFO line and no log4j banner: stderr holds the JVM's one notice, and stdout starts
    with the pipeline's own warning (the driver's stderr, merged by spark-submit)."""
    status, stdout, stderr, out = submitted
    assert status == 0, stderr
    # Only the JVM's own notices (Java 17: the incubator module Spark 4 loads); no Spark log line.
    assert all(ln.startswith("WARNING: ") for ln in stderr.splitlines()), stderr
    assert not re.search(r" (INFO|WARN) |log4j", stdout + stderr)
    assert stdout.splitlines()[0] == (
        f"mconn-pipeline: warning: skipped 1 file(s) in {out.parent / 'run'} not named like telemetry: n0.key"
    )


def test_only_telemetry_is_read_and_the_key_never_reaches_a_table_or_the_report(local, spark):
    """The run directory's key is skipped by name (one warning naming it); no malformed record, nothing of the
    key in the events table or the report."""
    status, _, stderr, out = local
    key = (out.parent / "run" / "n0.key").read_text()
    assert status == 0
    assert (
        f"mconn-pipeline: warning: skipped 1 file(s) in {out.parent / 'run'} not named like telemetry: n0.key"
        in stderr.splitlines()
    )
    events = spark.read.parquet(f"{out}/events")
    assert events.where("event = '_malformed'").count() == 0
    report = (out / "report.html").read_text()
    assert "PRIVATE KEY" not in report and key.splitlines()[1] not in report


def test_rotated_files_are_read_and_the_restart_counted(local):
    """A's first run is only in A.json.1: read with the directory, it makes A's restart count (0 without it)."""
    summary_line = next(ln for ln in local[1].splitlines() if "nodes / events" in ln)
    assert "4 (1 restarts)" in summary_line


def test_the_console_names_the_lost_row_the_killed_end_and_the_skew(local):
    """The console names the lost message's row, puts the one-sided row down to the killed node D (its logs
    are there), and warns that C's clock is 5 s ahead of B's, saying the audit does not depend on clocks."""
    from .fleetlog import node_id, session_id

    lines = local[1].splitlines()
    a, b, c = node_id("A"), node_id("B"), node_id("C")
    # The verdict, then what is not confirmed either way: D's one-sided row.
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("PROBLEM: 1 lost (see delivery_audit); "))
    assert "; 1 one-sided rows: one end logged no counters for them" in lines[verdict]
    assert lines[verdict + 1] == f"  1 lost: sender {a} receiver {b} session {session_id('s-ab')} channel 0x20"
    assert (
        "note: 1 one-sided rows: the silent end is in the logs but logged no counters for the channel (its "
        "node was killed before it logged them)" in lines
    )
    assert f"warning: clock skew: session {session_id('s-bc')}: {c} logged its start 5.00 s after {b}" in lines
    assert any("does not depend on clocks" in ln for ln in lines)
    report = (local[3] / "report.html").read_text()
    assert "the silent end is in the logs" in report and "clock skew" in report
