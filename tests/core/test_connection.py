"""Connection, the sans-I/O MConnection: handshake, bad input, keepalive, close, rates.

Everything is driven by hand: bytes in with ``receive_data``, bytes out with
``data_to_send``, time passed as ``now`` (specs/connection.md).
"""

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.connection import TRANSITIONS, Input, State
from mconn.core.handshake import hello_packet as core_hello_packet
from mconn.errors import (
    HandshakeTimeout,
    IncompatiblePeer,
    LocalProtocolError,
    MalformedPacket,
    MessageTooLarge,
    PacketTooLarge,
    PongTimeout,
    UnexpectedPacket,
    UnknownChannel,
    UnknownPacketType,
)
from mconn.core.events import CloseReceived, ConnectionFailed, HelloReceived, MessageReceived, PongReceived
from mconn.core.wire import PacketType
from tests.helpers_core import (
    CH,
    NODE_A,
    NODE_B,
    SPECS,
    CorePair,
    decode_stream,
    hello_packet,
    make_connection,
    msg,
    msg_payloads,
    open_connection,
    split_packets,
)

PING = b"\x01"
PONG = b"\x02"


def _failure(events) -> Exception:
    assert isinstance(events[-1], ConnectionFailed), events
    return events[-1].error


# -- the state table is the spec's table ---------------------------------------------------


