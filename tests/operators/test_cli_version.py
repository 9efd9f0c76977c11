"""``mconn --version`` names the per-packet path that runs, and the code that builds and
reads WebSocket frames: each the compiled twin or pure Python."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

PROGRAM = "import sys; from mconn.ops.cli import main; sys.exit(main(['--version']))"


def _version(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "MCONN_PURE"} | env
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environ, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_version_says_pure_python_and_why_under_mconn_pure():
    assert _version(MCONN_PURE="1") == "mconn 0.1.0 (pure Python (MCONN_PURE=1); ws frames pure Python (MCONN_PURE=1))"


@pytest.mark.skipif(
    importlib.util.find_spec("mconn.core._speedups") is None or importlib.util.find_spec("mconn.net._wsframe") is None,
    reason="the compiled twins mconn.core._speedups and mconn.net._wsframe are not built (`make` builds them)",
)
def test_version_says_accelerated_with_the_compiled_twins():
    assert _version() == "mconn 0.1.0 (accelerated; ws frames accelerated)"
