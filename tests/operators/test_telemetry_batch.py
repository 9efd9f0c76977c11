"""Telemetry records written once per reactor turn (mconn/ops/telemetry_file.py,
``JsonLinesObserver`` with a clock; specs/telemetry.md section 2): the records of one turn
reach the file when it ends, in order and byte for byte as one at a time would write
them, rotation cuts the files where it would have, and a stop writes what waits."""

import pathlib

from twisted.internet.task import Clock
from twisted.logger import LogPublisher

from mconn.ops.telemetry_file import (
    JsonLinesObserver,
    TelemetryFileService,
    format_record,
    open_log_file,
    rotated_paths,
)
from operators.test_telemetry_record import NODE_ID, VECTORS, twisted_event

EVENTS = [twisted_event(v) for v in VECTORS["version2"]] * 6


class CountingWrites:
    """Counts the writes of a LogFile (one write is one system call: the file is unbuffered)."""

    def __init__(self, log_file) -> None:
        self.writes = 0
        write = log_file.write

        def counted(data):
            self.writes += 1
            return write(data)

        log_file.write = counted


def service_at(path, clock, **options):
    publisher = LogPublisher()
    service = TelemetryFileService(path, NODE_ID, publisher=publisher, clock=clock, **options)
    service.startService()
    return service, publisher


def files_of(path) -> list[bytes]:
    return [pathlib.Path(name).read_bytes() for name in rotated_paths(path)]


def test_the_records_of_one_turn_are_written_together_when_it_ends(tmp_path):
    """Records published within one turn are not in the file until the turn ends (the clock's next call);
    then all of them are, in order, each the line format_record makes, in one write."""
    clock = Clock()
    path = tmp_path / "node.json"
    service, publisher = service_at(path, clock)
    writes = CountingWrites(service.log_file)
    try:
        for event in EVENTS[:5]:
            publisher(event)
        assert path.read_bytes() == b"" and writes.writes == 0
        clock.advance(0)
        assert path.read_bytes() == b"".join(format_record(e) for e in EVENTS[:5])
        assert writes.writes == 1
        publisher(EVENTS[5])
        clock.advance(0)
        assert path.read_bytes() == b"".join(format_record(e) for e in EVENTS[:6])
        assert writes.writes == 2 and clock.getDelayedCalls() == []
    finally:
        service.stopService()


def test_rotation_cuts_a_turns_records_where_one_at_a_time_would(tmp_path):
    """With a rotation every 1000 bytes, the files written from whole turns of records hold exactly the bytes
    of the files written one record at a time (no clock): a file ends with the record that filled it."""
    one_by_one, batched = tmp_path / "a" / "node.json", tmp_path / "b" / "node.json"
    for path in (one_by_one, batched):
        path.parent.mkdir()
    log_file = open_log_file(one_by_one, 1000, keep_files=100)
    plain = JsonLinesObserver(log_file)  # no clock: one write per record
    for event in EVENTS:
        plain(event)
    log_file.close()
    clock = Clock()
    service, publisher = service_at(batched, clock, rotate_bytes=1000, keep_files=100)
    for start in range(0, len(EVENTS), 17):  # turns of 17 records
        for event in EVENTS[start : start + 17]:
            publisher(event)
        clock.advance(0)
    service.stopService()
    assert len(rotated_paths(batched)) > 3
    assert files_of(batched) == files_of(one_by_one)


def test_a_stop_writes_the_records_still_waiting(tmp_path):
    """stopService writes the records of a turn that has not ended, and leaves no call behind."""
    clock = Clock()
    path = tmp_path / "node.json"
    service, publisher = service_at(path, clock)
    for event in EVENTS[:3]:
        publisher(event)
    service.stopService()
    assert path.read_bytes() == b"".join(format_record(e) for e in EVENTS[:3])
    assert clock.getDelayedCalls() == []
