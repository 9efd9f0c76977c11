"""The measurements of bench/run.py, written once against the link interface of links.py.

Every message starts with a kind byte, so the receiver needs no channel to classify it
(the raw baseline has none):

    B  bulk payload            S  small payload
    L  latency probe: kind | monotonic_ns (8 bytes, big-endian) | padding
    R  round-trip request: kind | sequence (8 bytes) | padding; the receiver echoes it
    E  end of the measurement: the receiver reports and closes

Senders. ``bulk`` and ``small`` keep one channel's queue full (Filler): ``offer_many``
of ``Filler.size`` messages at a time (64; bench/run.py's ``--batch``, 1,000 by default;
mconn: ``try_send_many``; raw: ``offer`` each, written in batches) until one is refused,
then ``offer_later`` (mconn: ``peer.send``; raw: the transport's ``resumeProducing``) and
go on when that fires, for ``duration`` seconds; then an E message. (``--one-by-one`` has
the mconn side call ``try_send`` once per message instead, as a sender without the batch
API would.) ``small_each`` is ``small`` one message at a time on every side: mconn calls
``try_send`` per message, the prebuilt-frames baseline (prebuilt.py, whose own filler
replaces Filler) writes each frame with its own ``transport.write``. ``priority`` does the same with 1 MiB messages on a
priority-1 channel and sends a probe every 5 ms on a priority-10 channel (raw: the probe
is written behind whatever the transport already buffers; there are no priorities).
``rtt`` keeps one 100-byte request outstanding; the sender times it with
``perf_counter_ns``.

Measuring. Probe times come from ``time.monotonic_ns`` (CLOCK_MONOTONIC on Linux), which
both processes share, so a probe's one-way delay is measured by the receiver directly.
At each probe the sender also records the bytes its kernel send queue holds (ahead of
the probe) and the receiver the bytes left unread in its receive queue. Throughput is
measured by the receiver, from the arrival of the first whole message of a kind to the
arrival of the last one, over the bytes of the messages after the first.
"""

from __future__ import annotations

import time

from twisted.internet.task import LoopingCall

from mconn import ChannelDescriptor

from links import Handler

BULK, SMALL, LATENCY, ROUND_TRIP, END = b"BSLRE"
BULK_SIZE = 1 << 20
SMALL_SIZE = 100
PROBE_INTERVAL = 0.005

BULK_CHANNEL = ChannelDescriptor(0x10, priority=1, send_queue_capacity=8)
SMALL_CHANNEL = ChannelDescriptor(0x20, priority=1, send_queue_capacity=10000)
PROBE_CHANNEL = ChannelDescriptor(0x30, priority=10, send_queue_capacity=1000)
RTT_CHANNEL = ChannelDescriptor(0x40, priority=1, send_queue_capacity=16)

#: The mconn channels each scenario declares (on both sides).
CHANNELS = {
    "bulk": [BULK_CHANNEL],
    "small": [SMALL_CHANNEL],
    "small_each": [SMALL_CHANNEL],
    "priority": [BULK_CHANNEL, PROBE_CHANNEL],
    "rtt": [RTT_CHANNEL],
}

_END_MESSAGE = bytes([END])
_SIZES = {BULK: BULK_SIZE, SMALL: SMALL_SIZE}


def padded(kind: int, field: int, size: int) -> bytes:
    """kind | field (8 bytes big-endian) | zero padding, ``size`` bytes in all."""
    return bytes([kind]) + field.to_bytes(8, "big") + bytes(size - 9)


def summarize(samples_ns: list[int]) -> dict:
    """Percentiles of latencies in nanoseconds, reported in milliseconds."""
    if not samples_ns:
        return {"n": 0}
    ordered = sorted(samples_ns)
    n = len(ordered)

    def pct(p: float) -> float:
        return ordered[min(n - 1, int(p * n))] / 1e6

    return {
        "n": n,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": ordered[-1] / 1e6,
        "mean_ms": sum(ordered) / n / 1e6,
    }


