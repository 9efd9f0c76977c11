"""The session lifecycle table (mconn.core.session_table) against specs/resume.md, and its decisions.

Sections 3 and 3.1 of specs/resume.md are parsed and compared, row for row, with
``TRANSITIONS``: state, side, input, next state, the reactor calls and the telemetry the
row's effects cause. Then properties of the table (closed is absorbing, every end names an
error class, a fresh start follows an end, only a re-dial reaches ``connecting``), random
walks through ``step()`` checked against the spec's table, and the pure decisions on a
hello (``decide_hello``) and on a session answer (``check_answer``, ``decide_answer``).
"""

from __future__ import annotations

import itertools
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn import errors
from mconn.errors import LocalProtocolError, PeerRejected, UnexpectedPacket
from mconn.core.session_ref import session_ref
from mconn.core.session_table import (
    TRANSITIONS,
    UNKNOWN_AFTER_RESTART,
    Decision,
    Effect,
    PeerState,
    SessionInput,
    SessionStateError,
    Side,
    Transition,
    Verdict,
    check_answer,
    decide_answer,
    decide_hello,
    simultaneous_why,
    step,
)
from tests.helpers_core import SessionRow, parse_session_table

SPEC_TEXT = (pathlib.Path(__file__).resolve().parents[2] / "specs" / "resume.md").read_text()
#: The two tables: section 3 and section 3.1.
MARKERS = ("session-states", "session-states-more")

S, I = PeerState, SessionInput  # noqa: E741 -- the names mconn/core/session_table.py uses


# -- the spec's tables ---------------------------------------------------------------------


ROWS = [row for marker in MARKERS for row in parse_session_table(SPEC_TEXT, marker)]


def _key(row: SessionRow) -> tuple[PeerState, SessionInput]:
    try:
        return PeerState(row.state), SessionInput(row.input)
    except ValueError as error:
        pytest.fail(f"{row.where}: {error}")


#: (state, input) -> SessionRow; a pair named twice fails test_spec_tables_have_the_keys_of_transitions.
SPEC_TABLE = {_key(row): row for row in ROWS}


def test_spec_tables_have_the_keys_of_transitions():
    """Sections 3 and 3.1 together name every (state, input) pair of TRANSITIONS, no other
    pair, and none twice (across both tables)."""
    seen: dict = {}
    for row in ROWS:
        key = _key(row)
        assert key not in seen, f"{row.where}: ({row.state}, {row.input}) is already {seen[key].where}"
        seen[key] = row
    spec, code = set(seen), set(TRANSITIONS)
    assert spec == code, (
        f"in the spec, not in TRANSITIONS: {sorted((s.value, i.value) for s, i in spec - code)}; "
        f"in TRANSITIONS, not in the spec: {sorted((s.value, i.value) for s, i in code - spec)}"
    )


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.state}-{r.input}" for r in ROWS])
def test_spec_row_equals_its_transition(row):
    """A spec row's side, next state, reactor calls (in order) and telemetry (in order)
    are those of its Transition in TRANSITIONS."""
    key = _key(row)
    assert key in TRANSITIONS, f"{row.where}: ({row.state}, {row.input}) is not in TRANSITIONS"
    transition = TRANSITIONS[key]
    assert row.side == transition.side.value, f"{row.where}: side"
    assert row.next_state == transition.next.value, f"{row.where}: next state"
    assert row.reactor_calls == transition.reactor_calls(), f"{row.where}: reactor calls"
    assert row.telemetry == transition.telemetry(), f"{row.where}: telemetry"


def test_section_3_1_holds_the_rows_of_section_7():
    """The takeover, duplicate, simultaneous-dial, new-session-answered and gave-up inputs
    are all in section 3.1 (the rows of section 7), none in section 3."""
    section_7 = {I.TAKEOVER, I.DUPLICATE_REFUSED, I.DUPLICATE_REPLACED, I.SIMULTANEOUS_DIAL}
    section_7 |= {I.NEW_SESSION_ANSWERED, I.DIAL_GAVE_UP}
    first = {SessionInput(row.input) for row in parse_session_table(SPEC_TEXT, "session-states")}
    more = {SessionInput(row.input) for row in parse_session_table(SPEC_TEXT, "session-states-more")}
    assert first.isdisjoint(section_7), sorted(i.value for i in first & section_7)
    assert section_7 <= more, sorted(i.value for i in section_7 - more)
    assert first | more == set(SessionInput), sorted(i.value for i in set(SessionInput) - first - more)


