"""The status page of a node: an HTML overview at ``/``, ``/status.json`` and Prometheus
``/metrics`` (specs/status.md).

``StatusService(switch, "tcp:8080")`` serves them with twisted.web. The page is
self-contained (inline CSS and JavaScript, no external fetches, enforced by its
Content-Security-Policy): it fetches ``status.json`` every second and redraws a table of
the peers and their channels, with inline SVG sparklines of each channel's send and
receive rates. ``/status.json`` is the same data for programs (``mconn status URL``).
The document and the page say which per-packet path the node runs (``hot_path``: the
compiled twin, "accelerated", or "pure Python" and why: mconn.core.speedups), and which
copies WebSocket frames run on (``ws_frames``: mconn.net.websocket_frames).
``/metrics`` is the node's Prometheus metrics (``mconn.ops.metrics``), rendered in the
reactor thread (prometheus_client's own twisted resource would read the Switch from a
thread pool).

An endpoint that names no interface (``tcp:8080``) listens on 127.0.0.1 only (``::1``
for ``tcp6``): the page is for the operator on the machine, or behind a proxy. Exposing
it is explicit: ``tcp:8080:interface=0.0.0.0``. The document holds node ids, addresses
and counters; never key material, certificates or file paths.

Theory of operation
-------------------
A ``RateSampler`` on the Switch's clock reads every peer's ``stats`` once per interval
and turns the byte counters into rates (bytes/s) from the difference with the previous
sample. The counters belong to a connection, so they restart from zero when a session
resumes on a new one; a counter that went down is taken as restarted, and its value is
the bytes since then. Each peer and channel keeps its last ``samples`` rates in a
bounded deque; a peer's history is forgotten when its session ends.

Reactors' sections: each reactor whose ``status()`` returns a dict gets one, in the
document's ``reactors`` and on the page. What a reactor returns is bounded before it is
served (``reactor_status``): at most ``STATUS_ROWS`` keys, each key a string of at most
``STATUS_KEY_CHARS``, each value a number, bool, null or a string of at most
``STATUS_TEXT_CHARS`` (a list or dict is written as compact JSON of its first
``STATUS_ITEMS`` items, and cut). A ``status()`` that raises shows its error instead. The
page writes every value as text (``textContent``), never as HTML.
"""

from __future__ import annotations

import collections
import itertools
import json
import time

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web import pages, resource, server

from mconn.core import speedups
from mconn.core.node_info import display_name
from mconn.ops.metrics import SwitchMetrics
from mconn.ops.status_page import PAGE
from mconn.net import websocket_frames
from mconn.net.websocket_endpoints import transport_kind
from mconn.switch.reactor import reactor_name

log = Logger(namespace="mconn.status")

#: Version of the ``/status.json`` document (specs/status.md).
STATUS_VERSION = 1
#: Seconds between two rate samples, and how many samples each sparkline shows.
SAMPLE_INTERVAL = 1.0
SAMPLES = 60
#: Bounds of a reactor's section (``Reactor.status()``): keys, characters of a key and of
#: a text value, and items of a list or dict written out.
STATUS_ROWS = 32
STATUS_KEY_CHARS = 64
STATUS_TEXT_CHARS = 256
STATUS_ITEMS = 16
#: Interfaces an endpoint without ``interface=`` listens on.
DEFAULT_INTERFACES = {"tcp": "127.0.0.1", "tcp6": "::1", "ssl": "127.0.0.1"}


def local_endpoint(description: str) -> str:
    """``description`` with ``interface=127.0.0.1`` (``::1`` for tcp6) added if it has none.

    Endpoint kinds without an interface (``unix:``...) are returned as they are.
    """
    kind, colon, rest = description.partition(":")
    interface = DEFAULT_INTERFACES.get(kind.strip().lower())
    if not colon or interface is None or "interface=" in rest:
        return description
    escaped = interface.replace(":", "\\:")
    return f"{description}:interface={escaped}"


# -- rates -------------------------------------------------------------------------------


class _Rates:
    """Send and receive rates of one counter pair: the last value, and a bounded history."""

    def __init__(self, samples: int) -> None:
        self.last: tuple[int, int] | None = None
        self.send: collections.deque[float] = collections.deque(maxlen=samples)
        self.receive: collections.deque[float] = collections.deque(maxlen=samples)

    def add(self, sent: int, received: int, elapsed: float) -> None:
        if self.last is not None and elapsed > 0:
            self.send.append(_delta(self.last[0], sent) / elapsed)
            self.receive.append(_delta(self.last[1], received) / elapsed)
        self.last = (sent, received)

    def as_fields(self) -> dict:
        return {
            "send_rate": float(self.send[-1]) if self.send else 0.0,
            "receive_rate": float(self.receive[-1]) if self.receive else 0.0,
            "send_history": [round(float(r), 1) for r in self.send],
            "receive_history": [round(float(r), 1) for r in self.receive],
        }


