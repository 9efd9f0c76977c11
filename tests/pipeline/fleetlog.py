"""Hand-made fleet telemetry with known truth, written the way jsonFileLogObserver writes.

A FleetLog holds nodes; a Link between two of them emits the events both ends of a
real link would log (specs/telemetry.md section 4), with the counters kept consistent:
``send`` moves messages (accepted and acked by the sender, delivered by the receiver),
and the faults are explicit: ``lose`` (accepted and acked, never delivered),
``duplicate`` (delivered once more), ``unconfirmed`` (accepted, never acked: reported
undelivered at the end). Time is explicit too: every call takes ``t``, seconds from the
log's origin.

Nodes are *older* by default: their events lack the fields added later (``session_id``
in ``connection_lost`` and ``channel_stats``, ``connection``, ``round_trip``,
``reason_kind``, ``channel_name``, and the ``node_started`` event), so the pipeline's
inference for old logs is what they exercise. A ``current`` node logs them all, as mconn
does now; its ``node_started`` names its ``moniker`` (None: a node without node info)
and ``network``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import pathlib

from mconn import errors

ORIGIN = 1_700_000_000.0
_LEVEL_UUID = "02e59486-f24d-46ad-8224-3acdf2a5732a"
_WARN = ("protocol_error", "peer_rejected", "connection_refused", "dial_gave_up", "loop_stalled")


def reason_kind(reason_type: str) -> str:
    """What a current node logs as ``reason_kind`` for a reason of this class (``mconn.errors.error_kind``)."""
    cls = getattr(errors, reason_type, None)
    return errors.error_kind(cls.__new__(cls)) if isinstance(cls, type) else errors.OTHER


def node_id(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def session_id(name: str) -> str:
    return hashlib.md5(name.encode()).hexdigest()


def record(event: str, t: float, **fields) -> str:
    """One line as jsonFileLogObserver writes it: RS, JSON object, newline."""
    body = {"event": event, **fields}
    body.update(
        log_logger={"unpersistable": True},
        log_level={"name": "warn" if event in _WARN else "info", "__class_uuid__": _LEVEL_UUID},
        log_namespace="mconn",
        log_source=None,
        log_format="{node_id} " + event,
        log_time=ORIGIN + t,
    )
    return "\x1e" + json.dumps(body) + "\n"


class Node:
    def __init__(
        self, fleet: FleetLog, name: str, port: int, current: bool = False, moniker: str | None = None
    ) -> None:
        self.fleet = fleet
        self.name = name
        self.moniker = moniker
        self.id = node_id(name)
        self.address = f"127.0.0.1:{port}"
        self.current = current
        self.runs = 0
        self.lines: list[tuple[float, int, str]] = []

    def emit(self, event: str, t: float, **fields) -> None:
        self.lines.append((t, len(self.lines), record(event, t, node_id=self.id, **fields)))

    def raw(self, t: float, text: str) -> None:
        """A line written as is (malformed input)."""
        self.lines.append((t, len(self.lines), text))

    def listen(self, t: float) -> None:
        self.emit("listening", t, address=self.address)

    def start(self, t: float) -> None:
        """The Switch starts (a current node): node_started, a new run, a new process."""
        self.runs += 1
        self.emit(
            "node_started",
            t,
            run_id=session_id(f"{self.name} run {self.runs}"),
            pid=1000 + self.runs,
            process_started=ORIGIN + t - 0.5,
            moniker=self.moniker,
            network="fleet-test" if self.moniker else None,
        )


class FleetLog:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self._ports = iter(range(26000, 27000))

    def node(self, name: str, current: bool = False, moniker: str | None = None) -> Node:
        if name not in self.nodes:
            self.nodes[name] = Node(self, name, next(self._ports), current, moniker)
        return self.nodes[name]

    def write(self, directory: pathlib.Path) -> dict[str, pathlib.Path]:
        """One file per node, lines in time order; returns {node name: path}."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, node in self.nodes.items():
            path = directory / f"{name}.json"
            path.write_text("".join(text for _, _, text in sorted(node.lines)))
            paths[name] = path
        return paths


