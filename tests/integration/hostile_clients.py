"""Hostile TCP clients for tests/integration/test_hostile.py, in their own process.

    python hostile_clients.py PORT TOTAL SEED [DRIPS]

Keeps CONCURRENCY connections to 127.0.0.1:PORT going, from 100 loopback source
addresses (127.0.0.2 to 127.0.0.101), until TOTAL have been made; each sends one of
KINDS (random bytes, a mutated valid stream, an oversized length, a truncated hello, a
ping flood, a valid hello and then silence, or nothing) and then waits for the node to
close it; it never closes first (a WATCHDOG aborts it, and says so). DRIPS more connect
from 127.0.0.250 and up and send a valid hello one byte per second. At the end one JSON
object goes to stdout:

    {"clients": [[kind, "host:port", gave_up], ...], "failed_connects": n, "seconds": t}

A separate process, so that the node under test has a core of its own on a 2-core machine
and its memory figures hold only its own objects.
"""

from __future__ import annotations

import json
import random
import sys
import time

from twisted.internet import defer, protocol, task

from mconn import ChannelDescriptor
from mconn.core import wire
from mconn.core.handshake import make_hello
from mconn.core.wire import PacketType

CONCURRENCY = 200
SOURCES = [f"127.0.0.{i}" for i in range(2, 102)]
#: A hostile client that the node has not closed by then gives up (the test fails).
WATCHDOG = 20.0
#: The channels of the nodes in test_hostile.py, announced in the hostile hellos too.
CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=4, recv_message_capacity=1 << 20),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=8, recv_message_capacity=4096),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=8, recv_message_capacity=4096),
]


def _reactor():
    from twisted.internet import reactor

    return reactor


# -- hostile clients -------------------------------------------------------------------------


def _hello_template() -> tuple[bytes, int]:
    """A valid hello packet, and where its 20 node id bytes are (they are swapped per
    connection: construct is too slow to encode 10,000 hellos within the time budget)."""
    body = wire.encode_hello(make_hello(node_id="00" * 20, channels=CHANNELS, max_packet_payload=1024))
    packet = wire.encode_extension(PacketType.HELLO, body)
    return packet, packet.index(bytes(20))


HELLO_TEMPLATE, NODE_ID_AT = _hello_template()
ACKS = [wire.encode_extension(PacketType.ACK, wire.encode_ack({0x21: n})) for n in range(3)]


def hello(rng: random.Random) -> bytes:
    """A valid hello of a fresh node id."""
    return HELLO_TEMPLATE[:NODE_ID_AT] + rng.randbytes(20) + HELLO_TEMPLATE[NODE_ID_AT + 20 :]


def uvarint(n: int) -> bytes:
    value = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([len(value)]) + value


def valid_stream(rng: random.Random) -> bytes:
    parts = [hello(rng)]
    for _ in range(rng.randrange(6)):
        kind = rng.randrange(4)
        if kind == 0:
            data = rng.randbytes(rng.randrange(200))
            parts.append(
                bytes([PacketType.MSG, rng.choice([0x20, 0x21, 0x30]), rng.random() < 0.7]) + uvarint(len(data)) + data
            )
        elif kind == 1:
            parts.append(bytes([rng.choice([PacketType.PING, PacketType.PONG])]))
        elif kind == 2:
            parts.append(rng.choice(ACKS))
        else:
            body = rng.randbytes(rng.randrange(30))
            parts.append(bytes([rng.randrange(0x80, 0x100)]) + uvarint(len(body)) + body)
    return b"".join(parts)


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(4)
        if kind == 0 and at < len(data):
            data[at] ^= rng.randrange(1, 256)
        elif kind == 1:
            data[at:at] = rng.randbytes(rng.randrange(1, 8))
        elif kind == 2:
            del data[at : at + rng.randrange(1, 8)]
        else:
            data[at:at] = data[max(0, at - 16) : at]
    return bytes(data)


def oversized(rng: random.Random) -> bytes:
    huge = uvarint(rng.choice([4097, 1 << 20, 1 << 40, (1 << 64) - 1]))
    return rng.choice(
        [
            bytes([PacketType.HELLO]) + huge,
            hello(rng) + bytes([PacketType.MSG, 0x21, 1]) + uvarint(rng.choice([1025, 1 << 30])),
            hello(rng) + bytes([rng.choice([0x05, 0x06, 0x80, 0xFF])]) + huge,
        ]
    )


