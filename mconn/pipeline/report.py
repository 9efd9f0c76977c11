"""The HTML report: one self-contained file, plots embedded as PNG (specs/pipeline.md section 7).

The first screen answers "is the fleet healthy?": a verdict line on exactly-once
delivery, the headline numbers, and the audit's findings if there are any. The plots
follow (link timeline, reconnect delays, round trips, bandwidth against priority,
unstable links, errors), then the tables behind them. Everything shown is collected
from the written tables (the contention chart: from the events' ``channel_stats``, as
the channels stage summed them per minute, ``channels.per_minute``) with bounded queries (top N, or a sample of at most ``SAMPLE`` values per histogram),
so the driver's memory does not grow with the fleet.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import os
import typing

from pyspark.sql import functions as F

from mconn.pipeline import audit, channels, console, headline, names, plots
from mconn.pipeline.ingest import MALFORMED, UNKNOWN
from mconn.pipeline.inputs import redact
from mconn.pipeline.sessions import PAIR

SAMPLE = 50_000
LANES = 25
TOP = 15
LOST = ("expired", "fresh", "rejected", "restarted")


def short(node_id) -> str:
    return "-" if node_id is None else node_id[: names.SHORT_ID_DIGITS]


def _chart_name(node_id, known: dict[str, str]) -> str:
    """A node in a chart's label: ``moniker (abcd1234)``, the moniker cut short, or the 8 digits."""
    return names.node(node_id, known, most=names.CHART_MONIKER)


def sample(df, rows: int):
    """The rows of ``df`` (``rows`` of them), or a uniform sample of about SAMPLE."""
    return _sampled(df, rows).collect()


def _sampled(df, rows: int):
    return df.sample(fraction=SAMPLE / rows, seed=1) if rows > SAMPLE else df


def _listed(df, name: str):
    """One row, one column ``name``: every row of ``df`` (bounded by the caller) as a list
    of structs, in no particular order."""
    return df.agg(F.collect_list(F.struct(*df.columns)).alias(name))


def _one(part) -> dict:
    """A part collected on its own (the functions that tests and callers use one by one)."""
    row = part.first()
    assert row is not None  # aggregates without grouping: exactly one row
    return row.asDict()


# -- the report's query: every part a one-row frame, all collected at once (``parts``) --


def parts(tables: dict, rows: dict, shared, event_counts: dict, rtt_rows: int, everything) -> list:
    """The one-row frames of everything the report shows, each its own column(s); side by
    side they make the report's one Spark query (``write`` takes the collected row).
    ``rows``: the tables' sizes; ``rtt_rows``: the round-trip samples (the summary's)."""
    found = [
        _findings_part(tables["delivery_audit"]),
        *_timeline_parts(tables["links"], shared.sessions, shared.breaks),
        _listed(_sampled(tables["reconnects"].select(*_RECONNECT_COLUMNS), rows["reconnects"]), "reconnect_sample"),
        _listed(_sampled(shared.rtt_samples.select("rtt"), rtt_rows), "rtt_sample"),
        _unstable_part(tables["links"]),
        _error_kinds_part(tables["errors"]),
        audit.top(
            tables["errors"],
            [-F.col("count"), F.col("source"), F.col("kind")],
            20,
            [c for _, c in _ERROR_COLUMNS],
            "errors",
        ),
        _share_part(shared.channel_minutes),
    ]
    return found + _input_parts(event_counts, everything)


def _timeline_parts(links, sessions, breaks) -> list:
    lost = F.col("outcome").isin(*LOST).cast("int")
    scored = links.groupBy("node_id", "peer_id").agg(
        (F.sum("suspensions") + 3 * F.sum(lost) + F.count("*")).alias("score")
    )
    order = [-F.col("score"), F.col("node_id"), F.col("peer_id")]
    pairs = scored.orderBy(F.desc("score"), "node_id", "peer_id").limit(LANES).select("node_id", "peer_id")
    lanes = audit.top(scored, order, LANES, ["node_id", "peer_id"], "lane_pairs")
    spans = links.join(pairs, ["node_id", "peer_id"]).select(
        "node_id",
        "peer_id",
        F.col("start").cast("double").alias("start"),
        F.col("observed_until").cast("double").alias("until"),
        "outcome",
    )
    by_time = [F.col("node_id"), F.col("peer_id"), F.col("start"), F.col("until")]
    spans = audit.top(spans, by_time, 20 * LANES, ["node_id", "peer_id", "start", "until", "outcome"], "lane_spans")
    gaps = (
        breaks.join(pairs, ["node_id", "peer_id"])
        .join(
            sessions.select("node_id", "peer_id", "session_id", "observed_until"), ["node_id", "peer_id", "session_id"]
        )
        .select(
            "node_id",
            "peer_id",
            F.col("break_at").alias("start"),
            F.coalesce("resolved_at", "observed_until").alias("until"),
        )
    )
    gaps = audit.top(gaps, by_time, 200 * LANES, ["node_id", "peer_id", "start", "until"], "lane_gaps")
    return [lanes, spans, gaps]


