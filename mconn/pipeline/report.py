"""The HTML report: one self-contained file, plots embedded as PNG (specs/pipeline.md section 7).

The first screen answers "is the fleet healthy?": a verdict line on exactly-once
delivery, the headline numbers, and the audit's findings if there are any. The plots
follow (link timeline, reconnect delays, round trips, bandwidth against priority,
unstable peers, errors), then the tables behind them. Everything shown is collected
from the written tables with bounded queries (top N, or a sample of at most
``SAMPLE`` values per histogram), so the driver's memory does not grow with the fleet.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import os
import typing

from pyspark.sql import functions as F

from mconn.pipeline import audit, console, headline, plots
from mconn.pipeline.ingest import MALFORMED, UNKNOWN
from mconn.pipeline.inputs import redact

SAMPLE = 50_000
LANES = 25
TOP = 15
LOST = ("expired", "fresh", "rejected", "restarted")


def short(node_id) -> str:
    return "-" if node_id is None else node_id[:8]


def sample(df, rows: int):
    """The rows of ``df`` (``rows`` of them), or a uniform sample of about SAMPLE."""
    if rows > SAMPLE:
        df = df.sample(fraction=SAMPLE / rows, seed=1)
    return df.collect()


# -- data for the plots ----------------------------------------------------------------


def timeline_lanes(links, sessions, breaks) -> tuple[list[dict], float]:
    lost = F.col("outcome").isin(*LOST).cast("int")
    pairs = (
        links.groupBy("node_id", "peer_id")
        .agg((F.sum("suspensions") + 3 * F.sum(lost) + F.count("*")).alias("score"))
        .orderBy(F.desc("score"), "node_id", "peer_id")
        .limit(LANES)
        .select("node_id", "peer_id")
    )
    pairs_rows = pairs.collect()
    if not pairs_rows:
        return [], 0.0
    spans = (
        links.join(pairs, ["node_id", "peer_id"])
        .select("node_id", "peer_id", F.col("start").cast("double"), F.col("observed_until").cast("double"), "outcome")
        .limit(20 * LANES)
        .collect()
    )
    gaps = (
        breaks.join(pairs, ["node_id", "peer_id"])
        .join(
            sessions.select("node_id", "peer_id", "session_id", "observed_until"), ["node_id", "peer_id", "session_id"]
        )
        .select("node_id", "peer_id", "break_at", F.coalesce("resolved_at", "observed_until"))
    )
    gaps = gaps.limit(200 * LANES).collect()
    lanes: dict[tuple[str, str], dict[str, typing.Any]] = {
        (r[0], r[1]): {"label": f"{short(r[0])} > {short(r[1])}", "sessions": [], "breaks": []} for r in pairs_rows
    }
    for node, peer, start, end, outcome in spans:
        lanes[(node, peer)]["sessions"].append((start, end, outcome))
    for node, peer, start, end in gaps:
        lanes[(node, peer)]["breaks"].append((start, end))
    origin = min(s[0] for lane in lanes.values() for s in lane["sessions"])
    return [lanes[(r[0], r[1])] for r in pairs_rows], origin


def reconnect_samples(reconnects, rows: int) -> tuple[dict[str, list[float]], list[float]]:
    """Dial delays by result, and the recovery time of each break, from one sample."""
    columns = ("result", "delay", "node_id", "peer_id", "break_time", "recovery_seconds")
    picked = sample(reconnects.select(*columns), rows)
    delays: dict[str, list[float]] = {}
    recovery = {}
    for r in picked:
        if r["delay"] is not None:
            delays.setdefault(r["result"] or "unknown", []).append(r["delay"])
        if r["recovery_seconds"] is not None:
            recovery[(r["node_id"], r["peer_id"], r["break_time"])] = r["recovery_seconds"]
    return dict(sorted(delays.items())), list(recovery.values())


def share_points(channels) -> list[dict]:
    per_channel = (
        channels.groupBy("node_id", "peer_id", "channel_id")
        .agg(
            F.max("priority").alias("priority"),
            F.sum("contended_bytes").alias("contended"),
            F.sum("link_contended_bytes").alias("link"),
            F.sum(F.col("priority_share") * F.col("link_contended_bytes")).alias("promised"),
        )
        .where(F.col("link") > 0)
    )
    rows = per_channel.orderBy(F.desc("link")).limit(2000).collect()
    return [
        {
            "priority_share": r["promised"] / r["link"],
            "bandwidth_share": r["contended"] / r["link"],
            "priority": r["priority"],
            "bytes": r["contended"],
        }
        for r in rows
    ]


def unstable_peers(links) -> list:
    lost = F.col("outcome").isin(*LOST).cast("int")
    per_peer = links.groupBy("peer_id").agg(
        F.sum("suspensions").alias("suspensions"),
        F.sum(lost).alias("sessions_lost"),
        F.count("*").alias("sessions"),
        F.countDistinct("node_id").alias("seen_by"),
    )
    score = F.col("suspensions") + F.col("sessions_lost")
    return per_peer.where(score > 0).orderBy(score.desc(), "peer_id").limit(TOP).collect()


def error_kinds(errors) -> list:
    return (
        errors.groupBy("source", "kind")
        .agg(F.sum("count").alias("count"))
        .orderBy(F.desc("count"), "source", "kind")
        .limit(TOP)
        .collect()
    )


# -- HTML ------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.verdict { padding: 0.6em 1em; border-radius: 6px; font-size: 1.1em; font-weight: 600; }
.ok { background: #e3f4e6; color: #1d6b2e; } .bad { background: #fbe3e3; color: #8c1c1c; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; } th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; } .grid img { max-width: 100%; }
.note { color: #666; font-size: 0.85em; }
"""


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return f'<p class="note">{html.escape(alt)}: nothing to plot.</p>'
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _cell(value) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{'-' if value is None else value}</td>"
    if isinstance(value, (int, float)):
        text = f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"
        return f'<td class="n">{text}</td>'
    text = str(value)
    if len(text) == 40 and all(c in "0123456789abcdef" for c in text):
        return f'<td title="{text}">{text[:12]}</td>'
    return f"<td>{html.escape(text)}</td>"


