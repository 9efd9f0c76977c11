"""What the write-path tests share: the channel, a collecting reactor, and a log of the
``sendmsg`` calls beneath a protocol (tests/integration/test_write_through.py over TCP,
test_websocket_write_through.py and test_websocket_direct.py over ws://)."""

from __future__ import annotations

from twisted.internet import defer

from helpers import bounded
from mconn import ChannelDescriptor, Reactor

CH = 0x20
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=8, recv_message_capacity=4 << 20)]


class Collector(Reactor):
    """Fires ``until(n)`` once n messages have arrived, and ``added`` with its first peer."""

    def __init__(self):
        self.messages: list[bytes] = []
        self.added = defer.Deferred()
        self._waiters: list = []

    def get_channels(self):
        return CHANNELS

    def add_peer(self, peer):
        if not self.added.called:
            self.added.callback(peer)

    def receive(self, channel_id, peer, message):
        self.messages.append(message)
        for n, d in list(self._waiters):
            if len(self.messages) >= n:
                self._waiters.remove((n, d))
                d.callback(n)

    def until(self, n):
        d = defer.Deferred()
        self._waiters.append((n, d))
        if len(self.messages) >= n:
            self._waiters.clear()
            d.callback(n)
        return bounded(d)


async def stop(*switches):
    await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]))


class SendLog:
    """Stands in for the socket of ``transport`` (default: the protocol's own; over ws,
    the TCP transport beneath the carrier): records each ``sendmsg`` (its buffers, as
    given, and the bytes the kernel took) and each resume of the protocol, in order."""

    def __init__(self, protocol, transport=None) -> None:
        transport = protocol.transport if transport is None else transport
        self.sock = transport.socket
        self.events: list[tuple] = []
        transport.socket = self
        resume = protocol.resumeProducing

        def resumed() -> None:
            self.events.append(("resume",))
            resume()

        protocol.resumeProducing = resumed

    def sendmsg(self, buffers, *args):
        buffers = list(buffers)
        sent = self.sock.sendmsg(buffers, *args)
        self.events.append(("sendmsg", buffers, sent))
        return sent

    def __getattr__(self, name):
        return getattr(self.sock, name)

    def sends(self) -> list[tuple]:
        return [e for e in self.events if e[0] == "sendmsg"]

    def turns(self) -> list[tuple[int, int]]:
        """(sendmsg calls, bytes they sent) between two resumes, resume to resume."""
        turns = [(0, 0)]
        for event in self.events:
            if event[0] == "resume":
                turns.append((0, 0))
            else:
                calls, sent = turns[-1]
                turns[-1] = (calls + 1, sent + event[2])
        return turns

    def most_sends_in_a_turn(self) -> int:
        """The most ``sendmsg`` calls between two resumes of the protocol."""
        return max(calls for calls, _ in self.turns())
