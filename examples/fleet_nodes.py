"""The fleet demo's nodes: twistd processes, the fault proxy, the fault schedule.

Used by examples/fleet.py (see its docstring for the topology). Every wait is bounded;
every process started is recorded in ``RUN/pids`` and stopped by its PID in
:meth:`Fleet.stop_all`, which is idempotent and runs on every way out.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

from twisted.internet import defer, protocol, task

from mconn import NodeKey
from mconn.ops.faultproxy import FaultProxy
from fleet_view import TelemetryTail

ROOT = pathlib.Path(__file__).resolve().parents[1]
TWISTD = pathlib.Path(sys.executable).with_name("twistd")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
NODE_COUNT = 5
#: Bounds on the waits, in seconds.
START_TIMEOUT = 60.0  # a twistd process up (imports are slow on a loaded machine)
LINKS_TIMEOUT = 60.0  # the seed links connected
STOP_TIMEOUT = 20.0  # a node gone after SIGTERM
KILL_TIMEOUT = 10.0  # a node gone after SIGKILL
SETTLE_TIMEOUT = 20.0  # links back after the last fault, before stopping
#: Started-line of mconn.ops.node (logged once twistd's signal handlers are installed).
STARTED = b" started: listening on "
#: Config for the demo: faults are found within seconds, sessions wait 30 s to resume.
NODE_CONFIG = {
    "ping-interval": "1.5",
    "pong-timeout": "3",
    "handshake-timeout": "4",
    "dial-timeout": "2",
    "max-reconnect-delay": "2",
    "resume-grace": "30",
    "ignore-discovered-addresses": True,  # a flag: no value
    "max-connections-per-ip": "64",
    "stats-interval": "2",
    "telemetry-rotate-bytes": "0",
}
FILE_SIZE = 1 << 20
#: Node options when mconn-pipeline --follow watches the fleet: files closed every 2 s
#: (names that never change), and all of them kept for the audit at the end.
FOLLOW_ARGS = ("--telemetry-rotate-seconds", "2", "--telemetry-keep-files", "1000000")


class FleetError(Exception):
    """The fleet could not be run (a node did not start): what and where to look."""


class Interrupted(FleetError):
    """Ctrl-C (SIGINT) or SIGTERM: the run stops early; the nodes are stopped as usual."""


class Waits:
    """Sleeps and polls that an interrupt ends at once (with :class:`Interrupted`)."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.interrupted = None  # the signal's name, once interrupted
        #: Called with no arguments on an interrupt (e.g. to stop a running pipeline).
        self.on_interrupt: list = []
        self._pending: set = set()

    def interrupt(self, name: str) -> None:
        self.interrupted = name
        for d in list(self._pending):
            d.cancel()
        for callback in list(self.on_interrupt):
            callback()

    async def sleep(self, seconds: float) -> None:
        self._check()
        d = task.deferLater(self.clock, max(0.0, seconds), lambda: None)
        self._pending.add(d)
        try:
            await d
        except defer.CancelledError:
            self._check()
            raise
        finally:
            self._pending.discard(d)

    async def until(self, predicate, what: str, timeout: float, step: float = 0.2):
        """Poll ``predicate`` until true; FleetError naming ``what`` after ``timeout`` seconds."""
        deadline = self.clock.seconds() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if self.clock.seconds() > deadline:
                raise FleetError(f"timed out after {timeout:g} s waiting for {what}")
            await self.sleep(step)

    def _check(self) -> None:
        if self.interrupted:
            raise Interrupted(f"interrupted by {self.interrupted}")


