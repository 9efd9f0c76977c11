"""A start that fails after the reactors were started stops them again, once.

``Switch.listen`` starts the reactors before it binds (CometBFT starts its reactors before
the switch listens); a port in use then fails the start. Whatever failed, the node's
reactors get their ``stop_reactor`` exactly once, so they do not leak what
``start_reactor`` opened (timers, files): from ``Switch.listen`` itself, from the node
service (in-process) and from a ``twistd -n`` process, which exits before its reactor
runs. Real ports in use on 127.0.0.1; every Switch and service started is stopped, and
every process started is waited for.
"""

import os
import socket
import subprocess

import pytest
import pytest_twisted
from twisted.internet import defer, error

from helpers import bounded, the_reactor
from mconn import Switch
from mconn.ops.node import Options, StartupError, build_service
from operators.lifecycle_reactor import Lifecycle
from operators.twistd_nodes import ENV, TIMEOUT, TWISTD

pytestmark = pytest.mark.integration

REACTOR = ("--reactor", "operators.lifecycle_reactor:Lifecycle")


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 that a socket of the test listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(tmp_path, *args):
    options = Options()
    options.parseOptions(["--key", str(tmp_path / "node.key"), *REACTOR, *args])
    return build_service(options.settings, clock=the_reactor())


@pytest_twisted.ensureDeferred
async def test_a_failed_listen_on_a_switch_not_started_stops_the_reactors_it_started(busy_port):
    """Switch.listen on a port in use, the Switch not started: start_reactor, then stop_reactor before the
    Deferred fails; a later listen starts them again and stopService stops them once more."""
    reactor = Lifecycle()
    switch = Switch([reactor], clock=the_reactor())
    with pytest.raises(error.CannotListenError):
        await switch.listen(f"tcp:{busy_port}:interface=127.0.0.1")
    assert reactor.calls == ["start_reactor", "stop_reactor"]
    await switch.listen("tcp:0:interface=127.0.0.1")
    await bounded(defer.maybeDeferred(switch.stopService))
    assert reactor.calls == ["start_reactor", "stop_reactor", "start_reactor", "stop_reactor"]


@pytest_twisted.ensureDeferred
async def test_a_failed_listen_on_a_running_switch_leaves_the_reactors_to_stop_service(busy_port):
    """On a started Switch a failed listen changes nothing: its stopService stops the reactors, once."""
    reactor = Lifecycle()
    switch = Switch([reactor], clock=the_reactor())
    switch.startService()
    try:
        with pytest.raises(error.CannotListenError):
            await switch.listen(f"tcp:{busy_port}:interface=127.0.0.1")
        assert reactor.calls == ["start_reactor"]
    finally:
        await bounded(defer.maybeDeferred(switch.stopService))
    assert reactor.calls == ["start_reactor", "stop_reactor"]


def test_a_node_whose_second_port_is_in_use_stops_its_reactors_once(tmp_path, busy_port):
    """--listen FREE --listen BUSY: the first listen started the reactors; the failed start stops them, at once
    (before the reactor runs again) and once, with the first port closed."""
    free = free_port()
    service = node(
        tmp_path,
        "--create-key",
        "--listen",
        f"tcp:{free}:interface=127.0.0.1",
        "--listen",
        f"tcp:{busy_port}:interface=127.0.0.1",
    )
    reactor = service.switch.reactors[0]
    with pytest.raises(StartupError, match=f"--listen tcp:{busy_port}:interface=127.0.0.1: Address already in use"):
        service.startService()
    assert reactor.calls == ["start_reactor", "stop_reactor"]
    assert not service.running and not service.switch.running
    service.stopService()  # an owner that stops it anyway: nothing more
    assert reactor.calls == ["start_reactor", "stop_reactor"]


def test_a_node_whose_only_port_is_in_use_stops_its_reactors_once(tmp_path, busy_port):
    """--listen BUSY: the listen that started the reactors stops them again; the node service adds nothing."""
    service = node(tmp_path, "--create-key", "--listen", f"tcp:{busy_port}:interface=127.0.0.1")
    reactor = service.switch.reactors[0]
    with pytest.raises(StartupError):
        service.startService()
    assert reactor.calls == ["start_reactor", "stop_reactor"]


def test_twistd_with_a_port_in_use_runs_stop_reactor_before_it_exits(tmp_path, busy_port):
    """twistd -n with its second --listen port in use exits 1 with one line, and the reactors' stop_reactor
    ran (the file the reactor writes says start_reactor, stop_reactor)."""
    calls = tmp_path / "calls"
    result = subprocess.run(
        [
            str(TWISTD),
            "-n",
            "--pidfile",
            "",
            "mconn",
            "--key",
            str(tmp_path / "node.key"),
            "--create-key",
            *REACTOR,
            "--listen",
            f"tcp:{free_port()}:interface=127.0.0.1",
            "--listen",
            f"tcp:{busy_port}:interface=127.0.0.1",
        ],
        cwd=tmp_path,
        env=dict(ENV, MCONN_TEST_LIFECYCLE=str(calls)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 1, result
    assert f"mconn: StartupError: --listen tcp:{busy_port}:interface=127.0.0.1: Address already in use" in result.stderr
    assert calls.read_text().splitlines() == ["start_reactor", "stop_reactor"]
    assert not os.path.exists(tmp_path / "node.pid")
