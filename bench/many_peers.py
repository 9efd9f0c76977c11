"""Many peers on one listening Switch: connect storm, memory, idle CPU, broadcast.

    .venv/bin/python bench/many_peers.py [--peers 10000] [--dialers 4] [--idle 130]
        [--before REV] [--telemetry file|none] [--profile FILE] [--py-spy PREFIX] [--raw-idle]

One listener process runs a Switch at the default Config with the admission limits
raised as an operator would for this many peers (``limits``), writing its telemetry to
a file in a temporary directory as ``TelemetryFileService`` does (``--telemetry none``:
nowhere). ``--dialers`` other processes each hold their share of the peers as raw mconn
connections (``RawPeer``: a hello with a session request, then pongs for the listener's
pings; no messages are sent, so nothing is acknowledged), from 200 loopback source
addresses (127.0.0.2 and up) so that neither ephemeral ports nor a per-address count
bound the run. Every process raises its RLIMIT_NOFILE to the hard limit.

The phases, in one run, driven over the processes' stdin and stdout (one JSON object a
line):

1. ``raw``: every dialer opens its share of ``--peers`` plain TCP connections to a plain
   Twisted port of the listener, at most ``CONCURRENCY`` under way per dialer, then closes
   them. The listener times its accepts, first to last: raw TCP connects per second.
   Nothing is read or written: the baseline of ``accept_ratio``.
1b. ``round``: the same with the socket work of a handshake, to another plain port: the
   listener writes the bytes of its hello at once and those of a session answer once a
   dialer's hello's worth has arrived; a dialer writes a hello's bytes and is done once
   the listener's are in (both sizes as mconn's; the storm's dialers report the bytes
   they read up to the answer, to check). The listener times first accept to last
   answer: raw rounds per second, the baseline of ``handshake_ratio``; and its CPU time
   per round, from the order to half a second after the last dialer is done.
1c. ``raw_idle`` (with ``--raw-idle``): the floor of phase 4. The dialers hold their
   share of ``--peers`` plain TCP connections to a third plain port, whose protocol pings
   each one ``ping_interval`` (60 s) after the last byte received, one DelayedCall and a
   ``transport.write`` per ping, as a plain Twisted program keeps a connection alive; the
   dialers answer each ping byte with a pong byte. The listener's CPU time over
   ``--idle`` seconds as in phase 4; then the connections close. Phase 4's CPU time over
   this one is what mconn's keepalive, stats tick and telemetry cost above the pings'
   and pongs' own system calls.
2. ``storm``: the same, to the Switch, each connection done at the listener's session
   answer. The listener times its sessions (first connection made to the last session
   up): handshakes per second, and their ratio to 1b (and to 1). The wall time from the order to the
   last session is the connect-storm time; refused and failed connections are counted.
   The listener's CPU time (user + system) from the order to half a second after the
   last dialer is done, per session: the steadier figure on a shared machine, where the
   raw accept rate moves 2x between runs; and the wall time of that span spent in the
   garbage collector (``gc.callbacks``), with its collections by generation. The stats
   tick's LoopingCall is reset at the order, so that its next tick (``stats_interval``,
   10 s, later) falls into a storm only if the storm is that long, in either tree (the
   first tick of a peer logs and pings it); the ticks in the span are counted.
3. ``rss``: the listener's VmRSS after ``gc.collect()`` and ``malloc_trim(0)``, less the
   same before the storm, over the peers connected.
4. ``idle``: the listener's CPU time (user + system) over ``--idle`` seconds of wall with
   every peer connected and no traffic; the pings each dialer answered meanwhile and the
   listener's pending DelayedCalls. The default, 130 s, holds two keepalive intervals
   (``ping_interval``, 60 s) and a margin: every peer is pinged twice in it, and each
   ping's pong and the telemetry it moves are in the figure (a window of a second or
   two, as bench/external.py's, misses the keepalive almost entirely). What the listener
   did meanwhile is counted (``work``): event loop turns, runs of the shared timer heap,
   connection timers fired, reads, and the telemetry records written, by event.
5. ``broadcast``: ``Switch.broadcast`` of one 100-byte message to every peer: the CPU and
   wall time of the call and of the reactor turns until its bytes are written, per peer,
   and the DelayedCalls it left behind; the dialers count the messages they received.
6. ``round_after``: phase 1b again, with the storm's peers still connected (idle). The
   storm's rate over the mean of the two rounds is ``handshake_ratio_bracketed``: the
   machine's speed drifts by tens of percent within a minute on a shared host, and a
   baseline taken on both sides of the storm follows it better than one taken before.

``--before REV`` runs the whole sequence a second time against ``git archive REV`` on
PYTHONPATH, its compiled twins built there (``setup.py build_ext --inplace``; REV may
also be a directory holding an ``mconn`` package, used as it is), in the order
``--order`` gives (``before,now``). ``--profile FILE`` runs each listener under
cProfile during the storm and during ``idle``, and writes the stats to
FILE.<variant>.storm and FILE.<variant>; ``--py-spy PREFIX`` records
the listener with py-spy (400 Hz, raw folded stacks) from a second before the storm's
order to its end, into PREFIX.<variant>.txt, and over the idle window into
PREFIX.<variant>.idle.txt. A summary table goes to stdout and the JSON to
bench/out/many-peers-<time>.json. The processes' own code (listener, dialer) is
bench/many_peers_roles.py.
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

from many_peers_roles import IDLE, SETTLE, STORM_DEADLINE, dialer, listener  # bench/ is the script's path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT_DIR = os.path.join(HERE, "out")

# -- orchestration ----------------------------------------------------------------------------


class Role:
    """One process of the run; it speaks one JSON object a line on stdin and stdout."""

    def __init__(self, argv, env) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise TimeoutError(f"no answer within {timeout} s from {self.proc.args}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.proc.args} ended ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, timeout: float = 60.0, **command) -> dict:
        self.send(**command)
        return self.read(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_variant(args, name: str, pythonpath: str, tmp: str) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    roles = []
    try:
        profile = ["--profile", f"{args.profile}.{name}"] if args.profile else []
        listener_role = Role(
            ["--role", "listener", "--peers", str(args.peers), "--telemetry", args.telemetry, "--tmp", tmp, *profile],
            env,
        )
        roles.append(listener_role)
        hello = listener_role.read(30)
        dialers = [Role(["--role", "dialer", "--index", str(i)], env) for i in range(args.dialers)]
        roles += dialers
        for d in dialers:
            d.read(30)
        counts = shares(args.peers, args.dialers)
        result = {"mconn_file": hello["mconn_file"], "config": hello["config"]}
        # 1. raw TCP connects
        for d, n in zip(dialers, counts, strict=True):
            d.send(do="raw", port=hello["raw_port"], count=n)
        raw_dialers = [d.read(STORM_DEADLINE + 30) for d in dialers]
        time.sleep(0.5)  # a dialer is done at connect, the listener may not have accepted the last ones yet
        raw = listener_role.ask(do="raw_span")
        for d in dialers:
            d.ask(do="close_raw")
        time.sleep(2.0)  # the listener sees the raw connections go
        result["raw"] = dict(
            raw, rate=raw["accepted"] / raw["seconds"] if raw["seconds"] else None, dialers=raw_dialers
        )
        # 1b. the raw round: the same socket work as a handshake, without mconn
        result["round"] = raw_round(listener_role, dialers, counts, hello)
        if args.raw_idle:
            result["raw_idle"] = raw_keepalive_idle(args, listener_role, dialers, counts, hello)
        result["base_rss"] = listener_role.ask(do="base")["rss"]
        # 2. connect storm
        spy = py_spy(args, listener_role, f"{args.py_spy}.{name}.txt") if args.py_spy else None
        listener_role.ask(do="profile_storm")
        t0 = time.time()
        for d, n in zip(dialers, counts, strict=True):
            d.send(do="storm", port=hello["port"], count=n)
        storm_dialers = [d.read(STORM_DEADLINE + 30) for d in dialers]
        time.sleep(0.5)
        span = listener_role.ask(do="storm_span")
        stop_py_spy(spy)
        result["storm"] = dict(
            span,
            wall=(span["last_up"] - t0) if span["last_up"] else None,
            rate=span["sessions"] / span["seconds"] if span["seconds"] else None,
            answered=sum(s["answered"] for s in storm_dialers),
            refused=sum(s["refused"] for s in storm_dialers),
            failed=sum(s["failed"] for s in storm_dialers),
            dialers=storm_dialers,
        )
        rates = result["storm"]["rate"], result["raw"]["rate"], result["round"]["rate"]
        result["accept_ratio"] = rates[0] / rates[1] if all(rates[:2]) else None
        result["handshake_ratio"] = rates[0] / rates[2] if rates[0] and rates[2] else None
        # 3. memory, 4. idle CPU
        time.sleep(args.settle)
        result["rss"] = listener_role.ask(do="rss", timeout=120)
        pings0 = sum(d.ask(do="report")["pings"] for d in dialers)
        spy = py_spy(args, listener_role, f"{args.py_spy}.{name}.idle.txt") if args.py_spy else None
        result["idle"] = listener_role.ask(do="idle", seconds=args.idle, timeout=args.idle + 120)
        stop_py_spy(spy)
        result["idle"]["pings_answered"] = sum(d.ask(do="report")["pings"] for d in dialers) - pings0
        # 5. broadcast
        result["broadcast"] = listener_role.ask(do="broadcast", timeout=120)
        time.sleep(2.0)
        result["broadcast"]["received"] = sum(d.ask(do="report")["messages"] for d in dialers)
        # 6. the raw round again: the storm's rate against the mean of the rounds before
        # and after it, so that the machine's speed drifting meanwhile counts less
        result["round_after"] = raw_round(listener_role, dialers, counts, hello)
        after = result["round_after"]["rate"]
        result["handshake_ratio_bracketed"] = (
            rates[0] / ((rates[2] + after) / 2) if rates[0] and rates[2] and after else None
        )
        for d in dialers:
            d.send(do="quit")
        listener_role.send(do="quit")
        with contextlib.suppress(subprocess.TimeoutExpired):
            listener_role.proc.wait(60)
        return result
    finally:
        for role in roles:
            role.kill()


def raw_keepalive_idle(args, listener_role, dialers, counts, hello) -> dict:
    """Phase 1c (``--raw-idle``): the idle phase's floor. Every dialer opens its share of
    connections to a plain Twisted port of the listener that pings each connection
    ``ping_interval`` after the last byte received (a DelayedCall per connection, a
    ``transport.write`` per ping); the dialers answer each ping with a pong. The
    listener's CPU time over ``--idle`` seconds, as phase 4 measures it; then the
    connections are closed."""
    for d, n in zip(dialers, counts, strict=True):
        d.send(do="keepalive", port=hello["keepalive_port"], count=n)
    for d in dialers:
        d.read(STORM_DEADLINE + 30)
    time.sleep(2.0)  # the listener accepts the last ones
    pings0 = sum(d.ask(do="report")["raw_pings"] for d in dialers)
    idle = listener_role.ask(do="idle", seconds=args.idle, timeout=args.idle + 120)
    idle["pings_answered"] = sum(d.ask(do="report")["raw_pings"] for d in dialers) - pings0
    idle["connections"] = listener_role.ask(do="keepalive_count")["connections"]
    for d in dialers:
        d.ask(do="close_raw")
    time.sleep(2.0)
    return idle


def py_spy(args, role: Role, path: str) -> subprocess.Popen:
    """py-spy recording ``role``'s process (400 Hz, raw folded stacks) into ``path``."""
    spy = subprocess.Popen(
        [args.py_spy_bin, "record", "-p", str(role.proc.pid), "-r", "400", "-f", "raw", "-o", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(1.0)  # py-spy attaches
    return spy


def stop_py_spy(spy: subprocess.Popen | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(30)


def raw_round(listener_role, dialers, counts, hello) -> dict:
    """One raw round of every dialer's share of connections: what the listener's Twisted
    does for a handshake's bytes without mconn (its hello at once, the session answer's
    bytes once the dialer's hello is in)."""
    listener_role.ask(do="mark_cpu")
    for d, n in zip(dialers, counts, strict=True):
        d.send(do="round", port=hello["round_port"], count=n, answer_size=hello["answer_size"])
    round_dialers = [d.read(STORM_DEADLINE + 30) for d in dialers]
    time.sleep(0.5)  # as after the storm
    rounds = listener_role.ask(do="round_span")
    for d in dialers:
        d.ask(do="close_raw")
    time.sleep(2.0)
    return dict(
        rounds,
        rate=rounds["answered"] / rounds["seconds"] if rounds["seconds"] else None,
        answer_size=hello["answer_size"],
        dialers=round_dialers,
    )


def archive(rev: str, into: str) -> str:
    """A tree of mconn at ``rev`` (or the directory ``rev``, prepared by hand), with its
    compiled twins built as the working tree's are: without them the tree at REV would
    run on pure Python against a compiled one, and the comparison would measure that."""
    if os.path.isdir(os.path.join(rev, "mconn")):
        return os.path.abspath(rev)  # a tree prepared by hand
    tree = os.path.join(into, f"tree-{rev}")
    os.makedirs(tree)
    files = subprocess.run(
        ["git", "-C", REPO, "ls-tree", "--name-only", rev], check=True, capture_output=True, text=True
    )
    paths = ["mconn"] + (["setup.py"] if "setup.py" in files.stdout.split() else [])
    data = subprocess.run(["git", "-C", REPO, "archive", rev, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=data, check=True)
    if "setup.py" in paths:
        built = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, capture_output=True, text=True
        )
        if built.returncode != 0 or "pure Python" in built.stderr:
            print(f"{rev}: its compiled twins did not build, it runs on pure Python:\n{built.stderr[-2000:]}")
    return tree


def summary(name: str, r: dict) -> list[str]:
    def f(value, fmt="{:.2f}"):
        return "-" if value is None else fmt.format(value)

    s, idle, b, rd, ra = r["storm"], r["idle"], r["broadcast"], r["round"], r["round_after"]
    return [
        f"{name}: {r['mconn_file']}",
        f"  raw TCP accepts/s {f(r['raw']['rate'], '{:.0f}')} ({r['raw']['accepted']} in {f(r['raw']['seconds'])} s)",
        f"  raw rounds/s {f(rd['rate'], '{:.0f}')} ({rd['answered']} of {rd['accepted']} in {f(rd['seconds'])} s, "
        f"{rd['answer_size']} bytes answered, failed {sum(d['round_failed'] for d in rd['dialers'])}), "
        f"listener CPU {f(rd.get('cpu_us_per_round'), '{:.0f}')} us per round; after the storm "
        f"{f(ra['rate'], '{:.0f}')} ({f(ra.get('cpu_us_per_round'), '{:.0f}')} us per round)",
        f"  storm: {s['connected']} connected, {s['answered']} answered, refused {s['refused']}, failed {s['failed']}, "
        f"wall {f(s['wall'])} s, handshakes/s {f(s['rate'], '{:.0f}')}, ratio to raw rounds "
        f"{f(r['handshake_ratio'], '{:.3f}')} (to the mean of the rounds before and after "
        f"{f(r['handshake_ratio_bracketed'], '{:.3f}')}), to raw accepts {f(r['accept_ratio'], '{:.3f}')}, "
        f"bytes to the answer {[d['answer_at'] for d in s['dialers']]}, listener refusals {s['refusals']}",
        f"  storm CPU of the listener {f(s.get('cpu_seconds'))} s, {f(s.get('cpu_us_per_session'), '{:.0f}')} us per handshake"
        f" (garbage collector {f(s.get('gc_seconds'))} s, collections by generation {s.get('gc_collections')}; "
        f"stats ticks in that span {s.get('ticks_in_storm')})",
        f"  RSS/peer {f(r['rss']['per_peer'] and r['rss']['per_peer'] / 1024)} KiB over {r['rss']['peers']} peers",
        f"  idle CPU {f(idle['cpu_share'] * 100)}% ({f(idle['cpu_seconds'])} s over {f(idle['wall'])} s: "
        f"user {f(idle.get('user_seconds'))} s, system {f(idle.get('system_seconds'))} s), "
        f"pings answered {idle['pings_answered']}, DelayedCalls {idle['delayed_calls']}",
        f"  idle work: {idle.get('work')}",
        *raw_idle_summary(r, f),
        f"  broadcast to {b['peers']}: call {f(b['call_cpu'] * 1e3)} ms CPU ({f(b['call_us_per_peer'])} us/peer), "
        f"until written {f(b['cpu'] * 1e3)} ms CPU / {f(b['wall'] * 1e3)} ms wall, received {b['received']}, "
        f"DelayedCalls {b['delayed_calls']}",
    ]


def raw_idle_summary(r: dict, f) -> list[str]:
    raw = r.get("raw_idle")
    if raw is None:
        return []
    return [
        f"  plain Twisted keepalive, {raw['connections']} connections: idle CPU {f(raw['cpu_share'] * 100)}% "
        f"({f(raw['cpu_seconds'])} s: user {f(raw['user_seconds'])} s, system {f(raw['system_seconds'])} s), "
        f"pings answered {raw['pings_answered']}; mconn's idle CPU over it "
        f"{f(r['idle']['cpu_seconds'] / raw['cpu_seconds'] if raw['cpu_seconds'] else None)}"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["main", "listener", "dialer"], default="main")
    parser.add_argument("--peers", type=int, default=10000)
    parser.add_argument("--dialers", type=int, default=4)
    parser.add_argument("--idle", type=float, default=IDLE)
    parser.add_argument("--settle", type=float, default=SETTLE)
    parser.add_argument(
        "--raw-idle", action="store_true", help="also measure the plain Twisted keepalive's idle CPU (phase 1c)"
    )
    parser.add_argument("--now", default=REPO, help="the tree to measure as 'now' (default: this one)")
    parser.add_argument("--before", default=None)
    parser.add_argument("--order", default="before,now")
    parser.add_argument("--telemetry", choices=["file", "none"], default="file")
    parser.add_argument("--profile", default=None)
    parser.add_argument(
        "--py-spy", default=None, help="record the listener with py-spy during the storm to PREFIX.<variant>.txt (raw)"
    )
    parser.add_argument("--py-spy-bin", default=os.path.join(os.path.dirname(sys.executable), "py-spy"))
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    if args.role == "listener":
        return listener(args)
    if args.role == "dialer":
        return dialer(args)
    tmp = tempfile.mkdtemp(prefix="mconn-many-peers-")
    try:
        variants = {"now": os.path.abspath(args.now)}
        if args.before:
            variants["before"] = archive(args.before, tmp)
        order = [v for v in args.order.split(",") if v in variants]
        results, lines = {}, []
        for name in order:
            results[name] = run_variant(args, name, variants[name], tmp)
            lines += summary(name, results[name])
            print("\n".join(summary(name, results[name])), flush=True)
        os.makedirs(OUT_DIR, exist_ok=True)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
        path = os.path.join(OUT_DIR, f"many-peers-{stamp}.json")
        with open(path, "w") as out:
            json.dump({"settings": vars(args), "results": results}, out, indent=1)
        print(f"results: {path}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
