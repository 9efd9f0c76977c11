"""NodeService on real 127.0.0.1 sockets: persistent --peer nodes, and a start that fails.

In-process and bounded: every service started is stopped, whatever the outcome.
"""

import functools
import socket

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import sleep, the_reactor, until as poll
from mconn import NodeKey
from mconn.ops.node import Options, StartupError, build_service
from mconn.ops.telemetry_file import read_events

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
#: Every wait of this module polls for at most TIMEOUT seconds.
until = functools.partial(poll, seconds=TIMEOUT)


def node(*args):
    options = Options()
    options.parseOptions(list(args))
    return build_service(options.settings, clock=the_reactor())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def started():
    services = []
    yield services
    stops = [defer.maybeDeferred(s.stopService) for s in services if s.running]
    if stops:
        pytest_twisted.blockon(defer.DeferredList(stops).addTimeout(TIMEOUT, the_reactor()))


@pytest_twisted.ensureDeferred
async def test_a_peer_that_is_down_at_start_is_dialed_until_it_is_up(tmp_path, started):
    """A configured peer that is down at start is dialed again until it is up, and then connected."""
    key = NodeKey.generate()
    key.save(tmp_path / "a.key")
    port = free_port()
    b = node(
        "--key",
        str(tmp_path / "b.key"),
        "--telemetry",
        str(tmp_path / "b.json"),
        "--peer",
        f"{key.node_id}@127.0.0.1:{port}",
        "--max-reconnect-delay",
        "0.1",
    )
    b.startService()
    started.append(b)
    await until(
        lambda: any(e["event"] == "dial_attempt" and e["result"] == "failed" for e in read_events(tmp_path / "b.json")),
        "a failed first dial",
    )
    a = node("--key", str(tmp_path / "a.key"), "--listen", f"tcp:{port}:interface=127.0.0.1")
    a.startService()
    started.append(a)
    await until(lambda: key.node_id in b.switch.peers, "b to reach a once a is up")


@pytest_twisted.ensureDeferred
async def test_a_port_in_use_fails_the_start_and_leaves_nothing_open(tmp_path, started):
    """A --listen port in use fails the start with a StartupError naming it, and the ports and telemetry file
    opened so far are closed."""
    first = node("--key", str(tmp_path / "first.key"), "--listen", "tcp:0:interface=127.0.0.1")
    first.startService()
    started.append(first)
    port = first.ports[0].getHost().port
    free = free_port()
    second = node(
        "--key",
        str(tmp_path / "second.key"),
        "--telemetry",
        str(tmp_path / "second.json"),
        "--listen",
        f"tcp:{free}:interface=127.0.0.1",
        "--listen",
        f"tcp:{port}:interface=127.0.0.1",
    )
    with pytest.raises(StartupError, match=f"^--listen tcp:{port}:interface=127.0.0.1: Address already in use$"):
        second.startService()
    assert not second.running and second.telemetry.log_file.closed
    await sleep(0)  # the closed port lets go of its socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", free))  # the port that did open was closed again


@pytest_twisted.ensureDeferred
async def test_stopping_writes_the_closing_events_before_the_file_is_closed(tmp_path, started):
    """Stopping a node writes connection_lost and session_ended to its telemetry file before closing it."""
    a = node(
        "--key",
        str(tmp_path / "a.key"),
        "--listen",
        "tcp:0:interface=127.0.0.1",
        "--telemetry",
        str(tmp_path / "a.json"),
    )
    a.startService()
    started.append(a)
    b = node("--key", str(tmp_path / "b.key"), "--peer", f"{a.switch.node_id}@127.0.0.1:{a.ports[0].getHost().port}")
    b.startService()
    started.append(b)
    await until(lambda: len(a.switch.peers) == 1, "b to connect")
    await defer.maybeDeferred(a.stopService).addTimeout(TIMEOUT, the_reactor())
    names = [e["event"] for e in read_events(tmp_path / "a.json")]
    assert names[-2:] == ["connection_lost", "session_ended"]
    assert a.telemetry.log_file.closed
