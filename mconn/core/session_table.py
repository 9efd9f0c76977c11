"""The session lifecycle as data: Peer states, inputs, and the transition table. Pure.

Theory of operation (specs/resume.md sections 3 and 7). A session (a ``Peer``) is in one
of four states. Everything that can happen to it is an input; ``TRANSITIONS`` maps each
(state, input) pair the build handles to the next state and the effects, in the order
``mconn.switch.session_manager.SessionManager`` applies them. A pair missing from the table is a bug
in the caller, never the peer's doing, and raises ``SessionStateError`` (as h2's
connection state machine raises on an unknown (state, input) pair).

The effects are the session manager's operations on the Peer; the reactor calls and the
telemetry a row causes follow from them (``reactor_calls`` and ``telemetry``), and
tests/core/test_session_table.py compares those with the tables in specs/resume.md.

Two pure decision functions sit beside the table: ``decide_hello`` (what a listener does
with a hello from a node it may already hold a session with) and ``decide_answer`` (what
a dialer does with the listener's session answer). They see only states and facts, so
they can be tested without a connection.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from mconn.errors import (
    ConnectionClosed,
    ConnectionLost,
    LocalProtocolError,
    PeerClosed,
    PeerRejected,
    PongTimeout,
    UnexpectedPacket,
)
from mconn.core.handshake import session_field
from mconn.core.session_ref import session_ref
from mconn.core.wire import Hello, SessionRequest, decode_session_request


class PeerState(enum.StrEnum):
    """``peer.state``: compares equal to its string value, for reactor authors."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    CONNECTING = "connecting"
    CLOSED = "closed"


class Side(enum.StrEnum):
    """Which side of a session a row concerns: the one that dialed, that listened, or both."""

    DIALER = "dialer"
    LISTENER = "listener"
    BOTH = "both"


class SessionInput(enum.Enum):
    """Everything that can happen to a session; values are the spec's names."""

    BREAK = "break"
    PONG_TIMEOUT = "pong timeout"
    BREAK_NO_GRACE = "break, resume_grace 0"
    CLOSE_RECEIVED = "close received"
    PEER_CLOSE = "peer.close"
    SWITCH_STOP = "switch stop"
    PROTOCOL_ERROR = "protocol error"
    REDIAL_CONNECTED = "redial connected"
    REDIAL_FAILED = "redial failed"
    RESUME_ACCEPTED = "resume accepted"
    RESUME_REFUSED = "resume refused"
    CHANNELS_CHANGED = "resume refused: channels changed"
    UNKNOWN_SESSION = "resume refused: unknown session"
    NEW_SESSION_REQUEST = "new session request"
    UNPROVEN_UNKNOWN_SESSION = "resume refused: unknown session, unproven"
    UNPROVEN_NEW_SESSION_REQUEST = "new session request, unproven"
    IMPOSSIBLE_COUNTS = "resume with impossible counts"
    GRACE_EXPIRED = "grace expired"
    # Section 7: takeovers, duplicates, simultaneous dial, giving up.
    TAKEOVER = "takeover"
    DUPLICATE_REFUSED = "duplicate refused"
    DUPLICATE_REPLACED = "duplicate replaced"
    SIMULTANEOUS_DIAL = "simultaneous dial"
    NEW_SESSION_ANSWERED = "new session answered"
    DIAL_GAVE_UP = "dial gave up"
    EVICTED = "evicted"


class Effect(enum.Enum):
    """What the session manager does to the Peer, in a row's order."""

    #: Abort the session's live transport without ending the session (it was replaced).
    DROP_TRANSPORT = "drop transport"
    #: The Peer lets go of its transport: a disconnect is counted, sends are held.
    DETACH = "detach"
    #: ``session_suspended``, then ``peer_suspended`` on every reactor.
    NOTIFY_SUSPENDED = "notify suspended"
    #: The grace timer of ``resume_grace`` starts.
    START_GRACE = "start grace"
    #: The side that dialed starts re-dialing.
    REDIAL = "redial"
    #: The Peer takes the new transport; ``session_resumed``, ``peer_resumed``.
    RESUME = "resume"
    #: The session is over: ``session_ended``, ``remove_peer`` with the reason.
    END = "end"


