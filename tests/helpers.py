"""Shared test helpers: packet builders, a recording reactor, a raw peer, log capture.

Packets are built with the construct declarations of mconn/core/wire.py (the reference
encoder), never with the hot-path encoder the code under test uses. The in-memory
transports come from ``mconn.testing``, which has its own (lossy) transport; only
tests/adapter/test_persistent.py still uses twisted.test.iosim, for one exact race.
"""

from __future__ import annotations

import dataclasses
import re

from twisted.internet import defer, task
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from mconn import ChannelDescriptor, Config, NodeKey, Reactor, Switch
from mconn.core.frame_buffer import FrameBuffer
from mconn.net.protocol import MConnectionFactory
from mconn.core.handshake import make_hello
from mconn.core.wire import (
    HelloTag,
    PacketType,
    SessionRequest,
    decode_close,
    encode_close,
    encode_extension,
    encode_hello,
    encode_packet,
    encode_session_request,
    encode_uvarint,
)

from helpers_core import PacketByPacket, hello_packet  # one hello builder for the core and adapter tests

PING = PacketType.PING
PONG = PacketType.PONG
MSG = PacketType.MSG
HELLO = PacketType.HELLO
CLOSE = PacketType.CLOSE


def new_node_id() -> str:
    return NodeKey.generate().node_id


def dialer_hello(request: SessionRequest | None = None, *, node_id: str | None = None, channels=None) -> bytes:
    """A dialer's whole hello packet, with ``request`` in its session field (default: a
    fresh session), as mconn's dialer sends it; ``channels`` (ChannelDescriptors)
    default to the one channel 0x20, ``node_id`` to a new one."""
    if request is None:
        request = SessionRequest(session_id=b"\xcd" * 16, resume=False)
    hello = make_hello(
        node_id=node_id or new_node_id(),
        channels=channels or [ChannelDescriptor(0x20)],
        max_packet_payload=1024,
        fields=((HelloTag.SESSION, encode_session_request(request)),),
    )
    return encode_extension(PacketType.HELLO, encode_hello(hello))


def buffered(transport) -> int:
    """Bytes written into Twisted's TCP transport that it has not sent yet."""
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


# -- packets ----------------------------------------------------------------------


def msg_packet(channel_id: int, data: bytes, *, eof: bool = True) -> bytes:
    return encode_packet(MSG, channel_id=channel_id, eof=eof, data=data)


def message_packets(channel_id: int, message: bytes, payload: int = 1024) -> bytes:
    """A whole message cut into msg packets of at most ``payload`` bytes."""
    pieces = [message[i : i + payload] for i in range(0, len(message), payload)] or [b""]
    return b"".join(msg_packet(channel_id, p, eof=i == len(pieces) - 1) for i, p in enumerate(pieces))


def close_packet(code: str, text: str = "") -> bytes:
    return encode_packet(CLOSE, body=encode_close(code, text))


def extension_packet(packet_type: int, body: bytes) -> bytes:
    return bytes([packet_type]) + encode_uvarint(len(body)) + body


def parse_packets(data: bytes) -> list[tuple]:
    """Split a byte stream into packets: ``(PING,)``, ``(MSG, ch, eof, bytes)``, ``(type, body)``.

    Close packets come back as ``(CLOSE, code, text)``.
    """
    buffer = PacketByPacket(FrameBuffer(max_payload=1 << 30, default_extension_limit=1 << 30))
    packets, error = buffer.feed(bytes(data))
    assert error is None, error
    assert buffer.buffered == 0, f"{buffer.buffered} bytes of an incomplete packet"
    out = []
    for packet in packets:
        if packet[0] == MSG:
            out.append((MSG, packet[1], packet[2], bytes(packet[3])))
        elif packet[0] == CLOSE:
            out.append((CLOSE, *decode_close(packet[1])))
        else:
            out.append(packet)
    return out


def messages_in(data: bytes) -> list[tuple[int, bytes]]:
    """The whole messages in a byte stream, as ``(channel_id, message)`` in wire order."""
    partial: dict[int, bytearray] = {}
    out = []
    for packet in parse_packets(data):
        if packet[0] == MSG:
            _, channel_id, eof, payload = packet
            partial.setdefault(channel_id, bytearray()).extend(payload)
            if eof:
                out.append((channel_id, bytes(partial.pop(channel_id))))
    return out


def close_packets_in(data: bytes) -> list[tuple[str, str]]:
    return [(p[1], p[2]) for p in parse_packets(data) if p[0] == CLOSE]


# -- reactors and peers -----------------------------------------------------------


