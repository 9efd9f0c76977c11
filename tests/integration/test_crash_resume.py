"""Sessions survive a SIGKILL of either node (specs/resume.md section 9): 100 seeded runs.

Each pair of processes (tests/integration/durable_node.py) is a sender and a receiver,
each with its node key file and its session store, connected through ``mconn
faultproxy``. The sender sends a numbered stream on two channels (``try_send`` on one,
``send`` on the other); the receiver's reactor appends every delivery, with its delivery
sequence, to a file (its own transaction log, read back by ``committed_deliveries``).

Each seed is one run: it picks the victim (sender or receiver) and a point of the stream
(a number of lines the receiver must have written first, plus up to 10 ms), SIGKILLs the
victim by its PID there, and starts it again with the same key and store. Several seeds
share a pair of processes (one restart each), and the pairs run side by side, so the
100 runs take about a minute on two cores. At the end the receiver's file must show every
message of both streams exactly once, in order per channel, with delivery sequences
1, 2, 3, ... in one session: nothing lost by a crash, nothing delivered twice.

A second test starts a node on a store written by another node key: it must refuse to
start, naming both keys.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from mconn.core.node_key import NodeKey

pytestmark = pytest.mark.integration

HERE = pathlib.Path(__file__).resolve().parent
NODE = str(HERE / "durable_node.py")
MCONN = pathlib.Path(sys.executable).with_name("mconn")
PROXY_STARTED = re.compile(r"mconn faultproxy: listening on 127\.0\.0\.1:(\d+)")
TRY_SEND, SEND = 0x20, 0x21

RUNS = 100
PAIRS = 5
#: Messages per channel, per run of a pair: the stream outlasts the pair's kills.
PER_RUN = 30
#: A kill comes after 1..SPAN more lines from the receiver (both channels together).
SPAN = 50
RATE = 400.0  # messages a second on the try_send channel (the send channel is one at a time)
#: Bound on every wait, in seconds.
TIMEOUT = 30.0


def until(condition, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """One process, its output in a file; stopped by its PID."""

    def __init__(self, name: str, directory: pathlib.Path, args: list[str]) -> None:
        self.name, self.args = name, args
        self.log = directory / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        until(lambda: self.output().count("ready") >= self.starts or self._died(), f"{self.name} to start")
        assert self.process is not None and self.process.poll() is None, f"{self.name} died:\n{self.output()}"

    def _died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=TIMEOUT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


class Pair:
    """A sender and a receiver through a fault proxy, and the receiver's ledger."""

    def __init__(self, directory: pathlib.Path, count: int) -> None:
        directory.mkdir()
        self.directory, self.count = directory, count
        keys = {}
        for role in ("sender", "receiver"):
            keys[role] = NodeKey.generate()
            keys[role].save(str(directory / f"{role}.key"))
        port = free_port()
        self.ledger = directory / "ledger"
        self.ledger.touch()
        self.proxy = Process("proxy", directory, [str(MCONN), "faultproxy", "--listen", "0", "--to", str(port)])
        self.proxy.start()
        proxy_port = int(until(lambda: PROXY_STARTED.search(self.proxy.output()), "the proxy").group(1))
        python = sys.executable
        self.receiver = Process(
            "receiver",
            directory,
            [python, NODE, "receiver", str(directory / "receiver.key"), str(directory / "receiver.db"), str(port)]
            + [str(self.ledger)],
        )
        address = f"{keys['receiver'].node_id}@127.0.0.1:{proxy_port}"
        self.sender = Process(
            "sender",
            directory,
            [python, NODE, "sender", str(directory / "sender.key"), str(directory / "sender.db"), address]
            + [str(count), str(RATE)],
        )

    def lines(self) -> int:
        return self.ledger.read_bytes().count(b"\n")

    def run(self, seeds: list[int]) -> list[str]:
        """One kill and restart per seed; returns what was done. A failure says what the
        processes printed besides their start lines."""
        try:
            return self._run(seeds)
        except AssertionError as e:
            said = [
                f"{p.name}: {line}"
                for p in (self.sender, self.receiver)
                for line in p.output().splitlines()
                if line.strip() not in ("ready", "acked")
            ]
            raise AssertionError(f"{self.directory}: {e}\n" + "\n".join(said[-40:])) from None

    def _run(self, seeds: list[int]) -> list[str]:
        self.receiver.start()
        self.receiver.wait_ready()
        self.sender.start()
        self.sender.wait_ready()
        done = []
        total = 2 * self.count
        # Both sides' session is on disk: the sender's first message left after its commit,
        # the receiver's first ack after its own.
        until(lambda: "acked" in self.sender.output(), "the receiver's first ack")
        for seed in seeds:
            rng = random.Random(seed)
            victim = rng.choice((self.sender, self.receiver))
            point = min(total, self.lines() + rng.randint(1, SPAN))
            until(lambda point=point: self.lines() >= point, f"seed {seed}: {point} lines ({victim.name} to be killed)")
            time.sleep(rng.uniform(0, 0.01))
            victim.kill()
            done.append(f"seed {seed}: killed the {victim.name} at {self.lines()} lines")
            victim.start()
            victim.wait_ready()
        until(lambda: self.lines() >= total, f"all {total} messages (after {done[-3:]})", timeout=60)
        return done

    def stop(self) -> None:
        for process in (self.sender, self.receiver, self.proxy):
            process.stop()

    def check(self, done: list[str]) -> None:
        """Every message of both streams exactly once, in order, with sequences 1..count."""
        streams: dict[int, list[tuple[int, int]]] = {TRY_SEND: [], SEND: []}
        sessions = set()
        for line in self.ledger.read_bytes().splitlines():
            session, channel, seq, payload = line.split(b" ")
            sessions.add(session)
            streams[int(channel)].append((int(seq), int(payload)))
        what = f"{self.directory}: {len(done)} kills, last {done[-3:]}"
        assert len(sessions) == 1, f"{what}: the stream ran over {len(sessions)} sessions"
        for channel, got in streams.items():
            payloads = [p for _, p in got]
            # Up to the shorter of the two: where they first differ (else the end of payloads).
            pairs = enumerate(zip(payloads, range(self.count), strict=False))
            first = next((i for i, (a, b) in pairs if a != b), len(payloads))
            assert payloads == list(range(self.count)), (
                f"{what}: channel {channel:#04x} payloads not 0..{self.count - 1} once each in order; "
                f"first difference at index {first}"
            )
            assert [s for s, _ in got] == list(range(1, self.count + 1)), f"{what}: sequences on {channel:#04x}"


