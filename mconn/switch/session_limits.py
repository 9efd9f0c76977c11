"""Session limits: dormant sessions make room instead of locking a node out.

A session that breaks is suspended for ``resume_grace``; without bounds, sessions that
nobody will resume would pin memory (their recovery buffers) and peer slots. The rules
(specs/resume.md section 1.3, specs/connection.md section 6):

* one address holds at most ``max_connections_per_ip`` inbound sessions, suspended ones
  included; when a new session from it would pass that, its oldest suspended session
  gives way (``evicted``). One address is a peer's ``ip_key``
  (``mconn.core.admission.limit_key``): an IPv4 address, or every address of one IPv6 /64
  (``Config.ip_limit_prefix_v4`` / ``_v6``), so the addresses of one /64 share the
  share of one address, live and suspended sessions together;
* at ``max_inbound_peers`` a suspended session that never carried a message gives way to
  a new one (the oldest first);
* at most ``max_suspended_sessions`` suspended sessions (the oldest gives way) holding at
  most ``max_suspended_bytes`` unacknowledged bytes (the one holding the most gives way).

A session that gives way ends with ``SessionRejected("evicted: ...")`` and its messages
are counted as undelivered; nothing is dropped silently.
"""

from __future__ import annotations

from mconn.errors import PeerRejected
from mconn.core.session_table import PeerState


class SessionLimits:
    """The session limits of one ``SessionManager``."""

    def __init__(self, sessions, admission) -> None:
        self.sessions = sessions
        self._admission = admission
        #: Suspended sessions by node id, the longest suspended first.
        self.suspended: dict = {}
        #: Sessions per direction (True: outbound) and inbound sessions per address (the
        #: peers' ``ip_key``: an IPv4 address, an IPv6 /64), kept as sessions start and
        #: end so that a limit costs no scan of every session.
        self.per_direction = {True: 0, False: 0}
        self.inbound_per_host: dict[str, int] = {}

    def state_changed(self, peer) -> None:
        """The table moved ``peer``: keep the suspended table in suspension order."""
        node_id = peer.node_id
        if peer.state is PeerState.SUSPENDED:
            self.suspended.setdefault(node_id, peer)
        elif self.suspended.get(node_id) is peer:
            del self.suspended[node_id]

    def counted(self, peer, delta: int) -> None:
        """``peer`` joined (1) or left (-1) the peer table, or its address changes."""
        self.per_direction[peer.is_outbound] += delta
        key = peer.ip_key
        if not peer.is_outbound and key is not None:
            left = self.inbound_per_host.get(key, 0) + delta
            if left:
                self.inbound_per_host[key] = left
            else:
                del self.inbound_per_host[key]

    def check_invariants(self, peers) -> None:
        """The counts and the suspended table agree with the peer table."""
        peers = list(peers)
        assert self.suspended == {p.node_id: p for p in peers if p.state is PeerState.SUSPENDED}, "suspended table"
        assert self.per_direction == {d: sum(1 for p in peers if p.is_outbound is d) for d in (True, False)}
        hosts = [p.ip_key for p in peers if not p.is_outbound and p.ip_key is not None]
        assert self.inbound_per_host == {h: hosts.count(h) for h in set(hosts)}, "per-host session counts"

    def check(self, protocol) -> None:
        """May a session start on ``protocol``? Suspended sessions make room rather than
        lock a node out (specs/connection.md section 6): one address (``ip_key``: an
        IPv4 address, an IPv6 /64) holds at most
        ``max_connections_per_ip`` inbound sessions, suspended ones included (its oldest
        suspended one gives way), and at ``max_inbound_peers`` a suspended session that
        never carried a message gives way to a new one.

        :raises PeerRejected: ``ip_limit``, or ``inbound_limit`` / ``outbound_limit``.
        """
        outbound = protocol.context.is_outbound
        sessions = self.sessions
        if not outbound and protocol.ip_key is not None:
            self._room_for_address(protocol.ip_key)
        if protocol.hello is not None and protocol.hello.node_id in sessions.config.unconditional_peers:
            return  # unconditional peers bypass the peer limits (Config.unconditional_peers)
        count = self.per_direction[outbound]
        limit = sessions.config.max_inbound_peers
        if not outbound and count >= limit:
            idle = [p for p in self.suspended.values() if not p.is_outbound and not p.session.carried_traffic()]
            if idle:
                sessions.evict(idle[0], f"max_inbound_peers {limit} reached; it never carried a message")
                count -= 1
        self._admission.check_peer_limit(outbound, count)

    def _room_for_address(self, key: str) -> None:
        """Room for one more inbound session from ``key`` (an ``ip_key``), its longest
        suspended session giving way if it holds ``max_connections_per_ip``."""
        limit = self.sessions.config.max_connections_per_ip
        count = self.inbound_per_host.get(key, 0)
        if count < limit:
            return
        suspended = [p for p in self.suspended.values() if not p.is_outbound and p.ip_key == key]
        if not suspended:
            raise PeerRejected("ip_limit", f"{count} sessions from {key} (max_connections_per_ip {limit})")
        self.sessions.evict(suspended[0], f"{count} sessions from {key} (max_connections_per_ip {limit})")

    def bound_suspended(self) -> None:
        """Suspended sessions are bounded in number (the oldest ends first) and in
        unacknowledged bytes (the one holding the most ends first): dormant sessions
        cannot pin unbounded memory (specs/resume.md section 1.3)."""
        config = self.sessions.config
        for _ in range(len(self.suspended)):
            suspended = list(self.suspended.values())  # the longest suspended first
            held = sum(p.session.unacked_bytes for p in suspended)
            if len(suspended) > config.max_suspended_sessions:
                victim = suspended[0]
                why = f"{len(suspended)} suspended sessions (max_suspended_sessions {config.max_suspended_sessions})"
            elif held > config.max_suspended_bytes:
                victim = max(suspended, key=lambda p: p.session.unacked_bytes)
                why = f"suspended sessions hold {held} unacknowledged bytes (max_suspended_bytes {config.max_suspended_bytes})"
            else:
                return
            self.sessions.evict(victim, why)