def test_transition_names_its_calls_and_events_in_the_spec_notation():
    """reactor_calls() and telemetry() follow the effects in order, name END's reason
    class, put a fresh start's add_peer / session_started after them and the dial result
    last; effects without a reactor call or event add none."""
    row = Transition(
        Side.BOTH, S.CLOSED, (Effect.DROP_TRANSPORT, Effect.DETACH, Effect.END), "Boom", fresh=True, dial="connected"
    )
    assert row.reactor_calls() == ("remove_peer(Boom)", "add_peer")
    assert row.telemetry() == ("session_ended", "session_started", "dial_attempt(connected)")
    suspending = (Effect.DETACH, Effect.NOTIFY_SUSPENDED, Effect.START_GRACE, Effect.REDIAL)
    suspend = Transition(Side.BOTH, S.SUSPENDED, suspending)
    assert suspend.reactor_calls() == ("peer_suspended",) and suspend.telemetry() == ("session_suspended",)
    resume = Transition(Side.DIALER, S.CONNECTED, (Effect.RESUME,), dial="connected")
    assert resume.reactor_calls() == ("peer_resumed",)
    assert resume.telemetry() == ("session_resumed", "dial_attempt(connected)")
    quiet = Transition(Side.DIALER, S.CONNECTING)
    assert quiet.reactor_calls() == quiet.telemetry() == ()


# -- properties of the table ----------------------------------------------------------------


def _name(key) -> str:
    return f"({key[0].value}, {key[1].value})"


def test_closed_is_absorbing():
    """Every row from closed stays closed and does nothing: no effects, no fresh start,
    no dial result, no reason."""
    rows = {key: t for key, t in TRANSITIONS.items() if key[0] is S.CLOSED}
    assert rows, "the table has no row from closed"
    for key, transition in rows.items():
        assert transition == Transition(transition.side, S.CLOSED), f"{_name(key)} is not a no-op: {transition}"


def test_a_row_ends_the_session_exactly_when_it_leaves_a_live_state_for_closed():
    """END is in a row's effects iff the row goes from a live state to closed; it is
    there once and last, and names a reason class of mconn.errors (only such rows name one)."""
    for key, transition in TRANSITIONS.items():
        ends = Effect.END in transition.effects
        assert ends == (key[0] is not S.CLOSED and transition.next is S.CLOSED), f"{_name(key)}: END"
        if not ends:
            assert transition.reason == "", f"{_name(key)} names a reason but does not end the session"
            continue
        assert transition.effects.count(Effect.END) == 1 and transition.effects[-1] is Effect.END, _name(key)
        reason = getattr(errors, transition.reason, None)
        assert isinstance(reason, type) and issubclass(reason, errors.MConnError), (
            f"{_name(key)}: remove_peer reason {transition.reason!r} is not an error class of mconn.errors"
        )


def test_a_fresh_session_starts_only_after_the_old_one_ended():
    """Every row that starts a fresh session ends the held one first, with SessionRejected
    (specs/resume.md section 5.2): remove_peer before add_peer, session_ended before
    session_started."""
    fresh = {key: t for key, t in TRANSITIONS.items() if t.fresh}
    assert fresh, "no row starts a fresh session"
    for key, transition in fresh.items():
        assert Effect.END in transition.effects and transition.next is S.CLOSED, _name(key)
        assert transition.reason == "SessionRejected", f"{_name(key)}: {transition.reason}"
        calls, events = transition.reactor_calls(), transition.telemetry()
        assert calls.index("remove_peer(SessionRejected)") < calls.index("add_peer"), _name(key)
        assert events.index("session_ended") < events.index("session_started"), _name(key)


