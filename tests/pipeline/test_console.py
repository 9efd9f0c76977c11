"""What the console says: the verdict says why the audit is incomplete, and the findings name the rows."""

from mconn.pipeline.audit import Findings
from mconn.pipeline.console import finding_lines, summary_table
from mconn.pipeline.headline import assess, verdict
from mconn.pipeline.headline import rows as headline_rows

BASE = {"messages_audited": 3647, "lost": 0, "duplicated": 0, "in_doubt": 0, "unsettled": 0, "one_sided_rows": 0}


def test_a_clean_audit_has_no_notes():
    """A clean audit's verdict is ok (green) and states the counts with no notes."""
    assert verdict(BASE) == ("ok", "exactly-once holds: 3,647 messages audited, 0 lost, 0 duplicated")


def test_unsettled_and_one_sided_rows_say_where_they_come_from():
    """Unsettled messages and one-sided rows make the verdict a caveat, not "exactly-once holds", with a note
    saying where each comes from."""
    level, text = verdict(dict(BASE, unsettled=66, one_sided_rows=2))
    assert level == "caveat"
    assert text == (
        "0 lost, 0 duplicated in 3,647 messages audited; "
        "66 unsettled: a sender was killed or the logs stop before its session ended; "
        "2 one-sided rows: one end logged no counters for them (its node was killed before it logged any, "
        "or its logs are missing)"
    )


def test_unconfirmed_messages_are_counted_by_cause_and_never_green():
    """Unconfirmed messages (the API's word for the sender's undelivered) qualify the verdict: those sent to a
    node that was killed, those the receiver delivered anyway (in doubt), and the rest, not delivered."""
    summary = dict(BASE, unconfirmed=530, unconfirmed_receiver_killed=514, in_doubt=6)
    level, head, notes = assess(summary)
    assert (level, head) == ("caveat", "0 lost, 0 duplicated in 3,647 messages audited")
    assert notes == [
        "514 unconfirmed: sent to a node that was killed (or whose logs stop or are missing), never acknowledged",
        "10 unconfirmed: not delivered, the session ended first (its sender's reactors were told)",
        "6 in doubt: reported unconfirmed, yet delivered (the ack was lost with the connection)",
    ]
    assert verdict(summary)[1] == "; ".join([head, *notes])
    assert "holds" not in verdict(summary)[1]


def test_lost_or_duplicated_is_a_problem():
    """Any lost or duplicated message makes the verdict a PROBLEM that names both counts; what is not
    confirmed either way follows."""
    assert verdict(dict(BASE, lost=1, duplicated=2)) == (
        "problem",
        "PROBLEM: 1 lost, 2 duplicated (see delivery_audit)",
    )
    assert verdict(dict(BASE, lost=1, unconfirmed=3, unconfirmed_receiver_killed=3))[1] == (
        "PROBLEM: 1 lost (see delivery_audit); 3 unconfirmed: sent to a node that was killed (or whose logs stop "
        "or are missing), never acknowledged"
    )


A, B, C = "a" * 40, "b" * 40, "c" * 40
NONE = Findings(
    problems=[], problem_rows=0, one_sided_killed=0, one_sided_missing=0, skews=[], skewed_sessions=0, unstarted={}
)


def test_the_rows_with_a_problem_are_named():
    """Each audit row with a lost or duplicated message gets a line: the counts, sender, receiver, session and
    channel; rows beyond those named are counted."""
    problems = [
        {"sender": A, "receiver": B, "session_id": "s1", "channel_id": 0x20, "lost": 2, "duplicated": 0},
        {"sender": C, "receiver": A, "session_id": "s2", "channel_id": 0x21, "lost": 0, "duplicated": 1},
    ]
    lines = finding_lines(Findings(**{**NONE.__dict__, "problems": problems, "problem_rows": 12}))
    assert lines == [
        f"  2 lost: sender {A} receiver {B} session s1 channel 0x20",
        f"  1 duplicated: sender {C} receiver {A} session s2 channel 0x21",
        "  ... and 10 more rows in delivery_audit",
    ]


def test_one_sided_rows_say_whether_the_silent_end_was_killed_or_is_missing():
    """One-sided rows whose silent end is in the logs are put down to a killed node, the others to missing
    logs; each count gets its own line."""
    lines = finding_lines(Findings(**{**NONE.__dict__, "one_sided_killed": 3, "one_sided_missing": 1}))
    assert lines == [
        "note: 3 one-sided rows: the silent end is in the logs but logged no counters for the channel (its node "
        "was killed before it logged them)",
        "note: 1 one-sided rows: the silent end's logs are missing from the input",
    ]


