"""CPU per telemetry event, written to a telemetry file, in one process (issue 13).

    PYTHONPATH=<tree> .venv/bin/python bench/telemetry_cost.py

What a connect storm pays per connection at the listener: ``connection_made``,
``handshake_done`` (with channels) and ``session_started`` through ``telemetry.emit`` to a
``TelemetryFileService`` on its own publisher, writing into a temporary directory. Prints
the smallest process time per event of 7 rounds of 2,000 connections (6,000 events): the
least disturbed by other processes. Run it with the trees to compare on PYTHONPATH, in
turns, in the same minutes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from twisted.logger import LogPublisher

from mconn import telemetry
from mconn.telemetry_file import TelemetryFileService

NODE, PEER = "ab" * 20, "cd" * 20
ROUNDS, CONNECTIONS = 7, 2000


def one_connection(i: int) -> None:
    address = f"127.0.0.1:{i}"
    telemetry.emit("connection_made", node_id=NODE, direction="inbound", remote_address=address,
                   local_address="127.0.0.1:26656")
    telemetry.emit("handshake_done", node_id=NODE, peer_id=PEER, remote_address=address, direction="inbound",
                   moniker="m", version="1", channels=[1, 2, 3], listen_address="127.0.0.1:1")
    telemetry.emit("session_started", node_id=NODE, peer_id=PEER, session_id="ef" * 16, direction="inbound",
                   remote_address=address)


def main() -> None:
    publisher = LogPublisher()
    telemetry.log.observer = publisher
    directory = tempfile.mkdtemp(prefix="mconn-telemetry-cost-")
    service = TelemetryFileService(os.path.join(directory, "t.jsonl"), NODE, publisher=publisher)
    service.startService()
    try:
        best = float("inf")
        for _ in range(ROUNDS):
            t0 = time.process_time()
            for i in range(CONNECTIONS):
                one_connection(i)
            best = min(best, (time.process_time() - t0) / (3 * CONNECTIONS))
    finally:
        service.stopService()
        shutil.rmtree(directory)
    print(f"{telemetry.__file__}: {best * 1e6:.1f} us per event (smallest of {ROUNDS} x {3 * CONNECTIONS})")


if __name__ == "__main__":
    main()
