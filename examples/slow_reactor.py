"""A reactor with CPU-heavy messages that does not stall its other peers
(specs/reactor-api.md section 4.1).

Run with ``python examples/slow_reactor.py [blocking|thread|process ...]`` (all three by
default). Three nodes on 127.0.0.1: "hub" runs a ``Verifier`` reactor; "heavy" sends it
messages that each take about ``WORK`` seconds of CPU to verify; "light" sends a short
message every 20 ms. The hub prints how late the light messages arrived, per way of
doing the heavy work:

* ``blocking``: verify inside ``receive``. The one event loop serves every peer, so each
  heavy message delays every light one by the whole verification.
* ``thread``: ``receive`` returns ``deferToThread(verify, message)``. mconn holds the
  heavy peer's next messages on that channel until the Deferred fires; the light peer
  flows. (hashlib's PBKDF2 releases the GIL; pure-Python work would not, so use:)
* ``process``: ``receive`` hands the work to a ``ProcessPoolExecutor`` and returns a
  Deferred for its result, for work that holds the GIL.

"How late" is measured from when each light message was due to be sent (its schedule),
so a loop that was blocked counts against the sender too, as it would for a remote one.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import struct
import sys
import time

from twisted.internet import defer, task, threads

from mconn import ChannelDescriptor, Config, Reactor, Switch

CHANNEL = 0x50
#: Seconds of CPU per heavy message (the iterations are calibrated to it at start).
WORK = 0.3
HEAVY_MESSAGES = 3
LIGHT_INTERVAL = 0.02
LIGHT_MESSAGES = 50


def verify(message: bytes, iterations: int) -> bytes:
    """The CPU-heavy check (PBKDF2, which runs without the GIL)."""
    return hashlib.pbkdf2_hmac("sha256", message, b"mconn-example", iterations)


def timed_verify(message: bytes, iterations: int) -> float:
    """``verify``, returning the seconds it took (wall clock, where it ran)."""
    start = time.perf_counter()
    verify(message, iterations)
    return time.perf_counter() - start


def calibrate(seconds: float) -> int:
    """PBKDF2 iterations that take about ``seconds`` here (the fastest of five trials:
    on a busy machine the others include time the CPU spent elsewhere)."""
    trials = []
    for _ in range(5):
        start = time.perf_counter()
        verify(b"calibration", 20_000)
        trials.append((time.perf_counter() - start) / 20_000)
    return max(1, int(seconds / min(trials)))


class Verifier(Reactor):
    """Owns CHANNEL. A message starting with b"H" is heavy; b"L" + a schedule time is light.

    :param mode: "blocking", "thread" or "process" (see the module docstring).
    :param iterations: PBKDF2 iterations of one heavy verification.
    :param pool: the ProcessPoolExecutor for "process".
    """

    def __init__(self, mode: str, iterations: int, pool=None) -> None:
        self.mode = mode
        self.iterations = iterations
        self.pool = pool
        #: Seconds each light message arrived after its schedule, in order.
        self.light_delays: list[float] = []
        #: Seconds each heavy verification took.
        self.work_times: list[float] = []

    def get_channels(self):
        return [ChannelDescriptor(CHANNEL, send_queue_capacity=64)]

    def receive(self, channel_id, peer, message):
        if message[:1] == b"L":
            (due,) = struct.unpack("!d", message[1:9])
            self.light_delays.append(time.time() - due)
            return None
        if self.mode == "blocking":
            self.work_times.append(timed_verify(message, self.iterations))
            return None
        if self.mode == "thread":
            d = threads.deferToThread(timed_verify, message, self.iterations)
        else:  # a thread only waits for the process doing the work
            future = self.pool.submit(timed_verify, message, self.iterations)
            d = threads.deferToThread(future.result)
        return d.addCallback(self.work_times.append)

    @property
    def heavy_done(self) -> int:
        return len(self.work_times)


async def run_mode(reactor, mode: str, iterations: int, pool=None) -> Verifier:
    """Hub, heavy and light on 127.0.0.1; returns the hub's Verifier once all arrived."""
    config = Config(stats_interval=0)
    verifier = Verifier(mode, iterations, pool)
    hub = Switch([verifier], config=config, clock=reactor)
    heavy = Switch([Verifier(mode, iterations)], config=config, clock=reactor)
    light = Switch([Verifier(mode, iterations)], config=config, clock=reactor)
    for switch in (hub, heavy, light):
        switch.startService()
    try:
        port = (await hub.listen("tcp:0:interface=127.0.0.1")).getHost().port
        address = f"{hub.node_id}@127.0.0.1:{port}"
        heavy_peer = await heavy.dial(address)
        light_peer = await light.dial(address)
        start = time.time() + 0.05
        for i in range(HEAVY_MESSAGES):
            heavy_peer.try_send(CHANNEL, b"H%d" % i + b"x" * 64)
        for i in range(LIGHT_MESSAGES):  # each sent at its due time, or as soon after as the loop allows
            due = start + i * LIGHT_INTERVAL
            await task.deferLater(reactor, max(0.0, due - time.time()), lambda: None)
            light_peer.try_send(CHANNEL, b"L" + struct.pack("!d", due))
        deadline = time.time() + 30
        while (len(verifier.light_delays) < LIGHT_MESSAGES or verifier.heavy_done < HEAVY_MESSAGES) and (
            time.time() < deadline
        ):
            await task.deferLater(reactor, 0.02, lambda: None)
    finally:
        await defer.gatherResults([s.stopService() for s in (hub, heavy, light)])
    return verifier


async def main(reactor, *modes: str) -> None:
    modes = modes or ("blocking", "thread", "process")
    iterations = calibrate(WORK)
    print(f"each heavy message: {iterations} PBKDF2 iterations (about {WORK} s of CPU here)")
    worst = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        for mode in modes:
            verifier = await run_mode(reactor, mode, iterations, pool if mode == "process" else None)
            delays = sorted(verifier.light_delays)
            if len(delays) < LIGHT_MESSAGES or verifier.heavy_done < HEAVY_MESSAGES:
                raise SystemExit(f"{mode}: messages missing ({len(delays)} light, {verifier.heavy_done} heavy)")
            worst[mode] = delays[-1]
            print(
                f"{mode:8}: light messages late by median {delays[len(delays) // 2] * 1e3:6.1f} ms, "
                f"worst {delays[-1] * 1e3:6.1f} ms ({verifier.heavy_done} heavy verified)"
            )
    if "blocking" in worst and any(m in worst for m in ("thread", "process")):
        best = min(worst[m] for m in ("thread", "process") if m in worst)
        print(f"worst light delay: blocking / off-loop = {worst['blocking'] / max(best, 1e-6):.1f}")


if __name__ == "__main__":
    sys.path.insert(0, ".")
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, *sys.argv[1:])))
