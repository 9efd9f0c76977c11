"""Structured telemetry: every event mconn logs, by stable name (specs/telemetry.md).

Events go through ``twisted.logger`` in the ``mconn`` namespace with keyword fields, never
pre-formatted strings, so that a jsonFileLogObserver writes them as data a pipeline can
read. Each carries ``event`` (the stable name below) and ``node_id`` (the logging node).

A session is named by its reference (``mconn.core.session_ref``), never by its id: in
plaintext mode the id is the resume secret, and every observer (the telemetry file,
twistd's log) would show it (specs/telemetry.md section 2.2). ``emit`` makes the
reference, so the parts that log pass the id as they hold it.
"""

from __future__ import annotations

import os
import secrets
import time

from twisted.logger import Logger, LogLevel

from mconn.core.node_info import display_name, node_info_of
from mconn.core.session_ref import session_ref_of_hex
from mconn.errors import MalformedPacket

log = Logger(namespace="mconn")

#: When this process loaded mconn, seconds since the epoch: the same value in every
#: ``node_started`` of one process, a new one after the process restarts.
PROCESS_STARTED = time.time()

#: Stable event names and their human-readable formats. specs/telemetry.md lists the
#: fields of each; tests/adapter/test_telemetry.py checks them against the spec.
FORMATS = {
    "node_started": "{node_id} started: run {run_id}, process {pid}",
    "listening": "{node_id} listening on {address}",
    "connection_made": "{node_id} {direction} connection with {remote_address}",
    "handshake_done": "{node_id} handshake with {peer_id} at {remote_address} done",
    "peer_rejected": "{node_id} refused {peer_id} at {remote_address}: {reason}: {message}",
    "connection_refused": "{node_id} refused a connection from {remote_address}: {reason}: {message}",
    "protocol_error": "{node_id} protocol error from {peer_id} at {remote_address}: {error_type}: {error}",
    "link_failed": "{node_id} link to {peer_id} at {remote_address} failed: {error_type}: {error}",
    "connection_lost": "{node_id} connection with {peer_id} at {remote_address} ended: {reason_type}: {reason}",
    "channel_stats": "{node_id} channel {channel_id:#04x} with {peer_id}: queue {queue_depth}",
    "reactor_error": "{node_id} reactor {reactor} failed in {method} for {peer_id}",
    "session_started": "{node_id} session {session_id} with {peer_id} started",
    "session_suspended": "{node_id} session {session_id} with {peer_id} suspended: {reason_type}",
    "session_resumed": "{node_id} session {session_id} with {peer_id} resumed, {resent} messages re-sent",
    "session_ended": "{node_id} session {session_id} with {peer_id} ended: {reason_type}: {reason}",
    "dial_attempt": "{node_id} dial {attempt} to {address}: {result}",
    "dial_gave_up": "{node_id} gave up dialing {peer_id}: {reason}",
    "duplicate_connection": "{node_id} second connection from {peer_id} at {remote_address}: {outcome}",
    "loop_stalled": "{node_id} event loop stalled {late:.3f}s (keepalive verdict on {peer_id} deferred)",
}

#: Events that are data only: logged without a ``log_format``, so text observers (twistd's
#: console and log file) skip them, while the telemetry file, the status page and the
#: metrics read their fields. ``channel_stats`` is one line per channel and peer at every
#: stats tick: most of a busy node's log, and no news to a reader of it.
DATA_ONLY = frozenset({"channel_stats"})

_LEVELS = {
    "protocol_error": "warn",
    "peer_rejected": "warn",
    "connection_refused": "warn",
    "loop_stalled": "warn",
    "dial_gave_up": "warn",
}
_LEVEL_OBJECTS = {name: LogLevel.levelWithName(level) for name, level in _LEVELS.items()}
#: The keys emit adds to an event (its name, Logger's log_* keys but the time, with
#: format_for's answer), by (event, peer_id None, an error to append, the Logger): at
#: most three per event and Logger, set in one update.
_FORMAT_CACHE: dict = {}


