"""mconn against raw Twisted framing, sender and receiver in separate processes.

    .venv/bin/python bench/run.py [--quick] [--duration S] [--scenarios bulk,small,...]
                                  [--profile DIR] [--raw-framing hand|int32]

Every measurement runs twice in the same invocation, once over the raw baseline (4-byte
big-endian length + payload, links.py) and once over mconn (default Config, 1024-byte
max_packet_payload), and prints mconn/raw. The scenarios are described in scenarios.py.
Each measurement starts a receiver process (``--role recv``), which listens on
127.0.0.1 port 0 and prints its port (and node id) as a JSON line, then a sender process
(``--role send``). Both print one JSON result line and exit; each has a hard deadline,
and whatever is still running at the end is killed by its PID.

Results go to stdout as a table and to bench/out/results-<time>.json (and latest.json).
With ``--profile DIR`` every role process runs under cProfile (slower: use it to find
what bounds mconn, not for the figures) and the top functions are printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BULK_SIZE = 1 << 20  # scenarios.BULK_SIZE (not imported here: it imports mconn)
OUT_DIR = os.path.join(HERE, "out")
SCENARIOS = ("bulk", "priority", "small", "rtt")
IMPLS = ("raw", "mconn")

#: (label, target kind, bound) per the issue; "ratio" targets compare mconn/raw.
TARGETS = {
    "bulk": "mconn/raw >= 0.30",
    "small": "mconn/raw >= 0.15",
    "rtt": "p50 mconn/raw <= 1.4",
    "priority": "mconn probe p99 <= 5 ms with bulk >= 0.8 of unloaded",
}


# -- role processes -----------------------------------------------------------------


def role_main(args) -> None:
    """One end of one measurement, in its own process, on the global Twisted reactor."""
    from twisted.internet import reactor as clock
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        textFileLogObserver,
    )

    from links import SOCKET_OPTIONS, LinkReactor, raw_factory
    from scenarios import CHANNELS, Sender, Sink

    SOCKET_OPTIONS.update(nodelay=args.nodelay, notsent_lowat=args.notsent_lowat)
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0] if args.role == "send" else cpus[1]})

    globalLogBeginner.beginLoggingTo(
        [FilteringLogObserver(textFileLogObserver(sys.stderr), [LogLevelFilterPredicate(LogLevel.warn)])],
        redirectStandardIO=False,
    )

    def emit(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    started = {}

    def mark_start() -> None:
        started.update(cpu=time.process_time(), wall=time.monotonic(), faults=_minor_faults())

    def report(result: dict) -> None:
        # CPU use of this process from connection to report: who is the bottleneck?
        wall = time.monotonic() - started.get("wall", 0.0)
        cpu = time.process_time() - started.get("cpu", 0.0)
        faults = _minor_faults() - started.get("faults", 0)
        result = dict(result, process={"cpu_s": cpu, "wall_s": wall, "cpu_share": cpu / wall if wall else None, "minor_faults": faults})
        emit({"result": result})
        clock.callLater(0.3, stop)

    def stop() -> None:
        if clock.running:
            clock.stop()

    def give_up() -> None:
        emit({"error": f"{args.role} deadline of {args.deadline}s passed"})
        stop()

    if args.role == "recv":

        def on_link(link) -> None:
            mark_start()
            link.handler = Sink(link, report)

    else:

        def on_link(link) -> None:
            mark_start()
            sender = Sender(link, args.scenario, args.duration, clock, report, rtt_count=args.rtt_count)
            link.handler = sender
            clock.callLater(0.1, sender.start)

    def failed(failure) -> None:
        emit({"error": failure.getTraceback()})
        stop()

    if args.impl == "raw":
        from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint

        factory = raw_factory(on_link, args.raw_framing)
        if args.role == "recv":
            d = TCP4ServerEndpoint(clock, 0, interface="127.0.0.1").listen(factory)
            d.addCallback(lambda port: emit({"port": port.getHost().port}))
        else:
            d = TCP4ClientEndpoint(clock, "127.0.0.1", args.port).connect(factory)
    else:
        from mconn import Config, Switch

        switch = Switch([LinkReactor(CHANNELS[args.scenario], on_link)], config=Config(), clock=clock)
        switch.startService()
        if args.role == "recv":
            d = switch.listen("tcp:0:interface=127.0.0.1")
            d.addCallback(lambda port: emit({"port": port.getHost().port, "node_id": switch.node_id}))
        else:
            d = switch.dial(f"{args.node_id}@127.0.0.1:{args.port}")
    d.addErrback(failed)
    clock.callLater(args.deadline, give_up)
    clock.run()


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# -- orchestration ------------------------------------------------------------------


def role_command(args, role: str, impl: str, scenario: str, extra: list[str]) -> list[str]:
    cmd = [sys.executable]
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
    return cmd + extra


def read_json_line(proc, timeout: float) -> dict:
    """The first stdout line of ``proc`` as JSON, waiting at most ``timeout`` seconds."""
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"no line from pid {proc.pid} within {timeout}s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError(f"pid {proc.pid} closed stdout before a line (exit {proc.wait()})")
            data += chunk
    line, _, rest = data.partition(b"\n")
    proc.leftover = rest
    return json.loads(line)


def result_of(name: str, out: bytes, err: bytes) -> dict:
    for line in out.decode().splitlines():
        obj = json.loads(line)
        if "result" in obj:
            return obj["result"]
        if "error" in obj:
            raise RuntimeError(f"{name}: {obj['error']}\n{err.decode()[-2000:]}")
    raise RuntimeError(f"{name}: no result\nstdout: {out.decode()[-500:]}\nstderr: {err.decode()[-2000:]}")


def run_pair(args, impl: str, scenario: str) -> dict:
    """Run one measurement: a receiver, then a sender; both results."""
    procs = []
    errs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    try:
        recv = subprocess.Popen(role_command(args, "recv", impl, scenario, []), stdout=subprocess.PIPE, stderr=errs[0], cwd=HERE)
        procs.append(recv)
        info = read_json_line(recv, 20)
        extra = ["--port", str(info["port"])] + (["--node-id", info["node_id"]] if "node_id" in info else [])
        send = subprocess.Popen(role_command(args, "send", impl, scenario, extra), stdout=subprocess.PIPE, stderr=errs[1], cwd=HERE)
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
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for f in errs:
            f.close()


def figures(scenario: str, r: dict) -> dict:
    """The numbers one measurement reduces to, with each process's CPU share and cost.

    ``cpu_us`` is CPU time per unit of work (per MB, per message, per round trip) from
    connection to report: steadier than rates on a machine whose two vCPUs contend.
    """
    recv, send = r["recv"], r["send"]
    out, units = _figures(scenario, recv, send)
    out["cpu_share"] = {side: round(r[side]["process"]["cpu_share"], 3) for side in ("send", "recv")}
    out["minor_faults"] = {side: r[side]["process"]["minor_faults"] for side in ("send", "recv")}
    if units:
        out["cpu_us"] = {side: r[side]["process"]["cpu_s"] * 1e6 / units for side in ("send", "recv")}
    return out


def _figures(scenario: str, recv: dict, send: dict) -> tuple[dict, float | None]:
    """(figures, units of work for the CPU cost) of one measurement."""
    if scenario == "bulk":
        b = recv["B"]
        return {"MB_per_s": b["bytes_per_s"] / 1e6, "messages": b["messages"], "seconds": b["seconds"]}, (
            b["messages"] * BULK_SIZE / 1e6
        )
    if scenario == "small":
        m = recv["S"]
        return {"messages_per_s": m["messages_per_s"], "messages": m["messages"], "seconds": m["seconds"]}, m["messages"]
    if scenario == "priority":
        return {
            "bulk_MB_per_s": recv["B"]["bytes_per_s"] / 1e6,
            "probe": recv.get("probe", {"n": 0}),
            "probes_sent": send.get("probes_sent", 0),
            "probes_refused": send.get("probes_refused", 0),
        }, None
    return {"rtt": send["rtt"], "round_trips": send["round_trips"]}, send["round_trips"]


def median_of(rounds: list):
    """The per-leaf median of several rounds' figures (dicts of numbers, nested)."""
    first = rounds[0]
    if isinstance(first, dict):
        return {k: median_of([r[k] for r in rounds if k in r]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(rounds)
    return first


def judge(results: dict) -> list[dict]:
    """Rows of the report: each figure, mconn/raw, and pass/miss where a target applies."""
    raw, mc = results.get("raw", {}), results.get("mconn", {})
    rows = []

    def row(name, unit, a, b, target=None, passed=None, ratio=True):
        rows.append({
            "figure": name,
            "unit": unit,
            "raw": a,
            "mconn": b,
            "mconn_over_raw": (b / a) if ratio and a and b is not None else None,
            "target": target,
            "pass": passed,
        })

    def cpu_rows(scenario, unit):
        for side, name in (("send", "sender"), ("recv", "receiver")):
            row(f"  CPU {name}", unit, raw[scenario]["cpu_us"][side], mc[scenario]["cpu_us"][side])

    if "bulk" in raw and "bulk" in mc:
        a, b = raw["bulk"]["MB_per_s"], mc["bulk"]["MB_per_s"]
        row("bulk 1 MiB msgs", "MB/s", a, b, TARGETS["bulk"], b / a >= 0.30)
        cpu_rows("bulk", "us/MB")
    if "small" in raw and "small" in mc:
        a, b = raw["small"]["messages_per_s"], mc["small"]["messages_per_s"]
        row("small 100 B msgs", "msg/s", a, b, TARGETS["small"], b / a >= 0.15)
        cpu_rows("small", "us/msg")
    if "rtt" in raw and "rtt" in mc:
        a, b = raw["rtt"]["rtt"], mc["rtt"]["rtt"]
        row("round trip p50", "ms", a["p50_ms"], b["p50_ms"], TARGETS["rtt"], b["p50_ms"] / a["p50_ms"] <= 1.4)
        row("round trip p99", "ms", a["p99_ms"], b["p99_ms"])
        cpu_rows("rtt", "us/rt")
    if "priority" in raw and "priority" in mc:
        a, b = raw["priority"], mc["priority"]
        p99_ok = b["probe"].get("p99_ms", float("inf")) <= 5.0
        row("priority probe p50", "ms", a["probe"].get("p50_ms"), b["probe"].get("p50_ms"))
        row("priority probe p99", "ms", a["probe"].get("p99_ms"), b["probe"].get("p99_ms"), "mconn p99 <= 5 ms", p99_ok)
        row("bulk while probing", "MB/s", a["bulk_MB_per_s"], b["bulk_MB_per_s"])
        if "bulk" in raw and "bulk" in mc:
            fa = a["bulk_MB_per_s"] / raw["bulk"]["MB_per_s"]
            fb = b["bulk_MB_per_s"] / mc["bulk"]["MB_per_s"]
            row("  as fraction of unloaded", "x", fa, fb, "mconn >= 0.8", fb >= 0.8, ratio=False)
    return rows


def print_table(rows: list[dict]) -> None:
    def fmt(v):
        if v is None:
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3f}"

    header = (
        f"{'figure':<26}{'unit':<7}{'raw':>12}{'mconn':>12}{'mconn/raw':>11}{'spread':>15}  "
        f"{'target':<46}result"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "" if r["pass"] is None else ("PASS" if r["pass"] else "MISS")
        spread = r.get("rounds_mconn_over_raw") or r.get("rounds_mconn") or []
        spread_text = f"{min(spread):.2f}..{max(spread):.2f}" if len(spread) > 1 else ""
        print(
            f"{r['figure']:<26}{r['unit']:<7}{fmt(r['raw']):>12}{fmt(r['mconn']):>12}"
            f"{fmt(r['mconn_over_raw']):>11}{spread_text:>15}  {r['target'] or '':<46}{verdict}"
        )


def machine() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import twisted

    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "twisted": twisted.__version__,
    }


def print_profiles(directory: str, top: int = 18) -> None:
    import pstats

    for name in sorted(os.listdir(directory)):
        if name.endswith(".prof") and "-mconn-" in name:
            print(f"\n=== {name}: top {top} by tottime ===")
            pstats.Stats(os.path.join(directory, name)).strip_dirs().sort_stats("tottime").print_stats(top)


def orchestrate(args) -> int:
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in scenarios:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    if "priority" in scenarios and "bulk" not in scenarios:
        scenarios.insert(0, "bulk")  # the priority figure needs the unloaded bulk rate
    started = time.monotonic()
    rounds = []
    role_results = []
    for n in range(args.repeat):
        figs: dict = {impl: {} for impl in IMPLS}
        raw: dict = {impl: {} for impl in IMPLS}
        for scenario in scenarios:
            for impl in IMPLS:
                print(f"round {n + 1}/{args.repeat} {scenario:<9} {impl:<6} ...", end=" ", flush=True)
                r = run_pair(args, impl, scenario)
                raw[impl][scenario] = r
                figs[impl][scenario] = figures(scenario, r)
                print(json.dumps(figs[impl][scenario]))
        rounds.append(figs)
        role_results.append(raw)
    results = median_of(rounds)
    rows = judge(results)
    per_round = [judge(figs) for figs in rounds]
    for i, row in enumerate(rows):
        ratios = [r[i]["mconn_over_raw"] for r in per_round if r[i]["mconn_over_raw"] is not None]
        values = [r[i]["mconn"] for r in per_round if r[i]["mconn"] is not None]
        row["rounds_mconn_over_raw"] = ratios
        row["rounds_mconn"] = values
        row["rounds_pass"] = [r[i]["pass"] for r in per_round]
    print(f"\nmedians of {args.repeat} round(s); spread = per-round min..max of mconn/raw (or of mconn)")
    print_table(rows)
    print(f"\ntotal {time.monotonic() - started:.1f}s")
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/run.py"] + sys.argv[1:]),
        "machine": machine(),
        "settings": {
            "duration_s": args.duration,
            "repeat": args.repeat,
            "rtt_count": args.rtt_count,
            "raw_framing": args.raw_framing,
            "pinned": args.pin,
            "nodelay": args.nodelay,
            "notsent_lowat": args.notsent_lowat,
            "profiled": bool(args.profile),
        },
        "figures": results,
        "rows": rows,
        "rounds": rounds,
        "role_results": role_results,
    }
    os.makedirs(OUT_DIR, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for name in (f"results-{stamp}.json", "latest.json"):
        with open(os.path.join(OUT_DIR, name), "w") as f:
            json.dump(doc, f, indent=2)
    print(f"wrote {os.path.join(OUT_DIR, f'results-{stamp}.json')}")
    if args.profile:
        print_profiles(args.profile)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about 1 s per measurement (smoke run)")
    p.add_argument("--duration", type=float, default=None, help="seconds per measurement (default 2.5, --quick 1)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--repeat", type=int, default=None, help="rounds; figures are medians (default 3, --quick 1)")
    p.add_argument("--rtt-count", type=int, default=None, help="timed round trips (default 2000, --quick 300)")
    p.add_argument("--profile", metavar="DIR", help="run every role under cProfile, writing DIR/*.prof")
    p.add_argument("--raw-framing", choices=("hand", "int32"), default="hand")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin the sender and the receiver to different CPUs (default on)")
    p.add_argument("--nodelay", action="store_true", help="experiment: TCP_NODELAY on every connection")
    p.add_argument("--notsent-lowat", type=int, metavar="BYTES",
                   help="experiment: TCP_NOTSENT_LOWAT on every connection (mconn: via a private attribute)")
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
    if args.repeat is None:
        args.repeat = 1 if args.quick or args.profile else 3
    if args.rtt_count is None:
        args.rtt_count = 300 if args.quick else 2000
    if args.role:
        role_main(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
