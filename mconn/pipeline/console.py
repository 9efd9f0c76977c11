"""The short summary table the command prints, and one-line error messages."""

from __future__ import annotations

from mconn.pipeline.headline import rows, verdict
from mconn.pipeline.tables import TABLES


def summary_table(summary: dict, report: str | None, out: str) -> str:
    width = max(len(label) for label, _ in rows(summary))
    lines = ["mconn fleet telemetry"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows(summary)]
    lines.append(verdict(summary)[1])
    if report:
        lines.append(f"report: {report}")
    lines.append(f"tables: {out.rstrip('/')}/{{{','.join(TABLES)},events}}")
    return "\n".join(lines)


def describe(error: BaseException) -> str:
    """The first line of an error, without the JVM stack trace Spark appends."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
