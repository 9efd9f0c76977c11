"""The durable session store: sessions that survive a restart of the process (opt-in).

One idea: the store, its records, its group commit and the sqlite file they go to (the
functions after the class open, check, load and write that file). ``load()`` hands the
sessions over once (a second call returns []), so that their messages are not kept alive by the store after the
Session drops them; ``open`` also raises StoreFormatUnsupported, and StoreError for a
store another process has open; ``commits`` counts transactions, ``path`` and
``node_id`` are what ``open`` was given.

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
at every load and cuts a lone message's wait from ~2.6 ms to ~0.3 ms (bench/RESULTS.md). One dedicated writer thread owns the sqlite
connection after ``open``; at most one transaction is in flight, and what is recorded
meanwhile waits for the next one (so commits grow with the load instead of queueing).
``durable()`` gives a Deferred that fires, in the reactor thread, once everything recorded
before the call is committed: that is what "accepted" may wait for.

Within a transaction the writer coalesces: a message acknowledged before its insert was
committed is never written, and only the last ``acked`` and ``delivered`` count of each
stream is.

``load()`` returns what the file held at ``open``, checked before anything is allocated
from it: sizes and counts are read with SQL aggregates first and compared with the limits,
so a doctored file gets StoreCorrupt naming the value, never a MemoryError.

One module of some 700 lines: the records' rules, the batch that coalesces them, the
schema it writes and the checks that read it back are one design that changes together.
"""

from __future__ import annotations

import collections
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer

from mconn.core.session import MESSAGE_OVERHEAD
from mconn.errors import (
    StoreCorrupt,
    StoreError,
    StoreFormatUnsupported,
    StoreFull,
    StoreOwnedByOtherNode,
)

__all__ = ["FORMAT_VERSION", "SessionStore", "StoredSession", "StoredStream"]

#: The file format this module writes and reads (specs/resume.md section 8.1).
FORMAT_VERSION = 1
#: Queued message bytes past which a commit starts without waiting for ``commit_delay``.
FLUSH_BYTES = 4 * 1024 * 1024
#: sqlite's page size for a new file (specs/resume.md section 8.1). A commit writes whole
#: pages: 4 KiB pages write the least for a commit of one small message (9-19 KB against
#: 34-66 KB, 135-210 KB with 64 KiB pages), 64 KiB pages record 64 KiB messages fastest
#: (2-4x 4 KiB pages); 16 KiB pages record them 2x as fast as 4 KiB pages
#: (bench/session_store_bench.py, bench/RESULTS.md "Durable sessions: the store").
PAGE_SIZE = 16384
#: Pages in the WAL past which a commit folds it into the file (a checkpoint): 4 MiB.
WAL_PAGES = 256
#: Limits of what a session row may hold, checked on record and on load.
MAX_SESSION_ID = 64
MAX_PEER_ID = 256
MAX_CHANNELS = 256
#: Sessions a store may hold: far above what a node keeps (its peers plus
#: ``max_suspended_sessions``); bounds what ``load`` allocates from a doctored file.
MAX_SESSIONS = 1 << 16
#: Counts and sequence numbers are sqlite integers: below 2**63.
MAX_COUNT = (1 << 63) - 1

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL);
CREATE TABLE sessions (
    id BLOB PRIMARY KEY, peer TEXT NOT NULL, outbound INTEGER NOT NULL, channels BLOB NOT NULL);
CREATE TABLE streams (
    session BLOB NOT NULL, channel INTEGER NOT NULL, acked INTEGER NOT NULL, delivered INTEGER NOT NULL,
    PRIMARY KEY (session, channel));
CREATE TABLE messages (
    session BLOB NOT NULL, channel INTEGER NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (session, channel, seq));
