"""A quiet SparkSession, and the progress line printed per stage.

Quiet means: no web UI, no console progress bars, log level WARN (log4j's startup banner
suppressed too), and, when the master is local, a driver bound to 127.0.0.1 only. On
``spark-submit`` the master and resources come from the command line; nothing here
overrides them (specs/pipeline.md section 6).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

#: log4j2 configuration for a local driver: warnings only, Hadoop's native-library
#: notice and Spark's loopback-address notice silenced.
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
"""

#: Settings for every run; a key already set (spark-submit, --conf) wins.
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.log.structuredLogging.enabled": "false",
    "spark.sql.debug.maxToStringFields": "200",  # the events table is wide: no plan-truncation warning
}

#: Extra settings when the master is local (one machine: few partitions, loopback only).
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "8",
}


def build_session(
    master: str | None = None, conf: dict[str, str] | None = None, app_name: str = "mconn-pipeline",
    java_options: str = "",
):
    """The SparkSession of a run (the existing one if a SparkContext is already up).

    :param master: e.g. ``local[2]``; None keeps what spark-submit set, or ``local[*]``.
    :param conf: extra Spark settings, applied over the defaults.
    :param java_options: more JVM flags for a local driver started here.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    existing = SparkConf()  # holds spark-submit's settings when launched by it
    master = master or existing.get("spark.master", None) or "local[*]"
    settings = dict(DEFAULTS)
    if master.startswith("local"):
        settings.update(LOCAL_DEFAULTS)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if not existing.contains("spark.driver.extraJavaOptions"):
            options = f"-Dlog4j2.configurationFile=file:{_log4j_file()} {java_options}"
            settings["spark.driver.extraJavaOptions"] = options.strip()
    settings = {k: v for k, v in settings.items() if not existing.contains(k)}
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _log4j_file() -> str:
    path = os.path.join(tempfile.gettempdir(), f"mconn-pipeline-log4j2-{os.getuid()}.properties")
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

    def stage(self, name: str) -> "_Stage":
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

    def __enter__(self) -> "_Stage":
        p = self.progress
        p.done += 1
        self.prefix = f"[{p.done}/{p.total}] {self.name}"
        self.started = time.monotonic()
        if p._is_tty():
            p._write(f"{self.prefix} ...")
        return self

    def __exit__(self, kind, value, tb) -> bool:
        p = self.progress
        elapsed = time.monotonic() - self.started
        p.timings[self.name] = elapsed
        detail = "failed" if kind is not None else (self.detail or "done")
        back = "\r" if p._is_tty() else ""  # over the "..." line
        p._write(f"{back}{self.prefix}: {detail} ({elapsed:.1f} s)\n")
        return False
