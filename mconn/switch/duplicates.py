"""Duplicate connections: is a session's live connection still there? (specs/resume.md 7.2)

A newcomer claims a node whose session is connected, without proving the session. NATS
Streaming's rule for a client id already in use decides: a ping goes out on the live
connection, and any bytes back within ``duplicate_probe_timeout`` say it is alive (the
newcomer is refused with ``duplicate``); silence, or the live connection breaking, says
it is gone (it is aborted, the session ends ``replaced``, and the newcomer gets a fresh
session). One probe per session at a time: a second newcomer while it runs is refused. The outcomes are the table rows ``duplicate refused`` and ``duplicate
replaced`` of ``mconn.core.session_table``, applied by the ``SessionManager``.
"""

from __future__ import annotations

from mconn.switch import telemetry
from mconn.core.connection import State
from mconn.errors import PeerRejected
from mconn.core.session_table import PeerState, SessionInput, session_request_of


class DuplicateProbes:
    """The probes of one ``SessionManager``, by newcomer connection."""

    def __init__(self, sessions) -> None:
        self.sessions = sessions
        #: newcomer protocol -> _Probe of the live connection it would replace.
        self.pending: dict = {}

    def start(self, newcomer, peer, *, proven: bool = False) -> None:
        """Probe ``peer``'s live connection on behalf of ``newcomer``.

        At most one probe per session is outstanding: a second newcomer while one is
        under way is refused at once, so that any number of newcomers can never replace
        a connection that keeps answering.

        :raises PeerRejected: ``duplicate``, while another newcomer's probe is pending.
        """
        waiting = next((p for p in self.pending.values() if p.peer is peer), None)
        if waiting is not None:
            raise PeerRejected(
                "duplicate",
                f"node {peer.node_id} is connected ({waiting.old.remote_address}) and a probe of that "
                f"connection for another new connection ({waiting.newcomer.remote_address}) is under way",
            )
        self.pending[newcomer] = _Probe(self, newcomer, peer, proven)

    def connection_lost(self, protocol) -> None:
        """A newcomer gone: its probe is dropped. A probed connection gone: the newcomer
        may have the session."""
        for probe in list(self.pending.values()):
            if probe.newcomer is protocol:
                probe.cancel()
                del self.pending[protocol]
            elif probe.old is protocol:
                probe.finish(alive=False)

    def cancel_all(self) -> None:
        for probe in list(self.pending.values()):
            probe.cancel()

    def done(self, probe: _Probe, alive: bool) -> None:
        """The old connection answered, and the newcomer is refused; or it did not, and
        the newcomer replaces it."""
        self.pending.pop(probe.newcomer, None)
        sessions = self.sessions
        newcomer, peer, old = probe.newcomer, probe.peer, probe.old
        if newcomer.end_reason is not None or newcomer.core.state is not State.OPEN:
            return
        node_id = peer.node_id
        if alive and peer.state is PeerState.CONNECTED and peer.connection is old:
            sessions.apply(peer, SessionInput.DUPLICATE_REFUSED)
            sessions.count(node_id, "duplicates_refused")
            self._event(newcomer, old, "refused")
            rejection = PeerRejected(
                "duplicate",
                f"node {node_id} is already connected ({old.remote_address}, "
                f"{'outbound' if old.context.is_outbound else 'inbound'}) and that connection answered a probe",
            )
            newcomer.owner.peer_rejected(newcomer, newcomer.hello, rejection)
            newcomer.close(rejection)
            return
        sessions.count(node_id, "duplicates_replaced")
        self._event(newcomer, old, "replaced")
        reason = (
            f"replaced: a new connection came from the node and the old one ({old.remote_address}) "
            f"did not answer a probe within {sessions.config.duplicate_probe_timeout}s"
        )

        def accept() -> None:
            newcomer.decide(
                lambda protocol, hello: sessions.accept(
                    protocol, hello, session_request_of(hello), reason, proven=probe.proven
                ),
                newcomer.hello,
            )
            newcomer.pump()

        if peer.state is PeerState.CLOSED:
            accept()
            return
        sessions.apply(
            peer,
            SessionInput.DUPLICATE_REPLACED,
            sessions.rejected(peer, reason),
            why="it did not answer a probe; a new connection replaced it",
            then=accept,
        )

    def _event(self, newcomer, old, outcome: str) -> None:
        telemetry.emit(
            "duplicate_connection",
            node_id=self.sessions.node_id,
            peer_id=newcomer.hello.node_id,
            remote_address=newcomer.remote_address,
            existing_address=old.remote_address,
            outcome=outcome,
        )


class _Probe:
    """One probe: a ping on the live connection, and a timer."""

    def __init__(self, probes: DuplicateProbes, newcomer, peer, proven: bool) -> None:
        self.probes = probes
        self.newcomer = newcomer
        self.peer = peer
        self.proven = proven  # the newcomer's node id is proven by its certificate
        self.old = peer.connection
        clock, config = probes.sessions.clock, probes.sessions.config
        self.old.probe()
        self.old.watch_bytes(self._answered)
        self._timer = clock.callLater(config.duplicate_probe_timeout, self.finish, False)

    def _answered(self, old) -> None:
        self.finish(alive=True)

    def cancel(self) -> None:
        if self._timer.active():
            self._timer.cancel()
        if self.old.watching(self._answered):
            self.old.watch_bytes(None)

    def finish(self, alive: bool) -> None:
        self.cancel()
        if self.probes.pending.get(self.newcomer) is self:
            self.probes.done(self, alive)