"""


@dataclass(frozen=True)
class StoredStream:
    """One channel of a stored session: message ``acked + i`` is ``unacked[i]``."""

    acked: int
    unacked: tuple[bytes, ...]
    delivered: int


@dataclass(frozen=True)
class StoredSession:
    """A session as the store held it at ``open``; ``streams`` has every channel."""

    session_id: bytes
    peer_id: str
    outbound: bool
    channel_ids: tuple[int, ...]
    streams: dict[int, StoredStream]


class _Stream:
    """The store's own counts of one channel, kept in memory to check records."""

    __slots__ = ("acked", "accepted", "delivered", "sizes")

    def __init__(self, acked: int = 0, delivered: int = 0) -> None:
        self.acked = acked
        self.accepted = acked
        self.delivered = delivered
        #: Cost (length + MESSAGE_OVERHEAD) of each unacknowledged message, in order.
        self.sizes: collections.deque[int] = collections.deque()


class _Batch:
    """Records queued for one transaction."""

    __slots__ = ("ops", "acked", "delivered", "nbytes", "upto")

    def __init__(self) -> None:
        #: In order: ("begin", row), ("msg", (session, channel, seq, body)), ("end", session).
        self.ops: list[tuple[str, Any]] = []
        #: (session, channel) -> the last acked / delivered count recorded.
        self.acked: dict[tuple[bytes, int], int] = {}
        self.delivered: dict[tuple[bytes, int], int] = {}
        self.nbytes = 0
        #: The record count this batch brings the file up to.
        self.upto = 0


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
        self._pending = _Batch()
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
        db = _connect(path)
        try:
            _check_or_create(db, path, node_id)
            loaded = _load(db, path, max_bytes)
        except sqlite3.DatabaseError as e:
            db.close()
            raise StoreCorrupt(path, f"sqlite: {e}") from e
        except BaseException:
            db.close()
            raise
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
        batch, self._pending = self._pending, _Batch()
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

    def submit(self, batch: _Batch) -> None:
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
                times = _commit(db, batch)
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


def _commit(db: sqlite3.Connection, batch: _Batch) -> tuple[float, float]:
    """Write one batch in one transaction (in the writer thread); the seconds its
    statements took, and its COMMIT."""
    start = time.perf_counter()
    acked = batch.acked
    db.execute("BEGIN IMMEDIATE")
    messages: list[tuple[bytes, int, int, bytes]] = []
    for kind, value in batch.ops:
        if kind == "msg":
            if value[2] >= acked.get((value[0], value[1]), 0):  # not already acknowledged
                messages.append(value)
            continue
        if messages:
            db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)", messages)
            messages = []
        if kind == "begin":
            session_id, _, _, channels = value
            db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)", value)
            db.executemany("INSERT INTO streams VALUES (?, ?, 0, 0)", [(session_id, c) for c in channels])
        else:
            for table, column in (("messages", "session"), ("streams", "session"), ("sessions", "id")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (value,))
    if messages:
        db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)", messages)
    if acked:
        rows = [(count, session_id, channel_id) for (session_id, channel_id), count in acked.items()]
        db.executemany("UPDATE streams SET acked = ? WHERE session = ? AND channel = ?", rows)
        db.executemany("DELETE FROM messages WHERE seq < ? AND session = ? AND channel = ?", rows)
    if batch.delivered:
        rows = [(count, session_id, channel_id) for (session_id, channel_id), count in batch.delivered.items()]
        db.executemany("UPDATE streams SET delivered = ? WHERE session = ? AND channel = ?", rows)
    written = time.perf_counter()
    db.execute("COMMIT")
    return written - start, time.perf_counter() - written


