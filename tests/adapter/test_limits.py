"""Limits against abuse (specs/connection.md section 6): each Config field, enforced.

Inbound admission (max_pending_handshakes, max_connections_per_ip) is decided when the
transport connects, before a Connection is built: a refused connection gets a close
packet naming the limit, a connection_refused event, a count in ``Switch.refusals``, and
costs a few hundred bytes. The handshake, both sides, is bounded by handshake_timeout;
pings by max_pings_per_interval; pongs a peer does not read by max_control_backlog; every
extension body by its size limit before a byte of it is buffered.
"""

import gc
import tracemalloc

import pytest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from helpers import (
    RawPeer,
    RecordingReactor,
    close_packets_in,
    extension_packet,
    hello_packet,
    msg_packet,
    new_node_id,
    open_switch_connection,
    parse_packets,
)
from mconn import ChannelDescriptor, Config, ControlFlood, HandshakeTimeout, PacketTooLarge, Switch
from mconn.net.protocol import MConnectionFactory
from mconn.testing import MemoryNetwork
from mconn.core.wire import PacketType, SessionAnswer, encode_session_answer, encode_uvarint

CHANNELS = [ChannelDescriptor(0x20, priority=3), ChannelDescriptor(0x21)]


def hello_of(node_id=None):
    return hello_packet(node_id or new_node_id(), CHANNELS)


@pytest.fixture
def network():
    return MemoryNetwork()


def listener(network, **config):
    reactor = RecordingReactor(CHANNELS)
    return network.switch([reactor], config=Config(**config)), reactor


def connect(network, switch, greeting=b""):
    raw = RawPeer(greeting)
    link = network.connect_raw(raw, switch)
    network.flush()
    return raw, link


def refused_code(raw):
    [(code, text)] = close_packets_in(raw.data)
    return code, text


# -- Config ------------------------------------------------------------------------------

NEW_FIELDS = ["max_pending_handshakes", "max_connections_per_ip", "max_pings_per_interval", "max_control_backlog"]


def test_defaults():
    """Defaults: 64 pending handshakes, 8 connections per IP, 20 pings per interval, 64 unsent control packets."""
    c = Config()
    assert (c.max_pending_handshakes, c.max_connections_per_ip) == (64, 8)
    assert (c.max_pings_per_interval, c.max_control_backlog) == (20, 64)


@pytest.mark.parametrize("field", NEW_FIELDS)
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8"])
def test_invalid_limits_are_refused_naming_field_and_value(field, value):
    """Each abuse limit must be an integer >= 1; anything else is a ValueError naming field and value."""
    with pytest.raises(ValueError, match=f"Config.{field} must be an integer >= 1, got {value!r}"):
        Config(**{field: value})


# -- max_pending_handshakes --------------------------------------------------------------


def test_past_max_pending_handshakes_a_new_connection_is_refused_at_once(network, telemetry):
    """Past max_pending_handshakes a new connection is closed at once with pending_limit, before any
    Connection is built; counted in refusals and logged, the handshaking ones untouched."""
    switch, _ = listener(network, max_pending_handshakes=2)
    stalled = [connect(network, switch) for _ in range(2)]
    raw, link = connect(network, switch)

    assert raw.lost is not None  # closed at once, not after a timeout
    code, text = refused_code(raw)
    assert code == "pending_limit"
    assert text == "2 inbound connections are handshaking (max_pending_handshakes 2)"
    assert link.inbound.core is None  # refused before a Connection was built
    assert link.inbound not in switch.connections
    assert switch.refusals == {"pending_limit": 1}
    [event] = telemetry.named("connection_refused")
    assert event["reason"] == "pending_limit" and event["message"] == text
    assert event["remote_address"] == link.inbound.remote_address == "192.0.2.1:40002"
    assert len(telemetry.named("connection_made")) == 2  # nothing else for the refused one
    assert [r.lost for r, _ in stalled] == [None, None]
    switch._check_invariants()


def test_a_finished_handshake_frees_its_pending_slot(network):
    """A completed handshake frees its pending slot for the next connection."""
    switch, reactor = listener(network, max_pending_handshakes=1)
    first, _ = connect(network, switch)
    first.send(hello_of())
    network.flush()
    assert len(switch.peers) == 1
    second, _ = connect(network, switch)  # the slot is free again
    assert second.lost is None
    third, _ = connect(network, switch)
    assert refused_code(third)[0] == "pending_limit"