def test_only_a_redial_reaches_connecting_and_only_the_dialer_is_there():
    """The one row into connecting from another state is (suspended, redial connected);
    every row from or into connecting is the dialer's (specs/resume.md section 3)."""
    into = [key for key, t in TRANSITIONS.items() if t.next is S.CONNECTING and key[0] is not S.CONNECTING]
    assert into == [(S.SUSPENDED, I.REDIAL_CONNECTED)], [_name(k) for k in into]
    for key, transition in TRANSITIONS.items():
        if S.CONNECTING in (key[0], transition.next):
            assert transition.side is Side.DIALER, f"{_name(key)} is the {transition.side.value}'s"


def test_resume_rows_end_connected_and_suspend_rows_end_suspended():
    """A row whose effects resume the session goes to connected; one that notifies a
    suspension goes to suspended; and only such rows call peer_resumed / peer_suspended."""
    for key, transition in TRANSITIONS.items():
        if Effect.RESUME in transition.effects:
            assert transition.next is S.CONNECTED, _name(key)
        if Effect.NOTIFY_SUSPENDED in transition.effects:
            assert transition.next is S.SUSPENDED, _name(key)
        if transition.next is S.CONNECTED and key[0] is not S.CONNECTED:
            assert Effect.RESUME in transition.effects, f"{_name(key)} reaches connected without resuming"


def test_every_state_is_reachable_and_every_live_state_can_end():
    """From connected (a Peer is born connected) every state is reachable, and from every
    state closed is reachable: the table has no dead end."""
    graph: dict = {}
    for (state, _), transition in TRANSITIONS.items():
        graph.setdefault(state, set()).add(transition.next)

    def reachable(start):
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert reachable(S.CONNECTED) == set(PeerState)
    for state in PeerState:
        assert S.CLOSED in reachable(state), f"no way from {state.value} to closed"


MISSING = [key for key in itertools.product(PeerState, SessionInput) if key not in TRANSITIONS]


def test_step_returns_the_row_of_a_pair_in_the_table():
    """step(state, input) is the table's Transition for every pair the table has."""
    for (state, input_), transition in TRANSITIONS.items():
        assert step(state, input_) is transition


@pytest.mark.parametrize("state, input_", MISSING, ids=[f"{s.value}-{i.value}" for s, i in MISSING])
def test_step_on_a_missing_pair_is_a_local_protocol_error(state, input_):
    """A pair missing from the table raises SessionStateError, a LocalProtocolError (a bug
    in mconn), whose message names the input and the state and which keeps both."""
    with pytest.raises(SessionStateError) as raised:
        step(state, input_)
    error = raised.value
    assert isinstance(error, LocalProtocolError)
    assert str(error) == f"session input {input_.value!r} is not allowed while the session is {state.value}"
    assert (error.state, error.input) == (state, input_)


def test_some_pairs_are_missing():
    """The table is not total: a closed session takes no break, a connected one no resume
    answer (so the parametrized test above checks real refusals)."""
    assert (S.CLOSED, I.BREAK) in MISSING and (S.CONNECTED, I.RESUME_ACCEPTED) in MISSING
    assert (S.CONNECTING, I.REDIAL_CONNECTED) in MISSING and (S.SUSPENDED, I.BREAK) in MISSING


# -- random walks -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(start=st.sampled_from(PeerState), inputs=st.lists(st.sampled_from(SessionInput), max_size=40))
def test_random_inputs_follow_the_spec_table(start, inputs):
    """Driving step() with any inputs from any state: a pair the spec's tables have moves to
    the spec's next state; any other raises SessionStateError and leaves the state alone.
    Along the way: once closed, always closed; a resume ends connected; a suspension
    notice ends suspended."""
    state = start  # the model: the spec's tables
    for input_ in inputs:
        row = SPEC_TABLE.get((state, input_))
        if row is None:
            with pytest.raises(SessionStateError):
                step(state, input_)
            continue  # the state is unchanged
        transition = step(state, input_)
        assert transition.next.value == row.next_state, row.where
        if Effect.RESUME in transition.effects:
            assert transition.next is S.CONNECTED
        if Effect.NOTIFY_SUSPENDED in transition.effects:
            assert transition.next is S.SUSPENDED
        if state is S.CLOSED:
            assert transition.next is S.CLOSED and transition.effects == ()
        state = transition.next


