"""The telemetry pipeline at fleet scale: synthetic logs, Spark on local[2], a Python baseline.

    .venv/bin/python bench/pipeline_bench.py [--nodes 1000] [--events 2000000,4000000]
        [--lost 5] [--duplicated 5] [--master local[2]] [--driver-memory 1g]
        [--data DIR] [--keep] [--no-baseline] [--compare-settings] [--before REF]
        [--before-records {1,2}] [--event-log DIR] [--floor]

For each size in ``--events`` (approximate event counts) the bench generates a fleet's
telemetry (generate() below: one file per node, version 2 records exactly as mconn's
telemetry file writes them, specs/telemetry.md section 2), then, in the same run and on
the same files, times:

* ``mconn-pipeline`` end to end (a fresh process: Spark start-up, every table, the
  report), with ``spark.driver.memory`` capped (1g by default);
* bench/pipeline_baseline.py: a straightforward single-process Python delivery audit;
* with ``--floor``, bench/spark_floor.py's ``audit``: the least Spark program that computes
  that audit (session start, one read, one join, one action), the floor under any Spark
  pipeline on these files.

With ``--before REF`` it also writes the same fleet in version 1 records (what
Twisted's jsonFileLogObserver wrote before, log_flattened and all) and times the pipeline
of git commit REF on them (its ``mconn`` exported with ``git archive``; the working tree
is not touched), and the baseline on them: before and after in one run. With
``--before-records 2`` the pipeline of REF runs on the same version 2 files instead (for a
REF that reads them: a change of the pipeline alone, measured on the same input).

With ``--event-log DIR`` each pipeline run writes Spark's event log there, and the bench
prints what each pipeline stage cost according to it (Spark jobs, tasks, executor run and
CPU seconds, GC, bytes read, shuffled and written; ``profile``): what bounds each figure.
Each run's load average (1 minute, at its start and end) is printed beside it: the
machine may be shared.

With ``--compare-settings`` it also runs ``mconn-pipeline`` a second time on the same files
with the settings the command did not pick forced by ``--conf`` (``other_settings``: those of
a large input for a small one, and the other way round; specs/pipeline.md section 6), and
prints the ratio: whether the size threshold picked the faster settings. Every run must
find exactly the injected losses and duplicates. It prints events/s for both, the
baseline's time over Spark's (the target: at least 1.0), the time ratio between
consecutive sizes against the event ratio (the linearity target: 2x events, at most 2.2x
time), and the input size against the driver memory. Results go to stdout and
bench/out/pipeline-<time>.json.

The synthetic fleet: every node logs ``node_started``, then has ``--degree`` peers; each
link carries three channels (priorities 1, 5 and 10) in both directions, has a
``channel_stats`` tick every 10 s at both ends (with ``session_id``, ``connection`` and a
ping ``round_trip`` that changes every minute, null in a session's first minute), breaks and resumes now and then (about one link in four), sometimes expires
and starts a fresh session (one in twenty), and ends with a shutdown. Counters are kept
consistent, snapshots included (a snapshot's ``acked`` never exceeds what the receiver
delivered by then, and ``delivered`` never goes down: an audit of snapshots alone, as a
live view makes before the final counters arrive, sees no false loss), then ``--lost`` receivers deliver one message fewer and ``--duplicated`` one
more than they should, on distinct sessions and channels chosen at random.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT_DIR = os.path.join(HERE, "out")
CHANNELS = ((0x20, 1), (0x21, 5), (0x30, 10))
TICK = 10.0
ORIGIN = 1_800_000_000.0
LEVEL_UUID = "02e59486-f24d-46ad-8224-3acdf2a5732a"
FORMATS = {  # mconn.switch.telemetry.FORMATS, copied so that the generator needs no mconn import
    "node_started": "{node_id} started: run {run_id}, process {pid}",
    "connection_made": "{node_id} {direction} connection with {remote_address}",
    "handshake_done": "{node_id} handshake with {peer_id} at {remote_address} done",
    "connection_lost": "{node_id} connection with {peer_id} at {remote_address} ended: {reason_type}: {reason}",
    "channel_stats": "{node_id} channel {channel_id} with {peer_id}: queue {queue_depth}",
    "session_started": "{node_id} session {session_id} with {peer_id} started",
    "session_suspended": "{node_id} session {session_id} with {peer_id} suspended: {reason_type}",
    "session_resumed": "{node_id} session {session_id} with {peer_id} resumed, {resent} messages re-sent",
    "session_ended": "{node_id} session {session_id} with {peer_id} ended: {reason_type}: {reason}",
    "dial_attempt": "{node_id} dial {attempt} to {peer_id} at {address}: {result}",
    "listening": "{node_id} listening on {address}",
}
_FIELD = __import__("re").compile(r"{(\w+)}")


def line(event: str, t: float, fields: dict) -> str:
    """One record in the format of ``--format``: 2, as mconn's telemetry file writes it
    (specs/telemetry.md section 2), or 1, as Twisted's jsonFileLogObserver wrote it."""
    if FORMAT == 2:
        body = {"v": 2, "event": event, "node_id": fields["node_id"], "log_time": ORIGIN + t, "level": "info"}
        body.update(fields)
        return json.dumps(body, separators=(",", ":")) + "\n"
    return line_v1(event, t, fields)


