"""Fixtures shared by the adapter and integration tests.

pytest-twisted installs Twisted's default reactor (``--reactor=default``) before the
tests run; only tests/integration uses it, everything else runs on a ``task.Clock``.
"""

import tracemalloc

import pytest

from helpers import Telemetry


@pytest.fixture
def telemetry():
    """Captures the mconn telemetry events logged during the test."""
    capture = Telemetry().start()
    yield capture
    capture.stop()


@pytest.fixture(scope="module")
def tracing():
    """tracemalloc traces for the whole module: the fuzz targets measure memory only
    while it does (tests/fuzz/message_target.py, ``bounded``)."""
    tracemalloc.start()
    yield
    tracemalloc.stop()
