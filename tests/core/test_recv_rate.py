"""The receive rate a hello announces, and the pacing it asks of the peer (specs/handshake.md
section 7, specs/connection.md section 5).

The vectors are specs/vectors/recv_rate.json; old hellos (without the field) are
specs/vectors/hello.json, and announce no limit. Sans I/O: time is passed in.
"""

from __future__ import annotations

import pytest

from mconn import errors
from mconn.config import MIN_RECV_RATE, Config
from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.core.connection import Connection
from mconn.core.events import CloseReceived, ConnectionFailed, HelloReceived
from mconn.core.handshake import check_hello, make_hello, recv_rate_field, recv_rate_of
from mconn.core.packet_size import payload_for_pace
from mconn.core.rate import BURST_TIME
from mconn.core.wire import HelloTag, PacketType
from tests.helpers_core import NODE_A, NODE_B, expand, load_vectors, make_connection, msg_payloads

VECTORS = load_vectors("recv_rate")
OLD_HELLOS = load_vectors("hello")["valid"]
VOTE, PART = 0x20, 0x21
CHANNELS = [
    ChannelDescriptor(VOTE, priority=10, send_queue_capacity=64),
    ChannelDescriptor(PART, priority=1, send_queue_capacity=64),
]


def _ids(vectors):
    return [v["name"] for v in vectors]


def _hello_with(field_value: bytes | None) -> wire.Hello:
    fields = () if field_value is None else ((HelloTag.RECV_RATE, field_value),)
    return make_hello(node_id=NODE_B, channels=[], max_packet_payload=1024, fields=fields)


def peer_hello(rate: float | None, *, max_packet_payload: int = 65536, channels=CHANNELS) -> bytes:
    """The whole hello packet of a peer that announces ``rate`` (None: an older peer)."""
    fields = () if rate is None else (recv_rate_field(rate),)
    hello = make_hello(node_id=NODE_B, channels=channels, max_packet_payload=max_packet_payload, fields=fields)
    return wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))


def opened(config: Config, rate: float | None, now: float = 0.0) -> tuple[Connection, int]:
    """Our Connection, open with a peer announcing ``rate``; and the bytes of our hello."""
    conn = make_connection(channels=CHANNELS, config=config, now=now)
    ours = conn.data_to_send(now)
    events = conn.receive_data(peer_hello(rate), now)
    assert [type(e) for e in events] == [HelloReceived], events
    return conn, len(ours)


# -- the field ----------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=_ids(VECTORS["valid"]))
def test_valid_field_decodes_to_its_rate_and_encodes_canonically(vector):
    """Each valid value is read as its rate; the rate is written back as the canonical bytes."""
    value = expand(vector["field_hex"])
    assert recv_rate_of(_hello_with(value)) == vector["rate"]
    assert recv_rate_field(vector["rate"]) == (
        HelloTag.RECV_RATE,
        expand(vector.get("canonical_hex", vector["field_hex"])),
    )


@pytest.mark.parametrize("vector", [v for v in VECTORS["valid"] if "hello_hex" in v], ids=lambda v: v["name"])
def test_valid_hello_carries_its_rate(vector):
    """A whole hello body with the field decodes, keeps the field, and yields its rate."""
    hello = wire.decode_hello(expand(vector["hello_hex"]))
    assert recv_rate_of(hello) == vector["rate"]
    assert wire.encode_hello(hello) == expand(vector["hello_hex"])


@pytest.mark.parametrize("vector", [v for v in VECTORS["valid"] if "packet_hex" in v], ids=lambda v: v["name"])
def test_hello_packet_vector_opens_a_connection_paced_at_its_rate(vector):
    """The vector's hello packet opens a Connection whose sending is paced at the rate."""
    conn = make_connection()
    events = conn.receive_data(expand(vector["packet_hex"]), 0.5)
    assert [type(e) for e in events] == [HelloReceived]
    assert conn.send_pace == vector["rate"]


@pytest.mark.parametrize("vector", VECTORS["incompatible"], ids=_ids(VECTORS["incompatible"]))
def test_a_rate_below_the_floor_is_refused_naming_the_value_and_the_floor(vector):
    """check_hello refuses it with RecvRateTooSmall; a Connection fails and closes with that code."""
    theirs = _hello_with(expand(vector["field_hex"]))
    ours = make_hello(node_id=NODE_A, channels=[], max_packet_payload=1024)
    rate = recv_rate_of(theirs)
    with pytest.raises(getattr(errors, vector["error"])) as info:
        check_hello(ours, theirs)
    assert f"recv_rate {rate} " in str(info.value) and str(MIN_RECV_RATE) in str(info.value)
    conn = make_connection()
    conn.data_to_send(0.0)
    events = conn.receive_data(wire.encode_extension(PacketType.HELLO, wire.encode_hello(theirs)), 0.0)
    assert [type(e) for e in events] == [ConnectionFailed]
    assert type(events[0].error) is errors.RecvRateTooSmall
    code, _ = wire.decode_close(wire.decode_packet(conn.data_to_send(0.0))[1])
    assert code == "RecvRateTooSmall"


