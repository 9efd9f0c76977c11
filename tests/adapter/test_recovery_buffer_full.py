"""A full recovery buffer refuses a message even when its channel queue has room.

Peer checks the connection's channel queue for room, then takes the message into the
session (``Session.admit``), then into the queue; when the session refuses, the message
is in neither: not sent, not counted, and the sequence numbers of later messages
unchanged (specs/resume.md, the recovery buffer bound).
"""

from helpers import messages_in, open_switch_connection
from mconn import ChannelDescriptor, Config
from mconn.core import wire
from mconn.core.session import MESSAGE_OVERHEAD, Session
from mconn.core.wire import PacketType

CH = 0x21
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=8, recv_message_capacity=8192)]
MESSAGE = 4000


def ack_packet(delivered: dict[int, int]) -> bytes:
    return wire.encode_extension(PacketType.ACK, wire.encode_ack(delivered))


def fill(h) -> list[bytes]:
    """try_send distinct messages until one is refused; the accepted ones."""
    accepted = []
    for i in range(1000):
        message = b"%05d" % i + bytes(MESSAGE - 5)
        if not h.peer.try_send(CH, message):
            return accepted
        accepted.append(message)
    raise AssertionError("the recovery buffer never filled")


def test_refused_message_is_neither_queued_nor_sent_nor_counted():
    """A message refused by a full recovery buffer is not queued, sent or counted; acks make room and the
    next message takes the next number."""
    h = open_switch_connection(channels=CHANNELS, config=Config(recovery_buffer_bytes=10_000))
    accepted = fill(h)
    session = h.peer.session
    # The channel's reserve (64 KiB, over the shared bound of 10,000 bytes) is what it
    # holds, each message counted with its overhead.
    cost = MESSAGE + MESSAGE_OVERHEAD
    assert session.unacked_bytes == len(accepted) * cost
    assert session.unacked_bytes <= 65536 < session.unacked_bytes + cost
    assert session.accepted(CH) == len(accepted)
    core_channel = h.proto.core.channels[CH]
    assert core_channel.queue_depth == 0  # the queue had room: the session refused it
    assert messages_in(h.take()) == [(CH, m) for m in accepted]

    # The peer confirms the first two: room for exactly the next ones, numbered on.
    d = h.peer.send_confirmed(CH, b"after")
    assert not d.called  # no room yet: it waits
    h.feed(ack_packet({CH: 2}))
    assert session.acked(CH) == 2
    assert session.accepted(CH) == len(accepted) + 1
    assert messages_in(h.take()) == [(CH, b"after")]
    h.feed(ack_packet({CH: len(accepted) + 1}))
    assert d.result is True
    assert session.unacked_bytes == 0


def test_admit_refuses_exactly_where_has_room_does_and_records_like_record_sent():
    """Session.admit is has_room + record_sent in one call, for every case of the bound."""

    def fresh() -> Session:
        return Session(
            b"s" * 16,
            [0x20, 0x21],
            recovery_buffer_bytes=1000,
            ack_every_messages=256,
            ack_every_bytes=1 << 20,
            channel_reserve_bytes=300,
        )

    # Each message costs its size plus MESSAGE_OVERHEAD: the bulk one fills the shared
    # bound to 990; 0x21's reserve of 300 then takes 20 + 60 + 28 and refuses 29.
    room = 300 - (20 + MESSAGE_OVERHEAD) - (60 + MESSAGE_OVERHEAD) - MESSAGE_OVERHEAD
    steps = [
        (0x20, 990 - MESSAGE_OVERHEAD),
        (0x20, 20),
        (0x21, 20),
        (0x21, 60),
        (0x21, room + 1),
        (0x21, room),
        (0x20, 10**6),
    ]
    one, two = fresh(), fresh()
    for channel_id, size in steps:
        message = bytes(size)
        expected = one.record_sent(channel_id, message) if one.has_room(channel_id, size) else None
        assert two.admit(channel_id, message) == expected, (channel_id, size)
        assert (two.unacked_bytes, two.accepted(channel_id)) == (one.unacked_bytes, one.accepted(channel_id))
    assert two.unconfirmed() == one.unconfirmed() == {0x20: 1, 0x21: 3}
