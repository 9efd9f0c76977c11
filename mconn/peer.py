"""Peer: one connected node, as reactors see it; sending happens here.

``send`` and ``try_send`` queue whole messages on a channel of the peer's connection
(specs/reactor-api.md section 3). ``send`` waits up to ``Config.send_timeout`` for room
in a full queue, in FIFO order with other waiting sends on that channel; ``try_send``
never waits, and never overtakes a waiting ``send``.
"""

from __future__ import annotations

import collections
import dataclasses

from twisted.internet import defer

from mconn.connection import State
from mconn.errors import ConnectionClosed
from mconn.wire import ChannelInfo, Hello


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChannelStatsSnapshot:
    """One channel's counters at one moment."""

    channel_id: int
    priority: int
    queue_depth: int
    waiting_sends: int
    bytes_sent: int
    messages_sent: int
    bytes_received: int
    messages_received: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerStats:
    """A peer's counters at one moment (``peer.stats``)."""

    node_id: str
    is_outbound: bool
    uptime: float
    bytes_sent: int
    bytes_received: int
    round_trip: float | None
    channels: tuple[ChannelStatsSnapshot, ...]


class Peer:
    """A connected node. Created by the Switch after the handshake; never by users."""

    def __init__(self, *, protocol, hello: Hello, is_outbound: bool, remote_address: str, clock, config) -> None:
        self.node_id = hello.node_id
        self.is_outbound = is_outbound
        self.listen_address = hello.listen_address
        self.remote_address = remote_address
        #: Channels the peer announced, by id.
        self.channels: dict[int, ChannelInfo] = {c.id: c for c in hello.channels}
        #: "connected" or "closed".
        self.state = "connected"
        #: Last measured ping round trip, in seconds (None before the first pong).
        self.round_trip: float | None = None
        self._protocol = protocol
        self._clock = clock
        self._config = config
        self._connected_at = clock.seconds()
        self._waiting: dict[int, collections.deque] = {}

    def __repr__(self) -> str:
        direction = "outbound" if self.is_outbound else "inbound"
        return f"<Peer {self.node_id} {direction} {self.remote_address} {self.state}>"

    # -- sending -------------------------------------------------------------------

    def _accepts(self, channel_id: int, message) -> bool:
        """False for channels either side lacks; ValueError for oversized messages."""
        core = self._protocol.core
        if self.state != "connected" or core.state is not State.OPEN:
            return False  # closing: nothing more can be queued
        ours = core.channels.get(channel_id)
        theirs = self.channels.get(channel_id)
        if ours is None or theirs is None:
            return False
        limit = min(ours.recv_capacity, theirs.recv_message_capacity)
        if len(message) > limit:
            raise ValueError(
                f"message of {len(message)} bytes on channel {channel_id:#04x} is larger than its "
                f"recv_message_capacity {limit} (ours {ours.recv_capacity}, peer's {theirs.recv_message_capacity})"
            )
        return True

    def try_send(self, channel_id: int, message: bytes) -> bool:
        """Queue ``message`` now if there is room; True if it was queued."""
        message = _as_bytes(message)
        if not self._accepts(channel_id, message) or self._waiting.get(channel_id):
            return False
        if not self._protocol.core.queue_message(channel_id, message):
            return False
        self._protocol.pump()
        return True

    def send(self, channel_id: int, message: bytes) -> defer.Deferred:
        """Queue ``message``, waiting up to send_timeout for room.

        :returns: a Deferred that fires True once the message is queued, False if the
            queue stayed full for ``send_timeout`` or the peer went away.
        """
        message = _as_bytes(message)
        if not self._accepts(channel_id, message):
            return defer.succeed(False)
        if self.try_send(channel_id, message):
            return defer.succeed(True)
        d = defer.Deferred()
        entry = [message, d, None]
        entry[2] = self._clock.callLater(self._config.send_timeout, self._send_timed_out, channel_id, entry)
        self._waiting.setdefault(channel_id, collections.deque()).append(entry)
        return d

    def _send_timed_out(self, channel_id: int, entry: list) -> None:
        self._waiting[channel_id].remove(entry)
        entry[1].callback(False)

    def _drain_waiting(self) -> bool:
        """Move waiting sends into queues that have room (called after each pump).

        Returns True if any moved. Their Deferreds fire after the move, so a callback
        that sends again sees consistent queues.
        """
        core = self._protocol.core
        if core.state is not State.OPEN:
            return False
        queued = []
        for channel_id, waiting in list(self._waiting.items()):
            while waiting and core.queue_message(channel_id, waiting[0][0]):
                _, d, timer = waiting.popleft()
                timer.cancel()
                queued.append(d)
        for d in queued:
            d.callback(True)
        return bool(queued)

    def _fail_waiting(self) -> None:
        for waiting in self._waiting.values():
            while waiting:
                _, d, timer = waiting.popleft()
                timer.cancel()
                d.callback(False)

    # -- lifecycle -----------------------------------------------------------------

    def close(self, reason=None) -> None:
        """Close the connection with a close packet; the reactors get ``remove_peer``."""
        if self.state != "connected":
            return
        self._protocol.close(ConnectionClosed("closed", "" if reason is None else str(reason)))

    @property
    def stats(self) -> PeerStats:
        core = self._protocol.core
        return PeerStats(
            node_id=self.node_id,
            is_outbound=self.is_outbound,
            uptime=self._clock.seconds() - self._connected_at,
            bytes_sent=core.bytes_sent,
            bytes_received=core.bytes_received,
            round_trip=self.round_trip,
            channels=tuple(
                ChannelStatsSnapshot(
                    channel_id=c.id,
                    priority=c.priority,
                    queue_depth=c.queue_depth,
                    waiting_sends=len(self._waiting.get(c.id, ())),
                    bytes_sent=c.stats.bytes_sent,
                    messages_sent=c.stats.messages_sent,
                    bytes_received=c.stats.bytes_received,
                    messages_received=c.stats.messages_received,
                )
                for c in core.channels.values()
            ),
        )


def _as_bytes(message) -> bytes:
    if isinstance(message, bytes):
        return message
    if isinstance(message, (bytearray, memoryview)):
        return bytes(message)
    raise TypeError(f"messages are bytes, got {type(message).__name__}")
