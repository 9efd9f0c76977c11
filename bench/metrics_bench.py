"""What Prometheus metrics cost: a scrape with many peers, and the message path.

    .venv/bin/python bench/metrics_bench.py [--peers 2000] [--rounds 5]

One process, no sockets: Switches on ``mconn.testing.MemoryNetwork`` (one Clock; for the
scrape, a ``SortedClock`` that makes 10,000 sessions quick to set up).

1. **Scrape.** One listening Switch with ``--peers`` sessions (each dialer sends it one
   message per channel, so the counters are not all zero). Timed with
   ``time.process_time``, smallest of ``--rounds``: ``generate_latest`` of its
   ``SwitchMetrics`` registry (the default, aggregated series; and with ``per_peer``),
   against the baseline of the same run, the ``/status.json`` document of the same
   Switch (``status_document`` and ``json.dumps``, what the status page already serves).
2. **Message path.** Two Switches; batches of 1000 messages of 100 bytes sent with
   ``try_send_many`` and delivered (``network.flush``), alternately with both Switches'
   ``SwitchMetrics`` started (their log observer on the global publisher) and stopped:
   the smallest CPU per message of each, and the ratio with/without, and how many log
   events the phase produced (each is one call of the observer). mconn counts nothing
   per message for the metrics, so the ratio should be 1 within noise; the same
   alternation with nothing started (an A/A run) shows how large that noise is.
3. **Events.** 20,000 ``channel_stats`` events logged (the most frequent event), with
   and without the observer: the cost it adds to each event it is called for.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import bisect
import json
import time

from prometheus_client import generate_latest
from twisted.internet.base import DelayedCall
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from mconn import ChannelDescriptor, Config, Reactor
from mconn.switch import telemetry
from mconn.ops.metrics import SwitchMetrics
from mconn.ops.status import RateSampler, status_document
from mconn.testing import MemoryNetwork

CHANNELS = (ChannelDescriptor(0x20, priority=1), ChannelDescriptor(0x30, priority=5, send_queue_capacity=2000))
CONFIG = Config(
    stats_interval=0,
    max_inbound_peers=100_000,
    max_connections_per_ip=100_000,
    max_pending_handshakes=100_000,
    max_pending_per_group=100_000,
)


class Sink(Reactor):
    def __init__(self) -> None:
        self.received = 0

    def get_channels(self):
        return list(CHANNELS)

    def receive(self, channel_id, peer, message) -> None:
        self.received += 1


class SortedClock(Clock):
    """``task.Clock`` that inserts each call in order instead of sorting every pending call
    on each ``callLater`` (quadratic with 10,000 peers' timers). Safe here: mconn never
    ``reset()``s a DelayedCall, the one change a sorted insert would miss."""

    def callLater(self, delay, callable, *args, **kw):
        call = DelayedCall(self.seconds() + delay, callable, args, kw, self.calls.remove, lambda c: None, self.seconds)
        bisect.insort(self.calls, call, key=DelayedCall.getTime)  # after calls due at the same time, as Clock
        return call

    def _sortCalls(self) -> None:
        pass  # kept sorted by callLater


def smallest(fn, rounds: int) -> float:
    """The smallest process time of ``fn()`` over ``rounds`` calls, in seconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def scrape_cost(peers: int, rounds: int) -> dict:
    network = MemoryNetwork(SortedClock())
    listener = network.switch([Sink()], config=CONFIG)
    for _ in range(peers):
        dialer = network.switch([Sink()], config=CONFIG)
        link = network.connect(dialer, listener)
        peer = link.peer_of(dialer)
        for d in CHANNELS:
            peer.try_send(d.id, b"x" * 100)
    network.flush()
    assert len(listener.peers) == peers, f"{len(listener.peers)} of {peers} sessions up"
    sampler = RateSampler(listener)
    metrics, per_peer = SwitchMetrics(listener), SwitchMetrics(listener, per_peer=True)
    figures = {
        "status_json_s": smallest(lambda: json.dumps(status_document(listener, sampler, lambda: [])), rounds),
        "scrape_s": smallest(lambda: generate_latest(metrics.registry), rounds),
        "scrape_per_peer_s": smallest(lambda: generate_latest(per_peer.registry), rounds),
        "scrape_bytes": len(generate_latest(metrics.registry)),
        "scrape_per_peer_bytes": len(generate_latest(per_peer.registry)),
    }
    figures["scrape_vs_status_json"] = figures["scrape_s"] / figures["status_json_s"]
    figures["scrape_per_peer_vs_status_json"] = figures["scrape_per_peer_s"] / figures["status_json_s"]
    figures["scrape_us_per_peer"] = figures["scrape_s"] / peers * 1e6
    return figures


def message_cost(batches: int, batch: int = 1000, *, placebo: bool = False) -> dict:
    """CPU per message, alternating batches without and with the metrics started
    (``placebo``: the "with" batches start nothing, an A/A run that shows the noise)."""
    network = MemoryNetwork()
    sink = Sink()
    a, b = network.switch([Sink()], config=CONFIG), network.switch([sink], config=CONFIG)
    peer = network.connect(a, b).peer_of(a)
    metrics = [SwitchMetrics(a), SwitchMetrics(b)]
    events = []  # every log event of the phase: what the metrics' observer would be called for
    globalLogPublisher.addObserver(events.append)
    message = b"m" * 100
    best = {"off": float("inf"), "on": float("inf")}
    for i in range(2 * batches):
        variant = "on" if i % 2 else "off"
        for m in metrics:
            m.start() if variant == "on" and not placebo else m.stop()
        start = time.process_time()
        sent = peer.try_send_many(0x30, [message] * batch)
        network.flush()
        best[variant] = min(best[variant], (time.process_time() - start) / batch)
        assert sent == batch
    for m in metrics:
        m.stop()
    globalLogPublisher.removeObserver(events.append)
    assert sink.received == 2 * batches * batch
    return {
        "message_us_without": best["off"] * 1e6,
        "message_us_with": best["on"] * 1e6,
        "message_with_vs_without": best["on"] / best["off"],
        "log_events_during_messages": len(events),
    }


def event_cost(count: int = 20_000, rounds: int = 5) -> dict:
    """CPU per ``channel_stats`` event logged (the most frequent event: one per busy peer
    and channel each stats tick) with and without one SwitchMetrics' observer."""
    network = MemoryNetwork()
    switch = network.switch([Sink()], config=CONFIG)
    metrics = SwitchMetrics(switch)
    fields = dict(
        peer_id="0" * 40,
        channel_id=0x30,
        priority=5,
        queue_depth=0,
        bytes_sent=1,
        messages_sent=1,
        bytes_received=1,
        messages_received=1,
        accepted=1,
        acked=1,
        delivered=1,
        session_id="00" * 16,
        connection=1,
        round_trip=0.001,
    )

    def emit():
        for _ in range(count):
            telemetry.emit("channel_stats", node_id=switch.node_id, **fields)

    best = {}
    for variant in ("off", "on", "off", "on"):
        metrics.start() if variant == "on" else metrics.stop()
        best[variant] = min(best.get(variant, float("inf")), smallest(emit, rounds) / count)
    metrics.stop()
    return {
        "event_us_without": best["off"] * 1e6,
        "event_us_with": best["on"] * 1e6,
        "event_with_vs_without": best["on"] / best["off"],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=30)
    args = p.parse_args(argv)
    # The message and event phases first: the scrape's 10,000 Switches leave garbage behind
    # whose collection disturbs what follows (a 1.09 ratio once, with 0 events observed).
    placebo = message_cost(args.batches, placebo=True)
    figures = {
        "peers": args.peers,
        **message_cost(args.batches),
        **event_cost(),
        "message_placebo_ratio": placebo["message_with_vs_without"],
    }
    figures.update(scrape_cost(args.peers, args.rounds))
    print(
        f"peers {args.peers}: /status.json {figures['status_json_s'] * 1e3:.1f} ms, "
        f"scrape {figures['scrape_s'] * 1e3:.1f} ms ({figures['scrape_vs_status_json']:.3f} of status.json, "
        f"{figures['scrape_us_per_peer']:.2f} us per peer, {figures['scrape_bytes']} bytes), "
        f"with per-peer series {figures['scrape_per_peer_s'] * 1e3:.1f} ms "
        f"({figures['scrape_per_peer_vs_status_json']:.3f}, {figures['scrape_per_peer_bytes']} bytes)"
    )
    print(
        f"message path, 100-byte messages: {figures['message_us_without']:.2f} us without metrics, "
        f"{figures['message_us_with']:.2f} us with: ratio {figures['message_with_vs_without']:.3f}; "
        f"log events meanwhile (the observer's only work): {figures['log_events_during_messages']}; "
        f"the same alternation starting nothing (noise): {figures['message_placebo_ratio']:.3f}"
    )
    print(
        f"one channel_stats event logged: {figures['event_us_without']:.2f} us without the observer, "
        f"{figures['event_us_with']:.2f} us with: ratio {figures['event_with_vs_without']:.3f}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
