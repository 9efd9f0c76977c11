"""The WebSocket upgrade as a fuzz target: a ws listener's connection fed any bytes, with checks.

Shared by the hypothesis test (tests/integration/test_websocket_fuzz_upgrade.py) and the
atheris harness (fuzz_upgrade.py). A real Switch's admission on a ``task.Clock`` and a
``WebSocketServerCarrier`` on a ``StringTransport`` (no sockets): the bytes go through
the head checks of mconn.net.websocket, autobahn's HTTP parser, and once upgraded, the
frame reader and the mconn protocol above.

Input: byte 0 chooses the world (bit 0: the peer is a trusted proxy; bit 1: it is an
IPv6 address; bit 2: ws_allowed_origins allows ``https://*.example``). Byte 1 seeds how
the rest is cut into chunks and how long the clock moves after each (0: in one chunk,
at once). The rest is what the peer sends. A seed is ``bytes([world, 0]) + request``
(``seeds``).

Checks, after every chunk: nothing escaped ``dataReceived`` or a timer; whatever the
listener wrote is an HTTP answer whose status is 101 or 4xx/5xx; the admission counts
agree with the live connections. At the end, once every timer has run out: the
listener has closed the connection (it never waits for ever), and once it is gone,
nothing is counted: no pending handshake, no address.
"""

from __future__ import annotations

import base64
import gc
import itertools
import random
import re

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from mconn.config import Config
from mconn.net.protocol import MConnectionFactory
from mconn.switch.switch import Switch
from mconn.net.websocket import WebSocketServerCarrierFactory

PATH = "/mconn"
CONFIG = Config(
    stats_interval=0,
    ws_handshake_timeout=5.0,
    handshake_timeout=4.0,
    close_linger=1.0,
    ws_trusted_proxies=frozenset({"127.0.0.1", "::1"}),
    max_connections_per_ip=1,
)
#: How long the clock moves after a chunk (biased to no wait; some pass every timer).
WAITS = (0.0, 0.0, 0.0, 0.01, 0.5, 3.0, 6.0)
#: More than every timeout together: the end of a run.
THE_END = 60.0
#: Runs between full garbage collections: without them a fuzz run grows by ~20 KB per input.
FULL_COLLECTION_EVERY = 256
_RUNS = itertools.count(1)
#: An HTTP answer's status line.
_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


def request(path: str = PATH, headers: bytes = b"") -> bytes:
    """A valid upgrade request, with ``headers`` (whole lines) added."""
    key = base64.b64encode(bytes(range(16)))
    return (
        b"GET " + path.encode() + b" HTTP/1.1\r\nHost: node.example:26656\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: mconn\r\n" + headers + b"\r\n"
    )


def seeds() -> list[bytes]:
    """The seed corpus: valid requests and the attacks this target guards, each world."""
    bodies = [
        request(),
        request(headers=b"X-Forwarded-For: 198.51.100.1, 203.0.113.7\r\n"),
        request(headers=b"X-Forwarded-For: 127.0.0.1\r\nX-Note: a\x85X-Forwarded-For: 203.0.113.66\r\n"),
        request(headers=b"X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-For: 203.0.113.8\r\n"),
        request(headers=b"Origin: https://ok.example\r\n"),
        request(headers=b"Origin: http://evil.example\r\n"),
        request(path="/other"),
        request() + bytes([0x82, 0x80 | 4]) + b"\0\0\0\0" + b"\x06\x01\x00\x00",
        b"",
        b"\x06\x00",
    ]
    return [bytes([world, 0]) + body for world in range(8) for body in bodies]


class _Transport(StringTransport):
    """A StringTransport as TCP's: no socket beneath (socket options are not set), and
    unregistering no producer does nothing (a FileDescriptor's does not raise)."""

    def getHandle(self):
        return None

    def unregisterProducer(self) -> None:
        self.producer = None


