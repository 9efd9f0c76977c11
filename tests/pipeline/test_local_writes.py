"""What a local run writes besides its tables: no Hadoop checksum files, and so no ``chmod``
process for one (specs/pipeline.md section 6).

Without its native library, Hadoop's local file system sets the permissions of every file
and directory it creates by running ``chmod``; a ``.crc`` checksum file beside each file
doubled the files. A ``chmod`` first on PATH records each call and runs the real one: the
driver JVM finds it there.
"""

import argparse
import os
import pathlib
import shutil
import stat
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import pipeline_bench  # noqa: E402 -- bench/ is not a package

REPO = pathlib.Path(__file__).resolve().parents[2]


def _files(directory: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_a_local_write_leaves_no_checksum_files(spark, tmp_path):
    spark.range(5).write.parquet(str(tmp_path / "t"))

    files = _files(tmp_path / "t")
    assert [f for f in files if f.endswith(".crc")] == []
    assert "_SUCCESS" in files and any(f.endswith(".parquet") for f in files)
    assert sorted(r.id for r in spark.read.parquet(str(tmp_path / "t")).collect()) == [0, 1, 2, 3, 4]


def test_a_rewritten_file_loses_its_stale_checksum_file(spark, tmp_path):
    """A ``.crc`` file an earlier writer left is removed with the file it checked, so a
    read never checks new bytes against it."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path("file://" + str(tmp_path / "f"))
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    (tmp_path / "f").write_bytes(b"old")
    (tmp_path / ".f.crc").write_bytes(b"stale")

    out = fs.create(path, True)
    out.write(b"new bytes")
    out.close()

    assert _files(tmp_path) == ["f"]
    stream = fs.open(path)
    assert bytes(bytearray(stream.read() for _ in range(9))) == b"new bytes"
    stream.close()


def test_a_run_starts_no_chmod_for_a_checksum_file(tmp_path):
    real = shutil.which("chmod")
    shim = tmp_path / "bin" / "chmod"
    shim.parent.mkdir()
    calls = tmp_path / "chmod-calls"
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{calls}"\nexec "{real}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    fleet = argparse.Namespace(nodes=4, degree=2, events_target=400, lost=1, duplicated=1, seed=3, workers=1)
    pipeline_bench.generate(fleet, str(tmp_path / "logs"))
    env = dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}")

    result = subprocess.run(
        [sys.executable, "-m", "mconn.pipeline", str(tmp_path / "logs"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    chmods = calls.read_text().splitlines()
    # The shim saw the JVM's calls (directories and Parquet parts still get one each) ...
    assert any(c.endswith(".parquet") for c in chmods), chmods
    # ... and none for a checksum file, of which the output has none.
    assert [c for c in chmods if c.endswith(".crc")] == []
    assert [f for f in _files(tmp_path / "out") if f.endswith(".crc")] == []
