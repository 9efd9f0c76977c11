"""A misbehaving peer loses its own connection, with a specific error, and nothing else.

Each case connects a scripted raw peer to a Switch that also has a well-behaved peer. The
bad bytes must close only the raw peer's connection, with the specific
RemoteProtocolError subclass: passed to remove_peer when a Peer existed, and always
logged as a protocol_error event and sent back as the close packet's code. The Switch and
the good peer carry on.
"""

import pytest

from helpers import (
    MSG,
    RawPeer,
    RecordingReactor,
    close_packets_in,
    extension_packet,
    hello_packet,
    msg_packet,
    new_node_id,
)
from mconn import (
    ChannelDescriptor,
    Config,
    IncompatiblePeer,
    MalformedPacket,
    MessageTooLarge,
    PacketTooLarge,
    RemoteProtocolError,
    UnexpectedPacket,
    UnknownChannel,
    UnknownPacketType,
)
from mconn.testing import MemoryNetwork
from mconn.core.wire import encode_uvarint

CHANNELS = [ChannelDescriptor(0x20, priority=3), ChannelDescriptor(0x21, recv_message_capacity=100)]
CONFIG = Config(max_packet_payload=1024, max_hello_size=4096)
RAW_ID = new_node_id()
HELLO = hello_packet(RAW_ID, CHANNELS, max_packet_payload=1024)

# (bytes the raw peer sends, the error, whether a Peer existed when it was detected)
CASES = {
    "unknown packet type": (HELLO + b"\x00", UnknownPacketType, True),
    "unknown critical extension type": (HELLO + extension_packet(0x7F, b"\x00"), UnknownPacketType, True),
    "msg before hello": (msg_packet(0x20, b"too early") + HELLO, UnexpectedPacket, False),
    "ping before hello": (b"\x01" + HELLO, UnexpectedPacket, False),
    "second hello": (HELLO + HELLO, UnexpectedPacket, True),
    "unknown channel": (HELLO + msg_packet(0x99, b"where?"), UnknownChannel, True),
    "eof byte 2": (HELLO + bytes([MSG, 0x20, 0x02, 0x01, 0x01]) + b"x", MalformedPacket, True),
    "size byte over 8": (HELLO + bytes([MSG, 0x20, 0x01, 0x09]) + bytes(9), MalformedPacket, True),
    "length over max_packet_payload": (
        HELLO + bytes([MSG, 0x20, 0x01]) + encode_uvarint(1025) + bytes(1025),
        PacketTooLarge,
        True,
    ),
    "message over recv_message_capacity": (
        HELLO + msg_packet(0x21, bytes(80), eof=False) + msg_packet(0x21, bytes(30)),
        MessageTooLarge,
        True,
    ),
    "malformed hello": (extension_packet(0x04, b"\x01\x01not a hello"), MalformedPacket, False),
    "hello with trailing garbage": (
        extension_packet(0x04, HELLO[2 + HELLO[1] :] + b"\xff"),
        MalformedPacket,
        False,
    ),
    "hello too large": (bytes([0x04]) + encode_uvarint(5000) + bytes(5000), PacketTooLarge, False),
    "incompatible version": (hello_packet(RAW_ID, CHANNELS, version=99), IncompatiblePeer, False),
    "malformed close": (HELLO + extension_packet(0x05, b"\x09"), MalformedPacket, True),
}


@pytest.fixture
def world():
    """A Switch with a good peer connected to it."""
    network = MemoryNetwork()
    reactor = RecordingReactor(CHANNELS)
    switch = network.switch([reactor], config=CONFIG)
    good_reactor = RecordingReactor(CHANNELS)
    good = network.switch([good_reactor], config=CONFIG)
    good_link = network.connect(good, switch)
    return network, switch, reactor, good, good_reactor, good_link


@pytest.mark.parametrize("data, error_type, had_peer", CASES.values(), ids=list(CASES))
@pytest.mark.parametrize("one_byte_at_a_time", [False, True], ids=["whole", "bytewise"])
def test_bad_input_drops_only_that_connection(world, telemetry, data, error_type, had_peer, one_byte_at_a_time):
    """Bad bytes, whole or bytewise, close only that connection with the specific error, logged and
    given as the reason; other peers carry on."""
    network, switch, reactor, good, good_reactor, good_link = world
    raw = RawPeer()
    raw_link = network.connect_raw(raw, switch)
    chunks = [data[i : i + 1] for i in range(len(data))] if one_byte_at_a_time else [data]
    for chunk in chunks:
        if raw.lost is None:
            raw.send(chunk)
            network.flush()

    # The raw peer was told why and dropped.
    assert raw.lost is not None
    assert close_packets_in(raw.data)[-1][0] == error_type.__name__
    assert raw_link.inbound not in switch.connections
    # The specific error, as the reason everywhere.
    assert type(raw_link.inbound.end_reason) is error_type
    [event] = telemetry.named("protocol_error")
    assert event["error_type"] == error_type.__name__
    assert event["peer_id"] == (RAW_ID if had_peer else None)
    removed = [(p, r) for p, r in reactor.removed() if p.node_id == RAW_ID]
    if had_peer:
        [(peer, reason)] = removed
        assert type(reason) is error_type and isinstance(reason, RemoteProtocolError)
        assert peer.state == "closed"
    else:
        assert removed == []
    # Everyone else carries on.
    assert list(switch.peers) == [good.node_id]
    assert good_link.peer_of(good).try_send(0x20, b"still fine")
    assert good_link.peer_of(switch).try_send(0x20, b"likewise")
    network.flush()
    assert reactor.received(0x20, good_link.peer_of(switch)) == [b"still fine"]
    assert good_reactor.received(0x20) == [b"likewise"]
    switch._check_invariants()
    good._check_invariants()


def test_messages_before_the_bad_bytes_are_delivered(world):
    """Whole messages that arrived before the violation still reach the reactor."""
    network, switch, reactor, *_ = world
    raw = RawPeer()
    network.connect_raw(raw, switch)
    raw.send(HELLO + msg_packet(0x20, b"good one") + b"\x00")
    network.flush()
    raw_peer = next(p for p, _ in reactor.removed())
    assert reactor.received(0x20, raw_peer) == [b"good one"]
    assert [c[0] for c in reactor.calls if c[0] != "add_peer" or c[1] is raw_peer][-2:] == ["receive", "remove_peer"]


def test_nothing_reaches_the_reactor_after_a_violation(world):
    """Packets after the bad bytes, even in the same read, are never delivered."""
    network, switch, reactor, *_ = world
    raw = RawPeer()
    network.connect_raw(raw, switch)
    raw.send(HELLO + msg_packet(0x99, b"bad") + msg_packet(0x20, b"after"))
    network.flush()
    assert b"after" not in reactor.received(0x20)


def test_optional_extension_packets_are_skipped(world):
    """An unknown extension type >= 0x80 is stepped over, not an error."""
    network, switch, reactor, *_ = world
    raw = RawPeer()
    network.connect_raw(raw, switch)
    raw.send(HELLO + extension_packet(0x80, b"future stuff") + msg_packet(0x20, b"after"))
    network.flush()
    assert raw.lost is None
    assert reactor.received(0x20)[-1:] == [b"after"]
