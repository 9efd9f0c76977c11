"""Hand-made fleet logs with known truth, through ``mconn-pipeline`` (cli.main) on real Spark.

Six older nodes (their logs lack the fields added to specs/telemetry.md later, so the
pipeline infers), one scenario per link so that each fault can be checked where it must
show up and nowhere else: a lost message (A -> B), a duplicate (C -> A), a resume (B
dials C), a grace expiry (D dials B), a restart (F crashes and comes back; E dials it),
plus malformed records, unknown events, protocol errors and a refused peer. Three current
nodes log every field: G dials H (ping round trips, a resume whose second connection
outgrew the first between two samples, a refused connection that carried no session),
H restarts with no session open, I restarts with its session to G open and nothing
replaces it. The run is module-scoped: the tests read its tables.
"""

import contextlib
import io
import json
import pathlib

import pytest

from .fleetlog import FleetLog, Link, node_id, record, session_id

A, B, C, D, E, F, G, H, I = (node_id(n) for n in "ABCDEFGHI")  # noqa: E741 -- nodes A to I
S_LOST, S_DUP, S_RESUME, S_EXPIRE, S_OLD, S_NEW, S_GH, S_GI = (
    session_id(n) for n in ("s-lost", "s-dup", "s-resume", "s-expire", "s-old", "s-new", "s-gh", "s-gi")
)
REFUSED = "unknown session (expired, or this node restarted)"
MALFORMED = 6


def build_fleet() -> FleetLog:
    fleet = FleetLog()
    a, b, c, d, e, f = (fleet.node(n) for n in "ABCDEF")
    for node in (a, b, c, d, e, f):
        node.listen(0)
    # A lost message: A accepted and saw acked 11 on 0x20, B delivered 10.
    lost = Link(a, b, "s-lost", 10, rtt=0.010)
    lost.send(a, 0x20, 10)
    lost.lose(a, 0x20)
    lost.send(b, 0x21, 4)
    lost.stats(a, 15, queue={0x20: 3, 0x21: 2}, sent_bytes={0x20: 1000, 0x21: 5000})
    lost.stats(a, 25, queue={0x20: 3, 0x21: 2}, sent_bytes={0x20: 2000, 0x21: 10000})
    lost.stats(b, 16)
    lost.end(70)
    # A duplicate: C accepted 7 on 0x21, A delivered 8.
    dup = Link(c, a, "s-dup", 80, rtt=0.030)
    dup.send(c, 0x21, 7)
    dup.duplicate(c, 0x21)
    dup.end(120)
    # A resume: the link breaks at 150, a dial fails, the second resumes the session.
    resume = Link(b, c, "s-resume", 130, rtt=0.020)
    resume.send(b, 0x20, 20)
    resume.send(c, 0x21, 3)
    resume.suspend(150)
    resume.dial(150.5, 1, "failed", error="ConnectionRefusedError: Connection was refused by other side")
    resume.resume(152, attempt=2)
    resume.send(b, 0x20, 5)
    resume.end(200)
    # A grace expiry: 2 messages accepted by D were never confirmed; reported undelivered.
    expire = Link(d, b, "s-expire", 210)
    expire.send(d, 0x20, 5)
    expire.unconfirmed(d, 0x20, 2)
    expire.suspend(220)
    for attempt, at in enumerate((221, 223, 227), start=1):
        expire.dial(at, attempt, "failed", error="ConnectionRefusedError: refused")
    expire.end(250, "SessionExpired", lose_connection=False)
    # A restart: F's process dies at 285 with its session open (no end in its log),
    # comes back at 290; E's resume is refused and a fresh session starts.
    old = Link(e, f, "s-old", 270)
    old.send(e, 0x20, 5)
    old.unconfirmed(e, 0x20, 1)
    old.send(f, 0x21, 3)
    old.unconfirmed(f, 0x21, 1)  # died with F: never reported by anyone
    old.stats(f, 280)
    old.suspend(285, ends=(e,))
    f.listen(290)
    old.end(291.005, "SessionRejected", ends=(e,), lose_connection=False)
    new = Link(e, f, "s-new", 291.0, resume_refused=REFUSED)
    old.dial(291.02, 1, "connected")
    new.send(e, 0x20, 2)
    new.end(330)
    current_nodes(fleet)
    # Errors: two protocol errors from one remote host (one of them on the line of a
    # record cut short), a refused duplicate peer.
    proto = dict(peer_id=None, remote_address="10.0.0.9:4000", error_type="UnknownPacketType", error="packet type 0x77")
    cut_short = f'\x1e{{"event": "connection_made", "node_id": "{C}", "direc'
    c.raw(99.9, cut_short + record("protocol_error", 100, node_id=C, **proto))
    c.emit("protocol_error", 101, **proto)
    a.emit(
        "peer_rejected",
        105,
        peer_id=B,
        remote_address="127.0.0.1:5555",
        reason="duplicate",
        message=f"node {B} is already connected",
    )
    a.emit("connection_refused", 106, remote_address="10.0.0.9:4100", reason="ip_limit", message="3 of 3")
    c.emit("loop_stalled", 102, peer_id=None, late=0.25)
    # A first dial that gives up: an attempt that belongs to no break.
    d.emit(
        "dial_attempt",
        5,
        peer_id=None,
        address="127.0.0.1:9999",
        attempt=1,
        delay=0.0,
        result="failed",
        error="ConnectionRefusedError: refused",
    )
    d.emit("dial_gave_up", 6, peer_id=None, reason="max_reconnects 1 reached: ConnectionRefusedError")
    # Malformed records (6, one of them above) and unknown events (2).
    a.raw(50, "not json\n")
    a.raw(52, record("channel_stats", 52, node_id=A, peer_id=B, channel_id=0x20, queue_depth="deep"))
    a.raw(53, record("listening", 53, address="127.0.0.1:1"))  # no node_id
    a.raw(54, "\x1e[1, 2]\n")
    a.raw(55, record("session_ended", 55, node_id=A, peer_id=B, session_id=session_id("s-bogus"), channels=[1, 2]))
    b.emit("node_upgraded", 60, version="2")
    b.emit("node_upgraded", 61, version="3")
    return fleet


