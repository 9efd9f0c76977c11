"""What an idle connected peer costs a listener in memory, by file:line, in one or more trees.

    .venv/bin/python bench/peer_memory.py [--peers 2000] [--settle 22] [--top 30]
        [--tree REV_OR_DIR ...]

For each tree (a git revision, exported with ``git archive`` and its compiled twins
built as bench/many_peers.py's ``--before`` does, or a directory holding an ``mconn``
package; default: this working tree) a listener process runs a Switch at the default
Config with the admission limits raised for ``--peers`` (bench/many_peers_roles.py's
``limits``) and its telemetry written to a file, as bench/many_peers.py's listener
does; one dialer process (bench/many_peers.py's, on this working tree: only the wire
bytes of a hello and a pong) opens ``--peers`` raw mconn connections to it over
loopback TCP. Once every peer is connected the listener starts its stats tick (held
until then, so that the tick's first probe of each peer follows the storm on any
machine) and waits ``--settle`` seconds (22 s: two ticks, as bench/many_peers.py
waits for; the first pings every new peer; 4 s: none), then measures, after ``gc.collect()`` and ``malloc_trim(0)``:

* ``rss``: VmRSS, less the same after listening and before the first connection,
  over the peers connected (a run without tracemalloc: its own tables would count);
* ``trace``: in a second run of the same, with ``tracemalloc`` started before the
  Switch is built (one frame a trace), the bytes and blocks allocated since listening
  and still held, over the peers, grouped by file:line (and by file), the paths
  relative to the tree or to site-packages so that trees compare line by line;
* ``objects`` (of the run without tracemalloc, whose snapshots are objects too): the
  objects the collector tracks, by type, over the peers, and for
  each type with at least one instance a peer the largest ``len(vars(obj))`` of its
  new instances (measured last: ``vars`` builds the dict it looks at). CPython keeps
  up to ~30 attribute values without a dict; an object past that carries a dict of
  ~1.2 KiB (tests/adapter/test_inbound_handshake.py caps a connection at 28).

With two trees or more the tables are printed side by side with the difference of the
last against the first, largest first. The JSON goes to bench/out/peer-memory-<time>.json.
Nothing here is timed, so the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT_DIR = os.path.join(HERE, "out")
#: Seconds the listener waits for every peer before it measures what it has.
CONNECT_DEADLINE = 120.0


# -- the listener -----------------------------------------------------------------------------


def short_path(path: str, tree: str) -> str:
    """A trace's file relative to the tree or to site-packages, so trees compare."""
    for root in (tree, *sys.path):
        if root and path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1 :]
    return path


def new_objects_by_type(before: set[int]) -> dict[str, list]:
    """The objects the collector tracks that were not there at ``before``, by type."""
    found: dict[str, list] = collections.defaultdict(list)
    for obj in gc.get_objects():
        if id(obj) not in before:
            kind = type(obj)
            found[f"{kind.__module__}.{kind.__qualname__}"].append(obj)
    return found


def listener(args) -> None:
    import tracemalloc

    if args.trace:
        tracemalloc.start(1)
    from twisted.internet import reactor as clock
    from twisted.logger import globalLogBeginner

    from many_peers_roles import BACKLOG, limits, raise_nofile, rss_bytes  # bench/ is on the path
    from many_peers_bytes import CHANNEL

    from mconn import ChannelDescriptor, Config, Reactor, Switch

    raise_nofile()
    globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)
    fields = set(Config.__dataclass_fields__)
    config = Config(**{k: v for k, v in limits(args.peers).items() if k in fields})

    class Quiet(Reactor):
        def get_channels(self):
            return [ChannelDescriptor(CHANNEL, priority=1)]

    switch = Switch([Quiet()], config=config, clock=clock)
    telemetry = telemetry_service(args, switch)
    switch.startService()
    tree = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["mconn"].__file__)))
    base: dict = {}

    def connected() -> int:
        return sum(1 for p in switch.peers.values() if p.state == "connected")

    # The stats tick waits until every peer is connected, so that its first probe of
    # each peer comes after the storm whatever the machine's speed: which transports
    # write through Twisted's buffer first decides what the transport class's shared
    # attribute keys hold (bench/RESULTS.md, "Memory per peer").
    stats_loop = switch._stats_loop
    if stats_loop is not None and stats_loop.running:
        stats_loop.stop()

    def listening(port) -> None:
        gc.collect()
        base["objects"] = {id(o) for o in gc.get_objects()}
        base["snapshot"] = tracemalloc.take_snapshot() if args.trace else None
        base["rss"] = rss_bytes()
        base["at"] = time.monotonic()
        reply(port=port.getHost().port, mconn_file=sys.modules["mconn"].__file__)
        clock.callLater(0.5, wait)

    def wait() -> None:
        if connected() >= args.peers or time.monotonic() - base["at"] > CONNECT_DEADLINE:
            if stats_loop is not None:
                stats_loop.start(config.stats_interval, now=False)
            clock.callLater(args.settle, measure)
        else:
            clock.callLater(0.5, wait)

    def measure() -> None:
        try:
            measured()
        except Exception:  # an answer whatever failed: the orchestrator waits for one
            import traceback

            reply(error=traceback.format_exc())
        clock.stop()

    def measured() -> None:
        peers = connected()
        rss = rss_bytes()  # collects first
        result = {"peers": peers, "rss_per_peer": (rss - base["rss"]) / peers if peers else None}
        if args.trace:
            result["lines"], result["files"] = traced(base["snapshot"], tracemalloc.take_snapshot(), tree, peers)
            tracemalloc.stop()
        result["objects"] = objects(base["objects"], peers)
        reply(**result)

    switch.listen(f"tcp:0:interface=127.0.0.1:backlog={BACKLOG}").addCallback(listening)
    clock.run()
    if telemetry is not None:
        telemetry.stopService()