def summarize_bytes(samples: list[int]) -> dict:
    """Median and maximum of byte counts, in KiB."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    return {"n": len(ordered), "p50_KiB": ordered[len(ordered) // 2] / 1024, "max_KiB": ordered[-1] / 1024}


# -- receiver ---------------------------------------------------------------------


class Sink(Handler):
    """The receiving end of every scenario: counts, timestamps, echoes, reports."""

    def __init__(self, link, report) -> None:
        self.link = link
        self._report = report
        #: kind -> [messages, bytes after the first, first arrival ns, last arrival ns]
        self._counts: dict[int, list] = {}
        #: Messages whose length is not their kind's (none expected: a check on delivery).
        self._malformed = 0
        self._probe_delays: list[int] = []
        self._recvq: list[int] = []
        self._done = False

    def message(self, channel: int, msg: bytes) -> None:
        kind = msg[0]
        now = time.monotonic_ns()
        if kind == ROUND_TRIP:
            self.link.send_now(channel, msg)
        elif kind == LATENCY:
            self._probe_delays.append(now - int.from_bytes(msg[1:9], "big"))
            self._recvq.append(self.link.kernel_queues()[1])
        elif kind == END:
            self._finish()
        else:
            if len(msg) != _SIZES.get(kind, -1):
                self._malformed += 1
            c = self._counts.get(kind)
            if c is None:
                self._counts[kind] = [1, 0, now, now]
            else:
                c[0] += 1
                c[1] += len(msg)
                c[3] = now

    def closed(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        result = {}
        for kind, (messages, size, first, last) in self._counts.items():
            seconds = (last - first) / 1e9
            result[chr(kind)] = {
                "messages": messages,
                "seconds": seconds,
                "bytes_per_s": size / seconds if seconds > 0 else None,
                "messages_per_s": (messages - 1) / seconds if seconds > 0 else None,
            }
        if self._probe_delays:
            result["probe"] = summarize(self._probe_delays)
            result["recvq_at_probe"] = summarize_bytes(self._recvq)
        result["malformed"] = self._malformed
        self._report(result)
        self.link.close()


# -- senders ----------------------------------------------------------------------


#: Messages a Filler offers at a time.
BATCH = 64


def _offer_each(link, channel: int, msgs: list) -> int:
    """``offer`` one message at a time (``--one-by-one``): how many were taken."""
    for taken, msg in enumerate(msgs):
        if not link.offer(channel, msg):
            return taken
    return len(msgs)


class Filler:
    """Keeps one channel's queue full with copies of ``msg`` until ``until`` (monotonic s)."""

    #: False: ``offer`` each message instead of ``offer_many`` (run.py --one-by-one).
    batched = True
    #: Messages offered at a time (run.py --batch sets it in its role processes).
    size = BATCH

    def __init__(self, link, channel: int, msg: bytes, until: float, on_done, batched: bool | None = None) -> None:
        self.link = link
        self.channel = channel
        self.msg = msg
        self.until = until
        self.sent = 0
        self._on_done = on_done
        if batched is not None:  # the scenario's choice (small_each) over the class's
            self.batched = batched

    def run(self) -> None:
        link, channel, msg, until, size = self.link, self.channel, self.msg, self.until, self.size
        batch = [msg] * size
        while time.monotonic() < until:
            taken = link.offer_many(channel, batch) if self.batched else _offer_each(link, channel, batch)
            self.sent += taken
            if taken < size:
                link.flush()
                link.offer_later(channel, msg, self._queued)
                return
            link.flush()
        link.flush()
        link.offer_later(channel, _END_MESSAGE, lambda: None)
        self._on_done()

    def _queued(self) -> None:
        self.sent += 1
        self.run()


