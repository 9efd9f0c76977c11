"""The telemetry of a session's lifecycle: ``session_started``, ``session_suspended``,
``session_resumed`` and ``session_ended`` (specs/telemetry.md section 4).

The ``SessionManager`` (mconn/switch/session_manager.py) calls one of these where the table of
``mconn.core.session_table`` says a session started, or where a row's ``NOTIFY_SUSPENDED``,
``RESUME`` or ``END`` effect runs; each writes one event with the fields that section
lists for it.
"""

from __future__ import annotations

from mconn.core.session_ref import session_ref
from mconn.errors import MConnError, error_kind
from mconn.switch import telemetry


def started(node_id: str, peer, protocol, refusal: str) -> None:
    """A fresh session on ``protocol``; ``refusal`` says why a resume was refused, if one was.
    (``_emit``'s fields written out, the session named by its reference at once: one
    event per handshake of a connect storm.)"""
    peer_id = peer.node_id
    fields = {
        "node_id": node_id,
        "peer_id": peer_id,
        "session_id": session_ref(peer.session.id),
        "remote_address": protocol.remote_address,
        "direction": "outbound" if peer.is_outbound else "inbound",
        "resume_refused": refusal,
    }
    node_info = getattr(peer, "node_info", None)
    if node_info is not None and node_info.moniker:
        fields.update(telemetry.peer_name(peer_id, node_info))
    telemetry.publish("session_started", fields)


def suspended(node_id: str, peer, reason: Exception, grace: float) -> None:
    """The transport of ``peer`` broke for ``reason``; it is held for ``grace`` seconds."""
    _emit(
        "session_suspended",
        node_id,
        peer,
        reason_type=type(reason).__name__,
        reason=str(reason),
        grace=grace,
    )


def resumed(node_id: str, peer, protocol, resend: dict) -> None:
    """``peer`` carries on on ``protocol``, re-sending ``resend`` (messages by channel)."""
    _emit(
        "session_resumed",
        node_id,
        peer,
        remote_address=protocol.remote_address,
        resent=sum(len(messages) for messages in resend.values()),
        resumes=peer.resumes,
    )


def ended(node_id: str, peer, reason: MConnError) -> None:
    """The session of ``peer`` ended for ``reason`` (its ``unconfirmed`` counts are set)."""
    _emit(
        "session_ended",
        node_id,
        peer,
        reason_type=type(reason).__name__,
        reason=str(reason),
        reason_kind=error_kind(reason),
        # The telemetry field keeps its name (the pipeline reads it); it counts messages
        # not confirmed delivered (specs/telemetry.md, session_ended).
        undelivered=[{"channel_id": c, "count": n} for c, n in sorted(reason.unconfirmed.items())],
        resumes=peer.resumes,
        channels=telemetry.session_counters(peer.session),
    )


def _emit(event: str, node_id: str, peer, **fields) -> None:
    """One event of ``peer``'s session: node_id, peer_id and session_id, then ``fields``."""
    telemetry.emit(
        event,
        node_id=node_id,
        peer_id=peer.node_id,
        session_id=peer.session.id.hex(),
        **fields,
        **telemetry.peer_name(peer.node_id, getattr(peer, "node_info", None)),
    )