def current_nodes(fleet: FleetLog) -> None:
    """G, H and I log every field of specs/telemetry.md (node_started, session_id, ...)."""
    g, h, i = (fleet.node(n, current=True) for n in "GHI")
    for node in (g, h, i):
        node.start(0)
        node.listen(0)
    gh = Link(g, h, "s-gh", 400, rtt=0.040)
    gh.send(g, 0x20, 6)
    gh.stats(g, 410, sent_bytes={0x20: 1000}, round_trip=0.005)
    gh.stats(h, 410, round_trip=0.006)
    gh.suspend(415)
    gh.resume(416)
    # H refused a second connection from G: it carried no session (session_id null).
    h.emit(
        "connection_lost",
        420,
        peer_id=G,
        remote_address="127.0.0.1:59999",
        direction="inbound",
        reason_type="PeerRejected",
        reason="duplicate",
        duration=0.01,
        bytes_sent=777,
        bytes_received=777,
        channels=[],
        session_id=None,
    )
    # The second connection has sent 3000 bytes, more than the first had (1000) at 410.
    gh.stats(g, 430, sent_bytes={0x20: 3000}, round_trip=0.005)  # no new pong: the same sample
    gh.stats(g, 440, sent_bytes={0x20: 3500}, round_trip=0.007)
    gh.end(450)
    h.start(470)  # H restarts with no session open
    h.listen(470)
    gi = Link(g, i, "s-gi", 480)
    gi.stats(i, 490)
    i.start(500)  # I restarts with its session open; no session with G follows
    i.listen(500)
    gi.suspend(500.5, ends=(g,))


@pytest.fixture(scope="module")
def out(tmp_path_factory, spark):
    """Run the command on the fleet's files (a directory and a glob); returns (status, JSON, out)."""
    from mconn.pipeline import cli

    root = tmp_path_factory.mktemp("known-truth")
    paths = build_fleet().write(root / "logs")
    (root / "more").mkdir()
    for name in "EF":  # some files through a directory, the others through a glob
        paths[name].rename(root / "more" / paths[name].name)
    out = root / "tables"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main([str(root / "logs" / "*.json"), str(root / "more"), "--out", str(out), "--json", "--check"])
    return status, json.loads(stdout.getvalue().strip().splitlines()[-1]), str(out)


def by(rows, *keys):
    """Rows by the value of one key, or by the tuple of several."""
    return {(r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys)): r for r in rows}


def test_check_fails_the_command_because_of_the_lost_and_the_duplicated_message(out):
    """With --check, the known fleet's one lost and one duplicated message make the command exit 3."""
    status, result, _ = out
    assert status == 3
    assert result["summary"]["lost"] == 1 and result["summary"]["duplicated"] == 1


