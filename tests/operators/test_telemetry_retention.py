"""Telemetry retention: rotated files are bounded in number and bytes, the oldest deleted
first (specs/telemetry.md section 2.1, mconn/ops/telemetry_file.py).

The first tests drive a TelemetryFileService through a private log publisher; the last
runs a node built as twistd builds it and lets a stranger connect to it again and again
on 127.0.0.1, which is how unbounded files would pile up. Every wait is bounded.
"""

import functools
import pathlib
import re
import socket

import pytest
import pytest_twisted
from twisted.logger import Logger, LogPublisher

from helpers import Telemetry, the_reactor, until as poll
from mconn.ops.node import Options, build_service
from mconn.ops.node_config_file import COUNTS, ConfigurationError, Setting
from mconn.ops.node_settings import resolve
from mconn.ops.telemetry_file import (
    DEFAULT_KEEP_BYTES,
    DEFAULT_KEEP_FILES,
    TelemetryFileService,
    read_events,
    closed_paths,
    rotated_paths,
)

NODE_ID = "ab" * 20
SPEC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "telemetry.md"
TIMEOUT = 15.0
until = functools.partial(poll, seconds=TIMEOUT)


def write_events(path, count, **retention):
    """Log ``count`` numbered events through a TelemetryFileService at ``path``; its files, oldest first."""
    publisher = LogPublisher()
    service = TelemetryFileService(path, NODE_ID, publisher=publisher, **retention)
    service.startService()
    log = Logger(namespace="mconn", observer=publisher)
    try:
        for n in range(count):
            log.info("event {n}", event="test_event", node_id=NODE_ID, n=n, padding="x" * 100)
    finally:
        service.stopService()
    return rotated_paths(path)


def seqs(path) -> list[int]:
    """The sequence numbers of the closed files of the log at ``path``, oldest first."""
    return [int(name.rsplit("-", 1)[1]) for name in closed_paths(path)]


def test_rotated_files_beyond_keep_files_are_deleted_oldest_first(tmp_path):
    """With keep_files 3, only the last three closed files remain after many rotations, and what they hold is
    the newest events, contiguous up to the last one logged."""
    path = tmp_path / "t.json"
    files = write_events(path, 200, rotate_bytes=1000, keep_files=3, keep_bytes=10**9)
    last = seqs(path)[-1]
    assert files == closed_paths(path) + [str(path)] and seqs(path) == [last - 2, last - 1, last] and last > 3
    numbers = [e["n"] for e in read_events(path)]
    assert numbers == list(range(numbers[0], 200)) and numbers[0] > 0, "kept events are not the newest, in order"


def test_rotated_files_hold_at_most_keep_bytes(tmp_path):
    """With keep_bytes 2500 and files of about 1 KB, the rotated files total at most 2500 bytes, the oldest
    having been deleted, and the newest events survive."""
    path = tmp_path / "t.json"
    files = write_events(path, 200, rotate_bytes=1000, keep_files=100, keep_bytes=2500)
    rotated = [p for p in files if p != str(path)]
    assert rotated == closed_paths(path) and rotated, files
    assert seqs(path) == list(range(seqs(path)[0], seqs(path)[0] + len(rotated)))  # the newest, no gap
    assert sum((tmp_path / p).stat().st_size for p in rotated) <= 2500
    assert read_events(path)[-1]["n"] == 199


def test_keep_files_zero_keeps_only_the_live_file(tmp_path):
    """keep_files 0 deletes each file as it is rotated out; the live file is all that remains."""
    path = tmp_path / "t.json"
    assert write_events(path, 50, rotate_bytes=1000, keep_files=0) == [str(path)]


