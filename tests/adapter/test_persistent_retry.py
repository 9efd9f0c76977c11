"""A persistent peer always comes back (specs/resume.md sections 6.4 and 7.1).

A persistent dial keeps trying, with the reconnect backoff capped by
``Config.max_reconnect_delay``, through every failure that may pass (nothing listens yet,
a peer limit, ``session_held``), until a session is up; only a permanent refusal,
``max_reconnects``, ``stop_dialing`` or ``stopService`` fail its Deferred, always with
DialGaveUp. On the in-memory network, on a task.Clock.
"""

import pytest
from twisted.internet.testing import MemoryReactorClock

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, DialGaveUp, NodeKey, PeerClosed, PeerIdMismatch, SessionExpired
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=5, send_queue_capacity=16)]
CONFIG = Config(stats_interval=0, max_reconnect_delay=0.5)
#: The jitter of default_reconnect_delay: a delay is its base times 0.75 to 1.25.
JITTER = 1.25


class Node:
    def __init__(self, network, port, config=CONFIG, **kwargs):
        self.reactor = RecordingReactor(CHANNELS)
        self.switch = network.switch([self.reactor], config=config, **kwargs)
        self.port = port
        self.switch.startService()
        if port is not None:
            self.listen()

    def listen(self):
        self.switch.listen(f"tcp:{self.port}:interface=127.0.0.1")

    @property
    def address(self):
        return f"{self.switch.node_id}@127.0.0.1:{self.port}"


@pytest.fixture
def network():
    return MemoryNetwork(MemoryReactorClock())


def settle(network, seconds, step=0.1):
    """Let ``seconds`` pass in steps of ``step``, completing dials and flushing at each."""
    for _ in range(round(seconds / step)):
        network.clock.advance(step)
        network.complete_dials()
        network.flush()


def results_of(d):
    out = []
    d.addBoth(out.append)
    return out


def attempts_to(telemetry, node_id):
    return [e for e in telemetry.named("dial_attempt") if e["peer_id"] == node_id]


def test_a_persistent_dial_backs_off_up_to_max_reconnect_delay_for_as_long_as_it_takes(network, telemetry):
    """A node that stays down for a minute: the persistent dial neither fails nor gives
    up; its attempts go on at delays that grow to max_reconnect_delay (0.5 s) and stay
    there (times the jitter), and once the node listens the Deferred fires with the Peer."""
    a, b = Node(network, None), Node(network, None)
    b.port = 26656  # where it will listen
    got = results_of(a.switch.dial(b.address, persistent=True))
    settle(network, 60)
    assert got == [] and a.switch.peers == {}
    delays = [e["delay"] for e in attempts_to(telemetry, b.switch.node_id)]
    assert all(e["result"] == "failed" for e in attempts_to(telemetry, b.switch.node_id))
    assert len(delays) > 60, f"only {len(delays)} attempts in a minute"
    assert max(delays) <= CONFIG.max_reconnect_delay * JITTER
    assert min(delays[20:]) >= CONFIG.max_reconnect_delay * (2 - JITTER), "the backoff did not reach its cap"
    b.listen()
    settle(network, 2)
    [peer] = got
    assert peer.state == "connected" and a.switch.peers[b.switch.node_id] is peer and peer.is_persistent


def test_a_peer_limit_refusal_is_retried_until_there_is_room(network, telemetry):
    """The node is full (max_inbound_peers 1): the persistent dial is refused with
    inbound_limit, keeps trying, and gets in once the other peer leaves."""
    b = Node(network, 26656, config=CONFIG.replace(max_inbound_peers=1))
    c = Node(network, None)
    c.switch.dial(b.address)
    settle(network, 0.5)
    assert c.switch.node_id in b.switch.peers
    a = Node(network, None)
    got = results_of(a.switch.dial(b.address, persistent=True))
    settle(network, 5)
    assert got == []
    errors = [e["error"] for e in attempts_to(telemetry, b.switch.node_id) if e["node_id"] == a.switch.node_id]
    assert len(errors) > 3 and all("inbound_limit" in error for error in errors), errors
    b.switch.peers[c.switch.node_id].close("making room")
    settle(network, 2)
    [peer] = got
    assert peer.state == "connected" and set(b.switch.peers) == {a.switch.node_id}


def test_a_permanent_refusal_fails_a_persistent_dial_with_dial_gave_up_naming_it(network, telemetry):
    """Another node answers at the address (id_mismatch): the address is banned after one
    attempt, the dial fails with DialGaveUp whose reason and __cause__ name the refusal,
    and the node is no longer persistent."""
    b = Node(network, 26656)
    wanted = NodeKey.generate().node_id
    a = Node(network, None)
    got = results_of(a.switch.dial(f"{wanted}@127.0.0.1:26656", persistent=True))
    settle(network, 10)
    [failure] = got
    assert failure.check(DialGaveUp), failure
    error = failure.value
    assert error.node_id == wanted and "all are banned" in error.reason and "PeerIdMismatch" in error.reason
    assert isinstance(error.__cause__, (PeerIdMismatch, PeerClosed)), repr(error.__cause__)
    assert [e["result"] for e in attempts_to(telemetry, wanted)] == ["not_retried"]
    [gave_up] = telemetry.named("dial_gave_up")
    assert gave_up["peer_id"] == wanted
    assert b.switch.peers == {} and a.switch.address_pool(wanted) is None


