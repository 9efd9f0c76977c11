"""Prometheus metrics of one Switch: ``/metrics`` on the status page (specs/status.md section 4).

``SwitchMetrics(switch)`` holds a ``prometheus_client.CollectorRegistry`` of its own (so
several nodes in one process never share or clash) with one collector, and
``SwitchMetrics.exposition(accept)`` renders it in the format the scraper asked for.

Reactors add their own metrics (``Reactor.metrics(registry)``, specs/reactor-api.md
section 12): once, when a ``SwitchMetrics`` is made, each reactor's hook is called with
a :class:`ReactorRegistry`, whose collectors are read after mconn's own at each scrape.
Names starting ``mconn_`` are mconn's: registering one raises ValueError naming the
reactor and the names, and a family of that name that a reactor's collector yields later
is left out. A collector that raises at a scrape is logged and left out of that scrape.

Theory of operation
-------------------
Nothing here runs per message, except the send-queue delay samples
(``mconn_channel_send_queue_seconds``): while the metrics are started, each channel of
each connection stamps at most one queued message in ``SEND_DELAY_EVERY`` (mconn/core/channel.py,
``SendDelay``) and the histogram counts the time from its queueing to its last packet
handed to the transport. What is live is read when Prometheus scrapes: the
byte and message counters of every live connection, the peers by state, queue depths,
the recovery buffers, the last round trips. Those connection counters start from zero
on every transport and vanish with it, so a node-wide total made of them alone would go
down each time a connection ends. What ended is therefore added from the node's own
telemetry events (specs/telemetry.md) as they are logged: ``connection_lost`` carries
the final counters of its connection; ``session_resumed``, ``session_ended``,
``protocol_error``... are counted as they come. A connection leaves the live set and its
``connection_lost`` is logged in one call, so a scrape sees its bytes exactly once.
Counting starts when ``start()`` adds the observer (the status service does it when it
starts, with the Switch): bytes of connections that ended before are not included.

Labels are bounded. ``state``, ``direction``, ``channel`` (this node's own channels) and
``stage`` have fixed value sets; ``reason``, ``error``, ``outcome``, ``result``,
``method`` come from mconn's own code (class names, close codes), and each metric
keeps at most ``MAX_LABEL_VALUES`` of them, counting the rest as ``other``. Node ids of
peers appear only with ``per_peer`` (``Config.metrics_per_peer``, or
``StatusService(..., per_peer_metrics=True)``): a node with 10,000 peers then exposes
10,000 series per per-peer metric.

Every series of a known label value exists from the first scrape, at 0: the directions,
states and channels, and the values mconn's code can give (``KNOWN_LABELS``: the error
classes of each kind, the close codes of refusals, dial results...). A series that appears
with its first event has no earlier sample to compare with, so ``increase()`` and
``rate()`` read 0 for that first event and an alert on them misses it.

Link failures and the peer's misbehaviour are counted apart (``mconn.errors`` kinds):
``mconn_link_failures_total{error}`` counts connections that ended for a link failure
(``connection_lost`` with ``reason_kind`` ``link``: PongTimeout, HandshakeTimeout,
ConnectionLost...), ``mconn_protocol_errors_total{error}`` the ``protocol_error`` events,
which are misbehaviour only.
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import NamedTuple, cast

import twisted
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from twisted.logger import ILogObserver, Logger, globalLogPublisher

from mconn import errors
from mconn.core.channel import SendDelay, send_delay_of, watch_send_delay
from mconn.switch.reactor import reactor_name

log = Logger(namespace="mconn.metrics")

#: Metric names starting so are mconn's own; a reactor may not register one.
RESERVED_PREFIX = "mconn_"

#: Distinct values one event-derived label keeps per metric; past it values count as "other".
MAX_LABEL_VALUES = 64
#: Upper bounds (seconds) of the round-trip buckets.
ROUND_TRIP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STATES = ("connected", "suspended", "connecting")
DIRECTIONS = ("inbound", "outbound")


def error_classes(kind: str) -> tuple[str, ...]:
    """The names of mconn's error classes of ``kind`` (``mconn.errors.LINK``...), sorted."""
    return tuple(
        sorted(
            name
            for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, errors.MConnError) and value.kind == kind
        )
    )


