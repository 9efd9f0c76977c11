"""One connection end, seen the same way over raw Twisted framing and over mconn.

The scenarios (scenarios.py) drive a *link* and never look below it:

    offer(channel, msg) -> bool      take ``msg`` now if backpressure allows; False: wait
    offer_many(channel, msgs) -> int take a prefix of ``msgs`` now (how many): the batch
                                     API (mconn: ``try_send_many``; raw: ``offer`` each)
    offer_later(channel, msg, cb)    take ``msg`` as soon as there is room, then call ``cb()``
    send_now(channel, msg) -> bool   send a latency-critical message (no waiting)
    flush()                          hand batched frames to the transport
    close()
    kernel_queues() -> (sendq, recvq)  bytes the kernel holds for the connection

and call ``link.handler.message(channel, msg)`` / ``link.handler.closed()``.

The raw baseline is the simplest honest framing: a 4-byte big-endian length, then the
payload, with no channels and no priorities. Its sender is the transport's IPushProducer
and writes frames in batches (``writeSequence``); its receiver is a hand-written parser
that copies each payload once, faster than ``Int32StringReceiver`` (which concatenates
the whole unprocessed buffer on every read: quadratic for 1 MiB messages);
``--raw-framing int32`` selects ``Int32StringReceiver`` on the receiving side to check.

``kernel_queues`` and the socket options reach mconn's socket through a private
attribute (``peer._protocol.transport``): they are diagnostics and experiments, and
none is on by default except the queue readings of the priority scenario.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.protocols.basic import Int32StringReceiver
from zope.interface import implementer

from mconn import ChannelDescriptor, Reactor

_LENGTH = struct.Struct(">I")
#: The raw sender hands its frames to the transport in one writeSequence once it has
#: collected this many, or this many bytes.
RAW_BATCH_FRAMES = 128
RAW_BATCH_BYTES = 65536
#: Largest frame the raw receiver accepts (mconn's default recv_message_capacity).
RAW_MAX_FRAME = 22020096


class Handler:
    """What a link calls; scenarios subclass it."""

    def message(self, channel: int, msg: bytes) -> None:
        pass

    def closed(self) -> None:
        pass


# -- socket diagnostics and experiments -------------------------------------------

#: Socket options the bench applies to every connection (set from the command line; an
#: experiment, off by default): {"nodelay": bool, "notsent_lowat": int | None}.
SOCKET_OPTIONS: dict = {"nodelay": False, "notsent_lowat": None}
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)


def kernel_queues(transport) -> tuple[int, int]:
    """(unsent-or-unacked bytes in the socket's send queue, unread bytes in its receive
    queue): what the kernel holds for this connection right now (Linux ioctls)."""
    fd = transport.getHandle().fileno()
    sendq = struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    recvq = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    return sendq, recvq


def apply_socket_options(transport) -> None:
    if SOCKET_OPTIONS["nodelay"]:
        transport.setTcpNoDelay(True)
    if SOCKET_OPTIONS["notsent_lowat"]:
        transport.getHandle().setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, SOCKET_OPTIONS["notsent_lowat"])


# -- raw Twisted ------------------------------------------------------------------


@implementer(IPushProducer)
class RawLink(Protocol):
    """Length-prefixed frames over one TCP connection; ``channel`` is ignored."""

    def __init__(self, on_link) -> None:
        self.handler = Handler()
        self._on_link = on_link
        self._head = b""  # the start of a frame header
        self._parts: list[bytes] | None = None  # payload pieces of an incomplete frame
        self._need = 0  # payload bytes that frame still lacks
        self._paused = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._waiter = None

    def connectionMade(self) -> None:
        apply_socket_options(self.transport)
        self.transport.registerProducer(self, True)
        self._on_link(self)

    def connectionLost(self, reason) -> None:
        self._paused = True
        self.handler.closed()

    # receiving

    def dataReceived(self, data: bytes) -> None:
        # A frame larger than what arrived keeps its payload pieces as they came and
        # joins them once (one copy); whole frames inside ``data`` are sliced out of it.
        message = self.handler.message
        if self._parts is not None:
            need = self._need
            if len(data) < need:
                self._parts.append(data)
                self._need = need - len(data)
                return
            self._parts.append(data[:need])
            parts, self._parts = self._parts, None
            message(0, b"".join(parts))
            data = data[need:]
        if self._head:
            data = self._head + data
            self._head = b""
        n = len(data)
        pos = 0
        out = []
        with memoryview(data) as mv:
            while n - pos >= 4:
                length = _LENGTH.unpack_from(mv, pos)[0]
                if length > RAW_MAX_FRAME:
                    raise ValueError(f"frame of {length} bytes is over {RAW_MAX_FRAME}")
                end = pos + 4 + length
                if end > n:
                    self._parts = [bytes(mv[pos + 4 :])]
                    self._need = end - n
                    pos = n
                    break
                out.append(bytes(mv[pos + 4 : end]))
                pos = end
            if pos < n:
                self._head = bytes(mv[pos:])
        for msg in out:
            message(0, msg)

    # sending

    def offer(self, channel: int, msg: bytes) -> bool:
        if self._paused or self._waiter is not None:
            return False
        pending = self._pending
        pending.append(_LENGTH.pack(len(msg)))
        pending.append(msg)
        self._pending_bytes += len(msg)
        if self._pending_bytes >= RAW_BATCH_BYTES or len(pending) >= 2 * RAW_BATCH_FRAMES:
            self.flush()
        return True

    def offer_many(self, channel: int, msgs: list) -> int:
        for taken, msg in enumerate(msgs):
            if not self.offer(channel, msg):
                return taken
        return len(msgs)

    def offer_later(self, channel: int, msg: bytes, cb) -> None:
        self.flush()
        self._waiter = (msg, cb)
        if not self._paused:
            self._release()

    def send_now(self, channel: int, msg: bytes) -> bool:
        self._pending.append(_LENGTH.pack(len(msg)))
        self._pending.append(msg)
        self.flush()
        return True

    def flush(self) -> None:
        if self._pending:
            parts, self._pending = self._pending, []
            self._pending_bytes = 0
            self.transport.writeSequence(parts)

    def close(self) -> None:
        self.flush()
        self.transport.loseConnection()

    def kernel_queues(self) -> tuple[int, int]:
        return kernel_queues(self.transport)

    # IPushProducer

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._release()

    def stopProducing(self) -> None:
        self._paused = True

    def _release(self) -> None:
        if self._waiter is not None:
            msg, cb = self._waiter
            self._waiter = None
            self.offer(0, msg)
            self.flush()
            cb()


class Int32Link(RawLink, Int32StringReceiver):
    """RawLink whose receiving side is Twisted's Int32StringReceiver."""

    MAX_LENGTH = RAW_MAX_FRAME

    def __init__(self, on_link) -> None:
        RawLink.__init__(self, on_link)

    dataReceived = Int32StringReceiver.dataReceived

    def stringReceived(self, msg: bytes) -> None:
        self.handler.message(0, msg)


