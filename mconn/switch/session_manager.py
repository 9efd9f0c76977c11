"""Sessions: the peer table and every session's lifecycle (specs/resume.md).

Theory of operation. A session is the link between two node ids; its ``Peer`` outlives
the connections beneath it. The ``SessionManager`` holds one Peer per node id and is the
only code that changes a Peer's state: every change is an input to the table of
``mconn.core.session_table``, and ``apply`` looks the (state, input) pair up, sets the next
state and runs the row's effects in order (detach, notify, grace timer, re-dial, resume,
end). A row that starts a fresh session is given the start as ``then``. The telemetry
events of those steps are written by ``mconn.switch.session_telemetry``.

Where the inputs come from: a hello on a listening connection (``hello_authorized``:
``decide_hello`` says resume, after a takeover if the old connection is live; probe it,
``mconn.switch.duplicates``; refuse; or start fresh, ending a held session first); the answer on
a dialing connection (``session_answered``); a connection lost (a break suspends,
anything else ends); timers and the re-dialer; ``Peer.close`` and the Switch stopping.
Limits and evictions are ``mconn.switch.session_limits``'.

The re-dialing itself is ``mconn.switch.persistent.PersistentDialing``'s; this module tells it
when a session needs re-dialing, when its waiting is over, and when a session started.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from twisted.logger import Logger

from mconn.switch import session_telemetry
from mconn.errors import (
    AckError,
    ConnectionClosed,
    LocalProtocolError,
    MConnError,
    PeerClosed,
    PeerRejected,
    SessionExpired,
    SessionRejected,
    StoreError,
    UnexpectedPacket,
)
from mconn.switch.peer import Peer
from mconn.switch.channel_shape import ChannelShape
from mconn.core.session import Budget, Session
from mconn.switch.duplicates import DuplicateProbes
from mconn.switch.node_counters import NodeCounters
from mconn.switch.session_limits import SessionLimits
from mconn.core.session_table import (
    Decision,
    Effect,
    PeerState,
    SessionInput,
    channel_change,
    check_answer,
    decide_answer,
    decide_hello,
    input_for_loss,
    session_request_of,
    simultaneous_why,
    step,
)
from mconn.core.wire import SESSION_ID_BYTES, SessionAnswer, SessionRequest

log = Logger(namespace="mconn.session_store")
S, I = PeerState, SessionInput  # noqa: E741 -- the names mconn/core/session_table.py's table uses

#: The close code and PeerRejected reason of the connection that loses a simultaneous dial.
SIMULTANEOUS_DIAL = "simultaneous_dial"
#: Close codes that end a session a resume attempt was made for (the other node is
#: stopping or closed the session on purpose); any other close just fails the attempt.
ENDS_SESSION = frozenset({"shutdown", "closed"})


@dataclasses.dataclass
class _Step:
    """What one input brings to its row's effects."""

    reason: Exception | None = None
    why: str = ""  # why a live transport is dropped
    stop_dialer: bool = True
    protocol: Any = None  # the new transport of a resume (an MConnectionProtocol)
    resend: dict[int, list[bytes]] | None = None
    answer: bool = False  # a resume the listener answers
    dropped: Exception | None = None  # set by DROP_TRANSPORT


