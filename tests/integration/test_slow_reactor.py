"""A slow reactor does not stall the other peers (specs/reactor-api.md
section 4.1), on real Switches on 127.0.0.1 with a real thread doing the slow work.

No timing is asserted (bench/slow_reactor.py measures the latencies): the test shows the
order of events instead. While one peer's receive is still working in a thread, every
message of another peer on the same channel is delivered; the slow peer's next messages
wait for it and then arrive in order; and examples/slow_reactor.py runs.
"""

import pathlib
import subprocess
import sys
import threading

import pytest
import pytest_twisted
from twisted.internet import threads

from helpers import bounded, the_reactor, until
from mconn import ChannelDescriptor, Config, Reactor, Switch

pytestmark = pytest.mark.integration

CH = 0x50


class ThreadedVerifier(Reactor):
    """receive of a message from ``slow_node`` waits in a thread for ``release``; others are
    recorded at once. ``log`` is every (node id, message) as receive finished it."""

    def __init__(self):
        self.slow_node = None
        self.release = threading.Event()
        self.log = []
        self.working = 0

    def get_channels(self):
        return [ChannelDescriptor(CH, send_queue_capacity=64)]

    def receive(self, channel_id, peer, message):
        if peer.node_id != self.slow_node:
            self.log.append((peer.node_id, message))
            return None
        self.working += 1
        d = threads.deferToThread(self.release.wait, 20)
        return d.addCallback(lambda _: self.log.append((peer.node_id, message)))


async def three_nodes():
    config = Config(stats_interval=0)
    verifier = ThreadedVerifier()
    hub = Switch([verifier], clock=the_reactor(), config=config)
    slow = Switch([ThreadedVerifier()], clock=the_reactor(), config=config)
    fast = Switch([ThreadedVerifier()], clock=the_reactor(), config=config)
    for s in (hub, slow, fast):
        s.startService()
    port = (await hub.listen("tcp:0:interface=127.0.0.1")).getHost().port
    address = f"{hub.node_id}@127.0.0.1:{port}"
    verifier.slow_node = slow.node_id
    return verifier, (hub, slow, fast), await bounded(slow.dial(address)), await bounded(fast.dial(address))


@pytest_twisted.ensureDeferred
async def test_other_peers_flow_while_one_peers_receive_works_in_a_thread():
    """The slow peer's first message occupies a thread; meanwhile all 200 of the fast
    peer's messages on the same channel are delivered and the slow peer's second message
    waits (it is not even handed to receive). Released, the slow peer's messages follow in
    order, one receive at a time."""
    verifier, switches, slow_peer, fast_peer = await three_nodes()
    try:
        for i in range(3):
            assert slow_peer.try_send(CH, b"slow-%d" % i)
        await until(lambda: verifier.working == 1, "the slow peer's first receive")
        for i in range(200):
            assert await fast_peer.send(CH, b"fast-%d" % i)
        fast_node = switches[2].node_id
        await until(lambda: len(verifier.log) == 200, "every fast message while the thread works")
        assert verifier.log == [(fast_node, b"fast-%d" % i) for i in range(200)]
        assert verifier.working == 1  # the slow peer's next messages were held
        verifier.release.set()
        await until(lambda: len(verifier.log) == 203, "the slow peer's messages after the release")
        assert [m for n, m in verifier.log[200:]] == [b"slow-0", b"slow-1", b"slow-2"]
        assert verifier.working == 3
    finally:
        verifier.release.set()
        for s in switches:
            await bounded(s.stopService())


def test_the_slow_reactor_example_runs():
    """examples/slow_reactor.py (thread and process modes) exits 0 with every message verified."""
    result = subprocess.run(
        [sys.executable, "examples/slow_reactor.py", "thread", "process"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "thread  : light messages late by" in result.stdout
    assert "process : light messages late by" in result.stdout
