"""A quiet SparkSession, and the progress line printed per stage.

Quiet means: no web UI, no console progress bars, log level WARN (log4j's startup banner
suppressed too), and, when the master is local, a driver bound to 127.0.0.1 only. On
``spark-submit`` the master and resources come from the command line; nothing here
overrides them (specs/pipeline.md section 6).

Small local inputs. A run over a few MB (a test, ``make run``'s five nodes) is all fixed
costs: the JVM compiling its own hot code, Spark generating and compiling Java for each
query (Janino, itself still interpreted in a fresh JVM), and one task per shuffle
partition per stage. Measured on 3 MB of telemetry (3,113 events), the driver JVM spent
96 s of CPU on a run with the defaults and 36 to 44 s with ``SMALL_DEFAULTS`` and
``SMALL_JAVA_OPTIONS``. Those settings would slow a large input down (interpreted
expressions, no optimizing JIT), so they apply only when the master is local and the
local input is below ``SMALL_INPUT`` bytes (``input_bytes``).

Local files written without checksum files. pyspark ships Hadoop without its native
library, so Hadoop's local file system sets the permissions of each file and directory it
creates by running ``chmod``: a process forked from the driver JVM per Parquet part, per
``_SUCCESS``, per committer directory, and per ``.crc`` checksum file beside each of the
files. With a local master the session's local file system writes no ``.crc`` files
(``skip_local_checksum_files``): 160 ``chmod`` processes for a 10 k-event run became 117
(bench/PIPELINE_RESULTS.md). The other ``chmod`` calls have no switch: only the native
library avoids them.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import sys
import tempfile
import time
import typing

#: log4j2 configuration for a local driver: warnings only, Hadoop's native-library
#: notice and Spark's loopback-address notice silenced, and so is the RPC dispatcher's
#: "message dropped" for an endpoint already stopped: on a loaded machine an executor's
#: last heartbeat can race the driver's stop, after the job has finished.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.dispatcher.name = org.apache.spark.rpc.netty.Dispatcher
logger.dispatcher.level = error
"""

#: Settings for every run; a key already set (spark-submit, --conf) wins.
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.log.structuredLogging.enabled": "false",
    "spark.sql.debug.maxToStringFields": "200",  # the events table is wide: no plan-truncation warning
    # The events table is written partitioned by event name (a dozen values): a writer per
    # value open at once, instead of a sort of every wide row by its partition first.
    "spark.sql.maxConcurrentOutputFileWriters": "32",
}

#: Extra settings when the master is local (one machine: few partitions, loopback only).
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "8",
    # The inputs are local files the command line resolved: Spark lists them in the
    # driver (a stat each) instead of running a job of one task per path above 32 paths.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}

#: Local input below this many bytes is small: fixed costs dominate (module doc).
SMALL_INPUT = 128 * 2**20

#: Extra settings for a small input: one shuffle partition, no code generation, and no
#: adaptive execution (with one partition it has nothing to coalesce, and it runs each
#: query stage as a job of its own, re-planned in between: 17.5 s against 19.2 s for a
#: 10 k-event run, bench/PIPELINE_RESULTS.md).
SMALL_DEFAULTS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

#: JVM flags for a small input: the quick JIT tier only (C2's compilations cost more
#: CPU than they save on a run of a minute), with room for its code: that tier's default
#: code cache (48 MB) fills in a session that runs many small jobs (the test suite's one
#: session did), and a JVM that stops compiling also failed to link a method handle in a
#: task, which killed the session.
SMALL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"


