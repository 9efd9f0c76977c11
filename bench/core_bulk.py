"""CPU per MB of bulk through two sans-I/O Connections, the receiver fed 64 KiB reads.

    PYTHONPATH=<tree> .venv/bin/python bench/core_bulk.py [--messages 300] [--read 65536] [--payload 65536]

A steadier view of the core's own bulk cost than the socket benchmark (no event loop, no
kernel, process time only): a dialing and a listening ``Connection`` exchange hellos, then
the sender queues 1 MiB messages one at a time and cuts them into 64 KiB packets (what
the adapter sets on loopback; ``--payload``) in writes of ``write_batch_bytes``; the bytes are handed to
the receiver in reads of ``--read`` bytes, interleaved with the writes as a socket would
deliver them, and the receiver's last three messages are kept alive (an application
holding what it received). Prints one JSON line: microseconds of process time per MB for
``data_to_send`` (send) and ``receive_data`` (receive), the messages received, the
minor page faults of the whole run (a reassembly that reallocates shows there), and
which per-packet path ran (``implementation``: ``MCONN_PURE=1`` gives the pure one).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import mconn
from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.connection import Connection
from mconn.core.handshake import make_hello

from hot_path import implementation  # bench/hot_path.py

CHANNEL = 0x10
MESSAGE = 1 << 20


def connection(node_id: str, channels: list) -> Connection:
    config = Config()
    hello = make_hello(node_id=node_id, channels=channels, max_packet_payload=config.max_packet_payload)
    return Connection(config=config, hello=hello, channels=channels, now=0.0)


def run(messages: int, read: int, payload: int = 65536) -> dict:
    channels = [ChannelDescriptor(CHANNEL, send_queue_capacity=64)]
    sender, receiver = connection("a" * 40, channels), connection("b" * 40, channels)
    receiver.receive_data(sender.data_to_send(0.0), 0.0)
    sender.receive_data(receiver.data_to_send(0.0), 0.0)
    if hasattr(sender, "set_packet_payload"):
        sender.set_packet_payload(payload)
    message = bytes(MESSAGE)
    clock = time.process_time
    send_s = receive_s = 0.0
    received = 0
    pending = b""
    kept: list = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(messages):
        sender.queue_message(CHANNEL, message)
        while True:
            start = clock()
            data = sender.data_to_send(1.0)
            send_s += clock() - start
            if not data:
                break
            pending += data
            while len(pending) >= read:
                chunk, pending = pending[:read], pending[read:]
                start = clock()
                events = receiver.receive_data(chunk, 1.0)
                receive_s += clock() - start
                received += len(events)
                kept = (kept + [e.message for e in events])[-3:]
    return {
        "send_us_per_MB": send_s / messages * 1e6,
        "receive_us_per_MB": receive_s / messages * 1e6,
        "messages_received": received,
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
        "mconn_file": mconn.__file__,
        "implementation": implementation(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300, help="1 MiB messages sent")
    parser.add_argument("--read", type=int, default=65536, help="bytes per read handed to the receiver")
    parser.add_argument(
        "--payload", type=int, default=65536, help="msg packet payload the sender cuts at (1024: the smallest allowed)"
    )
    args = parser.parse_args()
    print(json.dumps(run(args.messages, args.read, args.payload)))


if __name__ == "__main__":
    main()
