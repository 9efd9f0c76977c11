"""Two mconn nodes on 127.0.0.1 exchanging messages on three channels of different priorities.

Run with ``python examples/two_nodes.py`` (``make run`` is the fleet demo, examples/fleet.py).
Node "bob" listens, node "alice" dials it; alice then starts a 32 MiB bulk transfer on the
priority-1 channel and, while it is moving, sends chat lines (priority 10) and status ticks
(priority 5). The output shows the small messages arriving long before the bulk transfer
finishes.
"""

from __future__ import annotations

import sys
import time

from twisted.internet import defer, task

from mconn import Config, Switch
from reactors.demo import BULK, CHAT, STATUS, DemoReactor

BULK_SIZE = 32 << 20
CHAT_LINES = ["hello bob", "are you receiving the file?", "chat stays fast while it moves", "bye"]


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:7.3f}s] {text}", flush=True)


START = time.monotonic()


@defer.inlineCallbacks
def main(reactor):
    def on_message(name, peer, message):
        if name == "bulk":
            say(f"bob   <- {name:6} {len(message) / 2**20:.0f} MiB from {peer.node_id[:8]} (complete)")
        else:
            say(f"bob   <- {name:6} {message.decode()!r}")

    bob_reactor = DemoReactor("bob", on_message)
    alice_reactor = DemoReactor("alice", lambda name, peer, m: say(f"alice <- {name:6} {m.decode()!r}"))
    config = Config(stats_interval=0)
    bob = Switch([bob_reactor], config=config, clock=reactor)
    alice = Switch([alice_reactor], config=config, clock=reactor)
    bob.startService()
    alice.startService()
    port = yield bob.listen("tcp:0:interface=127.0.0.1")
    address = f"{bob.node_id}@127.0.0.1:{port.getHost().port}"
    say(f"bob   listening as {address}")
    peer = yield alice.dial(address)
    say(f"alice connected to bob ({peer.node_id[:8]}), channels: chat=prio 10, status=prio 5, bulk=prio 1")

    bulk_done = peer.send(BULK, b"\x00" * BULK_SIZE)
    say(f"alice -> bulk   {BULK_SIZE >> 20} MiB queued")
    for i, line in enumerate(CHAT_LINES):
        yield task.deferLater(reactor, 0.02, lambda: None)
        peer.try_send(STATUS, f"tick {i}".encode())
        yield peer.send(CHAT, line.encode())
        say(f"alice -> chat   {line!r}")
    yield bulk_done
    bob_peer = bob.peers[alice.node_id]
    yield bob_peer.send(CHAT, b"got it all, thanks")
    deadline = time.monotonic() + 30
    while len(bob_reactor.received[BULK]) < 1 and time.monotonic() < deadline:
        yield task.deferLater(reactor, 0.05, lambda: None)
    yield task.deferLater(reactor, 0.1, lambda: None)
    for ch, name in ((CHAT, "chat"), (STATUS, "status"), (BULK, "bulk")):
        stats = next(c for c in bob_peer.stats.channels if c.channel_id == ch)
        say(f"bob   {name:6} received {stats.messages_received} messages, {stats.bytes_received} bytes")
    yield alice.stopService()
    yield bob.stopService()
    ok = len(bob_reactor.received[BULK]) == 1 and len(bob_reactor.received[CHAT]) == len(CHAT_LINES)
    say("done: all messages crossed" if ok else "FAILED: messages missing")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.path.insert(0, ".")
    task.react(main)