# -- PeerState --------------------------------------------------------------------------------


def test_peer_state_compares_equal_to_its_string_value():
    """Reactor authors may compare ``peer.state`` with a string: each PeerState equals its
    value, str() and formatting give the value, and it hashes like the string."""
    for state in PeerState:
        assert state == state.value and str(state) == state.value and f"{state}" == state.value
        assert {state.value: 1}[state] == 1
    assert [s.value for s in PeerState] == ["connected", "suspended", "connecting", "closed"]
    assert PeerState("closed") is S.CLOSED and S.CONNECTED != "closed"


# -- decide_hello ----------------------------------------------------------------------------

CHANGE = "channels changed: 0x21 prio 1 removed, 0x21 prio 2 added"
HELD = [S.CONNECTED, S.SUSPENDED, S.CONNECTING]


def hello(held, *, asks_resume=False, proves=False, channel_change="", simultaneous=False) -> Verdict:
    return decide_hello(
        held, asks_resume=asks_resume, proves=proves, channel_change=channel_change, simultaneous=simultaneous
    )


def test_hello_without_a_held_session_starts_a_plain_fresh_one():
    """No session held, a new-session hello, no simultaneous dial: a fresh session with no
    reason and nothing to end."""
    assert hello(None) == Verdict(Decision.FRESH, None, "")


def test_hello_asking_to_resume_an_unknown_session_starts_fresh_with_the_restart_reason():
    """No session held and the hello asks to resume: fresh, nothing to end, reason
    "unknown session (expired, or this node restarted)" (section 5.2); a resume request is
    never treated as a simultaneous dial."""
    expected = Verdict(Decision.FRESH, None, "unknown session (expired, or this node restarted)")
    assert UNKNOWN_AFTER_RESTART == expected.reason
    assert hello(None, asks_resume=True) == expected
    assert hello(None, asks_resume=True, simultaneous=True) == expected


def test_hello_losing_a_simultaneous_dial_is_refused():
    """No session held, a new-session hello, and our own dial to that node wins: SIMULTANEOUS."""
    assert hello(None, simultaneous=True) == Verdict(Decision.SIMULTANEOUS)


@pytest.mark.parametrize("held", HELD, ids=[h.value for h in HELD])
def test_hello_proving_the_held_session_resumes_it(held):
    """A resume request that proves the held session, channels unchanged, resumes it in
    every held state (a takeover if it is still connected, section 7.2)."""
    assert hello(held, asks_resume=True, proves=True) == Verdict(Decision.RESUME)
    assert hello(held, asks_resume=True, proves=True, simultaneous=True) == Verdict(Decision.RESUME)


@pytest.mark.parametrize("held", HELD, ids=[h.value for h in HELD])
def test_hello_proving_the_session_with_other_channels_starts_fresh(held):
    """A resume request that proves the held session but changes channels: the held
    session ends with ``resume refused: channels changed`` and the change text is the
    fresh session's reason."""
    assert hello(held, asks_resume=True, proves=True, channel_change=CHANGE) == Verdict(
        Decision.FRESH, I.CHANNELS_CHANGED, CHANGE
    )


@pytest.mark.parametrize("asks_resume", [False, True], ids=["new", "resume-other-id"])
def test_hello_for_a_connected_session_that_does_not_prove_it_probes(asks_resume):
    """A held connected session and a hello that does not prove it (a new-session hello,
    or a resume of another id): PROBE the live connection (section 7.2), whatever the
    simultaneous flag says."""
    assert hello(S.CONNECTED, asks_resume=asks_resume) == Verdict(Decision.PROBE)
    assert hello(S.CONNECTED, asks_resume=asks_resume, simultaneous=True) == Verdict(Decision.PROBE)
    assert hello(S.CONNECTED, asks_resume=asks_resume, channel_change=CHANGE) == Verdict(Decision.PROBE)


