"""The version 2 telemetry record (specs/telemetry.md section 2): plain JSON Lines, lean and flat.

The golden records of specs/vectors/telemetry.json are written through a
TelemetryFileService byte for byte; every line is one JSON object that ``json.loads`` reads
and that has exactly the envelope and its event's fields of the spec; version 1 files
(Twisted's RS-separated records) and files mixing both are still read; a record cut short
by a killed process spoils nothing after it; rotation never splits a line.
"""

import json
import math
import pathlib

from twisted.logger import LogLevel, Logger, LogPublisher

from adapter.test_telemetry import SPEC_EVENTS
from helpers import SPEC_TYPE_CHECKS
from mconn.ops.telemetry_file import ENVELOPE, TelemetryFileService, format_record, read_events, rotated_paths

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "specs" / "vectors" / "telemetry.json").read_text())
NODE_ID = VECTORS["version2"][0]["logged"]["node_id"]


def twisted_event(vector: dict, **extra) -> dict:
    """The event dict a twisted.logger observer gets for a vector's logged event."""
    return {
        **vector["logged"],
        "log_time": vector["log_time"],
        "log_level": LogLevel.levelWithName(vector["level"]),
        "log_namespace": "mconn",
        "log_format": "{node_id} " + vector["logged"]["event"],
        "log_source": None,
        "log_logger": object(),
        **extra,
    }


def with_legacy_keys(event: dict) -> dict:
    """The event after twisted.python.log's bridge: it adds, at the end, the keys the event lacks."""
    return {**event, **{k: v for k, v in VECTORS["legacy_keys"].items() if k not in event}}


def write_through_service(path, events, **options) -> None:
    """Publish ``events`` to a TelemetryFileService at ``path`` and stop it."""
    publisher = LogPublisher()
    service = TelemetryFileService(path, NODE_ID, publisher=publisher, **options)
    service.startService()
    try:
        for event in events:
            publisher(event)
    finally:
        service.stopService()


def test_the_service_writes_the_golden_lines_byte_for_byte(tmp_path):
    """Each golden event, published as twisted.logger delivers it after the legacy log bridge added its keys
    (those the event lacks: peer_rejected keeps its own str ``message``), comes out as exactly its golden
    line, in order, and read_events gives back each line's object."""
    vectors = VECTORS["version2"]
    events = [with_legacy_keys(twisted_event(v)) for v in vectors]
    path = tmp_path / "node.json"
    write_through_service(path, events)
    assert path.read_text() == "".join(v["line"] for v in vectors)
    assert read_events(path) == [json.loads(v["line"]) for v in vectors]


def test_every_golden_line_is_one_json_object_with_the_envelope_and_its_events_fields():
    """Every event of the spec has a golden line; json.loads reads it; its keys are the envelope (v, event,
    node_id, log_time, level) in that order, then exactly the event's fields of section 4 with their types."""
    assert {v["logged"]["event"] for v in VECTORS["version2"]} == set(SPEC_EVENTS)
    for vector in VECTORS["version2"]:
        line = vector["line"]
        assert line.endswith("\n") and "\n" not in line[:-1] and "\x1e" not in line
        record = json.loads(line)
        name = record["event"]
        spec = SPEC_EVENTS[name]
        assert list(record)[: len(ENVELOPE)] == list(ENVELOPE), name
        assert (record["v"], record["level"], record["log_time"]) == (2, spec["level"], vector["log_time"])
        assert set(record) - {"v", "log_time", "level"} == set(spec["fields"]), name
        for field, type_name in spec["fields"].items():
            assert SPEC_TYPE_CHECKS[type_name](record[field]), f"{name}.{field} = {record[field]!r}"
        for parent, children in spec["items"].items():
            for item in record[parent]:
                assert set(item) == set(children), f"{name}.{parent}[]"