class _ClockTimers:
    """autobahn's timers (a factory's ``_batched_timer``: the upgrade and closing handshake
    timeouts) on the world's Clock: txaio puts them on the global reactor, which a fuzz run
    never runs."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def call_later(self, delay, func, *args, **kwargs):
        return _Call(self.clock.callLater(delay, func, *args, **kwargs))


class _Call:
    """A timer autobahn may cancel after it fired (as txaio's may be)."""

    def __init__(self, call) -> None:
        self.call = call

    def cancel(self) -> None:
        if self.call.active():
            self.call.cancel()


class World:
    """One listener connection of a Switch whose admission counts it from accept."""

    def __init__(self, choice: int) -> None:
        #: Failures logged (an exception in a Deferred's callback, a timer's, ...).
        self.failures: list = []
        config = CONFIG
        if choice & 4:
            config = config.replace(ws_allowed_origins=frozenset({"https://*.example"}))
        self.clock = Clock()
        self.switch = Switch([], clock=self.clock, config=config)
        factory = WebSocketServerCarrierFactory(
            MConnectionFactory(self.switch, is_outbound=False),
            path=PATH,
            secure=False,
            config=config,
            clock=self.clock,
        )
        factory._batched_timer = _ClockTimers(self.clock)
        trusted = bool(choice & 1)
        host = ("::1" if trusted else "2001:db8::5") if choice & 2 else ("127.0.0.1" if trusted else "198.51.100.5")
        peer = (IPv6Address if choice & 2 else IPv4Address)("TCP", host, 40000)
        self.transport = _Transport(peerAddress=peer)
        self.carrier = factory.buildProtocol(peer)
        self.carrier.makeConnection(self.transport)
        self.gone = False

    def receive(self, chunk: bytes, wait: float) -> None:
        if not self.transport.disconnecting:
            self.carrier.dataReceived(chunk)
        self.clock.advance(wait)
        self.check()

    def check(self) -> None:
        written = self.transport.value()
        if written:
            status = _STATUS.match(written)
            assert status is not None, f"the listener wrote {written[:80]!r}, not an HTTP answer"
            code = int(status.group(1))
            assert code == 101 or 400 <= code < 600, f"status {code}"
        self.switch._check_invariants()
        assert not self.failures, f"logged: {self.failures[0].getTraceback()}"

    def finish(self) -> None:
        """Every timer runs out; the listener must have closed the connection, and once it
        is gone nothing stays counted."""
        for _ in range(int(THE_END)):
            if self.transport.disconnecting:
                break
            self.clock.advance(1.0)
        assert self.transport.disconnecting, "the listener left the connection open after every timeout"
        self.carrier.connectionLost(Failure(ConnectionDone()))
        self.clock.advance(THE_END)  # whatever the loss armed
        admission = self.switch._admission
        assert admission.pending == 0 and admission.per_ip == {}, (admission.pending, admission.per_ip)
        assert not self.switch.connections
        self.switch._check_invariants()

    def observe(self, event) -> None:
        if event.get("log_failure") is not None:
            self.failures.append(event["log_failure"])


def schedule_from_bytes(data: bytes) -> tuple[int, list]:
    """``(world, [(chunk, wait)])`` from fuzzer bytes (module docstring)."""
    if len(data) < 2:
        return 0, [(data, 0.0)]
    stream = data[2:]
    if data[1] == 0:
        return data[0], [(stream, 0.0)]
    rng = random.Random(data[1])
    schedule, at = [], 0
    while at < len(stream):
        size = rng.choice((1, 2, 7, 64, 1000, len(stream)))
        schedule.append((stream[at : at + size], rng.choice(WAITS)))
        at += size
    return data[0], schedule


def run(world_choice: int, schedule) -> World:
    """Feed ``schedule`` to a new world with every check; returns it, finished. A failure
    logged meanwhile (a Deferred's unhandled error is logged once it is collected) fails."""
    world = World(world_choice)
    globalLogPublisher.addObserver(world.observe)
    try:
        world.check()
        for chunk, wait in schedule:
            world.receive(chunk, wait)
        world.finish()
        gc.collect(1)  # what this run made (a full collection costs ~30 ms per input)
        if next(_RUNS) % FULL_COLLECTION_EVERY == 0:
            gc.collect()  # a world is a web of cycles, and the automatic full collection lags far behind
        world.check()
    finally:
        globalLogPublisher.removeObserver(world.observe)
    return world


def fuzz_one(data: bytes) -> None:
    """The atheris target: any input must pass every check."""
    run(*schedule_from_bytes(data))
