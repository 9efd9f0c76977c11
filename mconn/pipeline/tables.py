"""The names of the pipeline's tables and stages, and where a table lives under ``out``.

A leaf: the job writes the tables under these names, the console lists them.
"""

from __future__ import annotations

TABLES = ("links", "reconnects", "delivery_audit", "channels", "latency", "errors", "summary")
STAGES = ("read telemetry", *TABLES, "report")


def table_path(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


def local_path(out: str) -> str | None:
    """The local directory behind ``out``, or None for a remote URI (hdfs://, s3a://...)."""
    if out.startswith("file:"):
        rest = out[len("file:") :]
        return "/" + rest.lstrip("/")  # file:/x, file:///x
    return None if "://" in out else out
