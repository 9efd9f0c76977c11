"""The recv_rate a receiver announces in its hello paces its peer over real TCP on
127.0.0.1 (specs/connection.md section 5, specs/handshake.md section 7): the sender's queue
forms in its own priority scheduler, so a vote sent behind a block-part flood overtakes it,
instead of waiting behind what the kernel buffers would hold.
"""

import pytest
import pytest_twisted

from helpers import RecordingReactor, bounded, listening_switches, sleep, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, Switch

pytestmark = pytest.mark.integration

VOTE, PART = 0x20, 0x21
CHANNELS = [
    ChannelDescriptor(VOTE, priority=10, send_queue_capacity=8),
    ChannelDescriptor(PART, priority=1, send_queue_capacity=8, recv_message_capacity=1 << 20),
]
RATE = 200_000  # bytes per second the receiver reads and announces
PARTS = 8  # 64 KiB block parts queued before the vote: 2.6 s at RATE


@pytest_twisted.ensureDeferred
async def test_a_vote_overtakes_a_flood_paced_at_the_receivers_announced_rate():
    receiver = RecordingReactor(CHANNELS)
    (listener,), port = await listening_switches([receiver], config=Config(recv_rate=RATE, stats_interval=0))
    sender = Switch([RecordingReactor(CHANNELS)], clock=the_reactor(), config=Config(stats_interval=0))
    sender.startService()
    try:
        peer = await bounded(sender.dial(f"{listener.node_id}@127.0.0.1:{port}"))
        assert peer.connection.core.send_pace == RATE  # taken from the listener's hello
        core = peer.connection.core
        sent_before, started = core.bytes_sent, the_reactor().seconds()
        for i in range(PARTS):
            assert peer.try_send(PART, bytes([i]) * 65536)
        await sleep(0.5)
        assert peer.try_send(VOTE, b"vote")
        # What went on the wire is what the receiver reads, no more: rate * elapsed, plus
        # a burst and a packet (unpaced, the kernel buffers between took hundreds of KiB).
        elapsed = the_reactor().seconds() - started
        assert core.bytes_sent - sent_before <= RATE * elapsed + 16_384, (core.bytes_sent - sent_before, elapsed)

        def arrived():
            return [(call[1], call[3][:1]) for call in receiver.calls if call[0] == "receive"]

        await until(lambda: (VOTE, b"v") in arrived(), "the vote", seconds=10.0)
        parts_first = arrived().index((VOTE, b"v"))
        # The vote waited in the sender's scheduler behind at most the part being cut, and
        # those that had gone out already; the rest of the flood comes after it.
        assert parts_first < PARTS - 2, arrived()
    finally:
        await stop_switches(sender, listener)
