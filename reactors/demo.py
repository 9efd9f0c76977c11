"""A three-channel demo reactor: chat (priority 10), status (5) and bulk (1).

It shows what priorities do: while a bulk transfer saturates the connection, chat lines
and status ticks still arrive promptly. Used by examples/two_nodes.py.
"""

from __future__ import annotations

import collections

from mconn import ChannelDescriptor, Reactor

CHAT = 0x10
STATUS = 0x11
BULK = 0x12
NAMES = {CHAT: "chat", STATUS: "status", BULK: "bulk"}


class DemoReactor(Reactor):
    """Reports every message through ``on_message(name, peer, message)``, counts them per
    channel in ``counts``, and keeps the last ``keep`` of each channel in ``received``
    (a peer that never stops sending must not grow the demo's memory)."""

    def __init__(self, name: str = "demo", on_message=None, *, keep: int = 16) -> None:
        self.name = name
        self.on_message = on_message or (lambda *args: None)
        self.received: dict[int, collections.deque] = {ch: collections.deque(maxlen=keep) for ch in NAMES}
        self.counts: dict[int, int] = dict.fromkeys(NAMES, 0)
        self.peers = []

    def get_channels(self):
        return [
            ChannelDescriptor(CHAT, priority=10, send_queue_capacity=16, recv_message_capacity=4096),
            ChannelDescriptor(STATUS, priority=5, send_queue_capacity=16, recv_message_capacity=4096),
            ChannelDescriptor(BULK, priority=1, send_queue_capacity=2, recv_message_capacity=64 << 20),
        ]

    def add_peer(self, peer) -> None:
        self.peers.append(peer)

    def remove_peer(self, peer, reason) -> None:
        self.peers.remove(peer)

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        self.received[channel_id].append(message)
        self.counts[channel_id] += 1
        self.on_message(NAMES[channel_id], peer, message)
