"""A fleet of five mconn nodes on 127.0.0.1, with faults, audited afterwards: ``make run``.

    python examples/fleet.py [--duration 60] [--out DIR]

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

Every process started is recorded in ``RUN/pids`` and stopped by its PID: at the end,
on an error, and on Ctrl-C. Exit status: 0 when the run and the audit are clean, 1 when
a node failed to start or the pipeline failed, 3 when the audit found lost or
duplicated messages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import signal
import sys
import time

from twisted.internet import defer, task

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
    )
    await task.deferLater(clock, 0, lambda: None)  # the reactor runs; replace its signal handlers
    catch_signals(clock, fleet)
    # Should the Twisted reactor stop some other way, the nodes are stopped first.
    clock.addSystemEventTrigger("before", "shutdown", fleet.stop_all)
    try:
        print(f"fleet: {args.nodes} nodes for {args.duration:g} s, run directory {run_dir}", flush=True)
        print(f"fleet: {fleet.describe_features()}", flush=True)
        await fleet.start()
        progress.done()
        print_status_urls(fleet.nodes)  # the seed's change when it is restarted
        await fleet.run_schedule()
    except FleetError as e:
        fleet.failures.insert(0, str(e))
    finally:
        await fleet.stop_all()
        progress.done()
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