class RecordingReactor(Reactor):
    """Owns ``channels`` and records every call, in order, in ``calls``.

    Entries: ``("add_peer", peer)``, ``("receive", channel_id, peer, message)``,
    ``("remove_peer", peer, reason)``.
    """

    def __init__(self, channels=()) -> None:
        self.channels = list(channels)
        self.calls: list[tuple] = []
        #: Called as ``on_receive(channel_id, peer, message)`` after a receive is recorded.
        self.on_receive = None

    def get_channels(self):
        return self.channels

    def add_peer(self, peer) -> None:
        self.calls.append(("add_peer", peer))

    def remove_peer(self, peer, reason) -> None:
        self.calls.append(("remove_peer", peer, reason))

    def receive(self, channel_id, peer, message) -> None:
        self.calls.append(("receive", channel_id, peer, message))
        if self.on_receive is not None:
            self.on_receive(channel_id, peer, message)

    def received(self, channel_id=None, peer=None) -> list[bytes]:
        return [
            c[3]
            for c in self.calls
            if c[0] == "receive" and channel_id in (None, c[1]) and (peer is None or c[2] is peer)
        ]

    def removed(self) -> list[tuple]:
        """``(peer, reason)`` of every remove_peer call."""
        return [(c[1], c[2]) for c in self.calls if c[0] == "remove_peer"]

    def methods_for(self, peer) -> list[str]:
        return [c[0] for c in self.calls if c[1] is peer or (c[0] == "receive" and c[2] is peer)]


class RawPeer(Protocol):
    """A scripted peer that speaks bytes: records what it receives and why it was dropped."""

    def __init__(self, greeting: bytes = b"") -> None:
        self.greeting = greeting
        self.data = bytearray()
        self.lost = None

    def connectionMade(self) -> None:
        if self.greeting:
            self.transport.write(self.greeting)

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason) -> None:
        self.lost = reason

    def send(self, data: bytes) -> None:
        self.transport.write(data)


# -- one connection over a StringTransport ----------------------------------------


class AutoPausingTransport(StringTransport):
    """A StringTransport that pauses its producer once ``limit`` bytes are buffered."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data) -> None:
        super().write(data)
        if self.producer is not None and len(self.value()) > self.limit and self.producerState != "paused":
            self.producerState = "paused"
            self.producer.pauseProducing()

    def drain(self) -> bytes:
        """Take the buffered bytes and resume the producer, as a socket that emptied."""
        data = self.value()
        self.clear()
        self.producerState = "producing"
        self.producer.resumeProducing()
        return data


@dataclasses.dataclass
class Harness:
    """One MConnectionProtocol over a StringTransport, driven by a Clock."""

    clock: Clock
    switch: Switch
    reactor: RecordingReactor
    proto: object
    transport: StringTransport
    peer_node_id: str
    #: What the protocol wrote in connectionMade (our hello).
    written_on_connect: bytes = b""

    @property
    def peer(self):
        return self.proto.peer

    def feed(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def take(self) -> bytes:
        """The bytes written since the last take."""
        data = self.transport.value()
        self.transport.clear()
        return data

    def lose(self) -> None:
        """The transport reports the connection gone (after loseConnection, say)."""
        self.proto.connectionLost(Failure(ConnectionDone("closed")))


CHANNELS = [
    ChannelDescriptor(0x20, priority=5, send_queue_capacity=1),
    ChannelDescriptor(0x21, priority=1, send_queue_capacity=2, recv_message_capacity=4096),
]


def open_switch_connection(
    *,
    channels=CHANNELS,
    peer_channels=None,
    config: Config | None = None,
    transport: StringTransport | None = None,
    handshake: bool = True,
    peer_max_packet_payload: int | None = None,
    is_outbound: bool = False,
) -> Harness:
    """A Switch with one connection over a StringTransport; the peer's hello is fed if ``handshake``.

    ``peer_channels`` (default: the same as ``channels``) is what the fake peer announces.
    The bytes written before this returns (our hello) are taken.
    """
    clock = Clock()
    config = config or Config()
    reactor = RecordingReactor(channels)
    switch = Switch([reactor], clock=clock, config=config)
    proto = MConnectionFactory(switch, is_outbound=is_outbound).buildProtocol(None)
    transport = transport if transport is not None else StringTransport()
    proto.makeConnection(transport)
    harness = Harness(clock, switch, reactor, proto, transport, new_node_id(), transport.value())
    if handshake:
        harness.feed(
            hello_packet(
                harness.peer_node_id,
                channels if peer_channels is None else peer_channels,
                max_packet_payload=peer_max_packet_payload or config.max_packet_payload,
            )
        )
        assert harness.peer is not None, "handshake was not accepted"
    harness.take()
    return harness


# -- telemetry ----------------------------------------------------------------------


class Telemetry:
    """The mconn telemetry events seen by an EventLoggingObserver on the global publisher."""

    def __init__(self) -> None:
        self.observer = EventLoggingObserver()

    def start(self) -> Telemetry:
        globalLogPublisher.addObserver(self.observer)
        return self

    def stop(self) -> None:
        globalLogPublisher.removeObserver(self.observer)

    @property
    def events(self) -> list[dict]:
        return [e for e in self.observer if e.get("log_namespace") == "mconn" and "event" in e]

    def named(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def names(self) -> list[str]:
        return [e["event"] for e in self.events]


# -- specs' field tables ---------------------------------------------------------------

#: A row of a field table in specs/*.md: | `name` | type | meaning |
SPEC_ROW = re.compile(r"^\| `([\w\[\].]+)` \| ([^|]+?) \|")

#: The types the specs' field tables use (specs/telemetry.md section 3, specs/status.md).
SPEC_TYPE_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "str or null": lambda v: v is None or isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "float or null": lambda v: v is None or isinstance(v, float),
    "list of int": lambda v: isinstance(v, list) and all(isinstance(i, int) for i in v),
    "list of str": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
    "list of float": lambda v: isinstance(v, list) and all(isinstance(i, float) for i in v),
    "list of object": lambda v: isinstance(v, list) and all(isinstance(i, dict) for i in v),
    "object": lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
    "object of int": lambda v: (
        isinstance(v, dict)
        and all(isinstance(k, str) and isinstance(i, int) and not isinstance(i, bool) for k, i in v.items())
    ),
}


# -- tests on the real reactor (loopback sockets, processes) ----------------------------


def the_reactor():
    """Twisted's global reactor, imported late (pytest-twisted installs it first)."""
    from twisted.internet import reactor

    return reactor