def test_a_hundred_seeded_kills_of_sender_or_receiver_lose_nothing_and_repeat_nothing(tmp_path):
    seeds = list(range(RUNS))
    shares = [seeds[i::PAIRS] for i in range(PAIRS)]
    pairs = [Pair(tmp_path / f"pair{i}", count=PER_RUN * len(share)) for i, share in enumerate(shares)]
    try:
        with concurrent.futures.ThreadPoolExecutor(PAIRS) as pool:
            results = list(pool.map(lambda job: job[0].run(job[1]), zip(pairs, shares, strict=True)))
    finally:
        for pair in pairs:
            pair.stop()
    for pair, done in zip(pairs, results, strict=True):
        pair.check(done)
    victims = " ".join(" ".join(done) for done in results)
    assert victims.count("killed the sender") + victims.count("killed the receiver") == RUNS
    assert "killed the sender" in victims and "killed the receiver" in victims


def test_a_store_written_by_another_node_key_refuses_to_start(tmp_path):
    pair = Pair(tmp_path / "pair", count=10)
    try:
        pair.receiver.start()
        pair.receiver.wait_ready()
        pair.receiver.stop()
        # The sender's key with the receiver's store: refused, naming both node ids.
        pair.sender.args[4] = str(pair.directory / "receiver.db")
        pair.sender.start()
        assert pair.sender.process is not None
        pair.sender.process.wait(timeout=TIMEOUT)
        output = pair.sender.output()
        assert pair.sender.process.returncode != 0
        assert "StoreOwnedByOtherNode" in output, output
        assert NodeKey.load(str(pair.directory / "receiver.key")).node_id in output, output
    finally:
        pair.stop()
