"""One real local Spark session for the whole test run (Spark takes seconds to start).

The pipeline extra (pyspark, matplotlib) and a Java runtime are required: the Makefile
installs them; these tests are not skipped when they are missing.
"""

import pytest


@pytest.fixture(scope="session")
def spark():
    from mconn.pipeline.spark import build_session

    # Small inputs: the settings the command gives a small local input (one shuffle
    # partition, no code generation, the quick JIT tier only; specs/pipeline.md section 6).
    session = build_session("local[2]", input_size=0)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tables(spark):
    """Reads one output table of a run: ``tables(out, "links")`` -> list of Row dicts."""

    def read(out, name):
        return [row.asDict() for row in spark.read.parquet(f"{out}/{name}").collect()]

    return read