def test_a_closed_pending_connection_frees_its_slot(network):
    """A handshaking connection that is lost frees its pending slot."""
    switch, _ = listener(network, max_pending_handshakes=1)
    first, link = connect(network, switch)
    link.reset()
    network.flush()
    second, _ = connect(network, switch)
    assert second.lost is None
    switch._check_invariants()


def test_outbound_connections_are_not_pending_inbound_ones(network):
    """Our own outbound handshakes do not count against max_pending_handshakes."""
    switch, _ = listener(network, max_pending_handshakes=1)
    other, _ = listener(network)
    network.connect(switch, other)  # outbound from switch: its handshake does not count
    raw, _ = connect(network, switch)
    assert raw.lost is None


# -- max_connections_per_ip --------------------------------------------------------------


def test_past_max_connections_per_ip_a_new_connection_from_that_ip_is_refused(network, telemetry):
    """Past max_connections_per_ip, established ones included, a new connection from that IP is refused
    with ip_limit; other addresses still connect."""
    switch, _ = listener(network, max_connections_per_ip=2)
    peers = [connect(network, switch, hello_of()) for _ in range(2)]  # established ones count too
    assert len(switch.peers) == 2
    raw, link = connect(network, switch)
    code, text = refused_code(raw)
    assert (code, text) == ("ip_limit", "2 connections from 192.0.2.1 (max_connections_per_ip 2)")
    assert link.inbound.core is None
    assert switch.refusals == {"ip_limit": 1}
    assert [e["reason"] for e in telemetry.named("connection_refused")] == ["ip_limit"]
    # Other addresses are not affected.
    other, _ = listener(network)
    network.connect(other, switch)
    assert len(switch.peers) == 3
    assert all(r.lost is None for r, _ in peers)
    switch._check_invariants()


def test_a_lost_connection_releases_its_ip_slot(network):
    """A lost connection releases its per-IP slot, so another from that IP is admitted."""
    switch, _ = listener(network, max_connections_per_ip=1)
    first, link = connect(network, switch, hello_of())
    assert switch._admission.per_ip == {"192.0.2.1": 1}
    link.reset()
    network.flush()
    assert switch._admission.per_ip == {}
    second, _ = connect(network, switch)
    assert second.lost is None
    switch._check_invariants()


def test_the_ip_slot_is_released_by_the_key_it_was_taken_with(network):
    """Twisted's per-peer limiter counts by one key and releases by another: ours uses
    the key stored at admission, whatever the transport says by connectionLost."""
    switch, _ = listener(network, max_connections_per_ip=1)
    _, link = connect(network, switch)
    transport = link.inbound.transport
    transport.getPeer = lambda: IPv4Address("TCP", "203.0.113.9", 1)  # says something else now
    link.reset()
    network.flush()
    assert switch._admission.per_ip == {}
    switch._check_invariants()


def test_a_refused_connection_releases_nothing(network):
    """A connection refused by ip_limit took no slot, so its end releases none."""
    switch, _ = listener(network, max_connections_per_ip=1)
    connect(network, switch)
    raw, link = connect(network, switch)
    assert raw.lost is not None and link.inbound.ip_key is None
    assert switch._admission.per_ip == {"192.0.2.1": 1}
    switch._check_invariants()


def test_outbound_connections_do_not_count_per_ip(network):
    """Outbound connections do not count against max_connections_per_ip."""
    dialer, _ = listener(network, max_connections_per_ip=1)
    targets = [listener(network)[0] for _ in range(3)]
    for target in targets:
        network.connect(dialer, target)
    assert len(dialer.peers) == 3 and dialer._admission.per_ip == {}


# -- pending handshakes per address group, and who gives way when all are taken ----------


def clocked_switch(**config):
    """A Switch on a task.Clock whose inbound connections come over StringTransports."""
    switch = Switch([RecordingReactor(CHANNELS)], clock=Clock(), config=Config(**config))
    return switch, MConnectionFactory(switch, is_outbound=False)


