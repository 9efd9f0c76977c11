"""Durable sessions (specs/resume.md section 9): what the session store costs, and how
fast a killed node's sessions come back.

    .venv/bin/python bench/durable_bench.py [--duration S] [--repeat N] [--restarts N] [--held N]

Throughput. Two Switches in this process over real loopback TCP (127.0.0.1), both with a
session store in a temporary directory, or both without (``memory``, the baseline), in
the same run, alternating which goes first each round. The sender keeps one channel's
queue full with ``try_send`` (``send`` when it is refused, refilling when that fires) for
``duration`` seconds; the receiver counts what its reactor got. Two sizes: 100-byte
messages (messages/s) and 1 MiB messages (MiB/s). Printed: medians over the rounds, the
ratio store/memory of each round's pair (median), and with the store the commits (fsyncs)
per second and messages per commit.

Recovery. A receiver process listens (with a store); a sender process dials it
persistently and sends ``held`` messages of 100 bytes that the receiver's reactor holds
(its ``receive`` returns a Deferred that never fires, so they stay unacknowledged, in the
sender's recovery buffer and store). The sender is SIGKILLed by its PID and started again
with its key and store; it prints how long ``startService`` took (opening the store and
restoring the session) and when ``peer_resumed`` came. Printed: from the new process's
start to resumed, and from ``startService`` to resumed (medians over ``restarts``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

from twisted.internet import defer  # noqa: E402

from mconn import ChannelDescriptor, Config, NodeKey, Reactor, Switch  # noqa: E402

SMALL, BULK = 100, 1 << 20
CHANNEL = 0x20
CHANNELS = [ChannelDescriptor(CHANNEL, priority=1, send_queue_capacity=1000, recv_message_capacity=BULK)]
BASE = dict(stats_interval=0, resume_grace=60.0, max_reconnect_delay=0.05, ignore_discovered_addresses=True)


class Sink(Reactor):
    """Counts what arrives; ``hold`` makes every receive a Deferred that never fires."""

    def __init__(self, hold: bool = False) -> None:
        self.messages = 0
        self.bytes = 0
        self.hold = hold
        self.resumed: defer.Deferred | None = None

    def get_channels(self):
        return CHANNELS

    def receive(self, channel_id, peer, message):
        self.messages += 1
        self.bytes += len(message)
        return defer.Deferred() if self.hold else None

    def peer_resumed(self, peer) -> None:
        if self.resumed is not None:
            self.resumed, d = None, self.resumed
            d.callback(time.perf_counter())


class Filler:
    """Keeps the channel's queue full: try_send until refused, then send, then again."""

    def __init__(self, peer, message: bytes) -> None:
        self.peer, self.message, self.running, self.accepted = peer, message, True, 0
        self.fill()

    def fill(self, _=None) -> None:
        peer, message = self.peer, self.message
        while self.running and peer.try_send(CHANNEL, message):
            self.accepted += 1
        if self.running:
            peer.send(CHANNEL, message).addCallback(self.sent)

    def sent(self, ok) -> None:
        self.accepted += bool(ok)
        self.fill()


async def throughput(twisted_reactor, directory: str, store: bool, size: int, duration: float) -> dict:
    sink = Sink()
    stores = {}
    switches = []
    for role in ("receiver", "sender"):
        config = Config(**BASE)
        if store:
            stores[role] = os.path.join(directory, f"{role}-{size}-{time.monotonic_ns()}.db")
            config = config.replace(session_store=stores[role])
        switch = Switch([sink if role == "receiver" else Sink()], config=config, clock=twisted_reactor)
        switch.startService()
        switches.append(switch)
    receiver, sender = switches
    port = await receiver.listen("tcp:0:interface=127.0.0.1")
    peer = await sender.dial(f"{receiver.node_id}@127.0.0.1:{port.getHost().port}")
    filler = Filler(peer, b"x" * size)
    await sleep(twisted_reactor, 0.5)  # warm up
    commits0 = _commits(sender)
    m0, b0, t0 = sink.messages, sink.bytes, time.perf_counter()
    await sleep(twisted_reactor, duration)
    m1, b1, t1 = sink.messages, sink.bytes, time.perf_counter()
    commits = _commits(sender) - commits0
    filler.running = False
    for switch in switches:
        await switch.stopService()
    elapsed = t1 - t0
    return {
        "messages_per_s": (m1 - m0) / elapsed,
        "mib_per_s": (b1 - b0) / elapsed / (1 << 20),
        "commits_per_s": commits / elapsed,
        "messages_per_commit": (m1 - m0) / commits if commits else 0.0,
    }