@dataclasses.dataclass(frozen=True)
class Transition:
    """One row: where the input leads and what happens on the way.

    :param reason: the class of the reason ``remove_peer`` gets (rows that END).
    :param fresh: a new session starts on the same transport (``session_started``,
        ``add_peer`` for a new Peer) once this one has ended.
    :param dial: the ``dial_attempt`` result the re-dialer reports for this input.
    """

    side: Side
    next: PeerState
    effects: tuple[Effect, ...] = ()
    reason: str = ""
    fresh: bool = False
    dial: str = ""

    def reactor_calls(self) -> tuple[str, ...]:
        """The reactor calls, in the notation of specs/resume.md's tables."""
        calls = {Effect.NOTIFY_SUSPENDED: "peer_suspended", Effect.RESUME: "peer_resumed"}
        out = [f"remove_peer({self.reason})" if e is Effect.END else calls.get(e) for e in self.effects]
        return tuple(c for c in out if c) + (("add_peer",) if self.fresh else ())

    def telemetry(self) -> tuple[str, ...]:
        """The session events and dial attempts, in the notation of specs/resume.md."""
        names = {
            Effect.NOTIFY_SUSPENDED: "session_suspended",
            Effect.RESUME: "session_resumed",
            Effect.END: "session_ended",
        }
        out = [names[e] for e in self.effects if e in names]
        out += ["session_started"] if self.fresh else []
        out += [f"dial_attempt({self.dial})"] if self.dial else []
        return tuple(out)


class SessionStateError(LocalProtocolError):
    """An input the session table has no row for in the Peer's state (a bug in mconn)."""

    def __init__(self, state: PeerState, input_: SessionInput) -> None:
        super().__init__(f"session input {input_.value!r} is not allowed while the session is {state.value}")
        self.state = state
        self.input = input_


# One letter each keeps a table row on one line.
S, I, E, D, L, B = PeerState, SessionInput, Effect, Side.DIALER, Side.LISTENER, Side.BOTH  # noqa: E741
_SUSPEND = (E.DETACH, E.NOTIFY_SUSPENDED, E.START_GRACE, E.REDIAL)
_REPLACE = (E.DROP_TRANSPORT, E.DETACH, E.END)

#: (state, input) -> Transition. Section 3 of specs/resume.md, then section 7.
TRANSITIONS: dict[tuple[PeerState, SessionInput], Transition] = {
    (S.CONNECTED, I.BREAK): Transition(B, S.SUSPENDED, _SUSPEND),
    (S.CONNECTED, I.PONG_TIMEOUT): Transition(B, S.SUSPENDED, _SUSPEND),
    (S.CONNECTED, I.BREAK_NO_GRACE): Transition(B, S.CLOSED, (E.END,), "ConnectionLost"),
    (S.CONNECTED, I.CLOSE_RECEIVED): Transition(B, S.CLOSED, (E.END,), "PeerClosed"),
    (S.CONNECTED, I.PEER_CLOSE): Transition(B, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.CONNECTED, I.SWITCH_STOP): Transition(B, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.CONNECTED, I.PROTOCOL_ERROR): Transition(B, S.CLOSED, (E.END,), "AckError"),
    (S.SUSPENDED, I.REDIAL_CONNECTED): Transition(D, S.CONNECTING),
    (S.SUSPENDED, I.REDIAL_FAILED): Transition(D, S.SUSPENDED, dial="failed"),
    (S.SUSPENDED, I.RESUME_ACCEPTED): Transition(L, S.CONNECTED, (E.RESUME,)),
    (S.SUSPENDED, I.CHANNELS_CHANGED): Transition(L, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.SUSPENDED, I.UNKNOWN_SESSION): Transition(L, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.SUSPENDED, I.NEW_SESSION_REQUEST): Transition(L, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.SUSPENDED, I.UNPROVEN_UNKNOWN_SESSION): Transition(L, S.SUSPENDED),
    (S.SUSPENDED, I.UNPROVEN_NEW_SESSION_REQUEST): Transition(L, S.SUSPENDED),
    (S.SUSPENDED, I.IMPOSSIBLE_COUNTS): Transition(L, S.CLOSED, (E.END,), "AckError"),
    (S.SUSPENDED, I.GRACE_EXPIRED): Transition(B, S.CLOSED, (E.END,), "SessionExpired"),
    (S.SUSPENDED, I.PEER_CLOSE): Transition(B, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.SUSPENDED, I.SWITCH_STOP): Transition(B, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.CONNECTING, I.RESUME_ACCEPTED): Transition(D, S.CONNECTED, (E.RESUME,), dial="connected"),
    (S.CONNECTING, I.RESUME_REFUSED): Transition(
        D, S.CLOSED, (E.END,), "SessionRejected", fresh=True, dial="connected"
    ),
    (S.CONNECTING, I.BREAK): Transition(D, S.SUSPENDED, dial="failed"),
    (S.CONNECTING, I.CLOSE_RECEIVED): Transition(D, S.CLOSED, (E.END,), "PeerClosed"),
    (S.CONNECTING, I.GRACE_EXPIRED): Transition(D, S.CLOSED, (E.END,), "SessionExpired"),
    (S.CONNECTING, I.PEER_CLOSE): Transition(D, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.CONNECTING, I.SWITCH_STOP): Transition(D, S.CLOSED, (E.END,), "ConnectionClosed"),
    (S.CLOSED, I.PEER_CLOSE): Transition(B, S.CLOSED),
    (S.CLOSED, I.SWITCH_STOP): Transition(B, S.CLOSED),
    # Section 7 (and the dialer's side of impossible resume counts).
    (S.CONNECTING, I.IMPOSSIBLE_COUNTS): Transition(D, S.CLOSED, (E.END,), "AckError"),
    (S.CONNECTING, I.NEW_SESSION_REQUEST): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTING, I.UNPROVEN_NEW_SESSION_REQUEST): Transition(D, S.CONNECTING),
    (S.CONNECTING, I.UNPROVEN_UNKNOWN_SESSION): Transition(D, S.CONNECTING),
    (S.CONNECTING, I.UNKNOWN_SESSION): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTING, I.CHANNELS_CHANGED): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTED, I.TAKEOVER): Transition(L, S.SUSPENDED, (E.DROP_TRANSPORT, E.DETACH, E.NOTIFY_SUSPENDED)),
    (S.CONNECTED, I.CHANNELS_CHANGED): Transition(L, S.CLOSED, _REPLACE, "SessionRejected", fresh=True),
    (S.CONNECTED, I.DUPLICATE_REFUSED): Transition(L, S.CONNECTED),
    (S.CONNECTED, I.DUPLICATE_REPLACED): Transition(L, S.CLOSED, _REPLACE, "SessionRejected", fresh=True),
    (S.SUSPENDED, I.DUPLICATE_REPLACED): Transition(L, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTING, I.DUPLICATE_REPLACED): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTED, I.SIMULTANEOUS_DIAL): Transition(B, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.SUSPENDED, I.NEW_SESSION_ANSWERED): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.CONNECTING, I.NEW_SESSION_ANSWERED): Transition(D, S.CLOSED, (E.END,), "SessionRejected", fresh=True),
    (S.SUSPENDED, I.DIAL_GAVE_UP): Transition(D, S.CLOSED, (E.END,), "SessionRejected"),
    (S.SUSPENDED, I.EVICTED): Transition(B, S.CLOSED, (E.END,), "SessionRejected"),
    (S.CONNECTING, I.DIAL_GAVE_UP): Transition(D, S.CLOSED, (E.END,), "SessionRejected"),
}
del S, I, E, D, L, B