def emit(event: str, **fields) -> None:
    """Log one telemetry event with its fields.

    The event is the one ``Logger.info`` (or ``warn``) would emit, built here: the
    Logger's check of its level and keyword plumbing cost a connection storm more than
    the record's own fields (bench/history/2026-11-24-evening.md, "Handshakes, round trip and bulk").

    A ``session_id`` field is given as the id's hex and logged as the session's
    reference (``mconn.core.session_ref``): the id is the resume secret in plaintext mode.
    """
    session_id = fields.get("session_id")
    if session_id is not None:
        fields["session_id"] = session_ref_of_hex(session_id)
    publish(event, fields)


#: What ``publish`` finds for a field it looks up that the event does not have.
_ABSENT = object()


def publish(event: str, fields: dict) -> None:
    """Log ``fields`` (a dict of its own, taken over) as the event ``event``: ``emit``
    without its keyword plumbing, for a caller that holds the fields in a dict and names
    a session by its reference already (``session_ref``), never by its id."""
    key = (event, fields.get("peer_id", _ABSENT) is None, bool(fields.get("error")), "log_peer" in fields, log)
    envelope = _FORMAT_CACHE.get(key)
    if envelope is None:
        envelope = _FORMAT_CACHE[key] = {
            "event": event,
            "log_logger": log,
            "log_level": _LEVEL_OBJECTS.get(event, LogLevel.info),
            "log_namespace": log.namespace,
            "log_source": log.source,
            "log_format": format_for(event, fields),
        }
    fields.update(envelope)
    fields["log_time"] = time.time()
    if "log_trace" in fields:
        fields["log_trace"].append((log, log.observer))
    log.observer(fields)


def format_for(event: str, fields: dict) -> str | None:
    """The event's ``log_format``: its FORMATS template, worded for what is known. A
    connection that ends before the hello has no peer id ("connection at ADDRESS", not
    "with None"); an event with an ``error`` its template does not show ends with it
    (a failed dial says why). None for the DATA_ONLY events: no text observer shows them."""
    if event in DATA_ONLY:
        return None
    text = FORMATS[event]
    if "peer_id" in fields and fields["peer_id"] is None:
        for known, unknown in (
            (" with {peer_id} at ", " at "),
            (" from {peer_id} at ", " from "),
            (" to {peer_id} at ", " to "),
            ("refused {peer_id} at ", "refused a connection from "),
        ):
            text = text.replace(known, unknown)
    if "log_peer" in fields:  # a peer with a moniker: peer_name
        text = text.replace("{peer_id}", "{log_peer}")
    if fields.get("error") and "{error}" not in text:
        text += " ({error})"
    return text


def peer_name(node_id: str | None, node_info) -> dict:
    """``{"log_peer": "moniker (abcd1234)"}`` for an event about a peer whose node info has
    a moniker (``mconn.core.node_info.display_name``), ``{}`` otherwise. ``format_for`` then
    shows it where the text showed ``{peer_id}``; like Twisted's own ``log_*`` keys it is
    for the text only, and the telemetry file leaves it out (``peer_id`` is the field)."""
    if node_id is None or node_info is None or not node_info.moniker:
        return {}
    return {"log_peer": display_name(node_id, node_info)}


def hello_peer_name(hello) -> dict:
    """``peer_name`` of the node that sent ``hello`` (None: no hello yet); a node info that
    does not decode names no one (the connection is refused for it)."""
    if hello is None:
        return {}
    try:
        return peer_name(hello.node_id, node_info_of(hello))
    except MalformedPacket:
        return {}


def node_started(node_id: str, node_info=None) -> str:
    """Log ``node_started`` for a Switch that starts; returns its new random run id.

    ``node_info``: the Switch's NodeInfo (None: it has none). Its ``moniker`` and
    ``network`` go into the event (null without one; an empty moniker is null too), so a
    reader of the telemetry (the pipeline's report) can name the node as its logs do."""
    run_id = secrets.token_hex(16)
    emit(
        "node_started",
        node_id=node_id,
        run_id=run_id,
        pid=os.getpid(),
        process_started=PROCESS_STARTED,
        moniker=(node_info.moniker or None) if node_info is not None else None,
        network=node_info.network if node_info is not None else None,
    )
    return run_id


def emit_failure(event: str, **fields) -> None:
    """Log one telemetry event together with the exception being handled."""
    log.failure(FORMATS[event], event=event, **fields)