def accept(factory, host, port=5000):
    """An inbound connection from ``host`` (IPv4 or IPv6), accepted; its protocol and transport."""
    address = (IPv6Address if ":" in host else IPv4Address)("TCP", host, port)
    transport = StringTransport(peerAddress=address)
    proto = factory.buildProtocol(address)
    proto.makeConnection(transport)
    return proto, transport


def test_group_limit_defaults():
    """Defaults: 16 pending handshakes per address group, groups of an IPv4 /24 and an IPv6 /64."""
    c = Config()
    assert (c.max_pending_per_group, c.pending_group_prefix_v4, c.pending_group_prefix_v6) == (16, 24, 64)


@pytest.mark.parametrize(
    "field, value, bounds",
    [
        ("max_pending_per_group", 0, ">= 1"),
        ("max_pending_per_group", 2.0, ">= 1"),
        ("pending_group_prefix_v4", 33, "in 0..32"),
        ("pending_group_prefix_v4", -1, "in 0..32"),
        ("pending_group_prefix_v6", 129, "in 0..128"),
        ("pending_group_prefix_v6", True, "in 0..128"),
    ],
)
def test_invalid_group_limits_are_refused_naming_field_and_value(field, value, bounds):
    """The group cap is an integer >= 1, the prefixes integers within their address length."""
    with pytest.raises(ValueError, match=f"Config.{field} must be an integer {bounds}, got {value!r}"):
        Config(**{field: value})


@pytest.mark.parametrize(
    "same, other, group",
    [
        (["198.51.100.1", "198.51.100.200", "198.51.100.77"], "198.51.101.1", "198.51.100.0/24"),
        (["2001:db8:0:1::1", "2001:db8:0:1:ffff::2", "2001:db8:0:1::3"], "2001:db8:0:2::1", "2001:db8:0:1::/64"),
    ],
    ids=["IPv4 /24", "IPv6 /64"],
)
def test_past_max_pending_per_group_a_new_connection_from_that_group_is_refused(same, other, group, telemetry):
    """Past max_pending_per_group handshakes from one /24 (or /64), a new connection from it is refused at
    once with pending_group_limit, though max_pending_handshakes has room; another group still gets in."""
    switch, factory = clocked_switch(max_pending_per_group=2)
    first, second = (accept(factory, host) for host in same[:2])
    proto, transport = accept(factory, same[2])
    text = f"2 inbound connections from {group} are handshaking (max_pending_per_group 2)"
    assert close_packets_in(transport.value()) == [("pending_group_limit", text)]
    assert proto.core is None and transport.disconnecting
    assert switch.refusals == {"pending_group_limit": 1}
    assert [(e["reason"], e["message"]) for e in telemetry.named("connection_refused")] == [
        ("pending_group_limit", text)
    ]
    outsider, _ = accept(factory, other)
    assert outsider.core is not None and outsider.end_reason is None
    assert first[0].end_reason is None and second[0].end_reason is None
    switch._check_invariants()


def test_the_group_prefixes_come_from_the_config():
    """pending_group_prefix_v4=32 makes every IPv4 address a group of its own."""
    switch, factory = clocked_switch(max_pending_per_group=1, pending_group_prefix_v4=32)
    assert [accept(factory, f"198.51.100.{i}")[0].end_reason for i in (1, 2, 3)] == [None, None, None]
    refused, _ = accept(factory, "198.51.100.1")
    assert refused.end_reason.reason == "pending_group_limit"


