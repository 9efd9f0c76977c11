"""`make run`'s fleet demo (examples/fleet.py), shortened: five twistd nodes, faults, the audit.

One run of about a minute (most of it Spark), as a subprocess with a bounded wait. Every
twistd process the demo started is recorded in RUN/pids; the test checks they are all
gone afterwards, and kills by PID any that are not (only processes whose command line
names this run directory), whatever the outcome.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from mconn.ops.telemetry_file import read_events
from operators.twistd_nodes import alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 420  # seconds: ~15 s of fleet, start and stop, then Spark (~30 s idle, minutes under load)
SUMMARY = re.compile(
    r"^fleet summary: sessions (\d+), resumes (\d+), fresh starts (\d+), restarts (\d+), "
    r"messages audited (\d+), lost (\d+), duplicated (\d+)$",
    re.M,
)


def recorded(run: pathlib.Path) -> list[tuple[str, int]]:
    path = run / "pids"
    if not path.exists():
        return []
    return [(name, int(pid)) for name, pid, *_ in (line.split() for line in path.read_text().splitlines())]


def kill_leftovers(run: pathlib.Path) -> None:
    for _, pid in recorded(run):
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if alive(pid) and str(run).encode() in cmdline:
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    run = tmp_path_factory.mktemp("fleet") / "run"
    proc = subprocess.Popen(
        [sys.executable, "examples/fleet.py", "--duration", "15", "--out", str(run)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        out += f"\n(test: the demo did not finish within {TIMEOUT} s)"
    finally:
        leftovers = [(name, pid) for name, pid in recorded(run) if alive(pid)]
        kill_leftovers(run)
    return proc.returncode, out, run, leftovers


def test_demo_exits_cleanly_with_a_clean_audit(demo):
    """The fleet demo exits 0 with an audit that lost and duplicated nothing, saw resumes, a fresh session and
    one restart, and wrote its report."""
    code, out, run, _ = demo
    assert code == 0, out
    summary = SUMMARY.search(out)
    assert summary, out
    sessions, resumes, fresh, restarts, audited, lost, duplicated = map(int, summary.groups())
    assert (lost, duplicated) == (0, 0), out
    assert resumes >= 1, out  # the resets and the black hole on the seed's proxy
    assert fresh >= 1, out  # the seed was killed and restarted with the same key
    assert restarts == 1, out  # node_started of the seed's second process (the only restart)
    assert audited > 0 and sessions >= 4, out
    report = re.search(r"^report: (.+)$", out, re.M).group(1)
    assert pathlib.Path(report).is_file() and pathlib.Path(report).is_relative_to(run)


def test_every_node_process_is_gone(demo):
    """Every node process the demo started (five, and the seed's restart) is gone when it exits."""
    code, out, run, leftovers = demo
    pids = recorded(run)
    # five nodes, and the seed's second process after its restart
    assert [name for name, _ in pids] == ["n0", "n1", "n2", "n3", "n4", "n0"], out
    assert leftovers == [], out


def test_nodes_chatted_streamed_and_moved_the_file(demo):
    """Every node saw chat lines, no bulk stream broke, no log has a traceback, and n1's file arrived byte for
    byte."""
    code, out, run, _ = demo
    logs = {path.relative_to(run): path.read_text(errors="replace") for path in (run / "nodes").glob("*/twistd*.log")}
    assert len(logs) == 6, sorted(logs)
    for name, text in logs.items():
        assert "fleet: chat <" in text, f"{name} saw no chat line:\n{text[-3000:]}"
        assert "bulk stream from" not in text, f"{name}: a bulk stream broke:\n{text[-3000:]}"
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
    received = [p for p in (run / "nodes").glob("*/downloads/demo-file*.bin")]
    assert received, "no node received n1's file"
    sent = (run / "demo-file.bin").read_bytes()
    assert all(p.read_bytes() == sent for p in received)


def test_the_seed_links_stayed_behind_the_proxy(demo):
    """n1..n4 learnt n0's direct address (hello, peer exchange) yet re-dialed it through the
    proxy after every fault (ignore_discovered_addresses), so every fault hit a link."""
    code, out, run, _ = demo
    events = {path.stem: read_events(path) for path in (run / "telemetry").glob("*.json")}
    seed_id = events["n0"][0]["node_id"]
    direct = {e["address"] for name in ("n0", "n0-2") for e in events[name] if e["event"] == "listening"}
    assert len(direct) == 1, direct  # restarted on the same port
    ups = [
        (name, e)
        for name in ("n1", "n2", "n3", "n4")
        for e in events[name]
        if e["event"] in ("session_started", "session_resumed") and e["peer_id"] == seed_id
    ]
    assert {e["remote_address"] for _, e in ups}.isdisjoint(direct), ups
    assert all(e["direction"] == "outbound" for _, e in ups if e["event"] == "session_started")
    assert any(e["event"] == "session_resumed" for _, e in ups)  # after the resets
    assert any(e["event"] == "session_started" and e["resume_refused"] for _, e in ups)  # after the restart


def test_a_node_that_cannot_start_fails_the_run(tmp_path):
    """A bad setting stops twistd at once: the demo says which node and where its log is,
    exits 1, runs no audit, and leaves nothing running."""
    run = tmp_path / "run"
    env = dict(os.environ, MCONN_DEMO_CHAT_INTERVAL="often")
    try:
        result = subprocess.run(
            [sys.executable, "examples/fleet.py", "--duration", "10", "--out", str(run)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        kill_leftovers(run)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"fleet: error: n0 exited with exit 1 while starting; see .*/nodes/n0/twistd.log", result.stderr)
    assert "MCONN_DEMO_CHAT_INTERVAL='often' is not a number" in (run / "nodes" / "n0" / "twistd.log").read_text()
    assert "fleet summary" not in result.stdout and not (run / "pipeline").exists()
    assert [name for name, _ in recorded(run)] == ["n0"]
    assert not any(alive(pid) for _, pid in recorded(run))


def test_telemetry_tail_reads_only_whole_records(tmp_path):
    """The fleet view's telemetry tail reads only whole records: a half-written one waits for its end and a
    garbled one is skipped."""
    sys.path.insert(0, str(ROOT / "examples"))
    from fleet_view import TelemetryTail

    a, b = "a" * 40, "b" * 40
    path = tmp_path / "n0.json"
    started = {"event": "session_started", "node_id": a, "peer_id": b, "session_id": "1" * 32}
    stats = {"event": "channel_stats", "node_id": a, "peer_id": b, "channel_id": 32, "delivered": 7}
    record = ("\x1e" + json.dumps(stats)).encode()
    path.write_bytes(b"\x1e" + json.dumps(started).encode() + b"\n" + record[:20])
    tail = TelemetryTail(tmp_path, {})
    tail.poll()
    assert tail.connected(a, b) and tail.links() == 1 and tail.messages() == 0
    with open(path, "ab") as f:
        f.write(record[20:] + b"\n" + b"\x1e{cut by a SIGKILL\n")
    tail.poll()
    assert tail.messages() == 7
    tail.forget(a)
    assert tail.links() == 0


def test_the_fleet_summary_names_the_problem_rows(capsys):
    """`make run`'s summary prints the findings of the pipeline's --json record under the table: the lost
    row named by sender, receiver, session and channel, as mconn-pipeline prints it."""
    sys.path.insert(0, str(ROOT / "examples"))
    from fleet_view import PipelineResult, print_summary

    # The --json summary's other figures (nodes, events, time span...) read as 0.
    summary = collections.defaultdict(int, sessions=4, resumes=1, fresh_starts=1, messages_audited=10, lost=2)
    row = "  2 lost: sender aa receiver bb session cc channel 0x20"
    result = PipelineResult(3, {"summary": summary, "report": None, "findings": [row]}, "")
    fleet = type("Fleet", (), {"run_dir": pathlib.Path("/nonexistent")})()
    assert print_summary(result, fleet) == 3
    out = capsys.readouterr().out
    assert row in out and "fleet summary: sessions 4" in out
