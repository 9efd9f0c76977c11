"""Nodes run by ``twistd mconn`` as real processes, for the operator tests.

Every wait is bounded; every process started is stopped by its PID in ``stop_all``,
whatever the outcome. The plugin is found through PYTHONPATH (the project root), so the
tests do not depend on how mconn is installed in the virtualenv.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from mconn.ops.telemetry_file import read_events

ROOT = pathlib.Path(__file__).resolve().parents[2]
TWISTD = pathlib.Path(sys.executable).with_name("twistd")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
#: Bound on every wait, in seconds (twistd starts in about a second on a busy machine).
TIMEOUT = 30.0
LOOPBACK = "tcp:0:interface=127.0.0.1"
STATUS_LINE = re.compile(r"mconn status page of node [0-9a-f]+ on (http://\S+)")


def wait_until(predicate, what: str, timeout: float = TIMEOUT):
    """Poll ``predicate`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def run_twistd(args, cwd, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run twistd to completion (bad configurations, daemon start)."""
    return subprocess.run([str(TWISTD), *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


class Node:
    """One ``twistd -n mconn`` process with its key, telemetry file and output in ``directory``."""

    def __init__(self, directory: pathlib.Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self.key = directory / f"{name}.key"
        self.telemetry = directory / f"{name}.json"
        self.output = directory / f"{name}.out"
        self.process: subprocess.Popen | None = None

    def start(self, *args: str) -> Node:
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                [
                    str(TWISTD),
                    "-n",
                    "--pidfile",
                    "",
                    "mconn",
                    "--key",
                    str(self.key),
                    "--create-key",
                    "--telemetry",
                    str(self.telemetry),
                    *args,
                ],
                cwd=self.directory,
                env=ENV,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def events(self, name: str | None = None) -> list[dict]:
        if not self.telemetry.exists():
            return []
        return [e for e in read_events(self.telemetry) if name is None or e["event"] == name]

    def wait_event(self, name: str, where=lambda e: True) -> dict:
        def found():
            self._check_running()
            return next((e for e in self.events(name) if where(e)), None)

        return wait_until(found, f"{self.name}: {name} event")

    def _check_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    @property
    def address(self) -> str:
        """``ID@HOST:PORT`` from the node's ``listening`` event."""
        event = self.wait_event("listening")
        return f"{event['node_id']}@{event['address']}"

    @property
    def status_url(self) -> str:
        """The status page's URL, from the line the node logs once the page's port is bound
        (``mconn status page of node ID on http://127.0.0.1:PORT/``)."""

        def logged():
            self._check_running()
            match = STATUS_LINE.search(self.log())
            return match and match.group(1)

        return wait_until(logged, f"{self.name}: the status page line")

    def terminate(self) -> int:
        """SIGTERM, then wait for the exit; the exit status.

        Waits first for the node's "started" line, which it logs once the reactor runs:
        a SIGTERM before twistd installs its handlers would kill it without a shutdown.
        """
        wait_until(lambda: " started: listening on " in self.log(), f"{self.name} to be running")
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=TIMEOUT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)


def stop_pid(pid: int) -> None:
    """Make sure a daemon we started is gone: SIGTERM, a bounded wait, then SIGKILL."""
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