async def send_latency(twisted_reactor, directory: str, count: int) -> dict:
    """``count`` sends of 100 bytes one after the other, each awaited, with a store: from
    ``send`` to its Deferred firing True (the commit covering the message), in ms."""
    switches = []
    for role in ("receiver", "sender"):
        path = os.path.join(directory, f"latency-{role}-{time.monotonic_ns()}.db")
        switch = Switch([Sink()], config=Config(session_store=path, **BASE), clock=twisted_reactor)
        switch.startService()
        switches.append(switch)
    receiver, sender = switches
    port = await receiver.listen("tcp:0:interface=127.0.0.1")
    peer = await sender.dial(f"{receiver.node_id}@127.0.0.1:{port.getHost().port}")
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        assert await peer.send(CHANNEL, b"l" * SMALL)
        samples.append((time.perf_counter() - t0) * 1000)
    commits = _commits(sender)
    for switch in switches:
        await switch.stopService()
    samples.sort()
    return {"p50_ms": samples[len(samples) // 2], "p99_ms": samples[int(len(samples) * 0.99)], "commits": commits}


def _commits(switch) -> int:
    store = switch._sessions.store  # the bench reads the store's counter; nothing calls into it
    return store.commits if store is not None else 0


def sleep(twisted_reactor, seconds: float) -> defer.Deferred:
    d: defer.Deferred = defer.Deferred()
    twisted_reactor.callLater(seconds, d.callback, None)
    return d


# -- recovery: processes ------------------------------------------------------------------


def node_process(args) -> None:
    """``--role listener|sender``: one process of the recovery measurement."""
    from twisted.internet import reactor as twisted_reactor

    key = NodeKey.load(args.key)
    config = Config(session_store=args.store, **BASE)
    if args.role == "listener":
        switch = Switch([Sink(hold=True)], node_key=key, config=config)
        switch.startService()
        switch.listen("tcp:0:interface=127.0.0.1").addCallback(
            lambda port: print(f"port {port.getHost().port}", flush=True)
        )
    else:
        sink = Sink()
        started = time.perf_counter()
        switch = Switch([sink], node_key=key, config=config)
        switch.startService()
        restored = time.perf_counter()
        sink.resumed = defer.Deferred()
        sink.resumed.addCallback(lambda t: print(f"resumed {restored - started:.6f} {t - started:.6f}", flush=True))

        def connected(peer):
            if peer.state == "connected":  # a first start: fill the session, then say so
                for _ in range(args.held):
                    peer.try_send(CHANNEL, b"h" * SMALL) or peer.send(CHANNEL, b"h" * SMALL)
                twisted_reactor.callLater(1.0, print, "filled", flush=True)

        switch.dial(args.peer, persistent=True).addCallback(connected)
    twisted_reactor.run()


class Child:
    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args], stdout=subprocess.PIPE, text=True
        )

    def line(self, word: str) -> str:
        assert self.process.stdout is not None
        for _ in range(1000):  # bounded: the lines a child prints
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"child exited before printing {word!r}")
            if line.startswith(word):
                return line
        raise RuntimeError(f"no {word!r} in 1000 lines")

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(timeout=10)


