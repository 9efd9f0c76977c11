"""The durable session store (mconn/switch/session_store.py, specs/resume.md section 8).

The store's writer is a real thread writing a real sqlite file under ``tmp_path``; the
reactor is a ``task.Clock`` whose ``callFromThread`` queues the writer's reports until the
test runs them (``ThreadClock.pump``), so every step is taken in an order the test sets.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from helpers import ThreadClock
from mconn.core.session import MESSAGE_OVERHEAD
from mconn.errors import StoreCorrupt, StoreError, StoreFormatUnsupported, StoreFull, StoreOwnedByOtherNode
from mconn.switch import session_store, session_store_file
from mconn.switch.session_store import FORMAT_VERSION, SessionStore, StoredSession, StoredStream

NODE = "a" * 40
OTHER = "b" * 40
PEER = "c" * 40
S1, S2 = b"\x01" * 16, b"\x02" * 16
DELAY = 0.002


@pytest.fixture
def clock():
    return ThreadClock()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "sessions.db")


def open_store(path, clock, node=NODE, max_bytes=1 << 20):
    return SessionStore.open(path, node, max_bytes=max_bytes, reactor=clock, commit_delay=DELAY)


def commit(store, clock):
    """Let the commit timer fire and run the writer's report."""
    clock.advance(DELAY)
    clock.pump()


def close(store, clock):
    """Close: a commit of what is queued (if anything is), then the close itself."""
    d = store.close()
    for _ in range(3):
        if d.called:
            break
        clock.pump()
    assert d.called
    return d


def reopen(store, clock, path):
    """Close the store and open the file again: the new store and its clock."""
    close(store, clock)
    clock = ThreadClock()
    return open_store(path, clock), clock


# -- round trip ------------------------------------------------------------------------


def test_a_session_survives_close_and_open(path, clock):
    """begin, accepted, acked, delivered come back from the file as they were recorded;
    an ended session does not."""
    store = open_store(path, clock)
    assert store.load() == []
    store.begin(S1, PEER, True, (0x20, 0x30))
    store.begin(S2, PEER, False, (0x20,))
    for seq in range(5):
        store.accepted(S1, 0x20, seq, b"m%d" % seq)
    store.accepted(S1, 0x30, 0, b"")
    store.acked(S1, 0x20, 2)
    store.delivered(S1, 0x30, 7)
    store.delivered(S1, 0x30, 9)
    store.accepted(S2, 0x20, 0, b"gone")
    store.end(S2)
    commit(store, clock)
    store.acked(S1, 0x20, 3)  # a later transaction
    commit(store, clock)
    store, clock = reopen(store, clock, path)
    assert store.load() == [
        StoredSession(
            session_id=S1,
            peer_id=PEER,
            outbound=True,
            channel_ids=(0x20, 0x30),
            streams={0x20: StoredStream(3, (b"m3", b"m4"), 0), 0x30: StoredStream(0, (b"",), 9)},
        )
    ]
    # The loaded counts are the store's own: the stream goes on where it stopped.
    assert store.used_bytes == 2 + 2 + 0 + 3 * MESSAGE_OVERHEAD
    with pytest.raises(StoreError, match="next is 5"):
        store.accepted(S1, 0x20, 3, b"again")
    assert store.load() == []  # handed over once
    store.accepted(S1, 0x20, 5, b"m5")
    store.acked(S1, 0x20, 6)
    store.end(S1)
    commit(store, clock)
    assert reopen(store, clock, path)[0].load() == []


def test_only_committed_records_are_in_the_files(path, clock, tmp_path):
    """A copy of the files (the database and its WAL) taken after a commit holds what was
    committed and not what was recorded after it: the process dying then loses those
    records, and durable() had not fired for them."""
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"committed")
    commit(store, clock)
    store.accepted(S1, 1, 1, b"not yet")
    assert not store.durable().called
    copy = tmp_path / "copy"
    copy.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(path + suffix, str(copy / "sessions.db") + suffix)
    assert open_store(str(copy / "sessions.db"), ThreadClock()).load()[0].streams[1].unacked == (b"committed",)
    close(store, clock)  # close commits the rest
    assert open_store(path, ThreadClock()).load()[0].streams[1].unacked == (b"committed", b"not yet")


