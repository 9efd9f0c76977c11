"""Session state that outlives a connection: counters, the recovery buffer, acks. Pure.

Theory of operation (specs/resume.md). A session is the logical link between two node
ids; transports come and go beneath it. Per channel and per direction it keeps counts
of whole messages:

* sending: ``acked`` is how many messages the peer has confirmed delivering to its
  reactor; ``unacked`` holds, in order, every message accepted since (sent or not). A
  message's sequence number is its index in the channel's stream, so message
  ``acked + i`` is ``unacked[i]``.
* receiving: ``delivered`` counts the messages handed to our reactor.

Acknowledgements carry ``delivered`` per channel, cumulatively; the sender drops what
they cover. On resume each side tells the other its ``delivered`` counts and re-sends,
whole and in order, every message past the peer's count. Messages that were partly
received when the transport broke are discarded by the receiver (it counts only whole
messages) and re-sent whole. So within the grace window each accepted message is
delivered exactly once, in order per channel.

The recovery buffer (all ``unacked`` bytes of the session) is bounded by
``recovery_buffer_bytes``: a full buffer refuses new messages (backpressure), it never
drops one. So that a bulk transfer cannot starve a high-priority channel of buffer room,
each channel may also keep up to ``channel_reserve_bytes`` unacknowledged outside that
shared bound, and a channel with nothing unacknowledged always gets one message in (so
no message that fits its channel is refused forever). Memory stays bounded by
``recovery_buffer_bytes`` plus, per channel, the reserve and one message.

Every bound counts a message as its length plus ``MESSAGE_OVERHEAD``: what a held
message costs beyond its payload. Counted by payload alone, empty messages would be
free, and a peer that never acknowledges could make the node keep any number of them.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import math
from collections.abc import Iterable

from mconn.core.speedups import SPEEDUPS

# AckError lives with the other errors; ``from mconn.core.session import AckError`` still works.
from mconn.errors import AckError, warn_renamed


#: What one unacknowledged message costs beyond its payload, in bytes: a bytes object's
#: header and its slot in a channel's deque measure 41-42 bytes (tracemalloc, CPython
#: 3.11); 64 covers the allocator's rounding. The recovery buffer, the channel reserve
#: and the node's budget count ``len(message) + MESSAGE_OVERHEAD`` per message
#: (specs/resume.md section 1.3).
MESSAGE_OVERHEAD = 64


class _Stream:
    __slots__ = ("acked", "unacked", "unacked_bytes", "delivered")

    def __init__(self) -> None:
        self.acked = 0
        self.unacked: collections.deque[bytes] = collections.deque()
        self.unacked_bytes = 0
        self.delivered = 0


#: The stream of every channel that has carried nothing yet in a session: one, shared and
#: never written (the first message accepted or delivered on a channel gives it a stream
#: of its own), so an idle peer costs no stream and no deque per channel. Its ``unacked``
#: is a tuple: a write that skipped that step fails instead of sharing.
_IDLE = _Stream.__new__(_Stream)
# The tuple is on purpose (see above): typed as the deque every other stream has.
_IDLE.acked, _IDLE.unacked, _IDLE.unacked_bytes, _IDLE.delivered = 0, (), 0, 0  # type: ignore[assignment]


class _IdleTable(dict[int, _Stream]):
    """A streams table whose channels are all ``_IDLE``, shared by every session over the
    same channels (``_idle_table``); a session copies it before its first write."""

    __slots__ = ()


#: channel ids (a tuple) -> their shared _IdleTable; a handful per node.
_IDLE_TABLES: dict[tuple[int, ...], dict[int, _Stream]] = {}


def _idle_table(channel_ids: Iterable[int]) -> dict[int, _Stream]:
    """The streams table of a new session: shared while idle (one dict fewer per peer
    that never carries a message), a plain dict for ids that are not a tuple."""
    if type(channel_ids) is not tuple:
        return dict.fromkeys(channel_ids, _IDLE)
    table: dict[int, _Stream] | None = _IDLE_TABLES.get(channel_ids)
    if table is None:
        table = _IdleTable.fromkeys(channel_ids, _IDLE)
        if len(_IDLE_TABLES) < 64:
            _IDLE_TABLES[channel_ids] = table
    return table


class Budget:
    """Unacknowledged bytes across every session of a node (``Config.max_unacked_bytes``):
    past ``limit`` a session takes a message only into a channel's reserve."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.used = 0


