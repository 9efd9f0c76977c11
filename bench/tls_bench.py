"""mconn over TLS against plaintext mconn, in the same run (specs/tls.md).

    .venv/bin/python bench/tls_bench.py [--duration S] [--repeat N] [--rtt-count N]
        [--scenarios bulk,small,rtt,handshake] [--json PATH]

Each round starts, for plaintext and for TLS (identity mode, TLS 1.3) in turn (the order
alternates between rounds), a receiver process (this file, ``--role receiver``) that
listens on 127.0.0.1 and prints its port and node id. This process dials it and measures:

* ``bulk``: 1 MiB messages on one channel for ``duration`` seconds, the queue kept full;
  then an end marker, which the receiver answers with what it got. MB/s over the time
  from the first send to that answer.
* ``small``: 100-byte messages, likewise; messages/s.
* ``rtt``: one 100-byte message echoed back at a time, ``rtt_count`` times; median and
  p99 round trip in microseconds.
* ``handshake``: sequential dial, session up, close, for ``duration`` seconds, from a
  pool of 32 client Switches used round-robin (a node id reconnects only after the
  others did, so the listener has long forgotten its previous session); connections/s.

Every figure also gets the CPU time per unit of work of each process (``cpu_us``): on a
machine whose cores are shared, rates wobble and CPU cost much less. The table shows the
medians over the rounds and TLS/plaintext. Results go to stdout and, with ``--json``, to
a file. The receiver is killed through its process group whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mconn import ChannelDescriptor, Config, NodeKey, Reactor  # noqa: E402

BULK, SMALL, ECHO, REPORT = 0x10, 0x20, 0x30, 0x31
CHANNELS = [
    ChannelDescriptor(BULK, priority=1, send_queue_capacity=8),
    ChannelDescriptor(SMALL, priority=1, send_queue_capacity=10000),
    ChannelDescriptor(ECHO, priority=5, send_queue_capacity=16),
    ChannelDescriptor(REPORT, priority=10, send_queue_capacity=16),
]
BULK_SIZE, SMALL_SIZE, ECHO_SIZE = 1 << 20, 100, 100
END = b"E"
CONFIG = Config(stats_interval=0, resume_grace=0)
#: The handshake scenario closes connections as fast as it opens them: the closes still
#: in progress must not trip the listener's per-IP and pending limits.
RECEIVER_CONFIG = CONFIG.replace(max_connections_per_ip=1000, max_pending_handshakes=1000)
SCENARIOS = ("bulk", "small", "rtt", "handshake")
IMPLS = ("plain", "tls")
CLIENTS = 32


def tls_options(impl: str, node_key: NodeKey):
    if impl == "plain":
        return None
    from mconn.tls import TLSOptions

    return TLSOptions.identity(node_key)


# -- the receiver --------------------------------------------------------------------


class Sink(Reactor):
    """Counts bulk and small messages, answers an end marker with the counts, echoes."""

    def __init__(self) -> None:
        self.counts = {BULK: [0, 0], SMALL: [0, 0]}

    def get_channels(self):
        return CHANNELS

    def receive(self, channel_id, peer, message) -> None:
        if channel_id == ECHO:
            peer.try_send(ECHO, message)
        elif message == END:
            messages, size = self.counts[channel_id]
            self.counts[channel_id] = [0, 0]
            report = {"messages": messages, "bytes": size, "cpu_s": time.process_time()}
            peer.try_send(REPORT, json.dumps(report).encode())
        else:
            count = self.counts[channel_id]
            count[0] += 1
            count[1] += len(message)


def receiver(impl: str) -> int:
    from twisted.internet import reactor

    from mconn import Switch

    key = NodeKey.generate()
    switch = Switch([Sink()], node_key=key, tls=tls_options(impl, key), config=RECEIVER_CONFIG, clock=reactor)
    switch.startService()

    def listening(port):
        print(port.getHost().port, switch.node_id, flush=True)

    switch.listen("tcp:0:interface=127.0.0.1").addCallback(listening)
    reactor.addReader(_StdinWatch(reactor))
    reactor.run()
    return 0


class _StdinWatch:
    """Stops the receiver's reactor when the sender closes our stdin."""

    def __init__(self, reactor) -> None:
        self.reactor = reactor

    def fileno(self) -> int:
        return sys.stdin.fileno()

    def doRead(self):
        if not os.read(sys.stdin.fileno(), 4096):
            self.reactor.stop()

    def connectionLost(self, reason) -> None:
        pass

    def logPrefix(self) -> str:
        return "stdin"


