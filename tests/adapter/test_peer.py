"""Peer.send and Peer.try_send (specs/reactor-api.md section 5), over a StringTransport.

``send`` fires True once the message is queued, False after send_timeout with the queue
still full or when the peer goes away; waiting sends are FIFO per channel, and try_send
never overtakes them. Both return False for a channel the peer did not announce and raise
ValueError for a message larger than the channel's recv_message_capacity.
"""

import pytest

from helpers import (
    AutoPausingTransport,
    close_packet,
    close_packets_in,
    messages_in,
    msg_packet,
    open_switch_connection,
)
from mconn import ChannelDescriptor, Config, ConnectionClosed

# 0x20 capacity 1 (both sides), 0x21 capacity 2 with recv_message_capacity 4096 (both
# sides); 0x22 is only ours, 0x23 only the peer's.
OURS = [
    ChannelDescriptor(0x20, send_queue_capacity=1),
    ChannelDescriptor(0x21, send_queue_capacity=2, recv_message_capacity=4096),
    ChannelDescriptor(0x22),
]
THEIRS = [
    ChannelDescriptor(0x20),
    ChannelDescriptor(0x21, recv_message_capacity=8192),
    ChannelDescriptor(0x23),
]


def connection(**kwargs):
    kwargs.setdefault("config", Config(send_timeout=5))
    return open_switch_connection(channels=OURS, peer_channels=THEIRS, **kwargs)


def paused_and_full(h, channel_id=0x20):
    """Pause the protocol and fill ``channel_id``'s queue."""
    h.proto.pauseProducing()
    while h.peer.try_send(channel_id, b"filler"):
        pass


def test_send_fires_true_when_queued():
    """With room in the queue, send has fired True by the time it returns."""
    h = connection()
    d = h.peer.send(0x20, b"m")
    assert d.called and d.result is True


def test_send_waits_and_fires_true_when_room_appears():
    """A send on a full queue waits, then fires True once the queue drains."""
    h = connection()
    paused_and_full(h)
    d = h.peer.send(0x20, b"waited")
    h.clock.advance(4.9)
    assert not d.called
    h.proto.resumeProducing()
    assert d.result is True


def test_send_fires_false_after_send_timeout():
    """When the queue stays full for send_timeout, send fires False and nothing is sent."""
    h = connection()
    paused_and_full(h)
    d = h.peer.send(0x20, b"never")
    h.clock.advance(4.9)
    assert not d.called
    h.clock.advance(0.1)
    assert d.result is False
    h.proto.resumeProducing()
    assert b"never" not in [m for _, m in messages_in(h.take())]


def test_send_fires_false_when_the_peer_goes_away():
    """A waiting send fires False when the connection is lost and the session with it."""
    h = connection(config=Config(send_timeout=5, resume_grace=0))
    paused_and_full(h)
    d = h.peer.send(0x20, b"orphan")
    h.lose()
    assert d.result is False
    assert h.clock.getDelayedCalls() == []  # the send_timeout timer was cancelled too


def test_waiting_sends_are_fifo():
    """Waiting sends on one channel are queued in the order send was called."""
    h = connection()
    paused_and_full(h, 0x21)
    results = []
    for name in (b"w1", b"w2", b"w3"):
        h.peer.send(0x21, name).addCallback(lambda ok, name=name: results.append((name, ok)))
    for _ in range(10):
        h.proto.resumeProducing()
        h.proto.pauseProducing()
    h.proto.resumeProducing()
    assert results == [(b"w1", True), (b"w2", True), (b"w3", True)]
    sent = [m for ch, m in messages_in(h.take()) if ch == 0x21]
    assert sent[-3:] == [b"w1", b"w2", b"w3"]


def test_try_send_never_overtakes_a_waiting_send():
    """While a send waits on a channel, try_send on it returns False even if room appeared."""
    h = connection()
    paused_and_full(h)
    d = h.peer.send(0x20, b"first in line")
    assert h.peer.try_send(0x20, b"queue jumper") is False
    h.proto.resumeProducing()
    assert d.result is True
    h.proto.resumeProducing()  # writes what the first resume moved into the queue
    assert [m for ch, m in messages_in(h.take()) if ch == 0x20][-1] == b"first in line"


def test_try_send_on_another_channel_is_not_blocked_by_waiting_sends():
    """Waiting sends hold back only their own channel."""
    h = connection()
    paused_and_full(h, 0x20)
    h.peer.send(0x20, b"waiting")
    assert h.peer.try_send(0x21, b"other channel")


@pytest.mark.parametrize("channel_id", [0x22, 0x23, 0x99])
def test_unannounced_channel_returns_false(channel_id):
    """A channel that we or the peer lack: try_send returns False, send fires False at once."""
    h = connection()
    assert h.peer.try_send(channel_id, b"x") is False
    d = h.peer.send(channel_id, b"x")
    assert d.called and d.result is False
    assert h.take() == b""


def test_message_larger_than_recv_message_capacity_raises():
    """A message over the smaller recv_message_capacity of the two sides raises ValueError."""
    h = connection()
    assert h.peer.try_send(0x21, b"x" * 4096)
    with pytest.raises(ValueError, match="4097 bytes.*0x21.*4096"):
        h.peer.try_send(0x21, b"x" * 4097)
    with pytest.raises(ValueError, match="recv_message_capacity"):
        h.peer.send(0x21, b"x" * 5000)