def step(state: PeerState, input_: SessionInput) -> Transition:
    """The row for ``input_`` in ``state``.

    :raises SessionStateError: if the table has none.
    """
    try:
        return TRANSITIONS[(state, input_)]
    except KeyError:
        raise SessionStateError(state, input_) from None


def input_for_loss(reason: Exception, *, stopping: bool, grace: float) -> SessionInput:
    """The input a connected session gets when its transport ends for ``reason``: a break
    that is not a close suspends it (specs/resume.md section 1.4)."""
    if isinstance(reason, (ConnectionLost, PongTimeout)):
        if stopping:
            return SessionInput.SWITCH_STOP
        if grace <= 0:
            return SessionInput.BREAK_NO_GRACE
        return SessionInput.PONG_TIMEOUT if isinstance(reason, PongTimeout) else SessionInput.BREAK
    if isinstance(reason, PeerClosed):
        return SessionInput.CLOSE_RECEIVED
    if isinstance(reason, ConnectionClosed):
        return SessionInput.SWITCH_STOP if reason.code == "shutdown" else SessionInput.PEER_CLOSE
    return SessionInput.PROTOCOL_ERROR


# -- decisions ------------------------------------------------------------------------


class Decision(enum.Enum):
    """What to do with a connection whose hello or session answer just arrived."""

    RESUME = "resume"  # the held session goes on over it
    PROBE = "probe"  # ask the held session's live connection whether it is still there
    FRESH = "fresh"  # a new session starts on it
    SIMULTANEOUS = "simultaneous"  # refuse it: the other connection of a simultaneous dial wins
    REFUSE = "refuse"  # refuse it: it may not end the session held (``ends`` is the held session's input)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A decision, with what the held session gets first and the reason a fresh one names.

    :param ends: the input the held session gets before a fresh one starts (None: no
        session is held, or it is left alone).
    :param reason: ``resume_refused`` of the fresh session (empty for a plain new one).
    """

    decision: Decision
    ends: SessionInput | None = None
    reason: str = ""


#: The verdicts without a reason, built once (a Verdict is frozen): a connect storm asks
#: for FRESH at every hello.
_RESUME, _PROBE, _SIMULTANEOUS, _FRESH = (
    Verdict(Decision.RESUME),
    Verdict(Decision.PROBE),
    Verdict(Decision.SIMULTANEOUS),
    Verdict(Decision.FRESH),
)

UNKNOWN_AFTER_RESTART = "unknown session (expired, or this node restarted)"
#: The close code of a hello refused because it may not end the session held.
SESSION_HELD = "session_held"


def decide_hello(
    held: PeerState | None,
    *,
    asks_resume: bool,
    proves: bool,
    channel_change: str,
    simultaneous: bool,
    proven: bool = True,
) -> Verdict:
    """A listener's decision on a hello (specs/resume.md sections 4, 5.2, 7.2 and 7.3).

    :param held: the state of the session held with the hello's node, or None.
    :param asks_resume: the hello's session request asks to resume.
    :param proves: it names the held session's id.
    :param channel_change: why the hello's channels differ from the held session's ('').
    :param simultaneous: no session is held and our own dial to that node, still
        handshaking, wins the simultaneous dial (our node id is the smaller).
    :param proven: the hello's node id is proven by a certificate. Within its grace, a
        suspended session can be ended only by a connection that proves its session id
        or the node's key: an unproven one is REFUSED and the session is left alone.
    """
    if held is not None:
        if asks_resume and proves:
            if channel_change:
                return Verdict(Decision.FRESH, SessionInput.CHANNELS_CHANGED, channel_change)
            return _RESUME
        if held is PeerState.CONNECTED:
            return _PROBE
        if not proven:
            refused = (
                SessionInput.UNPROVEN_UNKNOWN_SESSION if asks_resume else SessionInput.UNPROVEN_NEW_SESSION_REQUEST
            )
            return Verdict(Decision.REFUSE, refused, SESSION_HELD)
        if asks_resume:
            return Verdict(Decision.FRESH, SessionInput.UNKNOWN_SESSION, "unknown session")
        return Verdict(Decision.FRESH, SessionInput.NEW_SESSION_REQUEST, "new session")
    if asks_resume:
        return Verdict(Decision.FRESH, None, UNKNOWN_AFTER_RESTART)
    if simultaneous:
        return _SIMULTANEOUS
    return _FRESH


def check_answer(*, asked: bytes, asked_resume: bool, answered: bytes, resumed: bool, resumable: bool) -> None:
    """The checks a dialer makes of a session answer (specs/resume.md section 2.2).

    :param resumable: the session this connection asked to resume is still held.
    :raises UnexpectedPacket: naming what is wrong.
    """
    if answered != asked and (resumed or not asked_resume):
        # Named by their references: an error's text reaches logs and telemetry, and a
        # session id is the resume secret (specs/telemetry.md section 2.2).
        raise UnexpectedPacket(
            f"session answer names session {session_ref(answered)}, we asked for {session_ref(asked)}"
        )
    if resumed and not (asked_resume and resumable):
        raise UnexpectedPacket("the peer resumed a session we did not ask to resume")


def decide_answer(held: PeerState | None, *, held_outbound: bool, their_id: str, our_id: str) -> Verdict:
    """A dialer's decision on a fresh session answer, given another session it holds with
    that node (not the one this connection asked to resume, which ends first).

    :returns: FRESH (with ``ends`` for a held session to end first), or SIMULTANEOUS
        when the held session's connection wins.
    :raises PeerRejected: ``duplicate`` when we already dialed that node and are connected.
    """
    if held is None:
        return _FRESH
    if held is PeerState.CONNECTED:
        if held_outbound:
            raise PeerRejected("duplicate", f"node {their_id} is already connected")
        if their_id < our_id:
            return _SIMULTANEOUS
        return Verdict(Decision.FRESH, SessionInput.SIMULTANEOUS_DIAL)
    return Verdict(Decision.FRESH, SessionInput.NEW_SESSION_ANSWERED, "a new session replaced it")


def simultaneous_why(their_id: str, our_id: str) -> str:
    """The text of a simultaneous-dial refusal, alike on both sides."""
    return (
        f"node {their_id} and this node dialed each other; both keep the connection "
        f"dialed by the smaller node id ({min(their_id, our_id)})"
    )


def session_request_of(hello: Hello) -> SessionRequest | None:
    """The dialer's session request from its hello (None if it sent none).

    :raises MalformedPacket: if the field does not parse.
    """
    value = session_field(hello)
    return None if value is None else decode_session_request(value)


def channel_change(peer: Any, hello: Hello) -> str:
    """Why ``hello``'s channels differ from those ``peer``'s session started with ('' if
    they do not): each (channel, priority) pair removed or added, in ascending order."""
    before = {(c.id, c.priority) for c in peer.channels.values()}
    now = {(c.id, c.priority) for c in hello.channels}
    if before == now:
        return ""
    return "channels changed: " + ", ".join(
        f"{c:#04x} prio {p}" + (" added" if (c, p) in now else " removed") for c, p in sorted(before ^ now)
    )