def _delta(before: int, now: int) -> int:
    """Bytes counted since ``before``; a counter that went down restarted from zero."""
    return now - before if now >= before else now


class RateSampler:
    """Samples every peer's byte counters each ``interval`` seconds on the Switch's clock."""

    def __init__(self, switch, *, interval: float = SAMPLE_INTERVAL, samples: int = SAMPLES) -> None:
        self.switch = switch
        self.interval = float(interval)
        self.samples = samples
        #: (node id, channel id or None for the peer's total) -> _Rates.
        self.rates: dict[tuple, _Rates] = {}
        self._peers: dict[str, object] = {}  # node id -> the Peer sampled (a new session starts afresh)
        self._last_time: float | None = None
        self._loop = LoopingCall(self.sample)
        self._loop.clock = switch.clock

    def start(self) -> None:
        if not self._loop.running:
            self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def sample(self) -> None:
        now = self.switch.clock.seconds()
        elapsed = now - self._last_time if self._last_time is not None else 0.0
        self._last_time = now
        peers = dict(self.switch.peers)
        for key in [k for k in self.rates if self._peers.get(k[0]) is not peers.get(k[0])]:
            del self.rates[key]  # the session ended, or a new one replaced it
        self._peers = peers
        for node_id, peer in peers.items():
            stats = peer.stats
            self._rates(node_id, None).add(stats.bytes_sent, stats.bytes_received, elapsed)
            for c in stats.channels:
                self._rates(node_id, c.channel_id).add(c.bytes_sent, c.bytes_received, elapsed)

    def _rates(self, node_id: str, channel_id: int | None) -> _Rates:
        rates = self.rates.get((node_id, channel_id))
        if rates is None:
            rates = self.rates[(node_id, channel_id)] = _Rates(self.samples)
        return rates

    def fields(self, node_id: str, channel_id: int | None) -> dict:
        rates = self.rates.get((node_id, channel_id))
        return (rates if rates is not None else _Rates(0)).as_fields()


# -- the document --------------------------------------------------------------------------


def status_document(switch, sampler: RateSampler, listen_addresses) -> dict:
    """The ``/status.json`` document (specs/status.md section 2)."""
    tls = getattr(switch, "tls", None)
    moniker = _moniker(getattr(switch, "node_info", None))
    return {
        "version": STATUS_VERSION,
        "node_id": switch.node_id,
        "moniker": moniker,
        "name": display_name(switch.node_id, moniker),
        "time": time.time(),
        "listen_addresses": list(listen_addresses()),
        "tls": tls.mode if tls is not None else None,
        # Which per-packet path this process runs, as ``mconn --version`` says it.
        "hot_path": speedups.IMPLEMENTATION,
        "hot_path_why": speedups.WHY_PURE or None,
        # Which copies WebSocket frames run on (mconn/net/_wsframe.pyx or pure Python).
        "ws_frames": websocket_frames.IMPLEMENTATION,
        "ws_frames_why": websocket_frames.WSFRAME_WHY or None,
        "sample_interval": sampler.interval,
        "sample_slots": sampler.samples,
        "peers": [_peer_fields(peer, sampler) for _, peer in sorted(switch.peers.items())],
        "node_counters": [
            {"node_id": node_id, **{name: int(v) for name, v in counters.items()}}
            for node_id, counters in sorted(switch.node_counters.items())
        ],
        "refusals": {reason: int(count) for reason, count in sorted(switch.refusals.items())},
        "reactors": reactor_sections(switch),
    }


def reactor_sections(switch) -> list[dict]:
    """``[{"name": ..., "status": {...}}]`` of every reactor whose ``status()`` is not None,
    in the Switch's order, each bounded by :func:`reactor_status`."""
    sections = []
    for reactor in switch.reactors:
        status_of = getattr(reactor, "status", None)
        if status_of is None:
            continue
        try:
            status = status_of()
        except Exception as e:
            status = {"error": f"{type(e).__name__}: {e}"}
        if status is None:
            continue
        sections.append({"name": reactor_name(reactor), "status": reactor_status(status)})
    return sections