#: The close codes a refusal can have (``Switch.refusals``, specs/telemetry.md
#: ``peer_rejected`` and ``connection_refused``).
REFUSAL_REASONS = (
    "authorize_timeout",
    "banned",
    "duplicate",
    "duplicate_ip",
    "id_mismatch",
    "inbound_limit",
    "ip_limit",
    "malformed_pre_hello",
    "network_mismatch",
    "no_common_channel",
    "node_info_missing",
    "outbound_limit",
    "pending_evicted",
    "pending_group_limit",
    "pending_limit",
    "self",
    "session_held",
    "simultaneous_dial",
    "tls_required",
    "unauthorized",
    "unproven",
    "version_mismatch",
)
#: The reasons a session can end with (specs/reactor-api.md section 7.1).
SESSION_END_REASONS = tuple(
    sorted(
        {"SessionExpired", "SessionRejected", "PeerClosed", "ConnectionClosed", "ReactorError"}
        | set(error_classes(errors.LINK))
        | set(error_classes(errors.MISBEHAVIOUR))
    )
)
#: label -> the values mconn's code gives it, whose series exist at 0 from the start.
KNOWN_LABELS: dict[str, tuple[str, ...]] = {
    "direction": DIRECTIONS,
    "outcome": ("refused", "replaced"),
    "result": ("connected", "failed", "not_retried"),
    "method": (
        "add_peer",
        "receive",
        "routine",
        "remove_peer",
        "peer_suspended",
        "peer_resumed",
        "start_reactor",
        "stop_reactor",
    ),
}


class Counted(NamedTuple):
    """An event-derived counter: which telemetry events it counts, by which label."""

    event: str
    #: The label, or None for a counter without one.
    label: str | None
    #: The event field holding the label's value.
    field: str | None
    help: str
    #: The label values whose series exist at 0 from the start.
    known: tuple[str, ...] = ()
    #: (field, value) an event must have to count, or None: every event of its name.
    only: tuple[str, str] | None = None


#: Event-derived counters: name -> what it counts.
EVENT_COUNTERS = {
    "mconn_connections_opened": Counted(
        "connection_made", "direction", "direction", "Transports made, by direction.", DIRECTIONS
    ),
    "mconn_connections_closed": Counted(
        "connection_lost", "direction", "direction", "Transports ended, by direction.", DIRECTIONS
    ),
    "mconn_sessions_started": Counted(
        "session_started", "direction", "direction", "Sessions started, by who dialed.", DIRECTIONS
    ),
    "mconn_sessions_suspended": Counted("session_suspended", None, None, "Sessions suspended: the transport broke."),
    "mconn_session_resumes": Counted("session_resumed", None, None, "Sessions resumed on a new transport."),
    "mconn_sessions_ended": Counted(
        "session_ended", "reason", "reason_type", "Sessions ended, by the class of the reason.", SESSION_END_REASONS
    ),
    "mconn_protocol_errors": Counted(
        "protocol_error",
        "error",
        "error_type",
        "The peers' misbehaviour (protocol errors), by error class; link failures are not counted here.",
        error_classes(errors.MISBEHAVIOUR),
    ),
    "mconn_link_failures": Counted(
        "connection_lost",
        "error",
        "reason_type",
        "Connections ended by a link failure (PongTimeout, HandshakeTimeout, ConnectionLost...), by error class.",
        error_classes(errors.LINK),
        only=("reason_kind", errors.LINK),
    ),
    "mconn_duplicate_connections": Counted(
        "duplicate_connection",
        "outcome",
        "outcome",
        "Second connections from a node, by outcome.",
        KNOWN_LABELS["outcome"],
    ),
    "mconn_dial_attempts": Counted(
        "dial_attempt", "result", "result", "Dial attempts, by result.", KNOWN_LABELS["result"]
    ),
    "mconn_reactor_errors": Counted(
        "reactor_error", "method", "method", "Reactor callbacks that raised, by method.", KNOWN_LABELS["method"]
    ),
    "mconn_loop_stalls": Counted("loop_stalled", None, None, "Event loop stalls seen by a keepalive verdict."),
}


