"""What one peer's slow ``receive`` costs the other peers (specs/reactor-api.md
section 4.1).

A hub Switch in this process runs ``examples.slow_reactor.Verifier``. A child process (this
script with ``--senders``) runs two Switches that dial it over 127.0.0.1: "heavy" sends
``--heavy`` messages that each take ``--work`` seconds of CPU to verify, "light" sends a
small timestamped message every 20 ms. The hub records each light message's latency
(arrival minus the child's send time; the child's event loop is never blocked, so this is
what a remote peer would see). Modes, measured one after the other in the same run:

* ``baseline``: heavy messages cost nothing to verify (the latency of the path itself);
* ``blocking``: verification inside ``receive`` (the old way: one loop for every peer);
* ``thread``: ``receive`` returns ``deferToThread(verify, ...)``: mconn holds the heavy
  peer's channel and the light peer flows;
* ``process``: ``receive`` returns a Deferred for the verification in a process pool.

Prints each mode's light latencies (p50, p99, max) and the ratio of its p99 to the
baseline's. Usage: ``python bench/slow_reactor.py [--work 0.5] [--heavy 4] [--light 150]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import struct
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twisted.internet import defer, task  # noqa: E402

from examples.slow_reactor import CHANNEL, Verifier, calibrate  # noqa: E402
from mconn import Config, Switch  # noqa: E402

LIGHT_INTERVAL = 0.02
CONFIG = Config(stats_interval=0)


async def senders(reactor, address: str, heavy: int, light: int) -> None:
    """The child: heavy and light dial the hub and send; exits when the hub closes."""
    heavy_sw = Switch([Verifier("thread", 1)], config=CONFIG, clock=reactor)
    light_sw = Switch([Verifier("thread", 1)], config=CONFIG, clock=reactor)
    heavy_peer = await heavy_sw.dial(address)
    light_peer = await light_sw.dial(address)
    await task.deferLater(reactor, 0.2, lambda: None)
    for i in range(heavy):
        heavy_peer.try_send(CHANNEL, b"H%d" % i + b"x" * 64)
    for _ in range(light):
        light_peer.try_send(CHANNEL, b"L" + struct.pack("!d", time.time()))
        await task.deferLater(reactor, LIGHT_INTERVAL, lambda: None)
    for _ in range(3000):  # until the hub stops (it closes the sessions), at most 60 s
        if not heavy_sw.peers and not light_sw.peers:
            break
        await task.deferLater(reactor, 0.02, lambda: None)
    await defer.gatherResults([heavy_sw.stopService(), light_sw.stopService()])


async def measure(reactor, mode: str, iterations: int, args) -> list[float]:
    """One mode: the hub here, the senders in a child process (stopped by its PID)."""
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1) if mode == "process" else None
    verifier = Verifier("blocking" if mode == "baseline" else mode, 1 if mode == "baseline" else iterations, pool)
    hub = Switch([verifier], config=CONFIG, clock=reactor)
    hub.startService()
    port = (await hub.listen("tcp:0:interface=127.0.0.1")).getHost().port
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--senders",
            f"{hub.node_id}@127.0.0.1:{port}",
            "--heavy",
            str(args.heavy),
            "--light",
            str(args.light),
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.time() + 60 + args.heavy * args.work * 3
        while (len(verifier.light_delays) < args.light or verifier.heavy_done < args.heavy) and time.time() < deadline:
            await task.deferLater(reactor, 0.05, lambda: None)
    finally:
        await hub.stopService()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if pool is not None:
            pool.shutdown()
    if len(verifier.light_delays) < args.light or verifier.heavy_done < args.heavy:
        raise SystemExit(f"{mode}: {len(verifier.light_delays)} light, {verifier.heavy_done} heavy arrived")
    return sorted(verifier.light_delays), verifier.work_times


def percentile(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))]


async def main(reactor, args) -> None:
    if args.senders:
        await senders(reactor, args.senders, args.heavy, args.light)
        return
    iterations = calibrate(args.work)
    print(
        f"heavy: {args.heavy} messages of {iterations} PBKDF2 iterations (~{args.work} s CPU each); "
        f"light: {args.light} messages every {LIGHT_INTERVAL * 1e3:.0f} ms"
    )
    results = {}
    for mode in ("baseline", "blocking", "thread", "process"):
        results[mode] = await measure(reactor, mode, iterations, args)
    base = percentile(results["baseline"][0], 0.99)
    print(f"{'mode':10} {'verify s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99 / baseline p99':>20}")
    for mode, (delays, work) in results.items():
        p99 = percentile(delays, 0.99)
        print(
            f"{mode:10} {sum(work) / len(work):9.3f} {percentile(delays, 0.5) * 1e3:8.2f} {p99 * 1e3:8.2f} "
            f"{delays[-1] * 1e3:8.2f} {p99 / max(base, 1e-6):20.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=float, default=0.5, help="seconds of CPU per heavy message")
    parser.add_argument("--heavy", type=int, default=4, help="heavy messages")
    parser.add_argument("--light", type=int, default=150, help="light messages, one per 20 ms")
    parser.add_argument("--senders", help=argparse.SUPPRESS)
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, parser.parse_args())))
