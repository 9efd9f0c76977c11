"""Which files the pipeline reads (mconn/pipeline/inputs.py, specs/pipeline.md section 2.1).

No Spark here: the inputs are resolved before Spark starts. A directory that also holds
a node's private key must not hand the key to Spark, rotated files must come along with
any glob, and a missing path is one line.
"""

import bz2
import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

from mconn.core.node_key import NodeKey
from mconn.pipeline import cli, inputs

from .fleetlog import FleetLog, record

#: The checkout these tests run from: a child Python imports mconn from it.
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: A child Python that prints inputs.resolve(argv) as [paths, warnings], or exits 1 with the InputError.
RESOLVE = (
    "import json, sys\n"
    "from mconn.pipeline import inputs\n"
    "try:\n"
    "    r = inputs.resolve(sys.argv[1:])\n"
    "except inputs.InputError as e:\n"
    "    sys.exit(str(e))\n"
    "print(json.dumps([r.paths, r.warnings]))\n"
)
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
    assert (
        f"skipped 3 file(s) in {tmp_path / 'run'} not named like telemetry: n0.key, twistd.log, twistd.pid"
        in selected.warnings
    )
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
        f"gap in the rotated files of {tmp_path / 'b.json'}: {tmp_path / 'b.json'} missing; their records are not read",
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
    done = subprocess.run(
        [sys.executable, "-m", "mconn.pipeline", str(missing), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"mconn-pipeline: error: {missing}: no such file or directory"]


def resolve_in_child(logs, cwd):
    """inputs.resolve(logs) in a child Python, killed after 60 s (subprocess.run's timeout): a read that blocks or
    a walk that does not end fails the test instead of holding it. Returns (paths, warnings)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, *map(str, logs)], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_fifo_named_like_telemetry_is_skipped_and_named_without_blocking(tmp_path):
    """A FIFO named n2.json beside two nodes' files (and one deeper, and one named on the command line) holds
    nothing up: the walk, a glob and a direct name all finish, read the regular files only, and name each FIFO
    and what it is. Before, opening it waited for a writer for good."""
    paths = fleet_files(tmp_path / "logs")
    (tmp_path / "logs" / "deep").mkdir()
    fifos = [tmp_path / "logs" / "n2.json", tmp_path / "logs" / "deep" / "n3.jsonl"]
    for fifo in fifos:
        os.mkfifo(fifo)
    real = [str(paths["n0"]), str(paths["n1"])]
    for logs in ([tmp_path / "logs"], [tmp_path / "logs" / "**" / "*.json*"], [fifos[0], paths["n0"], paths["n1"]]):
        found, warnings = resolve_in_child(logs, tmp_path)
        assert sorted(found) == real, logs
        named = [w for w in warnings if "FIFO" in w]
        shown = fifos[:1] if logs[0] == fifos[0] else fifos
        assert sorted(named) == sorted(f"skipped {fifo}: not a regular file (a FIFO)" for fifo in shown), warnings
    assert inputs.first_record_verdict(str(fifos[0])) == "not a regular file (a FIFO)"


def test_a_run_given_only_a_fifo_fails_in_one_line_naming_it(tmp_path):
    """mconn-pipeline given a directory holding only a FIFO named like telemetry exits 1 at once with one line
    that names the FIFO and why it was skipped; no JVM is started."""
    os.mkfifo(tmp_path / "n0.json")
    done = subprocess.run(
        [sys.executable, "-m", "mconn.pipeline", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    fifo = tmp_path / "n0.json"
    assert done.stderr.splitlines() == [
        f"mconn-pipeline: error: no telemetry file in {tmp_path} (skipped {fifo}: not a regular file (a FIFO))"
    ]


def test_directory_links_are_not_followed_and_the_walk_ends(tmp_path):
    """Two self-links under the logs tree (logs/loop1 -> . and logs/a/loop2 -> ..) made 'logs/**/*.json' walk
    without end. The glob, and the directory walked as such, now end and give every real file once, naming the
    links they did not follow; a one-level wildcard crossing a link finds nothing new."""
    logs = tmp_path / "logs"
    paths = fleet_files(logs / "a")
    (logs / "top.json").write_text(V2)
    os.symlink(".", logs / "loop1")
    os.symlink("..", logs / "a" / "loop2")
    real = sorted([str(paths["n0"]), str(paths["n1"]), str(logs / "top.json")])
    found, warnings = resolve_in_child([logs / "**" / "*.json"], tmp_path)
    assert sorted(found) == real and len(found) == len(set(found))
    assert (
        f"did not follow 2 directory link(s) matching {logs / '**' / '*.json'}: {logs / 'a' / 'loop2'}, "
        f"{logs / 'loop1'}" in warnings
    )
    found, warnings = resolve_in_child(["logs/**/*.json"], tmp_path)  # relative, as the README writes it
    assert sorted(found) == sorted(os.path.relpath(p, tmp_path) for p in real)
    found, warnings = resolve_in_child([logs], tmp_path)
    assert sorted(found) == real
    assert f"did not follow 2 directory link(s) in {logs}: a/loop2, loop1" in warnings
    found, _ = resolve_in_child([logs / "*" / "*.json"], tmp_path)  # logs/loop1/top.json is logs/top.json
    assert sorted(os.path.realpath(p) for p in found) == sorted(os.path.realpath(p) for p in real)


def test_the_walk_looks_at_a_bounded_number_of_entries(tmp_path, capsys):
    """Resolving looks at most at max_entries directory entries (walk, glob and rotation listings together): one
    more is an InputError naming the bound, before anything is read; the command's --max-walk-entries sets it
    and is one error line too."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in range(40):
        (logs / f"n{n}.json").write_text(V2)
    assert len(inputs.resolve([str(logs)], max_entries=200).paths) == 40
    for given in ([str(logs)], [str(logs / "**" / "*.json")]):
        with pytest.raises(inputs.InputError, match="looked at more than 30 directory entries"):
            inputs.resolve(given, max_entries=30)
    assert inputs.MAX_WALK_ENTRIES == 1_000_000
    status = cli.main([str(logs), "--out", str(tmp_path / "out"), "--quiet", "--max-walk-entries", "10"])
    assert status == 1
    assert capsys.readouterr().err == (
        f"mconn-pipeline: error: looked at more than 10 directory entries (at {logs}); name fewer or narrower "
        "LOGS, or raise --max-walk-entries\n"
    )
    with pytest.raises(SystemExit) as raised:
        cli.main([str(logs), "--out", str(tmp_path / "out"), "--max-walk-entries", "0"])
    assert raised.value.code == 2