def build_versions() -> tuple[str, str, str]:
    """(mconn's version, Python's, Twisted's): ``mconn_build_info``'s labels."""
    try:
        version = importlib.metadata.version("mconn")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        version = "unknown"
    return version, platform.python_version(), twisted.__version__


def channel_label(channel_id: int) -> str:
    """The ``channel`` label of a channel id: ``0x20``."""
    return f"{channel_id:#04x}"


class EventTotals:
    """What ended, from one node's telemetry events (see the theory of operation)."""

    def __init__(self, switch) -> None:
        self.switch = switch
        #: Wire bytes sent and received by connections that ended.
        self.bytes_sent = 0
        self.bytes_received = 0
        #: channel id -> [bytes sent, messages sent, bytes received, messages received]
        #: of connections that ended.
        self.channels: dict[int, list[int]] = {}
        #: metric name -> {label value (or None): count}; the known values at 0 from the start.
        self.counts: dict[str, dict] = {
            name: (dict.fromkeys(counted.known, 0) if counted.label is not None else {None: 0})
            for name, counted in EVENT_COUNTERS.items()
        }
        self.messages_resent = 0
        self.grace_expiries = 0
        #: event name -> [(metric name, Counted)]; looked up with whatever an event's ``event`` holds.
        self._by_event: dict[object, list[tuple[str, Counted]]] = {}
        for name, counted in EVENT_COUNTERS.items():
            self._by_event.setdefault(counted.event, []).append((name, counted))
        self._observing = False

    def start(self) -> None:
        if not self._observing:
            globalLogPublisher.addObserver(cast(ILogObserver, self.observe))
            self._observing = True

    def stop(self) -> None:
        if self._observing:
            globalLogPublisher.removeObserver(cast(ILogObserver, self.observe))
            self._observing = False

    def observe(self, event: dict) -> None:
        """A log observer: counts this node's telemetry events, ignores everything else."""
        if event.get("log_namespace") != "mconn":
            return
        entries = self._by_event.get(event.get("event"))
        if entries is None or event.get("node_id") != self.switch.node_id:
            return
        for name, counted in entries:
            if counted.only is not None and event.get(counted.only[0]) != counted.only[1]:
                continue
            value = None if counted.field is None else str(event.get(counted.field))
            counts = self.counts[name]
            if value not in counts and len(counts) - ("other" in counts) >= MAX_LABEL_VALUES - 1:
                value = "other"  # one slot is kept for it
            counts[value] = counts.get(value, 0) + 1
        kind = event["event"]
        if kind == "connection_lost":
            self._ended_connection(event)
        elif kind == "session_resumed":
            self.messages_resent += int(event.get("resent", 0))
        elif kind == "session_ended" and event.get("reason_type") == "SessionExpired":
            self.grace_expiries += 1

    def _ended_connection(self, event: dict) -> None:
        self.bytes_sent += int(event.get("bytes_sent", 0))
        self.bytes_received += int(event.get("bytes_received", 0))
        own = {d.id for d in self.switch.channels}
        for c in event.get("channels", ()):
            channel_id = c.get("channel_id")
            if channel_id not in own:
                continue
            row = self.channels.setdefault(channel_id, [0, 0, 0, 0])
            row[0] += int(c["bytes_sent"])
            row[1] += int(c["messages_sent"])
            row[2] += int(c["bytes_received"])
            row[3] += int(c["messages_received"])


