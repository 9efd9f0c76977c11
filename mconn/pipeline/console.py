"""The short summary table the command prints, the findings beside it, and one-line error messages."""

from __future__ import annotations

from mconn.pipeline import names
from mconn.pipeline.headline import rows, verdict
from mconn.pipeline.tables import TABLES


def summary_table(summary: dict, report: str | None, out: str, findings=None) -> str:
    """The summary rows, the verdict, and what ``finding_lines`` says about ``findings``
    (an ``audit.Findings``, or its lines as ``--json`` gives them)."""
    width = max(len(label) for label, _ in rows(summary))
    lines = ["mconn fleet telemetry"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows(summary)]
    lines.append(verdict(summary)[1])
    if findings is not None:
        lines += findings if isinstance(findings, list) else finding_lines(findings)
    if report:
        lines.append(f"report: {report}")
    lines.append(f"tables: {out.rstrip('/')}/{{{','.join(TABLES)},events}}")
    return "\n".join(lines)


def finding_lines(findings) -> list[str]:
    """The audit rows with a problem, named; why rows are one-sided; clock skew and
    sessions seen without their start (specs/pipeline.md section 5.5)."""
    f = findings

    def node(node_id) -> str:  # moniker (abcd1234), or the whole id
        return names.node(node_id, f.node_names, whole=True)

    lines = []
    for r in f.problems:
        counts = ", ".join(f"{r[k]:,} {k}" for k in ("lost", "duplicated") if r[k])
        lines.append(
            f"  {counts}: sender {node(r['sender'])} receiver {node(r['receiver'])} session {r['session_id']} "
            f"channel {names.channel(r['channel_id'], f.channel_names)}"
        )
    if f.problem_rows > len(f.problems):
        lines.append(f"  ... and {f.problem_rows - len(f.problems):,} more rows in delivery_audit")
    if f.one_sided_killed:
        lines.append(
            f"note: {f.one_sided_killed:,} one-sided rows: the silent end is in the logs but logged no "
            "counters for the channel (its node was killed before it logged them)"
        )
    if f.one_sided_missing:
        lines.append(f"note: {f.one_sided_missing:,} one-sided rows: the silent end's logs are missing from the input")
    for session, logger, peer, seconds in f.skews:
        later, earlier = (node(logger), node(peer)) if seconds > 0 else (node(peer), node(logger))
        lines.append(
            f"warning: clock skew: session {session}: {later} logged its start {abs(seconds):.2f} s after {earlier}"
        )
    if f.skewed_sessions:
        more = f.skewed_sessions - len(f.skews)
        shown = f" ({more:,} not shown)" if more else ""
        lines.append(
            f"warning: {f.skewed_sessions:,} sessions{shown} whose two ends disagree on the time by more "
            f"than {f.skew_bound:g} s: times in the tables mix the nodes' clocks; the delivery audit "
            "compares counters, not times, and does not depend on clocks"
        )
    for node_id, count in sorted(f.unstarted.items()):
        cause = "is missing from the input" if f.starts_cut is False else "is missing, or before --since"
        lines.append(
            f"warning: node {node(node_id)}: {count:,} sessions seen without their start: its earlier telemetry "
            + cause
        )
    return lines


def describe(error: BaseException) -> str:
    """The first line of an error, without the JVM stack trace Spark appends."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
