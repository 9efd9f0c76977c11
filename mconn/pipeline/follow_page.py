"""The follower's page: plain HTML that reloads itself, and ``/state.json`` (specs/pipeline.md section 9).

In the style of the node status page (mconn/ops/status_page.py): self-contained, inline
CSS, no external resource, served on 127.0.0.1 only. It has no script: the page reloads
itself every trigger (``<meta http-equiv="refresh">``). Every value is written escaped
(``html.escape``): node ids, addresses and reasons come from telemetry files.
"""

from __future__ import annotations

import datetime
import html
import json

from twisted.web import resource, server

#: Seconds of event time per activity window (follow.py counts them).
WINDOW_SECONDS = 10
#: Activity windows kept for the page (the newest).
WINDOWS_SHOWN = 30
#: The events that the activity windows count, in the page's order.
ACTIVITY_EVENTS = (
    "session_started",
    "session_suspended",
    "session_resumed",
    "session_ended",
    "dial_attempt",
    "protocol_error",
    "node_started",
)

#: The headers of every answer: nothing may load from elsewhere, no caching.
HEADERS = {
    b"content-security-policy": b"default-src 'none'; style-src 'unsafe-inline'",
    b"x-content-type-options": b"nosniff",
    b"cache-control": b"no-store",
    b"referrer-policy": b"no-referrer",
}

_STYLE = """
  body { font: 13px/1.35 system-ui, sans-serif; margin: 1em 1.2em; color: #1d2430; background: #fafbfc; }
  h1 { font-size: 1.3em; margin: 0 0 .2em; }
  h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  .meta { color: #4b5565; } .meta span { margin-right: 1.6em; }
  table { border-collapse: collapse; background: #fff; box-shadow: 0 0 0 1px #dde1e7; }
  th, td { padding: .3em .55em; text-align: left; border-bottom: 1px solid #eceef2; white-space: nowrap; }
  th { background: #f0f2f5; font-weight: 600; font-size: 12.5px; }
  td.n { text-align: right; font-variant-numeric: tabular-nums; }
  td.mono { font-family: ui-monospace, monospace; font-size: 12px; }
  .verdict { display: inline-block; padding: .4em .9em; border-radius: .4em; font-weight: 700; font-size: 1.1em; }
  .ok { background: #d7f5df; color: #146c2e; } .bad { background: #f8d7da; color: #8a1c25; }
  .waiting { background: #fff1c2; color: #7a5600; }
  #error { color: #8a1c25; }
"""

#: The links table's columns: (title, field, kind).
LINK_COLUMNS = (
    ("node", "node_id", "id"),
    ("peer", "peer_id", "id"),
    ("session", "session_id", "id"),
    ("direction", "direction", "text"),
    ("outcome", "outcome", "text"),
    ("start", "start", "time"),
    ("resumes", "resumes", "n"),
    ("suspended s", "suspended_seconds", "seconds"),
    ("messages sent", "messages_sent", "n"),
    ("messages received", "messages_received", "n"),
)
RECONNECT_COLUMNS = (
    ("time", "time", "time"),
    ("node", "node_id", "id"),
    ("peer", "peer_id", "id"),
    ("attempt", "attempt", "n"),
    ("result", "result", "text"),
    ("resolution", "resolution", "text"),
    ("recovery s", "recovery_seconds", "seconds"),
)
PROBLEM_COLUMNS = (
    ("sender", "sender", "id"),
    ("receiver", "receiver", "id"),
    ("session", "session_id", "id"),
    ("channel", "channel_id", "n"),
    ("accepted", "accepted", "n"),
    ("delivered", "delivered", "n"),
    ("lost", "lost", "n"),
    ("duplicated", "duplicated", "n"),
    ("unsettled", "unsettled", "n"),
    ("verdict", "verdict", "text"),
)


def _cell(value, kind: str) -> str:
    if value is None:
        return '<td class="n">-</td>'
    if kind == "id":
        text = str(value)
        return f'<td class="mono" title="{html.escape(text)}">{html.escape(text[:12])}</td>'
    if kind == "time":
        moment = datetime.datetime.fromtimestamp(float(value), datetime.UTC)
        return f'<td class="mono">{moment.strftime("%H:%M:%S")}</td>'
    if kind == "seconds":
        return f'<td class="n">{float(value):.1f}</td>'
    if kind == "n":
        return f'<td class="n">{html.escape(str(value))}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _table(rows: list[dict], columns, total: int | None = None, empty: str = "none yet") -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _, _ in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(field), kind) for _, field, kind in columns) + "</tr>" for r in rows)
    if not rows:
        body = f'<tr><td colspan="{len(columns)}">{html.escape(empty)}</td></tr>'
    more = ""
    if total is not None and total > len(rows):
        more = f'<div class="meta">the newest {len(rows)} of {total}</div>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _verdict(snapshot) -> str:
    audit = snapshot.audit
    if not snapshot.batches:
        return '<span class="verdict waiting">waiting for the first closed file</span>'
    if audit.get("lost") or audit.get("duplicated"):
        text = f"lost {audit['lost']}, duplicated {audit['duplicated']}"
        return f'<span class="verdict bad" id="verdict">{html.escape(text)}</span>'
    text = f"exactly once so far: {audit.get('messages_audited', 0):,} messages audited, 0 lost, 0 duplicated"
    return f'<span class="verdict ok" id="verdict">{html.escape(text)}</span>'


