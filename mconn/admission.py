"""Admission: may an inbound connection start its handshake, may a session start? Pure.

The connection filter of specs/connection.md section 6 (CometBFT's transport does the
same job with its ``ConnFilterFunc``): per-address connection counts, the number of
inbound handshakes under way, and the peer limits per direction. Every refusal is a
``PeerRejected`` whose reason is the close code and whose message names the limit and
the values; ``refusals`` counts them by reason (``Switch.refusals``, the status page).
"""

from __future__ import annotations

from mconn.config import Config
from mconn.errors import PeerRejected


class Admission:
    """The admission counters of one Switch.

    :param config: the limits (``max_pending_handshakes``, ``max_connections_per_ip``,
        ``max_inbound_peers``, ``max_outbound_peers``).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        #: remote host -> inbound connections admitted from it and not yet gone.
        self.per_ip: dict[str, int] = {}
        #: Inbound connections admitted whose handshake has not ended yet.
        self.pending = 0
        #: Connections refused, by reason.
        self.refusals: dict[str, int] = {}

    def admit(self, host: str | None) -> PeerRejected | None:
        """Admit an inbound connection from ``host``, or say why not.

        An admitted connection counts against ``host`` until ``release(host)`` and as
        pending until ``handshake_over()``.
        """
        config = self.config
        from_host = self.per_ip.get(host, 0) if host is not None else 0
        if self.pending >= config.max_pending_handshakes:
            return PeerRejected(
                "pending_limit",
                f"{self.pending} inbound connections are handshaking "
                f"(max_pending_handshakes {config.max_pending_handshakes})",
            )
        if host is not None and from_host >= config.max_connections_per_ip:
            return PeerRejected(
                "ip_limit", f"{from_host} connections from {host} (max_connections_per_ip {config.max_connections_per_ip})"
            )
        if host is not None:
            self.per_ip[host] = from_host + 1
        self.pending += 1
        return None

    def handshake_over(self) -> None:
        """An admitted connection's handshake ended (a session, or the connection lost)."""
        self.pending -= 1

    def release(self, host: str | None) -> None:
        """An admitted connection from ``host`` is gone."""
        if host is None:
            return
        left = self.per_ip[host] - 1
        if left:
            self.per_ip[host] = left
        else:
            del self.per_ip[host]

    def check_peer_limit(self, outbound: bool, count: int) -> None:
        """May one more session start in this direction, with ``count`` already there?

        :raises PeerRejected: ``inbound_limit`` or ``outbound_limit``.
        """
        limit = self.config.max_outbound_peers if outbound else self.config.max_inbound_peers
        if count >= limit:
            kind = "outbound" if outbound else "inbound"
            raise PeerRejected(f"{kind}_limit", f"already {count} {kind} peers (max_{kind}_peers {limit})")

    def refused(self, rejection: PeerRejected) -> None:
        """Count a refusal by its reason."""
        self.refusals[rejection.reason] = self.refusals.get(rejection.reason, 0) + 1

    def check_invariants(self, live_hosts, live_pending: int) -> None:
        """The counts agree with the live connections: ``live_hosts`` has the host of
        every admitted connection still open, ``live_pending`` how many still handshake."""
        per_ip: dict[str, int] = {}
        for host in live_hosts:
            per_ip[host] = per_ip.get(host, 0) + 1
        assert per_ip == self.per_ip, f"per-IP counts {self.per_ip} != live {per_ip}"
        assert live_pending == self.pending, f"{self.pending} pending handshakes counted, {live_pending} live"
