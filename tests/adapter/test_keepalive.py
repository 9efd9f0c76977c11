"""Keepalive over a StringTransport and a Clock (specs/connection.md section 3).

After ping_interval with nothing received a ping goes out; if nothing at all arrives
within pong_timeout after it, the connection fails with PongTimeout. Only received bytes
prove the peer alive: our own outgoing traffic does not.
"""

import pytest
from twisted.logger import formatEvent

from helpers import PING, PONG, close_packets_in, msg_packet, open_switch_connection, parse_packets
from mconn import Config, PongTimeout
from mconn.core.wire import PacketType

CONFIG = Config(ping_interval=10, pong_timeout=4)


def test_ping_after_ping_interval_of_silence():
    """Nothing is sent before ping_interval; then exactly one ping."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(9.9)
    assert h.take() == b""
    h.clock.advance(0.1)
    assert parse_packets(h.take()) == [(PING,)]
    h.clock.advance(3.9)
    assert h.take() == b""  # one ping per silence, not one per timer


def test_pong_timeout_suspends_the_session_when_resume_is_on():
    """With resume_grace, a pong timeout is a break, not an end: the session is suspended."""
    h = open_switch_connection(config=CONFIG)
    peer = h.peer
    h.clock.advance(10)
    h.clock.advance(4)
    assert h.transport.disconnecting
    h.lose()
    assert h.reactor.removed() == [] and peer.state == "suspended"
    h.clock.advance(CONFIG.resume_grace)
    [(removed, reason)] = h.reactor.removed()
    assert removed is peer and type(reason).__name__ == "SessionExpired"


def test_pong_timeout_drops_the_connection():
    """No byte within pong_timeout after the ping: disconnect without a close packet (the
    peer is presumed gone; if only our direction failed, a close would end its session
    instead of letting it resume), remove_peer (resume disabled: the session ends with
    the connection)."""
    h = open_switch_connection(config=CONFIG.replace(resume_grace=0))
    peer = h.peer
    h.clock.advance(10)
    h.take()
    h.clock.advance(3.9)
    assert not h.transport.disconnecting
    h.clock.advance(0.1)
    assert h.transport.disconnecting
    assert close_packets_in(h.take()) == []
    h.lose()
    [(removed, reason)] = h.reactor.removed()
    assert removed is peer
    assert type(reason) is PongTimeout
    assert "pong_timeout 4" in str(reason)
    h.switch._check_invariants()


def test_pong_timeout_is_logged(telemetry):
    """A pong timeout is a link failure, logged at info as link_failed naming the peer, never as
    the peer's protocol_error."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(10)
    h.clock.advance(4)
    [event] = telemetry.named("link_failed")
    assert event["error_type"] == "PongTimeout"
    assert event["peer_id"] == h.peer_node_id
    assert event["log_level"].name == "info"
    assert formatEvent(event).startswith(f"{h.switch.node_id} link to {h.peer_node_id} at ")
    assert " failed: PongTimeout: nothing received within pong_timeout 4" in formatEvent(event)
    assert telemetry.named("protocol_error") == []


