"""What durable sessions cost: messages per second recorded and committed by the session
store (mconn/switch/session_store.py) against the in-memory session, in the same run.

    .venv/bin/python bench/session_store_bench.py [--seconds 5] [--commit-delay 0] [--dir DIR] [--no-strace]

Each measurement runs in a child process of this script (the same Python), one after the
other, for 100-byte and 64 KiB messages:

* ``memory``: the baseline, ``Session.admit`` of every message into a session's recovery
  buffer with an ack (``Session.on_ack``) trailing ``WINDOW`` messages behind, as a
  sender whose peer keeps up;
* ``store``: the same loop with the store: each message also ``SessionStore.accepted``,
  each ack also ``SessionStore.acked``, and after every ``burst`` messages the sender
  asks ``durable()`` and goes on, waiting only when a few bursts are not yet durable (``SCENARIOS``)
  (a sender whose ``send`` fires at durability, with room for a few bursts in flight).
  The file is on ``--dir`` (default: a temporary directory under bench/out, on the
  repository's disk). Under ``strace -f -c`` (unless ``--no-strace``) to count the
  fsync and fdatasync calls.

Then ``handoff``: the round trip of one empty job from the reactor thread to a worker
thread and back, through the store's design (a ``threading.Thread`` taking a queue,
answering with ``reactor.callFromThread``) and through ``deferToThreadPool`` on a
1-thread pool; and ``load``: open and load a store holding 64 MiB of 100-byte messages.

Prints each figure, the ratios, the load average before and after, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SESSION_ID = b"\x07" * 16
CHANNEL = 0x20
#: Messages between the newest accepted and the trailing ack.
WINDOW = 512
#: scenario -> (message size, messages per burst, bursts that may wait for durability at once).
#: ``lone``: one message at a time, each waited for (a sender of rare messages; each
#: commit holds one message, so its rate is the commit rate and its latency a commit's).
SCENARIOS = {"small": (100, 256, 4), "bulk": (65536, 16, 4), "lone": (100, 1, 1)}
MAX_BYTES = 256 << 20


def new_session():
    from mconn.core.session import Session

    return Session(
        SESSION_ID, (CHANNEL,), recovery_buffer_bytes=MAX_BYTES, ack_every_messages=64, ack_every_bytes=1 << 20
    )


def memory_phase(scenario: str, seconds: float) -> dict:
    """The baseline: admit and trailing acks, in memory only."""
    size, burst, _ = SCENARIOS[scenario]
    session = new_session()
    message = b"m" * size
    admit, on_ack = session.admit, session.on_ack
    sent, start, cpu = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        for _ in range(burst):
            admit(CHANNEL, message)
        sent += burst
        if sent > WINDOW:
            on_ack({CHANNEL: sent - WINDOW})
    elapsed = time.perf_counter() - start
    return {
        "messages": sent,
        "seconds": elapsed,
        "rate": sent / elapsed,
        "cpu_us": (time.thread_time() - cpu) / sent * 1e6,
    }


def bytes_written() -> int:
    """Bytes this process handed to write calls so far (``wchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def store_phase(scenario: str, seconds: float, directory: str, commit_delay: float) -> dict:
    """The store: the same loop, every record in the store, durability asked per burst."""
    from twisted.internet import defer, task

    from mconn.switch.session_store import SessionStore

    result: dict = {}

    async def main(reactor):
        size, burst, depth = SCENARIOS[scenario]
        path = os.path.join(directory, f"store-{scenario}.db")
        for stale in (path, path + "-wal"):  # a --dir used before: start empty
            if os.path.exists(stale):
                os.unlink(stale)
        store = SessionStore.open(path, "b" * 40, max_bytes=MAX_BYTES, reactor=reactor, commit_delay=commit_delay)
        store.begin(SESSION_ID, "c" * 40, True, (CHANNEL,))
        session = new_session()
        message = b"s" * size
        waiting: list[defer.Deferred] = []
        latencies: list[float] = []

        def fired(_, asked):
            latencies.append(time.perf_counter() - asked)

        sent, start, cpu, written = 0, time.perf_counter(), time.thread_time(), bytes_written()
        while time.perf_counter() - start < seconds:
            for _ in range(burst):
                seq = session.admit(CHANNEL, message)
                store.accepted(SESSION_ID, CHANNEL, seq, message)
            sent += burst
            if sent > WINDOW:
                session.on_ack({CHANNEL: sent - WINDOW})
                store.acked(SESSION_ID, CHANNEL, sent - WINDOW)
            d = store.durable()
            d.addCallback(fired, time.perf_counter())
            waiting.append(d)
            if len(waiting) >= depth:
                await waiting.pop(0)
        for d in waiting:
            await d
        elapsed = time.perf_counter() - start
        cpu = time.thread_time() - cpu
        written = bytes_written() - written
        commits = store.commits
        result.update(writer_write_us=store.write_seconds / sent * 1e6, writer_sync_us=store.sync_seconds / sent * 1e6)
        await store.close()
        latencies.sort()
        result.update(
            messages=sent,
            seconds=elapsed,
            rate=sent / elapsed,
            commits=commits,
            commits_per_s=commits / elapsed,
            messages_per_commit=sent / commits,
            durable_p50_ms=latencies[len(latencies) // 2] * 1e3,
            durable_p99_ms=latencies[int(len(latencies) * 0.99)] * 1e3,
            written_per_message=written / sent,
            written_per_commit=written / commits,
            reactor_cpu_us=cpu / sent * 1e6,
            process_cpu_us=time.process_time() / sent * 1e6,
        )

    try:
        task.react(main)
    except SystemExit as e:  # react exits when main is done; a failure has a non-zero code
        if e.code:
            raise
    return result


def handoff_phase(rounds: int = 3000) -> dict:
    """Round trips of an empty job to a worker thread and back, two ways."""
    import queue
    import threading

    from twisted.internet import defer, task, threads
    from twisted.python.threadpool import ThreadPool

    result: dict = {}

    async def main(reactor):
        jobs: queue.SimpleQueue = queue.SimpleQueue()

        def worker():
            while (job := jobs.get()) is not None:
                reactor.callFromThread(job.callback, None)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        start = time.perf_counter()
        for _ in range(rounds):
            d: defer.Deferred = defer.Deferred()
            jobs.put(d)
            await d
        result["thread_call_from_thread_us"] = (time.perf_counter() - start) / rounds * 1e6
        jobs.put(None)
        pool = ThreadPool(1, 1, "bench")
        pool.start()
        start = time.perf_counter()
        for _ in range(rounds):
            await threads.deferToThreadPool(reactor, pool, lambda: None)
        result["defer_to_thread_pool_us"] = (time.perf_counter() - start) / rounds * 1e6
        pool.stop()

    try:
        task.react(main)
    except SystemExit as e:  # react exits when main is done; a failure has a non-zero code
        if e.code:
            raise
    return result


class ThreadClock:
    """A reactor for a store driven without one: ``callFromThread`` queues, ``pump`` runs."""

    def __init__(self) -> None:
        import queue

        from twisted.internet import task

        self.clock = task.Clock()
        self.calls: queue.SimpleQueue = queue.SimpleQueue()

    def callLater(self, delay, f, *args, **kwargs):  # noqa: N802 (Twisted's name)
        return self.clock.callLater(delay, f, *args, **kwargs)

    def callFromThread(self, f, *args, **kwargs) -> None:  # noqa: N802 (Twisted's name)
        self.calls.put((f, args, kwargs))

    def pump(self) -> None:
        """Let the commit timer fire, then run one call from the writer."""
        self.clock.advance(1)
        f, args, kwargs = self.calls.get(timeout=600)
        f(*args, **kwargs)


def load_phase(directory: str, megabytes: int = 64) -> dict:
    """Open and load a store holding ``megabytes`` of 100-byte messages (and their overhead)."""
    from mconn.core.session import MESSAGE_OVERHEAD
    from mconn.switch.session_store import SessionStore

    path = os.path.join(directory, "load.db")
    for stale in (path, path + "-wal"):
        if os.path.exists(stale):
            os.unlink(stale)
    clock = ThreadClock()
    store = SessionStore.open(path, "b" * 40, max_bytes=megabytes << 20, reactor=clock)
    store.begin(SESSION_ID, "c" * 40, True, (CHANNEL,))
    count = (megabytes << 20) // (100 + MESSAGE_OVERHEAD)
    for seq in range(count):
        store.accepted(SESSION_ID, CHANNEL, seq, b"l" * 100)
    closed = store.close()
    while not closed.called:
        clock.pump()
    start = time.perf_counter()
    clock = ThreadClock()
    store = SessionStore.open(path, "b" * 40, max_bytes=megabytes << 20, reactor=clock)
    (stored,) = store.load()
    elapsed = time.perf_counter() - start
    assert len(stored.streams[CHANNEL].unacked) == count
    return {"messages": count, "file_bytes": os.path.getsize(path), "open_and_load_s": elapsed}


def child(args: list[str], strace: bool, out_dir: str) -> dict:
    """Run one phase in a child process; the fsync count from strace's summary."""
    command = [sys.executable, os.path.abspath(__file__), "--phase", *args]
    summary = os.path.join(out_dir, "strace.txt")
    if strace:
        # --seccomp-bpf: only the traced calls stop the process (else every call does).
        command = ["strace", "--seccomp-bpf", "-f", "-c", "-o", summary, "-e", "trace=fsync,fdatasync", *command]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "bench")]))
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    result = json.loads(output.strip().splitlines()[-1])
    if strace:
        with open(summary) as f:
            calls = _syscalls(f.read())
        result["fsyncs"] = calls.get("fsync", 0) + calls.get("fdatasync", 0)
        result["fsyncs_per_s"] = result["fsyncs"] / result["seconds"] if "seconds" in result else None
    return result


