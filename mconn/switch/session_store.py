"""The durable session store: sessions that survive a restart of the process (opt-in).

One idea: the store, its records and their group commit; the sqlite file they go to (its
schema, the checks at open, the load, the transaction) is ``session_store_file``.
``load()`` hands the sessions over once (a second call returns []), so that their
messages are not kept alive by the store after the Session drops them; ``open`` also
raises StoreFormatUnsupported, and StoreError for a store another process has open;
``commits`` counts transactions, ``path`` and ``node_id`` are what ``open`` was given.

Theory of operation (specs/resume.md section 8). The store keeps, per session, what
``mconn.core.session.Session`` keeps in memory: the session id, the peer, the direction,
the channels, and per channel ``acked``, the unacknowledged messages and ``delivered``.
It is one sqlite3 file in WAL mode with ``synchronous=FULL``.

Recording is cheap and synchronous: ``begin``, ``accepted``, ``acked``, ``delivered`` and
``end`` check the record against the store's own counts (a bad one raises StoreError and
changes nothing), update those counts in memory, and queue the record. Nothing touches the
file in the caller's (the Twisted reactor's) thread. Queued records are written by
**group commit**: one transaction, so one fsync of the WAL, for everything recorded since
the last one, at most ``commit_delay`` seconds after the first queued record (at once past
``FLUSH_BYTES`` queued message bytes). The default, 0, commits at the next turn of the
reactor: the grouping comes from the commit in flight, which measured as fast as any delay
at every load and cuts a lone message's wait from ~2.6 ms to ~0.3 ms (bench/RESULTS.md).
One dedicated writer thread owns the sqlite connection after ``open``; at most one
transaction is in flight, and what is recorded meanwhile waits for the next one (so
commits grow with the load instead of queueing).
``durable()`` gives a Deferred that fires, in the reactor thread, once everything recorded
before the call is committed: that is what "accepted" may wait for.

Within a transaction the writer coalesces: a message acknowledged before its insert was
committed is never written, and only the last ``acked`` and ``delivered`` count of each
stream is.

``load()`` returns what the file held at ``open``, checked before anything is allocated
from it (``session_store_file.open_file``).
"""

from __future__ import annotations

import collections
import queue
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any

from twisted.internet import defer

from mconn.core.session import MESSAGE_OVERHEAD
from mconn.errors import StoreError, StoreFull
from mconn.switch import session_store_file
from mconn.switch.session_store_file import (
    FORMAT_VERSION,
    MAX_COUNT,
    MAX_PEER_ID,
    MAX_SESSION_ID,
    Batch,
    StoredSession,
    StoredStream,
)

__all__ = ["FORMAT_VERSION", "SessionStore", "StoredSession", "StoredStream"]

#: Queued message bytes past which a commit starts without waiting for ``commit_delay``.
FLUSH_BYTES = 4 * 1024 * 1024


class _Stream:
    """The store's own counts of one channel, kept in memory to check records."""

    __slots__ = ("acked", "accepted", "delivered", "sizes")

    def __init__(self, acked: int = 0, delivered: int = 0) -> None:
        self.acked = acked
        self.accepted = acked
        self.delivered = delivered
        #: Cost (length + MESSAGE_OVERHEAD) of each unacknowledged message, in order.
        self.sizes: collections.deque[int] = collections.deque()


