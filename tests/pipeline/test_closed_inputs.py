"""The batch pipeline reads closed telemetry files and the older layout
(mconn/pipeline/inputs.py, specs/pipeline.md section 2.1, specs/telemetry.md section 2.1).

No Spark here: the inputs are resolved before Spark starts. Files are written by the
telemetry service itself (real files in tmp_path, a ``task.Clock``), so the names are the
ones a node gives.
"""

import fnmatch
import json
import os

from twisted.internet.task import Clock
from twisted.logger import Logger, LogPublisher

from mconn.ops.telemetry_file import TelemetryFileService, closed_paths
from mconn.pipeline import inputs

NODE_ID = "ab" * 20
V2 = json.dumps({"v": 2, "event": "listening", "node_id": NODE_ID, "log_time": 1.0, "level": "info"}) + "\n"


def node_files(path, rotations):
    """A node's log at ``path`` closed ``rotations`` times by age, then stopped (its last file closed)."""
    clock = Clock()
    clock.advance(1795601700.0)
    publisher = LogPublisher()
    service = TelemetryFileService(path, NODE_ID, publisher=publisher, clock=clock, rotate_seconds=5)
    service.startService()
    logger = Logger(namespace="mconn", observer=publisher)
    for n in range(rotations):
        logger.info("x", event="listening", node_id=NODE_ID, address=f"127.0.0.1:{n}")
        clock.advance(5)
    service.stopService()
    return closed_paths(path)


def test_a_directory_or_a_glob_of_live_names_reads_every_closed_file_and_the_old_layout(tmp_path):
    """A node's closed files, its older PATH.1 and PATH.2, and its (empty) PATH are all found, from the
    directory or from a glob naming PATH only, each once; no warning."""
    (tmp_path / "n0.json.2").write_text(V2)
    (tmp_path / "n0.json.1").write_text(V2)
    closed = node_files(tmp_path / "n0.json", 3)
    assert len(closed) == 3
    expected = sorted([str(tmp_path / "n0.json.2"), str(tmp_path / "n0.json.1"), *closed])
    for logs in ([str(tmp_path)], [str(tmp_path / "*.json")], [str(tmp_path / "n0.json")]):
        selected = inputs.resolve(logs)
        assert sorted(selected.paths) == expected, logs  # the empty PATH is skipped without a word
        assert selected.warnings == [], logs


def test_a_missing_closed_file_between_two_is_a_gap_and_pruned_old_ones_are_not(tmp_path):
    """Closed files whose oldest were deleted by retention warn nothing; one missing between two kept ones
    is named by its sequence number."""
    closed = node_files(tmp_path / "n0.json", 6)
    os.remove(closed[0])  # retention: the oldest go first
    assert inputs.resolve([str(tmp_path)]).warnings == []
    os.remove(closed[3])
    assert inputs.resolve([str(tmp_path)]).warnings == [
        f"gap in the closed files of {tmp_path / 'n0.json'}: sequence number 000004 missing; their records are not read"
    ]


def test_the_follow_glob_matches_closed_names_only(tmp_path):
    """CLOSED_GLOB (a Hadoop glob: ``{a,b}`` alternatives) matches each closed name a node gives and neither
    the live PATH nor the older layout's PATH.1."""
    closed = [os.path.basename(p) for p in node_files(tmp_path / "n0.jsonl", 2)]
    head, _, tail = inputs.CLOSED_GLOB.partition("{")
    choices, _, rest = tail.partition("}")
    patterns = [head + choice + rest for choice in choices.split(",")]

    def matches(name):
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    assert closed and all(matches(name) for name in closed), closed
    assert not any(matches(name) for name in ("n0.jsonl", "n0.jsonl.1", "n0.key", "n0.jsonl.1.gz"))
