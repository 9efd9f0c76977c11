"""Priority under a receive rate: votes against a block-part flood, before and after pacing.

A receiver reads at ``recv_rate`` 1,000,000 B/s; its peer sends at ``send_rate``
5,120,000 B/s (CometBFT's default) and keeps a priority-1 channel full of 64 KiB block
parts (``send_queue_capacity`` 100, as CometBFT's consensus channels), while a vote
(200 bytes) goes out on a priority-10 channel every 50-100 ms (uniform). Each message
carries its send time (``time.time()``, taken when ``try_send`` accepts it: one machine,
one clock); the receiver's reactor records its latency. Messages sent in the first
``--warmup`` seconds are left out.

Before pacing, the sender outruns the receiver: the excess piles up in the kernels'
socket buffers between them, below the scheduler, and a vote waits behind all of it.
With the receiver's rate announced in its hello, the sender paces at it and the backlog
stays in its scheduler, where a vote overtakes the block parts.

Both Switches run in one child process over real loopback sockets (127.0.0.1); the child
imports mconn from the tree given on PYTHONPATH. ``--pair-before REV`` also runs the
child against mconn at REV (``git archive``-d into a temporary directory, removed at the
end), right before the current tree, and prints both::

    .venv/bin/python bench/rate_priority.py --pair-before HEAD~1     # about 70 s
    .venv/bin/python bench/rate_priority.py --duration 10 --warmup 3 # the current tree only

Each child is stopped by its PID if it outlives its deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VOTE, PART = 0x22, 0x21
SEND_RATE = 5_120_000
RECV_RATE = 1_000_000
PART_SIZE = 64 * 1024
VOTE_SIZE = 200
QUEUE = 100
STAMP = struct.Struct("!d")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


# -- the child: two Switches on loopback ---------------------------------------------


async def measure(reactor, duration: float, warmup: float) -> dict:
    import mconn
    from mconn import ChannelDescriptor, Config, Reactor, Switch
    from twisted.internet import defer, task

    latencies: dict[int, list[tuple[float, float]]] = {VOTE: [], PART: []}

    class Consensus(Reactor):
        def get_channels(self):
            return [
                ChannelDescriptor(VOTE, priority=10, send_queue_capacity=QUEUE),
                ChannelDescriptor(PART, priority=1, send_queue_capacity=QUEUE),
            ]

        def receive(self, channel_id, peer, message):
            (sent,) = STAMP.unpack_from(message)
            latencies[channel_id].append((sent, time.time() - sent))

    config = Config(send_rate=SEND_RATE, recv_rate=RECV_RATE, stats_interval=0)
    receiver = Switch([Consensus()], config=config, clock=reactor)
    sender = Switch([Consensus()], config=config, clock=reactor)
    for switch in (receiver, sender):
        switch.startService()
    try:
        port = (await receiver.listen("tcp:0:interface=127.0.0.1")).getHost().port
        peer = await sender.dial(f"{receiver.node_id}@127.0.0.1:{port}")
        filler = b"p" * (PART_SIZE - STAMP.size)
        vote_filler = b"v" * (VOTE_SIZE - STAMP.size)
        start = time.time()
        end = start + duration
        sent = {VOTE: 0, PART: 0}

        def fill() -> None:
            # Bounded: at most the queue's capacity per call, then try_send refuses.
            for _ in range(QUEUE + 1):
                if not peer.try_send(PART, STAMP.pack(time.time()) + filler):
                    break
                sent[PART] += 1

        flood = task.LoopingCall(fill)
        flood.clock = reactor
        flood.start(0.002)
        rng = random.Random(1)
        while time.time() < end:  # one vote per 50-100 ms until the end
            await task.deferLater(reactor, rng.uniform(0.05, 0.1), lambda: None)
            if peer.try_send(VOTE, STAMP.pack(time.time()) + vote_filler):
                sent[VOTE] += 1
        flood.stop()
    finally:
        await defer.gatherResults([s.stopService() for s in (sender, receiver)])
    cut = start + warmup
    votes = [lat for t, lat in latencies[VOTE] if t >= cut]
    parts = [lat for t, lat in latencies[PART] if t >= cut]
    # Goodput: the parts that arrived after the warm-up, whenever sent.
    received = sum(1 for t, lat in latencies[PART] if t + lat >= cut)
    return {
        "mconn_file": mconn.__file__,
        "votes": len(votes),
        "votes_sent": sent[VOTE],
        "vote_p50": percentile(votes, 0.5),
        "vote_p99": percentile(votes, 0.99),
        "vote_max": max(votes) if votes else float("nan"),
        "parts": len(parts),
        "part_p50": percentile(parts, 0.5),
        "part_p99": percentile(parts, 0.99),
        "part_rate": received * PART_SIZE / (end - cut),
    }


def child(args) -> None:
    from twisted.internet import defer, task

    def run(reactor):
        d = defer.ensureDeferred(measure(reactor, args.duration, args.warmup))
        return d.addCallback(lambda result: print(json.dumps(result), flush=True))

    task.react(run)


# -- the parent: one child per tree ----------------------------------------------------


def run_child(name: str, tree: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, __file__, "--child", "--duration", str(args.duration), "--warmup", str(args.warmup)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=tree)
    try:
        out, _ = proc.communicate(timeout=args.duration + 60)
    finally:
        if proc.poll() is None:
            proc.kill()  # this child, by its PID
            proc.wait()
    result = json.loads(out.decode().strip().splitlines()[-1])
    if not result["mconn_file"].startswith(tree):
        raise SystemExit(f"{name}: imported {result['mconn_file']}, not mconn of {tree}")
    return result


def archive(rev: str, into: str) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True)
    data = subprocess.run(["git", "archive", rev, "mconn"], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=data, check=True)
    return commit.stdout.strip()


def main(args) -> None:
    results = {}
    tmp = tempfile.mkdtemp(prefix="mconn-rate-priority-") if args.pair_before else None
    try:
        if tmp is not None:
            commit = archive(args.pair_before, tmp)
            print(f"before: mconn at {commit}", flush=True)
            results[f"before ({commit})"] = run_child("before", tmp, args)
        results["now"] = run_child("now", REPO, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)
    print(
        f"send_rate {SEND_RATE:,} B/s, recv_rate {RECV_RATE:,} B/s, {PART_SIZE // 1024} KiB parts (priority 1), "
        f"{VOTE_SIZE} B votes (priority 10) every 50-100 ms; {args.duration:g} s, first {args.warmup:g} s left out"
    )
    print(
        f"{'tree':16} {'votes':>6} {'vote p50':>10} {'vote p99':>10} {'vote max':>10} {'parts':>6} {'part p50':>10} {'part p99':>10} {'parts B/s':>11}"
    )
    for name, r in results.items():
        print(
            f"{name:16} {r['votes']:6d} {r['vote_p50'] * 1e3:8.1f}ms {r['vote_p99'] * 1e3:8.1f}ms {r['vote_max'] * 1e3:8.1f}ms "
            f"{r['parts']:6d} {r['part_p50'] * 1e3:8.1f}ms {r['part_p99'] * 1e3:8.1f}ms {r['part_rate']:11,.0f}"
        )
    now = results["now"]
    verdict = "PASS" if now["vote_p99"] < now["part_p50"] / 10 else "FAIL"
    print(
        f"now: vote p99 {now['vote_p99'] * 1e3:.1f} ms against part p50 {now['part_p50'] * 1e3:.1f} ms: {verdict} (target: under a tenth)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of flood and votes per tree")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of messages left out at the start")
    parser.add_argument("--pair-before", metavar="REV", help="also measure mconn at REV, first")
    parser.add_argument("--json", metavar="FILE", help="write the results here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.child:
        child(parsed)
    else:
        main(parsed)
