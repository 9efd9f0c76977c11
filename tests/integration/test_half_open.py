"""Half-open links and stalled event loops, on real loopback sockets.

The kernel-side timers (TCP_USER_TIMEOUT, TCP keepalive) are set from Config; and a
reactor that blocks this node's event loop for longer than pong_timeout must not make a
healthy peer look dead: the keepalive verdict waits one loop turn after a stall, so the
pong already sitting in the socket is read first (specs/connection.md section 3).
"""

import socket
import subprocess
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import endpoints, protocol

from helpers import sleep, the_reactor
from mconn import ChannelDescriptor, Config, Switch

from .test_loopback import Collector, bounded, start_pair, stop

pytestmark = pytest.mark.integration

CHANNELS = [ChannelDescriptor(0x20, priority=1)]

#: A healthy node in its own process (its loop never stalls): listens, prints
#: "node_id port", and runs until its standard input closes. It answers pings 0.1 s late.
PEER = r"""
import sys
from twisted.internet import reactor, stdio
from twisted.internet.protocol import Protocol
from mconn import ChannelDescriptor, Config, Reactor, Switch

class Quiet(Reactor):
    def get_channels(self):
        return [ChannelDescriptor(0x20, priority=1)]

class StopOnEOF(Protocol):
    def connectionLost(self, reason):
        reactor.stop()

# Pings are answered 0.1 s late, so that the pong reaches the other node while its loop
# is blocked (a ping is the lone byte 01 on an idle connection).
from mconn.net.protocol import MConnectionProtocol
_received = MConnectionProtocol.dataReceived

def slow_pong(self, data):
    if data == b"\x01":
        reactor.callLater(0.1, _received, self, data)
    else:
        _received(self, data)

MConnectionProtocol.dataReceived = slow_pong

switch = Switch([Quiet()], config=Config(stats_interval=0))
switch.startService()

def listening(port):
    print(switch.node_id, port.getHost().port, flush=True)

switch.listen("tcp:0:interface=127.0.0.1").addCallback(listening)
stdio.StandardIO(StopOnEOF())
reactor.run()
"""


@pytest.fixture
def healthy_peer():
    process = subprocess.Popen([sys.executable, "-c", PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        node_id, port = process.stdout.readline().split()
        yield f"{node_id}@127.0.0.1:{port}"
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class Sleeper(protocol.Protocol):
    """Blocks the event loop in dataReceived: a reactor stuck in a computation."""

    seconds = 1.0

    def dataReceived(self, data):
        time.sleep(self.seconds)


async def blocker():
    """A loopback connection whose receiving end blocks the loop when written to."""
    factory = protocol.Factory.forProtocol(Sleeper)
    port = await endpoints.TCP4ServerEndpoint(the_reactor(), 0, interface="127.0.0.1").listen(factory)
    client = await endpoints.connectProtocol(
        endpoints.TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port.getHost().port), protocol.Protocol()
    )
    return port, client


def block_after_first_ping(proto, client):
    """Just after this connection's first keepalive ping goes out, make the Sleeper block
    the event loop while it handles I/O; the late pong arrives meanwhile, and the pong
    deadline passes before the loop can read it."""
    core = proto.core
    original = core.handle_timeout
    state = {"done": False}

    def handle_timeout(now):
        events = original(now)
        if not state["done"] and core._awaiting_pong():
            state["done"] = True
            the_reactor().callLater(0.02, client.transport.write, b"wake up and block")
        return events

    core.handle_timeout = handle_timeout
    return state


@pytest_twisted.ensureDeferred
async def test_a_stalled_loop_does_not_make_a_healthy_peer_look_dead(healthy_peer, telemetry):
    """A stall of our own event loop is reported as loop_stalled, not blamed on a healthy peer: no pong
    timeout, no disconnect."""
    config = Config(stats_interval=0, ping_interval=0.2, pong_timeout=0.3)
    node = Switch([Collector(CHANNELS)], clock=the_reactor(), config=config)
    node.startService()
    port, client = await blocker()
    try:
        peer = await bounded(node.dial(healthy_peer))
        stalled = block_after_first_ping(peer._protocol, client)
        await sleep(2.0)
        assert stalled["done"], "the ping never went out; the test proved nothing"
        assert peer.state == "connected" and peer.disconnects == 0, "our own stall was blamed on the peer"
        assert telemetry.named("connection_lost") == []
        [stall] = [e for e in telemetry.named("loop_stalled") if e["late"] > 0.5]
        assert stall["peer_id"] == peer.node_id
    finally:
        client.transport.loseConnection()
        await port.stopListening()
        await stop(node)


@pytest_twisted.ensureDeferred
async def test_half_open_timers_are_set_on_the_sockets():
    """TCP_USER_TIMEOUT and keepalive follow Config on both ends (Linux)."""
    if not hasattr(socket, "TCP_USER_TIMEOUT") or not hasattr(socket, "TCP_KEEPIDLE"):
        pytest.skip("this platform has no TCP_USER_TIMEOUT / TCP_KEEPIDLE")
    config = Config(stats_interval=0, ping_interval=20, pong_timeout=9, tcp_user_timeout=12.5)
    a, b, ra, rb, port = await start_pair(config=config)
    try:
        outbound = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        inbound = await bounded(ra.added)
        for peer in (outbound, inbound):
            sock = peer._protocol.transport.getHandle()
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 12500
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 20
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    finally:
        await stop(a, b)
    off = Config(stats_interval=0, tcp_user_timeout=None, tcp_keepalive=False)
    a, b, ra, rb, port = await start_pair(config=off)
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        sock = peer._protocol.transport.getHandle()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    finally:
        await stop(a, b)
