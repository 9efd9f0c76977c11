"""mconn against raw Twisted framing, sender and receiver in separate processes.

    .venv/bin/python bench/run.py [--quick] [--repeat N] [--duration S]
        [--scenarios bulk,priority,small,rtt] [--profile DIR | --py-spy DIR]
        [--raw-framing hand|int32] [--no-pin] [--nodelay] [--notsent-lowat BYTES]

Every measurement runs over the raw baseline (4-byte big-endian length + payload,
links.py) and over mconn (default Config: 1024-byte max_packet_payload), back to back,
in each of ``--repeat`` rounds; the table shows medians and mconn/raw. The scenarios are
described in scenarios.py. A measurement starts a receiver process (role.py), which
listens on 127.0.0.1 port 0 and prints its port and node id, then a sender process.
Each role runs in its own session; whatever of it is still running at the end is killed
through that process group's id.

Results go to stdout as a table and to bench/out/results-<time>.json (and latest.json).
``--profile DIR`` (cProfile) or ``--py-spy DIR`` runs every role under a profiler and
prints the top functions of the mconn roles; profiled figures are not the real ones.
``--nodelay`` and ``--notsent-lowat`` are experiments on socket options, off by default.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

import report

HERE = os.path.dirname(os.path.abspath(__file__))
MCONN_DIR = os.path.join(os.path.dirname(HERE), "mconn")
OUT_DIR = os.path.join(HERE, "out")
SCENARIOS = ("bulk", "priority", "small", "rtt")
IMPLS = ("raw", "mconn")
#: The options recorded with the results.
SETTINGS = ("duration", "repeat", "rtt_count", "raw_framing", "pin", "nodelay", "notsent_lowat", "max_packet_payload",
            "profile", "py_spy")

# -- orchestration ------------------------------------------------------------------


def role_command(args, role: str, impl: str, scenario: str, extra: list[str]) -> list[str]:
    cmd = [sys.executable]
    if args.py_spy:
        os.makedirs(args.py_spy, exist_ok=True)
        out = os.path.join(args.py_spy, f"{scenario}-{impl}-{role}.txt")
        cmd = [args.py_spy_bin, "record", "--nonblocking", "-r", "1000", "-f", "raw", "-o", out, "--"] + cmd
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        cmd += ["-m", "cProfile", "-o", os.path.join(args.profile, f"{scenario}-{impl}-{role}.prof")]
    cmd += [
        os.path.abspath(__file__),
        "--role", role,
        "--impl", impl,
        "--scenario", scenario,
        "--duration", str(args.duration),
        "--deadline", str(args.duration + 20),
        "--rtt-count", str(args.rtt_count),
        "--raw-framing", args.raw_framing,
    ] + ["--pin" if args.pin else "--no-pin"] + (["--nodelay"] if args.nodelay else [])
    if args.notsent_lowat:
        cmd += ["--notsent-lowat", str(args.notsent_lowat)]
    cmd += ["--max-packet-payload", str(args.max_packet_payload)]
    return cmd + extra


def read_json_line(proc, timeout: float) -> dict:
    """The first JSON line on ``proc``'s stdout, waiting at most ``timeout`` seconds.

    Lines that are not JSON objects (a profiler's chatter) are skipped.
    """
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            while b"\n" in data:
                line, _, data = data.partition(b"\n")
                if line.startswith(b"{"):
                    proc.leftover = data
                    return json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"no line from pid {proc.pid} within {timeout}s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError(f"pid {proc.pid} closed stdout before a line (exit {proc.wait()})")
            data += chunk


def result_of(name: str, out: bytes, err: bytes) -> dict:
    for line in out.decode().splitlines():
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if "result" in obj:
            return obj["result"]
        if "error" in obj:
            raise RuntimeError(f"{name}: {obj['error']}\n{err.decode()[-2000:]}")
    raise RuntimeError(f"{name}: no result\nstdout: {out.decode()[-500:]}\nstderr: {err.decode()[-2000:]}")


def start_role(cmd: list[str], stderr) -> subprocess.Popen:
    """A role process in its own session, so that its process group is only its own."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, cwd=HERE, start_new_session=True)


def stop_group(proc) -> None:
    """Kill what is left of a role: its process group, created for it (by its id)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def run_pair(args, impl: str, scenario: str) -> dict:
    """Run one measurement: a receiver, then a sender; both results."""
    procs = []
    errs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    try:
        recv = start_role(role_command(args, "recv", impl, scenario, []), errs[0])
        procs.append(recv)
        info = read_json_line(recv, 20)
        extra = ["--port", str(info["port"])] + (["--node-id", info["node_id"]] if "node_id" in info else [])
        send = start_role(role_command(args, "send", impl, scenario, extra), errs[1])
        procs.append(send)
        send_out, _ = send.communicate(timeout=args.duration + 30)
        recv_out, _ = recv.communicate(timeout=10)
        recv_out = recv.leftover + recv_out
        for f in errs:
            f.seek(0)
        recv_err, send_err = errs[0].read(), errs[1].read()
        for name, err in (("receiver", recv_err), ("sender", send_err)):
            if err.strip():
                print(f"  [{impl} {scenario} {name} stderr] {err.decode()[-1500:]}", file=sys.stderr)
        return {
            "recv": result_of(f"{impl} {scenario} receiver", recv_out, recv_err),
            "send": result_of(f"{impl} {scenario} sender", send_out, send_err),
        }
    finally:
        for proc in procs:
            stop_group(proc)
        for f in errs:
            f.close()


def run_rounds(args, scenarios: list[str]) -> tuple[list, list]:
    """Every measurement ``args.repeat`` times: (figures per round, role results per round)."""
    rounds, role_results = [], []
    for n in range(args.repeat):
        figs: dict = {impl: {} for impl in IMPLS}
        raw: dict = {impl: {} for impl in IMPLS}
        for scenario in scenarios:
            for impl in IMPLS:
                print(f"round {n + 1}/{args.repeat} {scenario:<9} {impl:<6} ...", end=" ", flush=True)
                raw[impl][scenario] = run_pair(args, impl, scenario)
                figs[impl][scenario] = report.figures(scenario, raw[impl][scenario])
                print(json.dumps(figs[impl][scenario]))
        rounds.append(figs)
        role_results.append(raw)
    return rounds, role_results


def write_json(doc: dict) -> str:
    os.makedirs(OUT_DIR, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(OUT_DIR, f"results-{stamp}.json")
    for name in (path, os.path.join(OUT_DIR, "latest.json")):
        with open(name, "w") as f:
            json.dump(doc, f, indent=2)
    return path


def orchestrate(args) -> int:
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in scenarios:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    if "priority" in scenarios and "bulk" not in scenarios:
        scenarios.insert(0, "bulk")  # the priority figure needs the unloaded bulk rate
    started = time.monotonic()
    digest = report.source_digest(MCONN_DIR)
    rounds, role_results = run_rounds(args, scenarios)
    rows = report.judge(rounds)
    print(f"\nmedians of {args.repeat} round(s); mconn/raw is the median of the per-round ratios")
    report.print_table(rows)
    print(f"\ntotal {time.monotonic() - started:.1f}s; mconn sources {digest['sha256']}")
    if report.source_digest(MCONN_DIR) != digest:
        print("WARNING: mconn/*.py changed during the run; the rounds may have measured different code")
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/run.py"] + sys.argv[1:]),
        "machine": report.machine(),
        "mconn_sources": digest,
        "settings": {k: getattr(args, k) for k in SETTINGS},
        "figures": report.median_of(rounds),
        "rows": rows,
        "rounds": rounds,
        "role_results": role_results,
    }
    print(f"wrote {write_json(doc)}")
    if args.profile:
        report.print_profiles(args.profile)
    if args.py_spy:
        report.print_py_spy(args.py_spy)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about 1 s per measurement (smoke run)")
    p.add_argument("--duration", type=float, default=None, help="seconds per measurement (default 2.5, --quick 1)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of " + ",".join(SCENARIOS) + " (priority implies bulk)")
    p.add_argument("--repeat", type=int, default=None, help="rounds; figures are medians (default 3, --quick 1)")
    p.add_argument("--rtt-count", type=int, default=None, help="timed round trips (default 5000, --quick 300)")
    p.add_argument("--profile", metavar="DIR", help="run every role under cProfile, writing DIR/*.prof")
    p.add_argument("--py-spy", metavar="DIR", help="run every role under py-spy record, writing DIR/*.txt")
    p.add_argument("--py-spy-bin", default="py-spy", help="the py-spy executable (pip install py-spy)")
    p.add_argument("--raw-framing", choices=("hand", "int32"), default="hand",
                   help="the raw receiver: hand-written (default, faster) or Int32StringReceiver")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin the sender and the receiver to different CPUs (default on)")
    p.add_argument("--nodelay", action="store_true", help="experiment: TCP_NODELAY on every connection")
    p.add_argument("--notsent-lowat", type=int, metavar="BYTES",
                   help="experiment: TCP_NOTSENT_LOWAT on every connection (mconn: via a private attribute)")
    p.add_argument("--max-packet-payload", type=int, default=1024, metavar="BYTES",
                   help="experiment: mconn Config.max_packet_payload (default 1024, the target's setting)")
    # role-process options (internal)
    p.add_argument("--role", choices=("send", "recv"), help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--node-id", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 1.0 if args.quick else 2.5
    for name in ("profile", "py_spy"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))  # the roles run in bench/
    if args.repeat is None:
        args.repeat = 1 if args.quick or args.profile or args.py_spy else 3
    if args.rtt_count is None:
        args.rtt_count = 300 if args.quick else 5000
    if args.role:
        from role import role_main

        role_main(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