# -- group commit ----------------------------------------------------------------------


def test_group_commit_writes_many_records_in_one_transaction(path, clock):
    """Everything recorded within commit_delay is one transaction; records made while it
    runs go in the next one; and nothing is committed before the delay."""
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1, 2))
    for seq in range(200):
        store.accepted(S1, 1, seq, b"x" * 100)
        store.delivered(S1, 2, seq + 1)
    clock.advance(DELAY / 2)
    assert store.commits == 0 and clock.from_threads.empty()
    clock.advance(DELAY / 2)  # the timer hands the batch to the writer
    for seq in range(200, 300):  # recorded while the transaction is in flight
        store.accepted(S1, 1, seq, b"y")
    clock.pump()
    assert store.commits == 1
    assert store.write_seconds > 0 and store.sync_seconds > 0  # the writer's time, reported with the commit
    clock.pump()  # the records made meanwhile went at once: their delay was spent waiting
    assert store.commits == 2
    assert clock.getDelayedCalls() == []
    (stored,) = reopen(store, clock, path)[0].load()
    assert len(stored.streams[1].unacked) == 300 and stored.streams[2].delivered == 200


def test_past_the_flush_threshold_a_commit_starts_without_waiting(path, clock):
    store = open_store(path, clock, max_bytes=64 << 20)
    store.begin(S1, PEER, True, (1,))
    body = b"z" * 65536
    for seq in range(session_store.FLUSH_BYTES // len(body)):
        store.accepted(S1, 1, seq, body)
    clock.pump()  # no clock.advance: the threshold started it
    assert store.commits == 1


def test_durable_fires_only_after_the_commit(path, clock):
    """durable() waits for the transaction holding every record made before it, and
    fires in the reactor thread (from the queued report), not before."""
    store = open_store(path, clock)
    assert store.durable().called  # nothing recorded: already durable
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"a")
    first = store.durable()
    clock.advance(DELAY)
    store.accepted(S1, 1, 1, b"b")  # after the first batch left: in the second
    second = store.durable()
    assert not first.called and not second.called
    clock.pump()
    assert first.called and not second.called
    assert store.commits == 1
    clock.pump()
    assert second.called and store.commits == 2


def test_acked_messages_are_dropped_from_the_file(path, clock):
    """An ack deletes the messages below it, also those acked before their insert was
    committed, and frees their bytes."""
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    for seq in range(10):
        store.accepted(S1, 1, seq, b"q" * 10)
    commit(store, clock)
    for seq in range(10, 20):
        store.accepted(S1, 1, seq, b"q" * 10)
    store.acked(S1, 1, 15)
    assert store.used_bytes == 5 * (10 + MESSAGE_OVERHEAD)
    commit(store, clock)
    close(store, clock)
    db = sqlite3.connect(path)
    assert [row[0] for row in db.execute("SELECT seq FROM messages ORDER BY seq")] == list(range(15, 20))
    db.close()


# -- bounds ----------------------------------------------------------------------------


def test_a_message_past_max_bytes_is_refused_and_an_ack_makes_room(path, clock):
    size = 100 + MESSAGE_OVERHEAD
    store = open_store(path, clock, max_bytes=3 * size)
    assert store.limit == 3 * size
    store.begin(S1, PEER, True, (1,))
    for seq in range(3):
        store.accepted(S1, 1, seq, b"m" * 100)
    with pytest.raises(StoreFull, match=f"{3 * size} of {3 * size} bytes used; a message needing {size}") as e:
        store.accepted(S1, 1, 3, b"m" * 100)
    assert (e.value.used, e.value.limit, e.value.path) == (3 * size, 3 * size, path)
    store.acked(S1, 1, 1)
    store.accepted(S1, 1, 3, b"m" * 100)  # the refused one took nothing: seq 3 is still next
    assert store.used_bytes == 3 * size
    store.end(S1)
    assert store.used_bytes == 0