#: (kind, weight, payload maker). A payload of None means: connect and send nothing.
KINDS = [
    ("random", 30, lambda rng: rng.randbytes(rng.randrange(1, 512))),
    ("mutated", 30, lambda rng: mutate(rng, valid_stream(rng))),
    ("oversized", 14, oversized),
    ("truncated hello", 3, lambda rng: (lambda h: h[: rng.randrange(1, len(h))])(hello(rng))),
    ("ping flood", 6, lambda rng: hello(rng) + bytes([PacketType.PING]) * rng.randrange(25, 400)),
    ("hello, then silence", 1, valid_stream),
    ("connect and stall", 2, lambda rng: None),
]


class Hostile(protocol.Protocol):
    def __init__(self, payload, drip: bool, done: defer.Deferred) -> None:
        self.payload = payload
        self.drip = drip
        self.done = done
        self.address = None
        self.received = 0
        self.gave_up = False
        self._calls = []

    def connectionMade(self):
        host = self.transport.getHost()
        self.address = f"{host.host}:{host.port}"
        if self.drip:
            loop = task.LoopingCall(self._drip)
            loop.clock = _reactor()
            loop.start(1.0)
            self._calls.append(loop)
        elif self.payload:
            self.transport.write(self.payload)
        self._calls.append(_reactor().callLater(WATCHDOG, self._give_up))

    def _drip(self):
        if self.payload:
            self.transport.write(self.payload[:1])
            self.payload = self.payload[1:]

    def _give_up(self):
        self.gave_up = True
        self.transport.abortConnection()

    def dataReceived(self, data):
        self.received += len(data)

    def connectionLost(self, reason):
        for call in self._calls:
            if getattr(call, "running", False):
                call.stop()
            elif hasattr(call, "active") and call.active():
                call.cancel()
        self._calls = []
        self.done.callback(self)


class HostileFactory(protocol.ClientFactory):
    def __init__(self, payload, drip, done):
        self.payload, self.drip, self.done = payload, drip, done

    def buildProtocol(self, addr):
        return Hostile(self.payload, self.drip, self.done)

    def clientConnectionFailed(self, connector, reason):
        self.done.callback(None)


def connect_hostile(port: int, source: str, payload, drip: bool = False) -> defer.Deferred:
    done = defer.Deferred()
    _reactor().connectTCP("127.0.0.1", port, HostileFactory(payload, drip, done), timeout=10, bindAddress=(source, 0))
    return done


class Flood:
    """Keeps CONCURRENCY hostile connections going until ``total`` have been made."""

    def __init__(self, port: int, seed: int) -> None:
        self.port = port
        self.rng = random.Random(seed)
        self.names = [k[0] for k in KINDS]
        self.weights = [k[1] for k in KINDS]
        self.makers = {k[0]: k[2] for k in KINDS}
        self.clients: list[tuple[str, str, bool]] = []  # (kind, address, gave_up)
        self.failed_connects = 0
        self.started = 0

    async def run(self, total: int) -> None:
        async def worker(n: int):
            while self.started < total:
                self.started += 1
                kind = self.rng.choices(self.names, self.weights)[0]
                payload = self.makers[kind](self.rng)
                client = await connect_hostile(self.port, SOURCES[self.started % len(SOURCES)], payload)
                if client is None:
                    self.failed_connects += 1
                    self.started -= 1  # try again: the count is of connections made
                else:
                    self.clients.append((kind, client.address, client.gave_up))

        await defer.gatherResults([defer.ensureDeferred(worker(n)) for n in range(CONCURRENCY)])


async def flood(port: int, total: int, seed: int, drips: int) -> dict:
    started = time.monotonic()
    slow = [connect_hostile(port, f"127.0.0.{250 + i}", hello(random.Random(i)), drip=True) for i in range(drips)]
    runner = Flood(port, seed)
    await runner.run(total)
    clients = runner.clients + [("slow drip", c.address, c.gave_up) for c in await defer.gatherResults(slow)]
    return {"clients": clients, "failed_connects": runner.failed_connects, "seconds": time.monotonic() - started}


def main(argv: list[str]) -> int:
    port, total, seed = int(argv[1]), int(argv[2]), int(argv[3])
    drips = int(argv[4]) if len(argv) > 4 else 0
    reactor = _reactor()
    outcome = {}

    def run():
        d = defer.ensureDeferred(flood(port, total, seed, drips))
        d.addCallback(outcome.update)
        d.addErrback(lambda failure: outcome.update(error=failure.getTraceback()))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(run)
    reactor.run()
    json.dump(outcome, sys.stdout)
    sys.stdout.flush()
    return 0 if "error" not in outcome else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