def _lanes(got: dict) -> tuple[list[dict], float]:
    pairs = [(r["node_id"], r["peer_id"]) for r in audit.ranked(got["lane_pairs"])]
    if not pairs:
        return [], 0.0
    known, _ = names.collected(got)
    lanes: dict[tuple[str, str], dict[str, typing.Any]] = {
        (node, peer): {
            "label": f"{_chart_name(node, known)} > {_chart_name(peer, known)}",
            "sessions": [],
            "breaks": [],
        }
        for node, peer in pairs
    }
    for r in audit.ranked(got["lane_spans"]):
        lanes[(r["node_id"], r["peer_id"])]["sessions"].append((r["start"], r["until"], r["outcome"]))
    for r in audit.ranked(got["lane_gaps"]):
        lanes[(r["node_id"], r["peer_id"])]["breaks"].append((r["start"], r["until"]))
    origin = min(s[0] for lane in lanes.values() for s in lane["sessions"])
    return [lanes[pair] for pair in pairs], origin


def timeline_lanes(links, sessions, breaks) -> tuple[list[dict], float]:
    """The link timeline's lanes (the LANES busiest node-peer pairs) and its origin."""
    row = _timeline_parts(links, sessions, breaks)
    return _lanes(_one(row[0].crossJoin(row[1]).crossJoin(row[2])))


_RECONNECT_COLUMNS = ("result", "delay", "node_id", "peer_id", "break_time", "recovery_seconds")


def _reconnects(picked) -> tuple[dict[str, list[float]], list[float]]:
    delays: dict[str, list[float]] = {}
    recovery = {}
    for r in picked:
        if r["delay"] is not None:
            delays.setdefault(r["result"] or "unknown", []).append(r["delay"])
        if r["recovery_seconds"] is not None:
            recovery[(r["node_id"], r["peer_id"], r["break_time"])] = r["recovery_seconds"]
    return dict(sorted(delays.items())), list(recovery.values())


def reconnect_samples(reconnects, rows: int) -> tuple[dict[str, list[float]], list[float]]:
    """Dial delays by result, and the recovery time of each break, from one sample."""
    return _reconnects(sample(reconnects.select(*_RECONNECT_COLUMNS), rows))


def _share_part(minutes):
    """``share_points``' query: one row, ``share_points`` the top 2000 link channels.
    ``minutes``: ``channels.per_minute``'s rows (the channels stage's, cached by the run:
    the report does not go over the samples again)."""
    per_channel = (
        minutes.groupBy(*PAIR, "channel_id")
        .agg(
            F.max("_backlog_priority").alias("priority"),
            F.sum("_backlog_bytes").alias("contended"),
            F.sum("_backlog_link").alias("link"),
            F.sum("_backlog_promised").alias("promised"),
        )
        .where(F.col("link") > 0)
    )
    order = [-F.col("link"), F.col("node_id"), F.col("peer_id"), F.col("channel_id")]
    columns = ["node_id", "peer_id", "channel_id", "priority", "contended", "link", "promised"]
    return audit.top(per_channel, order, 2000, columns, "share_points")


def _shares(got: dict) -> list[dict]:
    return [
        {
            "node_id": r["node_id"],
            "peer_id": r["peer_id"],
            "channel_id": r["channel_id"],
            "priority_share": r["promised"] / r["link"],
            "bandwidth_share": r["contended"] / r["link"],
            "priority": r["priority"],
            "bytes": r["contended"],
        }
        for r in audit.ranked(got["share_points"])
    ]


def share_points(events, channel_ids: list | None = None) -> list[dict]:
    """Bandwidth share against priority share per link channel, over the intervals in which
    at least two of the link's channels were *backlogged*: messages queued at both samples
    that bound the interval (``channel_stats.queue_depth`` above 0 at the sample before and
    at this one). A message queued at one sample and sent before the next is no backlog, so
    a chat line queued behind a bulk stream does not make the link contended; a queue that
    stays non-empty from sample to sample does. Over those intervals the promise is the
    channel's priority over the backlogged channels' priorities, weighted by the interval's
    bytes, as for the ``channels`` table (specs/pipeline.md section 4.3), whose ``pending``
    is looser (queued at either sample)."""
    return _shares(_one(_share_part(channels.per_minute(events, channel_ids))))


