"""Closed telemetry files keep their names; files close by age as well as size
(specs/telemetry.md section 2.1, mconn/ops/telemetry_file.py).

A reader of new files only (Spark's file source, the pipeline's follower) must see each
record once: a file, once closed, is never renamed again, and with ``rotate_seconds`` a
record is in a closed file at most that long after it was written. Real files in
tmp_path; a ``task.Clock`` for time.
"""

import os
import stat

import pytest
from twisted.internet.task import Clock
from twisted.logger import Logger, LogPublisher

from mconn.ops.telemetry_file import (
    CLOSED_NAME,
    FILE_MODE,
    TelemetryFileService,
    closed_paths,
    open_log_file,
    read_events,
    rotated_paths,
)

NODE_ID = "cd" * 20
#: 2026-11-25 10:15:00 UTC.
T0 = 1795601700.0


def service_at(path, clock, **options):
    publisher = LogPublisher()
    service = TelemetryFileService(path, NODE_ID, publisher=publisher, clock=clock, **options)
    service.startService()
    return service, Logger(namespace="mconn", observer=publisher)


def log(logger, n):
    logger.info("event {n}", event="test_event", node_id=NODE_ID, n=n, padding="x" * 100)


def contents(paths):
    return {name: open(name, "rb").read() for name in paths}


def test_a_closed_files_name_never_changes_across_later_rotations(tmp_path):
    """Each file closed by a rotation keeps its name and its bytes through every later rotation; a new one
    only adds a name, with the next sequence number."""
    path = tmp_path / "n.json"
    clock = Clock()
    clock.advance(T0)
    service, logger = service_at(path, clock, rotate_bytes=1000, keep_files=100)
    seen: dict[str, bytes] = {}
    try:
        for n in range(120):
            log(logger, n)
            clock.advance(1)
            now = contents(closed_paths(path))
            assert {name: now[name] for name in seen} == seen, "a closed file was renamed or changed"
            seen = now
    finally:
        service.stopService()
    names = [os.path.basename(name) for name in closed_paths(path)]
    assert len(names) > 5
    suffixes = [CLOSED_NAME.match(name[len("n.json.") :]) for name in names]
    assert all(suffixes), names
    assert [int(m.group(2)) for m in suffixes] == list(range(1, len(names) + 1))
    assert suffixes[0].group(1) >= "20261125T101500Z"  # closed at the clock's time, UTC
    assert [e["n"] for e in read_events(path)] == list(range(120))


def test_a_file_closes_by_age_with_a_fake_clock(tmp_path):
    """With rotate_seconds 5, a file holding a record is closed 5 s after it was opened by the timer alone (no
    later write), named for the clock's time; an empty file is never closed; stopService closes the last one."""
    path = tmp_path / "n.json"
    clock = Clock()
    clock.advance(T0)
    service, logger = service_at(path, clock, rotate_bytes=0, rotate_seconds=5)
    log(logger, 0)
    clock.advance(0)  # the turn ends: the record is written
    clock.advance(4.9)
    assert closed_paths(path) == []
    clock.advance(0.1)
    assert [os.path.basename(p) for p in closed_paths(path)] == ["n.json.20261125T101505Z-000001"]
    assert path.read_bytes() == b""
    clock.advance(60)  # idle: nothing to close
    assert len(closed_paths(path)) == 1
    log(logger, 1)
    clock.advance(0)
    clock.advance(5)
    assert len(closed_paths(path)) == 2  # within 5 s of the write
    log(logger, 2)
    clock.advance(1)
    service.stopService()
    assert len(closed_paths(path)) == 3 and path.read_bytes() == b""  # PATH is left empty
    assert [e["n"] for e in read_events(path)] == [0, 1, 2]
    assert clock.getDelayedCalls() == []


def test_a_write_after_the_age_closes_the_file_first(tmp_path):
    """A record written after the file turned rotate_seconds old (the timer late) goes to a new file: the old
    one closes before the write, holding only older records."""
    path = tmp_path / "n.json"
    clock = Clock()
    clock.advance(T0)
    log_file = open_log_file(path, 0, rotate_seconds=5, clock=clock)
    log_file.write(b'{"n":0}\n')
    clock.advance(6)
    log_file.write(b'{"n":1}\n')
    log_file.close()
    [closed] = closed_paths(path)
    assert open(closed, "rb").read() == b'{"n":0}\n' and path.read_bytes() == b'{"n":1}\n'