def reactor_status(status) -> dict:
    """A reactor's ``status()`` made safe to serve: at most STATUS_ROWS string keys, each
    value a number, bool, null or a string of at most STATUS_TEXT_CHARS."""
    if not isinstance(status, dict):
        return {"error": _cut(f"status() returned a {type(status).__name__}, not a dict")}
    out: dict[str, object] = {}
    for i, (key, value) in enumerate(status.items()):
        if i == STATUS_ROWS:
            out["..."] = f"{len(status) - STATUS_ROWS} more"
            break
        out[str(key)[:STATUS_KEY_CHARS]] = _cell(value)
    return out


def _cell(value):
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)  # JSON has no nan, inf
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, dict):
        items = list(itertools.islice(value.items(), STATUS_ITEMS))
        text = json.dumps({str(k): v for k, v in items}, separators=(",", ":"), default=str)
        more = len(value) - len(items)
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(itertools.islice(value, STATUS_ITEMS))
        text = json.dumps(items, separators=(",", ":"), default=str)
        more = len(value) - len(items)
    else:
        return _cut(str(value))
    return _cut(text + (f" (+{more} more)" if more else ""))


def _cut(text: str) -> str:
    return text if len(text) <= STATUS_TEXT_CHARS else text[: STATUS_TEXT_CHARS - 1] + "\u2026"


def _transport(peer) -> str | None:
    """What carries the peer's connection (``tcp``, ``tls``, ``ws``, ``wss``, ``ws+tls``),
    or None while it has none (specs/websocket.md section 7)."""
    protocol = peer.connection
    return transport_kind(protocol.transport) if protocol is not None and protocol.transport is not None else None


def _moniker(node_info) -> str:
    """The moniker of a node info, "" for none."""
    return node_info.moniker if node_info is not None else ""


def _peer_fields(peer, sampler: RateSampler) -> dict:
    stats = peer.stats
    unconfirmed = stats.unconfirmed
    moniker = _moniker(peer.node_info)
    return {
        "node_id": stats.node_id,
        "moniker": moniker,
        "name": display_name(stats.node_id, moniker),
        "state": stats.state,
        "direction": "outbound" if stats.is_outbound else "inbound",
        "remote_address": str(peer.remote_address or ""),
        "transport": _transport(peer),
        "listen_address": str(peer.listen_address or ""),
        "uptime": float(stats.uptime),
        "round_trip": float(stats.round_trip) if stats.round_trip is not None else None,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
        **sampler.fields(stats.node_id, None),
        "connects": stats.connects,
        "disconnects": stats.disconnects,
        "resumes": stats.resumes,
        "messages_resent": stats.messages_resent,
        "unacked_bytes": stats.unacked_bytes,
        "resume_rejections": stats.resume_rejections,
        "grace_expiries": stats.grace_expiries,
        "duplicates_refused": stats.duplicates_refused,
        "duplicates_replaced": stats.duplicates_replaced,
        "simultaneous_dials": stats.simultaneous_dials,
        "channels": [
            {
                "channel_id": c.channel_id,
                "name": c.name,
                "priority": c.priority,
                "queue_depth": c.queue_depth,
                "waiting_sends": c.waiting_sends,
                "bytes_sent": c.bytes_sent,
                "messages_sent": c.messages_sent,
                "bytes_received": c.bytes_received,
                "messages_received": c.messages_received,
                "accepted": c.accepted,
                "acked": c.acked,
                "delivered": c.delivered,
                "unconfirmed": int(unconfirmed.get(c.channel_id, 0)),
                **sampler.fields(stats.node_id, c.channel_id),
            }
            for c in stats.channels
        ],
    }


# -- twisted.web ---------------------------------------------------------------------------

#: The page may load nothing from elsewhere, and talk to this server only.
SECURITY_HEADERS = {
    b"content-security-policy": (
        b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        b"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
    ),
    b"x-content-type-options": b"nosniff",
    b"cache-control": b"no-store",
    b"referrer-policy": b"no-referrer",
}


class StatusJSON(resource.Resource):
    """``/status.json``."""

    isLeaf = True

    def __init__(self, document) -> None:
        super().__init__()
        self._document = document

    def render_GET(self, request) -> bytes:
        for name, value in SECURITY_HEADERS.items():
            request.setHeader(name, value)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self._document(), separators=(",", ":")).encode()


class Metrics(resource.Resource):
    """``/metrics``: Prometheus' text format, or OpenMetrics when the scraper asks for it."""

    isLeaf = True

    def __init__(self, metrics: SwitchMetrics) -> None:
        super().__init__()
        self._metrics = metrics

    def render_GET(self, request) -> bytes:
        accept = request.getHeader(b"accept")
        body, content_type = self._metrics.exposition(accept.decode("latin-1") if accept else None)
        request.setHeader(b"content-type", content_type.encode())
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-content-type-options", b"nosniff")
        return body