def test_a_full_budget_evicts_the_oldest_handshake_of_the_largest_group(telemetry):
    """All max_pending_handshakes taken: a newcomer from a smaller group is admitted, and the oldest
    pending handshake of the largest group is closed with pending_evicted (peer_rejected, counted in
    refusals), stops counting as pending at once, and releases its address when it is gone. A newcomer
    of the largest group evicts nobody: it is refused with pending_limit."""
    switch, factory = clocked_switch(max_pending_handshakes=4)
    (oldest, oldest_transport), *_ = [accept(factory, f"198.51.100.{i}") for i in (1, 2, 3)]
    accept(factory, "203.0.113.1")

    newcomer, _ = accept(factory, "192.0.2.7")

    assert newcomer.core is not None and newcomer.end_reason is None
    text = (
        "4 inbound connections are handshaking (max_pending_handshakes 4); the oldest of the 3 from "
        "198.51.100.0/24 gave way to one from 192.0.2.0/24"
    )
    assert close_packets_in(oldest_transport.value())[-1] == ("pending_evicted", text)
    assert oldest_transport.disconnecting
    assert oldest.end_reason.reason == "pending_evicted"
    assert oldest.handshake.called and oldest not in switch._admission._pending  # its handshake failed
    assert switch.refusals == {"pending_evicted": 1}
    [event] = telemetry.named("peer_rejected")
    assert (event["reason"], event["message"], event["peer_id"]) == ("pending_evicted", text, None)
    assert event["remote_address"] == "198.51.100.1:5000"
    assert switch._admission.pending == 4
    switch._check_invariants()  # the evicted one is still closing: it counts per IP, not as pending
    oldest.connectionLost(Failure(ConnectionDone()))
    assert "198.51.100.1" not in switch._admission.per_ip
    switch._check_invariants()
    newcomer.dataReceived(hello_of())
    assert len(switch.peers) == 1
    accept(factory, "198.51.100.9")  # full again, 198.51.100.0/24 the largest group (3)
    refused, transport = accept(factory, "198.51.100.10")
    assert close_packets_in(transport.value())[0][0] == "pending_limit" and refused.core is None
    assert switch.refusals == {"pending_evicted": 1, "pending_limit": 1}
    switch._check_invariants()


def test_stalled_sockets_from_eight_addresses_of_one_24_cannot_take_the_budget():
    """The handshake-stall attack, 64 silent sockets from 8 addresses, when the 8 share a /24: they get
    max_pending_per_group (16) handshakes, the rest are refused, and the budget stays open."""
    switch, factory = clocked_switch()
    ends = [accept(factory, f"198.51.100.{2 + n % 8}", 6000 + n)[0].end_reason for n in range(64)]
    assert ends.count(None) == 16
    assert switch.refusals == {"pending_group_limit": 48}
    newcomer, _ = accept(factory, "203.0.113.9")
    newcomer.dataReceived(hello_of())
    assert len(switch.peers) == 1
    switch._check_invariants()


def test_attackers_renewing_their_stalled_sockets_never_push_out_a_newcomer():
    """The handshake-stall attack from 8 /24s: 64 silent sockets fill max_pending_handshakes and every evicted
    one reconnects from its group, again and again. A newcomer from a new address is admitted, is never
    the one that gives way, and completes its handshake whenever it sends its hello."""
    switch, factory = clocked_switch()
    by_proto = {}
    for n in range(64):
        host = f"198.51.{n % 8}.{2 + n // 8}"
        by_proto[accept(factory, host, 6000 + n)[0]] = host
    assert switch._admission.pending == 64
    newcomer, _ = accept(factory, "203.0.113.9")
    assert newcomer.end_reason is None
    for round_ in range(40):  # each evicted socket reconnects at once, from its address
        [(gone, host)] = [(p, h) for p, h in by_proto.items() if p.end_reason is not None]
        del by_proto[gone]
        gone.connectionLost(Failure(ConnectionDone()))
        again, _ = accept(factory, host, 7000 + round_)
        assert again.end_reason is None
        by_proto[again] = host
        assert newcomer.end_reason is None
    assert switch.refusals == {"pending_evicted": 41}
    newcomer.dataReceived(hello_of())
    assert len(switch.peers) == 1
    switch._check_invariants()


# -- max_inbound_peers / max_outbound_peers (tests/adapter/test_switch.py): counted -------


def test_peer_limits_are_counted_in_refusals(network, telemetry):
    """A peer over max_inbound_peers is refused with inbound_limit, counted in refusals and logged."""
    switch, _ = listener(network, max_inbound_peers=1)
    connect(network, switch, hello_of())
    raw, _ = connect(network, switch, hello_of())
    assert refused_code(raw)[0] == "inbound_limit"
    assert switch.refusals == {"inbound_limit": 1}
    assert [e["reason"] for e in telemetry.named("peer_rejected")] == ["inbound_limit"]


# -- handshake_timeout -------------------------------------------------------------------


