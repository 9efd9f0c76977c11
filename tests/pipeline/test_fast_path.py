"""The fast path by prefix (specs/pipeline.md section 2.2) reads what the general path reads, no more, no less.

``ingest.write_events`` takes a clean version 2 line of an event without lists straight from its prefix
(``{"v":2,"event":"NAME",``) and leaves every other line to the general path (``read_records`` and
``parse``, which tests/pipeline/test_format.py checks against the golden vectors). These tests show which
lines the fast path takes, that a line whose prefix names an event but whose body is wrong still gets the
general path's reason, and that the written events table is row for row what the general path makes.
"""

import json
import pathlib

from mconn.pipeline import ingest

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "specs" / "vectors" / "telemetry.json").read_text())
LISTENING = '{"v":2,"event":"listening","node_id":"n1","log_time":1800000000.5,"level":"info","address":"tcp:1"}'

#: Lines whose prefix names an event of the fast path, each wrong in a way only the body shows, with the
#: general path's reason.
PREFIXED_BUT_MALFORMED = {
    # log_time a string: a value of the wrong type, and no numeric log_time.
    '{"v":2,"event":"listening","node_id":"n1","log_time":"soon","address":"tcp:1"}': "no event, node_id or numeric log_time",
    # a number field of the event holding a string.
    '{"v":2,"event":"channel_stats","node_id":"n1","log_time":1800000001.0,"peer_id":"p","channel_id":"32"}': "a field of the wrong JSON type",
    # a field of another event, of the wrong type: the general path checks it too.
    '{"v":2,"event":"listening","node_id":"n1","log_time":1800000002.0,"duration":"long"}': "a field of the wrong JSON type",
    # cut short by a killed process.
    '{"v":2,"event":"listening","node_id":"n1","log_ti': "not a JSON object",
    # a second "v" (the last one counts).
    '{"v":2,"event":"listening","node_id":"n1","log_time":1800000003.0,"v":3}': "record version 3: this reader knows 1 (no v) and 2",
    # a second "event" naming an event with lists: the lists' checks apply.
    '{"v":2,"event":"listening","node_id":"n1","log_time":1800000004.0,"event":"handshake_done","channels":7}': "channels: not a list of int",
    # no node_id.
    '{"v":2,"event":"listening","log_time":1800000005.0}': "no event, node_id or numeric log_time",
}


def rows(df) -> list[dict]:
    return [r.asDict(recursive=True) for r in df.orderBy("seq").collect()]


def test_the_fast_path_takes_only_clean_prefixed_lines_of_events_without_lists(spark, tmp_path):
    """``classify`` names the event of each clean golden version 2 line of an event without lists; a list
    event, a version 1 line, a line with ``v`` after ``event`` and each prefixed but malformed line are left
    to the general path (``_recheck``, the line kept whole)."""
    golden = [v["line"].rstrip("\n") for v in VECTORS["version2"]]
    reordered = '{"event":"listening","v":2,"node_id":"n1","log_time":1800000006.0,"address":"tcp:2"}'
    legacy = VECTORS["version1"][1]["line"].rstrip("\n")
    lines = golden + [reordered, legacy, *PREFIXED_BUT_MALFORMED]
    (tmp_path / "node.json").write_text("\n".join(lines) + "\n")
    got = rows(ingest.classify(ingest.read_lines(spark, [str(tmp_path)])))
    listed = {"handshake_done", "connection_lost", "session_ended"}
    expected = [
        json.loads(line)["event"] if json.loads(line)["event"] not in listed else ingest.RECHECK for line in golden
    ]
    expected += [ingest.RECHECK] * (2 + len(PREFIXED_BUT_MALFORMED))
    assert [r["event"] for r in got] == expected
    assert [r["record"] for r in got if r["event"] == ingest.RECHECK] == [
        line for line, name in zip(lines, expected, strict=True) if name == ingest.RECHECK
    ]
    assert all(r["reject_reason"] is None and r["version"] == 2 for r in got if r["event"] != ingest.RECHECK)


def test_a_prefixed_line_with_a_malformed_body_is_malformed_with_the_general_paths_reason(spark, tmp_path):
    """Each line whose prefix names ``listening`` or ``channel_stats`` but whose body is wrong (a mistyped
    field, a cut line, a second ``v`` or ``event``, no node_id) is in the written events table as malformed,
    with the reason, file and text the general path gives; the clean line after them is read."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node.json").write_text("\n".join([*PREFIXED_BUT_MALFORMED, LISTENING]) + "\n")
    out = str(tmp_path / "events")
    ingest.write_events(spark, [str(tmp_path / "logs")], out)
    got = rows(ingest.load_events(spark, out))
    assert [r["event"] for r in got] == [ingest.MALFORMED] * len(PREFIXED_BUT_MALFORMED) + ["listening"]
    assert [r["reject_reason"] for r in got[:-1]] == list(PREFIXED_BUT_MALFORMED.values())
    assert all(r["source_file"].endswith("node.json") for r in got[:-1])
    assert got[-1]["address"] == "tcp:1" and got[-1]["reject_reason"] is None
    assert not (tmp_path / "events" / ("event=" + ingest.RECHECK)).exists()


def test_the_written_events_table_is_the_general_paths_rows(spark, tmp_path):
    """One file mixing every golden version 2 line, the version 1 lines (two records on one line after a cut
    one), a reordered-key version 2 line, the golden malformed lines, blank lines and the prefixed but
    malformed lines: the events table that ``write_events`` writes holds exactly the rows, in the same
    ``seq`` order, that the general path alone makes of the file; ``--since``/``--until`` too."""
    v1 = [v["line"] for v in VECTORS["version1"]]
    text = "".join(v["line"] for v in VECTORS["version2"])
    text += v1[0] + v1[1][:30] + v1[1] + v1[2] + "\n   \n"
    text += '{"event":"listening","v":2,"node_id":"n1","log_time":1800000006.0,"address":"tcp:2"}\n'
    text += "".join(v["line"] for v in VECTORS["malformed"])
    text += "\n".join(PREFIXED_BUT_MALFORMED) + "\n" + LISTENING + "\n"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node.json").write_text(text)
    logs = [str(tmp_path / "logs")]
    times = [v["log_time"] for v in VECTORS["version2"]]
    windows = [(None, None), (min(times) + 1, max(times))]
    for since, until in windows:
        out = str(tmp_path / f"events-{since}")
        ingest.write_events(spark, logs, out, since, until)
        written = rows(ingest.load_events(spark, out))
        general = rows(ingest.parse(ingest.read_records(spark, logs), since, until))
        assert [{k: r[k] for k in sorted(r)} for r in written] == [{k: r[k] for k in sorted(r)} for r in general]
        names = {r["event"] for r in written}
        assert ingest.MALFORMED in names and "channel_stats" in names and ingest.RECHECK not in names
    assert len(written) < len(rows(ingest.load_events(spark, str(tmp_path / "events-None"))))
