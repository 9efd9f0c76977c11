"""The Reactor contract: what node software subclasses (specs/reactor-api.md).

A Reactor owns one or more channels. The Switch calls ``start_reactor`` once before the
first peer, ``add_peer`` once a peer's handshake is done and before any ``receive`` from
it, ``receive`` for every whole message on the reactor's channels, ``remove_peer`` once
after the last ``receive``, and ``stop_reactor`` once after the last ``remove_peer``.
Sending is done on the Peer (``peer.send`` / ``peer.try_send``) or with
``switch.broadcast``. Methods run in the Twisted reactor thread and should return
quickly; a ``receive`` with slow work returns a Deferred (or is ``async def``) and mconn
holds that peer's later messages on that channel until it fires (section 4.1).

Observability (section 12): ``metrics(registry)`` is called once when the node's
Prometheus metrics are set up, to register the reactor's own collectors; ``status()``
returns a small dict shown as the reactor's own section of the status page and in
``/status.json``. ``MessageCounter`` counts a reactor's messages by type, with a label
set the reactor declares, for both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mconn.core.channel import ChannelDescriptor

#: A Prometheus metric name (without the ``_total`` a counter gets).
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class Reactor:
    """Base class with no-op defaults; override what you need.

    ``switch`` is set by the Switch that the reactor is given to; ``name`` is how
    ``switch.reactor(name)`` finds it (the class name if None).
    """

    switch = None
    name: str | None = None

    def get_channels(self) -> list[ChannelDescriptor]:
        """The channels this reactor owns; their ids must be unique across the Switch."""
        return []

    def start_reactor(self) -> None:
        """Called once by the Switch before its first ``add_peer``: at ``startService``,
        or at the first ``listen``, ``dial`` or session if one comes first."""

    def stop_reactor(self) -> None:
        """Called once by ``stopService`` after every session has ended (the last
        ``remove_peer``), in the reverse order of ``start_reactor``."""

    def add_peer(self, peer) -> None:
        """A peer's handshake is done; it can be sent to from now on."""

    def remove_peer(self, peer, reason) -> None:
        """The peer is gone; ``reason`` is an mconn error saying why."""

    def receive(self, channel_id: int, peer, message: bytes):
        """A whole message arrived from ``peer`` on one of our channels.

        Return None when done, or a Deferred (an ``async def receive`` is wrapped in one):
        until it fires, this peer's later messages on this channel wait (section 4.1).
        """

    def on_error(self, peer, channel_id: int | None, error: Exception) -> str | None:
        """An exception escaped ``add_peer`` (``channel_id`` None) or ``receive``, or the
        Deferred ``receive`` returned failed. Return ``"drop"`` to end the session with a
        ``ReactorError``, ``"log"`` to keep the peer, or None for ``Config.reactor_errors``."""
        return None

    def spawn(self, peer, routine):
        """Run a per-peer routine (a coroutine, e.g. ``self.spawn(peer, self.gossip(peer))``
        in ``add_peer``) until the session ends: it is cancelled then, before
        ``remove_peer``; an exception escaping it is handled like one from ``receive``
        (``on_error`` with ``channel_id`` None). Returns a Deferred firing with its result,
        or None if it was cancelled or failed (section 5.8; ``Peer.spawn``)."""
        return peer.spawn(routine, reactor=self)

    def mark_good(self, peer) -> None:
        """``switch.mark_good(peer)``: another reactor vouches for ``peer`` (an address
        book moves it to its tried table)."""

    def peer_suspended(self, peer) -> None:
        """The peer's transport broke; its session waits ``resume_grace`` to resume."""

    def peer_resumed(self, peer) -> None:
        """The peer's session resumed on a new transport; nothing was lost."""

    def committed_deliveries(self, peer_id: str, session_id: bytes) -> dict[int, int] | None:
        """Called by a Switch with a session store as it restores a session at start
        (specs/resume.md section 9.4): per channel of this reactor, the delivered count
        (``peer.delivery_seq(channel_id).seq``) the reactor committed in its own
        transaction with the effect of that message, for ``peer_id``'s session
        ``session_id``; None (the default) if it keeps none. The Switch restores the larger
        of this and the store's count, so nothing the reactor committed is delivered again."""
        return None

    def metrics(self, registry) -> None:
        """Register this reactor's Prometheus collectors in ``registry`` (a
        ``prometheus_client.CollectorRegistry``, served on the node's ``/metrics``).

        Called once when the node's metrics are set up (a status endpoint); never without
        one. Names starting ``mconn_`` are refused with ValueError (they are mconn's own).
        """

    def status(self) -> dict | None:
        """A small dict of this reactor's state for the status page and ``/status.json``
        (its own section, named after the reactor), or None for no section. Called at
        every fetch of the document (once a second while the page is open): keep it cheap."""
        return None