def test_files_left_by_an_earlier_run_are_pruned_when_the_file_is_opened(tmp_path):
    """Rotated files from an earlier run with a looser bound are pruned to the new one as soon as the file is
    opened, keeping the newest."""
    path = tmp_path / "t.json"
    for n in range(1, 9):
        (tmp_path / f"t.json.{n}").write_text(f"file {n}\n")
    service = TelemetryFileService(path, NODE_ID, publisher=LogPublisher(), keep_files=2)
    service.log_file.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.1", "t.json.2"]
    assert (tmp_path / "t.json.2").read_text() == "file 2\n"


def test_the_keep_options_have_defaults_and_refuse_bad_values(tmp_path):
    """--telemetry-keep-files and --telemetry-keep-bytes default to 10 files and 100 MiB, are read from the
    command line, and a negative or non-integer value is refused naming the option."""
    defaults = resolve({})
    assert (defaults.telemetry_keep_files, defaults.telemetry_keep_bytes) == (DEFAULT_KEEP_FILES, DEFAULT_KEEP_BYTES)
    assert (DEFAULT_KEEP_FILES, DEFAULT_KEEP_BYTES) == (10, 100 * 1024 * 1024)
    options = Options()
    options.parseOptions(["--telemetry-keep-files", "3", "--telemetry-keep-bytes", "5000"])
    assert (options.settings.telemetry_keep_files, options.settings.telemetry_keep_bytes) == (3, 5000)
    with pytest.raises(SystemExit, match="--telemetry-keep-files: -1 must be a number of files >= 0"):
        Options().parseOptions(["--telemetry-keep-files", "-1"])
    with pytest.raises(SystemExit, match="--telemetry-keep-bytes: 'lots' is not an integer"):
        Options().parseOptions(["--telemetry-keep-bytes", "lots"])
    with pytest.raises(ConfigurationError, match="node.toml: telemetry_keep_bytes: 1.5 must be a number of bytes"):
        resolve({"telemetry_keep_bytes": Setting(1.5, "node.toml: telemetry_keep_bytes")})


def test_the_spec_lists_every_retention_option_with_its_default():
    """specs/telemetry.md section 2.1 has a row for each rotation and retention option, with its TOML key and
    the default the code uses."""
    section = SPEC.read_text().split("### 2.1 Files, rotation and retention", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `--([\w-]+)` \(`(\w+)`\) \| (\d+)", section, re.MULTILINE)
    assert {key: int(default) for _, key, default in rows} == COUNTS
    assert all(option.replace("-", "_") == key for option, key, _ in rows)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_strangers_connections_cannot_grow_a_nodes_telemetry_beyond_the_bound(tmp_path):
    """A node built as twistd builds it, with --telemetry-rotate-bytes 2048, --telemetry-keep-files 2 and
    --telemetry-keep-bytes 10000, that a stranger connects to 60 times from 127.0.0.1 ends with at most two
    rotated files holding at most 10000 bytes; the oldest events (its start) are gone, the newest kept."""
    options = Options()
    options.parseOptions([
        "--listen", "tcp:0:interface=127.0.0.1", "--key", str(tmp_path / "node.key"),
        "--telemetry", str(tmp_path / "node.json"), "--telemetry-rotate-bytes", "2048",
        "--telemetry-keep-files", "2", "--telemetry-keep-bytes", "10000",
    ])  # fmt: skip
    capture = Telemetry().start()
    service = build_service(options.settings, clock=the_reactor())
    service.startService()
    try:
        port = service.ports[0].getHost().port
        for n in range(60):
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT):
                pass  # connect and hang up, as a port scanner does
            await until(lambda n=n: len(capture.named("connection_lost")) > n, f"connection {n + 1} to be logged")
    finally:
        await service.stopService()
        capture.stop()
    path = tmp_path / "node.json"
    files = rotated_paths(path)
    assert files == closed_paths(path) + [str(path)] and len(files) == 3, files
    assert sum((tmp_path / p).stat().st_size for p in files[:-1]) <= 10000
    kept = read_events(path)
    assert kept[0]["event"] != "node_started" and kept[-1] == {**kept[-1], "node_id": service.switch.node_id}
    assert len(capture.named("connection_made")) == 60