def raw_factory(on_link, framing: str = "hand") -> Factory:
    cls = Int32Link if framing == "int32" else RawLink
    return Factory.forProtocol(lambda: cls(on_link))


# -- mconn ------------------------------------------------------------------------


class MconnLink:
    """A Peer with the link interface: offer is try_send, offer_later is send."""

    def __init__(self, peer) -> None:
        self.peer = peer
        self.handler = Handler()

    def offer(self, channel: int, msg: bytes) -> bool:
        return self.peer.try_send(channel, msg)

    def offer_many(self, channel: int, msgs: list) -> int:
        try_send_many = getattr(self.peer, "try_send_many", None)
        if try_send_many is None:  # a tree whose Peer has no batch API
            return RawLink.offer_many(self, channel, msgs)
        return try_send_many(channel, msgs)

    def offer_later(self, channel: int, msg: bytes, cb) -> None:
        def queued(ok: bool) -> None:
            if not ok:
                raise RuntimeError(f"peer.send on channel {channel:#04x} fired False (send_timeout or closed)")
            cb()

        self.peer.send(channel, msg).addCallback(queued)

    def send_now(self, channel: int, msg: bytes) -> bool:
        return self.peer.try_send(channel, msg)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.peer.close("benchmark done")

    def kernel_queues(self) -> tuple[int, int]:
        # A diagnostic only: mconn has no public way to reach the socket.
        return kernel_queues(self.peer._protocol.transport)


class LinkReactor(Reactor):
    """Declares the scenario's channels and turns each peer into an MconnLink."""

    def __init__(self, channels: list[ChannelDescriptor], on_link) -> None:
        self._channels = channels
        self._on_link = on_link
        self._links = {}

    def get_channels(self) -> list[ChannelDescriptor]:
        return self._channels

    def add_peer(self, peer) -> None:
        # Experiments only: mconn has no public way to reach the socket.
        if SOCKET_OPTIONS["nodelay"] or SOCKET_OPTIONS["notsent_lowat"]:
            apply_socket_options(peer._protocol.transport)
        link = self._links[peer] = MconnLink(peer)
        self._on_link(link)

    def remove_peer(self, peer, reason) -> None:
        link = self._links.pop(peer, None)
        if link is not None:
            link.handler.closed()

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        self._links[peer].handler.message(channel_id, message)