def _syscalls(summary: str) -> dict[str, int]:
    """strace -c's table: the calls column of each syscall row."""
    calls = {}
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in ("fsync", "fdatasync"):
            calls[fields[-1]] = int(fields[3])
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    parser.add_argument("--dir", help="where the store files go (default: a new directory under bench/out)")
    parser.add_argument(
        "--commit-delay", type=float, default=0.0, help="the store's (default 0: the next reactor turn)"
    )
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs with strace")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        name, rest = args.phase[0], args.phase[1:]
        if name == "memory":
            result = memory_phase(rest[0], float(rest[1]))
        elif name == "store":
            result = store_phase(rest[0], float(rest[1]), rest[2], float(rest[3]))
        elif name == "handoff":
            result = handoff_phase()
        else:
            result = load_phase(rest[0])
        print(json.dumps(result))
        return
    strace = not args.no_strace and shutil.which("strace") is not None
    out = os.path.join(ROOT, "bench", "out")
    os.makedirs(out, exist_ok=True)
    directory = args.dir or tempfile.mkdtemp(prefix="session-store-", dir=out)
    load_before = os.getloadavg()
    report: dict = {
        "load_before": load_before,
        "dir": directory,
        "seconds": args.seconds,
        "commit_delay": args.commit_delay,
    }
    for scenario, (size, burst, depth) in SCENARIOS.items():
        memory = child(["memory", scenario, str(args.seconds)], False, directory)
        store = child(["store", scenario, str(args.seconds), directory, str(args.commit_delay)], strace, directory)
        ratio = store["rate"] / memory["rate"]
        report[scenario] = {"memory": memory, "store": store, "ratio": ratio}
        print(
            f"{scenario} ({size} B, bursts of {burst}, {depth} waiting): memory {memory['rate']:,.0f} msg/s; "
            f"store {store['rate']:,.0f} msg/s = {ratio:.4f} of memory"
        )
        print(
            f"         {store['commits_per_s']:,.0f} commits/s ({store['messages_per_commit']:.0f} messages each), "
            f"fsyncs/s {store.get('fsyncs_per_s') or 0:,.0f}; durable p50 {store['durable_p50_ms']:.2f} ms, "
            f"p99 {store['durable_p99_ms']:.2f} ms; reactor thread {store['reactor_cpu_us']:.2f} us/msg "
            f"(memory {memory['cpu_us']:.2f}), process {store['process_cpu_us']:.2f} us/msg; written "
            f"{store['written_per_message']:,.0f} B/msg, {store['written_per_commit']:,.0f} B/commit; writer thread, "
            f"wall: statements {store['writer_write_us']:.2f} us/msg, COMMIT {store['writer_sync_us']:.2f} us/msg"
        )
    handoff = child(["handoff"], False, directory)
    report["handoff"] = handoff
    print(
        f"handoff round trip: thread + callFromThread {handoff['thread_call_from_thread_us']:.1f} us, "
        f"deferToThreadPool {handoff['defer_to_thread_pool_us']:.1f} us"
    )
    load = child(["load", directory], False, directory)
    report["load"] = load
    print(
        f"open and load {load['messages']:,} messages ({load['file_bytes']:,} B file): {load['open_and_load_s']:.2f} s"
    )
    report["load_after"] = os.getloadavg()
    print(f"load average before {load_before}, after {report['load_after']}")
    if not args.dir:
        shutil.rmtree(directory)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