def line_v1(event: str, t: float, fields: dict) -> str:
    """One record as jsonFileLogObserver writes it (log_flattened included)."""
    fmt = FORMATS[event]
    body = {"event": event, **fields}
    flattened = {}
    for name in _FIELD.findall(fmt):
        value = body[name]
        flattened[name + "!s:"] = str(value)
        flattened[name + "!:"] = value
    body.update(
        log_logger={"unpersistable": True},
        log_level={"name": "info", "__class_uuid__": LEVEL_UUID},
        log_namespace="mconn",
        log_source=None,
        log_format=fmt,
        log_time=ORIGIN + t,
        log_flattened=flattened,
    )
    return "\x1e" + json.dumps(body) + "\n"


#: The record format written: 2 (mconn's lean JSON Lines) or 1 (Twisted's); set by --format.
FORMAT = 2

_STATS_V2 = (
    '{{"v":2,"event":"channel_stats","node_id":"{n}","log_time":{t!r},"level":"info","peer_id":"{p}",'
    '"channel_id":{c},"priority":{pr},"queue_depth":{q},"bytes_sent":{bs},"messages_sent":{ms},'
    '"bytes_received":{br},"messages_received":{mr},"accepted":{a},"acked":{k},"delivered":{d},'
    '"session_id":"{s}","connection":{cn},"round_trip":{rt}}}\n'
)

_STATS = (
    '\x1e{{"event": "channel_stats", "node_id": "{n}", "peer_id": "{p}", "channel_id": {c}, "priority": {pr}, '
    '"queue_depth": {q}, "bytes_sent": {bs}, "messages_sent": {ms}, "bytes_received": {br}, "messages_received": {mr}, '
    '"accepted": {a}, "acked": {k}, "delivered": {d}, "session_id": "{s}", "connection": {cn}, "round_trip": {rt}, '
    '"log_logger": {{"unpersistable": true}}, '
    '"log_level": {{"name": "info", "__class_uuid__": "' + LEVEL_UUID + '"}}, "log_namespace": "mconn", '
    '"log_source": null, "log_format": "{{node_id}} channel {{channel_id}} with {{peer_id}}: queue {{queue_depth}}", '
    '"log_time": {t!r}, "log_flattened": {{"node_id!s:": "{n}", "node_id!:": "{n}", "channel_id!s:": "{c}", '
    '"channel_id!:": {c}, "peer_id!s:": "{p}", "peer_id!:": "{p}", "queue_depth!s:": "{q}", "queue_depth!:": {q}}}}}\n'
)


def node_id(i: int) -> str:
    return hashlib.sha1(b"node-%d" % i).hexdigest()


