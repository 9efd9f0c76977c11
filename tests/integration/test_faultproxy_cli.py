"""``mconn faultproxy`` as an operator runs it: the real command, a process, between two
Switches on 127.0.0.1.

The dialing Switch reaches the listening one only through the proxy (its
``ignore_discovered_addresses`` keeps it from learning the direct address), so every
fault the command prints happens to that session: a reset makes it resume, a black hole
holds a message until the hole is over, a delay shows in the round trip. Every wait is
bounded; every proxy process is stopped by its PID (SIGTERM, then SIGKILL in teardown),
every Switch stopped.
"""

from __future__ import annotations

import pathlib
import re
import signal
import socket
import subprocess
import sys

import pytest
import pytest_twisted

from helpers import bounded, the_reactor, until
from mconn import Config, Switch

from .test_loopback import CHANNELS, Collector, stop

pytestmark = pytest.mark.integration

MCONN = pathlib.Path(sys.executable).with_name("mconn")
#: Bound on every wait, in seconds.
TIMEOUT = 20.0
#: Re-dial at once after a break, through the proxy only; a round trip measured early.
CONFIG = Config(ignore_discovered_addresses=True, max_reconnect_delay=0.05, stats_interval=0.2)
STARTED = re.compile(r"mconn faultproxy: listening on 127\.0\.0\.1:(\d+), relaying to 127\.0\.0\.1:(\d+)")


class ProxyCommand:
    """One ``mconn faultproxy`` process, its output in a file."""

    def __init__(self, directory: pathlib.Path, *args: str) -> None:
        self.output_path = directory / f"faultproxy-{len(list(directory.iterdir()))}.out"
        with open(self.output_path, "wb") as out:
            self.process = subprocess.Popen(
                [str(MCONN), "faultproxy", "--listen", "127.0.0.1:0", *args], stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def lines(self, word: str) -> list[str]:
        """Output lines whose text after the timestamp starts with ``word``."""
        return [line for line in self.output().splitlines() if line.partition(" ")[2].startswith(word)]

    async def port(self) -> int:
        def started():
            assert self.process.poll() is None, f"mconn faultproxy exited early:\n{self.output()}"
            return STARTED.search(self.output())

        await until(started, "the proxy's first line", TIMEOUT)
        return int(STARTED.search(self.output()).group(1))

    async def stop(self) -> int:
        """SIGTERM by PID and a bounded wait; the exit status."""
        self.process.send_signal(signal.SIGTERM)
        await until(lambda: self.process.poll() is not None, "the proxy to exit", TIMEOUT)
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)


@pytest.fixture
def proxies(tmp_path):
    """Starts ProxyCommands; kills any still running at the end, by PID."""
    started: list[ProxyCommand] = []

    def proxy(*args: str) -> ProxyCommand:
        started.append(ProxyCommand(tmp_path, *args))
        return started[-1]

    yield proxy
    for p in started:
        p.kill()


async def pair_through(proxy_of):
    """A listening Switch ``a``, the proxy in front of it (``proxy_of(a's port)``) and ``b``
    dialing ``a`` through it, persistently. Returns (a, b, b's Collector, a's Collector,
    b's Peer of a, the proxy)."""
    ra, rb = Collector(CHANNELS), Collector(CHANNELS)
    a = Switch([ra], clock=the_reactor(), config=CONFIG)
    b = Switch([rb], clock=the_reactor(), config=CONFIG)
    a.startService()
    b.startService()
    switches = (a, b)
    try:
        port = (await a.listen("tcp:0:interface=127.0.0.1")).getHost().port
        proxy = proxy_of(port)
        proxy_port = await proxy.port()
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{proxy_port}", persistent=True), TIMEOUT)
        await bounded(ra.added, TIMEOUT)
    except BaseException:
        await stop(*switches)
        raise
    return a, b, ra, rb, peer, proxy


@pytest_twisted.ensureDeferred
async def test_resets_make_the_session_resume_and_the_summary_counts_them(proxies):
    """--reset-every resets the proxied link; the session resumes (peer.resumes), still delivers, and the proxy
    exits 0 on SIGTERM with a summary that counts the resets."""
    a, b, ra, rb, peer, proxy = await pair_through(
        lambda port: proxies("--to", f"127.0.0.1:{port}", "--reset-every", "1")
    )
    try:
        await until(lambda: peer.resumes >= 1, "a resume after a reset", TIMEOUT)
        assert any(line.endswith("reset: 1 link") for line in proxy.lines("reset:")), proxy.output()
        assert peer.try_send(0x21, b"after the reset")
        await ra.until(1)
        assert ra.received() == [b"after the reset"]
    finally:
        await stop(a, b)
    assert await proxy.stop() == 0
    summary = proxy.lines("stopped:")
    assert len(summary) == 1 and re.search(r", [1-9]\d* resets?, 0 black holes, ", summary[0]), proxy.output()