def outbound_connection(config):
    """An outbound MConnectionProtocol over a StringTransport, our hello taken."""
    clock = Clock()
    switch = Switch([RecordingReactor(CHANNELS)], clock=clock, config=config)
    proto = MConnectionFactory(switch, is_outbound=True).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    transport.clear()
    return clock, switch, proto, transport


def test_handshake_timeout_bounds_the_wait_for_the_session_answer():
    """The dialer's handshake ends with the listener's session answer: a listener that
    sends its hello and then nothing is dropped at handshake_timeout, counted from the
    connection, not left to the keepalive."""
    clock, switch, proto, transport = outbound_connection(Config(handshake_timeout=5, ping_interval=60))
    failures = []
    proto.handshake.addErrback(failures.append)
    clock.advance(3)
    proto.dataReceived(hello_of())  # the hello, but no session answer
    assert proto.peer is None
    clock.advance(1.9)
    assert transport.connected and not failures
    clock.advance(0.1)
    assert type(proto.end_reason) is HandshakeTimeout
    assert "no session answer from the listener within handshake_timeout 5" in str(proto.end_reason)
    assert close_packets_in(transport.value())[-1][0] == "HandshakeTimeout"
    assert transport.disconnecting
    proto.connectionLost(Failure(ConnectionDone()))
    [failure] = failures
    assert failure.check(HandshakeTimeout)
    assert switch.peers == {}


def test_an_answered_session_ends_the_handshake_timer():
    """Once the session answer arrives, handshake_timeout no longer applies; the next deadline is the ping."""
    clock, switch, proto, transport = outbound_connection(Config(handshake_timeout=5, ping_interval=60))
    request = proto.session_request
    answer = encode_session_answer(SessionAnswer(session_id=request.session_id, resumed=False, reason=""))
    proto.dataReceived(hello_of() + extension_packet(PacketType.SESSION, answer))
    assert proto.peer is not None
    clock.advance(30)
    assert proto.end_reason is None and proto.core.next_deadline() == 60


# -- pings and the control backlog -------------------------------------------------------


def test_a_peer_that_pings_too_often_is_dropped_naming_the_rate_and_the_limit(telemetry):
    """More than max_pings_per_interval pings in a ping_interval is ControlFlood, naming the rate and the
    limit in the close, the log and remove_peer."""
    h = open_switch_connection(config=Config(ping_interval=10, max_pings_per_interval=5))
    h.clock.advance(1)
    h.feed(bytes([PacketType.PING]) * 5)
    assert parse_packets(h.take()) == [(PacketType.PONG,)] * 5
    h.clock.advance(2)
    h.feed(bytes([PacketType.PING]))
    error = h.proto.end_reason
    assert type(error) is ControlFlood
    assert str(error) == "6 pings within 2.000s, over max_pings_per_interval 5 per ping_interval 10s"
    assert close_packets_in(h.take()) == [("ControlFlood", str(error))]
    [event] = telemetry.named("protocol_error")
    assert event["error_type"] == "ControlFlood"
    h.lose()  # the transport closes after the close packet
    [(peer, reason)] = h.reactor.removed()
    assert reason is error


def test_pings_within_the_limit_in_every_window_are_answered():
    """Pings up to the limit in every window keep the connection open."""
    h = open_switch_connection(config=Config(ping_interval=10, max_pings_per_interval=3))
    for _ in range(5):  # five windows, three pings each
        h.feed(bytes([PacketType.PING]) * 3)
        h.clock.advance(10)
    assert h.proto.end_reason is None


def test_pongs_a_peer_does_not_read_are_bounded():
    """Pongs left unsent past max_control_backlog, because the peer does not read, are ControlFlood."""
    h = open_switch_connection(config=Config(max_control_backlog=3, max_pings_per_interval=100))
    h.proto.pauseProducing()  # the transport is full: the peer does not read
    for _ in range(3):
        h.feed(bytes([PacketType.PING]))
    assert h.proto.end_reason is None
    h.feed(bytes([PacketType.PING]))
    error = h.proto.end_reason
    assert type(error) is ControlFlood
    assert str(error) == "3 control packets queued unsent (the peer does not read them), over max_control_backlog 3"
    assert close_packets_in(h.take()) == [("ControlFlood", str(error))]  # the pongs are dropped


