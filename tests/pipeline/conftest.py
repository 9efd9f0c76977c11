"""One real local Spark session for the whole test run (Spark takes seconds to start).

The pipeline extra (pyspark, matplotlib) and a Java runtime are required: the Makefile
installs them; these tests are not skipped when they are missing.
"""

import pytest


@pytest.fixture(scope="session")
def spark():
    from mconn.pipeline.spark import build_session

    # Small inputs: compiling code (Spark's codegen, the JIT's optimizing tier) would cost
    # more than it saves.
    small = {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    }
    session = build_session("local[2]", small, java_options="-XX:TieredStopAtLevel=1")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tables(spark):
    """Reads one output table of a run: ``tables(out, "links")`` -> list of Row dicts."""

    def read(out, name):
        return [row.asDict() for row in spark.read.parquet(f"{out}/{name}").collect()]

    return read