def test_empty_messages_are_not_free(path, clock):
    store = open_store(path, clock, max_bytes=2 * MESSAGE_OVERHEAD)
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"")
    store.accepted(S1, 1, 1, b"")
    with pytest.raises(StoreFull):
        store.accepted(S1, 1, 2, b"")


# -- bad values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.accepted(S1, 1, -1, b"x"), "sequence number -1 on channel 0x01 .* is negative"),
        (
            lambda s: s.accepted(S1, 1, 5, b"x"),
            "sequence number 5 .* not contiguous .* 2 acked and 1 held, so the next is 3",
        ),
        (lambda s: s.accepted(S1, 1, 1, b"x"), "sequence number 1 .* next is 3"),
        (lambda s: s.accepted(S1, 1, 3.0, b"x"), "sequence number 3.0 .* is not an integer"),
        (lambda s: s.accepted(S1, 1.0, 3, b"x"), "a channel id is an integer, not 1.0"),
        (lambda s: s.acked(S1, 1, 3.0), "acked count 3.0 .* out of range"),
        (lambda s: s.delivered(S1, 1, 5.0), "delivered count 5.0"),
        (lambda s: s.acked(S1, 1, 1), "acked count 1 on channel 0x01 .* went backwards: acked is 2, 3 accepted"),
        (lambda s: s.acked(S1, 1, 4), "acked count 4 .* out of range: acked is 2, 3 accepted"),
        (lambda s: s.delivered(S1, 1, 3), "delivered count 3 .* delivered is 4"),
        (lambda s: s.delivered(S1, 1, -1), "delivered count -1"),
        (lambda s: s.accepted(S1, 9, 0, b"x"), r"channel 9 is not in session 0101.* \(channels \[1, 2\]\)"),
        (lambda s: s.accepted(S2, 1, 0, b"x"), "no session"),
        (lambda s: s.end(S2), "no session"),
        (lambda s: s.begin(S1, PEER, True, (1,)), "session 0101.* is already stored"),
        (lambda s: s.begin(S2, PEER, True, (1, 1)), r"distinct integers 0..255, not \[1, 1\]"),
        (lambda s: s.begin(S2, PEER, True, (256,)), r"not \[256\]"),
        (lambda s: s.begin(b"", PEER, True, (1,)), "a session id is 1 to 64 bytes"),
        (lambda s: s.begin(S2, "", True, (1,)), "a peer id is 1 to 256 characters"),
    ],
)
def test_a_record_the_counts_make_impossible_is_refused_and_changes_nothing(path, clock, call, message):
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1, 2))
    for seq in range(3):
        store.accepted(S1, 1, seq, b"m")
    store.acked(S1, 1, 2)
    store.delivered(S1, 1, 4)
    used = store.used_bytes
    with pytest.raises(StoreError, match=message):
        call(store)
    assert store.used_bytes == used
    store.accepted(S1, 1, 3, b"next")  # the counts are as they were
    (stored,) = reopen(store, clock, path)[0].load()
    assert stored.streams[1] == StoredStream(2, (b"m", b"next"), 4)


def test_bad_open_arguments(path, clock, tmp_path):
    with pytest.raises(StoreError, match="max_bytes must be a positive integer, not 0"):
        SessionStore.open(path, NODE, max_bytes=0, reactor=clock)
    missing = str(tmp_path / "no" / "such" / "s.db")
    with pytest.raises(StoreError, match=f"its directory {tmp_path / 'no' / 'such'} does not exist"):
        SessionStore.open(missing, NODE, max_bytes=1024, reactor=clock)


# -- the file --------------------------------------------------------------------------


def test_the_file_is_private_and_refuses_another_node(path, clock):
    """Mode 0600 (an existing file's wider mode is narrowed); another node id's store is
    refused naming both ids."""
    open(path, "wb").close()
    os.chmod(path, 0o644)
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    commit(store, clock)
    for name in os.listdir(os.path.dirname(path)):
        assert os.stat(os.path.join(os.path.dirname(path), name)).st_mode & 0o777 == 0o600, name
    close(store, clock)
    with pytest.raises(StoreOwnedByOtherNode, match=f"belongs to node {NODE}, not to this node {OTHER}") as e:
        open_store(path, ThreadClock(), node=OTHER)
    assert (e.value.stored_node_id, e.value.our_node_id) == (NODE, OTHER)
    assert open_store(path, ThreadClock()).load()[0].session_id == S1  # refused, not damaged


