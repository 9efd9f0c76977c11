"""One IPv6 /64 is one address for the per-address limits, shown with real sockets from
five addresses of one /64 (specs/connection.md section 6, specs/resume.md section 1.3).

Loopback has one IPv6 address, so the test makes a network namespace (``ip netns add``;
it needs root, and is skipped without it) whose ``lo`` holds five addresses of
2001:db8:7:1::/64 (the attacker's), one of 2001:db8:7:2::/64 (an honest peer's), ``::1``
(another honest peer's) and the listener's. The listener and the raw-socket attacker
run inside it as processes (tests/integration/ipv6_prefix_node.py). From each of its
five addresses the attacker opens sessions that carry a message and then reset (left
suspended, as a dormant attacker leaves them), then sessions it keeps open.

Before, each address counted alone: the five held 32 suspended + 8 live sessions, and
the honest peers were refused ``inbound_limit``. Now the /64 holds at most
``max_connections_per_ip`` sessions, live and suspended together (each new one makes its
oldest suspended one give way; with all of them live the next is refused ``ip_limit``),
and both honest peers get a session. Every wait is bounded; both processes are killed by
PID and the namespace deleted at the end, whatever happened.

The same key holds for WebSocket clients behind a trusted proxy (``ws_trusted_proxies``),
counted by the address the proxy names: that one runs on 127.0.0.1, no namespace needed.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import endpoints

from helpers import RawPeer, stop_switches, the_reactor, until
from integration.test_websocket import node, upgrade_request, ws_listen
from mconn import Config

pytestmark = pytest.mark.integration

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "ipv6_prefix_node.py"
ATTACK_64 = "2001:db8:7:1::/64"
ATTACKERS = ["2001:db8:7:1::1", "2001:db8:7:1::2", "2001:db8:7:1::beef", "2001:db8:7:1:ffff::1", "2001:db8:7:1:a:b:c:d"]
HONEST = ["2001:db8:7:2::1", "::1"]
LISTENER = "2001:db8:7:ff::1"
#: Seconds each process may take to say what it must (they are local and small).
WAIT = 60.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def namespace():
    """A network namespace whose lo is up with the test's addresses; deleted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip to make a network namespace")
    name = f"mconn-v6-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for address in [*ATTACKERS, HONEST[0], LISTENER]:
            _ip("-n", name, "-6", "addr", "add", f"{address}/128", "dev", "lo", "nodad")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


class Process:
    """A process run inside the namespace, its stdout going to a file read as JSON lines."""

    def __init__(self, namespace: str, out: pathlib.Path, *args: str) -> None:
        self.out = out
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with open(out, "wb") as stdout:
            self.popen = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, str(SCRIPT), *args],
                stdout=stdout,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
            )

    def lines(self) -> list[dict]:
        found = []
        for line in self.out.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                pass  # a warning or a traceback line: shown by wait_for on failure
        return found

    def wait_for(self, event: str) -> dict:
        """The first line of ``event``, waiting at most WAIT seconds."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for line in self.lines():
                if line.get("event") == event:
                    return line
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} line from {self.popen.args}: {self.out.read_text()[-3000:]}")

    def stop(self) -> None:
        """Kill the process by its PID (``ip netns exec`` execs it: the PID is the script's)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


def test_five_addresses_of_one_ipv6_64_hold_one_addresss_sessions_and_honest_peers_get_in(namespace, tmp_path):
    config = Config()  # the listener runs Config's defaults for these limits
    processes = []
    try:
        listener = Process(namespace, tmp_path / "listener.jsonl", "listen", ATTACK_64)
        processes.append(listener)
        port = listener.wait_for("listening")["port"]
        attacker = Process(
            namespace, tmp_path / "attacker.jsonl", "attack", str(port), LISTENER, *ATTACKERS, "--", *HONEST
        )
        processes.append(attacker)
        done = attacker.wait_for("done")
        sessions = [line for line in listener.lines() if line.get("event") == "add_peer"]
    finally:
        for process in processes:
            process.stop()
    limit = config.max_connections_per_ip
    from_attack = [s for s in sessions if s["host"] in ATTACKERS]
    assert max(s["held"] for s in sessions) <= limit, [s["held"] for s in sessions]
    assert done["honest"] == {host: "session" for host in HONEST}, done
    assert {s["key"] for s in from_attack} == {ATTACK_64}, from_attack[:3]
    # Each dormant session made the oldest suspended one of the /64 give way; then the live
    # ones did, until the /64's share was all live and the next was refused at accept.
    assert done["dormant"] == {"session": 8 * len(ATTACKERS)}, done
    assert done["live"] == {"session": limit, "ip_limit": 2 * len(ATTACKERS) - limit}, done
    assert {s["host"] for s in sessions} >= set(HONEST)


@pytest_twisted.ensureDeferred
async def test_proxied_ws_clients_of_one_ipv6_64_share_max_connections_per_ip():
    """Behind the trusted proxy (127.0.0.1), five clients the proxy names in one /64 hold
    max_connections_per_ip (3) upgrades together: the fourth and fifth are refused ``ip_limit``
    (HTTP 429); a client of another /64 is upgraded."""
    config = Config(stats_interval=0, ws_trusted_proxies={"127.0.0.1"}, max_connections_per_ip=3)
    switch, _ = node(config=config)
    held = []
    try:
        port = await ws_listen(switch)

        async def upgrade(client: str) -> bytes:
            request = upgrade_request(port).replace(b"\r\n\r\n", f"\r\nX-Forwarded-For: {client}\r\n\r\n".encode())
            endpoint = endpoints.TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
            raw = await endpoints.connectProtocol(endpoint, RawPeer(request))
            held.append(raw)
            await until(lambda: b"\r\n\r\n" in raw.data or raw.lost is not None, f"the answer to {client}", 5.0, 0.005)
            return bytes(raw.data).split(b"\r\n", 1)[0]

        answers = [await upgrade(f"2a01:4f8:7:1::{i + 1:x}") for i in range(5)]
        assert [a.split(b" ")[1] for a in answers] == [b"101"] * 3 + [b"429"] * 2, answers
        assert b"ip_limit: 3 connections from 2a01:4f8:7:1::/64 (max_connections_per_ip 3)" in answers[3]
        assert (await upgrade("2a01:4f8:7:2::1")).startswith(b"HTTP/1.1 101")
        assert switch.refusals.get("ip_limit") == 2, switch.refusals
        switch._check_invariants()
    finally:
        for raw in held:
            raw.transport.abortConnection()
        await stop_switches(switch)