class Sender(Handler):
    """The sending end: runs one scenario for ``duration`` seconds, then reports."""

    def __init__(self, link, scenario: str, duration: float, clock, report, rtt_count: int = 2000) -> None:
        self.link = link
        self.scenario = scenario
        self.clock = clock
        self._report = report
        self._until = time.monotonic() + duration
        self._result: dict = {}
        self._filler = None
        self._probe_call = None
        self._probes_sent = 0
        self._probes_refused = 0
        self._sendq: list[int] = []
        self._rtt_count = rtt_count
        self._rtt_warmup = max(20, rtt_count // 10)
        self._rtt_seq = 0
        self._rtt_started = 0
        self._rtt_samples: list[int] = []

    def start(self) -> None:
        getattr(self, f"_start_{self.scenario}")()

    def _start_bulk(self) -> None:
        self._fill(BULK_CHANNEL.id, padded(BULK, 0, BULK_SIZE))

    def _start_small(self) -> None:
        self._fill(SMALL_CHANNEL.id, padded(SMALL, 0, SMALL_SIZE))

    def _start_small_each(self) -> None:
        self._fill(SMALL_CHANNEL.id, padded(SMALL, 0, SMALL_SIZE), batched=False)

    def _start_priority(self) -> None:
        self._probe_call = LoopingCall(self._probe)
        self._probe_call.clock = self.clock
        self._probe_call.start(PROBE_INTERVAL, now=False)
        self._fill(BULK_CHANNEL.id, padded(BULK, 0, BULK_SIZE))

    def _fill(self, channel: int, msg: bytes, batched: bool | None = None) -> None:
        # A link may bring its own filler (prebuilt.py's writes frames built once).
        filler = getattr(self.link, "filler", Filler)
        self._filler = filler(self.link, channel, msg, self._until, self._filled, batched)
        self._filler.run()

    def _filled(self) -> None:
        self._result["sent"] = self._filler.sent
        if self._probe_call is not None and self._probe_call.running:
            self._probe_call.stop()

    def _probe(self) -> None:
        msg = padded(LATENCY, time.monotonic_ns(), SMALL_SIZE)
        self._sendq.append(self.link.kernel_queues()[0])  # bytes ahead of the probe in the kernel
        if self.link.send_now(PROBE_CHANNEL.id, msg):
            self._probes_sent += 1
        else:
            self._probes_refused += 1

    def _start_rtt(self) -> None:
        self._next_request()

    def _next_request(self) -> None:
        done = self._rtt_seq >= self._rtt_count + self._rtt_warmup
        if done or time.monotonic() >= self._until:
            self.link.send_now(RTT_CHANNEL.id, _END_MESSAGE)
            return
        msg = padded(ROUND_TRIP, self._rtt_seq, SMALL_SIZE)
        self._rtt_started = time.perf_counter_ns()
        if not self.link.send_now(RTT_CHANNEL.id, msg):
            raise RuntimeError("round-trip request refused with nothing outstanding")

    def message(self, channel: int, msg: bytes) -> None:
        if msg[0] != ROUND_TRIP or int.from_bytes(msg[1:9], "big") != self._rtt_seq:
            raise RuntimeError(f"unexpected reply {msg[:9]!r} (expected sequence {self._rtt_seq})")
        elapsed = time.perf_counter_ns() - self._rtt_started
        if self._rtt_seq >= self._rtt_warmup:
            self._rtt_samples.append(elapsed)
        self._rtt_seq += 1
        self._next_request()

    def closed(self) -> None:
        if self._probe_call is not None and self._probe_call.running:
            self._probe_call.stop()
        if self._probes_sent or self._probes_refused:
            self._result["probes_sent"] = self._probes_sent
            self._result["probes_refused"] = self._probes_refused
            self._result["sendq_at_probe"] = summarize_bytes(self._sendq)
        if self._rtt_samples:
            self._result["rtt"] = summarize(self._rtt_samples)
            self._result["round_trips"] = self._rtt_seq
        self._report(self._result)