def peers_of(i: int, nodes: int, degree: int) -> list[int]:
    """A ring lattice: each node linked to its degree/2 successors and predecessors."""
    half = max(1, degree // 2)
    return sorted({(i + k) % nodes for k in range(-half, half + 1) if k and (i + k) % nodes != i})


class Plan:
    """One link's sessions, breaks and counters, the same for both of its ends."""

    def __init__(self, seed: int, a: int, b: int, duration: float) -> None:
        rng = random.Random(f"{seed}/{a}/{b}")
        self.dialer, self.listener = a, b  # the lower index dials
        start = rng.uniform(0, TICK)
        self.sessions = []
        if rng.random() < 0.05:  # the session expires in the middle; a fresh one follows
            cut = rng.uniform(duration * 0.3, duration * 0.6)
            self.sessions.append(self._session(rng, a, b, 0, start, cut, "SessionExpired"))
            start = cut + 30.0 + rng.uniform(1, 20)
        self.sessions.append(self._session(rng, a, b, len(self.sessions), start, duration, "ConnectionClosed"))

    @staticmethod
    def _session(rng, a, b, k, start, end, reason_type) -> dict:
        breaks = []
        if rng.random() < 0.25 and end - start > 60:
            at = rng.uniform(start + 20, end - 30)
            breaks.append((at, rng.choice((1, 1, 2, 3)), rng.uniform(0.05, 3.0)))
        rates = {(s, c): rng.uniform(0.05, 5.0) for s in (a, b) for c, _ in CHANNELS}
        grace_end = end - 30.0 if reason_type == "SessionExpired" else None
        return {
            "id": hashlib.md5(f"{a}-{b}-{k}-{start}".encode()).hexdigest(),
            "start": start,
            "end": end,
            "reason_type": reason_type,
            "breaks": breaks,
            "rates": rates,
            "grace_end": grace_end,
            "adjust": {},
        }


def counts_at(session: dict, sender: int, channel: int, t: float) -> int:
    end = session["grace_end"] if session["grace_end"] is not None else session["end"]
    return int(session["rates"][(sender, channel)] * (min(t, end) - session["start"]))


def node_lines(i: int, args, plans: dict) -> list[tuple[float, str]]:
    """Every line node i logs, with its time."""
    me = node_id(i)
    run = hashlib.md5(f"{args.seed}/run/{i}".encode()).hexdigest()
    out = [
        (0.0, line("node_started", 0.0, {"node_id": me, "run_id": run, "pid": 1000 + i, "process_started": ORIGIN})),
        (0.0, line("listening", 0.0, {"node_id": me, "address": f"127.0.0.1:{20000 + i}"})),
    ]
    phase = random.Random(f"{args.seed}/phase/{i}").uniform(0, TICK)
    for j in peers_of(i, args.nodes, args.degree):
        plan = plans[(min(i, j), max(i, j))]
        for session in plan.sessions:
            out += session_lines(i, j, plan, session, phase)
    return out


def session_lines(i, j, plan, s, phase) -> list[tuple[float, str]]:
    me, peer = node_id(i), node_id(j)
    dialer = plan.dialer == i
    direction = "outbound" if dialer else "inbound"
    remote = f"127.0.0.1:{20000 + j}" if dialer else f"127.0.0.1:{40000 + (j * 7 + i) % 20000}"
    sid, start, end = s["id"], s["start"], s["end"]
    ids = {"node_id": me, "peer_id": peer}
    out = []

    def add(event, t, **fields):
        out.append((t, line(event, t, {"node_id": me, **fields})))

    def connect(t):
        add("connection_made", t, direction=direction, remote_address=remote)
        add(
            "handshake_done",
            t + 0.002,
            peer_id=peer,
            remote_address=remote,
            direction=direction,
            max_packet_payload=1024,
            channels=[c for c, _ in CHANNELS],
            listen_address=f"127.0.0.1:{20000 + j}",
        )

    def lost(t, reason_type):
        add(
            "connection_lost",
            t,
            peer_id=peer,
            remote_address=remote,
            direction=direction,
            reason_type=reason_type,
            reason="the connection ended",
            duration=t - start,
            bytes_sent=int((t - start) * 3000),
            bytes_received=int((t - start) * 2900),
            channels=[
                {"channel_id": c, "bytes_sent": 0, "messages_sent": 0, "bytes_received": 0, "messages_received": 0}
                for c, _ in CHANNELS
            ],
            session_id=sid,
        )

    connect(start)
    add(
        "session_started",
        start + 0.003,
        **ids,
        session_id=sid,
        remote_address=remote,
        direction=direction,
        resume_refused="",
    )
    resumes = 0
    for at, attempts, recovery in s["breaks"]:
        lost(at, "ConnectionLost")
        add(
            "session_suspended",
            at + 0.0001,
            **ids,
            session_id=sid,
            reason_type="ConnectionLost",
            reason="Connection was reset",
            grace=30.0,
        )
        if dialer:
            for k in range(1, attempts):
                add(
                    "dial_attempt",
                    at + recovery * k / attempts,
                    **ids,
                    address=f"{peer}@127.0.0.1:{20000 + j}",
                    attempt=k,
                    delay=0.0,
                    result="failed",
                    error="ConnectionRefusedError: refused",
                )
            connect(at + recovery)
        resumes += 1
        add(
            "session_resumed",
            at + recovery + 0.004,
            **ids,
            session_id=sid,
            remote_address=remote,
            resent=3,
            resumes=resumes,
        )
        if dialer:
            add(
                "dial_attempt",
                at + recovery + 0.005,
                **ids,
                address=f"{peer}@127.0.0.1:{20000 + j}",
                attempt=attempts,
                delay=0.0,
                result="connected",
                error=None,
            )
    stop = s["grace_end"] if s["grace_end"] is not None else end
    # What a real node's snapshots can show. acked is what the receiver confirmed, so it
    # never exceeds the receiver's delivered count, and delivered never goes down: in an
    # expired session the last 2 messages each way are never delivered (the final
    # counters below), so no snapshot shows them acked or delivered either.
    unseen = 2 if s["grace_end"] is not None else 1
    undelivered_tail = 2 if s["grace_end"] is not None else 0
    t = start - (start - phase) % TICK + TICK
    while t < end:
        resumed = [b[0] + b[2] for b in s["breaks"] if b[0] + b[2] <= t]
        since = max([start] + resumed)
        # A ping each minute once the link is idle enough; a new value each time.
        rtt = "null" if t - start < 60 else repr(0.002 + 0.0001 * ((int(t) // 60 + i + j) % 17))
        for k, (c, priority) in enumerate(CHANNELS):
            a = counts_at(s, i, c, t)
            d = counts_at(s, j, c, t)
            ms = int(s["rates"][(i, c)] * (min(t, stop) - since)) if t < stop else 0
            mr = int(s["rates"][(j, c)] * (min(t, stop) - since)) if t < stop else 0
            out.append(
                (
                    t + k * 1e-5,
                    (_STATS_V2 if FORMAT == 2 else _STATS).format(
                        n=me,
                        p=peer,
                        c=c,
                        pr=priority,
                        q=(k * 7 + int(t)) % 4 if t < stop else 0,
                        bs=ms * 400,
                        ms=ms,
                        br=mr * 380,
                        mr=mr,
                        a=a,
                        k=max(0, a - unseen),
                        d=max(0, d - undelivered_tail),
                        s=sid,
                        cn=1 + len(resumed),
                        rt=rtt,
                        t=ORIGIN + t + k * 1e-5,
                    ),
                )
            )
        t += TICK
    if s["grace_end"] is not None:
        lost(stop, "ConnectionLost")
        add(
            "session_suspended",
            stop + 0.0001,
            **ids,
            session_id=sid,
            reason_type="ConnectionLost",
            reason="Connection was reset",
            grace=30.0,
        )
        if dialer:
            for k in range(1, 4):
                add(
                    "dial_attempt",
                    stop + k,
                    **ids,
                    address=f"{peer}@127.0.0.1:{20000 + j}",
                    attempt=k,
                    delay=1.0,
                    result="failed",
                    error="ConnectionRefusedError: refused",
                )
    else:
        lost(end, "ConnectionClosed")
    channels, undelivered = [], []
    for c, _ in CHANNELS:
        a = counts_at(s, i, c, end)
        unconfirmed = 2 if s["grace_end"] is not None else 0
        delivered = counts_at(s, j, c, end) - (2 if s["grace_end"] is not None else 0) + s["adjust"].get((j, c), 0)
        channels.append({"channel_id": c, "accepted": a, "acked": a - unconfirmed, "delivered": delivered})
        if unconfirmed:
            undelivered.append({"channel_id": c, "count": unconfirmed})
    add(
        "session_ended",
        end + 0.0002,
        **ids,
        session_id=sid,
        reason_type=s["reason_type"],
        reason="the node is stopping" if s["reason_type"] == "ConnectionClosed" else "grace ran out",
        resumes=resumes,
        undelivered=undelivered,
        channels=channels,
    )
    return out


# -- the fleet -----------------------------------------------------------------------


def make_plans(args) -> dict:
    duration = max(120.0, args.events_target * TICK / (args.nodes * args.degree * len(CHANNELS)))
    plans = {}
    for i in range(args.nodes):
        for j in peers_of(i, args.nodes, args.degree):
            if i < j:
                plans[(i, j)] = Plan(args.seed, i, j, duration)
    return plans


def inject(plans: dict, lost: int, duplicated: int, seed: int) -> list[tuple]:
    """Make ``lost`` receivers deliver one message fewer, ``duplicated`` one more."""
    rng = random.Random(f"{seed}/faults")
    keys = sorted(plans)
    chosen = set()
    faults = []
    while len(faults) < lost + duplicated:
        a, b = rng.choice(keys)
        session = rng.choice(plans[(a, b)].sessions)
        sender = rng.choice((a, b))
        channel = rng.choice(CHANNELS)[0]
        key = (session["id"], sender, channel)
        delta = -1 if len(faults) < lost else 1
        # In an expired session the receiver's one more is one of the 2 reported
        # undelivered: in_doubt, not duplicated (specs/pipeline.md section 5.2).
        if key in chosen or (delta > 0 and session["grace_end"] is not None):
            continue
        chosen.add(key)
        session["adjust"][(sender, channel)] = delta
        faults.append((node_id(sender), node_id(b if sender == a else a), session["id"], channel, delta))
    return faults


_PLANS: dict = {}


def _write_node(job) -> int:
    i, args, directory = job
    lines = node_lines(i, args, _PLANS)
    lines.sort(key=lambda x: x[0])
    with open(os.path.join(directory, f"node-{i:05d}.json"), "w") as f:
        f.writelines(text for _, text in lines)
    return len(lines)


def generate(args, directory: str, record_format: int = 2) -> tuple[int, list]:
    """Write the fleet's files under ``directory`` in record version ``record_format``;
    returns (events, injected faults). The same fleet, whatever the format."""
    import multiprocessing

    global _PLANS, FORMAT
    FORMAT = record_format
    _PLANS = make_plans(args)
    faults = inject(_PLANS, args.lost, args.duplicated, args.seed)
    os.makedirs(directory, exist_ok=True)
    jobs = [(i, args, directory) for i in range(args.nodes)]
    if args.workers <= 1:  # in this process: no fork (a process running a JVM gateway must not)
        return sum(_write_node(job) for job in jobs), faults
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        events = sum(pool.imap_unordered(_write_node, jobs, chunksize=8))
    return events, faults


# -- measuring -----------------------------------------------------------------------


def du(directory: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())


def timed(command: list[str], env=None, cwd=None) -> tuple[float, str, int, str, float]:
    """Run a command; returns (seconds, stdout, peak RSS in bytes of its process tree,
    the -Xmx flag of a JVM in the tree, if any, CPU seconds of the tree). The CPU seconds
    (user + system of every process of the tree, last seen every 0.5 s) say more than
    the wall time on a machine shared with other work."""
    started = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=cwd
    )
    peak, heap, cpu = 0, "", {}
    import threading

    out = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate(), strict=True)))
    reader.start()
    while reader.is_alive():
        rss, flags = tree_rss(proc.pid, cpu)
        peak, heap = max(peak, rss), heap or flags
        reader.join(0.5)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(out.get("stderr", "")[-4000:])
        raise SystemExit(f"{command[:3]} failed with exit code {proc.returncode}")
    return seconds, out["stdout"], peak, heap, sum(cpu.values())