def test_the_floor_itself_is_accepted():
    """A hello announcing exactly MIN_RECV_RATE passes check_hello."""
    ours = make_hello(node_id=NODE_A, channels=[], max_packet_payload=1024)
    assert check_hello(ours, _hello_with(recv_rate_field(MIN_RECV_RATE)[1])) == 1024


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=_ids(VECTORS["invalid"]))
def test_invalid_field_is_malformed(vector):
    """A value that is not exactly one uvarint is MalformedPacket naming the field."""
    with pytest.raises(errors.MalformedPacket, match="recv_rate"):
        recv_rate_of(_hello_with(expand(vector["field_hex"])))


@pytest.mark.parametrize("vector", VECTORS["invalid_hello"], ids=_ids(VECTORS["invalid_hello"]))
def test_invalid_hello_fails_the_connection(vector):
    """A hello with the field twice fails the connection with MalformedPacket."""
    conn = make_connection()
    events = conn.receive_data(wire.encode_extension(PacketType.HELLO, expand(vector["hello_hex"])), 0.0)
    assert [type(e) for e in events] == [ConnectionFailed]
    assert type(events[0].error) is errors.MalformedPacket
    assert "twice" in str(events[0].error)


@pytest.mark.parametrize("vector", OLD_HELLOS, ids=_ids(OLD_HELLOS))
def test_an_old_hello_announces_no_limit(vector):
    """Hellos without the field (every hello.json vector but the one with it) mean no limit."""
    hello = wire.decode_hello(expand(vector["hex"]))
    has_field = any(tag == HelloTag.RECV_RATE for tag, _ in hello.fields)
    assert (recv_rate_of(hello) is None) is not has_field


def test_our_hello_announces_our_recv_rate_rounded_down_and_nothing_without_one():
    """Config.recv_rate goes into our hello as whole bytes per second, rounded down (a
    sender pacing at it never outruns us); without it our hello is the one given."""
    given = make_hello(node_id=NODE_A, channels=CHANNELS, max_packet_payload=65536)
    with_rate = Connection(config=Config(recv_rate=1_000_000.9), hello=given, channels=CHANNELS, now=0.0)
    assert recv_rate_of(with_rate.hello) == 1_000_000
    assert wire.decode_hello(wire.decode_packet(with_rate.data_to_send(0.0))[1]) == with_rate.hello
    without = Connection(config=Config(), hello=given, channels=CHANNELS, now=0.0)
    assert without.hello is given and recv_rate_of(without.hello) is None


@pytest.mark.parametrize("rate", [999.9, 1, 0.5])
def test_a_config_below_the_floor_is_refused(rate):
    """A Config cannot announce less than MIN_RECV_RATE: ValueError naming the field, value and floor."""
    with pytest.raises(ValueError, match=rf"Config\.recv_rate .*{MIN_RECV_RATE}.*got {rate!r}"):
        Config(recv_rate=rate)


# -- pacing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "send_rate, announced, pace",
    [(None, 100_000, 100_000), (50_000.0, 100_000, 50_000), (200_000.0, 100_000, 100_000), (50_000.0, None, 50_000)],
)
def test_the_pace_is_the_lower_of_send_rate_and_the_announced_rate(send_rate, announced, pace):
    """send_pace is min(our send_rate, the peer's recv_rate); an older peer leaves send_rate."""
    conn, _ = opened(Config(send_rate=send_rate), announced)
    assert conn.send_pace == pace


def test_without_either_rate_nothing_is_paced():
    """Neither side limits: send_pace is None and a whole write batch goes out at once."""
    conn, _ = opened(Config(), None)
    assert conn.send_pace is None
    conn.queue_messages(PART, [b"p" * 65536] * 4)
    assert len(conn.data_to_send(0.0)) >= Config().write_batch_bytes


def test_the_announced_rate_holds_data_in_the_senders_scheduler():
    """A peer announcing 100,000 B/s: our data_to_send returns at most rate * elapsed
    (plus the bucket's burst and one packet) at every moment over 10 s, while the rest
    waits in the channel queues; and it keeps up with the rate."""
    rate = 100_000
    conn, hello_bytes = opened(Config(), rate)
    packet = payload_for_pace(rate) + 8
    burst = max(rate * BURST_TIME, 2068)
    sent = hello_bytes
    for step in range(1, 10_001):  # 10 s in 1 ms steps
        now = step / 1000
        conn.queue_messages(PART, [b"p" * 65536] * conn.room(PART))
        sent += len(conn.data_to_send(now))
        assert sent <= rate * now + burst + packet, f"{sent} bytes by {now:.3f} s"
        assert conn.wants_to_send()  # the rest waits in the scheduler
    assert sent >= rate * 10