class SwitchCollector:
    """A prometheus_client collector reading one Switch at scrape time."""

    def __init__(
        self, switch, totals: EventTotals, *, per_peer: bool | None = None, send_delays: dict | None = None
    ) -> None:
        self.switch = switch
        self.totals = totals
        self._per_peer = per_peer
        #: channel id -> the SendDelay its connections' channels sample into.
        self.send_delays: dict[int, SendDelay] = send_delays if send_delays is not None else {}

    @property
    def per_peer(self) -> bool:
        """Series labelled by peer node id: the constructor's choice, else
        ``Config.metrics_per_peer`` as the Switch has it now (off by default)."""
        if self._per_peer is not None:
            return bool(self._per_peer)
        return bool(self.switch.config.metrics_per_peer)

    def describe(self):
        return []  # names are not checked against other collectors: the registry is ours alone

    def collect(self):
        switch = self.switch
        yield node_info(switch)
        build = GaugeMetricFamily(
            "mconn_build_info",
            "The software this node runs: mconn's, Python's and Twisted's versions; always 1.",
            labels=("version", "python", "twisted"),
        )
        build.add_metric(build_versions(), 1)
        yield build
        yield channel_info(switch)
        yield from self._connections()
        yield from self._peers()
        yield from self._events()
        refusals = CounterMetricFamily(
            "mconn_refusals", "Connections refused, by reason (Switch.refusals).", labels=("reason",)
        )
        for reason, count in _bounded(switch.refusals.items(), known=REFUSAL_REASONS):
            refusals.add_metric((reason,), count)
        yield refusals
        if self.per_peer:
            yield from per_peer_metrics(switch)
        yield send_delay_histogram(self.send_delays)

    def _connections(self):
        """Live connections: counts, wire and channel counters (plus those that ended), queues."""
        ids = [d.id for d in self.switch.channels]
        live, sent, received, channels = _sum_connections(self.switch, self.totals, ids)
        gauge = GaugeMetricFamily(
            "mconn_connections",
            "Live transports, by direction and stage (handshaking, established: carrying a session, or closing).",
            labels=("direction", "stage"),
        )
        for labels, count in live.items():
            gauge.add_metric(labels, count)
        yield gauge
        yield CounterMetricFamily("mconn_sent_bytes", "Wire bytes written, all connections.", value=sent)
        yield CounterMetricFamily("mconn_received_bytes", "Wire bytes read, all connections.", value=received)
        for i, (name, kind, help_text) in enumerate(CHANNEL_METRICS):
            family = kind(name, help_text, labels=("channel",))
            for c in ids:
                family.add_metric((channel_label(c),), channels[c][i])
            yield family

    def _peers(self):
        """Sessions by state, recovery buffers, unconfirmed messages, round trips."""
        switch = self.switch
        ids = [d.id for d in switch.channels]
        states = {(s, d): 0 for s in STATES for d in DIRECTIONS}
        unconfirmed = dict.fromkeys(ids, 0)
        buffered = 0
        round_trips = []
        for peer in list(switch.peers.values()):
            key = (peer.state.value, "outbound" if peer.is_outbound else "inbound")
            if key in states:
                states[key] += 1
            session = peer.session
            buffered += session.unacked_bytes
            for c in session.channel_ids:
                if c in unconfirmed:
                    unconfirmed[c] += session.accepted(c) - session.acked(c)
            if peer.round_trip is not None and key[0] == "connected":
                round_trips.append(peer.round_trip)
        gauge = GaugeMetricFamily("mconn_peers", "Sessions, by state and by who dialed.", labels=("state", "direction"))
        for labels, count in states.items():
            gauge.add_metric(labels, count)
        yield gauge
        yield GaugeMetricFamily(
            "mconn_recovery_buffer_bytes",
            "Bytes of accepted messages not yet confirmed by the peer, all sessions.",
            value=buffered,
        )
        yield GaugeMetricFamily(
            "mconn_recovery_buffer_limit_bytes",
            "The node's bound on mconn_recovery_buffer_bytes (Config.max_unacked_bytes): full, sends wait.",
            value=switch.config.max_unacked_bytes,
        )
        family = GaugeMetricFamily(
            "mconn_channel_unconfirmed_messages",
            "Messages accepted and not yet confirmed delivered, all sessions.",
            labels=("channel",),
        )
        for c in ids:
            family.add_metric((channel_label(c),), unconfirmed[c])
        yield family
        yield round_trip_histogram(round_trips)

    def _events(self):
        totals = self.totals
        for name, counted in EVENT_COUNTERS.items():
            counts = totals.counts[name]
            if counted.label is None:
                yield CounterMetricFamily(name, counted.help, value=counts.get(None, 0))
                continue
            family = CounterMetricFamily(name, counted.help, labels=(counted.label,))
            for value, count in sorted(counts.items()):
                family.add_metric((value,), count)
            yield family
        yield CounterMetricFamily(
            "mconn_messages_resent", "Messages sent again after resumes.", value=totals.messages_resent
        )
        yield CounterMetricFamily(
            "mconn_session_grace_expiries",
            "Suspended sessions that outlived resume_grace.",
            value=totals.grace_expiries,
        )


