"""Which files the pipeline reads (mconn/pipeline/inputs.py, specs/pipeline.md section 2.1).

No Spark here: the inputs are resolved before Spark starts. A directory that also holds
a node's private key must not hand the key to Spark, rotated files must come along with
any glob, and a missing path is one line.
"""

import bz2
import gzip
import json
import subprocess
import sys

import pytest

from mconn.node_key import NodeKey
from mconn.pipeline import inputs

from .fleetlog import FleetLog, record

V2 = json.dumps({"v": 2, "event": "listening", "node_id": "ab" * 20, "log_time": 1.0, "level": "info"}) + "\n"


def fleet_files(directory):
    """Two nodes' telemetry (version 1 records) written under ``directory``."""
    fleet = FleetLog()
    for name in ("n0", "n1"):
        fleet.node(name).listen(0)
    return fleet.write(directory)


def test_a_directory_gives_its_telemetry_files_and_never_the_key_beside_them(tmp_path):
    """A directory is walked recursively for telemetry only: the node key, twistd's pid and text log, and .json
    files that are not telemetry are skipped, with warnings that name the files and never quote them."""
    paths = fleet_files(tmp_path / "run" / "telemetry")
    NodeKey.generate().save(tmp_path / "run" / "n0.key")
    (tmp_path / "run" / "twistd.pid").write_text("4242\n")
    (tmp_path / "run" / "twistd.log").write_text("2026-11-24T10:00:00+0000 [-] Log opened.\n")
    NodeKey.generate().save(tmp_path / "run" / "leaked.json")  # a key with a telemetry-like name
    (tmp_path / "run" / "notes.json").write_text(json.dumps(["not", "telemetry"]) + "\n")
    (tmp_path / "run" / "deep.json").write_text("[" * 100_000 + "\n")  # past Python's recursion limit
    (tmp_path / "run" / "telemetry" / "empty.json").write_text("")
    selected = inputs.resolve([str(tmp_path / "run")])
    assert selected.paths == [str(paths["n0"]), str(paths["n1"])]
    warnings = "\n".join(selected.warnings)
    assert f"skipped 3 file(s) in {tmp_path / 'run'} not named like telemetry: n0.key, twistd.log, twistd.pid" \
        in selected.warnings
    assert f"skipped {tmp_path / 'run' / 'leaked.json'}: not telemetry" in warnings
    assert f"skipped {tmp_path / 'run' / 'notes.json'}: not telemetry" in warnings
    assert f"skipped {tmp_path / 'run' / 'deep.json'}: not telemetry" in warnings
    assert "empty.json" not in warnings  # an empty file is nothing to read, not a problem
    assert "PRIVATE KEY" not in warnings and "4242" not in warnings


def test_a_glob_brings_the_rotated_files_of_what_it_matches(tmp_path):
    """The README's 'logs/**/*.json' also reads PATH.1, PATH.2 of every file it matches (the restart fleet's
    first runs are in them)."""
    paths = fleet_files(tmp_path / "logs" / "a")
    for n in (1, 2):
        (tmp_path / "logs" / "a" / f"n0.json.{n}").write_text(record("listening", -n, node_id="x" * 40))
    selected = inputs.resolve([str(tmp_path / "logs" / "**" / "*.json")])
    n0 = str(paths["n0"])
    assert selected.paths == [n0, n0 + ".1", n0 + ".2", str(paths["n1"])]
    assert selected.warnings == []


def test_both_record_formats_and_compressed_files_are_telemetry(tmp_path):
    """A file is telemetry when its first record is one: version 1 (RS-prefixed, Twisted's JSON) or version 2
    (plain JSON Lines with "v"), also gzip- or bzip2-compressed; a file named on the command line is read
    whatever its name."""
    (tmp_path / "old.json").write_text(record("listening", 0, node_id="a" * 40))
    (tmp_path / "new.jsonl").write_text(V2)
    with gzip.open(tmp_path / "new.jsonl.1.gz", "wt") as f:
        f.write(V2)
    with bz2.open(tmp_path / "new.jsonl.2.bz2", "wt") as f:
        f.write(V2)
    (tmp_path / "node-telemetry.out").write_text(V2)
    assert inputs.first_record_verdict(str(tmp_path / "old.json")) is None
    selected = inputs.resolve([str(tmp_path), str(tmp_path / "node-telemetry.out")])
    assert sorted(selected.paths) == sorted(
        str(tmp_path / n) for n in ("old.json", "new.jsonl", "new.jsonl.1.gz", "new.jsonl.2.bz2", "node-telemetry.out")
    )