def test_a_second_process_cannot_open_a_store_in_use(path, clock):
    store = open_store(path, clock)
    program = (
        "import sys\n"
        "from mconn.switch.session_store import SessionStore\n"
        "try:\n"
        f"    SessionStore.open({path!r}, {NODE!r}, max_bytes=1024)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("StoreError") and "in use by another process" in out, out
    close(store, clock)


def test_garbage_and_truncated_files_are_corrupt(path, clock):
    with open(path, "wb") as f:
        f.write(os.urandom(8192))
    with pytest.raises(StoreCorrupt, match=f"session store {path} is corrupt: sqlite: file is not a database"):
        open_store(path, clock)
    os.unlink(path)
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    for seq in range(200):
        store.accepted(S1, 1, seq, os.urandom(1000))
    close(store, clock)
    size = os.path.getsize(path)
    assert size > 100_000 and not os.path.exists(path + "-wal")  # checkpointed into the file
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(StoreCorrupt, match="corrupt"):
        open_store(path, ThreadClock())


def doctor(path, *statements):
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            db.execute(statement)
    finally:
        db.close()


def stored_file(path, clock, messages=3, max_bytes=1 << 20):
    store = open_store(path, clock, max_bytes=max_bytes)
    store.begin(S1, PEER, True, (1,))
    for seq in range(messages):
        store.accepted(S1, 1, seq, b"m")
    close(store, clock)


@pytest.mark.parametrize(
    "statement, message",
    [
        ("UPDATE messages SET body = zeroblob(2000000) WHERE seq = 0", "a message of 2000000 bytes, larger than"),
        (
            "UPDATE messages SET body = zeroblob(1000000)",
            r"3 messages of 3000000 bytes take 3000192 bytes, more than the store's limit of 1048576",
        ),
        ("UPDATE streams SET acked = -5", "a count or sequence number of -5"),
        ("UPDATE streams SET delivered = 'lots'", "a count or sequence number of 'lots'"),
        ("DELETE FROM messages WHERE seq = 1", "message 2 where 1 was due"),
        ("UPDATE streams SET acked = 1", "message 0 where 1 was due"),
        ("UPDATE sessions SET peer = printf('%.300c', 'x')", "a peer id of length 300, more than 256"),
        ("UPDATE sessions SET channels = x'0101'", "channels 0101"),
        ("DELETE FROM streams", "message 0 of channel 1 outside a stored stream"),
        ("DELETE FROM streams WHERE channel = 1; DELETE FROM messages", r"lacks the streams of channels \[1\]"),
        (
            "INSERT INTO sessions SELECT randomblob(16), 'p', 0, x'' FROM "
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 65536) SELECT i FROM n)",
            "65537 sessions, more than the 65536",
        ),
        ("DROP TABLE streams", "tables missing: streams"),
        ("UPDATE meta SET value = 'x' WHERE key = 'format_version'", "format version is 'x'"),
    ],
)
def test_a_doctored_store_is_corrupt_naming_the_value(path, clock, statement, message):
    """Sizes and counts are checked, by SQL aggregates, before anything is read from them."""
    stored_file(path, clock)
    doctor(path, *statement.split("; "))
    with pytest.raises(StoreCorrupt, match=message):
        open_store(path, ThreadClock())


def test_a_store_of_another_format_version_is_refused(path, clock):
    stored_file(path, clock)
    doctor(path, f"UPDATE meta SET value = {FORMAT_VERSION + 1} WHERE key = 'format_version'")
    with pytest.raises(StoreFormatUnsupported, match=f"has format version {FORMAT_VERSION + 1}; this mconn reads") as e:
        open_store(path, ThreadClock())
    assert (e.value.found, e.value.supported) == (FORMAT_VERSION + 1, FORMAT_VERSION)


# -- failures --------------------------------------------------------------------------