def test_the_lost_message_shows_up_in_one_audit_row_only(out, tables):
    """The one lost message shows up in exactly one audit row, its sender's session and channel, with both
    ends' final counts."""
    rows = tables(out[2], "delivery_audit")
    lost = [(r["sender"], r["receiver"], r["session_id"], r["channel_id"], r["lost"]) for r in rows if r["lost"]]
    assert lost == [(A, B, S_LOST, 0x20, 1)]
    row = by(rows, "sender", "receiver", "session_id", "channel_id")[(A, B, S_LOST, 0x20)]
    assert (row["accepted"], row["acked"], row["undelivered"], row["delivered"]) == (11, 11, 0, 10)
    assert row["verdict"] == "lost" and row["sender_final"] and row["receiver_final"]


def test_the_duplicate_shows_up_in_one_audit_row_only(out, tables):
    """The one duplicated message shows up in exactly one audit row, its sender's session and channel."""
    rows = tables(out[2], "delivery_audit")
    dups = [
        (r["sender"], r["receiver"], r["session_id"], r["channel_id"], r["duplicated"]) for r in rows if r["duplicated"]
    ]
    assert dups == [(C, A, S_DUP, 0x21, 1)]


def test_every_other_audit_row_is_clean(out, tables):
    """The only verdicts besides ok: the lost row, the duplicate, and F's restart."""
    rows = tables(out[2], "delivery_audit")
    verdicts = {(r["sender"], r["session_id"], r["channel_id"]): r["verdict"] for r in rows if r["verdict"] != "ok"}
    assert verdicts == {(A, S_LOST, 0x20): "lost", (C, S_DUP, 0x21): "duplicated", (F, S_OLD, 0x21): "unsettled"}
    assert {r["session_id"] for r in rows} == {S_LOST, S_DUP, S_RESUME, S_EXPIRE, S_OLD, S_NEW, S_GH, S_GI}
    assert sum(r["in_doubt"] for r in rows) == 0


def test_grace_expiry_reports_undelivered_not_lost(out, tables):
    """Messages left when grace expired count as undelivered, not lost; both ends say expired, with the
    suspension and failed redials."""
    audit = by(tables(out[2], "delivery_audit"), "sender", "session_id", "channel_id")
    row = audit[(D, S_EXPIRE, 0x20)]
    assert (row["accepted"], row["undelivered"], row["delivered"], row["lost"]) == (7, 2, 5, 0)
    links = by(tables(out[2], "links"), "node_id", "session_id")
    assert links[(D, S_EXPIRE)]["outcome"] == links[(B, S_EXPIRE)]["outcome"] == "expired"
    assert links[(D, S_EXPIRE)]["suspended_seconds"] == pytest.approx(30.0, abs=0.01)
    attempts = [r for r in tables(out[2], "reconnects") if r["session_id"] == S_EXPIRE]
    attempts.sort(key=lambda r: r["attempt"])
    assert [(r["attempt"], r["result"], r["resolution"], r["recovery_seconds"]) for r in attempts] == [
        (1, "failed", "expired", None),
        (2, "failed", "expired", None),
        (3, "failed", "expired", None),
    ]


def test_the_restart_shows_up_as_a_lost_session_end_and_a_fresh_session(out, tables):
    """A restarted node's old session has no end on its side and a fresh start on the other; its unreported
    message is unsettled, not lost."""
    links = by(tables(out[2], "links"), "node_id", "session_id")
    assert links[(F, S_OLD)]["outcome"] == "restarted" and links[(F, S_OLD)]["end"] is None
    assert links[(E, S_OLD)]["outcome"] == "fresh"
    assert links[(E, S_OLD)]["end_reason_type"] == "SessionRejected"
    assert links[(E, S_NEW)]["resume_refused"] == links[(F, S_NEW)]["resume_refused"] == REFUSED
    # F's counters for the old session come from its last channel_stats: one message
    # it accepted was neither delivered nor reported undelivered by anyone.
    audit = by(tables(out[2], "delivery_audit"), "sender", "session_id", "channel_id")
    row = audit[(F, S_OLD, 0x21)]
    assert (row["sender_final"], row["receiver_final"], row["accepted"], row["delivered"]) == (False, True, 4, 3)
    assert (row["unsettled"], row["lost"]) == (1, 0)
    assert audit[(E, S_OLD, 0x20)]["verdict"] == "ok"  # F's deliveries are a lower bound: nothing proven
    [attempt] = [r for r in tables(out[2], "reconnects") if r["node_id"] == E]
    assert (attempt["resolution"], attempt["session_id"]) == ("fresh", S_OLD)
    assert attempt["recovery_seconds"] == pytest.approx(291.01 - 285.0001, abs=1e-3)


