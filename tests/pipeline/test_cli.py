"""The command line's edges (usage, times, failures) and the --since/--until window.

The full run of the command is in test_known_truth.py; these need no output tables.
"""

import argparse
import sys

import pytest

from mconn.pipeline import cli, ingest
from mconn.pipeline import spark as spark_settings

from .fleetlog import ORIGIN, FleetLog


def test_times_are_epoch_seconds_or_iso_8601():
    """--since/--until take epoch seconds or ISO 8601 (UTC when no zone is given); anything else is a usage
    error."""
    assert cli.parse_time("1700000000.5") == 1700000000.5
    assert cli.parse_time("2023-11-14T22:13:20") == 1700000000.0  # UTC when the zone is not given
    assert cli.parse_time("2023-11-14T23:13:20+01:00") == 1700000000.0
    with pytest.raises(argparse.ArgumentTypeError, match="neither seconds"):
        cli.parse_time("yesterday")


def test_conf_is_key_equals_value():
    """--conf takes KEY=VALUE; a bare key is a usage error."""
    assert cli.parse_conf("spark.driver.memory=1g") == ("spark.driver.memory", "1g")
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_conf("spark.driver.memory")


def test_usage_errors_exit_with_2(capsys):
    """Usage errors (no --out, --since after --until) exit with 2 and say what is wrong."""
    with pytest.raises(SystemExit) as raised:
        cli.main(["logs"])  # no --out
    assert raised.value.code == 2
    assert cli.main(["logs", "--out", "x", "--since", "20", "--until", "10"]) == 2
    assert "--since must be before --until" in capsys.readouterr().err


def test_a_missing_input_fails_with_1_and_one_line(tmp_path, capsys):
    """A missing input path fails with exit 1 and a single error line naming it (no Spark needed: the inputs
    are checked before Spark starts)."""
    status = cli.main([str(tmp_path / "nothing-here"), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert status == 1
    assert err == f"mconn-pipeline: error: {tmp_path / 'nothing-here'}: no such file or directory\n"


def test_since_and_until_keep_a_window_and_every_malformed_record(spark, tmp_path):
    """--since and --until keep only the events inside their window, and still keep every malformed record."""
    fleet = FleetLog()
    node = fleet.node("A")
    for t in range(10):
        node.listen(t)
    node.raw(5.5, "garbage\n")
    fleet.write(tmp_path)
    records = ingest.read_records(spark, [str(tmp_path)])
    events = ingest.parse(records, since=ORIGIN + 3, until=ORIGIN + 7).groupBy("event").count().collect()
    assert {r["event"]: r["count"] for r in events} == {"listening": 4, ingest.MALFORMED: 1}


def test_input_size_counts_local_files_and_gives_up_on_remote_ones(tmp_path):
    """The input size counts local files, directories and globs recursively; a remote or missing input gives
    no size."""
    (tmp_path / "a.json").write_bytes(b"x" * 10)
    (tmp_path / "rotated").mkdir()
    (tmp_path / "rotated" / "a.json.1").write_bytes(b"y" * 5)
    assert spark_settings.input_bytes([str(tmp_path)]) == 15  # a directory, recursively
    assert spark_settings.input_bytes([str(tmp_path / "*.json"), f"file://{tmp_path}/rotated"]) == 15
    assert spark_settings.input_bytes([str(tmp_path), "hdfs:///fleet/logs"]) is None
    assert spark_settings.input_bytes([str(tmp_path / "nothing-here")]) is None


def test_only_a_small_local_input_gets_the_small_input_settings():
    """Only a small input on a local master gets the small-input Spark settings; large, unknown-size and
    cluster runs and spark-submit's own values are left alone; every driver started here logs quietly."""

    def settings(master, size, is_set=lambda key: False):
        return spark_settings.session_settings(master, is_set, {"spark.driver.memory": "1g"}, "", size)

    small = settings("local[2]", 3 * 2**20)  # make run's few MB
    assert small["spark.sql.shuffle.partitions"] == "1"
    assert small["spark.sql.codegen.wholeStage"] == "false"
    assert "-XX:TieredStopAtLevel=1" in small["spark.driver.extraJavaOptions"]
    assert small["spark.driver.memory"] == "1g"
    for large in (settings("local[2]", spark_settings.SMALL_INPUT), settings("local[2]", None)):
        assert large["spark.sql.shuffle.partitions"] == "8"
        assert "spark.sql.codegen.wholeStage" not in large
        assert "TieredStopAtLevel" not in large["spark.driver.extraJavaOptions"]
    cluster = settings("spark://host:7077", 3 * 2**20)
    assert "spark.sql.shuffle.partitions" not in cluster and "spark.sql.codegen.wholeStage" not in cluster
    # The driver runs here (client mode): only its quiet log configuration, no JIT flag.
    assert cluster["spark.driver.extraJavaOptions"].startswith("-Dlog4j2.configurationFile=file:")
    assert "TieredStopAtLevel" not in cluster["spark.driver.extraJavaOptions"]
    submitted = settings("local[2]", 3 * 2**20, is_set=lambda key: key == "spark.sql.shuffle.partitions")
    assert "spark.sql.shuffle.partitions" not in submitted  # spark-submit's own value wins


def test_submit_runs_the_installed_pysparks_spark_submit_with_what_it_needs(tmp_path):
    """mconn-pipeline-submit's command: pyspark's own bin/spark-submit, SPARK_HOME and both Python variables
    set to this installation, the quiet log4j2 configuration for the driver (unless the Spark configuration
    directory has its own), then the spark-submit options, cli.py and the pipeline's arguments."""
    import os

    import pyspark

    from mconn.pipeline import submit

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    argv, env = submit.command(["--master", "spark://h:7077"], ["logs", "--out", "t"], {"PATH": "/usr/bin"})
    assert argv[:3] == [os.path.join(home, "bin", "spark-submit"), "--master", "spark://h:7077"]
    assert argv[3] == os.path.abspath(cli.__file__) and argv[4:] == ["logs", "--out", "t"]
    assert env["SPARK_HOME"] == home and env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["SPARK_SUBMIT_OPTS"].startswith("-Dlog4j2.configurationFile=file:") and env["PATH"] == "/usr/bin"
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    _, env = submit.command([], ["logs", "--out", "t"], {"SPARK_CONF_DIR": str(tmp_path)})
    assert "SPARK_SUBMIT_OPTS" not in env  # the operator's own log configuration wins


def test_submit_checks_its_arguments_before_any_jvm(tmp_path, capsys):
    """Without -- it is a usage error (2) that shows the form; a missing input is exit 1 with one line; neither
    starts spark-submit."""
    from mconn.pipeline import submit

    assert submit.main(["--master", "spark://h:7077", "logs", "--out", "t"]) == 2
    assert "put -- between spark-submit's options and the pipeline's arguments" in capsys.readouterr().err
    assert submit.main(["--master", "spark://h:7077", "--", str(tmp_path / "gone"), "--out", "t"]) == 1
    assert capsys.readouterr().err == f"mconn-pipeline: error: {tmp_path / 'gone'}: no such file or directory\n"
    assert submit.main(["--", str(tmp_path)]) == 2  # no --out: the pipeline's own usage error
