"""The pipeline reads both telemetry record versions (specs/telemetry.md section 2, specs/pipeline.md 2).

The golden records of specs/vectors/telemetry.json go through ``ingest.read_records`` and
``ingest.parse``: a version 2 line and the version 1 line of the same event give the same
typed row; every golden version 2 line is read without a reject, its fields as logged;
each golden malformed line is counted malformed with its reason (a wrong type inside a
list item included); version 1 and version 2 lines mixed in one file, and a line cut short
between them, spoil nothing else.
"""

import json
import pathlib

import pytest

from mconn.pipeline import ingest, schema

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "specs" / "vectors" / "telemetry.json").read_text())
LIST_OF = {field: column for (_, field), column in schema.LIST_COLUMNS.items()}


def events_of(spark, path) -> list[dict]:
    """The parsed events of the files under ``path``, in file order."""
    parsed = ingest.parse(ingest.read_records(spark, [str(path)])).orderBy("seq")
    return [row.asDict(recursive=True) for row in parsed.collect()]


def logged_fields(event: dict, logged: dict) -> dict:
    """The columns of a parsed event that hold the logged fields, renamed back to the fields' names."""
    out = {}
    for name in logged:
        column = next((c for (e, f), c in schema.LIST_COLUMNS.items() if e == logged["event"] and f == name), name)
        out[name] = event[column]
    return out


@pytest.fixture(scope="module")
def golden(spark, tmp_path_factory):
    """The golden version 2 lines in one file, the version 1 lines in another; their parsed events."""
    directory = tmp_path_factory.mktemp("golden")
    (directory / "v2").mkdir()
    (directory / "v1").mkdir()
    (directory / "v2" / "node.json").write_text("".join(v["line"] for v in VECTORS["version2"]))
    (directory / "v1" / "node.json").write_text("".join(v["line"] for v in VECTORS["version1"]))
    return events_of(spark, directory / "v2"), events_of(spark, directory / "v1")


def test_every_golden_version_2_line_is_read_with_its_fields_as_logged(golden):
    """Each golden version 2 line becomes one event of its name, version 2, no reject reason, its fields (lists
    of objects as rows) equal to the logged values."""
    v2, _ = golden
    assert [e["event"] for e in v2] == [v["logged"]["event"] for v in VECTORS["version2"]]
    for event, vector in zip(v2, VECTORS["version2"], strict=True):
        assert event["reject_reason"] is None and event["version"] == 2, event["event"]
        assert event["log_time"] == vector["log_time"]
        assert logged_fields(event, vector["logged"]) == vector["logged"], event["event"]


def test_a_version_1_line_gives_the_same_row_as_the_version_2_line_of_the_same_event(golden):
    """The version 1 golden lines (Twisted's RS-separated records, log_flattened and all) parse to exactly the
    rows of the same events written as version 2, but for the version column."""
    v2, v1 = golden
    by_event = {(e["event"], e["log_time"]): e for e in v2}
    assert len(v1) == len(VECTORS["version1"])
    for event in v1:
        twin = by_event[(event["event"], event["log_time"])]
        assert event["version"] == 1
        assert {**event, "version": 2, "seq": twin["seq"]} == twin, event["event"]


def test_each_golden_malformed_line_is_malformed_with_its_reason(spark, tmp_path):
    """Each golden malformed line, a wrong JSON type inside a list item among them (session_ended's
    ``channels[].delivered`` as a string, which must not be read as null), is counted malformed with the
    golden reason, its file and its text kept (as read, for a record the parser took whole: its fields but
    ``level``); the well-formed line after them is read."""
    good = VECTORS["version2"][1]["line"]
    (tmp_path / "node.json").write_text("".join(v["line"] for v in VECTORS["malformed"]) + good)
    events = events_of(spark, tmp_path)
    assert [e["event"] for e in events] == [ingest.MALFORMED] * len(VECTORS["malformed"]) + ["listening"]
    for event, vector in zip(events, VECTORS["malformed"], strict=False):  # not the last, "listening"
        assert event["reject_reason"] == vector["reason"], vector["line"]
        assert event["source_file"].endswith("node.json")
        if event["record"] != vector["line"].strip():
            read = {k: v for k, v in json.loads(vector["line"]).items() if k != "level"}
            assert json.loads(event["record"]) == read, vector["line"]


def test_mixed_versions_and_a_cut_line_in_one_file_spoil_nothing(spark, tmp_path):
    """One file: version 1 records (two on one line after a cut one, as a killed older node leaves them), a
    version 2 line cut short and ended by the writer's newline, then version 2 lines: every whole record is
    read, in order, and the two cut ones are the only malformed records."""
    v1 = [v["line"] for v in VECTORS["version1"]]
    v2 = [v["line"] for v in VECTORS["version2"][:3]]
    cut_v1 = v1[1][:30]
    text = v1[0] + cut_v1 + v1[1] + v1[2] + v2[0][:50] + "\n" + v2[1] + v2[2]
    (tmp_path / "node.json").write_text(text)
    events = events_of(spark, tmp_path)
    names = [(e["event"], None if e["event"] == ingest.MALFORMED else e["version"]) for e in events]
    expected_v1 = [(v["fields"]["event"], 1) for v in VECTORS["version1"][:3]]
    assert names == [
        expected_v1[0],
        (ingest.MALFORMED, None),
        *expected_v1[1:],
        (ingest.MALFORMED, None),
        ("listening", 2),
        ("connection_made", 2),
    ]
    assert {e["reject_reason"] for e in events if e["event"] == ingest.MALFORMED} == {"not a JSON object"}
