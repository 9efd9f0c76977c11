"""``mconn-pipeline --follow``: how soon a closed file shows, and what the follower costs idle.

    .venv/bin/python bench/follow_bench.py [--seconds 60] [--trigger 5] [--rotate 1] [--idle 30]

A fleet of three Switches on 127.0.0.1 (A listens; B dials A; C dials A through a
FaultProxy, reset every 15 s) sends messages both ways on every link for ``--seconds``,
each node writing its telemetry with ``rotate_seconds=--rotate`` (closed files, names
that never change). The follower runs beside it as a subprocess (``--trigger``). Every
second the bench reads the follower's ``/state.json``: ``lag_seconds`` is, for the newest
batch, the largest time from a file's modification (its close) to the end of the batch
that read it and rebuilt the tables. Once the fleet has stopped and every closed file is
read, the follower's CPU (the Python driver and its JVM: utime + stime of every process
of its tree, from /proc/PID/stat) is measured over ``--idle`` seconds. One JSON line at
the end; every process started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

from twisted.internet import defer, protocol, task, threads

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mconn import ChannelDescriptor, Config, Switch  # noqa: E402
from mconn.ops.faultproxy import FaultProxy  # noqa: E402
from mconn.ops.telemetry_file import TelemetryFileService, closed_paths  # noqa: E402
from mconn.switch.reactor import Reactor  # noqa: E402

PIPELINE = pathlib.Path(sys.executable).with_name("mconn-pipeline")
TICKS = os.sysconf("SC_CLK_TCK")


class Sink(Reactor):
    """Takes every message on channel 0x20."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    def get_channels(self):
        return [ChannelDescriptor(0x20, priority=1, send_queue_capacity=64)]

    def receive(self, channel_id, peer, message):
        self.received += 1


class Child(protocol.ProcessProtocol):
    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.ended = defer.Deferred()

    def outReceived(self, data):
        self.out += data

    def errReceived(self, data):
        self.err += data

    def processEnded(self, reason):
        self.ended.callback(getattr(reason.value, "exitCode", None))


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and every process below it, seconds."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(times.get(p, 0) for p in tree) / TICKS


def get_state(url: str) -> dict:
    for attempt in range(3):  # a connection reset under load: try again
        try:
            with urllib.request.urlopen(url + "state.json", timeout=10) as response:
                return json.loads(response.read())
        except OSError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


async def main(reactor, args) -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="follow-bench-"))
    logs = work / "logs"
    logs.mkdir()
    child = Child()
    argv = [str(PIPELINE), "--follow", str(logs), "--port", "0", "--trigger", str(args.trigger)]
    transport = reactor.spawnProcess(child, argv[0], argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    pid = transport.pid
    result: dict = {"trigger": args.trigger, "rotate_seconds": args.rotate, "fleet_seconds": args.seconds}
    try:
        for _ in range(120):
            match = re.search(rb"the page is (http://\S+/)", bytes(child.out))
            if match or child.ended.called:
                break
            await task.deferLater(reactor, 1, lambda: None)
        if not match:
            raise SystemExit(f"the follower did not start: {bytes(child.err).decode(errors='replace')[-2000:]}")
        url = match.group(1).decode()
        config = Config(stats_interval=1.0, resume_grace=10.0, max_reconnect_delay=0.2)
        sinks = {name: Sink() for name in "ABC"}
        nodes = {name: Switch([sinks[name]], clock=reactor, config=config) for name in "ABC"}
        files = [
            TelemetryFileService(
                logs / f"{n}.json", s.node_id, rotate_seconds=args.rotate, keep_files=100_000, clock=reactor
            )
            for n, s in nodes.items()
        ]
        for f in files:
            f.startService()
        for s in nodes.values():
            s.startService()
        port = (await nodes["A"].listen("tcp:0:interface=127.0.0.1")).getHost().port
        proxy = FaultProxy("127.0.0.1", port)
        proxy_port = await proxy.start()
        ids = {n: s.node_id for n, s in nodes.items()}
        b = await nodes["B"].dial(f"{ids['A']}@127.0.0.1:{port}")
        c = await nodes["C"].dial(f"{ids['A']}@127.0.0.1:{proxy_port}")
        lags: list[float] = []
        seen_batches = -1
        started = reactor.seconds()
        n = 0
        while reactor.seconds() - started < args.seconds:
            peers = [b, c, *nodes["A"].peers.values()]
            for p in peers:
                for _ in range(10):
                    p.try_send(0x20, b"m%d" % n + b"x" * 100)
                    n += 1
            if int(reactor.seconds() - started) % 15 == 14:
                proxy.reset_all()
            state = await threads.deferToThread(get_state, url)
            if state["batches"] != seen_batches and state["lag_seconds"] is not None:
                seen_batches = state["batches"]
                lags.append(state["lag_seconds"])
            await task.deferLater(reactor, 1, lambda: None)
        await proxy.stop()
        for s in nodes.values():
            await s.stopService()
        for f in files:
            f.stopService()
        closed = sum(len(closed_paths(logs / f"{name}.json")) for name in "ABC")
        for _ in range(120):
            state = await threads.deferToThread(get_state, url)
            if state["files"] == closed:
                break
            await task.deferLater(reactor, 1, lambda: None)
        await task.deferLater(reactor, args.trigger + 2, lambda: None)  # the last batch ends
        before, t0 = tree_cpu_seconds(pid), time.monotonic()
        await task.deferLater(reactor, args.idle, lambda: None)
        after, t1 = tree_cpu_seconds(pid), time.monotonic()
        state = await threads.deferToThread(get_state, url)
        result.update(
            closed_files=closed,
            files_read=state["files"],
            events=state["events"],
            batches=state["batches"],
            lag_p50=statistics.median(lags) if lags else None,
            lag_max=max(lags) if lags else None,
            lag_batches=len(lags),
            last_batch_seconds=state["last_batch_seconds"],
            idle_seconds=round(t1 - t0, 1),
            idle_cpu_seconds=round(after - before, 2),
            idle_core_percent=round(100 * (after - before) / (t1 - t0), 2),
            audit=state["audit"],
        )
    except BaseException:
        sys.stderr.write(bytes(child.err).decode(errors="replace")[-3000:])
        raise
    finally:
        if not child.ended.called:
            os.kill(pid, signal.SIGTERM)
        await child.ended
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--trigger", type=float, default=5.0)
    p.add_argument("--rotate", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=30.0)
    arguments = p.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, arguments)))