@pytest.mark.parametrize("held", [S.SUSPENDED, S.CONNECTING], ids=["suspended", "connecting"])
def test_hello_resuming_another_id_ends_a_waiting_session(held):
    """A held suspended or connecting session and a resume request for another id: fresh,
    ending it with ``resume refused: unknown session``, reason "unknown session"."""
    expected = Verdict(Decision.FRESH, I.UNKNOWN_SESSION, "unknown session")
    assert hello(held, asks_resume=True) == expected
    assert hello(held, asks_resume=True, simultaneous=True) == expected


@pytest.mark.parametrize("held", [S.SUSPENDED, S.CONNECTING], ids=["suspended", "connecting"])
def test_hello_asking_a_new_session_ends_a_waiting_session(held):
    """A held suspended or connecting session and a new-session hello (the dialer
    restarted): fresh, ending it with ``new session request``, reason "new session"."""
    assert hello(held) == Verdict(Decision.FRESH, I.NEW_SESSION_REQUEST, "new session")
    assert hello(held, simultaneous=True) == Verdict(Decision.FRESH, I.NEW_SESSION_REQUEST, "new session")


GRID = list(itertools.product([None, *HELD], [False, True], [False, True], ["", CHANGE], [False, True]))


@pytest.mark.parametrize("held, asks_resume, proves, change, simultaneous", GRID)
def test_every_hello_verdict_is_a_row_of_the_table(held, asks_resume, proves, change, simultaneous):
    """Whatever decide_hello answers, the session manager can apply it: an ``ends`` input is
    a fresh-start row from the held state; RESUME has a resume-accepted row (after a
    takeover if connected); only a held connected session is probed; nothing is ended
    when no session is held."""
    verdict = hello(held, asks_resume=asks_resume, proves=proves, channel_change=change, simultaneous=simultaneous)
    if held is None:
        assert verdict.ends is None and verdict.decision in (Decision.FRESH, Decision.SIMULTANEOUS)
    if verdict.ends is not None:
        assert verdict.decision is Decision.FRESH and verdict.reason
        assert step(held, verdict.ends).fresh
    if verdict.decision is Decision.RESUME:
        state = step(held, I.TAKEOVER).next if held is S.CONNECTED else held
        assert step(state, I.RESUME_ACCEPTED).next is S.CONNECTED
    if verdict.decision is Decision.PROBE:
        assert held is S.CONNECTED
        assert step(held, I.DUPLICATE_REFUSED).next is S.CONNECTED and step(held, I.DUPLICATE_REPLACED).fresh


# -- check_answer ------------------------------------------------------------------------------

ASKED, OTHER = b"\xaa" * 16, b"\xbb" * 16


def answer(*, asked=ASKED, asked_resume=False, answered=ASKED, resumed=False, resumable=False) -> None:
    check_answer(asked=asked, asked_resume=asked_resume, answered=answered, resumed=resumed, resumable=resumable)


def test_answer_naming_another_session_to_a_new_session_request_is_refused():
    """A fresh answer to a new-session request must name the requested id: otherwise
    UnexpectedPacket "session answer names session X, we asked for Y" (section 2.2)."""
    with pytest.raises(UnexpectedPacket) as raised:
        answer(answered=OTHER)
    assert str(raised.value) == f"session answer names session {session_ref(OTHER)}, we asked for {session_ref(ASKED)}"


def test_resumed_answer_naming_another_session_is_refused():
    """A resumed answer must name the session we asked to resume: otherwise the same
    "session answer names session X, we asked for Y"."""
    with pytest.raises(UnexpectedPacket) as raised:
        answer(asked_resume=True, answered=OTHER, resumed=True, resumable=True)
    assert str(raised.value) == f"session answer names session {session_ref(OTHER)}, we asked for {session_ref(ASKED)}"


