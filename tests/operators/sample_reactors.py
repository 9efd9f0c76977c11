"""Reactors that ``twistd mconn --reactor operators.sample_reactors:...`` can build (no arguments)."""

from mconn import ChannelDescriptor, Reactor

CHAT = 0x10


class Chat(Reactor):
    """Owns channel 0x10 and keeps the count of what arrives."""

    def __init__(self) -> None:
        self.received = 0

    def get_channels(self):
        return [ChannelDescriptor(CHAT, priority=5, send_queue_capacity=8)]

    def receive(self, channel_id, peer, message):
        self.received += 1


class NotAReactor:
    """Builds fine, but is no mconn Reactor."""


class Broken(Reactor):
    def __init__(self) -> None:
        raise RuntimeError("cannot start without a database")