def test_stop_dialing_and_stop_service_fail_a_waiting_persistent_dial(network, telemetry):
    """A persistent dial that is still trying fails with DialGaveUp when stop_dialing is
    called, and another when the Switch stops; no attempt follows either."""
    a = Node(network, None)
    first, second = "ab" * 20, "cd" * 20
    got_first = results_of(a.switch.dial(f"{first}@127.0.0.1:26656", persistent=True))
    got_second = results_of(a.switch.dial(f"{second}@127.0.0.1:26657", persistent=True))
    settle(network, 3)
    assert got_first == [] and got_second == []
    a.switch.stop_dialing(first)
    [failure] = got_first
    assert failure.check(DialGaveUp) and "stop_dialing was called" in str(failure.value)
    made = len(attempts_to(telemetry, first))
    settle(network, 3)
    assert len(attempts_to(telemetry, first)) == made and got_second == []
    a.switch.stopService()
    [failure] = got_second
    assert failure.check(DialGaveUp) and "the node is stopping" in str(failure.value)
    made = len(attempts_to(telemetry, second))
    settle(network, 3)
    assert len(attempts_to(telemetry, second)) == made


def test_max_reconnects_0_still_makes_the_first_dial_of_a_persistent_peer(network, telemetry):
    """max_reconnects 0 allows no attempt after a failure, not no attempt at all: a
    persistent dial of a live node connects; one of a dead node fails with DialGaveUp
    after its one attempt."""
    config = CONFIG.replace(max_reconnects=0)
    a, b = Node(network, None, config=config), Node(network, 26656)
    got = results_of(a.switch.dial(b.address, persistent=True))
    settle(network, 1)
    [peer] = got
    assert getattr(peer, "state", None) == "connected", peer
    dead = "ab" * 20
    got = results_of(a.switch.dial(f"{dead}@127.0.0.1:26999", persistent=True))
    settle(network, 3)
    [failure] = got
    assert failure.check(DialGaveUp) and "max_reconnects=0" in str(failure.value)
    assert [e["result"] for e in attempts_to(telemetry, dead)] == ["failed"]


def test_retry_initial_dial_false_with_persistent_is_refused(network):
    """persistent=True with retry_initial_dial=False asks for two things at once: the dial
    fails with a ValueError naming both, and nothing is dialed."""
    a = Node(network, None)
    [failure] = results_of(a.switch.dial(f"{'ab' * 20}@127.0.0.1:26656", persistent=True, retry_initial_dial=False))
    assert failure.check(ValueError)
    assert "retry_initial_dial=False" in str(failure.value) and "persistent" in str(failure.value)
    assert a.switch.address_pool("ab" * 20) is None and network.clock.tcpClients == []


# -- a node restarted with the same key ------------------------------------------------------


def test_a_restarted_plaintext_node_is_refused_session_held_until_the_grace_ends_then_connects(telemetry):
    """A dialed B persistently; A's process dies and restarts with the same key while B
    holds their session suspended. A plaintext hello cannot prove it is the same node, so
    B refuses the restarted A (session_held) until its grace ends; A's persistent dial
    keeps trying, with the capped backoff, and gets a fresh session just after."""
    grace = 10.0
    config = Config(stats_interval=0, resume_grace=grace, max_reconnect_delay=0.5)
    network = MemoryNetwork()
    b_log, a_log = RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    b = network.switch([b_log], config=config)
    a = network.switch([a_log], config=config)
    b.startService()
    a.startService()
    b.listen("tcp:26656")
    a.dial(network.dial_address(b), persistent=True)
    network.run(1)
    held = b.peers[a.node_id]
    restarted = network.restart(a, [RecordingReactor(CHANNELS)])
    network.run(0.1)
    assert held.state == "suspended"
    got = results_of(restarted.dial(network.dial_address(b), persistent=True))
    network.run(grace - 2)
    assert got == [], "the restarted node got in while the session was held"
    assert b.peers[a.node_id] is held and held.state == "suspended"
    refused = attempts_to(telemetry, b.node_id)[1:]  # the first was the old process's dial
    assert len(refused) > 5 and all("session_held" in e["error"] for e in refused), refused
    assert b.refusals["session_held"] == len(refused)
    network.run(3)
    [peer] = got
    assert peer.state == "connected" and restarted.peers[b.node_id] is peer
    [(_, old, reason)] = [c for c in b_log.calls if c[0] == "remove_peer"]
    assert old is held and isinstance(reason, SessionExpired)
    fresh = b.peers[a.node_id]
    assert fresh is not held and fresh.state == "connected"
    delays = [e["delay"] for e in attempts_to(telemetry, b.node_id)]
    assert max(delays) <= config.max_reconnect_delay * JITTER
    b._check_invariants()
    restarted._check_invariants()
