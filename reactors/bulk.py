"""BulkReactor: a steady stream of bulk data to every peer, checked on arrival.

Channel 0x30, priority 1: the traffic that the priority scheduler lets chat overtake.
Each message is an 8-byte big-endian sequence number followed by ``chunk_size`` bytes
of a pattern that depends on the sequence number::

    +----------------+--------------------------------------------+
    | seq (u64, BE)  | PATTERN[seq % 256 : seq % 256 + chunk_size] |
    +----------------+--------------------------------------------+

Theory of operation
-------------------
Each peer that announced channel 0x30 gets one stream. A stream has at most one
``peer.send`` outstanding: the next message goes out only after the previous one's
Deferred fired True (backpressure: a full queue or recovery buffer slows the stream
down to what the peer takes), and no earlier than ``chunk_size / rate`` seconds after
the previous one was due (the rate bound). A send that fires False (the queue stayed
full for ``Config.send_timeout``) is retried with the same sequence number, so the
receiver still sees every number once, in order. While the session is suspended the
stream pauses; it goes on where it stopped when the session resumes.

Sequence numbers start at 0 for each session (each Peer object). Exactly-once, in-order
delivery within a session (specs/resume.md) means the receiver sees 0, 1, 2, ... with
the pattern intact; anything else is a :class:`BulkStreamError`, counted in ``errors``,
logged, and the peer is dropped with it.
"""

from __future__ import annotations

import struct

from twisted.logger import Logger

from mconn import ChannelDescriptor, Reactor

