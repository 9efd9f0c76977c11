"""Session limits: dormant sessions make room instead of locking a node out.

A session that breaks is suspended for ``resume_grace``; without bounds, sessions that
nobody will resume would pin memory (their recovery buffers) and peer slots. The rules
(specs/resume.md section 1.3, specs/connection.md section 6):

* one address holds at most ``max_connections_per_ip`` inbound sessions, suspended ones
  included; when a new session from it would pass that, its oldest suspended session
  gives way (``evicted``);
* at ``max_inbound_peers`` a suspended session that never carried a message gives way to
  a new one (the oldest first);
* at most ``max_suspended_sessions`` suspended sessions (the oldest gives way) holding at
  most ``max_suspended_bytes`` unacknowledged bytes (the one holding the most gives way).

A session that gives way ends with ``SessionRejected("evicted: ...")`` and its messages
are counted as undelivered; nothing is dropped silently.
"""

from __future__ import annotations

from mconn.errors import PeerRejected
from mconn.session_table import PeerState

S = PeerState


class SessionLimits:
    """The session limits of one ``SessionManager``."""

    def __init__(self, sessions, admission) -> None:
        self.sessions = sessions
        self._admission = admission

    def check(self, proto) -> None:
        """May a session start on ``proto``? Suspended sessions make room rather than
        lock a node out (specs/connection.md section 6): one address holds at most
        ``max_connections_per_ip`` inbound sessions, suspended ones included (its oldest
        suspended one gives way), and at ``max_inbound_peers`` a suspended session that
        never carried a message gives way to a new one.

        :raises PeerRejected: ``ip_limit``, or ``inbound_limit`` / ``outbound_limit``.
        """
        outbound = proto.context.is_outbound
        if not outbound and proto.ip_key is not None:
            self._room_for_address(proto.ip_key)
        same = [p for p in self.sessions.peers.values() if p.is_outbound == outbound]
        if not outbound and len(same) >= self.sessions.config.max_inbound_peers:
            idle = [p for p in same if p.state is S.SUSPENDED and not p.session.carried_traffic()]
            if idle:
                victim = min(idle, key=lambda p: p.suspended_at)
                self.sessions.evict(victim, f"max_inbound_peers {self.sessions.config.max_inbound_peers} reached; it never carried a message")
                same.remove(victim)
        self._admission.check_peer_limit(outbound, len(same))

    def _room_for_address(self, host: str) -> None:
        limit = self.sessions.config.max_connections_per_ip
        mine = [p for p in self.sessions.peers.values() if not p.is_outbound and p.ip_key == host]
        if len(mine) < limit:
            return
        suspended = [p for p in mine if p.state is S.SUSPENDED]
        if not suspended:
            raise PeerRejected("ip_limit", f"{len(mine)} sessions from {host} (max_connections_per_ip {limit})")
        victim = min(suspended, key=lambda p: p.suspended_at)
        self.sessions.evict(victim, f"{len(mine)} sessions from {host} (max_connections_per_ip {limit})")

    def bound_suspended(self) -> None:
        """Suspended sessions are bounded in number (the oldest ends first) and in
        unacknowledged bytes (the one holding the most ends first): dormant sessions
        cannot pin unbounded memory (specs/resume.md section 1.3)."""
        config = self.sessions.config
        for _ in range(len(self.sessions.peers)):
            suspended = [p for p in self.sessions.peers.values() if p.state is S.SUSPENDED]
            held = sum(p.session.unacked_bytes for p in suspended)
            if len(suspended) > config.max_suspended_sessions:
                victim = min(suspended, key=lambda p: p.suspended_at)
                why = f"{len(suspended)} suspended sessions (max_suspended_sessions {config.max_suspended_sessions})"
            elif held > config.max_suspended_bytes:
                victim = max(suspended, key=lambda p: p.session.unacked_bytes)
                why = f"suspended sessions hold {held} unacknowledged bytes (max_suspended_bytes {config.max_suspended_bytes})"
            else:
                return
            self.sessions.evict(victim, why)