def tree_rss(pid: int, cpu: dict | None = None) -> tuple[int, str]:
    """Resident bytes of a process and its descendants (Linux /proc), and the Spark driver's
    -Xmx; ``cpu`` gets each process's CPU seconds so far, by pid."""
    children, used = {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
                used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                continue
    total, todo, heap = 0, [pid], ""
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        if cpu is not None and p in used:
            cpu[p] = used[p]
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            driver = b"org.apache.spark.deploy.SparkSubmit" in args and b"org.apache.spark.launcher.Main" not in args
            if driver:  # the driver JVM, not spark-submit's launcher (-Xmx128m)
                heap = heap or next((a.decode() for a in args if a.startswith(b"-Xmx")), "")
        except OSError:
            pass
    return total, heap


def other_settings(nbytes: int) -> tuple[str, dict[str, str]]:
    """The settings the command does not pick for ``nbytes`` of local input (specs/pipeline.md
    section 6), as ``--conf`` values that force them: (their name, the values)."""
    sys.path.insert(0, REPO)
    from mconn.pipeline.spark import LOCAL_DEFAULTS, SMALL_DEFAULTS, SMALL_INPUT, SMALL_JAVA_OPTIONS, _log4j_file

    log4j = f"-Dlog4j2.configurationFile=file:{_log4j_file()}"
    if nbytes >= SMALL_INPUT:
        return "small", {**SMALL_DEFAULTS, "spark.driver.extraJavaOptions": f"{log4j} {SMALL_JAVA_OPTIONS}"}
    return "large", {
        "spark.sql.shuffle.partitions": LOCAL_DEFAULTS["spark.sql.shuffle.partitions"],
        "spark.sql.codegen.wholeStage": "true",
        "spark.sql.codegen.factoryMode": "FALLBACK",
        "spark.driver.extraJavaOptions": log4j,
    }


def run_spark(args, data: str, out: str, conf: dict[str, str] | None = None, code: str = REPO) -> dict:
    """``mconn-pipeline`` on ``data`` in a fresh process, from the mconn sources at ``code``."""
    command = [
        sys.executable,
        "-m",
        "mconn.pipeline",
        data,
        "--out",
        out,
        "--master",
        args.master,
        "--conf",
        f"spark.driver.memory={args.driver_memory}",
        "--json",
    ]
    for key, value in (conf or {}).items():
        command += ["--conf", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=code + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load = os.getloadavg()[0]
    seconds, stdout, peak, heap, cpu = timed(command, env, cwd=code)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_rss": peak,
        "heap": heap,
        "summary": result["summary"],
        "stages": result["timings"],
        "load": (load, os.getloadavg()[0]),
    }


def run_baseline(data: str) -> dict:
    seconds, stdout, peak, _, cpu = timed([sys.executable, os.path.join(HERE, "pipeline_baseline.py"), data])
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss": peak, **json.loads(stdout)}


def export_tree(ref: str, workdir: str) -> str:
    """The ``mconn`` package of git commit ``ref``, exported under ``workdir`` (the
    working tree is not touched); the directory to put on PYTHONPATH."""
    target = os.path.join(workdir, f"code-{ref}")
    os.makedirs(target, exist_ok=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "mconn"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    return target


def measure(args, size: int, workdir: str) -> dict:
    """One size: the fleet in version 2 records (and version 1 with ``--before``), the
    pipeline and the baseline on each, in the same run."""
    args.events_target = size
    data = os.path.join(workdir, f"logs-{size}")
    started = time.monotonic()
    events, faults = generate(args, data)
    generated = time.monotonic() - started
    nbytes = du(data)
    print(
        f"  generated {events:,} events, {nbytes / 1e9:.2f} GB in {args.nodes} files ({generated:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    log_dir, log_conf = event_log(args, f"events-{size}")
    spark = run_spark(args, data, os.path.join(workdir, f"out-{size}"), log_conf)
    if log_dir:
        spark["profile"] = profile(log_dir)
    print(f"  spark: {spark['seconds']:.1f} s", file=sys.stderr, flush=True)
    forced = None
    if args.compare_settings:
        kind, conf = other_settings(nbytes)
        forced = dict(run_spark(args, data, os.path.join(workdir, f"out-{size}"), conf), settings=kind)
        print(f"  spark, {kind}-input settings forced: {forced['seconds']:.1f} s", file=sys.stderr, flush=True)
    baseline = run_baseline(data) if args.baseline else None
    if baseline:
        print(f"  baseline: {baseline['seconds']:.1f} s", file=sys.stderr, flush=True)
    floor = run_floor(args, data) if args.floor else None
    if floor:
        print(f"  floor (least Spark audit): {floor['seconds']:.1f} s", file=sys.stderr, flush=True)
    before = measure_before(args, size, workdir, data if args.before_records == 2 else None) if args.before else None
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(os.path.join(workdir, f"out-{size}"), ignore_errors=True)
    lost = sum(1 for f in faults if f[4] < 0)
    return {
        "events": events,
        "bytes": nbytes,
        "lost_injected": lost,
        "duplicated_injected": len(faults) - lost,
        "spark": spark,
        "baseline": baseline,
        "spark_other_settings": forced,
        "before": before,
        "floor": floor,
    }


def run_floor(args, data: str) -> dict:
    """bench/spark_floor.py's ``audit`` program (the least Spark program that computes the
    baseline's audit) on ``data``, in a fresh process."""
    sys.path.insert(0, HERE)
    import spark_floor

    return spark_floor.measure("audit", data, args.master)


def event_log(args, name: str) -> tuple[str | None, dict | None]:
    """With ``--event-log``: a fresh directory for one run's event log, and the settings
    that write it there; else (None, None)."""
    if not args.event_log:
        return None, None
    log_dir = os.path.join(os.path.abspath(args.event_log), name)
    os.makedirs(log_dir, exist_ok=True)
    return log_dir, {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": "file://" + log_dir,
        "spark.eventLog.compress": "false",
    }


def measure_before(args, size: int, workdir: str, same: str | None = None) -> dict:
    """The pipeline of ``--before`` and the baseline on the same fleet: on the files at
    ``same`` (version 2 records), or else written again in version 1 records (what nodes
    wrote before)."""
    if same is None:
        data = os.path.join(workdir, f"logs-v1-{size}")
        events, _ = generate(args, data, record_format=1)
        nbytes = du(data)
        print(f"  before: {events:,} events in version 1 records, {nbytes / 1e9:.2f} GB", file=sys.stderr, flush=True)
    else:
        data, events, nbytes = same, None, du(same)
    code = export_tree(args.before, workdir)
    log_dir, log_conf = event_log(args, f"events-before-{size}")
    out = os.path.join(workdir, f"out-before-{size}")
    spark = run_spark(args, data, out, log_conf, code=code)
    if log_dir:
        spark["profile"] = profile(log_dir)
    print(f"  before: spark {spark['seconds']:.1f} s ({args.before})", file=sys.stderr, flush=True)
    baseline = run_baseline(data) if args.baseline and same is None else None
    if baseline:
        print(f"  before: baseline {baseline['seconds']:.1f} s", file=sys.stderr, flush=True)
    if not args.keep:
        if same is None:
            shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    return {
        "events": events,
        "bytes": nbytes,
        "spark": spark,
        "baseline": baseline,
        "ref": args.before,
        "records": 1 if same is None else 2,
    }


def _account(event: dict, stage_of_job: dict, totals: dict) -> None:
    """Add one event log record to ``totals`` (per job description: tasks, run s, CPU s,
    GC s, bytes read, shuffled, written)."""
    kind = event.get("Event")
    if kind == "SparkListenerJobStart":
        name = (event.get("Properties") or {}).get("spark.job.description") or "(no stage)"
        for stage in event.get("Stage IDs", []):
            stage_of_job[stage] = name
        totals.setdefault(name, [0, 0.0, 0.0, 0.0, 0, 0, 0, 0])[7] += 1
    elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
        m = event["Task Metrics"]
        t = totals.setdefault(stage_of_job.get(event["Stage ID"], "(no stage)"), [0, 0.0, 0.0, 0.0, 0, 0, 0, 0])
        shuffle_read = m.get("Shuffle Read Metrics", {})
        t[0] += 1
        t[1] += m.get("Executor Run Time", 0) / 1e3
        t[2] += m.get("Executor CPU Time", 0) / 1e9
        t[3] += m.get("JVM GC Time", 0) / 1e3
        t[4] += m.get("Input Metrics", {}).get("Bytes Read", 0)
        t[5] += shuffle_read.get("Remote Bytes Read", 0) + shuffle_read.get("Local Bytes Read", 0)
        t[6] += m.get("Output Metrics", {}).get("Bytes Written", 0)


def profile(directory: str) -> list[str]:
    """What the Spark event log under ``directory`` says each pipeline stage cost: its
    Spark jobs counted and their tasks summed (the job description is the stage's name,
    mconn/pipeline/job.py): executor run and CPU seconds, GC seconds, bytes read from
    files, shuffled, written."""
    names = [os.path.join(directory, n) for n in os.listdir(directory)]
    if not names:
        return ["no event log written"]
    latest = max(names, key=os.path.getmtime)
    if os.path.isdir(latest):  # Spark 4's rolling layout: eventlog_v2_APP/events_N_APP
        parts = [n for n in os.listdir(latest) if n.startswith("events_")]
        files = [os.path.join(latest, n) for n in sorted(parts, key=lambda n: int(n.split("_")[1]))]
    else:
        files = [latest]
    stage_of_job, totals = {}, {}
    for name in files:
        with open(name) as f:
            for text in f:
                _account(json.loads(text), stage_of_job, totals)
    lines = [
        f"{'stage (event log)':<18} {'jobs':>5} {'tasks':>6} {'run s':>8} {'cpu s':>8} {'gc s':>6} "
        f"{'read MB':>9} {'shuffle MB':>10} {'written MB':>10}"
    ]
    for name, t in totals.items():
        lines.append(
            f"{name[:18]:<18} {t[7]:>5} {t[0]:>6} {t[1]:>8.1f} {t[2]:>8.1f} {t[3]:>6.1f} "
            f"{t[4] / 1e6:>9.1f} {t[5] / 1e6:>10.1f} {t[6] / 1e6:>10.1f}"
        )
    every = [sum(t[k] for t in totals.values()) for k in range(8)]
    lines.append(
        f"{'all':<18} {every[7]:>5} {every[0]:>6} {every[1]:>8.1f} {every[2]:>8.1f} {every[3]:>6.1f} "
        f"{every[4] / 1e6:>9.1f} {every[5] / 1e6:>10.1f} {every[6] / 1e6:>10.1f}"
    )
    return lines


# -- the table -----------------------------------------------------------------------


def table(args, rows: list[dict]) -> str:
    lines = [
        f"{'events':>12} {'records':>9} {'input GB':>9} {'spark s':>8} {'cpu s':>7} {'events/s':>10} {'base s':>8} "
        f"{'cpu s':>7} {'base ev/s':>10} {'base/spark':>10} {'lost':>9} {'dup':>9} {'JVM peak':>9}",
        "-" * 130,
    ]
    for r in rows:
        lines.append(_line(r, "v2", r))
        if r.get("before"):
            b = r["before"]
            lines.append(_line(dict(b, events=r["events"]), f"v{b['records']}@{b['ref'][:7]}", r))
    return "\n".join(lines + [""] + _checks(args, rows))


def _line(r: dict, label: str, truth: dict) -> str:
    """One table line: a pipeline run and the baseline on the same files."""
    s, b = r["spark"], r["baseline"]
    found = (
        f"{s['summary']['lost']}/{truth['lost_injected']}",
        f"{s['summary']['duplicated']}/{truth['duplicated_injected']}",
    )
    return (
        f"{r['events']:>12,} {label:>9} {r['bytes'] / 1e9:>9.2f} {s['seconds']:>8.1f} {s['cpu_seconds']:>7.1f} "
        f"{r['events'] / s['seconds']:>10,.0f} "
        + (
            f"{b['seconds']:>8.1f} {b['cpu_seconds']:>7.1f} {r['events'] / b['seconds']:>10,.0f} "
            f"{b['seconds'] / s['seconds']:>10.2f} "
            if b
            else f"{'-':>8} {'-':>7} {'-':>10} {'-':>10} "
        )
        + f"{found[0]:>9} {found[1]:>9} {s['peak_rss'] / 1e9:>8.2f}G"
    )


def _checks(args, rows: list[dict]) -> list[str]:
    checks = []
    rate = rows[-1]["events"] / rows[-1]["spark"]["seconds"]
    checks.append(f"throughput {rate:,.0f} events/s (largest run) >= 100,000: {'PASS' if rate >= 1e5 else 'FAIL'}")
    for r in rows:
        if r["baseline"]:
            ratio = r["baseline"]["seconds"] / r["spark"]["seconds"]
            checks.append(
                f"{r['events']:,} events: baseline time / spark time {ratio:.2f} (>= 1.0): "
                f"{'PASS' if ratio >= 1.0 else 'FAIL'}"
            )
        if r.get("before"):
            b = r["before"]
            checks.append(
                f"{r['events']:,} events: before ({b['ref'][:7]}, version {b['records']} records) "
                f"{b['spark']['seconds']:.1f} s, {b['spark']['cpu_seconds']:.1f} CPU s; now "
                f"{r['spark']['seconds']:.1f} s, {r['spark']['cpu_seconds']:.1f} CPU s: "
                f"{b['spark']['seconds'] / r['spark']['seconds']:.2f}x faster, "
                f"{b['spark']['cpu_seconds'] / r['spark']['cpu_seconds']:.2f}x less CPU"
            )
    for r in rows:
        f = r.get("floor")
        if f:
            now = r["spark"]["seconds"]
            line = (
                f"{r['events']:,} events: least Spark audit (bench/spark_floor.py audit) {f['seconds']:.1f} s, "
                f"{f['cpu_seconds']:.1f} CPU s (load {_load(f)}), found {f['lost']}/{f['duplicated']}; "
                f"pipeline / floor {now / f['seconds']:.2f}"
            )
            if r.get("before"):
                line += f" (before {r['before']['spark']['seconds'] / f['seconds']:.2f})"
            checks.append(line)
    for small, large in itertools.pairwise(rows):
        er = large["events"] / small["events"]
        tr = large["spark"]["seconds"] / small["spark"]["seconds"]
        ok = tr <= 1.1 * er
        checks.append(f"linearity {er:.2f}x events -> {tr:.2f}x time (<= {1.1 * er:.2f}x): {'PASS' if ok else 'FAIL'}")
    big = rows[-1]
    checks.append(
        f"memory: input {big['bytes'] / 1e9:.2f} GB, driver JVM {big['spark']['heap'] or 'heap flag not seen'} "
        f"(spark.driver.memory={args.driver_memory}; the peak column is the RSS of the whole process tree, "
        f"Python driver and JVM with its non-heap memory): "
        f"{'input larger: PASS' if big['bytes'] > _bytes(args.driver_memory) else 'input smaller: not shown'}"
    )
    for r in rows:
        if r["spark"].get("profile"):
            checks += [
                f"profile of {r['events']:,} events (Spark event log; JVM CPU of the whole run "
                f"{r['spark']['cpu_seconds']:.1f} s):"
            ] + ["    " + p for p in r["spark"]["profile"]]
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r["spark"]["stages"].items())
        checks.append(f"stages of {r['events']:,} events, seconds: {stages} (load {_load(r['spark'])})")
        if r.get("before"):
            b = r["before"]["spark"]
            if b.get("profile"):
                checks += [f"  before: profile (JVM CPU of the whole run {b['cpu_seconds']:.1f} s):"]
                checks += ["    " + p for p in b["profile"]]
            stages = ", ".join(f"{k} {v:.1f}" for k, v in b["stages"].items())
            checks.append(f"  before: {stages} (load {_load(b)})")
    for r in rows:
        forced = r.get("spark_other_settings")
        if forced:
            checks.append(
                f"{r['events']:,} events: {r['spark']['seconds']:.1f} s as run, {forced['seconds']:.1f} s with the "
                f"{forced['settings']}-input settings forced: {forced['seconds'] / r['spark']['seconds']:.2f}x"
            )
    for r in rows:
        s, b = r["spark"]["summary"], r["baseline"]
        ok = (s["lost"], s["duplicated"]) == (r["lost_injected"], r["duplicated_injected"])
        if b:
            ok = ok and (b["lost"], b["duplicated"]) == (r["lost_injected"], r["duplicated_injected"])
        if r.get("before"):
            runs = (r["before"]["spark"]["summary"], r["before"]["baseline"] or r["before"]["spark"]["summary"])
            ok = ok and all(
                (x["lost"], x["duplicated"]) == (r["lost_injected"], r["duplicated_injected"]) for x in runs
            )
        checks.append(f"audit of {r['events']:,} events finds exactly the injected faults: {'PASS' if ok else 'FAIL'}")
    return checks


def _load(run: dict) -> str:
    """The 1-minute load average at a run's start and end."""
    return " -> ".join(f"{x:.1f}" for x in run.get("load", ())) or "not recorded"


def _bytes(size: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(float(size[:-1]) * units[size[-1].lower()]) if size[-1].lower() in units else int(size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--degree", type=int, default=8, help="peers per node")
    parser.add_argument("--events", default="2000000,4000000", help="comma-separated approximate event counts")
    parser.add_argument("--lost", type=int, default=5)
    parser.add_argument("--duplicated", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--workers", type=int, default=2, help="generator processes")
    parser.add_argument("--data", default=None, help="where to write the logs (a temporary directory by default)")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs and tables")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument(
        "--before",
        default=None,
        metavar="REF",
        help="also run the pipeline of git commit REF on the same fleet in version 1 records "
        "(what nodes wrote before), with the baseline on them",
    )
    parser.add_argument(
        "--before-records",
        type=int,
        choices=(1, 2),
        default=1,
        help="the records --before REF reads: 1 (the fleet written again in version 1, the "
        "default) or 2 (the same files as this tree's run)",
    )
    parser.add_argument(
        "--event-log",
        default=None,
        metavar="DIR",
        help="write the Spark event log of each pipeline run under DIR and print what each pipeline stage cost from it",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time bench/spark_floor.py's least Spark audit on the same files (a baseline)",
    )
    parser.add_argument(
        "--compare-settings",
        action="store_true",
        help="also run with the other input size's settings forced, and print the ratio",
    )
    args = parser.parse_args(argv)
    sizes = [int(float(x)) for x in args.events.split(",")]
    workdir = args.data or tempfile.mkdtemp(prefix="mconn-pipeline-bench-")
    rows = []
    try:
        for size in sizes:
            print(f"size ~{size:,} events", file=sys.stderr, flush=True)
            rows.append(measure(args, size, workdir))
    finally:
        if not args.keep and args.data is None:
            shutil.rmtree(workdir, ignore_errors=True)
    text = table(args, rows)
    print(text)
    os.makedirs(OUT_DIR, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(OUT_DIR, f"pipeline-{stamp}.json"), "w") as f:
        record = {"args": vars(args), "rows": rows, "table": text, "loadavg": os.getloadavg()}
        json.dump(record, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