def _table(headers: list[str], rows) -> str:
    if not rows:
        return '<p class="note">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def write(
    path: str, summary: dict, tables: dict, rows: dict, shared, event_counts: dict, everything, findings: audit.Findings
) -> None:
    """Collect what the report shows from the tables (``rows``: their sizes) and the audit's
    ``findings``, draw it, write it."""
    healthy, verdict = headline.verdict(summary)
    span = f"{summary['first_time']} to {summary['last_time']} UTC"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>mconn fleet telemetry</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>mconn fleet telemetry</h1>",
        f"<p class='note'>{html.escape(span)}</p>",
        f"<div class='verdict {'ok' if healthy else 'bad'}'>{html.escape(verdict)}</div>",
        _notes(findings),
        _table(["figure", "value"], headline.rows(summary)),
        "<h2>Delivery audit findings</h2>",
        _findings(tables["delivery_audit"]),
        "<h2>Links</h2>",
        _link_plots(summary, tables, rows, shared),
        _side_plots_and_tables(tables),
        "<h2>Input</h2>",
        _input_section(event_counts, everything),
        "</body></html>",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _notes(findings: audit.Findings) -> str:
    """The notes and warnings of the console (one-sided rows' causes, clock skew, sessions
    seen without their start, which may also be before a --since); the rows with a problem
    are in the findings table."""
    found = dataclasses.replace(findings, starts_cut=None)
    lines = [line for line in console.finding_lines(found) if not line.startswith(" ")]
    return "".join(f"<p class='note'>{html.escape(line)}</p>" for line in lines)