# -- the file ------------------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    """Open (creating, mode 0600) the file at ``path`` in WAL mode with synchronous=FULL."""
    _make_private(path)
    try:
        # isolation_level=None: transactions are the explicit BEGIN/COMMIT of _commit.
        db = sqlite3.connect(path, timeout=1.0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise StoreCorrupt(path, f"sqlite: {e}") from e
    try:
        _configure(db, path)
    except sqlite3.OperationalError as e:
        db.close()
        if "locked" in str(e):
            raise StoreError(f"session store {path} is in use by another process (sqlite: {e})") from e
        raise StoreCorrupt(path, f"sqlite: {e}") from e
    except sqlite3.DatabaseError as e:
        db.close()
        raise StoreCorrupt(path, f"sqlite: {e}") from e
    except BaseException:
        db.close()
        raise
    return db


def _make_private(path: str) -> None:
    """Create the file (mode 0600) if it is not there; narrow it, and a WAL left by an
    earlier process (sqlite opens that as it finds it), to 0600 if they are wider. The
    file holds session ids, which are resume secrets (section 1.1), and messages; sqlite
    gives the -wal file it creates the mode of the database file."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StoreError(f"session store {path}: its directory {parent} does not exist")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        for other in (path + "-wal", path + "-shm"):
            if os.path.exists(other) and os.stat(other).st_mode & 0o077:
                os.chmod(other, 0o600)
    except OSError as e:
        raise StoreError(f"session store {path}: cannot open: {e}") from e


def _configure(db: sqlite3.Connection, path: str) -> None:
    """The connection's settings (specs/resume.md section 8.1)."""
    # The page size of a new file (set before WAL mode makes it; an existing file keeps
    # its own): PAGE_SIZE says why 16 KiB.
    db.execute(f"PRAGMA page_size={PAGE_SIZE}")
    # One process at a time: the lock is taken by the BEGIN EXCLUSIVE below and held
    # until close; a second node on the same file gets "database is locked". Without a
    # shared-memory index, so no -shm file.
    db.execute("PRAGMA locking_mode=EXCLUSIVE")
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise StoreError(f"session store {path}: sqlite refused WAL mode (journal_mode is {mode})")
    # FULL, not NORMAL: in WAL mode NORMAL does not sync the WAL at each commit, so the
    # last commits may be lost at a power loss; a commit here is a promise.
    db.execute("PRAGMA synchronous=FULL")
    # Fold the WAL into the file every WAL_PAGES pages, and cut it back to 64 MiB after,
    # so that the WAL stays small next to max_bytes.
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    db.execute(f"PRAGMA journal_size_limit={64 << 20}")
    db.execute("BEGIN EXCLUSIVE")
    db.execute("COMMIT")


def _check_or_create(db: sqlite3.Connection, path: str, node_id: str) -> None:
    """Make the schema of an empty file; check an existing one's integrity, version and
    owner."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        db.execute("BEGIN IMMEDIATE")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('format_version', ?), ('node_id', ?)", (FORMAT_VERSION, node_id))
        db.execute("COMMIT")
    problems = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise StoreCorrupt(path, "integrity check: " + "; ".join(map(str, problems)))
    missing = {"meta", "sessions", "streams", "messages"} - tables if tables else set()
    if missing:
        raise StoreCorrupt(path, f"tables missing: {', '.join(sorted(missing))}")
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('format_version', 'node_id')"))
    version = meta.get("format_version")
    if not isinstance(version, int):
        raise StoreCorrupt(path, f"format version is {version!r}, not an integer")
    if version != FORMAT_VERSION:
        raise StoreFormatUnsupported(path, version, FORMAT_VERSION)
    stored = meta.get("node_id")
    if not isinstance(stored, str):
        raise StoreCorrupt(path, f"node id is {stored!r}, not text")
    if stored != node_id:
        raise StoreOwnedByOtherNode(path, stored, node_id)


def _load(db: sqlite3.Connection, path: str, max_bytes: int) -> list[StoredSession]:
    """Every stored session, its sizes and counts checked before they are used."""
    _check_sizes(db, path, max_bytes)
    sessions: dict[bytes, StoredSession] = {}
    rows = db.execute("SELECT id, peer, outbound, channels FROM sessions ORDER BY rowid")
    for session_id, peer_id, outbound, channels in rows:
        if not isinstance(session_id, bytes) or not isinstance(peer_id, str) or not isinstance(channels, bytes):
            raise StoreCorrupt(path, f"session row of types {type(session_id).__name__}, {type(peer_id).__name__}")
        if outbound not in (0, 1) or len(set(channels)) != len(channels):
            raise StoreCorrupt(path, f"session {session_id.hex()}: outbound {outbound!r}, channels {channels.hex()}")
        sessions[session_id] = StoredSession(session_id, peer_id, bool(outbound), tuple(channels), {})
    counts: dict[tuple[bytes, int], tuple[int, int]] = {}
    for session_id, channel_id, acked, delivered in db.execute("SELECT * FROM streams"):
        stored = sessions.get(session_id)
        if stored is None or channel_id not in stored.channel_ids:
            raise StoreCorrupt(path, f"stream of channel {channel_id!r} outside its session {session_id!r}")
        if not (isinstance(acked, int) and isinstance(delivered, int) and acked >= 0 and delivered >= 0):
            raise StoreCorrupt(
                path, f"channel {channel_id} of session {session_id.hex()}: acked {acked!r}, delivered {delivered!r}"
            )
        counts[session_id, channel_id] = (acked, delivered)
    held: dict[tuple[bytes, int], list[bytes]] = {key: [] for key in counts}
    query = "SELECT session, channel, seq, body FROM messages ORDER BY session, channel, seq"
    for session_id, channel_id, seq, body in db.execute(query):
        key = (session_id, channel_id)
        if key not in counts or not isinstance(body, bytes):
            raise StoreCorrupt(path, f"message {seq!r} of channel {channel_id!r} outside a stored stream")
        expected = counts[key][0] + len(held[key])
        if seq != expected:
            raise StoreCorrupt(
                path, f"channel {channel_id} of session {session_id.hex()}: message {seq!r} where {expected} was due"
            )
        held[key].append(body)
    for (session_id, channel_id), (acked, delivered) in counts.items():
        sessions[session_id].streams[channel_id] = StoredStream(acked, tuple(held[session_id, channel_id]), delivered)
    for stored in sessions.values():
        lacking = sorted(set(stored.channel_ids) - set(stored.streams))
        if lacking:
            raise StoreCorrupt(path, f"session {stored.session_id.hex()} lacks the streams of channels {lacking}")
    return list(sessions.values())


def _check_sizes(db: sqlite3.Connection, path: str, max_bytes: int) -> None:
    """Counts and sizes, read by aggregates (nothing large is read), against the limits."""
    (sessions,) = db.execute("SELECT count(*) FROM sessions").fetchone()
    if sessions > MAX_SESSIONS:
        raise StoreCorrupt(path, f"{sessions} sessions, more than the {MAX_SESSIONS} a store may hold")
    longest = db.execute("SELECT max(length(id)), max(length(peer)), max(length(channels)) FROM sessions").fetchone()
    for value, limit, what in zip(
        longest, (MAX_SESSION_ID, MAX_PEER_ID, MAX_CHANNELS), ("session id", "peer id", "channel list")
    ):
        if value is not None and value > limit:
            raise StoreCorrupt(path, f"a {what} of length {value}, more than {limit}")
    (streams,) = db.execute("SELECT count(*) FROM streams").fetchone()
    if streams > sessions * MAX_CHANNELS:
        raise StoreCorrupt(path, f"{streams} streams for {sessions} sessions")
    count, total, largest = db.execute(
        "SELECT count(*), total(length(body)), max(length(body)) FROM messages"
    ).fetchone()
    if largest is not None and largest > max_bytes:
        raise StoreCorrupt(path, f"a message of {largest} bytes, larger than the store's limit of {max_bytes}")
    used = int(total) + count * MESSAGE_OVERHEAD
    if used > max_bytes:
        raise StoreCorrupt(
            path,
            f"{count} messages of {int(total)} bytes take {used} bytes, more than the store's limit of {max_bytes}",
        )
    extremes = db.execute(
        "SELECT min(min(acked), min(delivered)), max(max(acked), max(delivered)) FROM streams"
    ).fetchone()
    low, high = extremes
    seqs = db.execute("SELECT min(seq), max(seq) FROM messages").fetchone()
    for value in (low, seqs[0]):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise StoreCorrupt(path, f"a count or sequence number of {value!r}")
    for value in (high, seqs[1]):
        if value is not None and (not isinstance(value, int) or value > MAX_COUNT):
            raise StoreCorrupt(path, f"a count or sequence number of {value!r}")