#: Per-channel families, in the order of the rows ``_sum_connections`` adds up.
CHANNEL_METRICS = (
    ("mconn_channel_sent_bytes", CounterMetricFamily, "Msg packet bytes sent on the channel, headers included."),
    ("mconn_channel_sent_messages", CounterMetricFamily, "Whole messages sent on the channel."),
    ("mconn_channel_received_bytes", CounterMetricFamily, "Message payload bytes received on the channel."),
    ("mconn_channel_received_messages", CounterMetricFamily, "Whole messages received on the channel."),
    ("mconn_channel_queued_messages", GaugeMetricFamily, "Messages queued to send on the channel, live connections."),
)
STAGES = ("handshaking", "established", "closing")


def _sum_connections(switch, totals: EventTotals, ids: list[int]):
    """(live connections by (direction, stage), wire bytes sent, received, {channel id:
    [bytes sent, messages sent, bytes received, messages received, queued]}), the
    counters of ended connections included."""
    channels = {c: [*totals.channels.get(c, (0, 0, 0, 0)), 0] for c in ids}
    sent, received = totals.bytes_sent, totals.bytes_received
    live = {(d, s): 0 for d in DIRECTIONS for s in STAGES}
    for proto in list(switch.connections):
        core = proto.core
        if core is None:
            continue
        stage = "established" if proto.peer is not None else "closing" if proto.handshake_ended else "handshaking"
        live[("outbound" if proto.context.is_outbound else "inbound", stage)] += 1
        sent += core.bytes_sent
        received += core.bytes_received
        for channel in core.channels.values():
            row, stats = channels.get(channel.id), channel.stats
            if row is not None:
                row[0] += stats.bytes_sent
                row[1] += stats.messages_sent
                row[2] += stats.bytes_received
                row[3] += stats.messages_received
                row[4] += channel.queue_depth
    return live, sent, received, channels


def round_trip_histogram(round_trips: list[float]) -> GaugeHistogramMetricFamily:
    """Connected peers by their last measured round trip, now (a gauge histogram)."""
    counts = [0] * (len(ROUND_TRIP_BUCKETS) + 1)
    for rtt in round_trips:
        for i, bound in enumerate(ROUND_TRIP_BUCKETS):
            if rtt <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    buckets, running = [], 0
    for label, count in zip((*(repr(b) for b in ROUND_TRIP_BUCKETS), "+Inf"), counts, strict=True):
        running += count
        buckets.append((label, running))
    return GaugeHistogramMetricFamily(
        "mconn_peer_round_trip_seconds",
        "Connected peers by their last measured ping round trip, seconds.",
        buckets=buckets,
        gsum_value=float(sum(round_trips)),
    )


def send_delay_histogram(send_delays: dict[int, SendDelay]) -> HistogramMetricFamily:
    """``mconn_channel_send_queue_seconds``: each channel's sampled send-queue delays."""
    family = HistogramMetricFamily(
        "mconn_channel_send_queue_seconds",
        "Seconds from a sampled message's queueing to its last packet handed to the transport.",
        labels=("channel",),
    )
    for channel_id, delay in send_delays.items():
        buckets = [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in delay.cumulative()]
        family.add_metric((channel_label(channel_id),), buckets, sum_value=delay.total)
    return family


