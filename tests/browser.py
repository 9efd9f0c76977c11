"""Headless Chromium for the tests that render a page (the status page, the fleet
report): a bounded run, its process group stopped.

``/usr/bin/chromium`` is installed by ``make test`` (the Makefile's Debian packages).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Where screenshots are kept (git-ignored).
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_TIMEOUT = 60.0


def run_browser(*args: str) -> str:
    """Run headless Chromium with ``args``; its stdout. Bounded: on a timeout its process
    group (led by the PID started here) is killed, and so are helpers it left behind."""
    with tempfile.TemporaryDirectory(prefix="mconn-chromium-") as profile:
        command = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            *args,
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True
        )
        try:
            out, err = process.communicate(timeout=BROWSER_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise AssertionError(f"chromium did not finish within {BROWSER_TIMEOUT}s: {command}") from None
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # helpers it left behind, if any
            except ProcessLookupError:
                pass
        assert process.returncode == 0, f"chromium exited with {process.returncode}: {err[-2000:]}"
        return out
