"""The inbound path as a fuzz target: a Connection fed a schedule of chunks, with checks.

Shared by the hypothesis tests (tests/core/test_fuzz_inbound.py,
tests/adapter/test_fuzz_switch.py) and the atheris harness (fuzz_inbound.py). Imports
only mconn's sans-I/O core: no Twisted, no hypothesis.

A *schedule* is a list of ``(chunk, wait, reads)``: ``wait`` seconds pass, the timers
that are due run, ``chunk`` is received, and if ``reads`` the peer takes what we send
(otherwise it piles up, as behind a peer that does not read). ``run`` raises
AssertionError when a check fails; any other exception is a bug as well.
"""

from __future__ import annotations

import random

from mconn import errors
from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.config import MIN_PACKET_PAYLOAD, Config
from mconn.core.connection import CHANNEL_COUNTS_LIMIT, Connection, State
from mconn.core.events import ConnectionFailed, MessageReceived
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.handshake import make_hello
from mconn.core.wire import HelloTag, PacketType, SessionRequest

CHANNELS = [
    ChannelDescriptor(0x20, priority=3, recv_message_capacity=300),
    ChannelDescriptor(0x21, recv_message_capacity=1000),
]
#: Small limits, so that short inputs reach every one of them (the packet payload at its
#: floor: a declared length over it is refused from the header alone).
CONFIG = Config(
    max_packet_payload=MIN_PACKET_PAYLOAD,
    max_hello_size=512,
    max_control_size=128,
    max_pings_per_interval=8,
    max_control_backlog=8,
    ping_interval=5.0,
    pong_timeout=3.0,
    handshake_timeout=4.0,
)
SESSION_ID = bytes(range(16))
OUR_ID = "aa" * 20
PEER_ID = "bb" * 20
#: Type byte, channel, eof, size byte and 8 length bytes: the longest header kept.
MAX_HEADER = 12
#: The most the frame buffer may hold: one header and the largest body limit.
MAX_BUFFERED = MAX_HEADER + max(
    CONFIG.max_packet_payload, CONFIG.max_hello_size, CONFIG.max_control_size + CHANNEL_COUNTS_LIMIT
)
#: Every reason a connection may fail for: specific RemoteProtocolError subclasses.
SPECIFIC = frozenset(
    {
        errors.MalformedPacket,
        errors.UnknownPacketType,
        errors.PacketTooLarge,
        errors.UnexpectedPacket,
        errors.UnknownChannel,
        errors.MessageTooLarge,
        errors.HandshakeTimeout,
        errors.IncompatiblePeer,
        errors.PacketPayloadTooSmall,
        errors.RecvRateTooSmall,
        errors.PongTimeout,
        errors.ControlFlood,
    }
)
#: How long a schedule step may wait (biased to no wait; some pass every timer).
WAITS = (0.0, 0.0, 0.0, 0.01, 0.5, 2.0, 6.0)


def new_connection(dialer: bool, config: Config = CONFIG) -> Connection:
    """Our side: a listener, or a dialer whose hello asks for a session."""
    fields = ()
    if dialer:
        request = SessionRequest(session_id=SESSION_ID, resume=False)
        fields = ((HelloTag.SESSION, wire.encode_session_request(request)),)
    hello = make_hello(node_id=OUR_ID, channels=CHANNELS, max_packet_payload=config.max_packet_payload, fields=fields)
    return Connection(config=config, hello=hello, channels=CHANNELS, now=0.0)


def extension(packet_type: int, body: bytes) -> bytes:
    return wire.encode_extension(packet_type, body)


def peer_hello(
    payload: int = MIN_PACKET_PAYLOAD, version: int = wire.PROTOCOL_VERSION, node_id: str = PEER_ID
) -> bytes:
    """A whole hello packet of the peer."""
    hello = make_hello(node_id=node_id, channels=CHANNELS, max_packet_payload=payload)
    if version != hello.version:
        hello = wire.Hello(**{**{k: getattr(hello, k) for k in hello.__dataclass_fields__}, "version": version})
    return extension(PacketType.HELLO, wire.encode_hello(hello))


