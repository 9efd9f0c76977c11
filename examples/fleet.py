"""A fleet of five mconn nodes on 127.0.0.1, with faults, audited afterwards: ``make run``.

    python examples/fleet.py [--duration 60] [--out DIR] [--follow [--follow-port 8090]]

What happens, in order (one progress line says which phase, and what so far):

1. **Keys.** A run directory (default ``run/fleet-<timestamp>/``) gets a NodeKey per node.
2. **Start.** Five ``twistd -n mconn`` processes on 127.0.0.1, each running the
   reactors ``reactors.fleet:FleetChat`` (a chat line every few seconds; node n1 also
   sends a file now and then), ``reactors.fleet:FleetBulk`` (a rate-bounded bulk
   stream to every peer) and, once it exists, ``reactors.pex:PexReactor``; with TLS
   (identity certificates) and a status page when the plugin offers them. Once up,
   each node's status page and Prometheus ``/metrics`` URL is printed.
3. **Faults**, on a schedule spread over ``--duration`` seconds: link resets, a black
   hole healed within ``resume_grace``, and the seed node killed (SIGKILL) and started
   again with the same key on the same port.
4. **Stop.** SIGTERM to every node (close packets, last telemetry), a bounded wait.
5. **Audit.** ``mconn-pipeline`` on the nodes' telemetry files; the summary (sessions,
   resumes, fresh starts, restarts, messages audited, lost, duplicated) and the report's path.

Topology
--------
n0 is the seed. A FaultProxy (mconn.ops.faultproxy) listens in front of it, and n1..n4 are
started with ``--peer n0@<proxy>``: their sessions with n0 run through the proxy, which
is where the faults are injected. Every node runs with ``ignore_discovered_addresses``,
so the listen address n0 announces in its hello is not added to the address pool of
n1..n4: they re-dial n0 through the proxy after every break, and the next fault hits
the new connection too. With the peer exchange reactor, n1..n4 learn each other's
(direct) addresses from n0 and connect among themselves directly; those links carry
chat and bulk traffic past the faults::

           n1 ----- n2          direct links: from peer exchange
           | \\     / |
           |   \\ /   |
           |   / \\   |
           n3 ----- n4
             \\ | | /
              proxy0            the proxied links: reset, black-holed
                |
                n0 (seed; killed and restarted)

Killing n0 leaves n1..n4 with suspended sessions; when n0 comes back, their resume
requests are refused (the new process does not know the sessions) and fresh sessions
start: the pipeline counts those as *fresh starts*, the resets and the black hole as
*resumes*. The audit must find 0 lost and 0 duplicated messages.

With ``--follow`` (``make run FOLLOW=1``) ``mconn-pipeline --follow`` watches the fleet
while it runs: the nodes close their telemetry files every 2 s, and the follower's page
(printed at the start; http://127.0.0.1:8090/ unless ``--follow-port``) shows the links,
the breaks and resumes, and the audit's verdict, a few seconds behind. After the stop it
reads the last files, its verdict is printed, and it is stopped before the batch audit.

Every process started is recorded in ``RUN/pids`` and stopped by its PID: at the end,
on an error, and on Ctrl-C. Exit status: 0 when the run and the audit are clean, 1 when
a node failed to start or the pipeline failed, 3 when the audit found lost or
duplicated messages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import signal
import urllib.request
import sys
import time

from twisted.internet import defer, protocol, task, threads

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: mconn and reactors next to examples/
sys.path.insert(0, str(HERE.parent))

from fleet_nodes import NODE_COUNT, Fleet, FleetError  # noqa: E402
from fleet_view import Progress, print_status_urls, print_summary, run_pipeline  # noqa: E402

#: Exit status after Ctrl-C, as a shell reports a process ended by SIGINT.
INTERRUPTED = 130


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleet.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long the fleet runs once it is up (default 60; at least 10)",
    )
    p.add_argument("--out", metavar="DIR", help="run directory (default run/fleet-<timestamp>)")
    p.add_argument("--nodes", type=int, default=NODE_COUNT, help=f"fleet size, at least 3 (default {NODE_COUNT})")
    p.add_argument(
        "--bulk-rate",
        type=float,
        default=64 * 1024,
        metavar="BYTES",
        help="bulk bytes per second from each node to each peer (default 65536)",
    )
    p.add_argument("--no-pipeline", action="store_true", help="stop after the fleet; no audit")
    p.add_argument(
        "--follow", action="store_true", help="watch the fleet live with mconn-pipeline --follow (a page on 127.0.0.1)"
    )
    p.add_argument("--follow-port", type=int, default=8090, metavar="PORT", help="the live page's port (default 8090)")
    args = p.parse_args(argv)
    if args.duration < 10:
        p.error(f"--duration must be at least 10 seconds, got {args.duration}")
    if not args.bulk_rate > 0:
        p.error(f"--bulk-rate must be a positive number of bytes per second, got {args.bulk_rate}")
    if args.nodes < 3:
        p.error(f"--nodes must be at least 3, got {args.nodes}")
    if args.out is None:
        args.out = str(ROOT / "run" / time.strftime("fleet-%Y%m%d-%H%M%S"))
    return args


async def main(clock, args) -> int:
    run_dir = pathlib.Path(args.out).resolve()
    progress = Progress(clock, total=args.duration)
    fleet = Fleet(
        clock,
        run_dir,
        count=args.nodes,
        duration=args.duration,
        bulk_rate=args.bulk_rate,
        progress=progress,
        pex=importlib.util.find_spec("reactors.pex") is not None,
        follow=args.follow,
    )
    follower = LiveView(clock, run_dir) if args.follow else None
    await task.deferLater(clock, 0, lambda: None)  # the reactor runs; replace its signal handlers
    catch_signals(clock, fleet)
    # Should the Twisted reactor stop some other way, the nodes are stopped first.
    clock.addSystemEventTrigger("before", "shutdown", fleet.stop_all)
    try:
        print(f"fleet: {args.nodes} nodes for {args.duration:g} s, run directory {run_dir}", flush=True)
        print(f"fleet: {fleet.describe_features()}", flush=True)
        if follower is not None:
            fleet.telemetry_dir.mkdir(parents=True, exist_ok=True)
            await follower.start(fleet.telemetry_dir, args.follow_port)
        await fleet.start()
        progress.done()
        print_status_urls(fleet.nodes)  # the seed's change when it is restarted
        await fleet.run_schedule()
    except FleetError as e:
        fleet.failures.insert(0, str(e))
    finally:
        await fleet.stop_all()
        progress.done()
        if follower is not None:
            await follower.finish(fleet.telemetry_dir)
    print(f"fleet: stopped; {fleet.describe_faults()}", flush=True)
    if fleet.failures:
        for failure in fleet.failures:
            print(f"fleet: error: {failure}", file=sys.stderr, flush=True)
        return INTERRUPTED if fleet.waits.interrupted else 1
    if args.no_pipeline:
        return 0
    result = await run_pipeline(clock, fleet.telemetry_dir, run_dir / "pipeline", progress, fleet.waits)
    progress.done()
    if fleet.waits.interrupted:
        print(f"fleet: the audit was interrupted by {fleet.waits.interrupted}", file=sys.stderr, flush=True)
        return INTERRUPTED
    (run_dir / "summary.json").write_text(json.dumps(result.record, indent=2, default=str) + "\n")
    return print_summary(result, fleet)


class _Child(protocol.ProcessProtocol):
    def __init__(self) -> None:
        self.out = bytearray()
        self.ended = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def processEnded(self, reason) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


class LiveView:
    """``mconn-pipeline --follow`` beside the fleet, recorded in RUN/pids, stopped by its PID."""

    def __init__(self, clock, run_dir: pathlib.Path) -> None:
        self.clock = clock
        self.run_dir = run_dir
        self.child = _Child()
        self.pid: int | None = None
        self.url: str | None = None

    async def start(self, telemetry_dir: pathlib.Path, port: int) -> None:
        program = pathlib.Path(sys.executable).with_name("mconn-pipeline")
        args = [
            str(program),
            "--follow",
            str(telemetry_dir),
            "--port",
            str(port),
            "--out",
            str(self.run_dir / "follow"),
        ]
        log = open(self.run_dir / "follow.log", "wb")
        transport = self.clock.spawnProcess(
            self.child,
            args[0],
            args,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            childFDs={0: "w", 1: "r", 2: log.fileno()},
        )
        log.close()
        self.pid = transport.pid
        with open(self.run_dir / "pids", "a") as f:
            f.write(f"follow {self.pid} -\n")
        for _ in range(120):  # Spark starts in 10 to 20 s
            match = re.search(rb"the page is (http://\S+/)", bytes(self.child.out))
            if match or self.child.ended.called:
                break
            await task.deferLater(self.clock, 0.5, lambda: None)
        if not match:
            print(f"fleet: the live view did not start; see {self.run_dir / 'follow.log'}", file=sys.stderr, flush=True)
            return
        self.url = match.group(1).decode()
        print(f"fleet: live view {self.url} (links, resumes and the audit, a few seconds behind)", flush=True)

    async def finish(self, telemetry_dir: pathlib.Path) -> None:
        """Wait (bounded) until the follower read every closed file, print its verdict, stop it."""
        try:
            if self.url is not None:
                closed = len([p for p in telemetry_dir.iterdir() if re.search(r"\.json\.\d{8}T\d{6}Z-\d+$", p.name)])
                state = None
                for _ in range(60):
                    state = await threads.deferToThread(self._state)
                    if state is not None and state["files"] >= closed:
                        break
                    await task.deferLater(self.clock, 1, lambda: None)
                if state is not None and state["audit"]:
                    a = state["audit"]
                    print(
                        f"fleet: live view: {state['files']} files, {a['messages_audited']} messages audited, "
                        f"lost {a['lost']}, duplicated {a['duplicated']}",
                        flush=True,
                    )
        finally:
            if self.pid is not None and not self.child.ended.called:
                os.kill(self.pid, signal.SIGTERM)
                timer = self.clock.callLater(60, lambda: self.child.ended.called or os.kill(self.pid, signal.SIGKILL))
                await self.child.ended
                if timer.active():
                    timer.cancel()

    def _state(self):
        try:
            with urllib.request.urlopen(f"{self.url}state.json", timeout=10) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None


def catch_signals(clock, fleet) -> None:
    """SIGINT (Ctrl-C) and SIGTERM end the run early, still stopping every node by PID;
    a second one while stopping SIGKILLs what is left."""

    def handle(number, frame):
        clock.callFromThread(interrupted, signal.Signals(number).name)

    def interrupted(name):
        if fleet.waits.interrupted:
            fleet.stop_all()
        fleet.waits.interrupt(name)

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


if __name__ == "__main__":
    arguments = parse_args()

    async def run(clock):
        code = await main(clock, arguments)
        raise SystemExit(code)  # task.react exits with a SystemExit's code

    task.react(lambda clock: defer.ensureDeferred(run(clock)))
