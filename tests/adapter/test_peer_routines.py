"""Per-peer routines and the removal signal (specs/reactor-api.md section 5.8):
``Reactor.spawn(peer, coroutine)`` runs a routine for as long as the session lives, cancels
it before ``remove_peer``, keeps it running across a suspend and resume, and hands an
exception escaping it to the reactor error policy; ``peer.when_removed()`` fires with the
reason the session ended. Over mconn.testing's in-memory network with a Clock.
"""

import pytest
from twisted.internet import defer, task

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, ReactorError
from mconn.testing import MemoryNetwork

CH = 0x30
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=2)]
CONFIG = Config(stats_interval=0, resume_grace=5.0, max_reconnect_delay=0.1)


class Gossip(RecordingReactor):
    """Starts a routine per peer in add_peer that sends a numbered message every 0.1 s
    until cancelled; records what the routine saw."""

    def __init__(self, *, policy=None, fail_at=None):
        super().__init__(CHANNELS)
        self.policy = policy
        self.fail_at = fail_at
        self.events: list = []
        self.done: dict = {}

    def add_peer(self, peer) -> None:
        super().add_peer(peer)
        self.done[peer.node_id] = self.spawn(peer, self.gossip(peer))

    def remove_peer(self, peer, reason) -> None:
        self.events.append(("remove_peer", peer.routines))
        super().remove_peer(peer, reason)

    def on_error(self, peer, channel_id, error):
        self.events.append(("on_error", channel_id, str(error)))
        return self.policy

    async def gossip(self, peer):
        n = 0
        try:
            while True:
                await task.deferLater(self.switch.clock, 0.1)
                n += 1
                if n == self.fail_at:
                    raise RuntimeError(f"routine failed at {n}")
                await peer.send(CH, b"%d" % n)
        except defer.CancelledError:
            self.events.append(("cancelled", n))
            raise


def _pair(network, reactor, listener_reactor=None):
    listener = network.switch([listener_reactor or RecordingReactor(CHANNELS)], config=CONFIG)
    dialer = network.switch([reactor], config=CONFIG)
    listener.listen("tcp:26656")
    dialed = dialer.dial(network.dial_address(listener), persistent=False)
    network.flush()
    return listener, dialer, dialed.result


def received(reactor) -> list[bytes]:
    return [call[3] for call in reactor.calls if call[0] == "receive"]


def test_a_routine_runs_until_the_session_ends_and_is_cancelled_before_remove_peer():
    network = MemoryNetwork()
    gossip, sink = Gossip(), RecordingReactor(CHANNELS)
    listener, dialer, peer = _pair(network, gossip, sink)
    network.advance(0.55, step=0.05)
    assert received(sink) == [b"1", b"2", b"3", b"4", b"5"]
    assert peer.routines == 1
    peer.close("done")
    network.flush()
    assert gossip.events == [("cancelled", 5), ("remove_peer", 0)]
    assert gossip.done[peer.node_id].result is None
    network.advance(1.0, step=0.1)
    assert len(received(sink)) == 5  # nothing after the end


def test_a_routine_keeps_running_across_a_suspend_and_its_sends_arrive_on_resume():
    network = MemoryNetwork()
    gossip, sink = Gossip(), RecordingReactor(CHANNELS)
    listener, dialer, peer = _pair(network, gossip, sink)
    network.advance(0.25, step=0.05)
    network.reset(dialer, listener)
    network.advance(2.0, step=0.05)
    assert peer.state == "connected" and peer.resumes == 1
    assert peer.routines == 1 and ("cancelled", 2) not in gossip.events
    got = received(sink)
    assert got == [b"%d" % n for n in range(1, len(got) + 1)] and len(got) >= 15


def test_an_exception_in_a_routine_drops_the_peer_by_the_default_policy():
    network = MemoryNetwork()
    gossip = Gossip(fail_at=3)
    listener, dialer, peer = _pair(network, gossip)
    network.advance(0.5, step=0.05)
    assert peer.state == "closed"
    reason = [call[2] for call in gossip.calls if call[0] == "remove_peer"][0]
    assert isinstance(reason, ReactorError) and "routine failed at 3" in str(reason)
    assert gossip.events[0] == ("on_error", None, "routine failed at 3")
    assert dialer.reactor_errors == {"Gossip": 1}


def test_a_routine_failure_the_reactor_only_logs_keeps_the_peer():
    network = MemoryNetwork()
    gossip = Gossip(policy="log", fail_at=2)
    listener, dialer, peer = _pair(network, gossip)
    network.advance(0.5, step=0.05)
    assert peer.state == "connected" and peer.routines == 0
    assert dialer.reactor_errors == {"Gossip": 1}
    assert gossip.done[peer.node_id].result is None  # handled: no unhandled error left


def test_when_removed_fires_with_the_reason_before_remove_peer_and_at_once_afterwards():
    network = MemoryNetwork()
    reactor = RecordingReactor(CHANNELS)
    listener, dialer, peer = _pair(network, reactor)
    order = []
    first, cancelled = peer.when_removed(), peer.when_removed()
    first.addCallback(lambda reason: order.append(("when_removed", reason)))
    reactor.on_receive = None
    original = reactor.remove_peer
    reactor.remove_peer = lambda p, reason: (order.append(("remove_peer", reason)), original(p, reason))
    cancelled.cancel()
    cancelled.addErrback(lambda f: f.trap(defer.CancelledError))
    peer.close("bye")
    network.flush()
    assert [step for step, _ in order] == ["when_removed", "remove_peer"]
    assert order[0][1] is order[1][1] and "bye" in str(order[0][1])
    late = peer.when_removed()
    assert late.called and late.result is order[0][1]


def test_a_routine_waiting_in_send_on_a_full_channel_is_cancelled_cleanly():
    """The routine waits in ``send`` (the channel is full and the peer does not read); the
    session ends: the wait is cancelled, the routine sees CancelledError, and no
    Deferred is fired twice."""
    network = MemoryNetwork(window=16384)
    listener, dialer, peer = _pair(network, RecordingReactor(CHANNELS))
    network.blackhole(dialer, listener)
    seen = []

    async def flood():
        try:
            for n in range(100):
                await peer.send(CH, bytes(4000) + b"%d" % n)
        except defer.CancelledError:
            seen.append("cancelled")
            raise

    d = dialer.reactors[0].spawn(peer, flood())
    assert peer.routines == 1 and not d.called
    peer.close("stop")
    network.advance(CONFIG.close_linger + 0.1, step=0.1)
    assert peer.state == "closed"
    assert seen == ["cancelled"] and d.result is None and peer.routines == 0


def test_spawn_refuses_what_is_not_a_routine_and_does_not_start_one_on_an_ended_session():
    network = MemoryNetwork()
    reactor = RecordingReactor(CHANNELS)
    listener, dialer, peer = _pair(network, reactor)
    with pytest.raises(TypeError, match="coroutine .* or a Deferred, not function"):
        reactor.spawn(peer, lambda: None)
    peer.close()
    network.flush()
    started = []

    async def routine():
        started.append(True)

    d = reactor.spawn(peer, routine())
    assert d.called and d.result is None and started == []