# -- checks ---------------------------------------------------------------------------------


def close_code(data: bytes) -> str | None:
    """The code of the one close packet ``data`` holds (None if it is empty)."""
    if not data:
        return None
    packets, error = FrameBuffer(max_payload=1 << 20, default_extension_limit=1 << 20).feed(
        data, stop_after_extension=False
    )
    assert error is None, error
    [(kind, body)] = [(p[0], p[1]) for p in packets]
    assert kind == PacketType.CLOSE, f"after a failure we send {kind:#04x}"
    return wire.decode_close(bytes(body))[0]


def check_failure(conn: Connection, events: list) -> None:
    """A failure is the last event, names a specific error, and leaves one close packet."""
    failures = [e for e in events if type(e) is ConnectionFailed]
    if not failures:
        return
    assert len(failures) == 1 and events[-1] is failures[0], events
    error = failures[0].error
    assert type(error) in SPECIFIC, f"{type(error).__name__}: {error}"
    assert conn.state is State.CLOSED and conn.error is error
    code = close_code(conn.data_to_send(1e9))
    # A pong timeout drops the transport without a close (specs/connection.md section 3).
    assert code == (None if type(error) is errors.PongTimeout else type(error).__name__)


def check_bounds(conn: Connection, config: Config = CONFIG) -> None:
    """What the peer can make us hold stays within the configured limits."""
    assert conn._buffer.buffered <= MAX_BUFFERED, conn._buffer.buffered
    for channel in conn.channels.values():
        assert channel.receiving_size <= channel.recv_capacity
    # Pongs up to max_control_backlog, and at most one ping of ours (specs/connection.md 6).
    assert len(conn._control) <= config.max_control_backlog + 1, len(conn._control)


def check_events(events: list) -> None:
    for event in events:
        if type(event) is MessageReceived:
            assert len(event.message) <= {0x20: 300, 0x21: 1000}[event.channel_id]


def run(conn: Connection, schedule) -> list:
    """Feed ``schedule`` to ``conn`` with every check; returns the events."""
    now = 0.0
    everything: list = []
    for chunk, wait, reads in schedule:
        deadline = conn.next_deadline()
        now += wait
        if deadline is not None and now >= deadline:
            events = conn.handle_timeout(now)
            check_failure(conn, events)
            everything += events
            after = conn.next_deadline()
            assert after is None or after > now, "timers never spin"
        if conn.state is State.CLOSED:
            assert conn.receive_data(chunk, now) == []
            continue
        events = conn.receive_data(chunk, now)
        check_events(events)
        check_failure(conn, events)
        check_bounds(conn)
        everything += events
        if reads and conn.state is not State.CLOSED:
            conn.data_to_send(now)
    return everything


# -- inputs from plain bytes (atheris, the seed corpus) -----------------------------------


def schedule_from_bytes(data: bytes) -> tuple[bool, list]:
    """``(dialer, schedule)`` from fuzzer bytes: byte 0 chooses our side, byte 1 seeds how
    the rest is cut and timed. A seed is ``bytes([0, 0]) + stream``."""
    if len(data) < 2:
        return False, [(data, 0.0, True)]
    dialer = bool(data[0] & 1)
    rng = random.Random(data[1])
    stream = data[2:]
    schedule = []
    at = 0
    while at < len(stream):
        size = rng.choice((1, 2, 7, 64, 1000, len(stream)))
        schedule.append((stream[at : at + size], rng.choice(WAITS), rng.random() < 0.8))
        at += size
    return dialer, schedule


def fuzz_one(data: bytes) -> None:
    """The atheris target: any input must pass every check."""
    dialer, schedule = schedule_from_bytes(data)
    conn = new_connection(dialer)
    conn.data_to_send(0.0)
    run(conn, schedule)
