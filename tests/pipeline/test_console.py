"""The console's one-sentence verdict says why the audit is incomplete, not just that it is."""

from mconn.pipeline.headline import verdict

BASE = {"messages_audited": 3647, "lost": 0, "duplicated": 0, "unsettled": 0, "one_sided_rows": 0}


def test_a_clean_audit_has_no_notes():
    """A clean audit's verdict is healthy and states the counts with no notes."""
    assert verdict(BASE) == (True, "exactly-once holds: 3,647 messages audited, 0 lost, 0 duplicated")


def test_unsettled_and_one_sided_rows_say_where_they_come_from():
    """Unsettled messages and one-sided rows keep the verdict healthy, with a note saying where each comes
    from."""
    healthy, text = verdict(dict(BASE, unsettled=66, one_sided_rows=2))
    assert healthy
    assert text.endswith(
        "(66 unsettled: a sender was killed or the logs stop before its session ended; "
        "2 one-sided rows: one end's logs are missing)"
    )


def test_lost_or_duplicated_is_a_problem():
    """Any lost or duplicated message makes the verdict a PROBLEM that names both counts."""
    assert verdict(dict(BASE, lost=1, duplicated=2)) == (
        False, "PROBLEM: 1 lost, 2 duplicated (see delivery_audit)"
    )