@pytest.mark.parametrize(
    "asked_resume, resumable",
    [(False, False), (False, True), (True, False)],
    ids=["not-asked", "not-asked-held", "ended"],
)
def test_resumed_answer_we_did_not_ask_for_is_refused(asked_resume, resumable):
    """``resumed 01`` when we asked for a new session, or when the session we asked to
    resume has ended meanwhile: "the peer resumed a session we did not ask to resume"."""
    with pytest.raises(UnexpectedPacket) as raised:
        answer(asked_resume=asked_resume, resumed=True, resumable=resumable)
    assert str(raised.value) == "the peer resumed a session we did not ask to resume"


def test_answers_the_dialer_accepts():
    """Accepted: a fresh answer naming the requested id; a resumed answer naming the held
    session we asked to resume; a fresh answer to a resume request, under a new id or the
    same one (the new session's id, section 2.2)."""
    answer()
    answer(asked_resume=True, resumed=True, resumable=True)
    answer(asked_resume=True, answered=OTHER)
    answer(asked_resume=True, answered=OTHER, resumable=True)
    answer(asked_resume=True, resumable=True)


# -- decide_answer ------------------------------------------------------------------------------

SMALL, LARGE = "1" * 40, "f" * 40


def test_fresh_answer_without_a_held_session_starts_fresh():
    """No other session with that node: a plain fresh session, nothing to end."""
    assert decide_answer(None, held_outbound=False, their_id=LARGE, our_id=SMALL) == Verdict(Decision.FRESH)
    assert decide_answer(None, held_outbound=True, their_id=SMALL, our_id=LARGE) == Verdict(Decision.FRESH)


def test_fresh_answer_while_our_own_dial_is_connected_is_a_duplicate():
    """A connected session over a connection we dialed: PeerRejected with reason
    "duplicate", naming the node."""
    with pytest.raises(PeerRejected) as raised:
        decide_answer(S.CONNECTED, held_outbound=True, their_id=LARGE, our_id=SMALL)
    assert raised.value.reason == "duplicate"
    assert str(raised.value) == f"node {LARGE} is already connected"


def test_fresh_answer_while_connected_inbound_keeps_the_smaller_ids_connection():
    """A connected session over their dial (both listeners accepted, section 7.3): if
    their id is smaller their connection wins (SIMULTANEOUS: refuse ours); if larger, ours
    wins and the held session ends with ``simultaneous dial``."""
    assert decide_answer(S.CONNECTED, held_outbound=False, their_id=SMALL, our_id=LARGE) == Verdict(
        Decision.SIMULTANEOUS
    )
    larger = decide_answer(S.CONNECTED, held_outbound=False, their_id=LARGE, our_id=SMALL)
    assert larger == Verdict(Decision.FRESH, I.SIMULTANEOUS_DIAL)
    assert step(S.CONNECTED, larger.ends).fresh


@pytest.mark.parametrize("held", [S.SUSPENDED, S.CONNECTING], ids=["suspended", "connecting"])
@pytest.mark.parametrize("outbound", [False, True], ids=["inbound", "outbound"])
def test_fresh_answer_replaces_a_waiting_session(held, outbound):
    """A suspended or connecting session with that node: fresh, ending it with ``new
    session answered`` and reason "a new session replaced it" (a row of section 3.1)."""
    for their_id, our_id in ((SMALL, LARGE), (LARGE, SMALL)):
        verdict = decide_answer(held, held_outbound=outbound, their_id=their_id, our_id=our_id)
        assert verdict == Verdict(Decision.FRESH, I.NEW_SESSION_ANSWERED, "a new session replaced it")
        assert step(held, verdict.ends).fresh


def test_simultaneous_why_names_the_node_and_the_winner_alike_on_both_sides():
    """The refusal text names the other node and the smaller node id as the winner, the
    same winner whichever side writes it."""
    assert simultaneous_why(LARGE, SMALL) == (
        f"node {LARGE} and this node dialed each other; "
        f"both keep the connection dialed by the smaller node id ({SMALL})"
    )
    assert simultaneous_why(SMALL, LARGE).endswith(f"({SMALL})")
    assert simultaneous_why(SMALL, LARGE).startswith(f"node {SMALL} ")