def test_a_failed_commit_fails_durable_every_later_record_and_close(path, clock, monkeypatch):
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    commit(store, clock)

    def broken(db, batch):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(session_store_file, "commit", broken)
    store.accepted(S1, 1, 0, b"lost")
    d = store.durable()
    commit(store, clock)
    failures = []
    d.addErrback(failures.append)
    assert failures and "commit failed: database or disk is full" in str(failures[0].value)
    with pytest.raises(StoreError, match="disk is full"):
        store.accepted(S1, 1, 1, b"more")
    closed = close(store, clock)
    closed.addErrback(failures.append)
    assert len(failures) == 2 and isinstance(failures[1].value, StoreError)
    monkeypatch.undo()
    assert open_store(path, ThreadClock()).load()[0].streams[1].unacked == ()


def test_close_commits_what_is_queued_and_then_refuses_records(path, clock):
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"queued")
    d = store.durable()
    closed = store.close()
    again = store.close()
    clock.pump(2)  # the commit, then the close
    assert d.called and closed.called and again.called
    assert clock.getDelayedCalls() == []
    with pytest.raises(StoreError, match="is closed"):
        store.accepted(S1, 1, 1, b"late")
    assert store.close().called
    assert open_store(path, ThreadClock()).load()[0].streams[1].unacked == (b"queued",)


def test_a_new_file_is_in_wal_mode_with_the_store_page_size(path, clock):
    store = open_store(path, clock)
    close(store, clock)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA page_size").fetchone()[0] == session_store_file.PAGE_SIZE
    assert dict(db.execute("SELECT key, value FROM meta")) == {"format_version": FORMAT_VERSION, "node_id": NODE}
    db.close()


def test_after_load_the_store_keeps_no_message_alive(path, clock):
    """The loaded sessions are handed over: once the caller drops them (their messages
    acknowledged), nothing of the store refers to them."""
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"x" * 1000)
    store, clock = reopen(store, clock, path)
    (stored,) = store.load()
    assert sys.getrefcount(stored) == 2  # ``stored`` and getrefcount's argument: not the store
    close(store, clock)


def test_a_damaged_free_list_is_found_at_open_not_at_a_later_commit(path, clock):
    """open runs sqlite's quick_check: damage in pages no load reads (here the free
    list, which the next commit would allocate from) refuses the file at open, instead
    of failing the store at some later commit."""
    store = open_store(path, clock, max_bytes=4 << 20)
    store.begin(S1, PEER, True, (1,))
    for seq in range(40):
        store.accepted(S1, 1, seq, b"f" * 50_000)
    commit(store, clock)
    store.acked(S1, 1, 40)  # their pages go to the free list
    close(store, clock)
    with open(path, "r+b") as f:
        header = f.read(100)
        trunk = int.from_bytes(header[32:36], "big")  # the first free-list trunk page
        assert trunk and int.from_bytes(header[36:40], "big") > 1
        f.seek((trunk - 1) * session_store_file.PAGE_SIZE)
        f.write(b"\xff" * 8)  # its next-trunk pointer and leaf count, far out of range
    with pytest.raises(StoreCorrupt, match="integrity check: .*"):
        open_store(path, ThreadClock())


def test_a_wal_left_by_a_killed_process_is_narrowed_to_0600_and_replayed(path, clock, tmp_path):
    """The files of a store whose process died (a copy taken while it ran), made
    readable by all: open narrows both and replays the WAL."""
    store = open_store(path, clock)
    store.begin(S1, PEER, True, (1,))
    store.accepted(S1, 1, 0, b"in the wal")
    commit(store, clock)
    left = tmp_path / "left"
    left.mkdir()
    copy = str(left / "sessions.db")
    for suffix in ("", "-wal"):
        shutil.copyfile(path + suffix, copy + suffix)
        os.chmod(copy + suffix, 0o644)
    assert os.path.getsize(copy + "-wal") > 0
    reopened = open_store(copy, ThreadClock())
    for suffix in ("", "-wal"):
        assert os.stat(copy + suffix).st_mode & 0o777 == 0o600, suffix
    assert reopened.load()[0].streams[1].unacked == (b"in the wal",)
    close(store, clock)