@pytest_twisted.ensureDeferred
async def test_a_black_hole_holds_a_message_until_it_is_over(proxies):
    """--blackhole: a message sent once the hole began arrives only after the proxy says the hole is over (its
    dead link reset, the session resumed), and then exactly once."""
    a, b, ra, rb, peer, proxy = await pair_through(
        lambda port: proxies("--to", f"127.0.0.1:{port}", "--blackhole", "2")
    )
    try:
        await until(lambda: proxy.lines("black hole:"), "the first black hole", TIMEOUT)
        assert proxy.lines("black hole:")[0].endswith("black hole: 1 link, for 2 s"), proxy.output()
        resumes = peer.resumes
        assert peer.try_send(0x21, b"into the hole")
        await ra.until(1)
        assert proxy.lines("black hole over: 1 dead link reset"), "delivered before the hole was over"
        assert peer.resumes > resumes  # the reset at the end of the hole: the session resumed
        assert ra.received() == [b"into the hole"]
    finally:
        await stop(a, b)
    assert await proxy.stop() == 0


@pytest_twisted.ensureDeferred
async def test_a_delay_shows_in_the_round_trip(proxies):
    """--delay 150 delays each direction: the session's measured round trip is at least 300 ms (on the loopback
    it is well under a millisecond without the proxy's delay)."""
    a, b, ra, rb, peer, proxy = await pair_through(lambda port: proxies("--to", f"127.0.0.1:{port}", "--delay", "150"))
    try:
        assert "delay 150 ms each way" in proxy.output()
        await until(lambda: peer.round_trip is not None, "a measured round trip", TIMEOUT)
        assert peer.round_trip >= 0.3
    finally:
        await stop(a, b)
    assert await proxy.stop() == 0


@pytest_twisted.ensureDeferred
async def test_duration_ends_the_run_on_its_own(proxies):
    """--duration stops the proxy by itself, exit status 0, after its summary line."""
    proxy = proxies("--to", "127.0.0.1:9", "--duration", "0.5")
    await proxy.port()
    await until(lambda: proxy.process.poll() is not None, "the proxy to stop by itself", TIMEOUT)
    assert proxy.process.returncode == 0
    assert proxy.output().splitlines()[-1].partition(" ")[2].startswith("stopped: 0 connections"), proxy.output()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "10.0.0.1:26656"], "argument --to: '10.0.0.1:26656': the host must be a loopback IP address"),
        (["--to", "127.0.0.1:0"], "argument --to: '127.0.0.1:0': the port must be a number from 1 to 65535"),
        (["--to", "::1:26656"], "argument --to: '::1:26656': write an IPv6 address in brackets, [::1]:PORT"),
        (["--to", "26656", "--delay", "-5"], "argument --delay: '-5': the number of milliseconds must be 0 or more"),
        (["--to", "26656", "--reset-every", "0"], "argument --reset-every: '0': the number of seconds must be above 0"),
        (["--to", "26656", "--blackhole", "soon"], "argument --blackhole: 'soon' is not a number of seconds"),
        (["--to", "26656", "--duration", "inf"], "argument --duration: 'inf' is not a number of seconds"),
    ],
)
def test_bad_arguments_name_the_option_and_the_value(args, message):
    """A bad value stops the command before it listens, exit status 2, naming the option and the value."""
    result = subprocess.run(
        [str(MCONN), "faultproxy", "--listen", "127.0.0.1:0", *args], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 2, result
    assert result.stderr.splitlines()[-1].startswith(f"mconn faultproxy: error: {message}"), result.stderr
    assert result.stdout == ""


def test_the_proxy_refuses_to_relay_to_itself():
    """--listen and --to the same address: refused, naming it."""
    result = subprocess.run(
        [str(MCONN), "faultproxy", "--listen", "127.0.0.1:26656", "--to", "26656"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 2
    assert "--listen 127.0.0.1:26656 is the --to address: the proxy would relay to itself" in result.stderr


def test_a_listen_port_in_use_is_one_line_and_exit_status_1(tmp_path):
    """--listen on a port in use: one line naming the option, the address and the reason, exit status 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [str(MCONN), "faultproxy", "--listen", f"127.0.0.1:{port}", "--to", "9"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert result.returncode == 1
    assert result.stderr == f"mconn faultproxy: --listen 127.0.0.1:{port}: Address already in use\n"