def recovery(directory: str, restarts: int, held: int) -> dict:
    keys = {}
    for role in ("listener", "sender"):
        keys[role] = os.path.join(directory, f"{role}.key")
        NodeKey.generate().save(keys[role])
    listener_id = NodeKey.load(keys["listener"]).node_id
    common = lambda role: ["--role", role, "--key", keys[role], "--store", os.path.join(directory, f"r-{role}.db")]  # noqa: E731
    listener = Child(common("listener"))
    port = listener.line("port").split()[1]
    sender_args = common("sender") + ["--peer", f"{listener_id}@127.0.0.1:{port}", "--held", str(held)]
    sender = Child(sender_args)
    sender.line("filled")
    to_resumed, service_to_resumed, restore = [], [], []
    try:
        for _ in range(restarts):
            sender.kill()
            t0 = time.perf_counter()
            sender = Child(sender_args)
            words = sender.line("resumed").split()
            to_resumed.append(time.perf_counter() - t0)
            restore.append(float(words[1]))
            service_to_resumed.append(float(words[2]) - float(words[1]))
    finally:
        sender.kill()
        listener.kill()
    return {
        "process_start_to_resumed_s": statistics.median(to_resumed),
        "start_service_s": statistics.median(restore),
        "start_service_to_resumed_s": statistics.median(service_to_resumed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--held", type=int, default=10000)
    parser.add_argument("--role", choices=("listener", "sender"))
    parser.add_argument("--key")
    parser.add_argument("--store")
    parser.add_argument("--peer")
    args = parser.parse_args()
    if args.role:
        node_process(args)
        return
    from twisted.internet import task

    with tempfile.TemporaryDirectory() as directory:
        recovered = recovery(directory, args.restarts, args.held)
    task.react(lambda r: defer.ensureDeferred(rounds(r, args, recovered)))


async def rounds(twisted_reactor, args, recovered: dict) -> None:
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        recovered["latency"] = await send_latency(twisted_reactor, directory, 500)
        for round_ in range(args.repeat):
            order = ("memory", "store") if round_ % 2 == 0 else ("store", "memory")
            for size in (SMALL, BULK):
                for mode in order:
                    r = await throughput(twisted_reactor, directory, mode == "store", size, args.duration)
                    results.setdefault((size, mode), []).append(r)
    report(results, recovered, args)


def report(results: dict, recovered: dict, args) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeat} rounds of {args.duration} s")
    for size, unit, key in ((SMALL, "messages/s", "messages_per_s"), (BULK, "MiB/s", "mib_per_s")):
        memory = [r[key] for r in results[(size, "memory")]]
        stored = results[(size, "store")]
        ratios = [s[key] / m[key] for s, m in zip(stored, results[(size, "memory")], strict=True)]
        print(
            f"try_send {size} B: memory {statistics.median(memory):,.1f} {unit}, store "
            f"{statistics.median(r[key] for r in stored):,.1f} {unit}, store/memory {statistics.median(ratios):.3f}; "
            f"commits {statistics.median(r['commits_per_s'] for r in stored):,.0f}/s, "
            f"{statistics.median(r['messages_per_commit'] for r in stored):,.1f} messages a commit"
        )
    latency = recovered["latency"]
    print(
        f"send of 100 B alone, awaited (one commit: its fsync): p50 {latency['p50_ms']:.2f} ms, "
        f"p99 {latency['p99_ms']:.2f} ms, {latency['commits']} commits for 500 sends"
    )
    print(
        f"recovery with {args.held} messages held: process start to resumed "
        f"{recovered['process_start_to_resumed_s'] * 1000:.0f} ms, startService (open + restore) "
        f"{recovered['start_service_s'] * 1000:.1f} ms, startService to resumed "
        f"{recovered['start_service_to_resumed_s'] * 1000:.1f} ms (medians of {args.restarts})"
    )


if __name__ == "__main__":
    main()