class ReactorRegistry(CollectorRegistry):
    """The registry ``Reactor.metrics(registry)`` gets: a prometheus_client
    ``CollectorRegistry`` whose collectors the node's ``/metrics`` serves after mconn's own.

    ``register`` refuses a collector with a family named ``mconn_...`` (ValueError naming
    the reactor and the names), as it refuses a name registered twice. At a scrape, a
    collector that raises is logged and left out, and families named ``mconn_...`` are
    dropped, so a reactor can neither break nor forge the node's own metrics.
    """

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        #: The name of the reactor whose hook is running (error messages name it).
        self.owner: str | None = None
        self._owned: list[tuple[object, str | None]] = []

    def register(self, collector) -> None:
        describe = getattr(collector, "describe", None) or collector.collect
        reserved = sorted({f.name for f in describe() if f.name.startswith(RESERVED_PREFIX)})
        if reserved:
            raise ValueError(
                f"reactor {self.owner!r} registers {', '.join(reserved)}: metric names starting "
                f"{RESERVED_PREFIX!r} are mconn's own"
            )
        super().register(collector)
        self._owned.append((collector, self.owner))

    def unregister(self, collector) -> None:
        super().unregister(collector)
        self._owned = [(c, owner) for c, owner in self._owned if c is not collector]

    def collect(self):
        for collector, owner in list(self._owned):
            try:
                families = list(collector.collect())
            except Exception:
                log.failure("a metrics collector of reactor {reactor} failed; left out of this scrape", reactor=owner)
                continue
            for family in families:
                if not family.name.startswith(RESERVED_PREFIX):
                    yield family


def per_peer_metrics(switch):
    """The opt-in per-peer series, labelled by the peer's node id."""
    up = GaugeMetricFamily(
        "mconn_peer_up", "1 for each session, with its state and who dialed.", labels=("peer", "state", "direction")
    )
    rtt = GaugeMetricFamily(
        "mconn_peer_last_round_trip_seconds", "The peer's last measured ping round trip.", labels=("peer",)
    )
    sent = CounterMetricFamily(
        "mconn_peer_sent_bytes", "Wire bytes sent on the session's current transport.", labels=("peer",)
    )
    received = CounterMetricFamily(
        "mconn_peer_received_bytes", "Wire bytes received on the session's current transport.", labels=("peer",)
    )
    buffered = GaugeMetricFamily(
        "mconn_peer_recovery_buffer_bytes", "Bytes not yet confirmed by the peer.", labels=("peer",)
    )
    resumes = CounterMetricFamily("mconn_peer_resumes", "Times this session was resumed.", labels=("peer",))
    for node_id, peer in sorted(switch.peers.items()):
        proto = peer.connection
        core = proto.core if proto is not None else None
        up.add_metric((node_id, peer.state.value, "outbound" if peer.is_outbound else "inbound"), 1)
        if peer.round_trip is not None:
            rtt.add_metric((node_id,), peer.round_trip)
        sent.add_metric((node_id,), core.bytes_sent if core is not None else 0)
        received.add_metric((node_id,), core.bytes_received if core is not None else 0)
        buffered.add_metric((node_id,), peer.session.unacked_bytes)
        resumes.add_metric((node_id,), peer.resumes)
    return [up, rtt, sent, received, buffered, resumes]


def _bounded(items, known: tuple[str, ...] = ()):
    """(label value, count) pairs, at most MAX_LABEL_VALUES of them; the rest summed as
    "other". The ``known`` values are always there (at 0 if absent), and kept first."""
    counts = {**dict.fromkeys(known, 0), **{str(k): v for k, v in items}}
    first = [(k, counts.pop(k)) for k in known]
    items = first + sorted(counts.items())
    if len(items) <= MAX_LABEL_VALUES:
        return sorted(items)
    kept = items[: MAX_LABEL_VALUES - 1]
    return sorted(kept) + [("other", sum(v for _, v in items[MAX_LABEL_VALUES - 1 :]))]