def parse_conf(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of a ``--conf`` Spark setting (the batch and the follow command's)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--conf wants KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def input_bytes(paths) -> int | None:
    """Bytes of the local files behind ``paths`` (files, directories, globs, ``file:``
    URIs); None when one is a remote URI or matches nothing (Spark reports it later)."""
    total = 0
    for path in paths:
        if path.startswith("file:"):
            path = "/" + path[len("file:") :].lstrip("/")
        elif "://" in path:
            return None
        matches = glob.glob(path) if any(c in path for c in "*?[") else [path]
        if not matches or not all(os.path.exists(m) for m in matches):
            return None
        for match in matches:
            if os.path.isdir(match):
                for top, _, files in os.walk(match):
                    total += sum(os.path.getsize(os.path.join(top, f)) for f in files)
            else:
                total += os.path.getsize(match)
    return total


def build_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "mconn-pipeline",
    java_options: str = "",
    input_size: int | None = None,
):
    """The SparkSession of a run (the existing one if a SparkContext is already up).

    :param master: e.g. ``local[2]``; None keeps what spark-submit set, or ``local[*]``.
    :param conf: extra Spark settings, applied over the defaults.
    :param java_options: more JVM flags for a local driver started here.
    :param input_size: bytes of input (``input_bytes``), if known: below ``SMALL_INPUT``
        a local run gets ``SMALL_DEFAULTS`` and ``SMALL_JAVA_OPTIONS``.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Launched by spark-submit: its JVM holds --master and --conf, and a SparkConf
        # sees them only once the gateway to that JVM is up (else spark-submit's
        # --master was ignored for local[*]).
        SparkContext._ensure_initialized()
    existing = SparkConf()  # holds spark-submit's settings when launched by it
    master = master or existing.get("spark.master", None) or "local[*]"
    if master.startswith("local"):
        local_environment()
    settings = session_settings(master, existing.contains, conf, java_options, input_size)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if master.startswith("local"):
        skip_local_checksum_files(spark)
    return spark


def local_environment() -> None:
    """The environment a local master's processes get from this one, unless already set:
    Spark bound to the loopback address, and ``PYSPARK_PYTHON`` this interpreter.

    pyspark starts its Python workers (the pipeline needs one, for ``createDataFrame``'s
    rows) with ``PYSPARK_PYTHON``, else the first ``python3`` on PATH: maybe another
    Python, whose worker pyspark refuses when its minor version differs, or a version
    manager's shim (pyenv's: 20 processes, 16 of them shell scripts, 0.17 s before the
    interpreter starts). A local master's workers run on this machine, so this one is there."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def skip_local_checksum_files(spark) -> None:
    """Files written through the session's local (``file:``) file system get no ``.crc``
    checksum file beside them (module doc): Hadoop writes one per file, and sets its
    permissions with a ``chmod`` process of its own.

    A local master only: its tasks run in the driver JVM and share the file system object
    set here (Hadoop caches one per scheme and user); a cluster's executors are other JVMs,
    left as they are. Reading is unchanged: a ``.crc`` file already beside a file is still
    verified. Not a setting: ``fs.file.impl=org.apache.hadoop.fs.RawLocalFileSystem`` would
    do the same, but ``SparkContext.textFile`` and the other Hadoop-RDD readers cast the
    local file system to ``LocalFileSystem`` and fail with a ``ClassCastException``."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    local = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    local.setWriteChecksum(False)  # a no-op on a file system that writes no checksums


def session_settings(
    master: str,
    is_set,
    conf: dict[str, str] | None = None,
    java_options: str = "",
    input_size: int | None = None,
) -> dict[str, str]:
    """The settings ``build_session`` applies: the defaults for ``master`` (those of a
    small input too), less the keys ``is_set`` (spark-submit's), plus ``conf``."""
    settings = dict(DEFAULTS)
    if master.startswith("local"):
        settings.update(LOCAL_DEFAULTS)
        if input_size is not None and input_size < SMALL_INPUT:
            settings.update(SMALL_DEFAULTS)
            java_options = f"{SMALL_JAVA_OPTIONS} {java_options}"
    # The driver JVM started here (any master: the driver runs here, client mode) logs
    # warnings only from its first line; spark-submit's own JVM is already running.
    options = f"-Dlog4j2.configurationFile=file:{_log4j_file()} {java_options}"
    settings["spark.driver.extraJavaOptions"] = options.strip()
    settings = {k: v for k, v in settings.items() if not is_set(k)}
    settings.update(conf or {})
    return settings


def _log4j_file() -> str:
    """The log4j2 configuration's file, written once per user and content (its name carries
    a digest of ``_LOG4J2``, so a changed configuration never meets a stale file)."""
    digest = hashlib.sha256(_LOG4J2.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"mconn-pipeline-log4j2-{os.getuid()}-{digest}.properties")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2)
        os.replace(tmp, path)
    return path


class Progress:
    """One line per stage: ``[n/total] stage: detail (1.2 s)``, on stderr by default.

    On a terminal the line appears when the stage starts and is completed in place.
    """

    def __init__(self, total: int, stream=None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done = 0
        self.timings: dict[str, float] = {}

    def stage(self, name: str) -> _Stage:
        """A context manager for one stage; set ``.detail`` on it to say what it made."""
        return _Stage(self, name)

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()

    def _is_tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())


class _Stage:
    def __init__(self, progress: Progress, name: str) -> None:
        self.progress = progress
        self.name = name
        self.detail = ""

    def __enter__(self) -> _Stage:
        p = self.progress
        p.done += 1
        self.prefix = f"[{p.done}/{p.total}] {self.name}"
        self.started = time.monotonic()
        if p._is_tty():
            p._write(f"{self.prefix} ...")
        return self

    def __exit__(self, kind, value, tb) -> typing.Literal[False]:
        p = self.progress
        elapsed = time.monotonic() - self.started
        p.timings[self.name] = elapsed
        detail = "failed" if kind is not None else (self.detail or "done")
        back = "\r" if p._is_tty() else ""  # over the "..." line
        p._write(f"{back}{self.prefix}: {detail} ({elapsed:.1f} s)\n")
        return False
