"""Typed messages against raw bytes: CPU per message of two Switches in one process.

    .venv/bin/python bench/typed.py [--rounds 3] [--before TREE]

The harness is bench/msgcost.py's (two Switches joined by StringTransports, no sockets,
``time.process_time``, the smallest cost per message over the batches). Each round runs,
in turn, on one connection with three channels:

* ``raw``: a raw channel; the sender passes the bytes of an encoded ``Tx`` (about 100
  bytes), the reactor gets bytes. The baseline.
* ``typed``: a channel with ``message_type=Tx``; the sender passes ``Tx`` objects
  (encoded by the Peer), the reactor gets decoded ``Tx`` objects.
* ``typed_bytes``: the same typed channel; the sender passes the encoded bytes (encode
  once, send to many), the reactor still gets decoded objects.

Prints one JSON line per round and the ratios ``typed / raw`` of the medians (above 1 is
slower). ``Tx`` is built at run time from a descriptor (tests/typed_messages.py).

``--before TREE`` also runs ``bench/msgcost.py`` (its ``small`` and ``small_many`` raw
scenarios) with TREE's mconn and with this tree's (or ``--after TREE``'s), alternating,
``--rounds`` times: the cost of raw bytes before and after typed channels existed, as a
ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from msgcost import connect, shuttle  # noqa: E402
from typed_messages import Tx  # noqa: E402

from mconn import ChannelDescriptor, Config, Reactor  # noqa: E402

RAW, TYPED = 0x10, 0x11
BATCH, BATCHES = 1000, 40
MESSAGE = Tx(data=bytes(range(80)), nonce=123456789, sender="node-0")
ENCODED = MESSAGE.SerializeToString()


class Counter(Reactor):
    def __init__(self) -> None:
        self.peer = None
        self.received = 0
        self.last = None

    def get_channels(self):
        return [
            ChannelDescriptor(RAW, send_queue_capacity=BATCH * 2),
            ChannelDescriptor(TYPED, send_queue_capacity=BATCH * 2, message_type=Tx),
        ]

    def add_peer(self, peer) -> None:
        self.peer = peer

    def receive(self, channel_id, peer, message) -> None:
        self.received += 1
        self.last = message


SCENARIOS = {"raw": (RAW, ENCODED, bytes), "typed": (TYPED, MESSAGE, Tx), "typed_bytes": (TYPED, ENCODED, Tx)}


def measure(scenario: str) -> dict:
    channel, message, received_type = SCENARIOS[scenario]
    dialer, listener, ra, rb = connect(Config(stats_interval=0), Counter)
    send, deliver = [], []
    for _ in range(BATCHES):
        t0 = time.process_time()
        if ra.peer.try_send_many(channel, [message] * BATCH) != BATCH:
            raise RuntimeError(f"{scenario}: try_send_many refused with nothing in flight")
        t1 = time.process_time()
        shuttle(dialer, listener)
        deliver.append(time.process_time() - t1)
        send.append(t1 - t0)
    if rb.received != BATCH * BATCHES or type(rb.last) is not received_type:
        raise RuntimeError(f"{scenario}: {rb.received} messages, the last a {type(rb.last).__name__}")
    cost = {"send_us": min(send) * 1e6 / BATCH, "deliver_us": min(deliver) * 1e6 / BATCH}
    cost["total_us"] = cost["send_us"] + cost["deliver_us"]
    return cost


def before_after(tree: str, after: str, rounds: int) -> dict:
    """bench/msgcost.py's raw small-message costs with TREE's mconn and with AFTER's."""
    runs = {"before": [], "after": []}
    for _ in range(rounds):
        for label, path in (("before", tree), ("after", after)):
            env = dict(os.environ, PYTHONPATH=path)
            out = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "msgcost.py")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            runs[label].append(json.loads(out.stdout.splitlines()[-1]))
    result = {}
    for scenario in ("small", "small_many"):
        before = statistics.median(r[scenario]["total_us"] for r in runs["before"])
        after = statistics.median(r[scenario]["total_us"] for r in runs["after"])
        result[scenario] = {
            "before_us": round(before, 2),
            "after_us": round(after, 2),
            "after/before": round(after / before, 3),
        }
    result["mconn_files"] = [runs["before"][0]["mconn_file"], runs["after"][0]["mconn_file"]]
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="a tree with an older mconn/ (git archive REV mconn | tar -x -C TREE)")
    p.add_argument("--after", default=str(ROOT), help="the tree --before is compared with (default: this one)")
    args = p.parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        row = {name: measure(name) for name in SCENARIOS}
        rounds.append(row)
        print(json.dumps({"round": i + 1, **{k: {m: round(v, 2) for m, v in c.items()} for k, c in row.items()}}))
    medians = {name: statistics.median(r[name]["total_us"] for r in rounds) for name in SCENARIOS}
    print(
        json.dumps(
            {
                "total_us_median": {k: round(v, 2) for k, v in medians.items()},
                "typed/raw": round(medians["typed"] / medians["raw"], 3),
                "typed_bytes/raw": round(medians["typed_bytes"] / medians["raw"], 3),
            }
        )
    )
    if args.before:
        print(json.dumps({"raw bytes, msgcost.py": before_after(args.before, args.after, args.rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