def sleep(seconds: float):
    """A Deferred that fires after ``seconds`` on the real reactor."""
    return task.deferLater(the_reactor(), seconds, lambda: None)


def bounded(d, seconds: float = 10.0):
    """``d`` (a Deferred or a coroutine), failing with TimeoutError after ``seconds``."""
    return defer.ensureDeferred(d).addTimeout(seconds, the_reactor())


async def until(condition, what: str = "the condition", seconds: float = 10.0, step: float = 0.02) -> None:
    """Poll ``condition`` every ``step`` on the real reactor, at most ``seconds``."""
    for _ in range(int(seconds / step)):
        if condition():
            return
        await sleep(step)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


async def listening_switches(reactors, node_infos=None, **kwargs) -> tuple[list, int]:
    """One started Switch per reactor on the real reactor (``node_infos[i]`` for the i-th if given, ``kwargs`` for
    all); the first listens on 127.0.0.1. Returns (the switches, the first one's port number)."""
    infos = node_infos if node_infos is not None else [None] * len(reactors)
    switches = [Switch([r], clock=the_reactor(), node_info=ni, **kwargs) for r, ni in zip(reactors, infos, strict=True)]
    for s in switches:
        s.startService()
    try:
        port = await switches[0].listen("tcp:0:interface=127.0.0.1")
    except BaseException:
        await stop_switches(*switches)
        raise
    return switches, port.getHost().port


async def stop_switches(*switches) -> None:
    """Stop every switch, bounded."""
    await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]))


# -- recorded dials ------------------------------------------------------------------


class _Refused:
    """A client endpoint that refuses at once: the recorded dial never leaves the process."""

    def connect(self, factory):
        return defer.fail(ConnectionRefusedError("refused by the test: dials are only recorded"))


def record_dials(switch, *, passthrough: bool):
    """Record every ``(host, port)`` ``switch`` dials; refuse them unless ``passthrough``."""
    dialed, real = [], switch._endpoint

    def endpoint(target):
        dialed.append((target.host, target.port))
        return real(target) if passthrough and target.host == "127.0.0.1" else _Refused()

    switch._endpoint = endpoint
    return dialed


class ThreadClock(Clock):
    """A Clock that also takes calls from other threads (``callFromThread``, as a writer
    thread reports, mconn.switch.session_store) and queues them until ``pump`` runs them
    in the test's thread: real threads, in an order the test sets."""

    def __init__(self) -> None:
        super().__init__()
        import queue

        self.from_threads: queue.SimpleQueue = queue.SimpleQueue()

    def callFromThread(self, f, *args, **kwargs) -> None:  # noqa: N802 (Twisted's name)
        self.from_threads.put((f, args, kwargs))

    def pump(self, count: int = 1) -> None:
        """Run the next ``count`` calls from other threads, waiting at most 10 s for each."""
        for _ in range(count):
            f, args, kwargs = self.from_threads.get(timeout=10)
            f(*args, **kwargs)