class Session:
    """One session's per-channel counters and recovery buffer.

    :param session_id: 16 random bytes, the session's name and resume secret.
    :param channel_ids: the channels both sides agreed on when the session started.
    :param recovery_buffer_bytes: bound on unacknowledged message bytes.
    :param ack_every_messages: send an ack after this many deliveries...
    :param ack_every_bytes: ...or this many delivered bytes, whichever comes first.
    :param budget: the node-wide ``Budget`` it shares with the node's other sessions
        (unbounded if None); ``release`` gives its bytes back when the session ends.
    """

    __slots__ = (
        "id",
        "_streams",
        "recovery_buffer_bytes",
        "channel_reserve_bytes",
        "unacked_bytes",
        "_ack_every_messages",
        "_ack_every_bytes",
        "_ack_messages_left",
        "_ack_bytes_left",
        "resent",
        "_budget",
    )

    def __init__(
        self,
        session_id: bytes,
        channel_ids: Iterable[int],
        *,
        recovery_buffer_bytes: int,
        ack_every_messages: int,
        ack_every_bytes: int,
        channel_reserve_bytes: int = 65536,
        budget: Budget | None = None,
    ) -> None:
        self.id = session_id
        self._budget = budget if budget is not None else Budget(math.inf)
        #: channel id -> its _Stream. Until a channel carries something, a table shared by
        #: the sessions over the same channels (``_IdleTable``), copied at the first write.
        self._streams = _idle_table(channel_ids)
        self.recovery_buffer_bytes = recovery_buffer_bytes
        self.channel_reserve_bytes = channel_reserve_bytes
        self.unacked_bytes = 0
        self._ack_every_messages = ack_every_messages
        self._ack_every_bytes = ack_every_bytes
        #: Deliveries and bytes left before an ack is due (counting down: the cheapest
        #: test per message).
        self._ack_messages_left = ack_every_messages
        self._ack_bytes_left = ack_every_bytes
        #: Counters for observability (specs/telemetry.md).
        self.resent = 0

    @property
    def channel_ids(self) -> frozenset[int]:
        return frozenset(self._streams)

    def proves(self, session_id: bytes) -> bool:
        """Whether ``session_id`` names this session (constant-time comparison)."""
        return hmac.compare_digest(self.id, session_id)

    # -- sending -------------------------------------------------------------------

    def has_room(self, channel_id: int, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` on the channel fits the recovery buffer now
        (``admit`` applies the same test)."""
        stream = self._streams[channel_id]
        budget = self._budget
        nbytes += MESSAGE_OVERHEAD
        return (
            not stream.unacked
            or stream.unacked_bytes + nbytes <= self.channel_reserve_bytes
            or (self.unacked_bytes + nbytes <= self.recovery_buffer_bytes and budget.used + nbytes <= budget.limit)
        )

    def admit(self, channel_id: int, message: bytes) -> int | None:
        """``has_room`` and ``record_sent`` in one call, the per-message path: the
        message's sequence number, or None (nothing recorded) when it does not fit."""
        stream = self._streams[channel_id]
        if stream is _IDLE:  # the per-message path tests it here and calls _own only then
            stream = self._own(channel_id)
        size = len(message) + MESSAGE_OVERHEAD
        unacked = stream.unacked
        budget = self._budget
        if (
            unacked
            and stream.unacked_bytes + size > self.channel_reserve_bytes
            and (self.unacked_bytes + size > self.recovery_buffer_bytes or budget.used + size > budget.limit)
        ):
            return None
        unacked.append(message)
        stream.unacked_bytes += size
        self.unacked_bytes += size
        budget.used += size
        return stream.acked + len(unacked) - 1

    def admit_many(self, channel_id: int, messages: list[bytes], total: int) -> int | None:
        """``admit`` of all of ``messages`` (``total`` bytes) in one step, when the
        session-wide bounds take them all: the first one's sequence number. Then ``admit``
        one at a time would have taken each (the counts it tests only grow, and it
        refuses only past ``recovery_buffer_bytes`` or the node's budget). None, with
        nothing recorded, when they do not: the caller admits them one by one."""
        total += MESSAGE_OVERHEAD * len(messages)
        budget = self._budget
        if self.unacked_bytes + total > self.recovery_buffer_bytes or budget.used + total > budget.limit:
            return None
        stream = self._own(channel_id)
        first = stream.acked + len(stream.unacked)
        stream.unacked.extend(messages)
        stream.unacked_bytes += total
        self.unacked_bytes += total
        budget.used += total
        return first

    def record_sent(self, channel_id: int, message: bytes) -> int:
        """Keep an accepted message until it is acknowledged; returns its sequence number."""
        stream = self._own(channel_id)
        stream.unacked.append(message)
        size = len(message) + MESSAGE_OVERHEAD
        stream.unacked_bytes += size
        self.unacked_bytes += size
        self._budget.used += size
        return stream.acked + len(stream.unacked) - 1

    def _own(self, channel_id: int) -> _Stream:
        """The channel's stream, to be written: its own (``_IDLE`` is replaced first)."""
        stream = self._streams[channel_id]
        if stream is _IDLE:
            stream = self._owned_streams()[channel_id] = _Stream()
        return stream

    def _owned_streams(self) -> dict[int, _Stream]:
        """The streams table, to be written: the shared idle one is copied first."""
        streams = self._streams
        if type(streams) is _IdleTable:
            streams = self._streams = dict(streams)
        return streams

    def accepted(self, channel_id: int) -> int:
        """How many messages were accepted on the channel in this session."""
        stream = self._streams[channel_id]
        return stream.acked + len(stream.unacked)

    def acked(self, channel_id: int) -> int:
        return self._streams[channel_id].acked

    def on_ack(self, delivered: dict[int, int]) -> list[tuple[int, int, int]]:
        """Drop what the peer confirms; returns ``(channel, old_acked, new_acked)`` per change.

        Raises AckError for a channel outside the session, a count beyond what was
        accepted, or a count going backwards.
        """
        changes = []
        for channel_id, count in delivered.items():
            stream = self._streams.get(channel_id)
            if stream is None:
                raise AckError(f"ack names channel {channel_id:#04x}, which is not in this session")
            accepted = stream.acked + len(stream.unacked)
            if count > accepted:
                raise AckError(
                    f"ack says {count} messages delivered on channel {channel_id:#04x}, but only {accepted} were sent"
                )
            if count < stream.acked:
                raise AckError(f"ack count for channel {channel_id:#04x} went backwards: {count} after {stream.acked}")
            old = stream.acked
            if count == old:
                continue
            unacked = stream.unacked
            if count == accepted:  # all of them (the usual ack of a sender at rest)
                freed = stream.unacked_bytes
                unacked.clear()
            else:
                freed = sum(map(len, itertools.islice(unacked, count - old))) + MESSAGE_OVERHEAD * (count - old)
                popleft = unacked.popleft
                for _ in itertools.repeat(None, count - old):
                    popleft()
            stream.unacked_bytes -= freed
            self.unacked_bytes -= freed
            self._budget.used -= freed
            stream.acked = count
            changes.append((channel_id, old, count))
        return changes

    def to_resend(self, peer_delivered: dict[int, int]) -> dict[int, list[bytes]]:
        """On resume: apply the peer's counts, then every message still unacknowledged."""
        self.on_ack({c: n for c, n in peer_delivered.items() if c in self._streams})
        resend = {c: list(s.unacked) for c, s in self._streams.items() if s.unacked}
        self.resent += sum(len(m) for m in resend.values())
        return resend

    def restore_stream(self, channel_id: int, *, acked: int, unacked: Iterable[bytes], delivered: int) -> None:
        """Set a channel's counts and recovery buffer as a session store kept them (a
        node restarted: specs/resume.md section 9). The messages count against the
        buffer and the node's budget as if accepted now; none is refused."""
        stream = self._own(channel_id)
        if stream.acked or stream.unacked or stream.delivered:
            raise ValueError(f"channel {channel_id:#04x} of this session carried messages already: cannot restore it")
        stream.acked = acked
        stream.unacked.extend(unacked)
        size = sum(map(len, stream.unacked)) + MESSAGE_OVERHEAD * len(stream.unacked)
        stream.unacked_bytes = size
        self.unacked_bytes += size
        self._budget.used += size
        stream.delivered = delivered

    def release(self) -> None:
        """The session ended: its unacknowledged bytes leave the node-wide budget (the
        messages stay, counted as not confirmed delivered)."""
        self._budget.used -= self.unacked_bytes
        self._budget = Budget(math.inf)

    def carried_traffic(self) -> bool:
        """Whether any message was accepted or delivered in this session."""
        return any(s.acked or s.unacked or s.delivered for s in self._streams.values())

    def unconfirmed(self) -> dict[int, int]:
        """Per channel, messages accepted whose delivery the peer has not confirmed yet
        (non-zero only); some may already be with its reactor, their ack on its way."""
        return {c: len(s.unacked) for c, s in self._streams.items() if s.unacked}

    def undelivered(self) -> dict[int, int]:
        """Deprecated name of :meth:`unconfirmed`."""
        warn_renamed("Session.undelivered()", "Session.unconfirmed()")
        return self.unconfirmed()

    # -- receiving -----------------------------------------------------------------

    def record_delivered(self, channel_id: int, nbytes: int) -> bool:
        """Count a message handed to our reactor; True when an ack is due."""
        stream = self._streams[channel_id]
        if stream is _IDLE:
            stream = self._own(channel_id)
        stream.delivered += 1
        self._ack_messages_left -= 1
        self._ack_bytes_left -= nbytes
        return self._ack_messages_left <= 0 or self._ack_bytes_left <= 0

    @property
    def ack_pending(self) -> bool:
        return self._ack_messages_left < self._ack_every_messages

    def take_ack(self) -> dict[int, int]:
        """The counts to acknowledge now (every channel with deliveries)."""
        self._ack_messages_left = self._ack_every_messages
        self._ack_bytes_left = self._ack_every_bytes
        return self.delivered_counts()

    def delivered_counts(self) -> dict[int, int]:
        return {c: s.delivered for c, s in self._streams.items() if s.delivered}

    def delivered(self, channel_id: int) -> int:
        return self._streams[channel_id].delivered


#: The reference per-message counters: the compiled twin's specification
#: (mconn/core/_speedups.pyx, tests/core/test_speedups_session.py).
reference_admit = Session.admit
reference_record_delivered = Session.record_delivered
if SPEEDUPS is not None:
    # The twin's functions are methods like these (Cython binds them to the instance).
    Session.admit = SPEEDUPS.admit  # type: ignore[method-assign]
    Session.record_delivered = SPEEDUPS.record_delivered  # type: ignore[method-assign]
