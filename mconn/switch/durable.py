"""Durable sessions: the Switch's session store and the reactors' committed counts
(specs/resume.md section 9).

With ``Config.session_store`` set, the Switch opens a ``mconn.switch.session_store.SessionStore``
at ``startService`` (bound to the node's key), restores every session it holds as a
suspended one (``SessionManager.restore``) and closes it at ``stopService``. The store's
bound is the memory's (section 1.3): ``max_bytes`` below.
"""

from __future__ import annotations

from mconn.core.session import MESSAGE_OVERHEAD

#: A channel's reserve of unacknowledged bytes outside the session-wide bound
#: (``mconn.core.session.Session``'s ``channel_reserve_bytes``, which the Switch leaves at its default).
CHANNEL_RESERVE_BYTES = 65536


def max_bytes(config, channels) -> int:
    """The store's bound: what memory holds at most (specs/resume.md section 1.3), the
    node's ``max_unacked_bytes`` plus, for every session the node may hold (peers of
    both directions and suspended ones), each channel's reserve and one largest message."""
    sessions = config.max_inbound_peers + config.max_outbound_peers + config.max_suspended_sessions
    per_session = sum(CHANNEL_RESERVE_BYTES + d.recv_message_capacity + MESSAGE_OVERHEAD for d in channels)
    return config.max_unacked_bytes + sessions * per_session


def open_store(config, node_id: str, channels, clock):
    """Open ``config.session_store`` for ``node_id``. The store refuses a file written by
    another node key, with its own error."""
    from mconn.switch.session_store import SessionStore  # only a node that keeps sessions loads sqlite3

    return SessionStore.open(config.session_store, node_id, max_bytes=max_bytes(config, channels), reactor=clock)


def committed_counts(reactor_set, peer_id: str, session_id: bytes) -> dict[int, int]:
    """The delivered counts the reactors committed with their effects for one session
    (``Reactor.committed_deliveries``), each channel's from the reactor owning it.

    :raises ValueError: for a count that is not an integer >= 0, or a channel the
        answering reactor does not own, naming the reactor, channel and value.
    """
    counts: dict[int, int] = {}
    for reactor in reactor_set.reactors:
        hook = getattr(reactor, "committed_deliveries", None)
        answer = hook(peer_id, session_id) if hook is not None else None
        for channel_id, count in (answer or {}).items():
            name = getattr(reactor, "name", None) or type(reactor).__name__
            if reactor_set.by_channel.get(channel_id) is not reactor:
                raise ValueError(
                    f"reactor {name}'s committed_deliveries names channel {channel_id!r}, which it does not own"
                )
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"reactor {name}'s committed_deliveries gives channel {channel_id:#04x} the count {count!r}; "
                    f"a delivered count is an integer >= 0"
                )
            counts[channel_id] = count
    return counts
