"""Pending receives, held messages, a small backlog bound and resets together keep every
message exactly once and in order per channel (specs/reactor-api.md section 4.1,
specs/resume.md). Seeded random schedules over mconn.testing's in-memory network.
"""

import random

import pytest
from twisted.internet import defer

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x70, send_queue_capacity=16), ChannelDescriptor(0x71, send_queue_capacity=16)]


class Moody(RecordingReactor):
    """receive returns a pending Deferred for about half the messages (chosen by ``rng``)."""

    def __init__(self, rng):
        super().__init__(CHANNELS)
        self.rng = rng
        self.pending = []

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        if self.rng.random() < 0.5:
            d = defer.Deferred()
            self.pending.append(d)
            return d
        return None


@pytest.mark.parametrize("seed", range(12))
def test_holds_and_resets_deliver_every_message_once_in_order(seed):
    """Random sends on two channels, random firing of pending receives, random link resets
    and a 600-byte backlog bound: at the end each channel's messages arrived exactly once,
    in the order sent, the sender has every one confirmed, and nothing is left held."""
    rng = random.Random(seed)
    network = MemoryNetwork(window=2048)
    config = Config(reactor_backlog_bytes=600, resume_grace=30.0, max_reconnect_delay=0.1, stats_interval=0)
    moody = Moody(rng)
    receiver = network.switch([moody], config=config)
    sender_switch = network.switch([RecordingReactor(CHANNELS)], config=config, reconnect_delay=lambda attempt: 0.05)
    receiver.listen("tcp:26656")
    dialed = sender_switch.dial(network.dial_address(receiver))
    network.flush()
    sender = dialed.result
    sent = {c.id: [] for c in CHANNELS}
    for _ in range(120):
        action = rng.random()
        if action < 0.55:
            channel = rng.choice(CHANNELS).id
            message = b"%d:%03d:" % (channel, len(sent[channel])) + b"m" * rng.randrange(1, 300)
            if sender.try_send(channel, message):
                sent[channel].append(message)
        elif action < 0.9:
            for d in [d for d in moody.pending if not d.called][: rng.randrange(1, 4)]:
                d.callback(None)
        elif action < 0.95 and sender.state == "connected":
            network.reset(sender_switch, receiver)
        network.advance(rng.choice((0.0, 0.01, 0.05, 0.2)), step=0.01)
    for _ in range(200):  # settle: fire everything pending until all arrived and are confirmed
        for d in [d for d in moody.pending if not d.called]:
            d.callback(None)
        network.advance(0.2, step=0.05)
        if all(sender.session.acked(c) == len(sent[c]) for c in sent) and all(d.called for d in moody.pending):
            break
    for channel, messages in sent.items():
        assert moody.received(channel) == messages, f"seed {seed}, channel {channel:#04x}"
        assert sender.session.acked(channel) == len(messages)
    here = receiver.peers[sender_switch.node_id]
    assert here is not None and here._delivery.busy == {} and here._delivery.backlog_bytes == 0
    assert sum(len(m) for m in sent.values()) > 20 and sender.resumes >= 1  # the schedule did reset the link
    receiver._check_invariants()
    sender_switch._check_invariants()
