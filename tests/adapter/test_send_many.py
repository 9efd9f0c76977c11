"""``Peer.try_send_many`` checks once per batch what does not depend on the message
(the per-message cost of a batch); what it accepts and refuses must stay what ``try_send``
one message at a time would (specs/reactor-api.md 5.1.1).
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import messages_in, open_switch_connection
from mconn import ChannelDescriptor, Config

CH = 0x21
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=3, recv_message_capacity=4096)]


@pytest.mark.parametrize("capacity", [3, 40])
def test_a_batch_accepts_what_try_send_one_at_a_time_accepts(capacity):
    """Once the recovery buffer is full (nothing is acknowledged here), a batch is taken
    up to the message that does not fit, in order, with writes whenever the queue runs
    full (capacity 3), or after Session.admit_many refused the whole list (capacity 40),
    and the refused ones are neither queued nor kept."""
    channels = [ChannelDescriptor(CH, send_queue_capacity=capacity, recv_message_capacity=4096)]
    config = Config(recovery_buffer_bytes=1000)  # so the channel's 64 KiB reserve decides
    one, many = (open_switch_connection(channels=channels, config=config) for _ in range(2))
    messages = [bytes([i]) * 4000 for i in range(20)]
    taken = 0
    while taken < len(messages) and one.peer.try_send(CH, messages[taken]):
        taken += 1
    assert many.peer.try_send_many(CH, messages) == taken == 16  # 16 x 4000 <= 65536
    assert messages_in(many.take()) == messages_in(one.take()) == [(CH, m) for m in messages[:16]]
    assert many.peer.session.accepted(CH) == one.peer.session.accepted(CH) == 16


def test_an_oversized_message_raises_after_the_ones_before_it_are_taken():
    """The size check is per message: the error names the sizes, and the messages
    before it stay accepted (and go out with the next write)."""
    h = open_switch_connection(channels=CHANNELS)
    with pytest.raises(ValueError, match="5000 bytes on channel 0x21 .* 4096"):
        h.peer.try_send_many(CH, [b"a", b"b", bytes(5000), b"c"])
    assert h.peer.session.accepted(CH) == 2
    h.peer.try_send(CH, b"d")
    assert [m for _, m in messages_in(h.take())] == [b"a", b"b", b"d"]


def test_a_batch_never_overtakes_a_waiting_send_and_takes_nothing_once_closed():
    """A ``send`` waiting for room in the recovery buffer is not overtaken by a smaller
    message that would fit, and a batch on a closed session takes nothing."""
    h = open_switch_connection(channels=CHANNELS, config=Config(recovery_buffer_bytes=1000, send_timeout=5))
    assert h.peer.try_send_many(CH, [bytes(4000)] * 16) == 16  # the 64 KiB reserve is full
    waiting = h.peer.send(CH, bytes(4000))
    assert not waiting.called
    assert h.peer.try_send(CH, b"x") is False  # what try_send does ...
    assert h.peer.try_send_many(CH, [b"x"]) == 0  # ... and so the batch, though one byte would fit
    h.peer.close("done")
    assert h.peer.try_send_many(CH, [b"late"]) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=30),
    capacity=st.integers(1, 40),
    recovery=st.integers(1, 40_000),
    paused=st.booleans(),
)
def test_a_batch_is_try_send_one_at_a_time(sizes, capacity, recovery, paused):
    """Whatever the batch, the queue's capacity, the recovery buffer's bound and whether
    the transport is paused, try_send_many accepts the messages try_send accepts one at
    a time, keeps the same session state, and writes the same bytes (in one step when the
    whole list fits: Session.admit_many)."""
    channels = [ChannelDescriptor(CH, send_queue_capacity=capacity, recv_message_capacity=4096)]
    config = Config(recovery_buffer_bytes=recovery)
    one, many = (open_switch_connection(channels=channels, config=config) for _ in range(2))
    if paused:
        one.proto.pauseProducing()
        many.proto.pauseProducing()
    messages = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    taken = 0
    while taken < len(messages) and one.peer.try_send(CH, messages[taken]):
        taken += 1
    assert many.peer.try_send_many(CH, messages) == taken
    assert many.peer.session.accepted(CH) == one.peer.session.accepted(CH) == taken
    assert many.peer.session.unacked_bytes == one.peer.session.unacked_bytes
    if paused:
        one.proto.resumeProducing()
        many.proto.resumeProducing()
    assert messages_in(many.take()) == messages_in(one.take())