def test_a_record_is_at_most_half_the_size_of_twisteds():
    """The lean channel_stats record (the bulk of any telemetry) is under half the bytes Twisted's
    jsonFileLogObserver wrote for the same event (its version 1 golden line)."""
    lean = next(v["line"] for v in VECTORS["version2"] if v["logged"]["event"] == "channel_stats")
    old = next(v["line"] for v in VECTORS["version1"] if v["fields"]["event"] == "channel_stats")
    assert len(lean) * 2 < len(old), (len(lean), len(old))


def test_reactor_error_carries_its_traceback_as_text(tmp_path):
    """An event logged with a failure (reactor_error) gets ``failure``: the traceback text, naming the
    exception; none of Twisted's flattened failure keys."""
    publisher = LogPublisher()
    service = TelemetryFileService(tmp_path / "n.json", NODE_ID, publisher=publisher)
    service.startService()
    try:
        raise ValueError("reactor bug 42")
    except ValueError:
        Logger(namespace="mconn", observer=publisher).failure(
            "{reactor} failed",
            event="reactor_error",
            node_id=NODE_ID,
            reactor="Chat",
            method="receive",
            peer_id="ab" * 20,
        )
    finally:
        service.stopService()
    [record] = read_events(tmp_path / "n.json")
    assert "ValueError: reactor bug 42" in record["failure"]
    assert set(record) == {*ENVELOPE, "reactor", "method", "peer_id", "failure"} and record["level"] == "critical"


def test_values_json_cannot_hold_become_null_or_text_and_the_record_is_kept():
    """A non-finite float is written as null and an object JSON has no type for as its str: the line is strict
    JSON and the record is not lost."""
    event = twisted_event(VECTORS["version2"][15], late=math.inf, extra=b"\x01")  # loop_stalled
    record = json.loads(format_record(event), parse_constant=lambda name: pytest_fail(name))
    assert record["late"] is None and record["extra"] == "b'\\x01'"


def pytest_fail(name):
    raise AssertionError(f"{name} is not JSON")


def test_version_1_and_mixed_files_are_read(tmp_path):
    """A file of Twisted's RS-separated records (an older node) followed by version 2 lines (the node upgraded
    in place) reads back as both: the version 1 events with their fields and log_time, then the records."""
    path = tmp_path / "node.json"
    path.write_text("".join(v["line"] for v in VECTORS["version1"]))
    events = [twisted_event(VECTORS["version2"][1])]
    write_through_service(path, events)
    read = read_events(path)
    assert len(read) == len(VECTORS["version1"]) + 1
    for vector, event in zip(VECTORS["version1"], read, strict=False):  # read[-1], the extra one, is below
        assert {k: event[k] for k in vector["fields"]} == vector["fields"]
        assert event["log_time"] == vector["log_time"] and "v" not in event
    assert read[-1] == json.loads(VECTORS["version2"][1]["line"])


def test_a_record_cut_short_by_a_killed_process_spoils_nothing_after_it(tmp_path):
    """A file whose last line was cut mid-record (no newline) gets a newline before the next record: the cut
    record is one bad line, skipped by read_events, and every later record reads back whole."""
    path = tmp_path / "node.json"
    first, second, third = (VECTORS["version2"][k] for k in (1, 2, 3))
    path.write_text(first["line"] + second["line"][:40])
    write_through_service(path, [twisted_event(third)])
    lines = path.read_text().splitlines(keepends=True)
    assert lines == [first["line"], second["line"][:40] + "\n", third["line"]]
    assert read_events(path) == [json.loads(first["line"]), json.loads(third["line"])]


def test_rotation_never_splits_a_line(tmp_path):
    """With a rotation every 1000 bytes, every file of the log (rotated ones and the live one) is whole lines
    of JSON objects, and all of them together are every record written, in order."""
    path = tmp_path / "node.json"
    vectors = VECTORS["version2"] * 6
    write_through_service(path, [twisted_event(v) for v in vectors], rotate_bytes=1000, keep_files=100)
    files = rotated_paths(path)
    assert len(files) > 3
    lines = []
    for name in files:
        text = pathlib.Path(name).read_text()
        assert text.endswith("\n"), name
        lines += text.splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == [json.loads(v["line"]) for v in vectors]
