"""mconn against raw Twisted framing, sender and receiver in separate processes.

    .venv/bin/python bench/run.py [--quick] [--repeat N] [--duration S]
        [--scenarios bulk,priority,small,small_each,rtt,acks,resume,storm,shaped] [--profile DIR | --py-spy DIR]
        [--raw-framing hand|int32] [--no-pin] [--nodelay] [--notsent-lowat BYTES]
        [--before REV] [--pair-before REV] [--one-by-one] [--batch N] [--resets N]

Each of the first five scenarios runs over two raw Twisted baselines and over mconn (default
Config), back to back, in each of ``--repeat`` rounds; the table shows medians, mconn/raw
and mconn/prebuilt. Both baselines frame a message as a 4-byte big-endian length + payload
and parse every message in Python on the receiving side; they differ in the sender:

* ``raw`` (links.py): offers each message, packs its length and writes the frames in
  batches: per-message Python work on both sides, as mconn's;
* ``prebuilt`` (prebuilt.py): writes a frame built once, 1,000 100-byte frames (one 1 MiB
  frame) a ``transport.write``; in ``small_each`` one frame a write. The fastest a Python
  program moves these bytes here: the limit the targets of mconn/prebuilt speak of.

``prebuilt`` does not run ``priority``: it has no priorities, and ``raw`` already shows a
probe written behind the bulk. The scenarios
are described in scenarios.py: ``small_each`` is ``small`` one message at a time (mconn:
``try_send`` per message; prebuilt: one write per message). A measurement starts a receiver process (role.py), which
listens on 127.0.0.1 port 0 and prints its port and node id, then a sender process.
Each role runs in its own session; whatever of it is still running at the end is killed
through that process group's id.

``--pair-before REV`` adds mconn at REV (``git archive``-d, on PYTHONPATH, as for
``acks`` below; its compiled twin built there when REV has one, so that both trees run
what they would run installed) to every round of those five, run right after mconn now,
and prints a table for each: before and after in one run. The hot path of each tree
(``mconn --version``'s words) is printed and kept with the results. The bulk and small senders hand mconn
``--batch`` (1,000) messages at a time with ``try_send_many`` (``--one-by-one``:
``try_send`` each); figures before this option were measured with batches of 64.

Two scenarios measure the session layer instead of mconn against raw:

* ``acks``: bulk and small throughput of mconn at ``--before`` (default 82a45f3, the core
  before sessions: no recovery buffer, no acks), of mconn now (the working tree), and
  of mconn now with acks 64-256 times rarer (RARE_ACKS), in each of ``--repeat`` rounds,
  the order of the three reversed every other round; the table shows now/before (the
  throughput cost of sessions and acks) and now/rare-acks (of sending acks alone).
  Then msgcost.py gives each variant's CPU per message in one process, without sockets.
  The old code is ``git archive``-d into a temporary directory under /tmp,
  removed at the end, and given to its processes on PYTHONPATH; the same bench
  scripts drive both (bench/ did not change API since then; each role reports which
  mconn it imported, and the run stops if a role imported the wrong one).
* ``resume``: one receiver and one dialer process; ``--resets`` resets of the dialer's
  session through a fault proxy, each timed from the reset to the first re-delivered
  and first new message, against fresh connect + handshake times from the same run
  (resume.py).

And two of many peers and a shaped bottleneck, run by their own scripts (external.py): ``storm`` (many_peers.py:
a connect storm of ``--storm-peers`` against the raw round, memory, idle CPU) and
``shaped`` (shaped.py: priority under a 20 and a 2 Mbit/s bottleneck; needs root).

Results go to stdout as a table and to bench/out/results-<time>.json (and latest.json).
``--profile DIR`` (cProfile) or ``--py-spy DIR`` runs every role under a profiler and
prints the top functions of the mconn roles; profiled figures are not the real ones.
``--nodelay`` and ``--notsent-lowat`` are experiments on socket options, off by default.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import external
import report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MCONN_DIR = os.path.join(REPO, "mconn")
OUT_DIR = os.path.join(HERE, "out")
#: Scenarios run over the raw baselines and over mconn, then the session-layer ones.
PAIR_SCENARIOS = ("bulk", "priority", "small", "small_each", "rtt")
SCENARIOS = PAIR_SCENARIOS + ("acks", "resume", "storm", "shaped")
IMPLS = ("raw", "prebuilt", "mconn")
#: Scenarios the prebuilt-frames baseline does not run (it has no priorities).
NOT_PREBUILT = ("priority",)
#: The ``acks`` scenario's variants: mconn before the session layer, now, now with rare acks.
ACK_VARIANTS = ("before", "now", "rare_acks")
ACK_SCENARIOS = ("bulk", "small")
#: The rare-acks variant acknowledges this many times less often than the defaults
#: (256 messages / 1 MiB), within the recovery buffer (32 MiB), so it never stalls.
RARE_ACKS = {"ack_every_messages": 256 * 256, "ack_every_bytes": 8 << 20, "ack_interval": 1.0}
#: The Config fields the --ack-* options set (role.py passes on only those given).
ACK_FIELDS = ("ack_every_messages", "ack_every_bytes", "ack_interval")
#: The options recorded with the results.
SETTINGS = (
    "duration",
    "repeat",
    "rtt_count",
    "raw_framing",
    "pin",
    "nodelay",
    "notsent_lowat",
    "max_packet_payload",
    "profile",
    "py_spy",
    "before",
    "pair_before",
    "one_by_one",
    "batch",
    "resets",
) + ACK_FIELDS

# -- orchestration ------------------------------------------------------------------


def deadline(args, scenario: str) -> float:
    """Seconds after which a role gives up (the resume schedule takes ~0.5 s per reset)."""
    if scenario == "resume":
        return args.resets * 2.0 + 30
    return args.duration + 20


def role_command(args, role: str, impl: str, scenario: str, extra: list[str], tag: str = "") -> list[str]:
    """The command line of one role; ``tag`` (default ``impl``) names its profile files."""
    cmd = [sys.executable]
    tag = tag or impl
    if args.py_spy:
        os.makedirs(args.py_spy, exist_ok=True)
        out = os.path.join(args.py_spy, f"{scenario}-{tag}-{role}.txt")
        cmd = [args.py_spy_bin, "record", "--nonblocking", "-r", "1000", "-f", "raw", "-o", out, "--"] + cmd
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        cmd += ["-m", "cProfile", "-o", os.path.join(args.profile, f"{scenario}-{tag}-{role}.prof")]
    cmd += (
        [
            os.path.abspath(__file__),
            "--role",
            role,
            "--impl",
            impl,
            "--scenario",
            scenario,
            "--duration",
            str(args.duration),
            "--deadline",
            str(deadline(args, scenario)),
            "--resets",
            str(args.resets),
            "--rtt-count",
            str(args.rtt_count),
            "--raw-framing",
            args.raw_framing,
        ]
        + ["--pin" if args.pin else "--no-pin"]
        + (["--nodelay"] if args.nodelay else [])
    )
    cmd += ["--one-by-one"] if args.one_by_one else []
    cmd += ["--batch", str(args.batch)]
    if args.notsent_lowat:
        cmd += ["--notsent-lowat", str(args.notsent_lowat)]
    if args.max_packet_payload is not None:
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


def start_role(cmd: list[str], stderr, env=None) -> subprocess.Popen:
    """A role process in its own session, so that its process group is only its own."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, cwd=HERE, env=env, start_new_session=True)