def test_a_killed_processs_file_is_closed_when_opened_again(tmp_path):
    """With rotate_seconds, a non-empty PATH left behind (a process killed, its last line cut) is closed under
    a new name when the file is opened, after the newest closed file, and 0600; logging starts in a new PATH."""
    path = tmp_path / "n.json"
    (tmp_path / "n.json.20261125T101000Z-000004").write_bytes(b'{"n":0}\n')
    path.write_bytes(b'{"n":1}\n{"n":2, "cut')
    os.chmod(path, 0o644)
    log_file = open_log_file(path, 0, rotate_seconds=5)
    log_file.close()
    old, left = closed_paths(path)
    assert old.endswith("-000004") and left.endswith("-000005")
    assert open(left, "rb").read() == b'{"n":1}\n{"n":2, "cut\n'
    assert stat.S_IMODE(os.stat(left).st_mode) == FILE_MODE
    assert path.read_bytes() == b""


def test_retention_keeps_the_newest_closed_files_within_keep_files_and_keep_bytes(tmp_path):
    """keep_files 3 keeps the three newest closed files; keep_bytes 2500 keeps at most 2500 bytes of them,
    newest first, with no gap in their sequence numbers."""
    for keep, expected_files in (({"keep_files": 3, "keep_bytes": 10**9}, 3), ({"keep_bytes": 2500}, None)):
        path = tmp_path / f"{expected_files}.json"
        clock = Clock()
        clock.advance(T0)
        service, logger = service_at(path, clock, rotate_bytes=1000, rotate_seconds=30, **keep)
        for n in range(200):
            log(logger, n)
            clock.advance(0)
        service.stopService()
        closed = closed_paths(path)
        seqs = [int(name.rsplit("-", 1)[1]) for name in closed]
        assert seqs == list(range(seqs[0], seqs[0] + len(closed))) and seqs[0] > 1
        if expected_files is not None:
            assert len(closed) == expected_files
        else:
            assert sum(os.path.getsize(name) for name in closed) <= 2500 and len(closed) >= 2
        assert read_events(path)[-1]["n"] == 199  # the last file was closed at the stop


def test_the_old_layout_is_read_first_and_pruned_first(tmp_path):
    """Files of the layout before closed names (PATH.2, PATH.1, newest last) are read before the closed files,
    as older; retention deletes them first."""
    path = tmp_path / "n.json"
    (tmp_path / "n.json.2").write_bytes(b'{"v":2,"event":"e","node_id":"x","log_time":1.0,"level":"info","n":0}\n')
    (tmp_path / "n.json.1").write_bytes(b'{"v":2,"event":"e","node_id":"x","log_time":2.0,"level":"info","n":1}\n')
    clock = Clock()
    clock.advance(T0)
    service, logger = service_at(path, clock, rotate_bytes=0, rotate_seconds=5, keep_files=4)
    for n in (2, 3):
        log(logger, n)
        clock.advance(5)
    files = rotated_paths(path)
    assert files[:2] == [f"{path}.2", f"{path}.1"] and files[2:] == closed_paths(path) + [str(path)]
    assert [e["n"] for e in read_events(path)] == [0, 1, 2, 3]
    log(logger, 4)
    clock.advance(5)  # a third closed file: the oldest of the old layout goes
    service.stopService()
    assert not (tmp_path / "n.json.2").exists() and (tmp_path / "n.json.1").exists()
    assert [e["n"] for e in read_events(path)] == [1, 2, 3, 4]


def test_a_negative_age_is_refused_naming_the_value(tmp_path):
    with pytest.raises(ValueError, match="rotate_seconds must be 0 \\(never\\) or more, got -1"):
        TelemetryFileService(tmp_path / "n.json", NODE_ID, rotate_seconds=-1)


def test_twistd_takes_telemetry_rotate_seconds(tmp_path):
    """--telemetry-rotate-seconds defaults to 0 (never by age), reaches the node's telemetry file, and a
    negative value is refused naming the option."""
    from mconn.ops.node import Options, build_service
    from mconn.ops.node_settings import resolve

    assert resolve({}).telemetry_rotate_seconds == 0
    options = Options()
    options.parseOptions([
        "--listen", "tcp:0:interface=127.0.0.1", "--key", str(tmp_path / "n.key"), "--create-key",
        "--telemetry", str(tmp_path / "n.json"), "--telemetry-rotate-seconds", "5",
    ])  # fmt: skip
    assert options.settings.telemetry_rotate_seconds == 5
    service = build_service(options.settings, clock=Clock())
    try:
        assert service.telemetry.rotate_seconds == 5 and service.telemetry.log_file.rotate_seconds == 5
    finally:
        service.telemetry.log_file.close()
    with pytest.raises(SystemExit, match="--telemetry-rotate-seconds: -1 must be a number of seconds >= 0"):
        Options().parseOptions(["--telemetry-rotate-seconds", "-1"])
