"""What the HTML report tells at a glance, on a hand-made fleet log with known truth, through
``mconn-pipeline`` (cli.main) on real Spark, and as a real headless Chromium renders it.

The fleet (current nodes, every field logged):

* P -> K: P sends 20 messages K delivers, then 514 that K never acknowledges: K is killed
  (it restarts, its session has no end in its log) and P's session expires with 514
  unconfirmed. Nothing is lost or duplicated, and nothing about those 514 is confirmed.
* Q -> R: a bulk channel (priority 1) always has a queue; a chat channel (priority 10) has
  one message queued at one sample only, sent before the next. Then the link goes silent:
  both ends log a ``PongTimeout`` about each other 1.3 s apart, both suspend, and the
  session resumes. Q's event loop stalls once (``loop_stalled`` names R, the peer whose
  timer noticed).
* S -> T: both channels stay backlogged from sample to sample: real contention. S logs a
  protocol error about T that T does not log about S.

P, Q and R have monikers (K had one, then restarted under another); K, S and T show by
their ids. The Q - R timeouts are logged as an older node logged them, ``protocol_error``
``PongTimeout`` (before ``link_failed``): a link failure, not misbehaviour. Q - R's
channel_stats name the channels (``0x20 bulk``, ``0x21 chat``).

The run is module-scoped: the tests read its tables and its report.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pathlib
import re
import struct

import pytest

from browser import ARTIFACTS, run_browser
from .fleetlog import FleetLog, Link, node_id, session_id

P, K, Q, R, S, T = (node_id(n) for n in "PKQRST")
S_KILLED, S_CHAT, S_BACKLOG = (session_id(n) for n in ("s-killed", "s-chat", "s-backlog"))
BULK, CHAT = 0x20, 0x21
CHANNELS = ((BULK, 1), (CHAT, 10))
UNCONFIRMED = 514
MONIKERS = {"P": "validator-p", "Q": "quebec", "R": "romeo"}
CHANNEL_NAMES = {BULK: "bulk", CHAT: "chat"}


def build_fleet() -> FleetLog:
    fleet = FleetLog()
    p, k, q, r, s, t = (fleet.node(n, current=True, moniker=MONIKERS.get(n)) for n in "PKQRST")
    k.moniker = "kilo-before"  # its first run's name; the restart below drops it
    for node in (p, k, q, r, s, t):
        node.start(0)
        node.listen(0)
    # P -> K: K delivers 20, then is killed; P's session expires with 514 unconfirmed.
    killed = Link(p, k, "s-killed", 10)
    killed.send(p, BULK, 20)
    killed.stats(k, 15)
    killed.unconfirmed(p, BULK, UNCONFIRMED)
    k.moniker = None  # restarted without a node info: the latest node_started names no one
    k.start(20)  # killed and started again: its session with P has no end in its log
    k.listen(20)
    killed.suspend(20.5, ends=(p,))
    killed.end(50.5, "SessionExpired", ends=(p,), lose_connection=False)
    # Q -> R: bulk always queued; one chat message queued at one sample only.
    chat = Link(q, r, "s-chat", 100, channels=CHANNELS, channel_names=CHANNEL_NAMES)
    chat.send(q, BULK, 50)
    chat.send(q, CHAT, 1)
    for tick in range(1, 7):
        chat.stats(
            q,
            100 + tick,
            queue={BULK: 5, CHAT: 1 if tick == 2 else 0},
            sent_bytes={BULK: 10_000 * tick, CHAT: 100 if tick >= 3 else 0},
        )
    q.emit("loop_stalled", 108, peer_id=R, late=0.3)
    # The link goes silent: both ends time out on each other, then it resumes.
    for node, at, remote in ((q, 110.0, r.address), (r, 111.3, "127.0.0.1:50000")):
        node.emit(
            "protocol_error",
            at,
            peer_id=chat.other(node).id,
            remote_address=remote,
            error_type="PongTimeout",
            error="nothing received within pong_timeout 3.0s after our ping",
        )
    chat.suspend(111.4)
    chat.resume(112)
    chat.end(150)
    # S -> T: both channels backlogged from sample to sample.
    backlog = Link(s, t, "s-backlog", 100, channels=CHANNELS)
    backlog.send(s, BULK, 40)
    backlog.send(s, CHAT, 40)
    for tick in range(1, 6):
        backlog.stats(s, 100 + tick, queue={BULK: 8, CHAT: 3}, sent_bytes={BULK: 1000 * tick, CHAT: 9000 * tick})
    s.emit(
        "protocol_error",
        120,
        peer_id=T,
        remote_address=t.address,
        error_type="UnknownChannel",
        error="channel 0x99 is not one of ours",
    )
    backlog.end(150)
    return fleet


#: What the report's charts were drawn from, by chart: the label of each lane or bar.
CHART_LABELS: dict[str, list[str]] = {}


@pytest.fixture(scope="module")
def out(tmp_path_factory, spark):
    """Run the command on the fleet's files; returns (JSON record, out directory). The labels the
    timeline and the bar charts get are kept in CHART_LABELS."""
    from mconn.pipeline import cli, plots

    def recording(draw, labels):
        def drawn(rows, *args, **kwargs):
            CHART_LABELS.setdefault(draw.__name__, []).extend(labels(rows))
            return draw(rows, *args, **kwargs)

        return drawn

    root = tmp_path_factory.mktemp("report")
    build_fleet().write(root / "logs")
    out = root / "tables"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "timeline", recording(plots.timeline, lambda lanes: [lane["label"] for lane in lanes]))
        patch.setattr(plots, "bars", recording(plots.bars, lambda rows: [label for label, _ in rows]))
        status = cli.main([str(root / "logs"), "--out", str(out), "--json", "--quiet"])
    assert status == 0
    return json.loads(stdout.getvalue().strip().splitlines()[-1]), str(out)


@pytest.fixture(scope="module")
def page(out):
    return open(out[0]["report"], encoding="utf-8").read()


def section(page: str, title: str) -> str:
    """The report's HTML from the heading ``title`` to the next heading."""
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 1)
    return page[start : end if end != -1 else len(page)]