def test_outcomes_of_every_session_end(out, tables):
    """Every session end in the known fleet gets its outcome: closed, resumed, expired, fresh, restarted or
    still open."""
    outcomes = {(r["node_id"], r["session_id"]): r["outcome"] for r in tables(out[2], "links")}
    assert outcomes == {
        (A, S_LOST): "closed",
        (B, S_LOST): "closed",
        (C, S_DUP): "closed",
        (A, S_DUP): "closed",
        (B, S_RESUME): "resumed",
        (C, S_RESUME): "resumed",
        (D, S_EXPIRE): "expired",
        (B, S_EXPIRE): "expired",
        (E, S_OLD): "fresh",
        (F, S_OLD): "restarted",
        (E, S_NEW): "closed",
        (F, S_NEW): "closed",
        (G, S_GH): "resumed",
        (H, S_GH): "resumed",
        (G, S_GI): "open",
        (I, S_GI): "restarted",
    }


def test_the_resume_is_counted_and_timed(out, tables):
    """The resume is counted once at both ends, with its suspension time, its two connections and the dial
    that ended it."""
    links = by(tables(out[2], "links"), "node_id", "session_id")
    for node in (B, C):
        row = links[(node, S_RESUME)]
        assert (row["resumes"], row["suspensions"]) == (1, 1)
        assert row["suspended_seconds"] == pytest.approx(152.021 - 150.0001, abs=1e-3)
        assert row["connections"] == 2
    attempts = [r for r in tables(out[2], "reconnects") if r["session_id"] == S_RESUME]
    attempts.sort(key=lambda r: r["attempt"])
    assert [(r["node_id"], r["attempt"], r["result"], r["resolution"]) for r in attempts] == [
        (B, 1, "failed", "resumed"),
        (B, 2, "connected", "resumed"),
    ]
    assert attempts[0]["recovery_seconds"] == pytest.approx(152.021 - 150.0001, abs=1e-3)


def test_bandwidth_share_follows_the_counters(out, tables):
    """A channel's bandwidth share follows its byte counters, and its contended samples are counted."""
    rows = by([r for r in tables(out[2], "channels") if r["node_id"] == A and r["peer_id"] == B], "channel_id")
    assert rows[0x20]["bytes_sent"] == 2000 and rows[0x21]["bytes_sent"] == 10000
    assert rows[0x20]["bandwidth_share"] == pytest.approx(1 / 6)
    assert rows[0x20]["priority_share"] == pytest.approx(1 / 6)
    assert rows[0x21]["bandwidth_share"] == pytest.approx(5 / 6)
    assert rows[0x21]["contended_samples"] == 2


def test_handshake_round_trips_per_link(out, tables):
    """Handshake round trips give per-link latency percentiles, measured on the dialing side only."""
    rows = by([r for r in tables(out[2], "latency") if r["scope"] == "link"], "node_id", "peer_id")
    assert rows[(C, A)]["p50_seconds"] == pytest.approx(0.030, abs=1e-4)
    assert rows[(B, C)]["samples"] == 2 and rows[(B, C)]["p50_seconds"] == pytest.approx(0.020, abs=1e-4)
    assert (A, C) not in rows  # only the dialing side measures


def test_errors_by_kind_and_remote_host(out, tables):
    """Errors are counted by source, kind and remote host."""
    rows = {(r["source"], r["kind"], r["remote_host"]): r["count"] for r in tables(out[2], "errors")}
    assert rows == {
        ("protocol_error", "UnknownPacketType", "10.0.0.9"): 2,
        ("peer_rejected", "duplicate", "127.0.0.1"): 1,
        ("connection_refused", "ip_limit", "10.0.0.9"): 1,
        ("dial_gave_up", "gave_up", None): 1,
        ("loop_stalled", "loop_stalled", None): 1,
    }


def test_a_dial_that_belongs_to_no_break(out, tables):
    """A dial that belongs to no break is kept with no peer, session, break time or resolution."""
    [row] = [r for r in tables(out[2], "reconnects") if r["address"] == "127.0.0.1:9999"]
    assert (row["peer_id"], row["session_id"], row["break_time"], row["resolution"]) == (None, None, None, None)


def test_malformed_and_unknown_records_are_counted_not_fatal(out):
    """Malformed records and unknown events are counted, not fatal, and every node is still seen."""
    summary = out[1]["summary"]
    assert (summary["malformed_records"], summary["unknown_events"]) == (MALFORMED, 2)
    assert summary["nodes"] == 9


