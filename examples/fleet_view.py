"""What the fleet demo shows: the progress line, the live telemetry, the audit's summary.

Used by examples/fleet.py. :class:`TelemetryTail` follows the nodes' telemetry files
(specs/telemetry.md) while they are written; :func:`run_pipeline` runs ``mconn-pipeline``
on them afterwards, with a bounded wait.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import sys

from twisted.internet import defer, protocol

PIPELINE = pathlib.Path(sys.executable).with_name("mconn-pipeline")
PIPELINE_TIMEOUT = 600.0
#: Without a terminal, the progress line is printed at most this often (seconds).
PLAIN_INTERVAL = 5.0
#: The line a node logs once its status page listens (mconn/ops/status.py).
STATUS_LINE = re.compile(rb"mconn status page of node [0-9a-f]+ on (http://\S+) \(Prometheus metrics: (http://\S+)\)")


def print_status_urls(nodes) -> None:
    """Each node's status page and Prometheus ``/metrics`` URL, from the line in its log."""
    for node in nodes:
        match = STATUS_LINE.search(node.log_path.read_bytes()) if node.log_path is not None else None
        if match is not None:
            page, metrics = (url.decode() for url in match.groups())
            print(f"fleet: {node.name} status page {page} Prometheus metrics {metrics}", flush=True)


class TelemetryTail:
    """Reads the complete lines appended to every ``*.json`` file in a directory.

    Keeps what the progress line shows: each session's state per (node, peer), the
    resumes, and the messages delivered (from ``channel_stats``).
    """

    def __init__(self, directory: pathlib.Path, names: dict[str, str]) -> None:
        self.directory = directory
        self.names = names
        self.listening: dict[str, str] = {}  # node id -> its first listen address
        self._offsets: dict[int, int] = {}  # inode -> bytes read
        self._state: dict[tuple[str, str], str] = {}  # (node, peer) -> connected / suspended
        self._resumed: set = set()  # (session id, resume number)
        self._delivered: dict[tuple, list] = {}  # (node, peer, channel) -> [base, last]

    def poll(self) -> None:
        # Offsets by inode: a file closed by rotation (renamed PATH.<time>-<seq>) is read on
        # from where its live name was left, and the new PATH from its start.
        files = []
        for path in self.directory.glob("*.json*"):
            try:
                files.append((path, path.stat()))
            except OSError:
                continue
        files.sort(key=lambda f: (f[0].name.split(".json")[0], f[1].st_mtime))  # each node's oldest first
        present = set()
        for path, info in files:
            present.add(info.st_ino)
            offset = self._offsets.get(info.st_ino, 0)
            if info.st_size <= offset:
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(8 << 20)
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # only whole lines: the writer may be mid-line
            self._offsets[info.st_ino] = offset + end
            for line in data[:end].splitlines():
                try:  # jsonFileLogObserver starts each record with an RS (RFC 7464)
                    event = json.loads(line.lstrip(b"\x1e"))
                except ValueError:
                    continue  # a line cut by a SIGKILL: the pipeline counts those
                if isinstance(event, dict):
                    self._see(event)
        for inode in [i for i in self._offsets if i not in present]:
            del self._offsets[inode]

    def _see(self, e: dict) -> None:
        kind, node, peer = e.get("event"), e.get("node_id"), e.get("peer_id")
        if kind == "listening":
            self.listening.setdefault(node, e.get("address"))
        elif kind in ("session_started", "session_resumed"):
            self._state[(node, peer)] = "connected"
            if kind == "session_resumed":
                self._resumed.add((e.get("session_id"), e.get("resumes")))
        elif kind == "session_suspended":
            self._state[(node, peer)] = "suspended"
        elif kind == "session_ended":
            self._state.pop((node, peer), None)
        elif kind == "channel_stats":
            value = e.get("delivered")
            if isinstance(value, int):
                counter = self._delivered.setdefault((node, peer, e.get("channel_id")), [0, 0])
                if value < counter[1]:  # a new session counts from 0
                    counter[0] += counter[1]
                counter[1] = value

    def forget(self, node_id: str) -> None:
        """A node was killed: nothing it logged about its sessions holds any more."""
        self.listening.pop(node_id, None)
        for key in [k for k in self._state if k[0] == node_id]:
            del self._state[key]

    def connected(self, node: str, peer: str) -> bool:
        return self._state.get((node, peer)) == "connected"

    def links(self) -> int:
        return len({frozenset(k) for k, state in self._state.items() if state == "connected"})

    def resumes(self) -> int:
        return len(self._resumed)

    def messages(self) -> int:
        return sum(base + last for base, last in self._delivered.values())