def test_a_vote_overtakes_a_paced_flood_within_one_packet():
    """Block parts flood a priority-1 channel at the announced pace for 2 s; a vote on the
    priority-10 channel then goes out in the next write that sends anything, after at
    most one packet's time at the pace; nothing beyond the pace was handed out before it."""
    rate = 1_000_000
    conn, hello_bytes = opened(Config(), rate)
    burst = max(rate * BURST_TIME, 2068)
    packet = payload_for_pace(rate) + 8
    sent, now = hello_bytes, 0.0
    for step in range(1, 2001):
        now = step / 1000
        conn.queue_messages(PART, [b"p" * 65536] * conn.room(PART))
        sent += len(conn.data_to_send(now))
    assert sent <= rate * now + burst + packet
    conn.queue_message(VOTE, b"v" * 200)
    queued_at = now
    for step in range(1, 1001):
        now = queued_at + step / 10_000
        out = conn.data_to_send(now)
        if out:
            break
    assert msg_payloads(out)[0] == (VOTE, True, b"v" * 200)
    assert now - queued_at <= packet / rate + 1e-4


def test_packets_are_cut_for_the_pace():
    """At 1 MB/s packets carry at most a quarter of the bucket's 10 ms burst (2,500
    bytes), not the negotiated 64 KiB: a vote waits behind 2.5 ms, not 65 ms."""
    conn, _ = opened(Config(), 1_000_000)
    conn.queue_message(PART, b"p" * 65536)
    sizes = [len(data) for _, _, data in msg_payloads(conn.data_to_send(0.0))]
    assert sizes and max(sizes) == payload_for_pace(1_000_000) == 2500


# -- both rates count the same bytes --------------------------------------------------------


def test_a_receiver_reading_at_the_senders_rate_never_falls_behind():
    """The sender's send_rate and the receiver's recv_rate are both 20,000 B/s and both
    count every byte, control packets included: a flood plus a 300-byte ack every 50 ms
    (6,000 B/s of control) for 20 s leaves the receiver at most one burst and one packet
    behind (receive_ready_at), instead of falling 6,000 B/s further behind."""
    rate = 20_000.0
    sender = make_connection(node_id=NODE_A, channels=CHANNELS, config=Config(send_rate=rate, max_packet_payload=1024))
    receiver = make_connection(node_id=NODE_B, channels=CHANNELS, config=Config(recv_rate=rate))
    receiver.receive_data(sender.data_to_send(0.0), 0.0)
    sender.receive_data(receiver.data_to_send(0.0), 0.0)
    assert sender.state is receiver.state is sender.state.OPEN
    counts = {c: 1 << 40 for c in range(60)}  # an ack of ~300 bytes
    burst = max(rate * BURST_TIME, 2068)
    worst = 0.0
    for step in range(1, 20_001):  # 20 s in 1 ms steps
        now = step / 1000
        sender.queue_messages(PART, [b"p" * 4096] * sender.room(PART))
        if step % 50 == 0:
            counts = {c: n + 1 for c, n in counts.items()}
            sender.send_ack(counts)
        data = sender.data_to_send(now)
        if data:
            events = receiver.receive_data(data, now)
            assert not any(isinstance(e, (ConnectionFailed, CloseReceived)) for e in events)
        worst = max(worst, receiver.receive_ready_at(now) - now)
    assert worst <= (burst + 1030) / rate, f"the receiver fell {worst:.3f} s behind"


def test_control_packets_spend_the_pace_and_data_waits_for_them():
    """Control bytes count against the pace: over 10 s, data plus control stays within
    rate * 10 plus a burst, a packet and the last ack."""
    rate = 20_000.0
    conn, hello_bytes = opened(Config(send_rate=rate, max_packet_payload=1024), None)
    counts = {c: 1 << 40 for c in range(60)}
    sent = hello_bytes
    control = 0
    for step in range(1, 10_001):
        now = step / 1000
        conn.queue_messages(PART, [b"p" * 4096] * conn.room(PART))
        if step % 50 == 0:
            counts = {c: n + 1 for c, n in counts.items()}
            conn.send_ack(counts)
        out = conn.data_to_send(now)
        sent += len(out)
        if out[:1] == bytes([PacketType.ACK]):
            control += len(wire.encode_extension(PacketType.ACK, wire.encode_ack(counts)))
    assert control >= 50_000  # the acks were a quarter of the rate
    # Control is never held back: the debt may pass one packet by the control sent since.
    ack = len(wire.encode_extension(PacketType.ACK, wire.encode_ack(counts)))
    assert sent <= rate * 10 + max(rate * BURST_TIME, 2068) + 1030 + ack


def test_set_rate_is_applied_at_open_and_keeps_the_bucket_debt():
    """A peer's lower rate replaces send_rate's from the hello on: what the hello and the
    first write spent is still owed, so nothing more goes out until it is repaid."""
    conn = make_connection(channels=CHANNELS, config=Config(send_rate=5_000_000.0))
    conn.data_to_send(0.0)
    conn.receive_data(peer_hello(MIN_RECV_RATE), 0.0)
    conn.queue_message(PART, b"p" * 10_000)
    first = conn.data_to_send(0.0)
    assert 0 < len(first) <= 2068 + payload_for_pace(MIN_RECV_RATE) + 8
    assert conn.data_to_send(0.5) == b""
    assert conn.next_deadline() < 60.0