def plugin_offers(*options: str) -> list[bool]:
    """Whether ``twistd mconn --help`` lists each option (the plugin may predate it)."""
    try:
        out = subprocess.run([str(TWISTD), "mconn", "--help"], env=ENV, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return [False] * len(options)
    return [f"{option} " in out.stdout or f"{option}=" in out.stdout for option in options]


class _Process(protocol.ProcessProtocol):
    """Tells when the process ended, and how."""

    def __init__(self) -> None:
        self.ended = defer.Deferred()
        self.status = None  # "exit 0", "signal 15", ...

    def processEnded(self, reason) -> None:
        value = reason.value
        self.status = f"signal {value.signal}" if getattr(value, "signal", None) else f"exit {value.exitCode}"
        self.ended.callback(self.status)


class Node:
    """One node of the fleet: its key, its directory, and its twistd process (one at a time)."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet = fleet
        self.name = f"n{index}"
        self.directory = fleet.run_dir / "nodes" / self.name
        self.directory.mkdir(parents=True, exist_ok=True)
        self.key_path = self.directory / "node.key"
        key = NodeKey.generate()
        key.save(self.key_path)
        self.node_id = key.node_id
        self.port = None  # the direct listen port, kept across restarts
        self.starts = 0
        self.process: _Process | None = None
        self.pid = None
        self.log_path = None
        self.stopping = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.status is None

    def started(self) -> bool:
        """Up: twistd logged the node's started line (SIGTERM is orderly from then on)."""
        if not self.running:
            raise FleetError(f"{self.name} exited with {self.process.status} while starting; see {self.log_path}")
        return STARTED in self.log_path.read_bytes()

    def start(self, peers: list[str], env: dict) -> None:
        self.starts += 1
        suffix = "" if self.starts == 1 else f"-{self.starts}"
        # Followed, a restart keeps its PATH: the node closes the killed run's file first.
        telemetry = self.fleet.telemetry_dir / f"{self.name}{'' if self.fleet.follow else suffix}.json"
        self.log_path = self.directory / f"twistd{suffix}.log"
        args = [
            str(TWISTD),
            "-n",
            "--pidfile",
            "",
            "mconn",
            "--listen",
            f"tcp:{self.port or 0}:interface=127.0.0.1",
            "--key",
            str(self.key_path),
            "--telemetry",
            str(telemetry),
            *[a for peer in peers for a in ("--peer", peer)],
            *[a for spec in self.fleet.reactors for a in ("--reactor", spec)],
            *[
                a
                for option, value in NODE_CONFIG.items()
                for a in ((f"--{option}",) if value is True else (f"--{option}", value))
            ],
            *self.fleet.feature_args,
            *(FOLLOW_ARGS if self.fleet.follow else ()),
        ]
        with open(self.log_path, "wb") as log, open(os.devnull, "rb") as null:
            self.process = _Process()
            transport = self.fleet.clock.spawnProcess(
                self.process,
                args[0],
                args,
                env=env,
                path=str(self.directory),
                childFDs={0: null.fileno(), 1: log.fileno(), 2: log.fileno()},
            )
        self.pid = transport.pid
        self.stopping = False
        self.fleet.record_pid(self, telemetry)

    def signal(self, number: int) -> None:
        """Signal our process by its PID; only while it is unreaped, so the PID is still ours."""
        if self.running:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:
                pass

    async def kill(self) -> None:
        """SIGKILL, and wait (bounded) until it is gone."""
        self.stopping = True
        self.signal(signal.SIGKILL)
        await self._ended(KILL_TIMEOUT)

    async def terminate(self) -> None:
        """SIGTERM once the node is up (else SIGKILL), a bounded wait, SIGKILL if still there."""
        if not self.running:
            return
        self.stopping = True
        try:
            up = STARTED in self.log_path.read_bytes()
        except OSError:
            up = False
        self.signal(signal.SIGTERM if up else signal.SIGKILL)
        try:
            await self._ended(STOP_TIMEOUT)
        except FleetError as timed_out:
            self.signal(signal.SIGKILL)
            await self._ended(KILL_TIMEOUT)
            raise FleetError(
                f"{self.name} (pid {self.pid}) ignored SIGTERM for {STOP_TIMEOUT:g} s; killed it"
            ) from timed_out

    async def _ended(self, timeout: float) -> None:
        if not self.running:
            return
        d = self.process.ended
        timer = self.fleet.clock.callLater(timeout, d.cancel)
        try:
            await d
        except defer.CancelledError:
            raise FleetError(
                f"{self.name} (pid {self.pid}) still running {timeout:g} s after being signalled"
            ) from None
        finally:
            if timer.active():
                timer.cancel()


class Fleet:
    """The nodes, the proxy in front of the seed, the schedule of faults."""

    def __init__(
        self,
        clock,
        run_dir: pathlib.Path,
        *,
        count: int,
        duration: float,
        bulk_rate: float,
        progress,
        pex: bool,
        follow: bool = False,
    ) -> None:
        self.clock = clock
        self.run_dir = run_dir
        self.telemetry_dir = run_dir / "telemetry"
        self.count = count
        self.duration = duration
        self.bulk_rate = bulk_rate
        self.progress = progress
        self.pex = pex
        self.follow = follow
        self.tls, self.status = plugin_offers("--tls", "--status")
        self.reactors = ["reactors.fleet:FleetChat", "reactors.fleet:FleetBulk"]
        if pex:
            self.reactors.append("reactors.pex:PexReactor")
        self.feature_args = (["--tls"] if self.tls else []) + (
            ["--status", "tcp:0:interface=127.0.0.1"] if self.status else []
        )
        self.nodes: list[Node] = []
        self.proxy: FaultProxy | None = None
        self.tail: TelemetryTail | None = None
        self.faults = {"resets": 0, "links reset": 0, "black holes": 0, "restarts": 0}
        self.failures: list[str] = []
        self.phase = "starting"
        self.started_at = None
        self._ticker = None
        self._stopping = None
        self.waits = Waits(clock)

    def describe_features(self) -> str:
        missing = [
            name
            for name, present in (
                ("TLS (--tls)", self.tls),
                ("status page (--status)", self.status),
                ("peer exchange", self.pex),
            )
            if not present
        ]
        text = "reactors " + ", ".join(spec.split(":")[1] for spec in self.reactors)
        text += "; TLS on" if self.tls else ""
        return text + (f"; not available yet: {', '.join(missing)}" if missing else "")

    def describe_faults(self) -> str:
        f = self.faults
        return (
            f"faults injected: {f['resets']} resets ({f['links reset']} links), {f['black holes']} black hole, "
            f"{f['restarts']} kill and restart of the seed"
        )

    def record_pid(self, node: Node, telemetry: pathlib.Path) -> None:
        with open(self.run_dir / "pids", "a") as f:
            f.write(f"{node.name} {node.pid} {telemetry.name}\n")

    # -- starting ------------------------------------------------------------------------

    async def start(self) -> None:
        self.telemetry_dir.mkdir(parents=True, exist_ok=True)
        self.demo_file = self.run_dir / "demo-file.bin"
        self.demo_file.write_bytes(os.urandom(FILE_SIZE))
        self.nodes = [Node(self, i) for i in range(self.count)]
        self.tail = TelemetryTail(self.telemetry_dir, {n.node_id: n.name for n in self.nodes})
        self._ticker = task.LoopingCall(self._tick)
        self._ticker.clock = self.clock
        self._ticker.start(0.5)
        seed = self.nodes[0]
        self.phase = f"starting seed {seed.name}"
        seed.start([], self._env(seed))
        await self._wait_up(seed)
        self.proxy = FaultProxy("127.0.0.1", seed.port, clock=self.clock)
        await self.proxy.start()
        self.phase = f"starting {self.count - 1} nodes"
        for node in self.nodes[1:]:
            node.start([self.seed_address], self._env(node))
        for node in self.nodes[1:]:
            await self._wait_up(node)
        self.phase = "connecting"
        await self.waits.until(self._seed_links_up, "every node's session with the seed", LINKS_TIMEOUT)
        self.started_at = self.clock.seconds()

    @property
    def seed_address(self) -> str:
        return f"{self.nodes[0].node_id}@127.0.0.1:{self.proxy.port}"

    def _env(self, node: Node) -> dict:
        env = dict(ENV, MCONN_DEMO_NAME=node.name, MCONN_DEMO_BULK_RATE=str(self.bulk_rate))
        if node is self.nodes[1]:  # one node sends a file, a few times over the run
            env.update(
                MCONN_DEMO_SEND_FILE=str(self.demo_file),
                MCONN_DEMO_FILE_AFTER="2",
                MCONN_DEMO_FILE_EVERY=str(max(5.0, self.duration / 3)),
            )
        return env

    async def _wait_up(self, node: Node) -> None:
        await self.waits.until(node.started, f"{node.name} to start (see {node.log_path})", START_TIMEOUT)
        address = await self.waits.until(
            lambda: self.tail.poll() or self.tail.listening.get(node.node_id),
            f"{node.name}'s listening event",
            START_TIMEOUT,
        )
        node.port = int(address.rsplit(":", 1)[1])

    def _seed_links_up(self) -> bool:
        self.tail.poll()
        seed = self.nodes[0].node_id
        return all(self.tail.connected(node.node_id, seed) for node in self.nodes[1:])

    # -- the run -------------------------------------------------------------------------

    def schedule(self) -> list:
        """(seconds after the start, what, action) of every fault, spread over the run."""
        d = self.duration
        hole = min(4.0, max(2.0, 0.1 * d))
        return [
            (0.15 * d, "reset", self._reset),
            (0.30 * d, "reset", self._reset),
            (0.35 * d, "black hole", lambda: self._black_hole(hole)),
            (0.50 * d, "kill and restart the seed", self._restart_seed),
            (0.80 * d, "reset", self._reset),
        ]

    async def run_schedule(self) -> None:
        for at, what, action in self.schedule():
            self.phase = "running"
            await self.waits.sleep(self.started_at + at - self.clock.seconds())
            self.phase = what
            await action()
        self.phase = "running"
        await self.waits.sleep(self.started_at + self.duration - self.clock.seconds())
        self.phase = "settling"
        try:  # let the last breaks heal, so that the audit sees sessions end cleanly
            await self.waits.until(self._seed_links_up, "the seed links to reconnect", SETTLE_TIMEOUT)
        except Interrupted:
            raise
        except FleetError as e:
            self.failures.append(str(e))

    async def _reset(self) -> None:
        self.faults["resets"] += 1
        self.faults["links reset"] += self.proxy.reset_all()

    async def _black_hole(self, seconds: float) -> None:
        self.faults["black holes"] += 1
        self.proxy.blackhole_all()
        await self.waits.sleep(seconds)
        self.proxy.heal()

    async def _restart_seed(self) -> None:
        seed = self.nodes[0]
        self.faults["restarts"] += 1
        await seed.kill()
        self.tail.forget(seed.node_id)
        await self.waits.sleep(1.0)
        self.phase = "restarting the seed"
        seed.start([], self._env(seed))
        await self._wait_up(seed)

    def _tick(self) -> None:
        self.tail.poll()
        for node in self.nodes:
            if node.process is not None and not node.running and not node.stopping:
                node.stopping = True  # report once
                self.failures.append(
                    f"{node.name} exited with {node.process.status} during the run; see {node.log_path}"
                )
        elapsed = 0.0 if self.started_at is None else self.clock.seconds() - self.started_at
        self.progress.update(
            phase=self.phase,
            elapsed=elapsed,
            up=sum(n.running for n in self.nodes),
            nodes=self.count,
            links=self.tail.links(),
            faults=sum(self.faults[k] for k in ("resets", "black holes", "restarts")),
            resumes=self.tail.resumes(),
            messages=self.tail.messages(),
        )

    # -- stopping ------------------------------------------------------------------------

    def stop_all(self) -> defer.Deferred:
        """SIGTERM every node, wait (bounded), SIGKILL what is left, stop the proxy. Idempotent.

        Called again while stopping (a second Ctrl-C), it SIGKILLs what is still running.
        """
        if self._stopping is not None and not self._stopping.called:
            for node in self.nodes:
                node.signal(signal.SIGKILL)
        if self._stopping is None:
            self._stopping = defer.ensureDeferred(self._stop_all())
        d = defer.Deferred()
        self._stopping.addBoth(lambda result: (d.callback(None), result)[1])
        return d

    async def _stop_all(self) -> None:
        self.phase = "stopping"
        waits = [defer.ensureDeferred(node.terminate()) for node in self.nodes]
        results = await defer.DeferredList(waits, consumeErrors=True)
        for ok, result in results:
            if not ok:
                self.failures.append(result.getErrorMessage())
        if self.proxy is not None:
            await self.proxy.stop()
        if self._ticker is not None and self._ticker.running:
            self._tick()
            self._ticker.stop()
        self.phase = "stopped"
