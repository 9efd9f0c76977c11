"""CPU per telemetry event, written to a telemetry file, in one process.

    PYTHONPATH=<tree> .venv/bin/python bench/telemetry_cost.py [--per-turn N]

What a connect storm pays per connection at the listener: ``connection_made``,
``handshake_done`` (with channels) and ``session_started`` through ``telemetry.emit`` to a
``TelemetryFileService`` on its own publisher, writing into a temporary directory. Prints
the smallest process time per event of 7 rounds of 2,000 connections (6,000 events): the
least disturbed by other processes. Run it with the trees to compare on PYTHONPATH, in
turns, in the same minutes.

The service is given a ``task.Clock`` when it takes one (a tree whose records of a
reactor turn are written together, at its end), and a turn ends after every
``--per-turn`` connections (default 1: three records a write, the least a storm
batches; a storm's turns hold many connections each). A tree that writes each record
at once ignores it.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import tempfile
import time

from twisted.internet.task import Clock
from twisted.logger import LogPublisher

from mconn.switch import telemetry
from mconn.ops.telemetry_file import TelemetryFileService, rotated_paths

NODE, PEER = "ab" * 20, "cd" * 20
ROUNDS, CONNECTIONS = 7, 2000


def one_connection(i: int) -> None:
    address = f"127.0.0.1:{i}"
    telemetry.emit(
        "connection_made", node_id=NODE, direction="inbound", remote_address=address, local_address="127.0.0.1:26656"
    )
    telemetry.emit(
        "handshake_done",
        node_id=NODE,
        peer_id=PEER,
        remote_address=address,
        direction="inbound",
        moniker="m",
        version="1",
        channels=[1, 2, 3],
        listen_address="127.0.0.1:1",
    )
    telemetry.emit(
        "session_started", node_id=NODE, peer_id=PEER, session_id="ef" * 16, direction="inbound", remote_address=address
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-turn", type=int, default=1, help="connections per reactor turn")
    args = parser.parse_args()
    publisher = LogPublisher()
    telemetry.log.observer = publisher
    directory = tempfile.mkdtemp(prefix="mconn-telemetry-cost-")
    path = os.path.join(directory, "t.jsonl")
    clock = Clock()
    takes_clock = "clock" in inspect.signature(TelemetryFileService).parameters
    options = {"clock": clock} if takes_clock else {}
    service = TelemetryFileService(path, NODE, publisher=publisher, **options)
    service.startService()
    try:
        best = float("inf")
        for _ in range(ROUNDS):
            t0 = time.process_time()
            for i in range(CONNECTIONS):
                one_connection(i)
                if (i + 1) % args.per_turn == 0:
                    clock.advance(0)  # the turn ends: its records are written
            clock.advance(0)
            best = min(best, (time.process_time() - t0) / (3 * CONNECTIONS))
    finally:
        service.stopService()
        lines = sum(1 for name in rotated_paths(path) for _ in open(name))
        shutil.rmtree(directory)
    assert lines == ROUNDS * 3 * CONNECTIONS, f"{lines} records written, not {ROUNDS * 3 * CONNECTIONS}"
    turns = f"{args.per_turn} connection(s) a turn" if takes_clock else "a write per record"
    print(f"{telemetry.__file__}: {best * 1e6:.1f} us per event (smallest of {ROUNDS} x {3 * CONNECTIONS}; {turns})")


if __name__ == "__main__":
    main()