def _unstable_part(links):
    lost = F.col("outcome").isin(*LOST).cast("int")
    link = [F.least("node_id", "peer_id").alias("a"), F.greatest("node_id", "peer_id").alias("b")]
    per_session = links.groupBy(*link, "session_id").agg(
        F.max("suspensions").alias("breaks"), F.max(lost).alias("lost")
    )
    per_link = per_session.groupBy("a", "b").agg(
        F.sum("breaks").alias("breaks"), F.sum("lost").alias("sessions_lost"), F.count("*").alias("sessions")
    )
    score = F.col("breaks") + F.col("sessions_lost")
    order = [-score, F.col("a"), F.col("b")]
    return audit.top(
        per_link.where(score > 0), order, TOP, ["a", "b", "breaks", "sessions_lost", "sessions"], "unstable_links"
    )


def unstable_links(links) -> list:
    """The links (node pairs, ``a`` < ``b``) with the most breaks and lost sessions.

    A break suspends both ends of a session, and a lost session has an end at each node
    (``restarted`` at the one that died, ``fresh`` or ``expired`` at the other): counted
    per link and session once, the larger of the two ends' counts, so a break is not
    blamed on each peer in turn."""
    return audit.ranked(_one(_unstable_part(links))["unstable_links"])


def _error_kinds_part(errors):
    kinds = errors.groupBy("source", "kind").agg(F.sum("count").alias("count"))
    order = [-F.col("count"), F.col("source"), F.col("kind")]
    return audit.top(kinds, order, TOP, ["source", "kind", "count"], "error_kinds")


def error_kinds(errors) -> list:
    return audit.ranked(_one(_error_kinds_part(errors))["error_kinds"])


