"""A three-channel demo reactor: chat (priority 10), status (5) and bulk (1).

It shows what priorities do: while a bulk transfer saturates the connection, chat lines
and status ticks still arrive promptly. Used by examples/two_nodes.py.
"""

from __future__ import annotations

from mconn import ChannelDescriptor, Reactor

CHAT = 0x10
STATUS = 0x11
BULK = 0x12
NAMES = {CHAT: "chat", STATUS: "status", BULK: "bulk"}


class DemoReactor(Reactor):
    """Records every message and reports it through ``on_message(name, peer, message)``."""

    def __init__(self, name: str = "demo", on_message=None) -> None:
        self.name = name
        self.on_message = on_message or (lambda *args: None)
        self.received: dict[int, list[bytes]] = {CHAT: [], STATUS: [], BULK: []}
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
        self.on_message(NAMES[channel_id], peer, message)