def test_messages_must_be_bytes():
    """A str message is a TypeError, not silently encoded."""
    h = connection()
    with pytest.raises(TypeError):
        h.peer.try_send(0x20, "text")


def test_send_and_try_send_return_false_after_close():
    """Once peer.close was called, sending returns False; it does not raise."""
    h = connection()
    h.peer.close()
    assert h.peer.try_send(0x20, b"late") is False
    d = h.peer.send(0x20, b"late")
    assert d.called and d.result is False


def test_close_with_waiting_sends():
    """peer.close with a send waiting neither raises nor sends it; the send fires False."""
    h = connection()
    paused_and_full(h)
    d = h.peer.send(0x20, b"waiting")
    h.peer.close()
    assert close_packets_in(h.take())[-1][0] == "closed"
    h.lose()
    assert d.result is False
    [(peer, reason)] = h.reactor.removed()
    assert isinstance(reason, ConnectionClosed) and reason.code == "closed"


@pytest.mark.parametrize("ending", [b"\x00", close_packet("shutdown")], ids=["protocol error", "close packet"])
def test_connection_ending_while_a_send_waits(ending):
    """Bad bytes or a close packet read while a send waits: dataReceived does not raise,
    the connection ends, and the send fires False."""
    h = connection()
    paused_and_full(h)
    d = h.peer.send(0x20, b"waiting")
    h.feed(ending)
    assert h.transport.disconnecting
    h.lose()
    assert d.result is False


def test_reply_to_a_message_that_arrived_with_a_close_packet():
    """A reactor replying to the peer's last message, read together with its close packet,
    gets False from try_send rather than an exception."""
    h = connection()
    replies = []
    h.reactor.on_receive = lambda channel_id, peer, message: replies.append(peer.try_send(channel_id, b"reply"))
    h.feed(msg_packet(0x20, b"last words") + close_packet("shutdown", "bye"))
    assert replies == [False]


def test_waiting_send_callback_may_send_on_another_channel():
    """A send made from another send's callback, on a channel with no waiting sends yet, works.

    The second send has to wait (its queue is full) while waiting sends of the first
    channel are being moved into their queue; that must not break the loop moving them.
    """
    transport = AutoPausingTransport(limit=0)  # pauses the producer after every write
    h = open_switch_connection(
        channels=OURS, peer_channels=THEIRS, transport=transport, config=Config(write_batch_bytes=1)
    )
    assert transport.producerState == "paused"
    assert h.peer.try_send(0x20, b"a1")
    assert h.peer.try_send(0x21, b"b1")
    assert h.peer.try_send(0x21, b"b2")
    chained = []
    h.peer.send(0x20, b"a2").addCallback(lambda ok: chained.append(h.peer.send(0x21, b"b3")))
    data = transport.drain()  # writes a1, pauses again, then moves a2 into the queue
    assert len(chained) == 1
    for _ in range(10):
        data += transport.drain()
    data += transport.value()
    assert chained[0].result is True
    got = messages_in(data)
    assert [m for ch, m in got if ch == 0x20] == [b"a1", b"a2"]
    assert [m for ch, m in got if ch == 0x21] == [b"b1", b"b2", b"b3"]


def test_sends_between_a_keepalive_failure_and_the_suspension_are_held_for_the_resume():
    """From the moment the transport fails (here a pong timeout, before connectionLost has
    come) until the session is suspended, send and try_send accept messages into the
    session as while suspended; after the break they are the session's unconfirmed
    messages, to be re-sent on resume, and the session is suspended, not ended."""
    h = connection(config=Config(send_timeout=5, ping_interval=10, pong_timeout=5))
    peer = h.peer
    h.clock.advance(10)  # a ping goes out
    h.clock.advance(5)  # no answer: PongTimeout; the transport is told to go, but is not gone yet
    assert type(h.proto.end_reason).__name__ == "PongTimeout" and peer.state == "connected"
    assert peer.try_send(0x20, b"during the failure") is True
    d = peer.send(0x21, b"also during the failure")
    assert d.called and d.result is True
    assert messages_in(h.take()) == []  # nothing more goes out on the failing connection
    h.lose()
    assert peer.state == "suspended"
    assert peer.stats.unconfirmed == {0x20: 1, 0x21: 1}
    assert h.reactor.removed() == []


def test_sends_after_a_close_received_are_refused():
    """A close packet means the session ends: sends while the connection goes are refused."""
    h = connection()
    h.feed(close_packet("closed"))
    assert h.peer.try_send(0x20, b"late") is False


def test_try_send_many_accepts_a_prefix_and_writes_them_in_one_pump():
    """try_send_many takes messages in order until one does not fit, pumps once for all of
    them (the queue refilled after a pump when it runs full), and returns how many were
    accepted; they go out in order, exactly as try_send would send them."""
    h = connection()
    messages = [b"m%d" % i for i in range(10)]
    assert h.peer.try_send_many(0x21, messages) == 10  # capacity 2: pumped when full
    assert [m for c, m in messages_in(h.take())] == messages
    h.proto.pauseProducing()
    assert h.peer.try_send_many(0x21, [b"a", b"b", b"c"]) == 2  # paused: only the queue's room
    assert h.peer.try_send_many(0x22, [b"x"]) == 0  # a channel the peer lacks
    h.proto.resumeProducing()
    assert [m for c, m in messages_in(h.take())] == [b"a", b"b"]