# -- HTML ------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.verdict { padding: 0.6em 1em; border-radius: 6px; font-size: 1.1em; font-weight: 600; }
.ok { background: #e3f4e6; color: #1d6b2e; } .bad { background: #fbe3e3; color: #8c1c1c; }
.caveat { background: #fdf0d5; color: #7a4b00; }
.verdict ul { margin: 0.3em 0 0 0; padding-left: 1.2em; font-weight: normal; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; } th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.grid figure { margin: 0; max-width: 100%; } img { max-width: 100%; height: auto; }
figcaption, figure > p.note { color: #666; font-size: 0.8em; max-width: 32em; }
.note { color: #666; font-size: 0.85em; }
dl.legend { color: #444; font-size: 0.8em; margin: 0.3em 0; }
dl.legend dt { font-weight: 600; float: left; clear: left; margin-right: 0.4em; }
dl.legend dd { margin: 0 0 0.2em 0; }
"""


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return f'<p class="note">{html.escape(alt)}: nothing to plot.</p>'
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _cell(value, known: dict[str, str] | None = None) -> str:
    """One table cell. A node id (40 hex digits) shows as ``moniker (abcd1234)`` when
    ``known`` names it, else its first 8 digits; a session id (32) its first 12; either
    keeps the whole id in its title."""
    if isinstance(value, bool) or value is None:
        return f"<td>{'-' if value is None else value}</td>"
    if isinstance(value, (int, float)):
        text = f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"
        return f'<td class="n">{text}</td>'
    text = str(value)
    if len(text) in (32, 40) and all(c in "0123456789abcdef" for c in text):  # a session or node id
        shown = names.node(text, known or {}) if len(text) == 40 else text[:12]
        return f'<td title="{text}">{html.escape(shown)}</td>'
    return f"<td>{html.escape(text)}</td>"


def _table(headers: list[str], rows, known: dict[str, str] | None = None) -> str:
    """``known``: node id -> moniker, how node ids in the cells are named (``_cell``)."""
    if not rows:
        return '<p class="note">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v, known) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def write(path: str, summary: dict, got: dict, event_counts: dict, findings: audit.Findings) -> None:
    """Draw and write what the report shows: ``got``, the collected row of ``parts``' query,
    beside the summary row and the audit's ``findings``."""
    span = f"{summary['first_time']} to {summary['last_time']} UTC"
    known, _ = names.collected(got)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>mconn fleet telemetry</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>mconn fleet telemetry</h1>",
        f"<p class='note'>{html.escape(span)}</p>",
        _verdict(summary),
        _notes(findings),
        _table(["figure", "value"], headline.rows(summary)),
        "<h2>Delivery audit findings</h2>",
        _findings(got, known),
        _legend(),
        "<h2>Links</h2>",
        _link_plots(summary, got),
        _side_plots_and_tables(got, known),
        "<h2>Input</h2>",
        _input_section(event_counts, got),
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


#: The verdict's level -> its CSS class: green, amber, red.
_LEVEL_CLASS = {headline.OK: "ok", headline.CAVEAT: "caveat", headline.PROBLEM: "bad"}


def _verdict(summary: dict) -> str:
    """The verdict's first clause, then each thing not confirmed either way as a list item:
    green only when there is none."""
    level, head, notes = headline.assess(summary)
    items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    listed = f"<ul>{items}</ul>" if items else ""
    return f"<div class='verdict {_LEVEL_CLASS[level]}' id='verdict'>{html.escape(head)}{listed}</div>"


def _legend() -> str:
    """What the audit's words mean, under the tables that use them."""
    items = "".join(f"<dt>{html.escape(word)}</dt><dd>{html.escape(text)}</dd>" for word, text in headline.LEGEND)
    return f"<dl class='legend'>{items}</dl>"


#: The findings table's columns: (header, delivery_audit column). The sender's count of
#: messages not confirmed delivered is ``undelivered`` in the table and in telemetry;
#: the report uses the API's word. The channel is shown with its name (``names.channel``).
_FINDING_COLUMNS = (
    ("sender", "sender"),
    ("receiver", "receiver"),
    ("session_id", "session_id"),
    ("channel", "channel_id"),
    ("accepted", "accepted"),
    ("unconfirmed", "undelivered"),
    ("delivered", "delivered"),
    ("lost", "lost"),
    ("duplicated", "duplicated"),
    ("in doubt", "in_doubt"),
    ("unsettled", "unsettled"),
    ("verdict", "verdict"),
)


def _findings_part(audit_df):
    """The audit rows whose verdict is not ``ok``, and those with unconfirmed messages that
    were not delivered (the receiver did not deliver them, or its counters are not final),
    worst first: the first 50."""
    not_delivered = F.coalesce(F.col("undelivered"), F.lit(0)) - F.col("in_doubt")
    order = [
        -F.col("lost"),
        -F.col("duplicated"),
        -F.col("unsettled"),
        -not_delivered,
        F.col("sender"),
        F.col("receiver"),
    ]
    shown = audit_df.where((F.col("verdict") != "ok") | (not_delivered > 0))
    columns = list(dict.fromkeys(column for _, column in _FINDING_COLUMNS))
    return audit.top(shown, order, 50, columns, "report_findings")


def _findings(got: dict, known: dict[str, str]) -> str:
    _, channel_names = names.collected(got)

    def shown(r, column):
        return names.channel(r[column], channel_names) if column == "channel_id" else r[column]

    rows = [tuple(shown(r, column) for _, column in _FINDING_COLUMNS) for r in audit.ranked(got["report_findings"])]
    return _table([header for header, _ in _FINDING_COLUMNS], rows, known)


def _link_plots(summary: dict, got: dict) -> str:
    lanes, origin = _lanes(got)
    delays, recovery = _reconnects(got["reconnect_sample"])
    rtt = [r["rtt"] for r in got["rtt_sample"]]
    source = summary["rtt_source"] or "no"
    return "\n".join(
        [
            _img(plots.timeline(lanes, origin), "link timeline"),
            _img(plots.reconnects(delays, recovery), "reconnect delays"),
            _img(plots.round_trips(rtt, summary["rtt_p50_seconds"], summary["rtt_p99_seconds"], source), "round trips"),
        ]
    )


#: The chart's caption: what counts as contention (``share_points``).
SHARES_CAPTION = (
    "Each point is one channel of a link, over the intervals between two channel_stats samples in "
    "which at least two of the link's channels were backlogged: messages queued at both samples. "
    "A message queued at one sample and sent before the next is not contention. On the diagonal, "
    "a channel got the bandwidth its priority promises among the backlogged channels."
)
#: The errors table's columns: (header, errors column).
_ERROR_COLUMNS = (
    ("source", "source"),
    ("kind", "kind"),
    ("scope", "scope"),
    ("node", "node_id"),
    ("peer", "peer_id"),
    ("remote host", "remote_host"),
    ("count", "count"),
    ("nodes", "nodes"),
    ("example", "example"),
)
ERRORS_CAPTION = (
    "scope node: about the node that logged it (its event loop stalled), named in the node column. "
    "scope link: both ends of the link logged it about each other (a silent link times out at both): "
    "one event, counted once; node is the end that logged it first, peer the other end. "
    "scope peer: about the peer or remote host named, counted over the nodes that logged it."
)


def _figure(png: bytes | None, alt: str, caption: str = "", empty: str = "") -> str:
    """A chart with its caption; ``empty`` says why there is no chart, when there is none."""
    text = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    if png is None and empty:
        return f"<figure><p class='note'>{html.escape(alt)}: {html.escape(empty)}</p>{text}</figure>"
    return f"<figure>{_img(png, alt)}{text}</figure>"


def _side_plots_and_tables(got: dict, known: dict[str, str]) -> str:
    links = audit.ranked(got["unstable_links"])
    kinds = audit.ranked(got["error_kinds"])
    unstable = [
        (
            f"{_chart_name(r['a'], known)} - {_chart_name(r['b'], known)}",
            {"breaks": r["breaks"], "sessions lost": r["sessions_lost"]},
        )
        for r in links
    ]
    by_kind = [(f"{r['source']}: {r['kind']}", {"count": r["count"]}) for r in kinds]
    errors = audit.ranked(got["errors"])
    return "\n".join(
        [
            "<div class='grid'>",
            _figure(
                plots.shares(_shares(got)),
                "bandwidth share against priority",
                SHARES_CAPTION,
                "nothing to plot: no link had two channels backlogged at once.",
            ),
            _figure(
                plots.bars(
                    unstable, {"breaks": plots.ORANGE, "sessions lost": plots.RED}, "Most unstable links", "count"
                ),
                "unstable links",
                "A break or a lost session counts once per link, not once at each end.",
            ),
            _figure(plots.bars(by_kind, {"count": plots.RED}, "Errors by kind", "count"), "errors"),
            "</div>",
            "<h2>Most unstable links</h2>",
            _table(
                ["node", "node", "breaks", "sessions lost", "sessions"],
                [(r["a"], r["b"], r["breaks"], r["sessions_lost"], r["sessions"]) for r in links],
                known,
            ),
            "<h2>Errors</h2>",
            _table(
                [header for header, _ in _ERROR_COLUMNS],
                [tuple(redact(r[c]) if c == "example" else r[c] for _, c in _ERROR_COLUMNS) for r in errors],
                known,
            ),
            f"<p class='note'>{html.escape(ERRORS_CAPTION)}</p>",
        ]
    )


def _input_parts(event_counts: dict, everything) -> list:
    """The input section's queries, only for what the counts say is there: malformed
    records by reason and 5 examples, unknown events by name."""
    found = []
    if event_counts.get(MALFORMED):
        rejects = everything.where(F.col("event") == MALFORMED)
        reasons = rejects.groupBy("reject_reason").count()
        found.append(audit.top(reasons, [-F.col("count")], TOP, ["reject_reason", "count"], "malformed_reasons"))
        found.append(_listed(rejects.select("source_file", "record").limit(5), "malformed_examples"))
    if event_counts.get(UNKNOWN):
        names = everything.where(F.col("event") == UNKNOWN).groupBy("unknown_event").count()
        found.append(audit.top(names, [-F.col("count")], 20, ["unknown_event", "count"], "unknown_names"))
    return found


def _input_section(event_counts: dict, got: dict) -> str:
    counts = sorted(((n, e) for e, n in event_counts.items()), reverse=True)
    parts = [_table(["event", "records"], [(e, n) for n, e in counts])]
    if event_counts.get(MALFORMED):
        reasons = [(r["reject_reason"], r["count"]) for r in audit.ranked(got["malformed_reasons"])]
        parts.append("<p>Malformed records by reason:</p>")
        parts.append(_table(["reason", "records"], reasons))
        examples = [(r["source_file"], r["record"]) for r in got["malformed_examples"]]
        # A key-like run in a record (a key pasted into a log) is not repeated here.
        parts.append("<p>Examples:</p>" + _table(["file", "record"], [(f, redact(r)) for f, r in examples]))
    if event_counts.get(UNKNOWN):
        names = [(r["unknown_event"], r["count"]) for r in audit.ranked(got["unknown_names"])]
        parts.append("<p>Unknown events:</p>")
        parts.append(_table(["event", "records"], names))
    return "\n".join(parts)
