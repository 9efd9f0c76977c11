"""FakePeer: a stand-in for ``mconn.Peer`` for unit tests of a Reactor.

Unit tests call the reactor's methods directly and pass it a ``FakePeer``, which records
what the reactor sends::

    peer = FakePeer(channels=reactor.get_channels())
    reactor.add_peer(peer)
    reactor.receive(0x20, peer, b"ping")
    assert peer.sent == [(0x20, b"pong")]
"""

from __future__ import annotations

import secrets

from twisted.internet import defer

from mconn.core.address import host_of
from mconn.core.channel import ChannelDescriptor
from mconn.core.codec import encode_message
from mconn.errors import ConnectionClosed, ReactorError
from mconn.core.session_table import PeerState
from mconn.core.wire import ChannelInfo

__all__ = ["FakePeer"]


class FakePeer:
    """A stand-in for ``mconn.Peer`` that records what a reactor sends to it.

    It follows the Peer contract of specs/reactor-api.md section 5: ``try_send`` and
    ``send`` refuse (False) a channel the peer did not announce, a channel in
    ``full_channels``, and everything once the peer is closed; a message larger than the
    channel's ``recv_message_capacity`` raises ValueError. Accepted messages are appended
    to ``sent``. ``send`` does not wait: where a real Peer would wait ``send_timeout`` for
    room, the fake fires False at once.

    :param node_id: 40 hex characters (a random one if None).
    :param channels: the ChannelDescriptors the peer announced; None accepts any channel
        and any size.
    :param is_outbound: whether "we" dialed this peer.
    :param remote_address: the ``host:port`` the connection comes from; ``remote_host``
        is its host (None if it names none), as a Peer's comes from its transport.
    :param listen_address: the address the peer says it listens on.
    :param node_info: the ``mconn.NodeInfo`` the peer announced (``peer.node_info``), or None.

    On a typed channel (a descriptor with ``message_type`` or ``codec``) objects are
    encoded as ``Peer.send`` encodes them, and ``sent`` records the encoded bytes.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        channels: list[ChannelDescriptor] | None = None,
        is_outbound: bool = False,
        remote_address: str = "127.0.0.1:26656",
        listen_address: str = "",
        is_persistent: bool = False,
        node_info=None,
    ) -> None:
        self.node_id = node_id if node_id is not None else secrets.token_hex(20)
        self.is_outbound = is_outbound
        self.is_persistent = is_persistent
        self.node_info = node_info
        #: Data reactors share about the peer (as ``Peer.data``; ``get`` / ``set``).
        self.data: dict = {}
        self.remote_address = remote_address
        self.remote_host = host_of(remote_address)
        self.listen_address = listen_address
        #: Channels the peer announced, by id (None: any channel is accepted).
        self.channels: dict[int, ChannelInfo] | None = None
        #: Typed channels: channel id -> (codec, message_type).
        self._codecs = {c.id: (c.codec, c.message_type) for c in channels or () if c.codec is not None}
        if channels is not None:
            self.channels = {
                c.id: ChannelInfo(id=c.id, priority=c.priority, recv_message_capacity=c.recv_message_capacity)
                for c in channels
            }
        #: "connected" or "closed".
        self.state = PeerState.CONNECTED
        self.round_trip: float | None = None
        #: Every accepted message, in order, as ``(channel_id, message)``.
        self.sent: list[tuple[int, bytes]] = []
        #: Channel ids whose queue the test wants to look full.
        self.full_channels: set[int] = set()
        #: The ``reason`` given to ``close``, once it was called.
        self.close_reason: Exception | None = None

    def __repr__(self) -> str:
        return f"<FakePeer {self.node_id} {self.state}>"

    def sent_on(self, channel_id: int) -> list[bytes]:
        """The accepted messages of one channel, in order."""
        return [message for channel, message in self.sent if channel == channel_id]

    def try_send_many(self, channel_id: int, messages) -> int:
        """``try_send`` each message until one is refused; how many were recorded."""
        accepted = 0
        for message in messages:
            if not self.try_send(channel_id, message):
                break
            accepted += 1
        return accepted

    def try_send(self, channel_id: int, message: bytes) -> bool:
        """Record ``message`` unless the peer would refuse it (see the class docstring)."""
        typed = self._codecs.get(channel_id)
        if typed is not None:
            message = encode_message(typed[0], typed[1], channel_id, message)
        elif not isinstance(message, (bytes, bytearray, memoryview)):
            raise TypeError(f"messages are bytes, got {type(message).__name__}")
        message = bytes(message)
        if self.state is not PeerState.CONNECTED or channel_id in self.full_channels:
            return False
        if self.channels is not None:
            info = self.channels.get(channel_id)
            if info is None:
                return False
            if len(message) > info.recv_message_capacity:
                raise ValueError(
                    f"message of {len(message)} bytes on channel {channel_id:#04x} is larger than its "
                    f"recv_message_capacity {info.recv_message_capacity}"
                )
        self.sent.append((channel_id, message))
        return True

    def send(self, channel_id: int, message: bytes) -> defer.Deferred:
        """Like ``try_send``, as a Deferred that has already fired."""
        return defer.succeed(self.try_send(channel_id, message))

    def close(self, reason=None, *, flush: bool = False) -> None:
        """Mark the peer closed; later sends return False. (Every recorded message
        counts as delivered, so ``flush`` changes nothing here.)"""
        if self.state is PeerState.CONNECTED:
            self.state = PeerState.CLOSED
            self.close_reason = ConnectionClosed("closed", "" if reason is None else str(reason))

    def stop_for_error(self, reason) -> None:
        """Mark the peer closed with a ``ReactorError`` carrying ``reason`` (as
        ``Peer.stop_for_error``); ``close_reason`` is that ReactorError."""
        if self.state is PeerState.CONNECTED:
            self.state = PeerState.CLOSED
            if not isinstance(reason, ReactorError):
                reason = ReactorError(None, None, reason, method="stop_for_error")
            self.close_reason = reason

    def get(self, key, default=None):
        """``data.get(key, default)``."""
        return self.data.get(key, default)

    def set(self, key, value) -> None:
        """``data[key] = value``."""
        self.data[key] = value