def test_a_file_named_on_the_command_line_is_still_checked(tmp_path):
    """A key named on the command line is skipped too; with nothing left the input is an error that says so."""
    key = tmp_path / "n0.key"
    NodeKey.generate().save(key)
    with pytest.raises(inputs.InputError, match=f"no telemetry file in {key}.*skipped {key}: not telemetry"):
        inputs.resolve([str(key)])


def test_a_missing_path_or_a_glob_matching_nothing_is_an_error_naming_it(tmp_path):
    """A local path that does not exist, or a glob that matches nothing, is an InputError naming it; a remote
    URI is handed to Spark unchecked."""
    fleet_files(tmp_path)
    with pytest.raises(inputs.InputError, match=f"{tmp_path / 'nothing-here'}: no such file or directory"):
        inputs.resolve([str(tmp_path), str(tmp_path / "nothing-here")])
    with pytest.raises(inputs.InputError, match=r"\*.jsn: no file matches this pattern"):
        inputs.resolve([str(tmp_path / "*.jsn")])
    assert inputs.resolve(["hdfs:///fleet/logs"]).paths == ["hdfs:///fleet/logs"]


def test_a_gap_in_the_rotation_indices_is_a_warning(tmp_path):
    """PATH, PATH.1 and PATH.3 without PATH.2 warn that PATH.2 is missing; rotated files without PATH warn
    that PATH is missing; a complete rotation warns nothing; a huge index is counted, not listed."""
    assert inputs.rotation_gaps(["/x/d.json", f"/x/d.json.{10**12}"]) == [
        "gap in the rotated files of /x/d.json: /x/d.json.1, /x/d.json.2, /x/d.json.3, /x/d.json.4, /x/d.json.5 "
        f"and {10**12 - 6} more missing; their records are not read"
    ]
    line = record("listening", 0, node_id="a" * 40)
    for name in ("a.json", "a.json.1", "a.json.3", "b.json.1", "c.json", "c.json.1", "c.json.2"):
        (tmp_path / name).write_text(line)
    selected = inputs.resolve([str(tmp_path)])
    assert selected.warnings == [
        f"gap in the rotated files of {tmp_path / 'a.json'}: {tmp_path / 'a.json.2'} missing; their records are "
        "not read",
        f"gap in the rotated files of {tmp_path / 'b.json'}: {tmp_path / 'b.json'} missing; their records are "
        "not read",
    ]


def test_key_material_is_redacted_and_ids_are_kept(tmp_path):
    """redact removes PEM blocks (a cut one to its end), 64+ hex characters and mixed-case base64 runs; node
    ids (40 hex), session ids and paths stay."""
    NodeKey.generate().save(tmp_path / "k")
    text = (tmp_path / "k").read_text()
    body = text.splitlines()[1]
    node_id, session = "ab" * 20, "cd" * 16
    shown = inputs.redact(f"before {text} after {node_id} {session} /tmp/pytest-of-root/logs/n0.json")
    assert body not in shown and "[redacted PEM block]" in shown
    assert shown.endswith(f"after {node_id} {session} /tmp/pytest-of-root/logs/n0.json")
    assert inputs.redact("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI") == "[redacted PEM block]"
    assert inputs.redact("seed " + "0f" * 32) == "seed [redacted 64 hex characters]"
    assert inputs.redact("k=" + body + " ok") == "k=[redacted 64 characters] ok"
    assert inputs.redact(None) is None


def test_the_command_fails_on_a_missing_path_in_one_line_before_spark_starts(tmp_path):
    """mconn-pipeline with a missing input exits 1 with one line naming the path, and no JVM was started (no
    Java or Spark line on stderr)."""
    missing = tmp_path / "nothing-here"
    done = subprocess.run([sys.executable, "-m", "mconn.pipeline", str(missing), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"mconn-pipeline: error: {missing}: no such file or directory"]