def stop_group(proc) -> None:
    """Kill what is left of a role: its process group, created for it (by its id)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def run_pair(args, impl: str, scenario: str, options: list[str] = (), env=None, tag: str = "") -> dict:
    """Run one measurement: a receiver, then a sender; both results.

    ``options`` go to both roles; ``env`` (default: ours) is their environment; ``tag``
    names their profile files (default: ``impl``).
    """
    procs = []
    errs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    try:
        recv = start_role(role_command(args, "recv", impl, scenario, list(options), tag), errs[0], env)
        procs.append(recv)
        info = read_json_line(recv, 20)
        extra = ["--port", str(info["port"])] + (["--node-id", info["node_id"]] if "node_id" in info else [])
        send = start_role(role_command(args, "send", impl, scenario, list(options) + extra, tag), errs[1], env)
        procs.append(send)
        send_out, _ = send.communicate(timeout=deadline(args, scenario) + 10)
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


def run_rounds(args, scenarios: list[str], before: tuple | None = None) -> tuple[list, list]:
    """Every measurement ``args.repeat`` times: (figures per round, role results per round).

    ``before`` (``--pair-before``: the tree and environment of ``before_tree``) adds a
    third variant to each round, ``before``: mconn of that tree, run right after mconn now.
    """
    rounds, role_results = [], []
    impls = IMPLS + (("before",) if before else ())
    for n in range(args.repeat):
        figs: dict = {impl: {} for impl in impls}
        raw: dict = {impl: {} for impl in impls}
        for scenario in scenarios:
            for impl in impls:
                if impl == "prebuilt" and scenario in NOT_PREBUILT:
                    continue
                print(f"round {n + 1}/{args.repeat} {scenario:<9} {impl:<6} ...", end=" ", flush=True)
                options = given_ack_options(args) if impl != "raw" else []
                if impl == "before":
                    tree, env = before
                    result = run_pair(args, "mconn", scenario, options, env, "mconn_before")
                    for side in ("send", "recv"):
                        check_mconn_file("before", result[side]["process"].get("mconn_file"), tree)
                else:
                    result = run_pair(args, impl, scenario, options)
                raw[impl][scenario] = result
                figs[impl][scenario] = report.figures(scenario, result)
                print(json.dumps(figs[impl][scenario]))
        rounds.append(figs)
        role_results.append(raw)
    return rounds, role_results


def run_pairs_with_before(args, scenarios: list[str]) -> dict:
    """``--pair-before REV``: raw, mconn now and mconn at REV in the same rounds; the
    table of each mconn against raw."""
    with before_tree(args.pair_before) as (tree, commit):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
        digest = report.source_digest(os.path.join(tree, "mconn"))
        before_path = hot_path(env)
        print(f"before = mconn at {commit[:7]}: {before_path}")
        rounds, role_results = run_rounds(args, scenarios, (tree, env))
    rows_before = report.judge([{"raw": r["raw"], "prebuilt": r["prebuilt"], "mconn": r["before"]} for r in rounds])
    rows = report.judge([{"raw": r["raw"], "prebuilt": r["prebuilt"], "mconn": r["mconn"]} for r in rounds])
    print(
        f"\nbefore = mconn at {commit[:7]} (sources {digest['sha256']}; {before_path}), same rounds; "
        f"medians of {args.repeat} round(s); mconn/raw and mconn/prebuilt are medians of the per-round ratios"
    )
    report.print_table(rows_before)
    print("\nnow = this tree")
    report.print_table(rows)
    return {
        "before_commit": commit,
        "before_sources": digest,
        "before_hot_path": before_path,
        "rows_before": rows_before,
        "rows": rows,
        "rounds": rounds,
        "role_results": role_results,
    }


# -- the session-layer scenarios ------------------------------------------------------


#: What a tree's build needs besides mconn/ (archived when the commit has them).
BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml")
#: The compiled twin's source: a tree that has it is built as ``make`` builds it.
SPEEDUPS_SOURCE = "mconn/core/_speedups.pyx"


def _in_commit(commit: str, path: str) -> bool:
    return (
        subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{commit}:{path}"], capture_output=True).returncode == 0
    )


@contextlib.contextmanager
def before_tree(rev: str):
    """mconn/ as of ``rev``, extracted into a new directory under /tmp, removed on exit.

    If the commit has the compiled twin, it is built there (in place, as ``make`` does),
    so that the tree runs on what it would run on when installed, not on its pure-Python
    functions; a failed build leaves it on those (``hot_path`` says which).
    Yields (directory, full commit id); the directory goes first on a role's PYTHONPATH.
    """
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    directory = tempfile.mkdtemp(prefix=f"mconn-bench-{commit[:7]}-", dir="/tmp")
    try:
        paths = ["mconn"] + [p for p in BUILD_FILES if _in_commit(commit, p)]
        archive = subprocess.Popen(
            ["git", "-C", REPO, "archive", "--format=tar", commit, *paths], stdout=subprocess.PIPE
        )
        subprocess.run(["tar", "-x", "-C", directory], stdin=archive.stdout, check=True)
        archive.stdout.close()
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
        if _in_commit(commit, SPEEDUPS_SOURCE) and "setup.py" in paths:
            build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
            done = subprocess.run(build, cwd=directory, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(f"WARNING: building the compiled twin at {commit[:7]} failed:\n{done.stderr[-1500:]}")
        yield directory, commit
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def hot_path(env=None) -> str:
    """Which per-packet path the mconn that ``env`` imports runs (``mconn --version``'s words)."""
    probe = (
        "try:\n from mconn.core.speedups import describe\nexcept ImportError:\n"
        " print('pure Python (no compiled twin in this tree)')\nelse:\n print(describe())"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=HERE, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"cannot import mconn to ask its hot path:\n{done.stderr[-1500:]}")
    return done.stdout.strip()


def as_options(fields: dict) -> list[str]:
    """``{"ack_interval": 1.0}`` -> ``["--ack-interval", "1.0"]``."""
    return [x for name, value in fields.items() for x in ("--" + name.replace("_", "-"), str(value))]


def given_ack_options(args) -> list[str]:
    """The --ack-* experiment options given on our command line, for mconn roles."""
    return as_options({k: getattr(args, k) for k in ACK_FIELDS if getattr(args, k) is not None})


def ack_options(variant: str) -> list[str]:
    return as_options(RARE_ACKS) if variant == "rare_acks" else []


def check_mconn_file(variant: str, path: str | None, tree: str) -> None:
    """Stop the run if a process imported the wrong mconn (PYTHONPATH not honoured)."""
    if (variant == "before") != (path or "").startswith(tree + os.sep):
        raise RuntimeError(f"acks {variant}: a process imported mconn from {path!r}")


def run_msgcost(variant: str, env, tree: str) -> dict:
    """msgcost.py for one variant: CPU per message in one process, without sockets."""
    cmd = [sys.executable, os.path.join(HERE, "msgcost.py")] + ack_options(variant)
    done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"msgcost {variant} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check_mconn_file(variant, result.pop("mconn_file"), tree)
    return result


def run_acks(args) -> dict:
    """The ``acks`` scenario: bulk and small over each variant, alternating the order;
    then, per round and variant, msgcost.py."""
    rounds, costs = [], []
    with before_tree(args.before) as (tree, commit):
        before_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
        digest = report.source_digest(os.path.join(tree, "mconn"))
        for n in range(args.repeat):
            order = ACK_VARIANTS if n % 2 == 0 else ACK_VARIANTS[::-1]
            figs: dict = {v: {} for v in ACK_VARIANTS}
            for scenario in ACK_SCENARIOS:
                for variant in order:
                    print(f"acks round {n + 1}/{args.repeat} {scenario:<6} {variant:<9} ...", end=" ", flush=True)
                    env = before_env if variant == "before" else None
                    result = run_pair(args, "mconn", scenario, ack_options(variant), env, f"mconn_{variant}")
                    for side in ("send", "recv"):
                        check_mconn_file(variant, result[side]["process"].get("mconn_file"), tree)
                    figs[variant][scenario] = report.figures(scenario, result)
                    print(json.dumps(figs[variant][scenario]))
            rounds.append(figs)
            cost = {}
            for variant in order:
                print(f"acks round {n + 1}/{args.repeat} msgcost {variant:<9} ...", end=" ", flush=True)
                cost[variant] = run_msgcost(variant, before_env if variant == "before" else None, tree)
                print(json.dumps(cost[variant]))
            costs.append(cost)
    rows = report.judge_acks(rounds)
    cost_rows = report.judge_msgcost(costs)
    print(
        f"\nacks: medians of {args.repeat} round(s); before = mconn at {commit[:7]} "
        f"(sources {digest['sha256']}), rare acks = {RARE_ACKS}"
    )
    report.print_variants(rows, ("now_over_before", "now_over_rare_acks"))
    print("\nCPU per message in one process, no sockets (msgcost.py: smallest batch; medians of the rounds)")
    report.print_variants(cost_rows, ("before_over_now", "rare_acks_over_now"))
    return {
        "before_commit": commit,
        "before_sources": digest,
        "rare_acks": RARE_ACKS,
        "rows": rows,
        "rounds": rounds,
        "msgcost_rows": cost_rows,
        "msgcost_rounds": costs,
    }


def run_resume(args) -> dict:
    """The ``resume`` scenario: one receiver, one dialer with the proxy, ``--resets`` resets."""
    print(f"resume: {args.resets} resets ...", flush=True)
    result = run_pair(args, "mconn", "resume")
    figs = report.resume_figures(result)
    print()
    report.print_resume(figs)
    return {"figures": figs, "role_results": result}


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
    load = os.getloadavg()
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/run.py"] + sys.argv[1:]),
        "machine": report.machine(),
        "mconn_sources": digest,
        "hot_path": hot_path(),
        "settings": {k: getattr(args, k) for k in SETTINGS},
    }
    print(f"mconn now (this tree): {doc['hot_path']}")
    pair = [s for s in scenarios if s in PAIR_SCENARIOS]
    if pair and args.pair_before:
        doc["pair_before"] = run_pairs_with_before(args, pair)
    elif pair:
        rounds, role_results = run_rounds(args, pair)
        rows = report.judge(rounds)
        print(f"\nmedians of {args.repeat} round(s); mconn/raw and mconn/prebuilt are medians of the per-round ratios")
        report.print_table(rows)
        doc.update(figures=report.median_of(rounds), rows=rows, rounds=rounds, role_results=role_results)
    if "acks" in scenarios:
        doc["acks"] = run_acks(args)
    if "resume" in scenarios:
        doc["resume"] = run_resume(args)
    if "storm" in scenarios:
        doc["storm"] = external.run_storm(args)
    if "shaped" in scenarios:
        doc["shaped"] = external.run_shaped(args)
    doc["load_average"] = {"start": load, "end": os.getloadavg()}
    print(
        f"\ntotal {time.monotonic() - started:.1f}s; mconn sources {digest['sha256']}; "
        f"load average (1 min) {load[0]:.2f} at start, {doc['load_average']['end'][0]:.2f} at end"
    )
    if report.source_digest(MCONN_DIR) != digest:
        print("WARNING: mconn/*.py changed during the run; the rounds may have measured different code")
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
    p.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated subset of " + ",".join(SCENARIOS) + " (priority implies bulk)",
    )
    p.add_argument("--repeat", type=int, default=None, help="rounds; figures are medians (default 3, --quick 1)")
    p.add_argument("--rtt-count", type=int, default=None, help="timed round trips (default 5000, --quick 300)")
    p.add_argument("--profile", metavar="DIR", help="run every role under cProfile, writing DIR/*.prof")
    p.add_argument("--py-spy", metavar="DIR", help="run every role under py-spy record, writing DIR/*.txt")
    p.add_argument("--py-spy-bin", default="py-spy", help="the py-spy executable (pip install py-spy)")
    p.add_argument(
        "--raw-framing",
        choices=("hand", "int32"),
        default="hand",
        help="the raw receiver: hand-written (default, faster) or Int32StringReceiver",
    )
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin the sender and the receiver to different CPUs (default on)",
    )
    p.add_argument("--nodelay", action="store_true", help="experiment: TCP_NODELAY on every connection")
    p.add_argument(
        "--notsent-lowat",
        type=int,
        metavar="BYTES",
        help="experiment: TCP_NOTSENT_LOWAT on every connection (mconn: via a private attribute)",
    )
    p.add_argument(
        "--max-packet-payload",
        type=int,
        default=None,
        metavar="BYTES",
        help="experiment: mconn Config.max_packet_payload (default: Config's, the target's setting)",
    )
    p.add_argument(
        "--before",
        default="82a45f3",
        metavar="REV",
        help="acks: the commit measured as 'before' (default 82a45f3, the core before sessions)",
    )
    p.add_argument(
        "--pair-before",
        metavar="REV",
        help="bulk, priority, small, small_each, rtt: also measure mconn at REV in the same rounds",
    )
    p.add_argument(
        "--one-by-one",
        action="store_true",
        help="bulk and small: the mconn sender calls try_send per message, not try_send_many",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1000,
        metavar="N",
        help="bulk and small: messages the sender offers at a time (mconn: try_send_many of N; default 1000)",
    )
    p.add_argument("--resets", type=int, default=None, help="resume: resets to time (default 20, --quick 5)")
    p.add_argument("--storm-peers", type=int, default=10000, help="storm: peers (default 10000, --quick 3000)")
    p.add_argument("--storm-dialers", type=int, default=4, help="storm: dialer processes (default 4, --quick 2)")
    p.add_argument("--storm-runs", type=int, default=3, help="storm: runs, figures are medians (default 3, --quick 1)")
    for name in ("ack_every_messages", "ack_every_bytes"):
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            help=f"experiment: mconn Config.{name} (the raw-vs-mconn scenarios)",
        )
    p.add_argument(
        "--ack-interval", type=float, help="experiment: mconn Config.ack_interval (the raw-vs-mconn scenarios)"
    )
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
    if args.resets is None:
        args.resets = 5 if args.quick else 20
    if args.batch < 1:
        p.error(f"--batch must be at least 1, not {args.batch}")
    if args.role:
        from role import role_main
        from scenarios import Filler

        Filler.size = args.batch
        role_main(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
