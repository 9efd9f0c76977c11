"""MConnectionProtocol over a StringTransport and a Clock: hello, handshake timer, writes, close."""

from twisted.internet.interfaces import IPushProducer
from zope.interface.verify import verifyObject

from helpers import (
    CHANNELS,
    CLOSE,
    HELLO,
    PING,
    PONG,
    close_packet,
    close_packets_in,
    hello_packet,
    messages_in,
    msg_packet,
    open_switch_connection,
    parse_packets,
)
from mconn import Config, ConnectionLost, HandshakeTimeout, PeerClosed
from mconn.core.wire import decode_hello


def test_hello_is_written_on_connection_made():
    """connectionMade writes exactly our hello: node id, channels, max_packet_payload."""
    h = open_switch_connection(handshake=False, config=Config(max_packet_payload=4000))
    [(kind, body)] = parse_packets(h.written_on_connect)
    assert kind == HELLO
    hello = decode_hello(body)
    assert hello.node_id == h.switch.node_id
    assert hello.max_packet_payload == 4000
    assert [(c.id, c.priority, c.recv_message_capacity) for c in hello.channels] == [
        (c.id, c.priority, c.recv_message_capacity) for c in CHANNELS
    ]
    assert h.clock.seconds() == 0  # no timer was needed to get it out


def test_protocol_is_the_transports_streaming_push_producer():
    """connectionMade registers the protocol as the transport's streaming IPushProducer."""
    h = open_switch_connection(handshake=False)
    assert h.transport.producer is h.proto
    assert h.transport.streaming is True
    verifyObject(IPushProducer, h.proto)


def test_handshake_timeout_drops_the_connection():
    """Without a hello within handshake_timeout the connection is closed with HandshakeTimeout."""
    h = open_switch_connection(handshake=False, config=Config(handshake_timeout=5))
    h.clock.advance(4.9)
    assert not h.transport.disconnecting
    h.clock.advance(0.2)
    assert h.transport.disconnecting
    [(code, text)] = close_packets_in(h.take())
    assert code == "HandshakeTimeout"
    assert "5" in text
    h.lose()
    assert isinstance(h.proto.end_reason, HandshakeTimeout)
    assert h.reactor.calls == []  # no Peer ever existed
    assert not h.switch.connections
    h.switch._check_invariants()


def test_handshake_timeout_is_logged_as_a_link_failure(telemetry):
    """The handshake timeout is a link failure: link_failed with no peer id, not a protocol_error,
    and its connection_lost says reason_kind link."""
    h = open_switch_connection(handshake=False, config=Config(handshake_timeout=5))
    h.clock.advance(5)
    h.lose()
    [event] = telemetry.named("link_failed")
    assert event["error_type"] == "HandshakeTimeout"
    assert event["peer_id"] is None
    assert telemetry.named("protocol_error") == []
    [lost] = telemetry.named("connection_lost")
    assert lost["reason_type"] == "HandshakeTimeout" and lost["reason_kind"] == "link"


def test_hello_in_time_cancels_the_handshake_timeout():
    """Once the hello arrived, handshake_timeout passing changes nothing."""
    h = open_switch_connection(config=Config(handshake_timeout=5, ping_interval=60))
    h.clock.advance(30)
    assert not h.transport.disconnecting
    assert h.take() == b""
    assert h.peer.state == "connected"


def test_try_send_writes_synchronously():
    """try_send puts the msg packet on the transport within the same call (no flush timer)."""
    h = open_switch_connection()
    assert h.peer.try_send(0x20, b"hello there")
    assert messages_in(h.transport.value()) == [(0x20, b"hello there")]


def test_send_writes_synchronously():
    """send on an empty queue fires True and writes at once."""
    h = open_switch_connection()
    d = h.peer.send(0x21, b"abc")
    assert messages_in(h.transport.value()) == [(0x21, b"abc")]
    assert d.result is True


def test_large_message_is_cut_into_negotiated_payloads():
    """A message goes out in packets of the smaller max_packet_payload of the two hellos."""
    h = open_switch_connection(config=Config(max_packet_payload=4096), peer_max_packet_payload=1024)
    assert h.peer.try_send(0x21, bytes(range(250)) * 10)
    packets = parse_packets(h.transport.value())
    assert [(p[2], len(p[3])) for p in packets] == [(0, 1024), (0, 1024), (1, 452)]
    assert messages_in(h.transport.value()) == [(0x21, bytes(range(250)) * 10)]


def test_ping_is_answered_with_pong():
    """A ping from the peer is answered with a pong in the same call."""
    h = open_switch_connection()
    h.feed(bytes([PING]))
    assert parse_packets(h.take()) == [(PONG,)]


def test_messages_are_routed_to_the_reactor():
    """Whole messages, even split across reads, reach the reactor's receive."""
    h = open_switch_connection()
    data = msg_packet(0x21, b"hel", eof=False) + msg_packet(0x21, b"lo")
    for i in range(len(data)):
        h.feed(data[i : i + 1])
    assert h.reactor.received(0x21) == [b"hello"]


def test_close_packet_from_peer_ends_with_peer_closed():
    """A close packet makes us disconnect; remove_peer gets PeerClosed with its code and text."""
    h = open_switch_connection()
    peer = h.peer
    h.feed(close_packet("shutdown", "bye"))
    assert h.transport.disconnecting
    h.lose()
    [(removed, reason)] = h.reactor.removed()
    assert removed is peer
    assert isinstance(reason, PeerClosed)
    assert (reason.code, reason.text) == ("shutdown", "bye")
    assert peer.state == "closed"
    assert h.switch.peers == {}
    h.switch._check_invariants()


def test_transport_loss_without_close_is_connection_lost():
    """When the transport goes away without a close packet and resume is off, remove_peer
    gets ConnectionLost (with resume on, the session is suspended: tests/integration/test_resume.py)."""
    h = open_switch_connection(config=Config(resume_grace=0))
    peer = h.peer
    h.lose()
    [(removed, reason)] = h.reactor.removed()
    assert removed is peer and isinstance(reason, ConnectionLost)


def test_peer_close_writes_close_packet_and_disconnects():
    """peer.close sends a close packet with code 'closed' and loses the connection."""
    h = open_switch_connection()
    h.peer.close("done here")
    [(code, text)] = close_packets_in(h.take())
    assert code == "closed"
    assert "done here" in text
    assert h.transport.disconnecting


def test_close_linger_aborts_a_transport_that_does_not_go_away():
    """After a close packet the transport is aborted if it has not gone within the linger time."""
    h = open_switch_connection()
    h.peer.close()
    assert not h.transport.disconnected
    h.clock.advance(10)
    assert h.transport.disconnected  # abortConnection was called


def test_hello_and_message_in_one_read():
    """A hello and a message in the same read both take effect, in order."""
    h = open_switch_connection(handshake=False)
    h.feed(hello_packet(h.peer_node_id, CHANNELS) + msg_packet(0x20, b"first"))
    assert [c[0] for c in h.reactor.calls] == ["add_peer", "receive"]
    assert h.reactor.received(0x20) == [b"first"]
    assert CLOSE not in [p[0] for p in parse_packets(h.take())]