class Progress:
    """One line that says what is happening; rewritten in place on a terminal."""

    def __init__(self, clock, total: float, stream=None) -> None:
        self.clock = clock
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_plain = None
        self._last_phase = None
        self._open = False
        self.fields = {}

    def update(self, **fields) -> None:
        self.fields.update(fields)
        f = self.fields
        text = f"[{f.get('phase', '')}]"
        if "elapsed" in f:
            text += (
                f" {f['elapsed']:.0f}/{self.total:.0f} s | nodes up {f['up']}/{f['nodes']} | links {f['links']}"
                f" | faults {f['faults']} | resumes {f['resumes']} | messages {f['messages']:,}"
            )
        self._show(text, f.get("phase"))

    def stage(self, text: str) -> None:
        """A phase without the fleet's figures (the audit)."""
        self.fields = {"phase": text}
        self._show(f"[{text}]", text)

    def _show(self, text: str, phase) -> None:
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + text[:width].ljust(width))
            self._open = True
        else:
            now = self.clock.seconds()
            if phase == self._last_phase and self._last_plain is not None and now - self._last_plain < PLAIN_INTERVAL:
                return
            self._last_plain, self._last_phase = now, phase
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        """End the line in place, so that what is printed next starts on a new line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


@dataclasses.dataclass
class PipelineResult:
    exit_code: int | None  # None: it did not finish in time
    record: dict  # the --json line: summary, timings, report
    stderr: str


class _Pipeline(protocol.ProcessProtocol):
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.out = bytearray()
        self.err = bytearray()
        self.shown = None
        self.ended = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data
        # the pipeline's stage lines: "[n/total] stage: detail (1.2 s)"; Spark and the JVM
        # may print other things on stderr, which stay in PipelineResult.stderr
        lines = [line.strip() for line in bytes(self.err).decode(errors="replace").splitlines()]
        stages = [line for line in lines if line.startswith("[")]
        if stages and stages[-1] != self.shown:
            self.shown = stages[-1]
            self.progress.stage("audit " + self.shown[:90])

    def processEnded(self, reason) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


async def run_pipeline(
    clock, telemetry_dir: pathlib.Path, out: pathlib.Path, progress: Progress, waits
) -> PipelineResult:
    """``mconn-pipeline TELEMETRY --out OUT --check --json``, stopped by its PID after
    PIPELINE_TIMEOUT (SIGKILL) or on an interrupt (SIGTERM)."""
    args = [str(PIPELINE), str(telemetry_dir), "--out", str(out), "--check", "--json"]
    progress.stage("audit: starting Spark")
    proc = _Pipeline(progress)
    transport = clock.spawnProcess(proc, args[0], args, env=dict(os.environ))
    transport.closeStdin()
    pid = transport.pid

    def stop(number):
        if not proc.ended.called:  # not reaped yet: the PID is still our child's
            os.kill(pid, number)

    timer = clock.callLater(PIPELINE_TIMEOUT, stop, signal.SIGKILL)
    waits.on_interrupt.append(lambda: stop(signal.SIGTERM))
    try:
        code = await proc.ended
    finally:
        waits.on_interrupt.clear()
        if timer.active():
            timer.cancel()
    record = {}
    for line in bytes(proc.out).decode(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                pass
    return PipelineResult(code, record, bytes(proc.err).decode(errors="replace"))


def print_summary(result: PipelineResult, fleet) -> int:
    """Print the audit's summary; the exit status: 0 clean, 3 lost/duplicated, 1 failed."""
    summary = result.record.get("summary")
    if result.exit_code not in (0, 3) or not summary:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        print(f"fleet: error: the pipeline failed (exit {result.exit_code}):\n{tail}", file=sys.stderr, flush=True)
        return 1
    try:
        from mconn.pipeline.console import summary_table

        # The --json record's findings name the problem rows (sender, receiver, session,
        # channel, count), the clock-skew and one-sided notes, as mconn-pipeline prints them.
        findings = result.record.get("findings")
        print(summary_table(summary, result.record.get("report"), str(fleet.run_dir / "pipeline"), findings))
    except ImportError:
        pass
    s = summary
    print(
        f"fleet summary: sessions {s['sessions']}, resumes {s['resumes']}, fresh starts {s['fresh_starts']}, "
        f"restarts {s.get('restarts', 0)}, messages audited {s['messages_audited']}, lost {s['lost']}, duplicated {s['duplicated']}"
    )
    print(f"report: {result.record.get('report')}", flush=True)
    return 3 if s["lost"] or s["duplicated"] else 0
