"""What a listener's handshake builds once instead of once per peer (bench/history/2026-11-25.md,
"Connect storm": the listener's work once per Switch): the fresh session answer's bytes around the session id
(``handshake.fresh_answer_parts``), the frame buffer's read-only extension limits, the
reasonless session verdicts. Each must give exactly what building it per peer would.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core import wire
from mconn.config import Config
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.handshake import asks_for_session, fresh_answer_parts, hello_packet, make_hello
from mconn.core.session_table import PeerState, decide_hello
from mconn.core.wire import HelloTag, PacketType, SessionAnswer
from tests.helpers_core import NODE_B, make_connection, open_connection


def _declared(session_id: bytes, reason: str) -> bytes:
    answer = SessionAnswer(session_id=session_id, resumed=False, reason=reason)
    return wire.encode_extension(PacketType.SESSION, wire.encode_session_answer(answer))


@settings(max_examples=150, deadline=None)
@given(session_id=st.binary(min_size=16, max_size=16), reason=st.text(max_size=300))
def test_the_fresh_answer_around_any_session_id_is_the_declared_answer(session_id, reason):
    """head + id + tail is the encoded SessionAnswer for any 16-byte id and any reason
    (a reason past 127 bytes changes the length's width: still the same bytes), and it
    decodes back to that answer."""
    head, tail = fresh_answer_parts(reason)
    packet = head + session_id + tail
    assert packet == _declared(session_id, reason)
    body = packet[
        len(packet)
        - len(wire.encode_session_answer(SessionAnswer(session_id=session_id, resumed=False, reason=reason))) :
    ]
    assert wire.decode_session_answer(body) == SessionAnswer(session_id=session_id, resumed=False, reason=reason)


def _outcome(send):
    """What an open connection sends after ``send(conn)``, or the type of what it raised."""
    conn = open_connection()
    try:
        send(conn)
        return conn.data_to_send(0.0)
    except Exception as error:
        return type(error)


def test_a_connection_sends_the_same_bytes_either_way_and_nothing_before_it_is_open():
    """send_fresh_session_answer queues what send_session_answer queues (an id of another
    length goes the general way, and fails the same way); on a connection not open yet
    neither queues anything."""
    session_id = bytes(range(16))
    for reason in ("", "unknown session (expired, or this node restarted)"):
        fast, general = open_connection(), open_connection()
        fast.send_fresh_session_answer(session_id, reason)
        general.send_session_answer(SessionAnswer(session_id=session_id, resumed=False, reason=reason))
        assert fast.data_to_send(0.0) == general.data_to_send(0.0) == _declared(session_id, reason)
    short = b"\x01" * 3
    fast = _outcome(lambda conn: conn.send_fresh_session_answer(short))
    assert fast == _outcome(lambda conn: conn.send_session_answer(SessionAnswer(session_id=short, resumed=False)))
    fresh = make_connection()
    fresh.data_to_send(0.0)  # our hello
    fresh.send_fresh_session_answer(session_id)
    assert fresh.data_to_send(0.0) == b""


def test_a_hello_asks_for_a_session_only_with_the_session_field():
    """asks_for_session finds tag 01 among the fields, and only it."""
    plain = make_hello(node_id=NODE_B, channels=[], max_packet_payload=1024)
    other = make_hello(node_id=NODE_B, channels=[], max_packet_payload=1024, fields=((0x7F, b"x"),))
    asking = make_hello(
        node_id=NODE_B, channels=[], max_packet_payload=1024, fields=((0x7F, b"x"), (HelloTag.SESSION, b"\x00" * 18))
    )
    assert (asks_for_session(plain), asks_for_session(other), asks_for_session(asking)) == (False, False, True)


def test_connections_with_one_config_share_read_only_extension_limits():
    """Two connections with equal sizes share one mapping of their limits
    (hello, ack, session), which nobody can change; a FrameBuffer given a plain dict
    still keeps a copy of its own."""
    config = Config(max_hello_size=3000, max_control_size=900)
    first, second = make_connection(config=config), make_connection(config=config)
    limits = first._buffer.extension_limits
    assert limits is second._buffer.extension_limits
    assert dict(limits) == {PacketType.HELLO: 3000, PacketType.ACK: 900 + 256 * 11, PacketType.SESSION: 900 + 256 * 11}
    try:
        limits[PacketType.HELLO] = 1
    except TypeError:
        pass
    assert limits[PacketType.HELLO] == 3000
    other = make_connection(config=Config(max_hello_size=5000))
    assert other._buffer.extension_limits[PacketType.HELLO] == 5000
    given_limits = {0x81: 20}
    buffer = FrameBuffer(max_payload=10, default_extension_limit=5, extension_limits=given_limits)
    given_limits[0x81] = 1
    assert buffer.extension_limits == {0x81: 20}


def test_reasonless_verdicts_are_shared_and_the_others_are_not():
    """A fresh session without anything held, a probe and a resume are one Verdict each
    (frozen, so shared safely); a verdict with a reason is still its own."""
    fresh = dict(asks_resume=False, proves=False, channel_change="", simultaneous=False)
    assert decide_hello(None, **fresh) is decide_hello(None, **fresh)
    assert decide_hello(PeerState.CONNECTED, **fresh) is decide_hello(PeerState.CONNECTED, **fresh)
    resume = dict(fresh, asks_resume=True, proves=True)
    assert decide_hello(PeerState.SUSPENDED, **resume) is decide_hello(PeerState.CONNECTED, **resume)
    held = decide_hello(PeerState.SUSPENDED, **fresh)
    assert held.reason == "new session" and held.ends is not None


def test_hello_packets_follow_the_hello_whichever_was_encoded_last():
    """hello_packet keeps the last Hello's packet by identity: alternating two hellos (and
    an equal copy of one) gives each its own encoding every time, the same bytes object
    for the same Hello."""
    first = make_hello(node_id=NODE_B, channels=[], max_packet_payload=1024)
    second = make_hello(node_id=NODE_B, channels=[], max_packet_payload=2048, listen_address="127.0.0.1:1")
    copy = make_hello(node_id=NODE_B, channels=[], max_packet_payload=1024)
    expected = {id(h): wire.encode_extension(PacketType.HELLO, wire.encode_hello(h)) for h in (first, second)}
    for hello in (first, second, first, first, second, copy):
        packet = hello_packet(hello)
        assert packet == expected[id(first if hello is copy else hello)]
    assert hello_packet(second) is hello_packet(second)


def test_idle_sessions_over_the_same_channels_share_one_table_until_one_is_used():
    """Two new sessions over the same channel ids share one streams table; the first
    message accepted (or delivered) gives a session its own copy, and the other session
    and the shared table stay idle. Ids given as a list get a table of their own."""
    from mconn.core.session import Session

    def session(ids):
        return Session(b"\x01" * 16, ids, recovery_buffer_bytes=1000, ack_every_messages=2, ack_every_bytes=100)

    first, second, third = session((0x20, 0x30)), session((0x20, 0x30)), session((0x20, 0x30))
    assert first._streams is second._streams is third._streams
    shared = first._streams
    assert first.admit(0x20, b"abc") == 0
    assert first._streams is not shared and first.accepted(0x20) == 1
    assert second.accepted(0x20) == 0 and not second.carried_traffic()
    assert second.record_delivered(0x30, 5) is False
    assert second._streams is not shared and second.delivered(0x30) == 1
    assert third._streams is shared and third.delivered(0x30) == 0 and third.unconfirmed() == {}
    assert session([0x20, 0x30])._streams is not shared


def _hello_body(node_id: str, channels) -> bytes:
    from mconn import ChannelDescriptor

    hello = make_hello(node_id=node_id, channels=[ChannelDescriptor(*c) for c in channels], max_packet_payload=1024)
    return wire.encode_hello(hello)


def test_hellos_announcing_the_same_channels_share_their_channel_infos(monkeypatch):
    """Two peers announcing the same channels get one tuple of (frozen) ChannelInfos, equal
    to a fresh decode's; another list gets its own; a list that breaks a rule raises every
    time (never kept); once CHANNEL_INFOS_KEPT lists are kept, others are decoded each time."""
    monkeypatch.setattr(wire, "_CHANNEL_INFOS", {})
    a = wire.decode_hello(_hello_body("aa" * 20, [(0x20, 1), (0x30, 5)]))
    b = wire.decode_hello(_hello_body("bb" * 20, [(0x20, 1), (0x30, 5)]))
    c = wire.decode_hello(_hello_body("cc" * 20, [(0x20, 2)]))
    assert a.channels is b.channels and a.node_id != b.node_id
    assert [(i.id, i.priority) for i in a.channels] == [(0x20, 1), (0x30, 5)]
    assert c.channels is not a.channels and [(i.id, i.priority) for i in c.channels] == [(0x20, 2)]
    info = wire.ChannelInfo(id=0x20, priority=1, recv_message_capacity=1024)
    twice = wire.encode_hello(
        wire.Hello(version=wire.PROTOCOL_VERSION, node_id="dd" * 20, max_packet_payload=1024, channels=(info, info))
    )
    for _ in range(2):
        with pytest.raises(wire.MalformedPacket, match="lists channel 0x20 twice"):
            wire.decode_hello(twice)
    assert len(wire._CHANNEL_INFOS) == 2
    monkeypatch.setattr(wire, "CHANNEL_INFOS_KEPT", 2)
    d1 = wire.decode_hello(_hello_body("dd" * 20, [(0x40, 1)]))
    d2 = wire.decode_hello(_hello_body("ee" * 20, [(0x40, 1)]))
    assert d1.channels == d2.channels and d1.channels is not d2.channels
    assert len(wire._CHANNEL_INFOS) == 2