class MessageCounter:
    """A reactor's messages counted by type and direction, for ``/metrics`` and ``status()``.

    ``types`` is the whole label set, declared once; a type outside it (say, a type byte
    read off the wire) is counted as ``other``, so a peer cannot grow the series. Counting
    is a dict update: nothing is taken from prometheus_client per message. Register the
    counter in ``Reactor.metrics``; it is exposed as ``NAME_total`` with the labels
    ``direction`` (``received``, ``sent``) and ``type``.

    :param name: the metric name, not starting with ``mconn_`` (without ``_total``).
    :param types: the message types, at most :attr:`MAX_TYPES` distinct strings.
    :param documentation: the metric's help text.
    """

    MAX_TYPES = 64
    OTHER = "other"
    DIRECTIONS = ("received", "sent")

    def __init__(self, name: str, types: Iterable[str], documentation: str = "") -> None:
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name) or name.startswith("mconn_"):
            raise ValueError(
                f"MessageCounter name must be a Prometheus metric name not starting 'mconn_', got {name!r}"
            )
        if name.endswith("_total"):
            raise ValueError(f"MessageCounter name {name!r} must not end in '_total' (the counter adds it)")
        declared = list(types)
        if not declared or not all(isinstance(t, str) and t for t in declared):
            raise ValueError(f"MessageCounter {name}: types must be non-empty strings, got {declared!r}")
        if len(set(declared)) != len(declared) or self.OTHER in declared or len(declared) > self.MAX_TYPES:
            raise ValueError(
                f"MessageCounter {name}: types must be at most {self.MAX_TYPES} distinct strings, "
                f"{self.OTHER!r} not among them (it counts the rest); got {declared!r}"
            )
        self.name = name
        self.documentation = documentation or f"Messages by direction and type ({name})."
        self.types = (*declared, self.OTHER)
        #: direction -> {type: count}, every declared type present from the start.
        self.counts: dict[str, dict[str, int]] = {d: dict.fromkeys(self.types, 0) for d in self.DIRECTIONS}

    def received(self, kind: str, n: int = 1) -> None:
        """Count ``n`` messages of type ``kind`` received."""
        counts = self.counts["received"]
        if kind in counts:
            counts[kind] += n
        else:
            counts[self.OTHER] += n

    def sent(self, kind: str, n: int = 1) -> None:
        """Count ``n`` messages of type ``kind`` sent (accepted by mconn)."""
        counts = self.counts["sent"]
        if kind in counts:
            counts[kind] += n
        else:
            counts[self.OTHER] += n

    def as_dict(self) -> dict[str, dict[str, int]]:
        """``{direction: {type: count}}`` without the zeros, for ``status()``."""
        return {d: {t: n for t, n in counts.items() if n} for d, counts in self.counts.items()}

    def describe(self):
        return self._families(zeros=True)

    def collect(self):
        """prometheus_client's collector protocol: one counter family."""
        return self._families(zeros=False)

    def _families(self, zeros: bool):
        from prometheus_client.core import CounterMetricFamily  # only once metrics are set up

        family = CounterMetricFamily(self.name, self.documentation, labels=("direction", "type"))
        for direction, counts in self.counts.items():
            for kind, count in counts.items():
                family.add_metric((direction, kind), 0 if zeros else count)
        return [family]


def reactor_name(reactor) -> str:
    """The name the Switch knows ``reactor`` by: its ``name``, or its class name."""
    return getattr(reactor, "name", None) or type(reactor).__name__
