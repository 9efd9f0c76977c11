"""CPU per message of two Switches in one process, without sockets: a steadier view.

    PYTHONPATH=<tree> .venv/bin/python bench/msgcost.py [--ack-every-messages N ...]
        [--profile bulk|small|small_many|rtt] [--pair-before REV [--rounds 5]]

run.py's ``acks`` scenario runs this once per variant and round, with the variant's mconn
on PYTHONPATH. A dialing and a listening Switch are joined by two Twisted
``StringTransport``s, which this script empties into the other side's ``dataReceived``
until neither has anything to say; the clock is a ``task.Clock`` that never advances,
so only count-based acks are sent. A *batch* is: the sender calls ``try_send`` until
``batch`` messages are accepted (each is queued, framed and written to its transport in
that call), then the bytes are shuttled both ways until quiet (the receiver parses,
routes and acknowledges; the sender takes the acks in). Each phase is timed with
``time.process_time``, and each phase's figure is its *smallest* cost per message over
the batches: the least disturbed by other processes, which only ever add time. Only API
present before the session layer is used (commit 82a45f3 on).

``--profile SCENARIO`` runs that scenario's batches under cProfile instead and prints the
top functions by own time, with their calls per message.

``--pair-before REV`` measures mconn now and mconn at REV in the same run: REV's mconn/
is ``git archive``-d into a directory under /tmp and, when it has the compiled twin
(mconn/core/_speedups.pyx), its extension is built there (``cythonize -i``), so that
before and after each run as ``make`` would install them. Then ``--rounds`` rounds run
this script once per tree, the order reversed every other round, each in its own process
with its tree on PYTHONPATH; the figure of each tree is its median over the rounds, and
the line printed is ``{"now": {...}, "before": {...}, "now_over_before": {...}}`` with
each tree's implementation (``mconn --version``'s word) and file.

Prints one JSON line: ``{"bulk": {"send_us": ..., "deliver_us": ..., "total_us": ...},
"small": {...}, "small_many": {...}, "rtt": {"round_trip_us": ...}, "mconn_file": ...,
"implementation": ...}``,
microseconds per message (bulk messages are 1 MiB). ``small_many`` sends each batch with
one ``Peer.try_send_many`` call (one pump for the batch) and is left out for trees
without it. ``rtt`` is the CPU of one round trip: one 100-byte message sent with
``try_send``, echoed by the other side's reactor with ``try_send``, both ways shuttled,
as the socket benchmark's rtt scenario does it but without the sockets and the event
loop (the smallest of 40 batches of 500, process time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

import mconn
from mconn import ChannelDescriptor, Config, Reactor, Switch

# bench/run.py's acks scenario also runs this file on a tree from before the layers were
# packages (its --before, 82a45f3 by default), where the protocol is mconn/protocol.py.
if os.path.isdir(os.path.join(os.path.dirname(mconn.__file__), "net")):
    from mconn.net.protocol import MConnectionFactory
else:
    from mconn.protocol import MConnectionFactory  # type: ignore[no-redef]

from hot_path import implementation  # bench/hot_path.py

CHANNEL = ChannelDescriptor(0x10, priority=1, send_queue_capacity=100000)
#: scenario -> (message size, messages per batch, batches)
WORK = {"bulk": (1 << 20, 4, 40), "small": (100, 1000, 60), "small_many": (100, 1000, 60)}


class Counter(Reactor):
    def __init__(self) -> None:
        self.peer = None
        self.received = 0

    def get_channels(self):
        return [CHANNEL]

    def add_peer(self, peer) -> None:
        self.peer = peer

    def receive(self, channel_id, peer, message) -> None:
        self.received += 1


def shuttle(a, b) -> None:
    """Hand each side what the other wrote, until neither writes more (bounded)."""
    for _ in range(100000):
        moved = False
        for src, dst in ((a, b), (b, a)):
            data = src.transport.value()
            if data:
                src.transport.clear()
                dst.dataReceived(data)
                moved = True
        if not moved:
            return
    raise RuntimeError("the two sides never went quiet")


def connect(config: Config, reactor_type=Counter):
    """(dialer, listener, their reactors): two Switches running a ``reactor_type()`` each, past the handshake."""
    clock = Clock()
    ra, rb = reactor_type(), reactor_type()
    a = Switch([ra], config=config, clock=clock)
    b = Switch([rb], config=config, clock=clock)
    dialer = MConnectionFactory(a, is_outbound=True, expected_node_id=b.node_id).buildProtocol(None)
    listener = MConnectionFactory(b, is_outbound=False).buildProtocol(None)
    dialer.makeConnection(StringTransport(IPv4Address("TCP", "127.0.0.1", 1), IPv4Address("TCP", "127.0.0.1", 2)))
    listener.makeConnection(StringTransport(IPv4Address("TCP", "127.0.0.1", 2), IPv4Address("TCP", "127.0.0.1", 1)))
    shuttle(dialer, listener)
    if ra.peer is None or rb.peer is None:
        raise RuntimeError("the handshake did not complete in memory")
    return dialer, listener, ra, rb


class Echo(Counter):
    """Sends every message back on its channel (the rtt scenario's far side)."""

    def receive(self, channel_id, peer, message) -> None:
        self.received += 1
        peer.try_send(channel_id, message)


def measure_rtt(config: Config, batches: int = 40, batch: int = 500) -> dict:
    """CPU per round trip of one 100-byte message (see the module docstring)."""
    made = iter([Counter, Echo])  # connect() builds the dialer's reactor first
    dialer, listener, ra, rb = connect(config, reactor_type=lambda: next(made)())
    peer, msg = ra.peer, bytes(100)

    def one() -> None:
        if not peer.try_send(CHANNEL.id, msg):
            raise RuntimeError("rtt: try_send refused with nothing in flight")
        for src, dst in ((dialer, listener), (listener, dialer)):
            data = src.transport.value()
            src.transport.clear()
            dst.dataReceived(data)

    for _ in range(200):
        one()
    best = float("inf")
    for _ in range(batches):
        t0 = time.process_time()
        for _ in range(batch):
            one()
        best = min(best, time.process_time() - t0)
    if ra.received != rb.received or ra.received < batches * batch:
        raise RuntimeError(f"rtt: {rb.received} messages echoed, {ra.received} came back")
    return {"round_trip_us": best * 1e6 / batch}


def _supported(scenario: str) -> bool:
    """``small_many`` needs ``Peer.try_send_many`` (the batch API); a tree without it skips it."""
    from mconn import Peer

    return not scenario.endswith("_many") or hasattr(Peer, "try_send_many")


def measure(config: Config, scenario: str) -> dict:
    """The smallest cost per message of each phase over the batches (microseconds)."""
    size, batch, batches = WORK[scenario]
    dialer, listener, ra, rb = connect(config)
    peer, msg = ra.peer, bytes(size)
    send, deliver = [], []
    for _ in range(batches):
        t0 = time.process_time()
        if scenario.endswith("_many"):  # Peer.try_send_many: one pump for the batch
            if peer.try_send_many(CHANNEL.id, [msg] * batch) != batch:
                raise RuntimeError(f"{scenario}: try_send_many refused with nothing in flight")
        else:
            for _ in range(batch):
                if not peer.try_send(CHANNEL.id, msg):
                    raise RuntimeError(f"{scenario}: try_send refused with nothing in flight")
        t1 = time.process_time()
        shuttle(dialer, listener)
        deliver.append(time.process_time() - t1)
        send.append(t1 - t0)
    if rb.received != batch * batches:
        raise RuntimeError(f"{scenario}: {rb.received} messages delivered of {batch * batches}")
    cost = {"send_us": min(send) * 1e6 / batch, "deliver_us": min(deliver) * 1e6 / batch}
    cost["total_us"] = cost["send_us"] + cost["deliver_us"]
    return cost


def profile(config: Config, scenario: str, top: int = 25) -> None:
    """``measure`` under cProfile; the top functions by own time, per message."""
    profiler = cProfile.Profile()
    if scenario == "rtt":  # n is round trips here
        batch, batches = 500, 10
        profiler.runcall(measure_rtt, config, batches, batch)
    else:
        profiler.runcall(measure, config, scenario)
        size, batch, batches = WORK[scenario]
    n = batch * batches
    stats = pstats.Stats(profiler).stats
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    print(f"cProfile of msgcost {scenario}: {n} messages; own and cumulative us per message (inflated)")
    print(f"{'calls/msg':>10}{'own us':>9}{'cum us':>9}  function")
    for (path, line, name), (calls, _, own, cum, _) in rows:
        print(f"{calls / n:>10.3f}{own * 1e6 / n:>9.3f}{cum * 1e6 / n:>9.3f}  {path.rsplit('/', 1)[-1]}:{line}({name})")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def built_tree(rev: str):
    """mconn/ at ``rev`` in a new directory under /tmp, its compiled twin built when it
    has one; yields the directory (removed on exit)."""
    name = "".join(c if c.isalnum() else "_" for c in rev[:12])
    directory = tempfile.mkdtemp(prefix=f"mconn-msgcost-{name}-", dir="/tmp")
    try:
        archive = subprocess.Popen(["git", "-C", REPO, "archive", "--format=tar", rev, "mconn"], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", directory], stdin=archive.stdout, check=True)
        archive.stdout.close()
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {rev} failed")
        pyx = os.path.join(directory, "mconn", "core", "_speedups.pyx")
        if os.path.exists(pyx):
            cythonize = os.path.join(os.path.dirname(sys.executable), "cythonize")
            subprocess.run([cythonize, "-q", "-i", "-3", pyx], check=True, capture_output=True, timeout=600)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_tree(tree: str, options: list[str]) -> dict:
    """This script (without --pair-before) on ``tree``'s mconn, in its own process."""
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *options],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"msgcost on {tree} failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["mconn_file"].startswith(tree + os.sep):
        raise RuntimeError(f"msgcost on {tree} imported mconn from {out['mconn_file']}")
    return out


def _medians(runs: list[dict]) -> dict:
    """Per scenario and figure, the median over the rounds (other fields: the first's)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = {k: statistics.median(r[key][k] for r in runs) for k in value}
    return out


def pair_before(rev: str, rounds: int, options: list[str]) -> dict:
    """Now and ``rev``, ``rounds`` times each, alternating (see the module docstring)."""
    runs: dict[str, list[dict]] = {"now": [], "before": []}
    with built_tree(rev) as before:
        trees = {"now": REPO, "before": before}
        for n in range(rounds):
            for name in ("now", "before") if n % 2 == 0 else ("before", "now"):
                runs[name].append(run_tree(trees[name], options))
    now, then = _medians(runs["now"]), _medians(runs["before"])
    ratios = {
        key: {k: now[key][k] / then[key][k] for k in value if then[key].get(k)}
        for key, value in now.items()
        if isinstance(value, dict) and isinstance(then.get(key), dict)
    }
    return {"now": now, "before": then, "now_over_before": ratios, "before_rev": rev, "rounds": rounds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("ack_every_messages", "ack_every_bytes"):
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--ack-interval", type=float)
    p.add_argument("--profile", choices=sorted(WORK) + ["rtt"], help="print a cProfile of one scenario instead")
    p.add_argument("--pair-before", metavar="REV", help="also measure mconn at REV (its twin built) in the same run")
    p.add_argument("--rounds", type=int, default=5, help="--pair-before: rounds of the two trees (default 5)")
    args = p.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k.startswith("ack_") and v is not None}
    if args.pair_before:
        if args.rounds < 1:
            p.error(f"--rounds must be at least 1, got {args.rounds}")
        print(json.dumps(pair_before(args.pair_before, args.rounds, as_options(fields))))
        return 0
    config = Config(stats_interval=0, **fields)
    if args.profile:
        profile(config, args.profile)
        return 0
    out = {scenario: measure(config, scenario) for scenario in WORK if _supported(scenario)}
    out["rtt"] = measure_rtt(config)
    out["mconn_file"] = sys.modules["mconn"].__file__
    out["implementation"] = implementation()
    print(json.dumps(out))
    return 0


def as_options(fields: dict) -> list[str]:
    """``{"ack_interval": 1.0}`` -> ``["--ack-interval", "1.0"]``."""
    return [x for name, value in fields.items() for x in ("--" + name.replace("_", "-"), str(value))]


if __name__ == "__main__":
    sys.exit(main())