CHANNEL = 0x30
PRIORITY = 1
#: Largest chunk a BulkReactor sends or accepts (the channel's recv_message_capacity
#: is this plus the header).
MAX_CHUNK = 64 * 1024
DEFAULT_CHUNK = 16 * 1024
#: Bytes per second per peer.
DEFAULT_RATE = 256 * 1024
HEADER = struct.Struct(">Q")
PATTERN = bytes(range(256)) * (MAX_CHUNK // 256 + 1)

log = Logger()


class BulkStreamError(ValueError):
    """A bulk message that breaks the stream: wrong length, sequence or content."""

    def __init__(self, node_id: str, problem: str) -> None:
        super().__init__(f"bulk stream from {node_id}: {problem}")
        self.node_id = node_id
        self.problem = problem


def payload(seq: int, size: int) -> bytes:
    """The pattern bytes that follow sequence number ``seq`` in a message of ``size``."""
    start = seq % 256
    return PATTERN[start : start + size]


def encode(seq: int, size: int) -> bytes:
    return HEADER.pack(seq) + payload(seq, size)


def check(node_id: str, expected: int, message: bytes) -> int:
    """The sequence number of ``message`` if it is the one ``expected`` and intact.

    :raises BulkStreamError: naming what is wrong, with the values.
    """
    if len(message) < HEADER.size:
        raise BulkStreamError(node_id, f"message of {len(message)} bytes is shorter than its {HEADER.size}-byte header")
    (seq,) = HEADER.unpack_from(message)
    if seq != expected:
        raise BulkStreamError(node_id, f"sequence number {seq}, expected {expected}")
    body = memoryview(message)[HEADER.size :]
    if body != payload(seq, len(body)):
        raise BulkStreamError(node_id, f"message {seq} ({len(body)} bytes) does not carry its pattern")
    return seq


class _Stream:
    """The bulk stream to one peer (see the theory of operation)."""

    def __init__(self, owner: BulkReactor, peer) -> None:
        self.owner = owner
        self.peer = peer
        self.clock = owner.switch.clock
        self.next_seq = 0
        self.due = self.clock.seconds()
        self.sending = False  # a peer.send Deferred is outstanding
        self.paused = False  # the session is suspended
        self.stopped = False
        self.timer = None

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        self.stopped = True
        self._cancel_timer()

    def pause(self) -> None:
        self.paused = True
        self._cancel_timer()

    def resume(self) -> None:
        self.paused = False
        self.due = max(self.due, self.clock.seconds())
        self._schedule()

    def _cancel_timer(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None

    def _schedule(self) -> None:
        if self.stopped or self.paused or self.sending or self.timer is not None:
            return
        self.timer = self.clock.callLater(max(0.0, self.due - self.clock.seconds()), self._send)

    def _send(self) -> None:
        self.timer = None
        if self.stopped or self.paused or self.sending:
            return
        size = self.owner.chunk_size
        self.sending = True
        d = self.peer.send(CHANNEL, encode(self.next_seq, size))
        d.addCallback(self._sent, size)
        d.addErrback(self._failed)

    def _sent(self, accepted: bool, size: int) -> None:
        self.sending = False
        now = self.clock.seconds()
        if accepted:
            self.next_seq += 1
            self.owner.messages_sent += 1
            self.owner.bytes_sent += size
            self.due = max(self.due + size / self.owner.rate, now - 1.0)  # no burst after a stall
        else:  # queue full for send_timeout, or the peer is closing: same number again
            self.owner.send_retries += 1
            self.due = max(self.due, now)
        self._schedule()

    def _failed(self, failure) -> None:
        self.sending = False
        log.failure("bulk send to {node_id} failed", failure, node_id=self.peer.node_id)
        self.stop()


class BulkReactor(Reactor):
    """Streams bulk data to every peer at a bounded rate and checks what arrives.

    :param rate: bytes per second per peer (payload, headers not counted).
    :param chunk_size: payload bytes per message, at most :data:`MAX_CHUNK`.

    Counters: ``bytes_sent`` / ``messages_sent`` (accepted by ``peer.send``),
    ``bytes_received`` / ``messages_received`` (checked and in order), ``errors``
    (messages that broke a stream), ``send_retries``.
    """

    def __init__(self, rate: float = DEFAULT_RATE, chunk_size: int = DEFAULT_CHUNK) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ValueError(f"BulkReactor rate must be a positive number of bytes per second, got {rate!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 0 < chunk_size <= MAX_CHUNK:
            raise ValueError(f"BulkReactor chunk_size must be an integer in 1..{MAX_CHUNK}, got {chunk_size!r}")
        self.rate = float(rate)
        self.chunk_size = chunk_size
        self.bytes_sent = 0
        self.messages_sent = 0
        self.bytes_received = 0
        self.messages_received = 0
        self.errors = 0
        self.send_retries = 0
        self._streams: dict = {}  # Peer -> _Stream
        self._expected: dict = {}  # Peer -> next sequence number from it

    def get_channels(self) -> list[ChannelDescriptor]:
        return [
            ChannelDescriptor(
                CHANNEL, priority=PRIORITY, send_queue_capacity=2, recv_message_capacity=HEADER.size + MAX_CHUNK
            )
        ]

    def add_peer(self, peer) -> None:
        self._expected[peer] = 0
        if CHANNEL in peer.channels:
            stream = self._streams[peer] = _Stream(self, peer)
            stream.start()

    def remove_peer(self, peer, reason) -> None:
        self._expected.pop(peer, None)
        stream = self._streams.pop(peer, None)
        if stream is not None:
            stream.stop()

    def peer_suspended(self, peer) -> None:
        stream = self._streams.get(peer)
        if stream is not None:
            stream.pause()

    def peer_resumed(self, peer) -> None:
        stream = self._streams.get(peer)
        if stream is not None:
            stream.resume()

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        expected = self._expected.get(peer)
        if expected is None:  # the stream already broke: the peer is being dropped
            return
        try:
            check(peer.node_id, expected, message)
        except BulkStreamError as error:
            self.errors += 1
            self._expected.pop(peer, None)
            log.error("{error}; dropping the peer", error=str(error), node_id=peer.node_id)
            peer.close(error)
            return
        self._expected[peer] = expected + 1
        self.messages_received += 1
        self.bytes_received += len(message) - HEADER.size

    @property
    def streams(self) -> int:
        """Peers being streamed to now."""
        return len(self._streams)
