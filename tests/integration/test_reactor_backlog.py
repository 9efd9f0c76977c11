"""The reactor backlog on every transport (specs/reactor-api.md section 4.1): a peer
whose messages wait for a busy channel is read no further once they reach
``reactor_backlog_messages`` or cost ``reactor_backlog_bytes`` (payload plus
``MESSAGE_OVERHEAD`` each), whatever their size: 2-byte and empty messages too.

A raw peer (tests/integration/raw_transports.py) gets its session, then writes a stream
of tiny msg packets at once to a channel whose reactor's first ``receive`` returns a
Deferred that has not fired. The listener holds what it read, up to the bound plus what
the read that crossed it completed, and stops reading: the rest waits in the sender's
buffers and the kernel, and the held count stays put. Once the Deferred fires, every
message is delivered once and in order. Every wait is bounded; every Switch stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from helpers import sleep, stop_switches, until
from mconn import ChannelDescriptor, Config, Reactor
from mconn.core.session import MESSAGE_OVERHEAD
from mconn.core.wire import PacketType, encode_packet
from tests.integration.raw_transports import CELL_IDS, CELLS, Cell, dialer_hello_announcing

pytestmark = pytest.mark.integration

CH = 0x20
#: The most messages one read completes past the bound: a read is at most 64 KiB (Twisted's
#: TCP read size; TLS and WebSocket hand up no more than one read's payload), and the
#: smallest msg packet, an empty message, is 4 bytes.
ONE_READ = 65536 // 4
BASE = Config(stats_interval=0, handshake_timeout=5.0, ws_handshake_timeout=5.0)


class BusyOnce(Reactor):
    """Records every message; its first ``receive`` returns ``pending``, unfired."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.pending: Deferred | None = None

    def get_channels(self):
        return [ChannelDescriptor(CH, recv_message_capacity=1024)]

    def receive(self, channel_id, peer, message):
        self.received.append(message)
        if self.pending is None:
            self.pending = Deferred()
            return self.pending
        return None


def stream_of(messages: list[bytes]) -> bytes:
    return b"".join(encode_packet(PacketType.MSG, channel_id=CH, eof=True, data=m) for m in messages)


#: Two-byte messages numbered in order, each followed by an empty one.
PAIRS = [m for i in range(40_000) for m in (i.to_bytes(2, "big"), b"")]
#: Empty messages only: they cost nothing but their overhead.
EMPTY = [b""] * 80_000
CASES = {
    # The message count is the bound that holds (4,000 held cost 264 KB, under 1 MiB).
    "count": (PAIRS, BASE.replace(reactor_backlog_messages=4000)),
    # The cost is the bound that holds: 512 empty messages cost 32 KiB.
    "cost": (EMPTY, BASE.replace(reactor_backlog_bytes=32768, reactor_backlog_messages=1_000_000)),
}


async def held_steady(delivery, what: str) -> int:
    """Wait until the held count has not moved for a while; return it."""
    last = -1
    for _ in range(50):
        if delivery.backlog_messages == last:
            return last
        last = delivery.backlog_messages
        await sleep(0.1)
    raise AssertionError(f"{what}: the held count never settled ({last})")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("transport, host", CELLS, ids=CELL_IDS)
@pytest_twisted.ensureDeferred
async def test_tiny_messages_to_a_busy_channel_stop_reading_at_the_bound(transport, host, case):
    """Held messages stop at the bound (plus one read), reading stops, the sender's
    messages wait on its side; after the Deferred fires all arrive once, in order."""
    messages, config = CASES[case]
    reactor = BusyOnce()
    cell = await Cell(transport, host, [reactor], config).listen()
    try:
        raw, node_id = await cell.raw_peer(lambda node_id: dialer_hello_announcing(node_id))
        await until(lambda: cell.switch.peers.get(node_id) is not None, "the session")
        peer = cell.switch.peers[node_id]
        raw.send(stream_of(messages))
        await until(lambda: peer._protocol._backlogged, "reading to stop")
        delivery = peer._delivery
        held = await held_steady(delivery, f"{transport} {case}")
        bound_messages, bound_bytes = config.reactor_backlog_messages, config.reactor_backlog_bytes
        assert held == sum(len(backlog) for backlog in delivery.busy.values())
        assert held >= bound_messages or delivery.backlog_bytes >= bound_bytes
        assert held <= min(bound_messages, bound_bytes // MESSAGE_OVERHEAD) + ONE_READ, held
        assert delivery.backlog_bytes <= bound_bytes + ONE_READ * (MESSAGE_OVERHEAD + 2)
        assert len(reactor.received) == 1 and 1 + held < len(messages)  # the rest was not read
        assert peer._protocol._backlogged and raw.lost is None

        reactor.pending.callback(None)
        await until(lambda: len(reactor.received) >= len(messages), "every message", seconds=20.0)
        assert reactor.received == messages
        assert delivery.backlog_messages == delivery.backlog_bytes == 0 and not peer._protocol._backlogged
        raw.transport.loseConnection()
    finally:
        await stop_switches(cell.switch)
