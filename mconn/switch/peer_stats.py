"""PeerStats: a Peer's counters at one moment (``peer.stats``; specs/reactor-api.md 5.6).

Frozen snapshots, taken on demand: the session's counts (accepted, acknowledged,
delivered, unconfirmed), the current connection's bytes and messages per channel, and the
per-node counters the Switch keeps across sessions.
"""

from __future__ import annotations

import dataclasses

from mconn.errors import warn_renamed


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChannelStatsSnapshot:
    """One channel's counters at one moment."""

    channel_id: int
    priority: int
    queue_depth: int
    waiting_sends: int
    bytes_sent: int
    messages_sent: int
    bytes_received: int
    messages_received: int
    #: Session-wide: messages accepted, confirmed delivered by the peer, delivered to us.
    accepted: int = 0
    acked: int = 0
    delivered: int = 0
    #: The channel's name (``ChannelDescriptor.name``), empty if it has none.
    name: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerStats:
    """A peer's counters at one moment (``peer.stats``)."""

    node_id: str
    is_outbound: bool
    state: str
    uptime: float
    bytes_sent: int
    bytes_received: int
    round_trip: float | None
    channels: tuple[ChannelStatsSnapshot, ...]
    connects: int = 0
    disconnects: int = 0
    resumes: int = 0
    messages_resent: int = 0
    unacked_bytes: int = 0
    #: Accepted for sending and not yet confirmed delivered, per channel id (some may be
    #: with the peer's reactor, their acknowledgement on its way). ``undelivered`` is
    #: its old name, deprecated.
    unconfirmed: dict = dataclasses.field(default_factory=dict)
    #: Per node, across sessions (``Switch.node_counters``): resumes refused, sessions
    #: that outlived resume_grace, duplicate connections refused or that replaced a
    #: dead one, simultaneous dials settled.
    resume_rejections: int = 0
    grace_expiries: int = 0
    duplicates_refused: int = 0
    duplicates_replaced: int = 0
    simultaneous_dials: int = 0

    @property
    def undelivered(self) -> dict:
        """Deprecated name of ``unconfirmed``."""
        warn_renamed("PeerStats.undelivered", "PeerStats.unconfirmed")
        return self.unconfirmed


def snapshot(peer, *, descriptors, held: dict, waiting: dict, uptime: float, node_counters: dict) -> PeerStats:
    """``peer.stats``: the counters of ``peer``'s session, its current connection and its
    node. The Peer hands in what it alone holds: our channels' ``descriptors``, the
    messages ``held`` while suspended and the sends ``waiting`` for room (per channel),
    the session's ``uptime``, and its node's counters."""
    protocol = peer.connection
    core = protocol.core if protocol is not None else None
    session = peer.session
    channels = []
    for desc in descriptors:
        c = core.channels[desc.id] if core is not None else None
        channels.append(
            ChannelStatsSnapshot(
                channel_id=desc.id,
                priority=desc.priority,
                queue_depth=c.queue_depth if c is not None else held.get(desc.id, 0),
                waiting_sends=len(waiting.get(desc.id, ())),
                bytes_sent=c.stats.bytes_sent if c is not None else 0,
                messages_sent=c.stats.messages_sent if c is not None else 0,
                bytes_received=c.stats.bytes_received if c is not None else 0,
                messages_received=c.stats.messages_received if c is not None else 0,
                accepted=session.accepted(desc.id) if desc.id in session.channel_ids else 0,
                acked=session.acked(desc.id) if desc.id in session.channel_ids else 0,
                delivered=session.delivered(desc.id) if desc.id in session.channel_ids else 0,
                name=desc.name,
            )
        )
    return PeerStats(
        node_id=peer.node_id,
        is_outbound=peer.is_outbound,
        state=peer.state.value,
        uptime=uptime,
        bytes_sent=core.bytes_sent if core is not None else 0,
        bytes_received=core.bytes_received if core is not None else 0,
        round_trip=peer.round_trip,
        channels=tuple(channels),
        connects=peer.connects,
        disconnects=peer.disconnects,
        resumes=peer.resumes,
        messages_resent=session.resent,
        unacked_bytes=session.unacked_bytes,
        unconfirmed=session.unconfirmed(),
        **node_counters,
    )
