"""A local master's Python workers run the driver's interpreter (specs/pipeline.md section 6).

pyspark starts its workers with ``PYSPARK_PYTHON``, else the first ``python3`` on PATH:
perhaps another Python (pyspark refuses a worker of another minor version), or a version
manager's shim that runs shell scripts before it. The pipeline's one Python-side job
(``createDataFrame`` of the summary row) needs a worker.
"""

import os
import sys


def test_a_local_masters_workers_run_this_interpreter(spark):
    workers = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: __import__("sys").executable).collect()

    assert workers == [sys.executable, sys.executable]


def test_a_python_already_chosen_is_kept(monkeypatch):
    from mconn.pipeline import spark as spark_settings

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python3.11/bin/python")
    spark_settings.local_environment()

    assert os.environ["PYSPARK_PYTHON"] == "/opt/python3.11/bin/python"