class SessionManager:
    """The sessions of one Switch.

    :param channels: the node's ChannelDescriptors (every session covers them).
    :param admission: the Switch's ``Admission`` (peer limits per direction).
    :param dialing: the Switch's ``PersistentDialing``.
    :param reactors: the Switch's ``mconn.switch.routing.ReactorSet``: its ``notify``
        tells every reactor about a session (add_peer, remove_peer, ...), its ``route``
        hands each message a Peer receives to the reactor owning its channel.
    :param dialing_to: ``dialing_to(node_id)``: an outbound connection of ours to that
        node is still handshaking (a simultaneous dial).
    """

    def __init__(self, *, node_id, clock, config, channels, admission, dialing, reactors, dialing_to) -> None:
        self.node_id = node_id
        self.clock = clock
        #: Unacknowledged bytes of all sessions (``Config.max_unacked_bytes``; follows ``config``).
        self.budget = Budget(config.max_unacked_bytes)
        self.config = config
        self.channels = channels
        #: What every Peer shares about our channels (mconn.switch.channel_shape).
        self.shape = ChannelShape(channels)
        self._channel_ids = tuple(d.id for d in channels)
        self._admission = admission
        self.reactors = reactors
        self._dialing = dialing
        self._notify = reactors.notify
        self._dialing_to = dialing_to
        #: Sessions by node id (none closed).
        self.peers: dict[str, Peer] = {}
        #: node id -> counters that outlive sessions (PeerStats, status page).
        self.node_counters = NodeCounters()
        self.stopping = False
        self._grace_timers: dict = {}
        #: The session store (``Config.session_store``, opened by the Switch at start), or
        #: None: every session's begin, messages, acks, deliveries and end are written to it.
        self.store: Any = None
        #: Sessions read back from the store and not resumed since, by node id.
        self._restored: dict[str, Peer] = {}
        self._probes = DuplicateProbes(self)
        self._limits = SessionLimits(self, admission)
        self._effects = {
            Effect.DROP_TRANSPORT: self._drop_transport,
            Effect.DETACH: lambda peer, _: peer._detach(),
            Effect.NOTIFY_SUSPENDED: self._notify_suspended,
            Effect.START_GRACE: self._start_grace,
            Effect.REDIAL: self._redial,
            Effect.RESUME: self._resume_effect,
            Effect.END: self._end_effect,
        }

    @property
    def config(self):
        """The Switch's Config. A new one applies to sessions and connections made from
        then on, and at once to the node-wide budget of unacknowledged bytes
        (``max_unacked_bytes``), which every session shares."""
        return self._config

    @config.setter
    def config(self, config) -> None:
        self._config = config
        self.budget.limit = config.max_unacked_bytes

    # -- the table -------------------------------------------------------------------

    def apply(self, peer: Peer, input_: SessionInput, reason=None, *, then=None, **facts) -> None:
        """Move ``peer`` by the table's row for ``input_`` and run the row's effects;
        a row that starts a fresh session runs ``then`` last."""
        transition = step(peer.state, input_)
        if transition.fresh != (then is not None):
            raise LocalProtocolError(f"session input {input_.value!r} in {peer.state.value}: fresh start mismatch")
        peer.state = transition.next
        self._limits.state_changed(peer)
        context = _Step(reason=reason, **facts)
        for effect in transition.effects:
            self._effects[effect](peer, context)
        if then is not None:
            then()

    def _drop_transport(self, peer: Peer, step_: _Step) -> None:
        old = peer.connection
        if old is not None:
            old.carry(None)
            step_.dropped = ConnectionClosed("replaced", step_.why)
            old.abort(step_.dropped)

    def _notify_suspended(self, peer: Peer, step_: _Step) -> None:
        reason = step_.reason if step_.reason is not None else step_.dropped
        # A break or pong timeout gives its reason; a takeover drops the live transport.
        assert reason is not None, "a session suspends for a reason"
        session_telemetry.suspended(self.node_id, peer, reason, self.config.resume_grace)
        self._notify("peer_suspended", peer, peer)

    def _start_grace(self, peer: Peer, _) -> None:
        peer.suspended_at = self.clock.seconds()
        self._grace_timers[peer.node_id] = self.clock.callLater(self.config.resume_grace, self._grace_expired, peer)
        self._limits.bound_suspended()

    def evict(self, peer: Peer, why: str) -> None:
        """End a suspended session to make room: SessionRejected("evicted: ..."), with its
        undelivered counts."""
        self.apply(peer, I.EVICTED, self.rejected(peer, f"evicted: {why}"))

    def _resume_effect(self, peer: Peer, step_: _Step) -> None:
        protocol, resend = step_.protocol, step_.resend
        assert resend is not None, "a resume is applied with what to re-send (_resume)"
        self._stop_waiting(peer, dialer=False)  # a dialer that got here stops by itself
        protocol.carry(peer)
        self._limits.counted(peer, -1)
        peer.ip_key = protocol.ip_key  # the resumed session counts against its new address
        self._limits.counted(peer, 1)
        if step_.answer:
            answer = SessionAnswer(session_id=peer.session.id, resumed=True, delivered=peer.session.delivered_counts())
            if self.store is None:
                protocol.core.send_session_answer(answer)
            else:  # its counts on disk first (specs/resume.md 9.3); what follows waits for later commits
                self.store.durable().addCallback(self._answer_stored, protocol, answer)
        peer._attach(protocol, resend)
        peer.resumes += 1
        session_telemetry.resumed(self.node_id, peer, protocol, resend)
        self._notify("peer_resumed", peer, peer)
        protocol.pump()
        self._handshake_done(protocol, peer)
        self._dialing.session_up(peer)

    def _answer_stored(self, _, protocol, answer: SessionAnswer) -> None:
        """The resume's counts are committed: the answer goes out, if the connection is
        still there (the peer's acks, re-sent messages and new ones wait for later
        commits, so they follow it)."""
        if protocol.end_reason is None:
            protocol.core.send_session_answer(answer)
            protocol.pump()

    def _redial(self, peer: Peer, _) -> None:
        """The side that dialed re-dials a suspended session. With a store, once the
        delivered counts its resume request will carry (they stopped at the break) are
        committed, so a restart never resumes below counts the peer was told (9.3)."""
        if peer.address is None:
            return
        if self.store is None:
            self._dialing.redial(peer)
            return
        self.store.durable().addCallback(lambda _: self._dialing.redial(peer) if peer.state is S.SUSPENDED else None)

    def _end_effect(self, peer: Peer, step_: _Step) -> None:
        reason = step_.reason
        # Every row that ends a session is given an MConnError (the table names which):
        # its unconfirmed counts are recorded on it.
        assert isinstance(reason, MConnError), f"a session ends for an MConnError, not {reason!r}"
        self._stop_waiting(peer, dialer=step_.stop_dialer)
        if not reason.unconfirmed:
            reason.unconfirmed = peer.session.unconfirmed()
        peer.session.release()
        self._forget_stored(peer)
        if isinstance(reason, SessionRejected):
            self.count(peer.node_id, "resume_rejections")
        protocol = peer.connection
        if protocol is not None:
            protocol.carry(None)
        peer._end(reason)
        if self.peers.get(peer.node_id) is peer:
            del self.peers[peer.node_id]
            self._limits.counted(peer, -1)
        session_telemetry.ended(self.node_id, peer, reason)
        self._notify("remove_peer", peer, peer, reason)
        if not self.stopping:
            self._dialing.session_ended(peer.node_id)  # a persistent peer gets a fresh session

    def _forget_stored(self, peer: Peer) -> None:
        """The session ended: the store forgets it. Not a dormant session the node is
        stopping with (no close packet went out for it): the peer holds it too, and the
        node started again with the same store resumes it (specs/resume.md section 9)."""
        if self._restored.get(peer.node_id) is peer:
            del self._restored[peer.node_id]
        if self.store is not None and not (self.stopping and peer.connection is None):
            self._record("end", peer.session.id)

    def _record(self, what: str, *args) -> None:
        """A session's begin or end, written to the store. A store that failed (a full
        disk, an I/O error: specs/resume.md section 8.2) is logged; the session's start
        or end goes on in memory, which is all a node without a store has."""
        try:
            getattr(self.store, what)(*args)
        except StoreError as error:
            log.error(
                "{node_id} session store: {what} not recorded: {error}", node_id=self.node_id, what=what, error=error
            )

    def rejected(self, peer: Peer, why: str) -> SessionRejected:
        """The reason a session ends with when a newer one takes its place."""
        return SessionRejected(why, peer.session.unconfirmed())

    # -- starting and resuming -------------------------------------------------------

    def session_request(self, resuming) -> SessionRequest:
        """The session request of an outbound hello: resume ``resuming`` if it is held."""
        if resuming is not None and resuming.state is not S.CLOSED:
            session = resuming.session
            return SessionRequest(session_id=session.id, resume=True, delivered=session.delivered_counts())
        return SessionRequest(session_id=os.urandom(SESSION_ID_BYTES), resume=False)

    def connection_made(self, protocol) -> None:
        resuming = protocol.context.resuming
        if resuming is not None and resuming.state is S.SUSPENDED:
            self.apply(resuming, I.REDIAL_CONNECTED)

    def accept(self, protocol, hello, request, refusal: str, *, proven: bool = False) -> None:
        """The listener starts a fresh session on ``protocol`` and answers it."""
        self._check_limits(protocol)
        if request is None or request.resume:  # a refused resume starts under a new id
            session_id = os.urandom(SESSION_ID_BYTES)
        else:
            session_id = request.session_id
        protocol.core.send_fresh_session_answer(session_id, refusal)
        self._start(protocol, hello, session_id, refusal, proven=proven)

    def _check_limits(self, protocol) -> None:
        self._limits.check(protocol)

    def _start(self, protocol, hello, session_id: bytes, refusal: str, *, proven: bool) -> Peer:
        config = self.config
        session = Session(
            session_id,
            self._channel_ids,
            recovery_buffer_bytes=config.recovery_buffer_bytes,
            ack_every_messages=config.ack_every_messages,
            ack_every_bytes=config.ack_every_bytes,
            budget=self.budget,
        )
        context = protocol.context
        peer = Peer(
            sessions=self,
            protocol=protocol,
            hello=hello,
            session=session,
            is_outbound=context.is_outbound,
            address=context.address,
        )
        peer.proven = proven
        peer.ip_key = protocol.ip_key
        self.peers[peer.node_id] = peer
        self._limits.counted(peer, 1)
        if self.store is not None:
            self._record("begin", session_id, peer.node_id, peer.is_outbound, self._channel_ids)
        protocol.carry(peer)
        session_telemetry.started(self.node_id, peer, protocol, refusal)
        self._notify("add_peer", peer, peer)
        self._handshake_done(protocol, peer)
        self._dialing.session_up(peer)
        return peer

    def _handshake_done(self, protocol, peer: Peer) -> None:
        """``protocol``'s handshake ended with ``peer``'s session: it is pending no more
        (``Admission``) and its ``handshake`` Deferred fires."""
        self._admission.handshake_over(protocol)
        protocol.end_handshake(peer)

    def _resume(self, protocol, peer: Peer, peer_delivered: dict, *, answer: bool, proven: bool = False) -> None:
        """Resume ``peer`` on ``protocol``; a newcomer that proves the session takes over
        the live transport at once. Impossible counts end the session (AckError)."""
        if peer.state is S.CONNECTED:
            self.apply(peer, I.TAKEOVER, why="the session moved to a new connection")
        if self._restored.pop(peer.node_id, None) is peer:
            self._resume_restored(protocol, peer, proven)
        try:
            resend = peer.session.to_resend(peer_delivered)
        except AckError as error:
            self.apply(peer, I.IMPOSSIBLE_COUNTS, error)
            raise
        if self.store is not None:  # the peer's counts acknowledged what they cover
            session = peer.session
            for channel_id in peer_delivered.keys() & session.channel_ids:
                self.store.acked(session.id, channel_id, session.acked(channel_id))
        self.apply(peer, I.RESUME_ACCEPTED, protocol=protocol, resend=resend, answer=answer)

    def _resume_restored(self, protocol, peer: Peer, proven: bool) -> None:
        """The first resume of a session read back from the store: the Peer learns the
        node's hello, proof and address from the connection (specs/resume.md 9.2)."""
        peer.adopt_hello(protocol.hello)
        peer.proven = proven
        if peer.address is None:
            peer.address = protocol.context.address

    def restore(self, stored, committed) -> list[Peer]:
        """Read back the sessions of the store, each as a suspended session whose transport
        just broke (specs/resume.md section 9.2): grace timer from now, its unacknowledged
        messages in the recovery buffer, its delivered counts the larger of the store's and
        the reactors' (``committed(peer_id, session_id)``: the counts they committed with
        their effect, or None). Reactors get ``add_peer``. Returns the Peers."""
        restored = []
        for record in stored:
            if set(record.channel_ids) != set(self._channel_ids) or record.peer_id in self.peers:
                # Our channels changed since: the peer would refuse the resume anyway.
                self.store.end(record.session_id)
                continue
            peer = self._restore_one(record, committed(record.peer_id, record.session_id) or {})
            restored.append(peer)
        return restored

    def _restore_one(self, record, reactor_counts: dict) -> Peer:
        config = self.config
        session = Session(
            record.session_id,
            self._channel_ids,
            recovery_buffer_bytes=config.recovery_buffer_bytes,
            ack_every_messages=config.ack_every_messages,
            ack_every_bytes=config.ack_every_bytes,
            budget=self.budget,
        )
        for channel_id in self._channel_ids:
            stream = record.streams.get(channel_id)
            stored = stream.delivered if stream is not None else 0
            delivered = max(stored, reactor_counts.get(channel_id, 0))
            if stream is not None or delivered:
                acked, unacked = (stream.acked, stream.unacked) if stream is not None else (0, ())
                session.restore_stream(channel_id, acked=acked, unacked=unacked, delivered=delivered)
            if delivered > stored:
                self.store.delivered(record.session_id, channel_id, delivered)
        peer = Peer.restored(sessions=self, node_id=record.peer_id, session=session, is_outbound=record.outbound)
        self.peers[peer.node_id] = peer
        self._restored[peer.node_id] = peer
        self._limits.counted(peer, 1)
        self._limits.state_changed(peer)
        self._notify("add_peer", peer, peer)  # before the grace's limits may evict it
        self._start_grace(peer, None)
        return peer

    # -- a hello on a listening connection -----------------------------------------------

    def hello_authorized(self, protocol, hello, *, proven: bool = False) -> None:
        """The peer may join: the listener decides the session now; the dialer waits for
        the answer (specs/resume.md sections 4 and 7).

        :param proven: the hello's node id is proven by a certificate.
        :raises PeerRejected: a simultaneous dial this connection loses, a connection
            whose id is not proven claiming a session that was (``unproven``), or a limit.
        """
        if protocol.context.is_outbound:
            return
        existing = self.peers.get(hello.node_id)
        if existing is not None and existing.proven and not proven:
            raise PeerRejected(
                "unproven",
                f"node {hello.node_id} has a session here whose id its certificate proved; this connection "
                f"presented no certificate, so it may not resume, probe for or replace that session",
            )
        request = session_request_of(hello)
        asks_resume = request is not None and request.resume
        proves = (
            existing is not None
            and request is not None
            and request.resume
            and existing.session.proves(request.session_id)
        )
        simultaneous = (
            existing is None and not asks_resume and self.node_id < hello.node_id and self._dialing_to(hello.node_id)
        )
        verdict = decide_hello(
            existing.state if existing is not None else None,
            asks_resume=asks_resume,
            proves=proves,
            # A restored session does not know the channels the node announced at its start.
            channel_change=(
                channel_change(existing, hello) if proves and self._restored.get(hello.node_id) is not existing else ""
            ),
            simultaneous=simultaneous,
            proven=proven,
        )
        # Only a held session is refused for, resumed, probed or ended (decide_hello).
        if verdict.decision is Decision.REFUSE:
            assert existing is not None and verdict.ends is not None
            self.apply(existing, verdict.ends)
            raise PeerRejected(
                verdict.reason,
                f"node {hello.node_id} has a {existing.state} session here, held for resume_grace "
                f"{self.config.resume_grace}s; a connection that proves neither that session nor the node's "
                f"key cannot end it (resume it with its session id, or start a new one once it has ended)",
            )
        if verdict.decision is Decision.RESUME:
            assert existing is not None and request is not None
            self._resume(protocol, existing, request.delivered, answer=True, proven=proven)
        elif verdict.decision is Decision.PROBE:
            assert existing is not None
            self._probes.start(protocol, existing, proven=proven)
        elif verdict.decision is Decision.SIMULTANEOUS:
            self.count(hello.node_id, "simultaneous_dials")
            raise PeerRejected(SIMULTANEOUS_DIAL, simultaneous_why(hello.node_id, self.node_id))
        elif verdict.ends is not None:
            assert existing is not None
            self.apply(
                existing,
                verdict.ends,
                self.rejected(existing, verdict.reason),
                why="the session's channels changed",
                then=lambda: self.accept(protocol, hello, request, verdict.reason, proven=proven),
            )
        else:
            self.accept(protocol, hello, request, verdict.reason, proven=proven)

    # -- the answer on a dialing connection --------------------------------------------

    def session_answered(self, protocol, answer: SessionAnswer, *, proven: bool = False) -> None:
        """The listener's answer to our session request (specs/resume.md section 2.2)."""
        request, resuming = protocol.session_request, protocol.context.resuming
        if not protocol.context.is_outbound or protocol.peer is not None or request is None or protocol.hello is None:
            raise UnexpectedPacket("session packet where none was asked for")
        held = resuming is not None and resuming.state is not S.CLOSED
        check_answer(
            asked=request.session_id,
            asked_resume=request.resume,
            answered=answer.session_id,
            resumed=answer.resumed,
            resumable=held,
        )
        if answer.resumed:
            self._resume(protocol, resuming, answer.delivered, answer=False, proven=proven)
        elif held:
            # The dialer goes on: this attempt connected, to a fresh session.
            why = answer.reason or "the peer started a new session"
            self.apply(
                resuming,
                I.RESUME_REFUSED,
                self.rejected(resuming, why),
                stop_dialer=False,
                then=lambda: self._answered_fresh(protocol, answer, proven),
            )
        else:
            self._answered_fresh(protocol, answer, proven)

    def _answered_fresh(self, protocol, answer: SessionAnswer, proven: bool) -> None:
        node_id = protocol.hello.node_id
        existing = self.peers.get(node_id)
        held = existing.state if existing is not None else None
        verdict = decide_answer(
            held, held_outbound=existing is not None and existing.is_outbound, their_id=node_id, our_id=self.node_id
        )

        def start() -> None:
            self._check_limits(protocol)
            self._start(protocol, protocol.hello, answer.session_id, answer.reason, proven=proven)

        if verdict.decision is Decision.SIMULTANEOUS or verdict.ends is I.SIMULTANEOUS_DIAL:
            # Both dialed and each side's listener accepted: keep the connection dialed by
            # the smaller node id, as the other side does.
            self.count(node_id, "simultaneous_dials")
            why = simultaneous_why(node_id, self.node_id)
            if verdict.decision is Decision.SIMULTANEOUS:
                raise PeerRejected(SIMULTANEOUS_DIAL, why)
            assert existing is not None  # the held session is connected (decide_answer)
            old = existing.connection

            def replace() -> None:
                old.close(PeerRejected(SIMULTANEOUS_DIAL, why))
                start()

            ended = self.rejected(existing, "simultaneous dial: " + why)
            self.apply(existing, I.SIMULTANEOUS_DIAL, ended, then=replace)
        elif verdict.ends is not None:
            assert existing is not None  # only a held session is ended (decide_answer)
            self.apply(existing, verdict.ends, self.rejected(existing, verdict.reason), then=start)
        else:
            start()

    # -- breaks, ends, timers ----------------------------------------------------------

    def connection_lost(self, protocol, reason: Exception) -> None:
        """A transport ended: its session suspends or ends; a resume attempt fails or ends."""
        peer = protocol.peer
        resuming = protocol.context.resuming
        if peer is not None and peer.connection is protocol:
            self.apply(peer, self._input_for(reason), reason)
        elif resuming is not None and resuming.state is S.CONNECTING:
            if isinstance(reason, PeerClosed) and reason.code in ENDS_SESSION:
                self.apply(resuming, I.CLOSE_RECEIVED, reason)  # the node is going away: no resume
            else:
                self.apply(resuming, I.BREAK)  # this attempt failed; the dialer tries again

    def forget_probes(self, protocol) -> None:
        """A connection is gone: the probes it waited for, or that probed it, are over."""
        self._probes.connection_lost(protocol)

    def _input_for(self, reason: Exception) -> SessionInput:
        return input_for_loss(reason, stopping=self.stopping, grace=self.config.resume_grace)

    def would_suspend(self, reason: Exception | None) -> bool:
        """Would a connected session whose transport ends for ``reason`` be suspended?"""
        return reason is not None and step(S.CONNECTED, self._input_for(reason)).next is S.SUSPENDED

    def _grace_expired(self, peer: Peer) -> None:
        self._grace_timers.pop(peer.node_id, None)
        self.count(peer.node_id, "grace_expiries")
        self.apply(peer, I.GRACE_EXPIRED, SessionExpired(self.config.resume_grace, peer.session.unconfirmed()))

    def _stop_waiting(self, peer: Peer, *, dialer: bool) -> None:
        timer = self._grace_timers.pop(peer.node_id, None)
        if timer is not None and timer.active():
            timer.cancel()
        self._dialing.session_settled(peer.node_id, stop_dialer=dialer)

    def close(self, peer: Peer, reason: Exception) -> None:
        """``Peer.close``: a close packet if connected (the session ends when the
        transport goes), else the session ends now."""
        if peer.connection is not None:
            peer.connection.close(reason)
        else:
            self.apply(peer, I.PEER_CLOSE, reason)

    def is_persistent(self, node_id: str) -> bool:
        """``Peer.is_persistent``: this node keeps ``node_id`` connected."""
        return self._dialing.is_persistent(node_id)

    def redial_failed(self, node_id: str | None) -> None:
        """A re-dial attempt failed before a transport was up."""
        peer = self.peers.get(node_id) if node_id is not None else None
        if peer is not None and peer.state is S.SUSPENDED:
            self.apply(peer, I.REDIAL_FAILED)

    def gave_up(self, node_id: str | None, why: str) -> None:
        """The re-dialer of ``node_id`` gave up: a session waiting for it ends."""
        peer = self.peers.get(node_id) if node_id is not None else None
        if peer is not None and peer.state in (S.SUSPENDED, S.CONNECTING):
            self.apply(peer, I.DIAL_GAVE_UP, self.rejected(peer, f"gave up re-dialing: {why}"))

    def stop(self) -> None:
        """The Switch stops: sessions without a transport end now (the others end as
        their connections close), and pending probes are dropped."""
        self.stopping = True
        for peer in list(self.peers.values()):
            if peer.connection is None:
                self.apply(peer, I.SWITCH_STOP, ConnectionClosed("shutdown", "the node is stopping"))
        self._probes.cancel_all()

    # -- counters and invariants ---------------------------------------------------------

    def count(self, node_id: str, counter: str) -> None:
        self.node_counters.count(node_id, counter, keep=lambda n: n in self.peers or self._dialing.knows(n))

    def check_invariants(self, connections) -> None:
        """The peer table agrees with the live connections."""
        for node_id, peer in self.peers.items():
            assert peer.node_id == node_id and peer.state is not S.CLOSED, f"peer table corrupt at {node_id}"
            if peer.state is S.CONNECTED:
                protocol = peer.connection
                assert protocol in connections and protocol.peer is peer, f"{node_id}: connected without a connection"
            else:
                assert peer.connection is None, f"{node_id}: {peer.state} but holds a connection"
                assert self.config.resume_grace > 0, f"{node_id}: {peer.state} although resume is off"
        for protocol in connections:
            if protocol.peer is not None:
                assert self.peers.get(protocol.peer.node_id) is protocol.peer, "a connection carries a forgotten Peer"
        self._limits.check_invariants(self.peers.values())