class Link:
    """One session between ``dialer`` and ``listener``; counters per channel and direction."""

    def __init__(
        self,
        dialer: Node,
        listener: Node,
        name: str,
        t: float,
        channels=((0x20, 1), (0x21, 5)),
        rtt=0.01,
        resume_refused: str = "",
        channel_names=None,
    ) -> None:
        self.dialer, self.listener = dialer, listener
        self.session = session_id(name)
        self.channels = dict(channels)
        #: channel id -> the name a current node's channel_stats gives it ("" without one)
        self.channel_names = dict(channel_names or {})
        self.rtt = rtt
        # (sender name, channel) -> counters
        self.accepted = collections.Counter()
        self.acked = collections.Counter()
        self.delivered = collections.Counter()  # keyed by the *sender*: delivered at the other end
        self.resumes = 0
        self.connection = 1  # as Peer.connects: one more at each resume
        self._inbound_port = iter(range(50000, 60000))
        self._connect(t)
        for node in (dialer, listener):
            node.emit(
                "session_started",
                t + rtt,
                peer_id=self.other(node).id,
                session_id=self.session,
                remote_address=self._remote(node),
                direction="outbound" if node is dialer else "inbound",
                resume_refused=resume_refused,
            )

    def other(self, node: Node) -> Node:
        return self.listener if node is self.dialer else self.dialer

    def _remote(self, node: Node) -> str:
        return self.listener.address if node is self.dialer else f"127.0.0.1:{self._port}"

    def _connect(self, t: float) -> None:
        self._port = next(self._inbound_port)
        dialer, listener = self.dialer, self.listener
        dialer.emit("connection_made", t, direction="outbound", remote_address=listener.address)
        listener.emit("connection_made", t + self.rtt / 2, direction="inbound", remote_address=self._remote(listener))
        for node, at in ((listener, t + self.rtt / 2 + 0.0001), (dialer, t + self.rtt)):
            node.emit(
                "handshake_done",
                at,
                peer_id=self.other(node).id,
                remote_address=self._remote(node),
                direction="outbound" if node is dialer else "inbound",
                max_packet_payload=1024,
                channels=sorted(self.channels),
                listen_address=self.other(node).address,
            )

    # -- traffic ---------------------------------------------------------------------

    def send(self, sender: Node, channel: int, n: int) -> None:
        key = (sender.name, channel)
        self.accepted[key] += n
        self.acked[key] += n
        self.delivered[key] += n

    def lose(self, sender: Node, channel: int, n: int = 1) -> None:
        key = (sender.name, channel)
        self.accepted[key] += n
        self.acked[key] += n

    def duplicate(self, sender: Node, channel: int, n: int = 1) -> None:
        self.delivered[(sender.name, channel)] += n

    def unconfirmed(self, sender: Node, channel: int, n: int) -> None:
        self.accepted[(sender.name, channel)] += n

    def counters(self, node: Node, channel: int) -> dict:
        peer = self.other(node)
        return {
            "accepted": self.accepted[(node.name, channel)],
            "acked": self.acked[(node.name, channel)],
            "delivered": self.delivered[(peer.name, channel)],
        }

    def _current(self, node: Node, **fields) -> dict:
        """The fields only a current node logs."""
        return fields if node.current else {}

    def stats(self, node: Node, t: float, queue=None, sent_bytes=None, round_trip=None) -> None:
        """One channel_stats tick at ``node``: queue depths and byte counters per channel."""
        queue, sent_bytes = queue or {}, sent_bytes or {}
        current = self._current(node, session_id=self.session, connection=self.connection, round_trip=round_trip)
        for i, (channel, priority) in enumerate(sorted(self.channels.items())):
            node.emit(
                "channel_stats",
                t + i * 1e-4,
                peer_id=self.other(node).id,
                channel_id=channel,
                **self._current(node, channel_name=self.channel_names.get(channel, "")),
                priority=priority,
                queue_depth=queue.get(channel, 0),
                bytes_sent=sent_bytes.get(channel, 0),
                messages_sent=0,
                bytes_received=0,
                messages_received=0,
                **self.counters(node, channel),
                **current,
            )

    # -- breaks ----------------------------------------------------------------------

    def _lost(self, t: float, reason_type: str, ends=None) -> None:
        for node in ends or (self.dialer, self.listener):
            node.emit(
                "connection_lost",
                t,
                peer_id=self.other(node).id,
                remote_address=self._remote(node),
                direction="outbound" if node is self.dialer else "inbound",
                reason_type=reason_type,
                reason="the connection broke",
                **self._current(node, reason_kind=reason_kind(reason_type)),
                duration=1.0,
                bytes_sent=1000,
                bytes_received=2000,
                channels=[
                    {"channel_id": c, "bytes_sent": 0, "messages_sent": 0, "bytes_received": 0, "messages_received": 0}
                    for c in sorted(self.channels)
                ],
                **self._current(node, session_id=self.session),
            )

    def suspend(self, t: float, ends=None, grace: float = 30.0) -> None:
        """The transport breaks: connection_lost and session_suspended at ``ends`` (both)."""
        self._lost(t, "ConnectionLost", ends)
        for node in ends or (self.dialer, self.listener):
            node.emit(
                "session_suspended",
                t + 0.0001,
                peer_id=self.other(node).id,
                session_id=self.session,
                reason_type="ConnectionLost",
                reason="Connection to the other side was lost",
                grace=grace,
            )

    def dial(self, t: float, attempt: int, result: str, delay: float = 0.0, error=None) -> None:
        self.dialer.emit(
            "dial_attempt",
            t,
            peer_id=self.listener.id,
            address=f"{self.listener.id}@{self.listener.address}",
            attempt=attempt,
            delay=delay,
            result=result,
            error=error,
        )

    def resume(self, t: float, attempt: int = 1) -> None:
        """The dialer's attempt connects and both ends resume (then the dial is reported)."""
        self._connect(t)
        self.resumes += 1
        self.connection += 1
        for node in (self.listener, self.dialer):
            node.emit(
                "session_resumed",
                t + self.rtt + 0.001,
                peer_id=self.other(node).id,
                session_id=self.session,
                remote_address=self._remote(node),
                resent=0,
                resumes=self.resumes,
            )
        self.dial(t + self.rtt + 0.002, attempt, "connected")

    def end(self, t: float, reason_type: str = "ConnectionClosed", ends=None, lose_connection=True) -> None:
        """``session_ended`` at the given ends (both by default), counters as they stand."""
        if lose_connection:
            self._lost(t, reason_type, ends)
        for node in ends or (self.dialer, self.listener):
            channels = [{"channel_id": c, **self.counters(node, c)} for c in sorted(self.channels)]
            undelivered = [
                {"channel_id": c["channel_id"], "count": c["accepted"] - c["acked"]}
                for c in channels
                if c["accepted"] > c["acked"]
            ]
            node.emit(
                "session_ended",
                t + 0.0002,
                peer_id=self.other(node).id,
                session_id=self.session,
                reason_type=reason_type,
                reason="it ended",
                **self._current(node, reason_kind=reason_kind(reason_type)),
                resumes=self.resumes,
                undelivered=undelivered,
                channels=channels,
            )