# -- the sender ----------------------------------------------------------------------


class Source(Reactor):
    """Hands the sender the reports and echoes of the receiver."""

    def __init__(self) -> None:
        from twisted.internet import defer

        self.defer = defer
        self.waiting = {}

    def get_channels(self):
        return CHANNELS

    def next(self, channel_id):
        d = self.waiting[channel_id] = self.defer.Deferred()
        return d

    def receive(self, channel_id, peer, message) -> None:
        d = self.waiting.pop(channel_id, None)
        if d is not None:
            d.callback(message)


async def fill(peer, channel_id: int, message: bytes, duration: float, clock, source) -> dict:
    start = time.perf_counter()
    cpu = time.process_time()
    stop_at = start + duration
    while time.perf_counter() < stop_at:
        while peer.try_send(channel_id, message):
            pass
        if not await peer.send(channel_id, message):
            raise RuntimeError(f"send on {channel_id:#04x} fired False")
    report = source.next(REPORT)
    if not peer.try_send(channel_id, END):
        await peer.send(channel_id, END)
    report = json.loads(await report)
    elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "messages": report["messages"], "bytes": report["bytes"],
            "send_cpu_s": time.process_time() - cpu, "recv_cpu_end": report["cpu_s"]}


async def round_trips(peer, count: int, source) -> list[float]:
    message = b"r" * ECHO_SIZE
    times = []
    for _ in range(count):
        echo = source.next(ECHO)
        start = time.perf_counter_ns()
        peer.try_send(ECHO, message)
        await echo
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


async def handshakes(impl: str, address: str, duration: float, clock) -> dict:
    from mconn import Switch

    clients = []
    for _ in range(CLIENTS):
        key = NodeKey.generate()
        switch = Switch([], node_key=key, tls=tls_options(impl, key), config=CONFIG, clock=clock)
        switch.startService()
        clients.append(switch)
    done = 0
    start = time.perf_counter()
    cpu = time.process_time()
    try:
        while time.perf_counter() - start < duration:
            peer = await clients[done % CLIENTS].dial(address)
            peer.close("next")
            done += 1
        elapsed = time.perf_counter() - start
        return {"connections": done, "elapsed": elapsed, "send_cpu_s": time.process_time() - cpu}
    finally:
        from twisted.internet import defer

        await defer.gatherResults([c.stopService() for c in clients])


def start_receiver(impl: str):
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--role", "receiver", "--impl", impl],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, text=True,
    )
    line = process.stdout.readline().split()
    if len(line) != 2:
        stop_receiver(process)
        raise RuntimeError(f"the {impl} receiver did not start (printed {line!r})")
    return process, int(line[0]), line[1]


def stop_receiver(process) -> float:
    """Stop the receiver; returns its CPU seconds (from /proc) before it went."""
    cpu = _cpu_of(process.pid)
    try:
        process.stdin.close()
        process.wait(timeout=5)
    except (subprocess.TimeoutExpired, OSError):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return cpu


def _cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


