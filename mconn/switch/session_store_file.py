"""The durable session store's file: one sqlite3 file, opened, checked, read and written.

``mconn.switch.session_store.SessionStore`` decides what to record and when; this module
is what that means on disk (specs/resume.md section 8.1): the schema and its format
version, the connection's settings (WAL mode, ``synchronous=FULL``, the exclusive lock
that keeps a second process out), the checks at open, the load, and the one transaction
a batch of records is written in.

``open_file`` returns the connection and what the file held. It reads nothing large
before checking it: counts and sizes are read with SQL aggregates first and compared
with the limits, so a doctored file gets StoreCorrupt naming the value, never a
MemoryError; and sqlite's ``quick_check`` runs first, so damage in pages no load reads
(the free list a later commit would allocate from) refuses the file at open instead of
failing the store at some later commit.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from mconn.core.session import MESSAGE_OVERHEAD
from mconn.errors import StoreCorrupt, StoreError, StoreFormatUnsupported, StoreOwnedByOtherNode

__all__ = [
    "FORMAT_VERSION",
    "MAX_CHANNELS",
    "MAX_COUNT",
    "MAX_PEER_ID",
    "MAX_SESSIONS",
    "MAX_SESSION_ID",
    "PAGE_SIZE",
    "WAL_PAGES",
    "Batch",
    "StoredSession",
    "StoredStream",
    "commit",
    "open_file",
]

#: The file format this module writes and reads (specs/resume.md section 8.1).
FORMAT_VERSION = 1
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


class Batch:
    """Records queued for one transaction: what ``commit`` writes."""

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


# -- opening -------------------------------------------------------------------------


def open_file(path: str, node_id: str, max_bytes: int) -> tuple[sqlite3.Connection, list[StoredSession]]:
    """Create the store's file at ``path`` or open the one there, locked for this
    process, and read what it holds.

    Raises StoreError when the parent directory is missing or another process has the
    file open, StoreOwnedByOtherNode for another node's file, StoreFormatUnsupported for
    another format version, StoreCorrupt for a file that is not a sound store.
    """
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
    return db, loaded


def _connect(path: str) -> sqlite3.Connection:
    """Open (creating, mode 0600) the file at ``path`` in WAL mode with synchronous=FULL."""
    _make_private(path)
    try:
        # isolation_level=None: transactions are the explicit BEGIN/COMMIT of commit().
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
        longest, (MAX_SESSION_ID, MAX_PEER_ID, MAX_CHANNELS), ("session id", "peer id", "channel list"), strict=True
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


# -- writing -------------------------------------------------------------------------


def commit(db: sqlite3.Connection, batch: Batch) -> tuple[float, float]:
    """Write one batch in one transaction (in the store's writer thread, the one that
    owns ``db``); the seconds its statements took, and its COMMIT."""
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
