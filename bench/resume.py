"""The resume measurement: how long a session takes to carry on after a reset.

Both ends run in role processes (role.py), as the other scenarios do. The receiver is a
listening Switch. The dialer process holds a Switch and, in front of the receiver, a
FaultProxy (tests/faultproxy.py) on 127.0.0.1; its session goes through the proxy, and
it keeps up a steady stream: STREAM_BATCH 100-byte messages every STREAM_TICK seconds,
each carrying its sequence number and its *epoch* (how many resets the dialer had done
when it accepted the message).

Both processes note their event loop's stalls (StallWatch), to tell a slow resume from
a process that was not running. The dialer also notes when its own telemetry events (TIMELINE) are logged after each
reset, which splits the resume into detection, redial and handshake.

Each of ``resets`` iterations takes three samples, in this order:

1. *fresh, proxied*: a new Switch (new node key, made before the clock starts) dials the
   receiver through the proxy and sends one message from ``add_peer``; the message
   carries the ``time.monotonic_ns()`` read just before ``dial``. The receiver measures
   dial -> first message delivered; the dialer measures dial -> handshake done. The
   session is then closed and the Switch stopped. This is the baseline: a plain fresh
   TCP connect plus mconn handshake, over the same path as the resumed session.
2. *fresh, direct*: the same without the proxy (what the proxy's relaying costs).
3. *reset*: the dialer accepts STREAM_BATCH messages and, in the same reactor turn,
   reads the clock and resets every proxied link (RST both ends). Those last messages
   are still in the dead transport's buffer, so every reset loses some and the session
   has something to re-deliver. The dialer re-dials at once (the first reconnect delay
   is 0) and resumes. It then waits for its ``peer_resumed`` and SETTLE seconds.

The receiver counts resumes (``peer_resumed``). After resume r, a message of epoch < r
was accepted before reset r: it is *re-delivered*; one of epoch r is *new*. It records,
per resume, the arrival of the first re-delivered and of the first new message, and it
checks that sequence numbers arrive exactly once and in order. Both processes read
CLOCK_MONOTONIC (``time.monotonic_ns``), so reset and arrival times compare directly;
report.py pairs them.
"""

from __future__ import annotations

import os
import sys
import time

from twisted.internet import defer, task
from twisted.internet.task import LoopingCall
from twisted.logger import globalLogPublisher

from mconn import ChannelDescriptor, Reactor, Switch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from faultproxy import FaultProxy  # noqa: E402  (tests/ is not a package)

STREAM, FRESH, END = b"TFE"
SIZE = 100
STREAM_CHANNEL = ChannelDescriptor(0x50, priority=1, send_queue_capacity=2000)
STREAM_TICK = 0.002
STREAM_BATCH = 10
#: Seconds a fresh session is kept open so that its first message arrives.
FRESH_HOLD = 0.05
#: Seconds between a resume and the next sample.
SETTLE = 0.15
#: Bound on every wait for a dial, a resume or a close.
WAIT = 5.0
#: Both processes note when their event loop ran late by more than STALL seconds
#: (a 2 ms timer that fired late): a process that was not running cannot deliver.
STALL_TICK = 0.002
STALL = 0.005
MODES = ("proxy", "direct")
#: The dialer's telemetry events (specs/telemetry.md) timed after each reset: where
#: the time between the reset and the resume goes.
TIMELINE = ("connection_lost", "session_suspended", "connection_made", "handshake_done", "session_resumed")


def stream_message(seq: int, epoch: int) -> bytes:
    """T | sequence (8 bytes) | epoch (4 bytes) | padding."""
    return bytes([STREAM]) + seq.to_bytes(8, "big") + epoch.to_bytes(4, "big") + bytes(SIZE - 13)


def fresh_message(index: int, mode: int, dial_ns: int) -> bytes:
    """F | sample index (4 bytes) | mode (1 byte) | dial time ns (8 bytes) | padding."""
    return bytes([FRESH]) + index.to_bytes(4, "big") + bytes([mode]) + dial_ns.to_bytes(8, "big") + bytes(SIZE - 14)


class StallWatch:
    """Notes (end ns, length ns, CPU ns the process used meanwhile) of every event-loop
    stall longer than STALL: CPU close to the length means the process was busy (our
    code, the garbage collector); CPU near zero means it was not running at all."""

    def __init__(self, clock) -> None:
        self.stalls: list[tuple[int, int, int]] = []
        self._last = time.monotonic_ns()
        self._last_cpu = time.process_time_ns()
        self._loop = LoopingCall(self._tick)
        self._loop.clock = clock
        self._loop.start(STALL_TICK, now=False)

    def _tick(self) -> None:
        now, cpu = time.monotonic_ns(), time.process_time_ns()
        late = now - self._last - int(STALL_TICK * 1e9)
        if late > STALL * 1e9 and len(self.stalls) < 10000:
            self.stalls.append((now, late, cpu - self._last_cpu))
        self._last, self._last_cpu = now, cpu

    def stop(self) -> list:
        if self._loop.running:
            self._loop.stop()
        return self.stalls


