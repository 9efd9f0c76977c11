"""What a held message costs (specs/reactor-api.md section 4.1): the backlog of a busy
channel counts each message's payload plus ``MESSAGE_OVERHEAD``, and the messages
themselves; tracemalloc shows the overhead covers the Python objects a held message
keeps alive, so a bound in bytes is a bound on memory whatever the messages' sizes.
"""

from __future__ import annotations

import collections
import gc
import tracemalloc

import pytest
from twisted.internet.task import Clock

from mconn import ChannelDescriptor, Config
from mconn.switch.peer_delivery import PeerDelivery
from mconn.core.session import MESSAGE_OVERHEAD
from tests.helpers_core import msg, open_connection

CH = 0x20
COUNT = 5_000


class Unread:
    """The Peer a PeerDelivery reads: no session needed for holding, no transport."""

    session = None
    connection = None


class NoReactors:
    """The reactors a PeerDelivery routes to: none are reached while a channel is busy."""

    def route(self, channel_id, peer, message):
        raise AssertionError(f"a held message on channel {channel_id:#04x} reached a reactor")


def read_messages(size: int) -> list[bytes]:
    """``COUNT`` messages of ``size`` bytes as a Connection hands them up from one read."""
    conn = open_connection(channels=[ChannelDescriptor(CH, recv_message_capacity=1 << 20)])
    events = conn.receive_data(b"".join(msg(CH, bytes([7]) * size) for _ in range(COUNT)), 1.0)
    return [event.message for event in events]


@pytest.mark.parametrize("size", [0, 2, 3, 100])
def test_the_overhead_covers_what_a_held_message_costs(size):
    """Holding COUNT messages grows traced memory by at most payload + the overhead each,
    and the backlog counts exactly that cost and COUNT messages."""
    delivery = PeerDelivery(Unread(), reactors=NoReactors(), clock=Clock(), config=Config())
    delivery.busy[CH] = collections.deque()  # the channel is busy
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        messages = read_messages(size)  # traced from their making: the bytes objects count
        for message in messages:
            delivery.deliver(CH, message)
        del messages, message  # what is left is what the backlog holds
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert delivery.backlog_messages == COUNT
    assert delivery.backlog_bytes == COUNT * (size + MESSAGE_OVERHEAD)
    assert grown / COUNT <= size + MESSAGE_OVERHEAD, f"{grown / COUNT:.1f} bytes per held {size}-byte message"


def test_empty_messages_cost_their_overhead():
    """An empty message costs MESSAGE_OVERHEAD, so a stream of them meets the byte
    bound: reactor_backlog_bytes // MESSAGE_OVERHEAD of them at most."""
    delivery = PeerDelivery(Unread(), reactors=NoReactors(), clock=Clock(), config=Config())
    delivery.busy[CH] = collections.deque()
    for _ in range(1000):
        delivery.deliver(CH, b"")
    assert delivery.backlog_bytes == 1000 * MESSAGE_OVERHEAD > 0


def test_the_message_bound_is_a_config_field_checked_like_the_others():
    """reactor_backlog_messages defaults to 4096 and must be a positive integer."""
    assert Config().reactor_backlog_messages == 4096
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"Config.reactor_backlog_messages must be an integer >= 1, got {bad!r}"):
            Config(reactor_backlog_messages=bad)