def _spec_table() -> dict:
    text = (SPECS / "connection.md").read_text()
    block = text.split("<!-- transitions:begin -->")[1].split("<!-- transitions:end -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    assert rows[0] == ["State", "Input", "Next state"]
    table = {}
    for state, event, new in rows[2:]:
        key = (State[state], Input[event])
        assert key not in table, f"row {key} twice in specs/connection.md"
        table[key] = State[new]
    return table


def test_spec_table_equals_transitions():
    """The transition table in specs/connection.md is exactly TRANSITIONS."""
    assert _spec_table() == TRANSITIONS


def test_spec_diagram_has_exactly_the_transitions():
    """The spec's state diagram has one edge per transition, no more and no fewer."""
    text = (SPECS / "connection.md").read_text()
    diagram = text.split("```mermaid")[1].split("```")[0]
    edges = set()
    for source, target, labels in re.findall(r"^\s*(\w+) --> (\w+) : (.+)$", diagram, re.M):
        for label in labels.split(","):
            edges.add((State[source], Input[label.strip()], State[target]))
    assert edges == {(s, i, n) for (s, i), n in TRANSITIONS.items()}


# -- handshake -------------------------------------------------------------------------------


def test_hello_is_the_first_thing_sent_without_waiting():
    """A new connection sends its hello (version, node id, channels, payload) at once, and only that."""
    conn = make_connection(channels=[ChannelDescriptor(0x20, priority=3), ChannelDescriptor(0x21)])
    assert conn.state is State.HANDSHAKING
    kind, body = wire.decode_packet(conn.data_to_send(0.0))
    assert kind == PacketType.HELLO
    hello = wire.decode_hello(body)
    assert hello == conn.hello
    assert (hello.version, hello.node_id, hello.max_packet_payload) == (1, NODE_A, 65536)  # Config's default
    assert [(c.id, c.priority) for c in hello.channels] == [(0x20, 3), (0x21, 1)]
    assert conn.data_to_send(0.0) == b""


def test_core_pair_handshake_opens_both_sides():
    """Two cores exchanging hellos both report HelloReceived and are OPEN."""
    pair = CorePair.make()
    events_a, events_b = pair.pump(0.0)
    assert events_a == [HelloReceived(hello=pair.b.hello, max_packet_payload=65536)]
    assert events_b == [HelloReceived(hello=pair.a.hello, max_packet_payload=65536)]
    assert pair.a.state is pair.b.state is State.OPEN
    assert pair.a.peer_hello.node_id == NODE_B and pair.b.peer_hello.node_id == NODE_A


def test_negotiated_payload_is_the_smaller_of_the_two():
    """Both sides use the smaller max_packet_payload, and messages are cut at it."""
    pair = CorePair.make(config_a=Config(max_packet_payload=2048), config_b=Config(max_packet_payload=1024))
    events_a, events_b = pair.pump(0.0)
    assert events_a[0].max_packet_payload == events_b[0].max_packet_payload == 1024
    assert pair.a.max_packet_payload == pair.b.max_packet_payload == 1024

    message = bytes(range(256)) * 12  # 3072 bytes
    assert pair.a.queue_message(CH, message)
    _, events_b = pair.pump(1.0)
    assert events_b == [MessageReceived(channel_id=CH, message=message)]
    assert [len(d) for _, _, d in msg_payloads(b"".join(pair.sent_by_a[1:]))] == [1024, 1024, 1024]


def test_larger_packets_than_negotiated_are_refused():
    """A packet over the negotiated payload is PacketTooLarge naming its size and the limit."""
    conn = open_connection(peer_payload=1024)
    error = _failure(conn.receive_data(msg(CH, b"x" * 1025), 1.0))
    assert type(error) is PacketTooLarge
    assert "1025" in str(error) and "1024" in str(error)


def test_packet_right_after_the_hello_is_judged_by_the_negotiated_payload():
    """A packet in the same chunk as the hello is already held to the payload just negotiated."""
    conn = make_connection()
    events = conn.receive_data(hello_packet(max_packet_payload=1024) + msg(CH, b"y" * 1025), 0.0)
    assert [type(e) for e in events] == [HelloReceived, ConnectionFailed]
    assert type(events[1].error) is PacketTooLarge


def test_hello_and_messages_in_one_chunk():
    """A hello, messages and a ping in one chunk are all handled: messages delivered, ping answered."""
    conn = make_connection()
    events = conn.receive_data(hello_packet() + msg(CH, b"one") + PING + msg(CH, b"two"), 0.0)
    assert [type(e) for e in events] == [HelloReceived, MessageReceived, MessageReceived]
    assert [e.message for e in events[1:]] == [b"one", b"two"]
    assert conn.data_to_send(0.0).endswith(PONG)


def test_hello_byte_by_byte():
    """A hello and a message fed one byte at a time give the same events as whole."""
    conn = make_connection()
    data = hello_packet() + msg(CH, b"slow")
    events = []
    for i in range(len(data)):
        events += conn.receive_data(data[i : i + 1], 0.0)
    assert [type(e) for e in events] == [HelloReceived, MessageReceived]


def test_incompatible_version_fails_naming_both_versions():
    """A hello of another version is IncompatiblePeer naming both versions and closes the connection."""
    conn = make_connection()
    error = _failure(conn.receive_data(hello_packet(version=2), 0.0))
    assert type(error) is IncompatiblePeer
    assert "version 2" in str(error) and "1" in str(error)
    assert conn.state is State.CLOSED


def test_no_message_may_be_queued_before_the_handshake():
    """queue_message while handshaking is a LocalProtocolError."""
    conn = make_connection()
    with pytest.raises(LocalProtocolError, match="0x20.*handshaking"):
        conn.queue_message(CH, b"too early")


def test_queueing_on_an_unknown_channel_is_a_local_error():
    """queue_message on a channel we did not declare is a LocalProtocolError naming it."""
    conn = open_connection()
    with pytest.raises(LocalProtocolError, match="0x55"):
        conn.queue_message(0x55, b"x")


# -- bad input -------------------------------------------------------------------------------


def _malformed_hello() -> bytes:
    body = bytes.fromhex("01 01") + bytes.fromhex(NODE_B) + bytes.fromhex("02 04 00 01 01 20 00 00 00")  # priority 0
    return wire.encode_extension(PacketType.HELLO, body)


BAD_INPUTS = [
    # (name, open first?, bytes, error class, words the message must name)
    ("unknown packet type 00", True, b"\x00", UnknownPacketType, ["0x00"]),
    ("unknown critical extension 7f", True, bytes.fromhex("7f 00"), UnknownPacketType, ["0x7f"]),
    ("msg before hello", False, msg(CH, b"hi"), UnexpectedPacket, ["0x20", "before the hello"]),
    ("ping before hello", False, PING, UnexpectedPacket, ["ping", "handshaking"]),
    ("pong before hello", False, PONG, UnexpectedPacket, ["pong", "handshaking"]),
    ("second hello", True, hello_packet(), UnexpectedPacket, ["hello", "open"]),
    ("unknown channel", True, msg(0x99, b"hi"), UnknownChannel, ["0x99", "0x20"]),
    ("eof 02", True, bytes.fromhex("03 20 02 00"), MalformedPacket, ["eof", "0x02"]),
    ("size byte 09", True, bytes.fromhex("03 20 01 09"), MalformedPacket, ["0x09"]),
    ("length over max_packet_payload", True, bytes.fromhex("03 20 01 02 04 01"), PacketTooLarge, ["1025", "1024"]),
    ("malformed hello", False, _malformed_hello(), MalformedPacket, ["hello"]),
    ("hello too large", False, bytes.fromhex("04 02 10 01"), PacketTooLarge, ["4097", "4096"]),
    ("close body too large", True, bytes.fromhex("05 02 04 01"), PacketTooLarge, ["1025", "1024"]),
    ("malformed close", True, bytes.fromhex("05 01 02 01 05"), MalformedPacket, ["close"]),
]


@pytest.mark.parametrize("name, opened, data, error_class, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_fails_with_a_specific_error(name, opened, data, error_class, words):
    """Each kind of bad input fails the connection with its own error class and a message naming the values."""
    conn = open_connection() if opened else make_connection()
    events = conn.receive_data(data, 1.0)
    assert [type(e) for e in events] == [ConnectionFailed]
    error = events[0].error
    assert type(error) is error_class
    for word in words:
        assert word in str(error), (word, str(error))
    assert conn.state is State.CLOSED and conn.error is error


def test_reassembled_message_over_recv_message_capacity():
    """A message whose packets together exceed recv_message_capacity is MessageTooLarge."""
    conn = open_connection(channels=[ChannelDescriptor(CH, recv_message_capacity=100)])
    assert conn.receive_data(msg(CH, b"a" * 60, eof=False), 1.0) == []
    error = _failure(conn.receive_data(msg(CH, b"b" * 60), 1.0))
    assert type(error) is MessageTooLarge
    assert "0x20" in str(error) and "120" in str(error) and "100" in str(error)


def test_malformed_hello_message_names_what_is_wrong():
    """An error message says what was wrong and with which values."""
    conn = make_connection()
    error = _failure(conn.receive_data(_malformed_hello(), 0.0))
    assert "priority" in str(error) and "0" in str(error), str(error)


def test_messages_before_the_bad_bytes_are_still_delivered():
    """Messages read before bad bytes in the same chunk are delivered; nothing after them is."""
    conn = open_connection()
    events = conn.receive_data(msg(CH, b"first") + PING + msg(CH, b"second") + b"\x00" + msg(CH, b"never"), 1.0)
    assert events[:-1] == [
        MessageReceived(channel_id=CH, message=b"first"),
        MessageReceived(channel_id=CH, message=b"second"),
    ]
    assert type(_failure(events)) is UnknownPacketType


def test_after_a_failure_only_a_close_naming_the_error_goes_out():
    """After a failure only a close naming the error is sent; queued data, input and timers are dropped."""
    conn = open_connection()
    conn.queue_message(CH, b"queued")
    error = _failure(conn.receive_data(msg(0x99, b""), 1.0))
    assert decode_stream(conn.data_to_send(1.0)) == [
        (PacketType.CLOSE, wire.encode_close("UnknownChannel", str(error)))
    ]
    assert conn.data_to_send(2.0) == b""
    assert conn.receive_data(msg(CH, b"late"), 2.0) == []
    assert conn.next_deadline() is None
    assert conn.handle_timeout(1000.0) == []
    with pytest.raises(LocalProtocolError, match="closed"):
        conn.queue_message(CH, b"x")


def test_unknown_optional_extension_is_stepped_over():
    """An unknown extension >= 0x80 is skipped, whether open or handshaking."""
    conn = open_connection()
    events = conn.receive_data(bytes.fromhex("80 01 03 010203 ff 00") + msg(CH, b"after"), 1.0)
    assert events == [MessageReceived(channel_id=CH, message=b"after")]
    handshaking = make_connection()
    assert handshaking.receive_data(bytes.fromhex("80 00"), 0.0) == []
    assert handshaking.state is State.HANDSHAKING


# -- handshake timeout -----------------------------------------------------------------------


def test_handshake_timeout():
    """No hello within handshake_timeout is HandshakeTimeout at exactly that deadline."""
    conn = make_connection(config=Config(handshake_timeout=10.0), now=100.0)
    assert conn.next_deadline() == 110.0
    assert conn.handle_timeout(109.9) == []
    error = _failure(conn.handle_timeout(110.0))
    assert type(error) is HandshakeTimeout
    assert "10" in str(error)
    assert conn.state is State.CLOSED and conn.next_deadline() is None


def test_hello_in_time_stops_the_handshake_timer():
    """A hello before handshake_timeout opens the connection; the next deadline is the ping."""
    conn = make_connection(config=Config(handshake_timeout=10.0), now=100.0)
    conn.receive_data(hello_packet(), 109.0)
    assert conn.handle_timeout(110.0) == []
    assert conn.state is State.OPEN
    assert conn.next_deadline() == 109.0 + 60.0


# -- keepalive -------------------------------------------------------------------------------


def test_ping_after_ping_interval_of_silence():
    """After ping_interval without input exactly one ping is sent, and pong_timeout starts."""
    conn = open_connection()
    assert conn.next_deadline() == 60.0
    assert conn.handle_timeout(59.9) == []
    assert conn.data_to_send(59.9) == b""
    assert conn.handle_timeout(60.0) == []
    assert conn.data_to_send(60.0) == PING
    assert conn.next_deadline() == 60.0 + 45.0


def test_silence_after_the_ping_is_a_pong_timeout():
    """Nothing received for pong_timeout after our ping is PongTimeout."""
    conn = open_connection()
    conn.handle_timeout(60.0)
    conn.data_to_send(60.0)
    assert conn.handle_timeout(104.9) == []
    error = _failure(conn.handle_timeout(105.0))
    assert type(error) is PongTimeout
    assert "45" in str(error)


def test_any_received_byte_proves_liveness():
    """Even the first byte of a packet cancels the pong timeout and restarts ping_interval."""
    conn = open_connection()
    conn.handle_timeout(60.0)
    assert conn.receive_data(b"\x03", 100.0) == []  # the first byte of some msg packet
    assert conn.handle_timeout(105.0) == []
    assert conn.state is State.OPEN
    assert conn.next_deadline() == 160.0


@settings(max_examples=300, deadline=None)
@given(
    opened=st.booleans(),
    steps=st.lists(
        st.tuples(st.sampled_from(["timer", "pong", "hello", "msg"]), st.floats(0.0, 70.0)),
        max_size=12,
    ),
)
def test_overdue_says_whether_handle_timeout_fails(opened, steps):
    """``overdue(now)`` (the adapter's test for a verdict after a stall of its loop) is
    True exactly when ``handle_timeout(now)`` fails the connection: a handshake or a pong
    overdue, never a ping due."""
    conn = open_connection() if opened else make_connection()
    now = 0.0
    inputs = {"pong": PONG, "hello": hello_packet(), "msg": msg(CH, b"hi")}
    for kind, wait in steps:
        now += wait
        if kind in inputs:
            conn.receive_data(inputs[kind], now)
        overdue = conn.overdue(now)
        failed = any(type(e) is ConnectionFailed for e in conn.handle_timeout(now))
        assert overdue == failed, (kind, now)
        conn.data_to_send(now)


def test_received_data_restarts_the_ping_interval():
    """A received message postpones the ping by ping_interval."""
    conn = open_connection()
    conn.receive_data(msg(CH, b"hi"), 30.0)
    assert conn.next_deadline() == 90.0
    conn.handle_timeout(60.0)
    assert conn.data_to_send(60.0) == b""


def test_outgoing_traffic_does_not_delay_the_ping():
    """Sending does not postpone the ping: only received bytes count."""
    conn = open_connection()
    for t in (10.0, 30.0, 50.0):
        conn.queue_message(CH, b"out")
        assert conn.data_to_send(t)
    assert conn.next_deadline() == 60.0
    conn.handle_timeout(60.0)
    assert conn.data_to_send(60.0) == PING


def test_a_peer_that_never_reads_holds_at_most_one_of_our_pings():
    """A peer that sends a byte now and then but never reads what we send: each silent
    interval asks for a ping, but one still queued unsent is not queued again."""
    conn = open_connection()
    now = 0.0
    for _ in range(50):  # never data_to_send: the peer does not read
        now += 60.0
        conn.handle_timeout(now)
        assert conn.state is State.OPEN
        conn.receive_data(msg(CH, b"x"), now + 1.0)  # alive, but reading nothing
        now += 1.0
    assert conn.data_to_send(now) == PING


def test_every_ping_is_answered_with_a_pong():
    """Each ping received gets its own pong."""
    conn = open_connection()
    assert conn.receive_data(PING + PING, 1.0) == []
    assert conn.data_to_send(1.0) == PONG + PONG


def test_control_packets_go_before_data():
    """Pongs and pings go out ahead of data queued before them."""
    conn = open_connection()
    conn.queue_message(CH, b"d" * 5000)
    first = conn.data_to_send(1.0, budget=1)
    assert first[:1] == b"\x03"
    conn.receive_data(PING, 1.0)
    conn.handle_timeout(100.0)  # also queues our ping
    out = conn.data_to_send(100.0, budget=1)
    assert out[:2] == PONG + PING
    assert decode_stream(out)[2][0] == PacketType.MSG


def test_pong_reports_the_round_trip():
    """A pong answering our ping reports the round trip; a second pong is ignored."""
    conn = open_connection()
    conn.handle_timeout(60.0)
    conn.data_to_send(60.0)
    assert conn.receive_data(PONG, 60.25) == [PongReceived(round_trip=0.25)]
    assert conn.receive_data(PONG, 61.0) == []  # nobody asked for this one
    assert conn.next_deadline() == 121.0


def test_unsolicited_pong_is_ignored():
    """A pong we did not ask for is neither an event nor an error."""
    conn = open_connection()
    assert conn.receive_data(PONG, 5.0) == []
    assert conn.state is State.OPEN


def test_keepalive_between_two_cores():
    """Two cores ping each other after ping_interval and both measure the round trip."""
    pair = CorePair.make()
    pair.pump(0.0)
    for conn in (pair.a, pair.b):
        conn.handle_timeout(60.0)
    events_a, events_b = pair.pump(60.5)
    assert events_a == [PongReceived(round_trip=0.5)]
    assert events_b == [PongReceived(round_trip=0.5)]
    assert pair.a.next_deadline() == pair.b.next_deadline() == 120.5


# -- close -----------------------------------------------------------------------------------


def test_close_packet_from_the_peer():
    """A close from the peer is CloseReceived with its code and text and closes the connection."""
    conn = open_connection()
    close = wire.encode_extension(PacketType.CLOSE, wire.encode_close("duplicate", "already connected"))
    assert conn.receive_data(close, 1.0) == [CloseReceived(code="duplicate", text="already connected")]
    assert conn.state is State.CLOSED
    assert conn.next_deadline() is None
    assert conn.data_to_send(1.0) == b""


def test_close_packet_during_the_handshake():
    """A close before the hello is CloseReceived too, and closes the connection."""
    conn = make_connection()
    close = wire.encode_extension(PacketType.CLOSE, wire.encode_close("inbound_limit", "40 peers"))
    assert conn.receive_data(close, 1.0) == [CloseReceived(code="inbound_limit", text="40 peers")]
    assert conn.state is State.CLOSED


def test_bytes_after_the_peers_close_are_ignored_like_later_bytes():
    """After CloseReceived the connection is CLOSED, whether trailing bytes share the chunk or not."""
    close = wire.encode_extension(PacketType.CLOSE, wire.encode_close("shutdown", ""))
    separate = open_connection()
    assert separate.receive_data(close, 1.0) == [CloseReceived(code="shutdown", text="")]
    assert separate.receive_data(PING, 1.0) == []
    together = open_connection()
    assert together.receive_data(close + PING, 1.0) == [CloseReceived(code="shutdown", text="")]
    assert together.data_to_send(1.0) == b""


def test_our_close_is_the_last_thing_sent():
    """After close() only the close packet goes out; queued data is dropped and a second close is a no-op."""
    pair = CorePair.make()
    pair.pump(0.0)
    pair.a.queue_message(CH, b"never sent")
    pair.a.close("shutdown", "the node is stopping")
    assert pair.a.state is State.CLOSING
    assert decode_stream(pair.a.data_to_send(1.0)) == [
        (PacketType.CLOSE, wire.encode_close("shutdown", "the node is stopping"))
    ]
    assert pair.a.data_to_send(1.0) == b""
    pair.a.close("again")  # a second close is a no-op
    assert pair.a.data_to_send(1.0) == b""
    with pytest.raises(LocalProtocolError, match="closing"):
        pair.a.queue_message(CH, b"x")


def test_while_closing_the_peers_packets_are_read_and_ignored():
    """While closing, the peer's packets are read but ignored (no pong) until its close arrives."""
    conn = open_connection()
    conn.close("shutdown")
    conn.data_to_send(1.0)
    assert conn.receive_data(msg(CH, b"late") + PING + PONG, 2.0) == []
    assert conn.data_to_send(2.0) == b""  # no pong while closing
    close = wire.encode_extension(PacketType.CLOSE, wire.encode_close("shutdown", ""))
    assert conn.receive_data(close, 2.0) == [CloseReceived(code="shutdown", text="")]
    assert conn.state is State.CLOSED


def test_close_during_the_handshake_goes_out_after_our_hello():
    """A close before the handshake ends is sent after our hello."""
    conn = make_connection()
    conn.close("self", "connected to ourselves")
    kinds = [kind for kind, _ in decode_stream(conn.data_to_send(0.0))]
    assert kinds == [PacketType.HELLO, PacketType.CLOSE]


def test_close_text_is_cut_to_fit_a_close_packet():
    """A long close text is shortened so the close packet fits max_control_size."""
    conn = open_connection()
    conn.close("shutdown", "x" * 5000)
    (packet,) = split_packets(conn.data_to_send(1.0))
    code, text = wire.decode_close(wire.decode_packet(packet)[1])
    assert code == "shutdown" and 0 < len(text) < 1000
    assert len(packet) <= Config().max_control_size


# -- timers never spin -------------------------------------------------------------------------


def _assert_timer_advances(conn, now):
    """Calling handle_timeout at (or after) next_deadline must move next_deadline past now."""
    deadline = conn.next_deadline()
    assert deadline is not None
    now = max(now, deadline)
    conn.handle_timeout(now)
    conn.data_to_send(now)
    after = conn.next_deadline()
    assert after is None or after > now, f"next_deadline() is {after} after handle_timeout({now})"


def test_timers_advance_while_handshaking_and_open():
    """handle_timeout at the deadline always moves next_deadline forward: handshake, ping, pong timeout."""
    _assert_timer_advances(make_connection(), 0.0)
    conn = open_connection()
    _assert_timer_advances(conn, 0.0)  # sends a ping
    _assert_timer_advances(conn, 0.0)  # pong timeout


def test_no_timer_while_closing():
    """Once our close is out the core needs no timer (the adapter bounds the close)."""
    conn = open_connection()
    conn.close("shutdown")
    conn.data_to_send(1.0)
    assert conn.next_deadline() is None
    assert conn.handle_timeout(1000.0) == []


def test_timer_advances_with_send_rate_while_the_transport_is_paused():
    """send_rate set, data pending and tokens left, but the adapter is paused by the
    transport and does not call data_to_send: handle_timeout must not ask to be called
    again at once, forever (specs/connection.md section 5)."""
    conn = open_connection(config=Config(send_rate=1_000_000.0))
    conn.queue_message(CH, b"z" * 50_000)
    assert conn.data_to_send(1.0, budget=1)  # one write, then the transport pauses us
    assert conn.wants_to_send()
    deadline = conn.next_deadline()
    now = max(1.0, deadline)
    conn.handle_timeout(now)
    after = conn.next_deadline()
    assert after > now, f"next_deadline() is {after} after handle_timeout({now})"


# -- rate limits -----------------------------------------------------------------------------


def test_send_rate_limits_bytes_per_second():
    """Over 10 s, send_rate holds to within one burst and one packet."""
    rate = 10_000.0
    conn = open_connection(config=Config(send_rate=rate), channels=[ChannelDescriptor(CH, send_queue_capacity=4)])
    sent = 0
    for step in range(10_001):  # 10 s in 1 ms steps
        now = step / 1000
        while conn.queue_message(CH, b"r" * 3000):
            pass
        sent += len(conn.data_to_send(now))
    burst = max(rate * 0.01, 2068)
    assert rate * 10 <= sent <= rate * 10 + burst + 1030


def test_send_rate_debt_delays_data_but_not_control_packets():
    """After the burst, data waits until the bucket is out of debt; a pong goes out at once."""
    conn = open_connection(config=Config(send_rate=1000.0))
    conn.queue_message(CH, b"q" * 5000)
    first = conn.data_to_send(0.0)
    spent = len(core_hello_packet(conn.hello)) + len(first)  # every byte counts, our hello too
    assert spent > 2068  # the burst, overdrawn by at most one packet
    assert conn.wants_to_send()
    ready = conn.next_deadline()
    assert ready == pytest.approx((spent - 2068 + 1) / 1000.0, abs=1e-6)
    assert conn.data_to_send(ready / 2) == b""
    conn.receive_data(PING, ready / 2)
    assert conn.data_to_send(ready / 2) == PONG
    assert conn.data_to_send(ready + 0.01) != b""


def test_data_may_go_out_at_the_deadline_send_rate_announces():
    """next_deadline() is when the bucket is out of debt; data_to_send must send then."""
    conn = open_connection(config=Config(send_rate=1000.0))
    conn.queue_message(CH, b"q" * 5000)
    conn.data_to_send(0.0)
    ready = conn.next_deadline()
    assert 0.0 < ready < 60.0
    assert conn.data_to_send(ready / 2) == b""
    assert conn.handle_timeout(ready) == []
    assert conn.data_to_send(ready) != b""


def test_recv_rate_is_reflected_in_receive_ready_at():
    """Input beyond recv_rate's burst puts receive_ready_at in the future by the debt."""
    conn = open_connection(config=Config(recv_rate=1000.0))
    assert conn.receive_ready_at(0.0) == 0.0
    # 2068 bytes of burst minus the hello already read; 5000 more puts the bucket in debt.
    conn.receive_data(msg(CH, b"w" * 1000, eof=False) * 5, 0.0)
    ready = conn.receive_ready_at(0.0)
    debt = len(hello_packet()) + 5 * 1006 - 2068
    assert ready == pytest.approx(debt / 1000.0, abs=1e-3)
    assert conn.receive_ready_at(ready + 1.0) == ready + 1.0


def test_without_rates_nothing_waits():
    """With no rates set, receiving never waits and sending is unbounded."""
    conn = open_connection()
    conn.receive_data(msg(CH, b"w" * 1000) * 100, 0.0)
    assert conn.receive_ready_at(0.0) == 0.0
    for _ in range(10):
        conn.queue_message(CH, b"v" * 60000)
        assert len(conn.data_to_send(0.0)) > 60000


# -- both directions -------------------------------------------------------------------------


def test_messages_flow_both_ways_on_several_channels_in_order():
    """Messages sent both ways on two channels arrive complete and in order per channel."""
    channels = [
        ChannelDescriptor(0x20, priority=1, send_queue_capacity=10),
        ChannelDescriptor(0x30, priority=5, send_queue_capacity=10),
    ]
    pair = CorePair.make(channels_a=channels, channels_b=channels)
    pair.pump(0.0)
    sent = {0x20: [bytes([i]) * (300 * i) for i in range(1, 8)], 0x30: [bytes([100 + i]) * 700 for i in range(8)]}
    for channel_id, messages in sent.items():
        for m in messages:
            assert pair.a.queue_message(channel_id, m) and pair.b.queue_message(channel_id, m)
    events_a, events_b = pair.pump(1.0, budget=3000)
    for events in (events_a, events_b):
        got = {0x20: [], 0x30: []}
        for e in events:
            got[e.channel_id].append(e.message)
        assert got == sent


@settings(max_examples=100, deadline=None)
@given(
    payload_a=st.integers(1024, 4096),
    payload_b=st.integers(1024, 4096),
    messages=st.lists(st.tuples(st.sampled_from([0x20, 0x30]), st.binary(max_size=9000)), max_size=8),
    cuts=st.lists(st.integers(0, 30000), max_size=12),
)
def test_any_split_of_the_stream_delivers_the_same_messages(payload_a, payload_b, messages, cuts):
    """For any payload sizes and any cuts of the stream, the same messages arrive in order per channel."""
    channels = [
        ChannelDescriptor(0x20, send_queue_capacity=8),
        ChannelDescriptor(0x30, priority=4, send_queue_capacity=8),
    ]
    a = make_connection(channels=channels, config=Config(max_packet_payload=payload_a))
    b = make_connection(node_id=NODE_B, channels=channels, config=Config(max_packet_payload=payload_b))
    b.receive_data(a.data_to_send(0.0), 0.0)
    a.receive_data(b.data_to_send(0.0), 0.0)
    for channel_id, message in messages:
        assert a.queue_message(channel_id, message)
    stream = b""
    while chunk := a.data_to_send(1.0, budget=4000):
        stream += chunk
    # Every packet but a message's last carries exactly the negotiated payload.
    negotiated = min(payload_a, payload_b)
    sizes = {0x20: [], 0x30: []}
    for channel_id, eof, data in msg_payloads(stream):
        sizes[channel_id].append(len(data))
        if not eof:
            assert len(data) == negotiated
    events = []
    points = sorted({c % (len(stream) + 1) for c in cuts})
    for start, end in itertools.pairwise([0, *points, len(stream)]):
        events += b.receive_data(stream[start:end], 1.0)
    assert all(isinstance(e, MessageReceived) for e in events)
    for channel_id in (0x20, 0x30):
        expected = [m for c, m in messages if c == channel_id]
        assert [e.message for e in events if e.channel_id == channel_id] == expected


def test_a_run_of_full_packets_past_recv_message_capacity_fails_before_it_is_kept():
    """MessageTooLarge holds on the bulk fast path (frame_buffer.RUN) too."""
    from mconn.errors import MessageTooLarge

    conn = open_connection(channels=[ChannelDescriptor(CH, recv_message_capacity=2048)])
    stream = b"".join(msg(CH, b"x" * 1024, eof=False) for _ in range(3))
    events = conn.receive_data(stream, 1.0)
    assert isinstance(events[-1], ConnectionFailed)
    assert isinstance(events[-1].error, MessageTooLarge)
    assert "3072" in str(events[-1].error) and "2048" in str(events[-1].error)
    assert conn.channels[CH].receiving is None


def test_room_and_queue_messages_are_the_send_path_into_a_channel_queue():
    """``room`` counts what the queue takes; ``queue_messages`` queues a prefix that fits,
    in order; both refuse a channel the connection lacks; nothing is taken unless open."""
    conn = make_connection(channels=[ChannelDescriptor(CH, send_queue_capacity=3)])
    assert conn.room(CH) == 0  # handshaking: nothing may be queued yet
    with pytest.raises(LocalProtocolError, match="connection is handshaking"):
        conn.queue_messages(CH, [b"early"])
    conn = open_connection(channels=[ChannelDescriptor(CH, send_queue_capacity=3)])
    assert conn.room(CH) == 3
    assert conn.queue_message(CH, b"a")
    assert conn.room(CH) == 2
    assert conn.queue_messages(CH, [b"b", b"c", b"d"]) == 2  # "d" does not fit
    assert conn.room(CH) == 0 and not conn.queue_message(CH, b"d")
    assert conn.queue_messages(CH, [b"d"]) == 0
    with pytest.raises(LocalProtocolError, match="channel 0x7f is not one of this connection's channels"):
        conn.room(0x7F)
    out = conn.data_to_send(1.0)
    assert [m for _, _, m in msg_payloads(out)] == [b"a", b"b", b"c"]
    assert conn.room(CH) == 3


def test_room_is_zero_not_negative_after_a_requeue_past_capacity():
    """A resumed session re-sends whatever the peer lacks, past the queue's capacity; until
    the queue is back under it there is no room, and nothing queued is dropped."""
    conn = open_connection(channels=[ChannelDescriptor(CH, send_queue_capacity=2)])
    conn.requeue(CH, [b"r1", b"r2", b"r3", b"r4"])
    assert conn.room(CH) == 0
    assert not conn.queue_message(CH, b"new")
    assert [m for _, _, m in msg_payloads(conn.data_to_send(1.0))] == [b"r1", b"r2", b"r3", b"r4"]
    assert conn.room(CH) == 2