def node_info(switch) -> GaugeMetricFamily:
    """``mconn_node_info``: this node's id, TLS mode and what its node info announces."""
    info = GaugeMetricFamily(
        "mconn_node_info",
        "This node: its id, TLS mode, and its node info's moniker, network and software version; always 1.",
        labels=("node_id", "tls", "moniker", "network", "version"),
    )
    tls = getattr(switch, "tls", None)
    announced = getattr(switch, "node_info", None)
    info.add_metric(
        (
            switch.node_id,
            tls.mode if tls is not None else "off",
            announced.moniker if announced is not None else "",
            announced.network if announced is not None else "",
            announced.version if announced is not None else "",
        ),
        1,
    )
    return info


def channel_info(switch) -> GaugeMetricFamily:
    """``mconn_channel_info``: each channel of this node with its name (``ChannelDescriptor.name``)."""
    family = GaugeMetricFamily(
        "mconn_channel_info",
        "Each channel of this node, with its name (empty if its descriptor has none); always 1.",
        labels=("channel", "name"),
    )
    for desc in switch.channels:
        family.add_metric((channel_label(desc.id), getattr(desc, "name", "")), 1)
    return family


class SwitchMetrics:
    """The registry of one Switch, and what keeps its totals.

    :param per_peer: add the per-peer series, labelled by the peer's node id; None:
        ``Config.metrics_per_peer`` (off by default: a node with 10,000 peers would
        expose 10,000 series per metric).
    """

    def __init__(self, switch, *, per_peer: bool | None = None) -> None:
        self.switch = switch
        self.totals = EventTotals(switch)
        #: channel id -> SendDelay (``mconn_channel_send_queue_seconds``), sampled while started.
        self.send_delays = {d.id: SendDelay(switch.clock.seconds) for d in switch.channels}
        self._watching: list = []
        self.collector = SwitchCollector(switch, self.totals, per_peer=per_peer, send_delays=self.send_delays)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        #: What the reactors registered (``Reactor.metrics``), served after mconn's own.
        self.reactor_registry = ReactorRegistry()
        self.registry.register(self.reactor_registry)
        for reactor in switch.reactors:
            self.reactor_registry.owner = name = reactor_name(reactor)
            try:
                reactor.metrics(self.reactor_registry)
            except Exception:
                log.failure("the metrics hook of reactor {reactor} failed", reactor=name)
        self.reactor_registry.owner = None

    def start(self) -> None:
        """Count the node's events, and sample send-queue delays, from now on."""
        self.totals.start()
        if self._watching:
            return
        for desc in self.switch.channels:
            current = send_delay_of(desc)
            if current is not None:  # another SwitchMetrics of this Switch samples already
                self.send_delays[desc.id] = current
                continue
            watch_send_delay(desc, self.send_delays[desc.id])
            self._watching.append(desc)
        self._set_live(lambda channel: channel.send_delay is None)

    def stop(self) -> None:
        self.totals.stop()
        ours = {id(self.send_delays[desc.id]) for desc in self._watching}
        for desc in self._watching:
            watch_send_delay(desc, None)
        self._watching = []
        self._set_live(lambda channel: id(channel.send_delay) in ours, clear=True)

    def _set_live(self, which, clear: bool = False) -> None:
        """Give the channels of live connections their SendDelay (or take it back)."""
        for proto in list(self.switch.connections):
            core = proto.core
            if core is None:
                continue
            for channel in core.channels.values():
                if channel.id in self.send_delays and which(channel):
                    channel.set_send_delay(None if clear else self.send_delays[channel.id])

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) for a scrape: OpenMetrics if ``accept`` asks for it, else
        Prometheus' text format 0.0.4."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


__all__ = [
    "SwitchMetrics",
    "SwitchCollector",
    "EventTotals",
    "ReactorRegistry",
    "channel_label",
    "MAX_LABEL_VALUES",
    "RESERVED_PREFIX",
]
