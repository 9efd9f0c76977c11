"""A Switch paces what it sends a peer at the recv_rate the peer's hello announces
(specs/connection.md section 5), on a task.Clock over a StringTransport.

The adapter re-arms its timer for the pace, which the peer's hello may set when our own
Config has no send_rate: without that, data would wait for the keepalive timer.
"""

from __future__ import annotations

from mconn import ChannelDescriptor, Config
from mconn.core import wire
from mconn.core.handshake import make_hello, recv_rate_field
from mconn.core.packet_size import payload_for_pace
from mconn.core.wire import PacketType
from tests.helpers import messages_in, new_node_id, open_switch_connection

VOTE, PART = 0x20, 0x21
CHANNELS = [
    ChannelDescriptor(VOTE, priority=10, send_queue_capacity=8),
    ChannelDescriptor(PART, priority=1, send_queue_capacity=8),
]


def announcing(rate: int) -> bytes:
    hello = make_hello(
        node_id=new_node_id(), channels=CHANNELS, max_packet_payload=65536, fields=(recv_rate_field(rate),)
    )
    return wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))


def flooded(rate: int):
    """A Switch without send_rate, open with a peer announcing ``rate``; its block-part
    channel kept full on every clock step; the bytes it wrote after its hello, with times."""
    h = open_switch_connection(channels=CHANNELS, config=Config(), handshake=False)
    h.feed(announcing(rate))
    assert h.peer is not None
    h.take()
    log: list[tuple[float, bytes]] = []
    write = h.transport.write

    def logging_write(data):
        log.append((h.clock.seconds(), bytes(data)))
        write(data)

    h.transport.write = logging_write
    return h, log


def fill(h) -> None:
    while h.peer.try_send(PART, b"p" * 65536):
        pass


def test_the_switch_sends_at_the_announced_rate_and_no_faster():
    """Over 5 s in 1 ms steps, what was written is within rate * t (plus a burst and a
    packet) at every step, and reaches the rate: the timer follows the pace."""
    rate = 200_000
    h, log = flooded(rate)
    start = h.clock.seconds()
    bound = max(rate * 0.01, 2068) + payload_for_pace(rate) + 8 + 200  # a burst, a packet, an ack
    for _ in range(5000):
        fill(h)
        h.clock.advance(0.001)
        written = sum(len(data) for _, data in log)
        assert written <= rate * (h.clock.seconds() - start) + bound
    assert written >= rate * 5 - bound


def test_a_vote_overtakes_the_paced_flood():
    """A vote sent into the paced flood is written within one packet's time at the pace,
    ahead of the block parts still queued."""
    rate = 1_000_000
    h, log = flooded(rate)
    for _ in range(500):
        fill(h)
        h.clock.advance(0.001)
    assert h.peer.try_send(VOTE, b"v" * 100)
    sent_at = h.clock.seconds()
    for _ in range(100):
        if any(VOTE == channel for t, data in log if t >= sent_at for channel, _ in messages_in(data)):
            break
        h.clock.advance(0.0005)
    assert h.clock.seconds() - sent_at <= (payload_for_pace(rate) + 8) / rate + 0.001
    assert h.proto.core.wants_to_send()  # block parts still wait in the scheduler