def sleep(clock, seconds: float) -> defer.Deferred:
    return task.deferLater(clock, seconds, lambda: None)


def bounded(clock, d: defer.Deferred, what: str) -> defer.Deferred:
    """``d``, failing with a TimeoutError naming ``what`` after WAIT seconds."""

    def timed_out(failure, timeout):
        failure.trap(defer.CancelledError)
        raise TimeoutError(f"{what}: nothing within {timeout}s")

    return d.addTimeout(WAIT, clock).addErrback(timed_out, WAIT)


# -- receiver -----------------------------------------------------------------------


class ResumeReceiver(Reactor):
    """The listening end: times deliveries around resumes and the fresh samples."""

    def __init__(self, report, clock) -> None:
        self._report = report
        self._stalls = StallWatch(clock)
        self.stream_peer = None
        self._next_seq = 0
        self._out_of_order = 0
        self._epoch_ahead = 0
        self._resumes: list[dict] = []
        self._suspended_ns = None
        self._fresh: list[dict] = []
        self._done = False

    def get_channels(self):
        return [STREAM_CHANNEL]

    def add_peer(self, peer) -> None:
        if self.stream_peer is None:
            self.stream_peer = peer  # the dialer's streaming session comes first

    def peer_suspended(self, peer) -> None:
        if peer is self.stream_peer:
            self._suspended_ns = time.monotonic_ns()

    def peer_resumed(self, peer) -> None:
        if peer is self.stream_peer:
            self._resumes.append(
                {
                    "suspended_ns": self._suspended_ns,
                    "resumed_ns": time.monotonic_ns(),
                    "first_ns": None,
                    "first_resent_ns": None,
                    "first_new_ns": None,
                    "resent": 0,
                }
            )
            self._suspended_ns = None

    def receive(self, channel_id: int, peer, msg: bytes) -> None:
        now = time.monotonic_ns()
        kind = msg[0]
        if kind == STREAM:
            self._stream(now, int.from_bytes(msg[1:9], "big"), int.from_bytes(msg[9:13], "big"))
        elif kind == FRESH:
            self._fresh.append(
                {
                    "index": int.from_bytes(msg[1:5], "big"),
                    "mode": MODES[msg[5]],
                    "dial_ns": int.from_bytes(msg[6:14], "big"),
                    "arrival_ns": now,
                }
            )
        elif kind == END and peer is self.stream_peer:
            self._finish()

    def _stream(self, now: int, seq: int, epoch: int) -> None:
        if seq != self._next_seq:
            self._out_of_order += 1
        self._next_seq = seq + 1
        resumes = len(self._resumes)
        if not resumes:
            return
        r = self._resumes[-1]
        if r["first_ns"] is None:
            r["first_ns"] = now
        if epoch < resumes:
            r["resent"] += 1
            if r["first_resent_ns"] is None:
                r["first_resent_ns"] = now
        elif epoch == resumes:
            if r["first_new_ns"] is None:
                r["first_new_ns"] = now
        else:
            self._epoch_ahead += 1  # a reset the receiver never saw resumed

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self._report(
            {
                "resumes": self._resumes,
                "fresh": self._fresh,
                "stream_messages": self._next_seq,
                "out_of_order": self._out_of_order,
                "epoch_ahead": self._epoch_ahead,
                "stalls": self._stalls.stop(),
            }
        )
        if self.stream_peer is not None:
            self.stream_peer.close("benchmark done")


def start_receiver(clock, report) -> defer.Deferred:
    """Listen on 127.0.0.1 port 0; fires with ``{"port", "node_id"}``."""
    switch = Switch([ResumeReceiver(report, clock)], clock=clock)
    switch.startService()
    d = switch.listen("tcp:0:interface=127.0.0.1")
    return d.addCallback(lambda port: {"port": port.getHost().port, "node_id": switch.node_id})


# -- dialer -------------------------------------------------------------------------


class _DialerReactor(Reactor):
    """The dialer's view of its sessions: resumes and ends, as Deferreds to wait on."""

    def __init__(self, on_add=None) -> None:
        self._on_add = on_add
        self.resumed: defer.Deferred | None = None
        self.removed = defer.Deferred()

    def get_channels(self):
        return [STREAM_CHANNEL]

    def add_peer(self, peer) -> None:
        if self._on_add is not None:
            self._on_add(peer)

    def peer_resumed(self, peer) -> None:
        if self.resumed is not None and not self.resumed.called:
            self.resumed.callback(time.monotonic_ns())

    def remove_peer(self, peer, reason) -> None:
        if not self.removed.called:
            self.removed.callback(reason)