class StatusPage(resource.Resource):
    """``/``: the HTML overview; anything else under it is 404 (``/status.json`` is a child)."""

    def render_GET(self, request) -> bytes:
        for name, value in SECURITY_HEADERS.items():
            request.setHeader(name, value)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return PAGE.encode()

    def getChild(self, path: bytes, request):
        if path == b"":
            return self
        return pages.notFound()


class _QuietSite(server.Site):
    """A Site that does not log every request (the page polls once a second)."""

    noisy = False
    displayTracebacks = False

    def log(self, request) -> None:
        pass


def status_site(
    switch, sampler: RateSampler, listen_addresses=None, metrics: SwitchMetrics | None = None
) -> server.Site:
    """The twisted.web Site serving ``/``, ``/status.json`` and ``/metrics`` for ``switch``.

    :param listen_addresses: a callable returning the node's listen addresses (the
        Switch's first one if None).
    :param metrics: the Switch's SwitchMetrics (None: no ``/metrics``).
    """
    if listen_addresses is None:

        def listen_addresses():
            return [switch.listen_address] if switch.listen_address else []

    root = StatusPage()
    root.putChild(b"status.json", StatusJSON(lambda: status_document(switch, sampler, listen_addresses)))
    if metrics is not None:
        root.putChild(b"metrics", Metrics(metrics))
    return _QuietSite(root)


class StatusService(Service):
    """Serves the status page of ``switch`` on a server endpoint, samples rates, and
    counts the node's events for ``/metrics`` while running.

    :param endpoint: a Twisted server endpoint string; without ``interface=`` it listens
        on 127.0.0.1 (:func:`local_endpoint`).
    :param listen_addresses: a callable returning the node's listen addresses.
    :param per_peer_metrics: add series labelled by peer node id to ``/metrics``; None:
        ``Config.metrics_per_peer`` (off by default: specs/status.md section 4).
    """

    def __init__(
        self,
        switch,
        endpoint: str = "tcp:0",
        *,
        listen_addresses=None,
        interval: float = SAMPLE_INTERVAL,
        samples: int = SAMPLES,
        per_peer_metrics: bool | None = None,
    ) -> None:
        self.switch = switch
        self.endpoint = local_endpoint(endpoint)
        self.sampler = RateSampler(switch, interval=interval, samples=samples)
        #: The Switch's Prometheus registry and collector (``/metrics``).
        self.metrics = SwitchMetrics(switch, per_peer=per_peer_metrics)
        self.site = status_site(switch, self.sampler, listen_addresses, self.metrics)
        #: The IListeningPort, once bound.
        self.port = None

    def listen(self) -> defer.Deferred:
        """Bind the endpoint; fires with the port (TCP endpoints fire at once)."""
        endpoint = serverFromString(self.switch.clock, self.endpoint)
        return endpoint.listen(self.site).addCallback(self._listening)

    def _listening(self, port):
        self.port = port
        log.info(
            "mconn status page of node {node_id} on {url} (Prometheus metrics: {metrics_url})",
            node_id=self.switch.node_id,
            url=self.url,
            metrics_url=self.metrics_url,
        )
        return port

    @property
    def metrics_url(self) -> str | None:
        """``http://HOST:PORT/metrics`` once bound (None before)."""
        url = self.url
        return url + "metrics" if url is not None else None

    @property
    def url(self) -> str | None:
        """``http://HOST:PORT/`` once bound (None before)."""
        if self.port is None:
            return None
        host = self.port.getHost()
        if not hasattr(host, "port"):
            return None
        name = f"[{host.host}]" if ":" in host.host else host.host
        return f"http://{name}:{host.port}/"

    def startService(self) -> None:
        super().startService()
        self.sampler.start()
        self.metrics.start()
        if self.port is None:
            self.listen().addErrback(
                lambda f: log.failure("cannot serve the status page on {endpoint}", f, endpoint=self.endpoint)
            )

    def stopService(self) -> defer.Deferred:
        super().stopService()
        self.sampler.stop()
        self.metrics.stop()
        port, self.port = self.port, None
        return defer.maybeDeferred(port.stopListening) if port is not None else defer.succeed(None)


async def serve_status(switch, endpoint: str = "tcp:0:interface=127.0.0.1", **kwargs) -> StatusService:
    """Start a StatusService for ``switch`` in this process (tests, embedding); stop it
    with ``stopService()``. Fires once it listens."""
    service = StatusService(switch, endpoint, **kwargs)
    await service.listen()
    service.startService()
    return service