# -- the verdict -----------------------------------------------------------------------


def test_unconfirmed_messages_to_a_killed_node_qualify_the_verdict(out, page):
    """514 messages sent to a node that was killed are counted unconfirmed (the sender's undelivered), and
    the verdict says so in amber instead of a bare green "exactly-once holds"."""
    summary = out[0]["summary"]
    assert (summary["lost"], summary["duplicated"]) == (0, 0)
    assert (summary["unconfirmed"], summary["unconfirmed_receiver_killed"]) == (UNCONFIRMED, UNCONFIRMED)
    verdict = re.search(r"<div class='verdict (\w+)' id='verdict'>(.*?)</div>", page, re.S)
    assert verdict, "no verdict in the report"
    assert verdict.group(1) == "caveat"
    assert verdict.group(2).startswith(f"0 lost, 0 duplicated in {summary['messages_audited']:,} messages audited")
    assert f"<li>{UNCONFIRMED} unconfirmed: sent to a node that was killed" in verdict.group(2)
    assert "exactly-once holds" not in page


def test_the_report_uses_the_api_word_unconfirmed(page):
    """The findings table heads the sender's count with the API's word, unconfirmed, and lists the row whose
    514 messages the killed receiver never acknowledged (its verdict is ok)."""
    findings = section(page, "Delivery audit findings")
    headers = re.findall(r"<th>(.*?)</th>", findings)
    assert "unconfirmed" in headers and "undelivered" not in headers
    row = re.search(rf'<tr><td title="{P}">.*?</tr>', findings)
    assert row, "the row of P's unconfirmed messages is not in the findings"
    cells = dict(zip(headers, cell_values(row.group(0)), strict=True))
    assert (cells["receiver"], cells["unconfirmed"], cells["verdict"]) == (K, str(UNCONFIRMED), "ok")


def test_nodes_show_by_moniker_and_channels_by_name(page):
    """Node ids in the report's tables show as ``moniker (abcd1234)`` from the node's latest node_started
    (the whole id kept in the cell's title), as the 8-hex prefix for a node without one (K restarted without
    its moniker; T never had one); a channel shows with the name channel_stats gave it."""
    findings = section(page, "Delivery audit findings")
    headers = re.findall(r"<th>(.*?)</th>", findings)
    row = re.search(rf'<tr><td title="{P}">.*?</tr>', findings)
    assert row, "the row of P's unconfirmed messages is not in the findings"
    cells = dict(zip(headers, cell_texts(row.group(0)), strict=True))
    assert (cells["sender"], cells["receiver"]) == (f"validator-p ({P[:8]})", K[:8])
    assert cells["channel"] == "0x20 bulk"
    unstable = section(page, "Most unstable links")
    shown = {text for title, text in re.findall(r'<td title="(\w+)">(.*?)</td>', unstable)}
    assert shown == {f"quebec ({Q[:8]})", f"romeo ({R[:8]})", f"validator-p ({P[:8]})", K[:8]}
    assert "kilo-before" not in page
    errors = section(page, "Errors")
    assert f'<td title="{Q}">quebec ({Q[:8]})</td>' in errors  # the loop stall's node
    assert f'<td title="{T}">{T[:8]}</td>' in errors  # S's protocol error names T, which has no moniker