class SessionStore:
    """Durable sessions in one sqlite3 file (specs/resume.md section 8).

    Made by :meth:`open`. Records raise StoreError (a subclass naming the values) and
    change nothing when they contradict the store's counts; StoreFull when a message would
    pass ``max_bytes``. After a failed commit every record and ``durable()`` fails with
    the StoreError of that failure.
    """

    def __init__(self, path: str, node_id: str, db: sqlite3.Connection, *, max_bytes: int, clock, commit_delay: float):
        self.path = path
        self.node_id = node_id
        self.limit = max_bytes
        self.used_bytes = 0
        #: Transactions committed since open (each one fsync of the WAL).
        self.commits = 0
        #: The writer thread's wall time since open in the statements of its transactions,
        #: and in their COMMIT (the WAL's fsync, and a checkpoint's now and then).
        self.write_seconds = 0.0
        self.sync_seconds = 0.0
        self._clock = clock
        self._commit_delay = commit_delay
        self._sessions: dict[bytes, dict[int, _Stream]] = {}
        self._loaded: list[StoredSession] = []
        self._pending = Batch()
        self._recorded = 0  # records taken since open
        self._committed = 0  # of those, how many are in the file
        self._in_flight = False
        self._timer = None
        self._waiters: collections.deque[tuple[int, defer.Deferred]] = collections.deque()
        self._failure: StoreError | None = None
        #: The close() Deferreds while closing (None before close is called).
        self._close_waiters: list[defer.Deferred] | None = None
        self._closed = False
        self._writer = _Writer(db, path, self._from_writer)

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        node_id: str,
        *,
        max_bytes: int,
        reactor=None,
        commit_delay: float = 0.0,
    ) -> SessionStore:
        """Create the store at ``path`` or open the one there, and read what it holds.

        ``reactor`` provides ``callLater`` and ``callFromThread`` (the global Twisted
        reactor if None). Raises StoreError when the parent directory is missing,
        StoreOwnedByOtherNode for another node's store, StoreFormatUnsupported for
        another format version, StoreCorrupt for a file that is not a sound store.
        """
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise StoreError(f"session store {path}: max_bytes must be a positive integer, not {max_bytes!r}")
        if not commit_delay >= 0:
            raise StoreError(f"session store {path}: commit_delay must be >= 0 seconds, not {commit_delay!r}")
        if reactor is None:
            from twisted.internet import reactor  # the edge: only if none was given
        db, loaded = session_store_file.open_file(path, node_id, max_bytes)
        store = cls(path, node_id, db, max_bytes=max_bytes, clock=reactor, commit_delay=commit_delay)
        store._adopt(loaded)
        store._writer.start()
        return store

    def _adopt(self, loaded: list[StoredSession]) -> None:
        """Take the loaded sessions' counts as the store's own."""
        self._loaded = loaded
        for stored in loaded:
            streams = self._sessions[stored.session_id] = {}
            for channel_id, s in stored.streams.items():
                stream = streams[channel_id] = _Stream(s.acked, s.delivered)
                stream.accepted = s.acked + len(s.unacked)
                stream.sizes.extend(len(m) + MESSAGE_OVERHEAD for m in s.unacked)
                self.used_bytes += sum(stream.sizes)

    def load(self) -> list[StoredSession]:
        """The sessions the file held at ``open``, handed over once: the store keeps no
        reference to them (their messages are the caller's to drop when acknowledged),
        so a later call returns an empty list."""
        loaded, self._loaded = self._loaded, []
        return loaded

    # -- recording -----------------------------------------------------------------

    def begin(self, session_id: bytes, peer_id: str, outbound: bool, channel_ids: Iterable[int]) -> None:
        """A session started: keep it, every channel's counts at zero."""
        self._check_usable()
        channels = tuple(channel_ids)
        if not isinstance(session_id, bytes) or not 0 < len(session_id) <= MAX_SESSION_ID:
            raise StoreError(
                f"session store {self.path}: a session id is 1 to {MAX_SESSION_ID} bytes, not {session_id!r}"
            )
        if session_id in self._sessions:
            raise StoreError(f"session store {self.path}: session {session_id.hex()} is already stored")
        if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_PEER_ID:
            raise StoreError(f"session store {self.path}: a peer id is 1 to {MAX_PEER_ID} characters, not {peer_id!r}")
        bad = [c for c in channels if not isinstance(c, int) or not 0 <= c <= 255]
        if bad or len(set(channels)) != len(channels):
            raise StoreError(
                f"session store {self.path}: channel ids must be distinct integers 0..255, not {list(channels)!r}"
            )
        self._sessions[session_id] = {c: _Stream() for c in channels}
        self._queue(("begin", (session_id, peer_id, int(bool(outbound)), bytes(channels))), 0)

    def accepted(self, session_id: bytes, channel_id: int, seq: int, message: bytes) -> None:
        """Message ``seq`` was accepted for sending on the channel: keep it until acked.

        ``seq`` must be the channel's next one (``acked`` + the messages held)."""
        stream = self._stream(session_id, channel_id)
        if not isinstance(seq, int) or seq != stream.accepted:
            what = (
                "not an integer"
                if not isinstance(seq, int)
                else "negative"
                if seq < 0
                else "not contiguous with the stream"
            )
            raise StoreError(
                f"session store {self.path}: sequence number {seq!r} on channel {channel_id:#04x} of session "
                f"{session_id.hex()} is {what}: {stream.acked} acked and {stream.accepted - stream.acked} held, "
                f"so the next is {stream.accepted}"
            )
        if not isinstance(message, bytes):
            message = bytes(message)
        size = len(message) + MESSAGE_OVERHEAD
        if self.used_bytes + size > self.limit:
            raise StoreFull(self.path, self.used_bytes, self.limit, size)
        stream.accepted += 1
        stream.sizes.append(size)
        self.used_bytes += size
        self._queue(("msg", (session_id, channel_id, seq, message)), len(message))

    def acked(self, session_id: bytes, channel_id: int, count: int) -> None:
        """The peer confirmed the channel's first ``count`` messages: drop those held."""
        stream = self._stream(session_id, channel_id)
        if not isinstance(count, int) or count < stream.acked or count > stream.accepted:
            what = "went backwards" if isinstance(count, int) and count < stream.acked else "is out of range"
            raise StoreError(
                f"session store {self.path}: acked count {count!r} on channel {channel_id:#04x} of session "
                f"{session_id.hex()} {what}: acked is {stream.acked}, {stream.accepted} accepted"
            )
        for _ in range(count - stream.acked):
            self.used_bytes -= stream.sizes.popleft()
        stream.acked = count
        self._pending.acked[session_id, channel_id] = count
        self._queue(None, 0)

    def delivered(self, session_id: bytes, channel_id: int, count: int) -> None:
        """The channel's first ``count`` received messages were handed to our reactor."""
        stream = self._stream(session_id, channel_id)
        if not isinstance(count, int) or not stream.delivered <= count <= MAX_COUNT:
            raise StoreError(
                f"session store {self.path}: delivered count {count!r} on channel {channel_id:#04x} of session "
                f"{session_id.hex()} went backwards or is out of range: delivered is {stream.delivered}"
            )
        stream.delivered = count
        self._pending.delivered[session_id, channel_id] = count
        self._queue(None, 0)

    def end(self, session_id: bytes) -> None:
        """The session is over: forget it and everything it held."""
        self._check_usable()
        streams = self._sessions.pop(session_id, None)
        if streams is None:
            raise StoreError(f"session store {self.path}: no session {session_id!r} to end")
        self.used_bytes -= sum(sum(s.sizes) for s in streams.values())
        batch = self._pending
        for channel_id in streams:
            batch.acked.pop((session_id, channel_id), None)
            batch.delivered.pop((session_id, channel_id), None)
        self._queue(("end", session_id), 0)

    def _stream(self, session_id: bytes, channel_id: int) -> _Stream:
        self._check_usable()
        if not isinstance(channel_id, int):  # 1.0 would find channel 1, and go into the file as a REAL
            raise StoreError(f"session store {self.path}: a channel id is an integer, not {channel_id!r}")
        streams = self._sessions.get(session_id)
        if streams is None:
            raise StoreError(f"session store {self.path}: no session {session_id!r}")
        stream = streams.get(channel_id)
        if stream is None:
            raise StoreError(
                f"session store {self.path}: channel {channel_id!r} is not in session {session_id.hex()} "
                f"(channels {sorted(streams)})"
            )
        return stream

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._close_waiters is not None:
            raise StoreError(f"session store {self.path} is closed")

    # -- group commit --------------------------------------------------------------

    def _queue(self, op: tuple[str, Any] | None, nbytes: int) -> None:
        """Queue one record; start the commit timer at the first, or commit at once past
        FLUSH_BYTES."""
        batch = self._pending
        if op is not None:
            batch.ops.append(op)
        batch.nbytes += nbytes
        self._recorded += 1
        if batch.nbytes >= FLUSH_BYTES:
            self._flush()
        elif self._timer is None and not self._in_flight:
            self._timer = self._clock.callLater(self._commit_delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._flush()

    def _flush(self) -> None:
        """Hand the queued records to the writer, unless a transaction is in flight (then
        they go when it returns)."""
        if self._in_flight or self._committed == self._recorded or self._failure is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, Batch()
        batch.upto = self._recorded
        self._in_flight = True
        self._writer.submit(batch)

    def _from_writer(self, upto: int, error: BaseException | None, times: tuple[float, float] = (0.0, 0.0)) -> None:
        """Called by the writer thread: hop to the reactor thread."""
        self._clock.callFromThread(self._committed_upto, upto, error, times)

    def _committed_upto(self, upto: int, error: BaseException | None, times: tuple[float, float] = (0.0, 0.0)) -> None:
        """In the reactor thread: a transaction (or the close, ``upto`` -1) ended; fire
        what it made durable."""
        self._in_flight = False
        if upto < 0:
            self._closed_file(error)
            return
        if error is not None:
            self._fail(error)
        else:
            self.commits += 1
            self.write_seconds += times[0]
            self.sync_seconds += times[1]
            self._committed = upto
            waiters = self._waiters
            while waiters and waiters[0][0] <= upto:
                waiters.popleft()[1].callback(None)
        closing = self._close_waiters is not None
        if self._failure is None and self._committed != self._recorded:
            if closing or self._timer is None or self._pending.nbytes >= FLUSH_BYTES:
                # Records came while the transaction ran: their delay is already spent.
                self._flush()
        elif closing:
            self._in_flight = True
            self._writer.close()

    def _closed_file(self, error: BaseException | None) -> None:
        self._closed = True
        if error is not None and self._failure is None:
            self._fail(error)
        waiters, self._close_waiters = self._close_waiters or [], []
        for d in waiters:
            if self._failure is None:
                d.callback(None)
            else:
                d.errback(self._failure)

    def _fail(self, error: BaseException) -> None:
        """A commit failed: the store takes no more records; every waiter hears it."""
        self._failure = error if isinstance(error, StoreError) else StoreError(f"session store {self.path}: {error}")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, self._waiters = self._waiters, collections.deque()
        for _, d in waiters:
            d.errback(self._failure)

    def durable(self) -> defer.Deferred:
        """A Deferred that fires None once every record taken before this call is
        committed (fails with StoreError if the commit fails)."""
        if self._failure is not None:
            return defer.fail(self._failure)
        if self._committed == self._recorded:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._waiters.append((self._recorded, d))
        return d

    def close(self) -> defer.Deferred:
        """Commit what is queued, then close the file. The Deferred fires None after,
        or fails with the StoreError of a commit that failed."""
        if self._closed:
            return defer.fail(self._failure) if self._failure is not None else defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        if self._close_waiters is not None:
            self._close_waiters.append(d)
            return d
        self._close_waiters = [d]
        if self._in_flight:
            return d  # _committed_upto goes on
        if self._failure is None and self._committed != self._recorded:
            self._flush()
        else:
            self._in_flight = True
            self._writer.close()
        return d


class _Writer:
    """The one thread that writes the file: takes batches from a queue, commits each in
    one transaction, reports ``(upto, error)`` through ``report`` (from its thread)."""

    def __init__(self, db: sqlite3.Connection, path: str, report) -> None:
        self._db = db
        self._path = path
        self._report = report
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"session-store {path}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self._queue.put(batch)

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        db = self._db
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            try:
                times = session_store_file.commit(db, batch)
            except Exception as e:  # sqlite3.Error, OSError: the store fails, said to every waiter
                try:
                    db.rollback()
                except sqlite3.Error:
                    pass
                self._report(batch.upto, StoreError(f"session store {self._path}: commit failed: {e}"))
                continue
            self._report(batch.upto, None, times)
        try:
            db.close()
            self._report(-1, None)
        except sqlite3.Error as e:
            self._report(-1, StoreError(f"session store {self._path}: close failed: {e}"))
