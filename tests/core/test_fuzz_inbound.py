"""Fuzzing the whole inbound path of the sans-I/O Connection with hypothesis.

Frame buffer, packet decoders, handshake, keepalive and session packets get arbitrary
bytes, and valid streams mutated (bytes flipped, inserted, deleted, cut, repeated), in
arbitrary chunks at arbitrary times, with or without the peer reading what we send
(strategies: tests/fuzz/strategies.py). For every input (checks: tests/fuzz/target.py):

* nothing escapes ``receive_data`` or ``handle_timeout``: a violation ends the event list
  with ``ConnectionFailed`` carrying a specific RemoteProtocolError subclass (never the
  bare base class), and the only bytes left to send are one close packet naming it;
* what the peer can make us hold stays within the configured limits: the frame buffer
  (one packet header plus the largest body limit), each reassembly buffer
  (recv_message_capacity), the control queue (max_control_backlog);
* timers never spin, and a closed connection ignores everything after.

A second property feeds each stream whole and one byte at a time: same events, same
error class. tests/fuzz/fuzz_inbound.py runs the same target under atheris for long
runs. The example counts keep this file under 15 s on a loaded CI machine.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mconn import errors
from mconn.core.connection import State
from mconn.core import wire
from mconn.core.events import CloseReceived, ConnectionFailed, HelloReceived
from mconn.core.wire import PacketType

from tests.fuzz.strategies import schedules, streams
from tests.fuzz.target import CONFIG, fuzz_one, new_connection, peer_hello, run, schedule_from_bytes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules(), dialer=st.booleans())
def test_any_inbound_bytes_end_in_events_or_a_specific_failure(schedule, dialer):
    """Any inbound schedule, dialer or listener, ends in events or a specific failure within the limits."""
    conn = new_connection(dialer)
    conn.data_to_send(0.0)  # our hello
    run(conn, schedule)
    event(type(conn.error).__name__ if conn.error is not None else conn.state.value)  # --hypothesis-show-statistics


def summary(events: list) -> list:
    out = []
    for e in events:
        if type(e) is ConnectionFailed:
            out.append(("failed", type(e.error)))
        elif type(e) is HelloReceived:
            out.append(("hello", e.hello.node_id, e.max_packet_payload))
        else:
            out.append(e)
    return out


@settings(max_examples=200, deadline=None)
@given(data=streams, dialer=st.booleans())
def test_whole_and_bytewise_streams_give_the_same_events(data, dialer):
    """The decoder fails at the same byte however the stream is cut (frame_buffer.py)."""
    whole = new_connection(dialer)
    bytewise = new_connection(dialer)
    events_whole = whole.receive_data(data, 1.0)
    events_bytewise = [e for i in range(len(data)) for e in bytewise.receive_data(data[i : i + 1], 1.0)]
    assert summary(events_whole) == summary(events_bytewise)
    assert whole.state is bytewise.state
    if whole.state is not State.CLOSED:  # after a failure the rest is never read
        assert whole._buffer.buffered == bytewise._buffer.buffered


@settings(max_examples=50, deadline=None)
@given(extra=st.integers(1, 50), chunk=st.integers(1, 8))
def test_a_ping_flood_is_a_control_flood(extra, chunk):
    """Valid pings past max_pings_per_interval in one window: ControlFlood, however cut."""
    conn = new_connection(False)
    data = peer_hello() + bytes([PacketType.PING]) * (CONFIG.max_pings_per_interval + extra)
    events = [e for i in range(0, len(data), chunk) for e in conn.receive_data(data[i : i + chunk], 1.0)]
    assert type(events[-1]) is ConnectionFailed and type(events[-1].error) is errors.ControlFlood


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400))
def test_the_atheris_target_accepts_any_bytes(data):
    """tests/fuzz/fuzz_inbound.py's target, so that the harness cannot rot unnoticed."""
    fuzz_one(data)
    assert schedule_from_bytes(bytes([1, 7]) + data)[0] is True


def test_a_full_pong_queue_and_our_own_ping_stay_within_the_bound():
    """Found by the fuzzer: a peer that pings up to max_control_backlog and never reads,
    then falls silent for ping_interval, has our own ping queued beside its pongs: the
    bound is the pongs plus that one ping (tests/core/test_connection.py shows that no
    second ping is ever queued beside it)."""
    conn = new_connection(False)
    conn.data_to_send(0.0)
    pings = bytes([PacketType.PING]) * CONFIG.max_control_backlog
    run(conn, [(peer_hello() + pings, 0.0, False), (b"", CONFIG.ping_interval + 1, False)])
    assert conn.state is State.OPEN and len(conn._control) == CONFIG.max_control_backlog + 1


def test_a_failed_connection_keeps_none_of_the_read_after_a_hello():
    """Found by the fuzzer: a read with the peer's hello, a second hello and then more
    bytes. Decoding pauses after each hello (limits may change), keeping the rest of the
    read; the second hello fails the connection, and what was kept goes with it, since a
    closed connection reads nothing more (without that, 3,000 bytes stayed held, past the
    frame buffer's bound of one header and the largest body)."""
    conn = new_connection(False)
    conn.data_to_send(0.0)
    events = conn.receive_data(peer_hello() + peer_hello() + bytes(3000), 0.0)
    assert type(events[-1]) is ConnectionFailed
    assert type(events[-1].error) is errors.UnexpectedPacket and "hello" in str(events[-1].error)
    assert conn.state is State.CLOSED
    assert conn._buffer.buffered == 0
    assert conn.receive_data(b"\x01" * 10, 1.0) == []


def test_a_close_received_keeps_none_of_the_read_after_it():
    """Found by the fuzzer too: the peer's hello, its close and 3,000 more bytes in one
    read. The close ends the connection and everything after it is ignored, including
    what decoding kept of the read when it paused after the close packet."""
    conn = new_connection(False)
    conn.data_to_send(0.0)
    close = wire.encode_extension(PacketType.CLOSE, wire.encode_close("shutdown", "bye"))
    events = conn.receive_data(peer_hello() + close + bytes(3000), 0.0)
    assert type(events[-1]) is CloseReceived and events[-1].code == "shutdown"
    assert conn.state is State.CLOSED
    assert conn._buffer.buffered == 0
