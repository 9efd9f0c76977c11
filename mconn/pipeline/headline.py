"""The headline of a run in words: the audit's verdict and the summary's rows.

Pure functions of the summary row (a dict); the console table and the HTML report
both print them.

The verdict has three levels. ``problem``: a message was lost or duplicated. ``caveat``:
none was, but some messages are not confirmed either way (unconfirmed, in doubt,
unsettled, or in one-sided rows): the verdict says how many and why, never a bare
"holds". ``ok``: every audited message is accounted for by both ends.

The words are the API's: a session's reason names the messages not confirmed delivered
``unconfirmed`` (specs/reactor-api.md), and so does the report; the telemetry field and
the ``delivery_audit`` column that carry the count keep their older name, ``undelivered``
(specs/telemetry.md, ``session_ended``).
"""

from __future__ import annotations

OK, CAVEAT, PROBLEM = "ok", "caveat", "problem"

#: What the audit's words mean, for the legend under the report's audit tables.
LEGEND = (
    (
        "unconfirmed",
        "accepted for sending and not confirmed delivered when the sender's session ended; the "
        "sender's reactors were told (the reason's unconfirmed). The delivery_audit column and the "
        "telemetry field keep the older name undelivered",
    ),
    (
        "in doubt",
        "unconfirmed, yet the receiver delivered them: the acknowledgement was lost with the "
        "connection. Not a fault of mconn; an application that re-sends what was unconfirmed "
        "delivers these twice",
    ),
    (
        "unsettled",
        "accepted by a sender whose session has no end in the logs (its node was killed, or the "
        "logs stop first): neither delivered nor reported unconfirmed by anyone",
    ),
    (
        "one-sided",
        "a row with counters from one end only: the other node's logs are missing, or it was "
        "killed before it logged counters for the channel",
    ),
)


def _get(summary: dict, key: str) -> int:
    """A count of the summary row; 0 when absent (a summary written before the column existed)."""
    return summary.get(key) or 0


def caveats(summary: dict) -> list[str]:
    """What is not confirmed either way, one phrase per cause (empty when everything is)."""
    unconfirmed = _get(summary, "unconfirmed")
    to_killed = _get(summary, "unconfirmed_receiver_killed")
    in_doubt = _get(summary, "in_doubt")
    not_delivered = max(0, unconfirmed - to_killed - in_doubt)
    notes = []
    if to_killed:
        notes.append(
            f"{to_killed:,} unconfirmed: sent to a node that was killed (or whose logs stop or are "
            "missing), never acknowledged"
        )
    if not_delivered:
        notes.append(
            f"{not_delivered:,} unconfirmed: not delivered, the session ended first (its sender's reactors were told)"
        )
    if in_doubt:
        notes.append(
            f"{in_doubt:,} in doubt: reported unconfirmed, yet delivered (the ack was lost with the connection)"
        )
    if _get(summary, "unsettled"):
        notes.append(
            f"{summary['unsettled']:,} unsettled: a sender was killed or the logs stop before its session ended"
        )
    if _get(summary, "one_sided_rows"):
        notes.append(
            f"{summary['one_sided_rows']:,} one-sided rows: one end logged no counters for them "
            "(its node was killed before it logged any, or its logs are missing)"
        )
    return notes


def assess(summary: dict) -> tuple[str, str, list[str]]:
    """(level, the verdict's first clause, ``caveats``): the parts ``verdict`` joins."""
    problems = [f"{summary[k]:,} {k}" for k in ("lost", "duplicated") if summary[k]]
    notes = caveats(summary)
    if problems:
        return PROBLEM, "PROBLEM: " + ", ".join(problems) + " (see delivery_audit)", notes
    audited = f"{summary['messages_audited']:,} messages audited"
    if notes:
        return CAVEAT, f"0 lost, 0 duplicated in {audited}", notes
    return OK, f"exactly-once holds: {audited}, 0 lost, 0 duplicated", notes


def verdict(summary: dict) -> tuple[str, str]:
    """(level, one sentence) about the exactly-once audit; the level is OK, CAVEAT or PROBLEM."""
    level, head, notes = assess(summary)
    return level, "; ".join([head, *notes])


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
            f"unconfirmed {_get(s, 'unconfirmed'):,} (in doubt {s['in_doubt']:,}), unsettled {s['unsettled']:,}",
        ),
        (
            "errors",
            f"protocol {s['protocol_errors']:,} (peer misbehaviour), "
            f"link failures {_get(s, 'link_failures'):,} (timeouts, resets: not errors), "
            f"refused connections {s['refused_connections']:,}, "
            f"dials given up {s['gave_up_dials']:,}, loop stalls {s['loop_stalls']:,}, "
            f"reactor {s['reactor_errors']:,}",
        ),
        (
            f"round trip ({s['rtt_source'] or 'no samples'})",
            f"p50 {seconds(s['rtt_p50_seconds'])}, p99 {seconds(s['rtt_p99_seconds'])}",
        ),
    ]