def test_clock_skew_names_the_session_and_says_the_audit_does_not_depend_on_clocks():
    """A session whose ends logged its start seconds apart is named with the later node; the summary line
    gives the bound and says the audit compares counters, not times."""
    lines = finding_lines(Findings(**{**NONE.__dict__, "skews": [("s1", A, B, -7.25)], "skewed_sessions": 3}))
    assert lines[0] == f"warning: clock skew: session s1: {B} logged its start 7.25 s after {A}"
    assert lines[1] == (
        "warning: 3 sessions (2 not shown) whose two ends disagree on the time by more than 2 s: times in the "
        "tables mix the nodes' clocks; the delivery audit compares counters, not times, and does not depend on "
        "clocks"
    )


def test_sessions_seen_without_their_start_point_at_missing_files():
    """A node with sessions seen without their start is told its earlier files are missing (or, when the
    report cannot know about --since, that they may be before it)."""
    assert finding_lines(Findings(**{**NONE.__dict__, "unstarted": {A: 2}})) == [
        f"warning: node {A}: 2 sessions seen without their start: its earlier telemetry is missing from the input"
    ]
    unknown = Findings(**{**NONE.__dict__, "unstarted": {A: 2}, "starts_cut": None})
    assert finding_lines(unknown)[0].endswith("is missing, or before --since")
    assert finding_lines(NONE) == []


def test_the_summary_table_takes_the_findings_or_their_json_lines():
    """summary_table prints the findings after the verdict, from an audit.Findings or from the lines --json
    gives (what a caller of the command has)."""
    summary = dict(
        BASE,
        nodes=2,
        restarts=0,
        events=10,
        malformed_records=0,
        unknown_events=0,
        first_time="t0",
        last_time="t1",
        sessions=1,
        links=1,
        resumes=0,
        fresh_starts=0,
        expired_sessions=0,
        rejected_sessions=0,
        restarted_sessions=0,
        dial_attempts=0,
        failed_dials=0,
        recovery_p50_seconds=None,
        recovery_max_seconds=None,
        in_doubt=0,
        protocol_errors=0,
        refused_connections=0,
        gave_up_dials=0,
        loop_stalls=0,
        reactor_errors=0,
        rtt_p50_seconds=None,
        rtt_p99_seconds=None,
        rtt_source=None,
        lost=1,
    )
    found = Findings(
        **{
            **NONE.__dict__,
            "problems": [
                {"sender": A, "receiver": B, "session_id": "s1", "channel_id": 0x20, "lost": 1, "duplicated": 0}
            ],
            "problem_rows": 1,
        }
    )
    table = summary_table(summary, None, "out", found).splitlines()
    assert table[table.index("PROBLEM: 1 lost (see delivery_audit)") + 1] == (
        f"  1 lost: sender {A} receiver {B} session s1 channel 0x20"
    )
    assert summary_table(summary, None, "out", finding_lines(found)) == "\n".join(table)


def test_the_findings_name_nodes_by_moniker_and_channels_by_name():
    """With the names the run collected, a problem row, a clock skew and sessions seen without their start name
    a node ``moniker (abcd1234)`` and a channel ``0x20 votes``; a node without a moniker keeps its whole id."""
    found = Findings(
        **{
            **NONE.__dict__,
            "problems": [
                {"sender": A, "receiver": B, "session_id": "s1", "channel_id": 0x20, "lost": 1, "duplicated": 0}
            ],
            "problem_rows": 1,
            "skews": [("s2", A, C, -5.0)],
            "skewed_sessions": 1,
            "unstarted": {A: 2},
            "node_names": {A: "alpha", C: "gamma"},
            "channel_names": {0x20: "votes"},
        }
    )
    lines = finding_lines(found)
    assert lines[0] == f"  1 lost: sender alpha ({A[:8]}) receiver {B} session s1 channel 0x20 votes"
    assert f"warning: clock skew: session s2: gamma ({C[:8]}) logged its start 5.00 s after alpha ({A[:8]})" in lines
    assert any(line.startswith(f"warning: node alpha ({A[:8]}): 2 sessions seen without their start") for line in lines)


def test_the_errors_row_books_link_failures_apart():
    """The errors row says protocol errors are peer misbehaviour and link failures are not errors."""
    summary = dict(
        BASE,
        nodes=2,
        restarts=0,
        events=10,
        malformed_records=0,
        unknown_events=0,
        first_time="t0",
        last_time="t1",
        sessions=1,
        links=1,
        resumes=0,
        fresh_starts=0,
        expired_sessions=0,
        rejected_sessions=0,
        restarted_sessions=0,
        dial_attempts=0,
        failed_dials=0,
        recovery_p50_seconds=None,
        recovery_max_seconds=None,
        rtt_p50_seconds=None,
        rtt_p99_seconds=None,
        rtt_source=None,
        protocol_errors=0,
        link_failures=8,
        refused_connections=1,
        gave_up_dials=2,
        loop_stalls=3,
        reactor_errors=4,
    )
    errors = next(value for label, value in headline_rows(summary) if label == "errors")
    assert errors == (
        "protocol 0 (peer misbehaviour), link failures 8 (timeouts, resets: not errors), refused connections 1, "
        "dials given up 2, loop stalls 3, reactor 4"
    )
