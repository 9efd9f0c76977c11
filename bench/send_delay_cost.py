"""CPU per message of a channel's send path with and without send-queue delay sampling.

    PYTHONPATH=<tree> .venv/bin/python bench/send_delay_cost.py [--messages 200000] [--rounds 5]

One process, no sockets: a ``Channel`` of mconn/core/channel.py queues ``--messages``
messages of 100 bytes, 64 at a time, and a ``Scheduler`` cuts them into packets after
each 64: queued as one batch (``writable_queue().extend``, as ``try_send_many`` does:
one stamp decision per batch) or one by one (``enqueue``, as ``try_send``: one per
message). Three
variants, in turns within each round: no ``SendDelay`` (a node without a status
endpoint), a ``SendDelay`` with the default ``SEND_DELAY_EVERY`` (a node whose metrics
are started), one stamping at most one message in 16, and one stamping every message
it may (one in flight at a time: the worst case). Prints the median
nanoseconds per message of each, and the difference to the first.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mconn.core.channel import SEND_DELAY_EVERY, Channel, ChannelDescriptor, Scheduler, SendDelay

BATCH = 64
PAYLOAD = 1024 * 64
MESSAGE = b"m" * 100


def run(messages: int, delay: SendDelay | None, one_by_one: bool) -> float:
    """Seconds of CPU to queue and emit ``messages`` messages on one channel."""
    channel = Channel(ChannelDescriptor(0x20, send_queue_capacity=BATCH))
    channel.set_send_delay(delay)
    scheduler = Scheduler([channel], 0.0)
    batch = [MESSAGE] * BATCH
    enqueue = channel.enqueue
    start = time.process_time()
    for _ in range(messages // BATCH):
        if one_by_one:
            for message in batch:
                enqueue(message)
        else:
            channel.writable_queue().extend(batch)
        while channel.is_pending:
            scheduler.next_packets(0.0, PAYLOAD, 256 * 1024)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    variants = {
        "off": lambda: None,
        f"every {SEND_DELAY_EVERY}": lambda: SendDelay(time.monotonic),
        "every 16": lambda: SendDelay(time.monotonic, every=16),
        "every 1": lambda: SendDelay(time.monotonic, every=1),
    }
    for one_by_one in (False, True):
        results: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, make in variants.items():
                results[name].append(run(args.messages, make(), one_by_one) / args.messages * 1e9)
        base = statistics.median(results["off"])
        print("one by one (enqueue)" if one_by_one else "batches of 64 (extend)")
        for name, values in results.items():
            median = statistics.median(values)
            print(
                f"  {name:9} {median:7.1f} ns/message  ({median - base:+.1f})  rounds {[round(v, 1) for v in values]}"
            )


if __name__ == "__main__":
    main()