def _findings(audit) -> str:
    findings = (
        audit.where(F.col("verdict") != "ok")
        .orderBy(F.desc("lost"), F.desc("duplicated"), F.desc("unsettled"), "sender", "receiver")
        .limit(50)
        .collect()
    )
    columns = (
        "sender",
        "receiver",
        "session_id",
        "channel_id",
        "accepted",
        "undelivered",
        "delivered",
        "lost",
        "duplicated",
        "unsettled",
        "verdict",
    )
    return _table(list(columns), [tuple(r[c] for c in columns) for r in findings])


def _link_plots(summary: dict, tables: dict, rows: dict, shared) -> str:
    lanes, origin = timeline_lanes(tables["links"], shared.sessions, shared.breaks)
    delays, recovery = reconnect_samples(tables["reconnects"], rows["reconnects"])
    rtt = [r[0] for r in sample(shared.rtt_samples.select("rtt"), shared.rtt_samples.count())]  # cached
    source = summary["rtt_source"] or "no"
    return "\n".join(
        [
            _img(plots.timeline(lanes, origin), "link timeline"),
            _img(plots.reconnects(delays, recovery), "reconnect delays"),
            _img(plots.round_trips(rtt, summary["rtt_p50_seconds"], summary["rtt_p99_seconds"], source), "round trips"),
        ]
    )


def _side_plots_and_tables(tables: dict) -> str:
    peers = unstable_peers(tables["links"])
    kinds = error_kinds(tables["errors"])
    unstable = [
        (short(r["peer_id"]), {"suspensions": r["suspensions"], "sessions lost": r["sessions_lost"]}) for r in peers
    ]
    by_kind = [(f"{r['source']}: {r['kind']}", {"count": r["count"]}) for r in kinds]
    errors = tables["errors"].orderBy(F.desc("count")).limit(20).collect()
    error_columns = ("source", "kind", "remote_host", "peer_id", "count", "nodes", "example")
    return "\n".join(
        [
            "<div class='grid'>",
            _img(plots.shares(share_points(tables["channels"])), "bandwidth share against priority"),
            _img(
                plots.bars(
                    unstable, {"suspensions": plots.ORANGE, "sessions lost": plots.RED}, "Most unstable peers", "count"
                ),
                "unstable peers",
            ),
            _img(plots.bars(by_kind, {"count": plots.RED}, "Errors by kind", "count"), "errors"),
            "</div>",
            "<h2>Most unstable peers</h2>",
            _table(
                ["peer", "suspensions", "sessions lost", "sessions", "seen by nodes"],
                [(r["peer_id"], r["suspensions"], r["sessions_lost"], r["sessions"], r["seen_by"]) for r in peers],
            ),
            "<h2>Errors</h2>",
            _table(
                list(error_columns),
                [tuple(redact(r[c]) if c == "example" else r[c] for c in error_columns) for r in errors],
            ),
        ]
    )


def _input_section(event_counts: dict, everything) -> str:
    rejects = everything.where(F.col("event") == MALFORMED)
    counts = sorted(((n, e) for e, n in event_counts.items()), reverse=True)
    parts = [_table(["event", "records"], [(e, n) for n, e in counts])]
    if event_counts.get(MALFORMED):
        reasons = rejects.groupBy("reject_reason").count().orderBy(F.desc("count")).collect()
        parts.append("<p>Malformed records by reason:</p>")
        parts.append(_table(["reason", "records"], [tuple(r) for r in reasons]))
        examples = rejects.select("source_file", "record").limit(5).collect()
        # A key-like run in a record (a key pasted into a log) is not repeated here.
        parts.append("<p>Examples:</p>" + _table(["file", "record"], [(f, redact(r)) for f, r in examples]))
    if event_counts.get(UNKNOWN):
        names = everything.where(F.col("event") == UNKNOWN).groupBy("unknown_event").count().orderBy(F.desc("count"))
        parts.append("<p>Unknown events:</p>")
        parts.append(_table(["event", "records"], [tuple(r) for r in names.limit(20).collect()]))
    return "\n".join(parts)