def _activity(snapshot) -> str:
    windows = sorted(snapshot.activity.items(), reverse=True)
    columns = [("window (UTC)", "start", "time")] + [(e.replace("_", " "), e, "n") for e in ACTIVITY_EVENTS]
    rows = [{"start": start, **{e: counts.get(e, 0) for e in ACTIVITY_EVENTS}} for start, counts in windows]
    return _table(rows, columns)


def render(snapshot) -> bytes:
    """The page for ``snapshot`` (a follow.Snapshot)."""
    s = snapshot
    refresh = max(1, round(s.trigger))
    updated = (
        datetime.datetime.fromtimestamp(s.last_batch_at, datetime.UTC).strftime("%H:%M:%S UTC")
        if s.last_batch_at
        else "not yet"
    )
    meta = [
        f"following {s.directory}",
        f"{s.files} closed files, {s.events:,} events ({s.malformed} malformed)",
        f"batch {s.batches} at {updated}" + (f", took {s.last_batch_seconds:.1f} s" if s.last_batch_seconds else ""),
    ]
    if s.lag_seconds is not None:
        meta.append(f"file closed to shown: {s.lag_seconds:.1f} s (at most {s.max_lag_seconds:.1f} s)")
    if s.watermark:
        meta.append(f"activity watermark {s.watermark}")
    audit = s.audit
    counts = ""
    if audit:
        counts = (
            f'<div class="meta"><span>{audit["rows"]} audit rows</span><span>{audit["ok_rows"]} ok</span>'
            f"<span>{audit['one_sided_rows']} one-sided</span><span>{audit['unsettled']} unsettled</span>"
            f"<span>{audit['in_doubt']} in doubt</span></div>"
        )
    error = f'<div id="error">{html.escape(s.error)}</div>' if s.error else ""
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mconn fleet (live)</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>mconn fleet, live</h1>
<div class="meta">{"".join(f"<span>{html.escape(m)}</span>" for m in meta)}</div>
{error}
<h2>Delivery audit</h2>
{_verdict(s)}
{counts}
{_table(s.problems, PROBLEM_COLUMNS, empty="no audit row with a problem") if s.problems else ""}
<h2>Breaks and resumes, per {WINDOW_SECONDS} s of event time</h2>
{_activity(s)}
<h2>Links ({s.link_count} session ends)</h2>
{_table(s.links, LINK_COLUMNS, s.link_count)}
<h2>Reconnects ({s.reconnect_count} dial attempts)</h2>
{_table(s.reconnects, RECONNECT_COLUMNS, s.reconnect_count)}
<div class="meta">Machine-readable: <a href="state.json">state.json</a></div>
</body>
</html>
"""
    return page.encode()


class PageHolder:
    """The latest snapshot, replaced in the reactor thread (``update``)."""

    def __init__(self, snapshot) -> None:
        self.snapshot = snapshot

    def update(self, snapshot) -> None:
        self.snapshot = snapshot


class _Page(resource.Resource):
    def __init__(self, holder: PageHolder) -> None:
        super().__init__()
        self.holder = holder
        self.putChild(b"state.json", _State(holder))

    def render_GET(self, request) -> bytes:
        for name, value in HEADERS.items():
            request.setHeader(name, value)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return render(self.holder.snapshot)

    def getChild(self, path: bytes, request):
        if path == b"":
            return self
        return resource.NoResource()


class _State(resource.Resource):
    isLeaf = True

    def __init__(self, holder: PageHolder) -> None:
        super().__init__()
        self.holder = holder

    def render_GET(self, request) -> bytes:
        for name, value in HEADERS.items():
            request.setHeader(name, value)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self.holder.snapshot.as_json(), default=str).encode()


class _QuietSite(server.Site):
    """No line per request: a watched page reloads every few seconds."""

    noisy = False
    displayTracebacks = False

    def log(self, request) -> None:
        pass


def listen(reactor, holder: PageHolder, port: int):
    """Serve ``holder``'s page on 127.0.0.1:``port`` (0: any free port); the listening port."""
    return reactor.listenTCP(port, _QuietSite(_Page(holder)), interface="127.0.0.1")