def test_the_charts_label_nodes_by_moniker(out):
    """The link timeline's lanes and the unstable-links bars are labelled with the nodes' names."""
    lanes = CHART_LABELS["timeline"]
    assert f"quebec ({Q[:8]}) > romeo ({R[:8]})" in lanes and f"validator-p ({P[:8]}) > {K[:8]}" in lanes
    assert f"{S[:8]} > {T[:8]}" in lanes
    bars = CHART_LABELS["bars"]
    pair = sorted((("quebec", Q), ("romeo", R)), key=lambda named: named[1])
    assert " - ".join(f"{name} ({node[:8]})" for name, node in pair) in bars


def test_the_headline_books_link_failures_apart_from_protocol_errors(out, page):
    """Connections lost to a link failure (reason_kind link) are counted apart, and the headline says they are
    not errors; the older PongTimeouts logged as protocol_error are not counted as peer misbehaviour."""
    summary = out[0]["summary"]
    # P's link to K broke once at P; Q - R's broke at both ends; the other ends were closes.
    assert (summary["link_failures"], summary["protocol_errors"]) == (3, 1)
    headline = dict(re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td></tr>", page))
    assert headline["errors"].startswith(
        "protocol 1 (peer misbehaviour), link failures 3 (timeouts, resets: not errors), refused connections 0"
    )


def test_a_legend_explains_in_doubt_and_unsettled(page):
    """A legend under the findings table says what unconfirmed, in doubt, unsettled and one-sided mean."""
    legend = re.search(r"<dl class='legend'>(.*?)</dl>", section(page, "Delivery audit findings"), re.S)
    assert legend, "no legend under the findings table"
    terms = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", legend.group(1)))
    assert set(terms) == {"unconfirmed", "in doubt", "unsettled", "one-sided"}
    assert "acknowledgement was lost with the connection" in terms["in doubt"]
    assert "killed" in terms["unsettled"]


# -- contention ------------------------------------------------------------------------


def test_one_queued_message_is_not_contention_a_sustained_backlog_is(out, spark):
    """Q -> R's chat message queued at one sample only makes no contended interval; S -> T's two channels
    backlogged from sample to sample do, with the shares their bytes and priorities give."""
    from mconn.pipeline import report

    events = spark.read.parquet(f"{out[1]}/events")
    points = {(p["node_id"], p["peer_id"], p["channel_id"]): p for p in report.share_points(events)}
    assert set(points) == {(S, T, BULK), (S, T, CHAT)}
    # Ticks 2 to 5 are contended (tick 1 has no sample before it): 1000 and 9000 bytes each.
    assert points[(S, T, BULK)]["bandwidth_share"] == pytest.approx(0.1)
    assert points[(S, T, CHAT)]["bandwidth_share"] == pytest.approx(0.9)
    assert points[(S, T, BULK)]["priority_share"] == pytest.approx(1 / 11)
    assert points[(S, T, CHAT)]["priority_share"] == pytest.approx(10 / 11)
    assert points[(S, T, CHAT)]["bytes"] == 4 * 9000


def cell_values(row: str) -> list[str]:
    """The cells of one table row: a shortened id's full value (its title), else the text."""
    return [title or text for title, text in re.findall(r'<td(?: class="n")?(?: title="(\w+)")?>(.*?)</td>', row)]


def cell_texts(row: str) -> list[str]:
    """The cells of one table row as shown."""
    return re.findall(r'<td(?: class="n")?(?: title="\w+")?>(.*?)</td>', row)


# -- errors and breaks -----------------------------------------------------------------


def test_a_loop_stall_names_the_stalled_node_not_its_peer(out, tables, page):
    """Q's loop stalled: the errors row names Q (scope node), not R, the peer whose timer noticed; the
    report's errors table shows Q in its node column."""
    [row] = [r for r in tables(out[1], "errors") if r["source"] == "loop_stalled"]
    assert (row["scope"], row["node_id"], row["peer_id"], row["count"]) == ("node", Q, None, 1)
    errors = section(page, "Errors")
    headers = re.findall(r"<th>(.*?)</th>", errors)
    [stall] = [r for r in re.findall(r"<tr>(.*?)</tr>", errors) if "<td>loop_stalled</td><td>loop_stalled" in r]
    cells = dict(zip(headers, cell_values(stall), strict=True))
    assert (cells["scope"], cells["node"], cells["peer"]) == ("node", Q, "-")


def test_a_break_both_ends_saw_is_one_link_event(out, tables):
    """Both ends of Q - R timed out on each other: one errors row of scope link, counted once, naming Q (who
    saw it first) and R; S's error about T, which T did not log, stays an error about the peer."""
    rows = {(r["source"], r["kind"]): r for r in tables(out[1], "errors") if r["source"] == "protocol_error"}
    timeout = rows[("protocol_error", "PongTimeout")]
    assert (timeout["scope"], timeout["node_id"], timeout["peer_id"]) == ("link", Q, R)
    assert (timeout["count"], timeout["nodes"]) == (1, 2)
    other = rows[("protocol_error", "UnknownChannel")]
    assert (other["scope"], other["node_id"], other["peer_id"], other["count"]) == ("peer", None, T, 1)
    # The timeout is a link failure: the summary's protocol_errors counts the misbehaviour only.
    assert out[0]["summary"]["protocol_errors"] == 1


def test_breaks_and_lost_sessions_count_once_per_link(out, spark):
    """The Q - R break suspended both ends: one break of one link, not one for each peer; the session P lost
    when K was killed (restarted at K, expired at P) is one lost session."""
    from mconn.pipeline import report

    links = spark.read.parquet(f"{out[1]}/links")
    got = {(r["a"], r["b"]): (r["breaks"], r["sessions_lost"], r["sessions"]) for r in report.unstable_links(links)}
    assert got == {tuple(sorted((Q, R))): (1, 0, 1), tuple(sorted((P, K))): (1, 1, 1)}


# -- as a browser shows it -------------------------------------------------------------

#: Appended to a copy of the report: after layout, every image's rendered and natural size.
MEASURE = """<script>
window.addEventListener("load", () => {
  const sizes = [...document.images].map(i => ({alt: i.alt, width: i.width, height: i.height,
    natural_width: i.naturalWidth, natural_height: i.naturalHeight}));
  const out = document.createElement("pre");
  out.id = "sizes";
  out.textContent = JSON.stringify(sizes);
  document.body.appendChild(out);
});
</script>"""


def png_size(page: str, alt: str) -> tuple[int, int]:
    """Width and height of the embedded PNG with this alt text, from its IHDR chunk."""
    data = re.search(rf'<img alt="{alt}" src="data:image/png;base64,([^"]+)"', page)
    assert data, f"no {alt} chart in the report"
    return struct.unpack(">II", base64.b64decode(data.group(1))[16:24])


def test_a_browser_shows_the_verdict_and_charts_in_their_own_proportions(out, page, tmp_path):
    """Headless Chromium renders the report: the verdict text, the nodes' monikers and the link failures apart
    from protocol errors are there, every chart keeps its own aspect ratio
    (none stretched to its neighbours' height), the unstable-links chart of two links is wider than tall; a
    screenshot is kept under tests/artifacts/."""
    measured = tmp_path / "report.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    window = "--window-size=1280,1000"
    dom = run_browser("--virtual-time-budget=5000", window, "--dump-dom", measured.as_uri())
    assert "0 lost, 0 duplicated in" in dom and f"{UNCONFIRMED} unconfirmed" in dom
    assert f"quebec ({Q[:8]})" in dom  # the unstable links table names the nodes
    assert "link failures 3 (timeouts, resets: not errors)" in dom
    sizes = re.search(r'<pre id="sizes">(.*?)</pre>', dom, re.S)
    assert sizes, f"the measuring script did not run:\n{dom[-2000:]}"
    images = json.loads(sizes.group(1).replace("&quot;", '"'))
    charts = {i["alt"] for i in images}
    assert {"unstable links", "bandwidth share against priority", "errors", "link timeline"} <= charts
    for image in images:
        rendered = image["width"] / image["height"]
        natural = image["natural_width"] / image["natural_height"]
        assert rendered == pytest.approx(natural, rel=0.02), f"{image['alt']} is drawn out of proportion: {image}"
    width, height = png_size(page, "unstable links")
    assert height < width, f"the unstable links chart is {width} x {height}"
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "fleet_report.png"
    report = pathlib.Path(out[0]["report"]).as_uri()
    run_browser("--virtual-time-budget=5000", "--hide-scrollbars", window, f"--screenshot={screenshot}", report)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"report screenshot: {screenshot}")