#: The fields of one ``channel_stats`` after ``node_id`` and ``peer_id``, in the order of
#: the tuples ``channel_samples`` returns.
SAMPLE_FIELDS = (
    "channel_id",
    "channel_name",
    "priority",
    "queue_depth",
    "bytes_sent",
    "messages_sent",
    "bytes_received",
    "messages_received",
    "accepted",
    "acked",
    "delivered",
    "session_id",
    "connection",
    "round_trip",
)


def channel_samples(peer, descriptors=None) -> tuple:
    """One peer's ``channel_stats`` fields now: a tuple per channel, in SAMPLE_FIELDS order
    (``round_trip`` last; ``session_id`` as bytes), cheap to keep and compare.

    With ``descriptors`` (the Switch's channels, which each of its sessions has) a
    connected peer's are read straight from its connection's channels and its session,
    the same values as ``peer.stats`` gives without the rest of that snapshot (the stats
    tick's path: the snapshot was a fifth of an idle listener's CPU time when a
    keepalive round trip moved 167 peers' samples a second); a suspended peer's come
    from ``peer.stats`` (its held messages are the Peer's own)."""
    session = peer.session
    session_id, connects, round_trip = session.id, peer.connects, peer.round_trip
    protocol = peer.connection
    core = protocol.core if protocol is not None else None
    if core is not None and descriptors is not None:
        channels = core.channels
        rows = []
        for desc in descriptors:
            channel_id = desc.id
            channel = channels[channel_id]
            stats = channel.stats
            rows.append(
                (
                    channel_id,
                    desc.name,
                    desc.priority,
                    channel.queue_depth,
                    stats.bytes_sent,
                    stats.messages_sent,
                    stats.bytes_received,
                    stats.messages_received,
                    session.accepted(channel_id),
                    session.acked(channel_id),
                    session.delivered(channel_id),
                    session_id,
                    connects,
                    round_trip,
                )
            )
        return tuple(rows)
    return tuple(
        (
            c.channel_id,
            c.name,
            c.priority,
            c.queue_depth,
            c.bytes_sent,
            c.messages_sent,
            c.bytes_received,
            c.messages_received,
            c.accepted,
            c.acked,
            c.delivered,
            session_id,
            connects,
            round_trip,
        )
        for c in peer.stats.channels
    )


def sample_key(peer, channel_ids=None) -> tuple:
    """What a peer's ``channel_samples`` depend on, far cheaper to take: two equal keys
    mean equal samples. Queue depths and counters move only with bytes through the
    connection or messages accepted; a resume changes ``connects``, a new session or
    connection the objects themselves. ``channel_ids``: the Switch's, which each of its
    sessions has (None: the session's own, a set built per call)."""
    protocol = peer.connection
    core = protocol.core if protocol is not None else None
    session = peer.session
    accepted = sum(map(session.accepted, session.channel_ids if channel_ids is None else channel_ids))
    if core is None:
        return (session, peer.connects, peer.state, accepted, peer.round_trip)
    return (session, peer.connects, core, core.bytes_sent, core.bytes_received, accepted, peer.round_trip)


def channel_stats(node_id: str, peer, samples: tuple | None = None) -> None:
    """Log ``channel_stats`` for every channel of one peer's session (``samples``: its
    ``channel_samples``, taken now if None)."""
    peer_id = peer.node_id
    for sample in channel_samples(peer) if samples is None else samples:
        fields = dict(zip(SAMPLE_FIELDS, sample, strict=True))
        fields["session_id"] = fields["session_id"].hex()
        emit("channel_stats", node_id=node_id, peer_id=peer_id, **fields)


def channel_counters(core) -> list[dict]:
    """A connection's per-channel counters (``connection_lost``'s ``channels``)."""
    return [
        {
            "channel_id": c.id,
            "bytes_sent": c.stats.bytes_sent,
            "messages_sent": c.stats.messages_sent,
            "bytes_received": c.stats.bytes_received,
            "messages_received": c.stats.messages_received,
        }
        for c in core.channels.values()
    ]


def session_counters(session) -> list[dict]:
    """A session's per-channel counts (``session_ended``'s ``channels``)."""
    return [
        {"channel_id": c, "accepted": session.accepted(c), "acked": session.acked(c), "delivered": session.delivered(c)}
        for c in sorted(session.channel_ids)
    ]