def test_acks_do_not_pile_up_behind_a_peer_that_does_not_read():
    """Acks are cumulative: an unsent one is replaced by the next, so a busy peer that does
    not read ours costs one queued ack, not one per ack_interval."""
    h = open_switch_connection(config=Config(ack_every_messages=1, max_control_backlog=2))
    h.proto.pauseProducing()
    for i in range(10):
        h.feed(msg_packet(0x20, b"m%d" % i))
    assert h.proto.end_reason is None
    h.proto.resumeProducing()
    acks = [p for p in parse_packets(h.take()) if p[0] == PacketType.ACK]
    assert len(acks) == 1
    assert acks[0][1] == bytes.fromhex("01 01 20 01 0a")  # one count: channel 0x20, 10 delivered


# -- size limits before buffering --------------------------------------------------------


@pytest.mark.parametrize(
    "header, limit_name",
    [
        (bytes([PacketType.HELLO]) + encode_uvarint(4097), "max_hello_size 4096"),
        (bytes([PacketType.CLOSE]) + encode_uvarint(1025), "1024"),
        (bytes([0x80]) + encode_uvarint(1025), "1024"),
        (bytes([PacketType.HELLO]) + encode_uvarint(1 << 40), "4096"),
    ],
    ids=["hello", "close", "optional extension", "hello 2^40"],
)
def test_an_oversized_body_is_refused_at_its_header_before_any_byte_is_buffered(header, limit_name):
    """A hello, close or extension body over its limit is PacketTooLarge from its header, nothing buffered."""
    h = open_switch_connection(handshake=False)
    h.feed(header)  # the header only: the body never needs to arrive
    assert type(h.proto.end_reason) is PacketTooLarge
    assert limit_name.split()[-1] in str(h.proto.end_reason)
    assert h.proto.core._buffer.buffered == 0


def test_an_incomplete_body_buffers_at_most_its_limit():
    """A body within its limit is buffered as it arrives, and no more than it."""
    h = open_switch_connection(handshake=False)
    h.feed(bytes([PacketType.HELLO]) + encode_uvarint(4096) + bytes(4000))
    assert h.proto.end_reason is None
    assert h.proto.core._buffer.buffered == 4 + 4000  # 04 02 10 00, then the body so far


# -- what a refusal costs ----------------------------------------------------------------


def retained_bytes(make, count):
    """Bytes still allocated, per item, after ``make()`` ran ``count`` times (kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [make() for _ in range(count)]
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    total = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    del kept
    return total / count


def test_a_refused_connection_costs_under_3_5_kib():
    """Refused in connectionMade, before the Connection core: what stays allocated until
    the transport closes is the protocol object, a close packet, a log event and the
    test's StringTransport itself (about 1.5 KiB in all; no Deferred is made for an
    inbound handshake nobody waits on). An admitted connection, even before it buffered
    anything, costs over 1 KiB more (its Connection: channels, scheduler, frame buffer;
    ~1.35 KiB since its frame buffer shares its limits, Admission adds no callback and its
    timer is an entry in the clock's Timers: bench/history/2026-11-25.md, "Connect storm")."""
    switch = Switch([RecordingReactor(CHANNELS)], clock=Clock(), config=Config(max_connections_per_ip=1))
    factory = MConnectionFactory(switch, is_outbound=False)
    address = IPv4Address("TCP", "198.51.100.7", 5000)

    def accept():
        transport = StringTransport(peerAddress=address)
        proto = factory.buildProtocol(address)
        proto.makeConnection(transport)
        return proto, transport

    accept()  # takes the one slot for that address
    for _ in range(300):  # fill Twisted's buffer of early log events (it keeps 200)
        accept()
    refused = retained_bytes(accept, 500)
    assert switch.refusals["ip_limit"] >= 800
    switch.config = Config(max_connections_per_ip=10_000, max_pending_handshakes=10_000, max_pending_per_group=10_000)
    admitted = retained_bytes(accept, 200)
    print(f"retained per connection: refused {refused:.0f} B, admitted {admitted:.0f} B")
    assert refused < 3584
    assert admitted > refused + 1024