def telemetry_service(args, switch):
    """The telemetry file bench/many_peers.py's listener writes (its default); the module
    is mconn/telemetry_file.py in trees from before the packages. Asked of the tree's
    own files: the venv's editable install would find ``mconn.ops`` in this working
    tree for a tree that has none."""
    package = os.path.dirname(os.path.abspath(sys.modules["mconn"].__file__))
    if os.path.isdir(os.path.join(package, "ops")):
        from mconn.ops.telemetry_file import TelemetryFileService
    else:
        from mconn.telemetry_file import TelemetryFileService  # type: ignore[no-redef]

    service = TelemetryFileService(os.path.join(args.tmp, "telemetry.jsonl"), switch.node_id)
    service.startService()
    return service


def traced(before, after, tree: str, peers: int) -> tuple[dict, dict]:
    """Bytes and blocks a peer by file:line and by file, of what was allocated since
    ``before`` and is still held (tracemalloc's own lines left out)."""
    import tracemalloc

    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<unknown>")]
    before, after = before.filter_traces(keep), after.filter_traces(keep)
    lines: dict[str, list[float]] = {}
    for stat in after.compare_to(before, "lineno"):
        frame = stat.traceback[0]
        key = f"{short_path(frame.filename, tree)}:{frame.lineno}"
        lines[key] = [stat.size_diff / peers, stat.count_diff / peers]
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for key, (size, count) in lines.items():
        name = key.rsplit(":", 1)[0]
        files[name][0] += size
        files[name][1] += count
    return lines, dict(files)


def objects(before: set[int], peers: int) -> dict:
    """Tracked objects a peer by type; for each kind with an instance a peer or more, the
    most instance attributes of one, and the names only some of them set (``late``:
    name -> instances), each of which a class's closed keys may give a dict of its own.
    Measured last: ``vars`` builds the dict of each instance it is asked about."""
    found = new_objects_by_type(before)
    table = {}
    for name, instances in found.items():
        row: dict = {"per_peer": len(instances) / peers}
        if len(instances) >= peers and hasattr(instances[0], "__dict__") and not isinstance(instances[0], type):
            names = collections.Counter()
            for obj in instances:
                attributes = getattr(obj, "__dict__", None)
                if isinstance(attributes, dict):
                    names.update(attributes.keys())
                    row["max_attributes"] = max(row.get("max_attributes", 0), len(attributes))
            late = {key: count for key, count in names.items() if count < len(instances)}
            if late:
                row["late"] = late
        table[name] = row
    return table


def reply(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


# -- orchestration ----------------------------------------------------------------------------


def run_tree(args, tree: str, trace: bool, tmp: str) -> dict:
    """One listener of ``tree`` and one dialer of this working tree, until measured."""
    from many_peers import Role  # bench/ is the script's path

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, HERE]))
    argv = [sys.executable, os.path.abspath(__file__), "--role", "listener", "--peers", str(args.peers)]
    argv += ["--settle", str(args.settle), "--tmp", tmp] + (["--trace"] if trace else [])
    listener_proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
    dialer = None
    try:
        hello = json.loads(listener_proc.stdout.readline())
        dialer = Role(["--role", "dialer", "--index", "0"], dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, HERE])))
        dialer.read(30)
        dialer.send(do="storm", port=hello["port"], count=args.peers)
        line = listener_proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the listener of {tree} ended ({listener_proc.wait()})")
        result = json.loads(line)
        if "error" in result:
            raise RuntimeError(f"the listener of {tree} failed:\n{result['error']}")
        return dict(result, mconn_file=hello["mconn_file"])
    finally:
        if dialer is not None:
            dialer.kill()
        with contextlib.suppress(ProcessLookupError):
            listener_proc.kill()
        listener_proc.wait()


