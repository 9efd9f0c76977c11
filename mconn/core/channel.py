"""Channels: descriptors, send queues, chunking, reassembly and the priority scheduler.

Theory of operation (specs/scheduling.md; the packet layout is specs/wire.md section 2.3).

Sending. Each channel holds up to ``send_queue_capacity`` whole messages plus the one
being cut into packets. Every packet but a message's last carries exactly the negotiated
payload size (chunking: specs/wire.md section 4, specs/scheduling.md section 2). The next
packet comes from the pending channel with the lowest ``recently_sent / priority``, ties
to the channel declared first (specs/scheduling.md section 3.1). ``recently_sent`` counts
the bytes a channel put on the wire (headers included) and decays continuously,
``exp(-dt / DECAY_TAU)`` (the reference multiplies by 0.8 every 2 s, a step every 2 s;
ours is the same average decay without the steps; section 3.2). Decaying every channel
on every packet would cost O(channels); instead every channel stores
``recently_sent * exp((t - epoch) / tau)`` so that one common factor decays them all at
once, and comparisons need no decay at all. When the factor grows large the stored values
are rescaled (section 8).

Once a channel is chosen it keeps the wire while its ratio stays below the runner-up's;
on a tie the choice is made again: the greedy choice per packet, computed per run of
packets (section 8). What this guarantees, and what it does not, is section 6.

Receiving. Payloads are collected per channel until eof, then joined once; a message
is checked against ``recv_message_capacity`` before its bytes are kept. A payload piece of
at least ``KEEP_VIEW_MIN`` bytes that is at least half of the read it came in (or a run
of such pieces from one read that add up to half of it) is kept as a view of that read,
not copied until the join; other pieces are copied into a bytearray between the
views, so what a partial message keeps alive is at most about twice its bytes. The frame
buffer hands a read's consecutive not-last packets of a channel over as one run, their
payloads under ``KEEP_VIEW_MIN`` already copied together into one bytes object, which
holds only its own bytes: from ``KEEP_VIEW_MIN`` on it is kept as it is, a read's small
packets costing one step and no second copy before the join. (A
BytesIO grew to the exact size at every 64 KiB write, each growth a realloc that
copied or faulted in the whole buffer: ~0.4 ms per 1 MiB message, bench/history/2026-11-24-night.md.)

Send-queue delay (``SendDelay``, ``mconn_channel_send_queue_seconds``, specs/status.md
section 4). A channel with a ``send_delay`` stamps a queueing (a call of
``writable_queue``, which every append to a queue goes through: one message queued by
``enqueue``, or the first message of a batch extended at once): the stamp is the
message's place in the channel's sequence (messages finished plus messages waiting) and
the clock's time. When ``emit`` finishes that message (its last packet handed to the
connection, which writes it to the transport), the time since the stamp is observed,
and no message is stamped until the channel's sequence reaches ``SendDelay.every``
places past the sampled one: at most one message in ``every`` is sampled, never two at
once. Both the stamp in flight and that window are one integer, ``_stamp_at``, which
``emit`` compares with its finished count once per call: a channel costs one attribute
test per queueing without a ``send_delay``, two with one, and two clock reads per sample. The core reads no clock itself: the clock is
the one the ``SendDelay`` was given. Which descriptors have a ``SendDelay`` is kept by
``watch_send_delay``; a Channel made from one of them takes it.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any, cast

from mconn.core.codec import codec_for
from mconn.core.speedups import SPEEDUPS
from mconn.errors import MessageTooLarge

#: Time constant of the recently_sent decay, in seconds: 0.8 per 2 s on average.
DECAY_TAU = 2.0 / math.log(1.25)
_RESCALE_EXPONENT = math.log(1e12)

#: Default largest reassembled message (21 MiB, CometBFT's RecvMessageCapacity).
DEFAULT_RECV_MESSAGE_CAPACITY = 22020096
#: A received payload piece this large, and at least half of the read it is a view of,
#: is kept as that view until its message is whole; smaller ones are copied (see above).
KEEP_VIEW_MIN = 4096
#: Upper bounds (seconds) of the send-queue delay buckets: 100 us to 30 s.
SEND_DELAY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: At most one message in this many is stamped (and never two in flight).
SEND_DELAY_EVERY = 256
#: ``ChannelDescriptor.name``: at most this many characters of [A-Za-z0-9_.-].
MAX_CHANNEL_NAME = 32
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


@dataclasses.dataclass(frozen=True, slots=True)
class ChannelDescriptor:
    """What a reactor declares about one of its channels.

    :param id: the channel's byte id (0..255), unique across a Switch's reactors.
    :param priority: relative share of bandwidth under contention (>= 1).
    :param send_queue_capacity: whole messages queued per peer before ``try_send``
        returns False (the one being sent is not counted).
    :param recv_message_capacity: the largest reassembled message accepted.
    :param message_type: a protobuf message class (typed messages, ``mconn.core.codec``):
        ``receive`` gets decoded objects and ``send`` encodes them. None: raw bytes.
    :param codec: any object with ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``,
        instead of protobuf's; once built, ``codec`` is the channel's codec or None.
    :param name: a name for people (``"votes"``): the status page, the metrics
        (``mconn_channel_info``) and ``channel_stats`` show it next to the id. At most
        ``MAX_CHANNEL_NAME`` (32) characters of ``[A-Za-z0-9_.-]``; empty: none. This
        node's own: never sent to peers.
    """

    id: int
    priority: int = 1
    send_queue_capacity: int = 1
    recv_message_capacity: int = DEFAULT_RECV_MESSAGE_CAPACITY
    message_type: type | None = None
    codec: object = None
    name: str = ""

    def __post_init__(self) -> None:
        if not _is_int(self.id) or not 0 <= self.id <= 255:
            raise ValueError(f"channel id must be an integer in 0..255, got {self.id!r}")
        if not _is_int(self.priority) or self.priority < 1:
            raise ValueError(f"channel {self.id:#04x}: priority must be an integer >= 1, got {self.priority!r}")
        if not _is_int(self.send_queue_capacity) or self.send_queue_capacity < 1:
            raise ValueError(
                f"channel {self.id:#04x}: send_queue_capacity must be an integer >= 1, got {self.send_queue_capacity!r}"
            )
        if not _is_int(self.recv_message_capacity) or self.recv_message_capacity < 0:
            raise ValueError(
                f"channel {self.id:#04x}: recv_message_capacity must be an integer >= 0, "
                f"got {self.recv_message_capacity!r}"
            )
        if (
            not isinstance(self.name, str)
            or len(self.name) > MAX_CHANNEL_NAME
            or not _CHANNEL_NAME.fullmatch(self.name)
        ):
            raise ValueError(
                f"channel {self.id:#04x}: name must be text of at most {MAX_CHANNEL_NAME} characters "
                f"of [A-Za-z0-9_.-], got {self.name!r}"
            )
        object.__setattr__(self, "codec", codec_for(self.id, self.message_type, self.codec))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.lru_cache(maxsize=4096)
def msg_header(channel_id: int, eof: bool, length: int) -> bytes:
    """The bytes of a msg packet before its payload: 03 | ch | eof | uvarint length."""
    size = (length.bit_length() + 7) // 8
    return bytes((3, channel_id, 1 if eof else 0, size)) + length.to_bytes(size, "big")


class ChannelStats:
    """Counters of one channel on one connection: messages, and their bytes (payloads,
    without packet headers) sent and received."""

    __slots__ = ("bytes_sent", "messages_sent", "bytes_received", "messages_received")

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.messages_sent = 0
        self.bytes_received = 0
        self.messages_received = 0


class SendDelay:
    """How long messages of one channel wait to be written: a histogram of the time from
    a message's queueing to its last packet handed to the transport, over every
    connection whose Channel has it (sampled: see the theory of operation).

    :param clock: returns the time in seconds (a Switch gives its ``clock.seconds``).
    :param every: stamp at most one queued message in this many (an integer >= 1).
    :param buckets: the buckets' upper bounds in seconds, increasing.
    """

    __slots__ = ("clock", "every", "buckets", "counts", "total", "count")

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        every: int = SEND_DELAY_EVERY,
        buckets: tuple[float, ...] = SEND_DELAY_BUCKETS,
    ) -> None:
        if not _is_int(every) or every < 1:
            raise ValueError(f"SendDelay every must be an integer >= 1, got {every!r}")
        if not buckets or any(not b > a for a, b in itertools.pairwise(buckets)) or not buckets[0] > 0:
            raise ValueError(f"SendDelay buckets must be positive and increasing, got {buckets!r}")
        self.clock = clock
        self.every = every
        self.buckets = tuple(float(b) for b in buckets)
        #: Observations per bucket (not cumulative); the last one is past every bound.
        self.counts = [0] * (len(buckets) + 1)
        #: Seconds observed in all, and how many observations.
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Count one message that waited ``seconds`` (a clock set back counts as 0)."""
        seconds = max(0.0, seconds)
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, ``inf`` last."""
        running = 0
        out = []
        for bound, count in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


#: id(descriptor) -> (the descriptor, kept so that its id is not reused; its SendDelay).
_WATCHED: dict[int, tuple[ChannelDescriptor, SendDelay]] = {}


def watch_send_delay(desc: ChannelDescriptor, delay: SendDelay | None) -> None:
    """Channels made from ``desc`` (this very object) from now on sample their send-queue
    delay into ``delay``; None stops it for channels made later. Channels already made
    are changed with ``Channel.set_send_delay``."""
    if delay is None:
        _WATCHED.pop(id(desc), None)
    else:
        _WATCHED[id(desc)] = (desc, delay)


def send_delay_of(desc: ChannelDescriptor) -> SendDelay | None:
    """The SendDelay ``watch_send_delay`` gave ``desc``, or None."""
    entry = _WATCHED.get(id(desc))
    return entry[1] if entry is not None and entry[0] is desc else None


class Channel:
    """Per-connection state of one channel: its queue, its current message, reassembly."""

    __slots__ = (
        "id",
        "priority",
        "capacity",
        "recv_capacity",
        "queue",
        "sending",
        "offset",
        "stored_sent",
        "receiving",
        "receiving_size",
        "stats",
        "send_delay",
        "_full_header",
        "_full_payload",
        "_stamp_at",
        "_stamp_time",
        "_skipping",
    )

    def __init__(self, desc: ChannelDescriptor) -> None:
        self.id = desc.id
        self.priority = desc.priority
        self.capacity = desc.send_queue_capacity
        self.recv_capacity = desc.recv_message_capacity
        #: The messages waiting: ``()`` until the first one (an empty deque costs ~760
        #: bytes, per channel and peer: much of an idle peer's memory), then a deque.
        self.queue: collections.deque[bytes] | tuple[()] = ()
        self.sending: memoryview | None = None
        self.offset = 0
        self.stored_sent = 0.0
        #: The pieces of the message being received (views and bytearrays), or None.
        self.receiving: list[Any] | None = None
        self.receiving_size = 0
        self.stats = ChannelStats()
        self._full_header = b""
        self._full_payload = -1
        #: Where send-queue delays are sampled (None: they are not).
        self.send_delay = send_delay_of(desc)
        #: -1: the next queueing is stamped. Else, with ``_skipping`` False, the stamped
        #: message's place in this channel's sequence (``_stamp_time``: when it was
        #: queued); with ``_skipping`` True, the last place of the window after a sample.
        self._stamp_at = -1
        self._stamp_time = 0.0
        self._skipping = False

    def set_send_delay(self, delay: SendDelay | None) -> None:
        """Sample into ``delay`` from the next queued message on (None: stop sampling)."""
        self.send_delay = delay
        self._stamp_at = -1
        self._skipping = False

    @property
    def queue_depth(self) -> int:
        """Messages waiting, counting the one being sent."""
        return len(self.queue) + (self.sending is not None)

    @property
    def is_pending(self) -> bool:
        return self.sending is not None or bool(self.queue)

    def enqueue(self, message: bytes) -> bool:
        """Queue a whole message; False when ``send_queue_capacity`` are already waiting."""
        if len(self.queue) >= self.capacity:
            return False
        self.writable_queue().append(message)
        return True

    def writable_queue(self) -> collections.deque[bytes]:
        """The queue as a deque (made on the first message), to append to: every append
        goes through here, so that a send-queue delay sample can be stamped."""
        queue = self.queue
        if isinstance(queue, tuple):
            queue = self.queue = collections.deque()
        if self.send_delay is not None and self._stamp_at < 0:
            self._stamp(len(queue))
        return queue

    def _stamp(self, waiting: int) -> None:
        """The next message queued is sampled: its place, and the time now."""
        delay = cast(SendDelay, self.send_delay)
        self._stamp_at = self.stats.messages_sent + waiting + (self.sending is not None)
        self._stamp_time = delay.clock()

    def _observe(self) -> None:
        """``emit`` passed ``_stamp_at``: observe how long the stamped message waited and
        open the window, or close the window."""
        delay = self.send_delay
        if self._skipping or delay is None:
            self._stamp_at = -1
            self._skipping = False
            return
        delay.observe(delay.clock() - self._stamp_time)
        sampled = self._stamp_at
        if delay.every > 1 and self.stats.messages_sent < sampled + delay.every:
            self._stamp_at = sampled + delay.every - 1  # stamp again from place sampled + every
            self._skipping = True
        else:
            self._stamp_at = -1

    def emit(self, parts: list[Any], payload: int, budget: int) -> tuple[int, int]:
        """Append packets of the current message to ``parts`` until ``budget`` wire bytes.

        Returns ``(wire_bytes, messages_finished)``. At least one packet is emitted. A
        message that fits one packet goes out as it is (no view of it is made), and its
        header is looked up once for a run of messages of one size. ``stats.bytes_sent``
        counts the message bytes (payloads), as the receiving side's ``bytes_received``
        does, so the two ends of a link agree; the scheduler weighs wire bytes.
        """
        if self._full_payload != payload:
            self._full_header = msg_header(self.id, False, payload)
            self._full_payload = payload
        full = self._full_header
        full_wire = len(full) + payload
        append = parts.append
        # A message is pending: popleft is reached only with one queued, so in a deque.
        queue = cast("collections.deque[bytes]", self.queue)
        mv = self.sending
        offset = self.offset
        total = 0 if mv is None else len(mv)
        last_size = -1
        header = b""
        wire = 0
        data = 0  # payload bytes
        finished = 0
        while True:
            if mv is None:
                message = queue.popleft()
                size = len(message)
                if size <= payload:  # the whole message is its last packet
                    if size != last_size:
                        header = msg_header(self.id, True, size)
                        last_size = size
                    append(header)
                    if size:
                        append(message)
                    wire += len(header) + size
                    data += size
                    finished += 1
                    if not queue or wire >= budget:
                        break
                    continue
                mv = memoryview(message)
                offset = 0
                total = size
            remaining = total - offset
            if remaining > payload:
                append(full)
                append(mv[offset : offset + payload])
                offset += payload
                wire += full_wire
                data += payload
                if wire >= budget:
                    break
                continue
            last = msg_header(self.id, True, remaining)
            append(last)
            append(mv[offset:])
            wire += len(last) + remaining
            data += remaining
            finished += 1
            mv = None
            if not queue or wire >= budget:
                break
        self.sending = mv
        self.offset = offset
        stats = self.stats
        stats.messages_sent += finished
        stats.bytes_sent += data
        if self._stamp_at >= 0 and stats.messages_sent > self._stamp_at:
            self._observe()
        return wire, finished

    def too_large(self, size: int) -> MessageTooLarge:
        """Drop the partial message; the error the connection fails with (``size``: the
        message's bytes so far, over ``recv_capacity``)."""
        self.receiving = None
        self.receiving_size = 0
        return MessageTooLarge(
            f"message on channel {self.id:#04x} reached {size} bytes, over its "
            f"recv_message_capacity {self.recv_capacity}"
        )

    def reassemble_run(self, payloads: list[Any]) -> None:
        """Add the payloads of consecutive not-last packets (views of the read, or bytes
        of small ones copied together), or the part of a streamed packet's payload that
        has arrived (frame_buffer.RUN). The capacity is checked for the run as a whole,
        before any of it is kept: MessageTooLarge names the size with the whole run."""
        size = self.receiving_size + sum(map(len, payloads))
        if size > self.recv_capacity:
            raise self.too_large(size)
        parts = self.receiving
        if parts is None:
            parts = self.receiving = []
        first = payloads[0] if payloads else None
        whole = first.obj if type(first) is memoryview else None
        added = size - self.receiving_size
        if (
            type(whole) is bytes
            and added >= KEEP_VIEW_MIN * len(payloads)
            and 2 * added >= len(whole)
            and all(type(p) is memoryview and p.obj is whole for p in payloads)
        ):
            parts.extend(payloads)  # large views of one read, together at least half of it
        else:
            for piece in payloads:
                _collect(parts, piece)
        self.stats.bytes_received += added
        self.receiving_size = size

    def reassemble(self, eof: int, data: memoryview) -> bytes | None:
        """Add one packet's payload; the whole message once ``eof`` is set (its pieces
        joined: one copy of each byte)."""
        size = self.receiving_size + len(data)
        if size > self.recv_capacity:
            raise self.too_large(size)
        stats = self.stats
        stats.bytes_received += len(data)
        parts = self.receiving
        if eof:
            stats.messages_received += 1
            if parts is None:
                return bytes(data)
            parts.append(data)
            self.receiving = None
            self.receiving_size = 0
            return b"".join(parts)
        if parts is None:
            parts = self.receiving = []
        _collect(parts, data)
        self.receiving_size = size
        return None


def _collect(parts: list[Any], piece: bytes | memoryview) -> None:
    """Keep ``piece`` (bytes or a memoryview of a read) in ``parts``: as it is when it is
    at least ``KEEP_VIEW_MIN`` bytes and half of the (immutable) read it views (or of the
    same read as the view before it, already kept alive), so that kept views never hold
    more than twice their bytes; otherwise copied into a trailing
    bytearray. (A run of views of one read that add up to half of it is kept whole by
    ``reassemble_run``.)"""
    size = len(piece)
    last = parts[-1] if parts else None
    if size >= KEEP_VIEW_MIN:
        whole = piece.obj if type(piece) is memoryview else piece
        kept_alive = type(last) is memoryview and last.obj is whole
        if type(whole) is bytes and (2 * size >= len(whole) or kept_alive):  # bytes: immutable
            parts.append(piece)
            return
    if type(last) is bytearray:
        last += piece
    else:
        parts.append(bytearray(piece))


class Scheduler:
    """Chooses which channel's packets go out next (see the theory of operation above)."""

    def __init__(self, channels: list[Channel], now: float) -> None:
        self.channels = channels
        #: The time the channels' ``stored_sent`` values are relative to (rescaled at
        #: most once per ``exp(_RESCALE_EXPONENT)`` of decay).
        self.epoch = now
        #: Messages taken off the channel queues so far (each made room for a send).
        self.taken = 0

    def pending(self) -> bool:
        for c in self.channels:
            if c.sending is not None or c.queue:
                return True
        return False

    def recently_sent(self, channel: Channel, now: float) -> float:
        """The decayed byte count of ``channel`` at ``now`` (for statistics and tests)."""
        return channel.stored_sent * math.exp(-(now - self.epoch) / DECAY_TAU)

    def next_packets(self, now: float, payload: int, budget: int) -> tuple[list[Any], int]:
        """Packets worth about ``budget`` wire bytes, as a list of byte parts to join.

        Returns ``(parts, wire_bytes)``; ``parts`` is empty when nothing is pending.
        (``schedule``, through the compiled twin when it is in use.)
        """
        parts: list[Any] = []
        return parts, active_schedule(self, parts, now, payload, budget)


def schedule(scheduler: Scheduler, parts: list[Any], now: float, payload: int, budget: int) -> int:
    """The scheduler's pick and the packets' framing: append to ``parts`` the msg packets
    of the pending channels worth about ``budget`` wire bytes (at least one packet, at
    most one packet past ``budget``), cut at ``payload`` bytes; returns the wire bytes
    appended (0, nothing appended, when no channel is pending or ``budget`` <= 0).

    The reference of the compiled twin (mconn/core/_speedups.pyx,
    tests/core/test_speedups_send.py): the twin's ``parts`` may cut the same bytes into
    other pieces (it frames a run of small packets into one bytes object); joined they
    are the same bytes, and the channels and the scheduler change in the same way.
    """
    if payload < 1:
        raise ValueError(f"packet payload must be at least 1 byte, got {payload}")
    pending = [c for c in scheduler.channels if c.sending is not None or c.queue]
    if not pending:
        return 0
    exponent = (now - scheduler.epoch) / DECAY_TAU
    if exponent > _RESCALE_EXPONENT:
        # Fold the decay into the stored values (they may underflow to 0: fine).
        for c in scheduler.channels:
            c.stored_sent *= math.exp(-exponent)
        scheduler.epoch = now
        exponent = 0.0
    scale = math.exp(exponent)
    sent = 0
    while pending and sent < budget:
        if len(pending) == 1:
            chosen = pending[0]
            limit = budget - sent
        else:
            # Lowest ratio wins; ties go to the channel declared first.
            chosen = min(pending, key=_ratio)
            runner_up = min((c for c in pending if c is not chosen), key=_ratio)
            # Bytes the chosen channel may send before its ratio passes the runner-up's.
            room = (_ratio(runner_up) - _ratio(chosen)) * chosen.priority / scale
            limit = max(1, min(budget - sent, int(room)))
        queued = len(chosen.queue)
        wire, _ = chosen.emit(parts, payload, limit)
        scheduler.taken += queued - len(chosen.queue)
        chosen.stored_sent += wire * scale
        sent += wire
        if not chosen.is_pending:
            pending.remove(chosen)
    return sent


#: What ``Scheduler.next_packets`` and ``Connection.data_to_send`` run: the compiled twin
#: when it is in use (mconn.core.speedups), else the reference above.
active_schedule: Callable[[Scheduler, list[Any], float, int, int], int] = (
    schedule if SPEEDUPS is None else SPEEDUPS.schedule
)


def _ratio(channel: Channel) -> float:
    return channel.stored_sent / channel.priority
