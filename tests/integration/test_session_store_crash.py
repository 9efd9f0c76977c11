"""The session store survives a process killed while it commits (specs/resume.md section 8.4).

A child process (``sys.executable -c CHILD``) opens the store, takes up the stream where the
file left it, and records in a loop: a batch of messages of random sizes on one channel,
acks trailing behind, a delivered count on another, a checkpoint about every commit; after each ``durable()`` it prints the
last committed sequence number and ack. The test SIGKILLs it by PID at a seeded random
moment, then opens the file itself: the store opens cleanly, every message the child
reported committed is there (or acknowledged), whole and in order, with no gap, and the
counts are at least those reported. Each seed kills the same store twice, so a
store recovered from one kill is the one the next child writes.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest
from helpers import ThreadClock
from mconn.errors import StoreCorrupt
from mconn.switch.session_store import SessionStore

pytestmark = pytest.mark.integration

NODE = "d" * 40
SESSION = b"\x05" * 16
DATA, COUNTS = 0x20, 0x21
SEEDS = range(20)
KILLS_PER_SEED = 2

#: The child: records until killed. Message ``seq`` is ``payload(seq)``, of a size drawn
#: from the seed, so the parent can check every byte.
CHILD = r"""
import random, sys, threading
from twisted.internet import task
from mconn.switch import session_store_file
from mconn.switch.session_store import SessionStore

# A checkpoint (the WAL folded into the file) every 64 pages, about every commit, so that
# kills land in checkpoints as well as in commits.
session_store_file.WAL_PAGES = 64
path, node, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
SESSION, DATA, COUNTS = b"\x05" * 16, 0x20, 0x21

def payload(seq):
    return b"%d:" % seq + bytes([seq % 251]) * random.Random(seq).choice((0, 10, 100, 3000, 20000, 60000))

async def main(reactor):
    store = SessionStore.open(path, node, max_bytes=64 << 20, reactor=reactor, commit_delay=0.002)
    loaded = store.load()
    if loaded:
        stream = loaded[0].streams[DATA]
        seq, acked = stream.acked + len(stream.unacked), stream.acked
    else:
        store.begin(SESSION, "e" * 40, True, (DATA, COUNTS))
        seq = acked = 0
    rng = random.Random(seed)
    print("open", seq, acked, flush=True)
    while True:
        for _ in range(rng.randint(1, 40)):
            store.accepted(SESSION, DATA, seq, payload(seq))
            seq += 1
        acked = max(acked, seq - rng.randint(1, 300))
        store.acked(SESSION, DATA, acked)
        store.delivered(SESSION, COUNTS, seq)
        await store.durable()
        # durable() fires in the reactor's thread, not the writer's: else the child fails.
        assert threading.current_thread() is threading.main_thread(), threading.current_thread()
        print("committed", seq - 1, acked, flush=True)

task.react(main)
"""


def payload(seq: int) -> bytes:
    return b"%d:" % seq + bytes([seq % 251]) * random.Random(seq).choice((0, 10, 100, 3000, 20000, 60000))


def lines_until_killed(child: subprocess.Popen, delay: float) -> list[str]:
    """The child's complete stdout lines, read while it runs; SIGKILL (by PID) ``delay``
    seconds after its first commit."""
    assert child.stdout is not None
    out, kill_at, deadline = b"", None, time.monotonic() + 60
    fd = child.stdout.fileno()
    while time.monotonic() < deadline:
        if kill_at is None and b"committed" in out:
            kill_at = time.monotonic() + delay
        if kill_at is not None and time.monotonic() >= kill_at:
            os.kill(child.pid, signal.SIGKILL)
            break
        ready, _, _ = select.select([fd], [], [], 0.001)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # the child ended by itself: its stderr says why
            out += chunk
    else:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    rest = child.stdout.read()
    assert child.returncode == -signal.SIGKILL, f"child ended with {child.returncode}: {child.stderr.read()!r}"
    out += rest
    return [line for line in out.decode().split("\n")[:-1]]  # the last piece has no newline: cut


def check_store(path: str, committed: int, acked: int) -> tuple[int, int]:
    """Open the store the killed child left; every reported message is there. Returns the
    stream's (acked, next sequence number)."""
    clock = ThreadClock()
    store = SessionStore.open(path, NODE, max_bytes=64 << 20, reactor=clock)
    (stored,) = store.load()
    closed = store.close()
    clock.pump()
    assert closed.called
    stream = stored.streams[DATA]
    following = stream.acked + len(stream.unacked)
    assert stream.acked >= acked, f"ack {acked} was committed, the store says {stream.acked}"
    assert following > committed, f"message {committed} was committed, the store ends at {following - 1}"
    for offset, message in enumerate(stream.unacked):  # whole, in order, no gap (load checks the numbers)
        assert message == payload(stream.acked + offset), stream.acked + offset
    assert stored.streams[COUNTS].delivered >= committed + 1
    assert stored.streams[COUNTS].delivered == following  # recorded in the same transactions
    return stream.acked, following


@pytest.mark.parametrize("seed", SEEDS)
def test_a_store_killed_during_commits_keeps_everything_committed(tmp_path, seed):
    path = str(tmp_path / "sessions.db")
    rng = random.Random(seed)
    position = (0, 0)
    for kill in range(KILLS_PER_SEED):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, path, NODE, str(seed * 100 + kill)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        lines = lines_until_killed(child, rng.uniform(0.0, 0.3))
        opened = lines[0].split()
        assert opened[0] == "open" and (int(opened[2]), int(opened[1])) == position, (lines[0], position)
        reports = [line.split() for line in lines if line.startswith("committed")]
        assert reports, lines
        _, committed, acked = reports[-1]
        position = check_store(path, int(committed), int(acked))
        assert position[1] > int(committed)


def test_a_store_whose_file_is_cut_short_is_corrupt_not_half_loaded(tmp_path):
    """The torn write sqlite cannot heal: the database file itself cut short (a disk that
    lost its tail). The store refuses it instead of loading part of a stream."""
    path = str(tmp_path / "sessions.db")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, NODE, "7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines_until_killed(child, 0.5)
    check_store(path, 0, 0)  # and its close folded the WAL into the file
    assert not os.path.exists(path + "-wal")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - size // 3)
    with pytest.raises(StoreCorrupt):
        SessionStore.open(path, NODE, max_bytes=64 << 20, reactor=ThreadClock())