class ResumeDialer:
    """The dialing end: the proxy, the streaming session and the schedule of samples."""

    def __init__(self, clock, port: int, node_id: str, resets: int) -> None:
        self.clock = clock
        self.port = port
        self.node_id = node_id
        self.resets = resets
        self.reactor = _DialerReactor()
        self.peer = None
        self.seq = 0
        self.epoch = 0
        self.refused = 0
        self.samples = {"resets": [], "fresh": []}
        self._switch = None
        self._timeline: dict | None = None  # event -> monotonic ns, while a reset is timed
        self._attempts: list[dict] = []

    def _observe(self, event: dict) -> None:
        """A log observer: the first of each TIMELINE event of our own Switch, and the
        dial attempts (how many, after what delay) of the current reset."""
        if event.get("log_namespace") != "mconn" or event.get("node_id") != self._switch.node_id:
            return
        name, marks = event.get("event"), self._timeline
        if marks is not None and name in TIMELINE and name not in marks:
            marks[name] = time.monotonic_ns()
        elif name == "dial_attempt":  # logged once the attempt's handshake is done
            self._attempts.append({k: event.get(k) for k in ("attempt", "delay", "result")})

    async def run(self) -> dict:
        clock = self.clock
        proxy = FaultProxy("127.0.0.1", self.port, clock=clock)
        proxy_port = await proxy.start()
        switch = self._switch = Switch([self.reactor], clock=clock)
        switch.startService()
        stream = LoopingCall(self._tick)
        stream.clock = clock
        globalLogPublisher.addObserver(self._observe)
        stalls = StallWatch(clock)
        try:
            self.peer = await bounded(clock, switch.dial(f"{self.node_id}@127.0.0.1:{proxy_port}"), "first dial")
            stream.start(STREAM_TICK, now=True)
            await sleep(clock, SETTLE)
            for i in range(self.resets):
                for mode, port in zip(MODES, (proxy_port, self.port), strict=True):
                    await self._fresh(i, mode, port)
                await self._reset(i, proxy)
            stream.stop()
            if not await self.peer.send(STREAM_CHANNEL.id, bytes([END])):
                raise RuntimeError("the end message was refused")
            await bounded(clock, self.reactor.removed, "the receiver's close")
            return dict(
                self.samples,
                stream_messages=self.seq,
                refused=self.refused,
                stalls=stalls.stop(),
                peer_resumes=self.peer.resumes,
                messages_resent=self.peer.stats.messages_resent,
            )
        finally:
            stalls.stop()
            globalLogPublisher.removeObserver(self._observe)
            if stream.running:
                stream.stop()
            await switch.stopService()
            await proxy.stop()

    def _send(self) -> None:
        if self.peer.try_send(STREAM_CHANNEL.id, stream_message(self.seq, self.epoch)):
            self.seq += 1
        else:
            self.refused += 1

    def _tick(self) -> None:
        for _ in range(STREAM_BATCH):
            self._send()

    async def _reset(self, index: int, proxy) -> None:
        self.reactor.resumed = defer.Deferred()
        first_lost = self.seq
        self._tick()  # these are still in the transport's buffer when the link dies
        self._timeline, self._attempts = {}, []
        reset_ns = time.monotonic_ns()
        links = proxy.reset_all()
        self.epoch += 1
        lost = self.seq - first_lost
        resumed_ns = await bounded(self.clock, self.reactor.resumed, f"resume after reset {index}")
        timeline, self._timeline = self._timeline, None
        self.samples["resets"].append(
            {
                "index": index,
                "reset_ns": reset_ns,
                "resumed_ns": resumed_ns,
                "links": links,
                "unsent_at_reset": lost,
                "timeline_ns": timeline,
                "dial_attempts": self._attempts,
            }
        )
        await sleep(self.clock, SETTLE)

    async def _fresh(self, index: int, mode: str, port: int) -> None:
        clock = self.clock
        sample = {"index": index, "mode": mode}

        def greet(peer) -> None:
            peer.try_send(STREAM_CHANNEL.id, fresh_message(index, MODES.index(mode), sample["dial_ns"]))

        reactor = _DialerReactor(on_add=greet)
        switch = Switch([reactor], clock=clock)  # a new node key, made before the clock starts
        switch.startService()
        try:
            sample["dial_ns"] = time.monotonic_ns()
            peer = await bounded(clock, switch.dial(f"{self.node_id}@127.0.0.1:{port}"), f"fresh dial {mode}")
            sample["handshake_ns"] = time.monotonic_ns()
            await sleep(clock, FRESH_HOLD)
            peer.close("sample done")
            await bounded(clock, reactor.removed, f"close of fresh session {mode}")
        finally:
            await switch.stopService()
        self.samples["fresh"].append(sample)


def start_dialer(clock, port: int, node_id: str, resets: int) -> defer.Deferred:
    """Run the schedule; fires with the dialer's samples."""
    return defer.ensureDeferred(ResumeDialer(clock, port, node_id, resets).run())