def test_pong_cancels_the_pong_timeout_and_measures_round_trip():
    """A pong after our ping keeps the connection and sets peer.round_trip."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(10)
    h.clock.advance(1.5)
    h.feed(bytes([PONG]))
    assert h.peer.round_trip == 1.5
    h.clock.advance(4)
    assert not h.transport.disconnecting


def test_a_pong_rearms_the_timer_at_once():
    """The pong ends the wait for it: the timer, armed at the pong deadline (ping +
    pong_timeout), is re-armed at ping_interval after the pong instead of firing at that
    deadline for nothing. An idle link costs one timer run per ping_interval."""
    h = open_switch_connection(config=CONFIG)
    runs = []
    handle_timeout = h.proto.core.handle_timeout
    h.proto.core.handle_timeout = lambda now: (runs.append(now), handle_timeout(now))[1]
    h.clock.advance(10)
    assert parse_packets(h.take()) == [(PING,)] and runs == [10]
    h.clock.advance(1.5)
    h.feed(bytes([PONG]))
    h.clock.advance(4)  # past the ping's pong deadline (14): nothing to run
    assert runs == [10]
    h.clock.advance(5.99)
    assert h.take() == b"" and runs == [10]
    h.clock.advance(0.01)  # ping_interval after the pong: the next ping, in one run
    assert parse_packets(h.take()) == [(PING,)] and runs == [10, pytest.approx(21.5)]
    assert not h.transport.disconnecting


def test_a_late_ping_goes_out_at_once_and_only_a_late_verdict_is_a_stall(telemetry):
    """A timer that fires late (our event loop stalled) with a ping due sends the ping at
    once: a ping is no verdict, nothing is logged. One late with the pong overdue gives
    the verdict one more loop turn and logs ``loop_stalled`` (specs/connection.md
    section 3)."""
    h = open_switch_connection(config=CONFIG)
    timer_runs = []
    handle_timeout = h.proto.core.handle_timeout
    h.proto.core.handle_timeout = lambda now: (timer_runs.append(now), handle_timeout(now))[1]
    h.clock.advance(10.5)  # the ping was due at 10
    assert parse_packets(h.take()) == [(PING,)] and timer_runs == [10.5]
    assert telemetry.named("loop_stalled") == []
    h.clock.advance(5)  # its pong was due at 14.5: the verdict, 1 s late, waits a turn
    [stall] = telemetry.named("loop_stalled")
    assert stall["late"] == pytest.approx(1.0)
    assert h.transport.disconnecting and timer_runs == [10.5, 15.5]


def test_any_received_bytes_cancel_the_pong_timeout():
    """Any received packet, not only a pong, proves the peer alive."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(10)
    h.take()
    h.clock.advance(3)
    h.feed(msg_packet(0x20, b"still here"))
    h.clock.advance(3)  # past the ping's pong deadline (14)
    assert not h.transport.disconnecting
    # Only the ack of the delivered message went out (specs/resume.md): no ping, no close.
    assert [p[0] for p in parse_packets(h.take())] == [PacketType.ACK]
    h.clock.advance(7)  # 10 s after the message: the next ping
    assert parse_packets(h.take()) == [(PING,)]
    assert h.reactor.received(0x20) == [b"still here"]


def test_received_bytes_postpone_the_ping():
    """Each received byte restarts the ping_interval countdown."""
    h = open_switch_connection(config=CONFIG)
    for _ in range(5):
        h.clock.advance(9)
        h.feed(bytes([PING]))
        assert parse_packets(h.take()) == [(PONG,)]  # answers, but never pings
    assert not h.transport.disconnecting


def test_outgoing_traffic_does_not_postpone_the_ping():
    """Sending every second does not delay the ping: only received bytes count."""
    h = open_switch_connection(config=CONFIG)
    for _ in range(9):
        h.clock.advance(1)
        assert h.peer.try_send(0x21, b"chatter")
    h.take()
    h.clock.advance(1)
    assert parse_packets(h.take()) == [(PING,)]


def test_outgoing_traffic_does_not_prevent_the_pong_timeout():
    """A peer that only receives from us, and sends nothing, is dropped after the ping."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(10)
    for _ in range(4):
        assert not h.transport.disconnecting
        assert h.peer.try_send(0x21, b"chatter")
        h.clock.advance(1)
    assert h.transport.disconnecting
    assert close_packets_in(h.take()) == []


def test_pong_is_sent_before_queued_data():
    """A pong goes out ahead of data already waiting in the queues."""
    h = open_switch_connection(config=CONFIG)
    h.proto.pauseProducing()
    assert h.peer.try_send(0x20, b"queued")
    h.feed(bytes([PING]))
    h.proto.resumeProducing()
    packets = parse_packets(h.take())
    assert packets[0] == (PONG,)
    assert packets[1][3] == b"queued"


def test_even_an_incomplete_packet_proves_the_peer_alive():
    """The first byte of a packet still in flight cancels the pong timeout."""
    h = open_switch_connection(config=CONFIG)
    h.clock.advance(10)
    h.clock.advance(3)
    data = msg_packet(0x21, b"slow link")
    h.feed(data[:1])
    h.clock.advance(2)  # past the pong deadline (14)
    assert not h.transport.disconnecting
    h.feed(data[1:])
    assert h.reactor.received(0x21) == [b"slow link"]


def test_a_probe_arms_its_pong_deadline():
    """A probe (the stats tick's, a duplicate connection's: ``MConnectionProtocol.probe``)
    that goes unanswered ends the connection pong_timeout after it, not at the keepalive
    timer ping_interval after the last bytes received (here 10 s, 5 s later)."""
    h = open_switch_connection(config=CONFIG.replace(resume_grace=0))
    peer = h.peer
    h.clock.advance(1)
    assert h.proto.probe() == 1
    assert parse_packets(h.take()) == [(PING,)]
    h.clock.advance(3.9)
    assert not h.transport.disconnecting
    h.clock.advance(0.1)
    assert h.transport.disconnecting
    h.lose()
    [(removed, reason)] = h.reactor.removed()
    assert removed is peer and type(reason) is PongTimeout