async def measure(impl: str, args) -> dict:
    from twisted.internet import reactor

    from mconn import Switch

    process, port, node_id = start_receiver(impl)
    results = {}
    try:
        source = Source()
        key = NodeKey.generate()
        switch = Switch([source], node_key=key, tls=tls_options(impl, key), config=CONFIG, clock=reactor)
        switch.startService()
        address = f"{node_id}@127.0.0.1:{port}"
        peer = await switch.dial(address)
        for scenario, channel_id, size in (("bulk", BULK, BULK_SIZE), ("small", SMALL, SMALL_SIZE)):
            if scenario in args.scenarios:
                recv_cpu = _cpu_of(process.pid)
                r = await fill(peer, channel_id, os.urandom(size), args.duration, reactor, source)
                r["recv_cpu_s"] = _cpu_of(process.pid) - recv_cpu
                results[scenario] = r
        if "rtt" in args.scenarios:
            recv_cpu, cpu = _cpu_of(process.pid), time.process_time()
            times = await round_trips(peer, args.rtt_count, source)
            results["rtt"] = {"times": times, "send_cpu_s": time.process_time() - cpu,
                              "recv_cpu_s": _cpu_of(process.pid) - recv_cpu}
        await switch.stopService()
        if "handshake" in args.scenarios:
            recv_cpu = _cpu_of(process.pid)
            r = await handshakes(impl, address, args.duration, reactor)
            r["recv_cpu_s"] = _cpu_of(process.pid) - recv_cpu
            results["handshake"] = r
    finally:
        stop_receiver(process)
    return results


def figures(scenario: str, r: dict) -> dict:
    """(rate, unit, cpu_us per unit for send and recv) of one measurement."""
    if scenario == "bulk":
        units = r["bytes"] / 1e6
        rate, unit = units / r["elapsed"], "MB/s"
    elif scenario == "small":
        units = r["messages"]
        rate, unit = units / r["elapsed"], "msg/s"
    elif scenario == "rtt":
        units = len(r["times"])
        times = sorted(r["times"])
        return {"median_us": statistics.median(times), "p99_us": times[int(0.99 * (len(times) - 1))],
                "cpu_us": {"send": r["send_cpu_s"] * 1e6 / units, "recv": r["recv_cpu_s"] * 1e6 / units}}
    else:
        units = r["connections"]
        rate, unit = units / r["elapsed"], "conn/s"
    return {unit: rate, "cpu_us": {"send": r["send_cpu_s"] * 1e6 / units, "recv": r["recv_cpu_s"] * 1e6 / units}}


def table(rounds: list[dict], scenarios) -> list[dict]:
    rows = []
    for scenario in scenarios:
        per_impl = {impl: [figures(scenario, r[impl][scenario]) for r in rounds] for impl in IMPLS}
        for key in per_impl["plain"][0]:
            if key == "cpu_us":
                for side in ("send", "recv"):
                    values = {i: statistics.median(f["cpu_us"][side] for f in per_impl[i]) for i in IMPLS}
                    rows.append(_row(scenario, f"cpu_us/unit {side}", values))
            else:
                values = {i: statistics.median(f[key] for f in per_impl[i]) for i in IMPLS}
                rows.append(_row(scenario, key, values))
    return rows


def _row(scenario, figure, values):
    ratio = values["tls"] / values["plain"] if values["plain"] else float("nan")
    return {"scenario": scenario, "figure": figure, "plain": values["plain"], "tls": values["tls"], "tls/plain": ratio}


def print_table(rows) -> None:
    print(f"{'scenario':<10} {'figure':<18} {'plain':>12} {'tls':>12} {'tls/plain':>10}")
    for r in rows:
        print(f"{r['scenario']:<10} {r['figure']:<18} {r['plain']:>12.1f} {r['tls']:>12.1f} {r['tls/plain']:>10.3f}")


def sender(args) -> int:
    from twisted.internet import defer, reactor

    rounds = []
    outcome = {}

    async def run():
        for n in range(args.repeat):
            order = IMPLS if n % 2 == 0 else IMPLS[::-1]
            rounds.append({impl: await measure(impl, args) for impl in order})

    def done(result):
        outcome["result"] = result
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()).addBoth(done))
    reactor.run()
    failure = outcome.get("result")
    if failure is not None:
        failure.raiseException()
    rows = table(rounds, args.scenarios)
    print(f"tls_bench: {args.repeat} rounds, {args.duration}s each, TLS identity mode (medians)")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows}, f, indent=1, default=str)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=("sender", "receiver"), default="sender")
    parser.add_argument("--impl", choices=IMPLS, default="plain")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt-count", type=int, default=2000)
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=list(SCENARIOS))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    if args.role == "receiver":
        return receiver(args.impl)
    return sender(args)


if __name__ == "__main__":
    sys.exit(main())
