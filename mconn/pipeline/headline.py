"""The headline of a run in words: the audit's verdict and the summary's rows.

Pure functions of the summary row (a dict); the console table and the HTML report
both print them.
"""

from __future__ import annotations


def verdict(summary: dict) -> tuple[bool, str]:
    """(healthy, one sentence) about the exactly-once audit."""
    problems = [f"{summary[k]:,} {k}" for k in ("lost", "duplicated") if summary[k]]
    if problems:
        return False, "PROBLEM: " + ", ".join(problems) + " (see delivery_audit)"
    notes = []
    if summary["unsettled"]:
        notes.append(
            f"{summary['unsettled']:,} unsettled: a sender was killed or the logs stop before its session ended"
        )
    if summary["one_sided_rows"]:
        notes.append(
            f"{summary['one_sided_rows']:,} one-sided rows: one end logged no counters for them "
            "(its node was killed before it logged any, or its logs are missing)"
        )
    text = f"exactly-once holds: {summary['messages_audited']:,} messages audited, 0 lost, 0 duplicated"
    return True, text + (f" ({'; '.join(notes)})" if notes else "")


def seconds(value) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def rows(summary: dict) -> list[tuple[str, str]]:
    s = summary
    return [
        (
            "nodes / events",
            f"{s['nodes']:,} ({s['restarts']:,} restarts) / {s['events']:,} "
            f"({s['malformed_records']:,} malformed, {s['unknown_events']:,} unknown)",
        ),
        ("time span", f"{s['first_time']} .. {s['last_time']} UTC"),
        ("sessions / links", f"{s['sessions']:,} / {s['links']:,}"),
        (
            "resumes",
            f"{s['resumes']:,} (fresh starts {s['fresh_starts']:,}; sessions expired "
            f"{s['expired_sessions']:,}, rejected {s['rejected_sessions']:,}, "
            f"lost in restarts {s['restarted_sessions']:,})",
        ),
        (
            "dial attempts",
            f"{s['dial_attempts']:,} ({s['failed_dials']:,} failed); recovery p50 "
            f"{seconds(s['recovery_p50_seconds'])}, max {seconds(s['recovery_max_seconds'])}",
        ),
        (
            "messages audited",
            f"{s['messages_audited']:,}: lost {s['lost']:,}, duplicated {s['duplicated']:,}, "
            f"in doubt {s['in_doubt']:,}, unsettled {s['unsettled']:,}",
        ),
        (
            "errors",
            f"protocol {s['protocol_errors']:,}, refused connections {s['refused_connections']:,}, "
            f"dials given up {s['gave_up_dials']:,}, loop stalls {s['loop_stalls']:,}, "
            f"reactor {s['reactor_errors']:,}",
        ),
        (
            f"round trip ({s['rtt_source'] or 'no samples'})",
            f"p50 {seconds(s['rtt_p50_seconds'])}, p99 {seconds(s['rtt_p99_seconds'])}",
        ),
    ]