#: Modules renamed when mconn was split into packages (flat name: name since).
RENAMED = {"sessions.py": "session_manager.py", "connections.py": "connection_set.py"}


def module_of(path: str) -> str:
    """A file's row in the files table: mconn's modules by their name alone (renamed
    ones by their name since), so that a tree from before the packages pairs with one
    after (mconn/connection.py with mconn/core/connection.py)."""
    if path.startswith("mconn/") and path.endswith(".py"):
        name = os.path.basename(path)
        return "mconn/.../" + RENAMED.get(name, name)
    return path


def by_module(table: dict) -> dict:
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for path, (size, count) in table.items():
        rows[module_of(path)][0] += size
        rows[module_of(path)][1] += count
    return dict(rows)


def side_by_side(results: dict[str, dict], key: str, top: int) -> list[str]:
    """The ``top`` rows of ``key`` (lines or files) by the largest change from the
    first tree to the last, bytes a peer in each tree."""
    names = list(results)
    tables = [results[n][key] if key == "lines" else by_module(results[n][key]) for n in names]
    rows = set().union(*tables)

    def size(table, row):
        return table.get(row, [0.0, 0.0])[0]

    ordered = sorted(rows, key=lambda r: -abs(size(tables[-1], r) - size(tables[0], r)))
    head = f"| {key[:-1]} | " + " | ".join(f"{n}: B (blocks) a peer" for n in names)
    out = [head + (" | change |" if len(names) > 1 else " |"), "|---" * (len(names) + 1 + (len(names) > 1)) + "|"]
    if len(names) == 1:
        ordered = sorted(rows, key=lambda r: -size(tables[0], r))
    for row in ordered[:top]:
        cells = [f"{t.get(row, [0, 0])[0]:,.0f} ({t.get(row, [0, 0])[1]:.2f})" for t in tables]
        change = [f"{size(tables[-1], row) - size(tables[0], row):+,.0f}"] if len(names) > 1 else []
        out.append(f"| {row} | " + " | ".join(cells + change) + " |")
    totals = [sum(v[0] for v in t.values()) for t in tables]
    change = [f"{totals[-1] - totals[0]:+,.0f}"] if len(names) > 1 else []
    out.append("| all traced | " + " | ".join([f"{t:,.0f}" for t in totals] + change) + " |")
    return out


def objects_table(results: dict[str, dict]) -> list[str]:
    names = list(results)
    kinds = sorted(
        {k for r in results.values() for k, v in r["objects"].items() if v["per_peer"] >= 0.5},
        key=lambda k: -max(r["objects"].get(k, {"per_peer": 0})["per_peer"] for r in results.values()),
    )
    out = ["| type | " + " | ".join(f"{n}: a peer (attributes)" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for kind in kinds:
        cells = []
        for n in names:
            row = results[n]["objects"].get(kind)
            cells.append(
                "-"
                if row is None
                else f"{row['per_peer']:.2f}" + (f" ({row['max_attributes']})" if "max_attributes" in row else "")
            )
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    for n in names:
        for kind, row in results[n]["objects"].items():
            if row.get("late"):
                out.append(f"{n}: {kind} names only some instances set: {row['late']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["main", "listener"], default="main")
    parser.add_argument("--peers", type=int, default=2000)
    parser.add_argument("--settle", type=float, default=22.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--tree", action="append", default=None, help="a revision or a directory (repeatable)")
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "listener":
        listener(args)
        return
    from many_peers import archive

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="peer-memory-") as tmp:
        for rev in args.tree or [REPO]:
            tree = archive(rev, tmp) if not os.path.isdir(os.path.join(rev, "mconn")) else os.path.abspath(rev)
            name = os.path.basename(rev.rstrip("/")) or rev
            plain = run_tree(args, tree, trace=False, tmp=tmp)
            traced_run = run_tree(args, tree, trace=True, tmp=tmp)
            results[name] = dict(
                traced_run, rss_per_peer=plain["rss_per_peer"], rss_peers=plain["peers"], objects=plain["objects"]
            )
            print(
                f"{name}: {plain['peers']} peers, RSS {plain['rss_per_peer'] / 1024:.2f} KiB a peer; "
                f"traced {sum(v[0] for v in traced_run['lines'].values()) / 1024:.2f} KiB a peer "
                f"over {traced_run['peers']} peers ({traced_run['mconn_file']})",
                flush=True,
            )
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"peer-memory-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    with open(path, "w") as out:
        json.dump({"argv": sys.argv, "peers": args.peers, "settle": args.settle, "results": results}, out, indent=1)
    print(f"{path}\n")
    print("\n".join(side_by_side(results, "files", args.top)))
    print()
    print("\n".join(side_by_side(results, "lines", args.top)))
    print()
    print("\n".join(objects_table(results)))


if __name__ == "__main__":
    main()