def test_summary_headline(out):
    """The summary's headline counts match the known fleet exactly."""
    s = out[1]["summary"]
    assert (s["sessions"], s["links"], s["resumes"], s["fresh_starts"]) == (8, 7, 2, 1)
    assert (s["expired_sessions"], s["restarted_sessions"], s["restarts"]) == (1, 2, 2)
    assert (s["dial_attempts"], s["failed_dials"]) == (8, 5)
    assert (s["lost"], s["duplicated"], s["unsettled"], s["in_doubt"]) == (1, 1, 1, 0)
    assert (s["protocol_errors"], s["refused_connections"], s["gave_up_dials"], s["loop_stalls"]) == (2, 2, 1, 1)
    assert s["reactor_errors"] == 0
    # Connections lost to a break: B - C and D - B at both ends, E alone once (older nodes: by reason_type),
    # G - H at both ends and G alone once (current nodes: reason_kind link); closes and refusals are not.
    assert s["link_failures"] == 8


def test_the_one_row_summary_is_one_part_file(out):
    """The summary table's one row is written as one Parquet part, not one a slice of the
    session's default parallelism (an empty file and a task for each other slice)."""
    parts = sorted(p.name for p in pathlib.Path(out[2], "summary").glob("part-*"))
    assert len(parts) == 1, parts


def test_report_is_one_html_file_with_embedded_plots(out):
    """The report is one self-contained HTML file with its plots embedded, stating the problem found."""
    report = out[1]["report"]
    text = open(report, encoding="utf-8").read()
    assert text.startswith("<!doctype html>") and "PROBLEM: 1 lost, 1 duplicated" in text
    assert text.count("data:image/png;base64,") >= 5
    assert 'src="http' not in text  # self-contained


def test_a_restart_with_no_session_open_is_counted(out, tables):
    """H's second node_started follows a run whose only session had ended: no session end
    shows it, the restarts count does; G and H's first node_started are starts, not restarts."""
    assert out[1]["summary"]["restarts"] == 2  # H's and I's
    links = by(tables(out[2], "links"), "node_id", "session_id")
    assert links[(H, S_GH)]["outcome"] == "resumed" and links[(H, S_GH)]["end"] is not None


def test_a_restart_marks_the_open_session_of_the_node_lost(out, tables):
    """I restarted with its session open and nothing replaced it: restarted, not open,
    observed until the restart."""
    links = by(tables(out[2], "links"), "node_id", "session_id")
    row = links[(I, S_GI)]
    assert (row["outcome"], row["end"]) == ("restarted", None)
    assert row["duration_seconds"] == pytest.approx(500 - 480.01, abs=1e-3)
    assert links[(G, S_GI)]["outcome"] == "open"


def test_latency_comes_from_ping_round_trips_when_logged(out, tables):
    """G and H logged round_trip: distinct values per session, at both ends; the older
    nodes keep handshake round trips."""
    rows = tables(out[2], "latency")
    link = by([r for r in rows if r["scope"] == "link"], "node_id", "peer_id")
    gh = link[(G, H)]
    assert (gh["source"], gh["samples"], gh["max_seconds"]) == ("ping", 2, 0.007)
    assert gh["p50_seconds"] == pytest.approx(0.005)
    assert (link[(H, G)]["source"], link[(H, G)]["samples"], link[(H, G)]["p50_seconds"]) == ("ping", 1, 0.006)
    assert link[(C, A)]["source"] == "handshake"
    [fleet] = [r for r in rows if r["scope"] == "fleet"]
    assert fleet["source"] == out[1]["summary"]["rtt_source"] == "handshake+ping"


def test_connection_counter_separates_a_new_connection_that_outgrew_the_old(out, tables):
    """G's 0x20 sent 1000 bytes on connection 1, then 3000 and 3500 on connection 2: 4500
    in all (without the counter, 3000 after 1000 reads as 2000 more)."""
    rows = by([r for r in tables(out[2], "channels") if (r["node_id"], r["peer_id"]) == (G, H)], "channel_id")
    assert rows[0x20]["bytes_sent"] == 4500 and rows[0x20]["samples"] == 3


def test_connections_are_attributed_by_session_id(out, tables):
    """H's refused connection (session_id null) is no connection of the session."""
    links = by(tables(out[2], "links"), "node_id", "session_id")
    assert (links[(H, S_GH)]["connections"], links[(H, S_GH)]["bytes_sent"]) == (2, 2000)
    assert links[(G, S_GH)]["connections"] == 2
