"""Who may join (specs/tls.md section 6), on a MemoryNetwork: allowed_peers and an
authorize hook that answers now or later, on the listener's side and on the dialer's.

An asynchronous answer holds the connection's events (the listener may start its session
and send before the dialer's authorize has answered); they are delivered, in order, once
it says yes, and dropped when it says no or the connection goes away first.
"""

from twisted.internet import defer

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=1)]
CONFIG = Config(stats_interval=0, handshake_timeout=5.0)


class Greeter(RecordingReactor):
    def add_peer(self, peer):
        super().add_peer(peer)
        peer.try_send(0x20, b"welcome")


class Hook:
    """An authorize hook whose answers the test gives later."""

    def __init__(self):
        self.asked = []

    def __call__(self, node_id, address, certificate):
        d = defer.Deferred()
        self.asked.append((node_id, address, certificate, d))
        return d

    def answer(self, value):
        [(*_, d)] = self.asked
        d.callback(value)


def pair(*, listener=None, dialer=None, greeter=False):
    """A listener ``a`` (its reactor greets new peers if ``greeter``) and a dialer ``b``
    on one MemoryNetwork, each with the authorize hook given, if any."""
    network = MemoryNetwork()
    ra, rb = (Greeter if greeter else RecordingReactor)(CHANNELS), RecordingReactor(CHANNELS)
    a = network.switch([ra], config=CONFIG, authorize=listener)
    b = network.switch([rb], config=CONFIG, authorize=dialer)
    return network, a, ra, b, rb


def connect(network, dialer, listener):
    """``network.connect``; nobody waits on the dialer's handshake, so its failure is not logged."""
    link = network.connect(dialer, listener)
    link.outbound.handshake.addErrback(lambda failure: None)
    return link


def added(reactor):
    return [call for call in reactor.calls if call[0] == "add_peer"]


def test_a_listener_decides_later_and_nothing_happens_before():
    """Until the listener's hook answers, neither side has a peer or an add_peer; after yes, both do."""
    hook = Hook()
    network, a, ra, b, rb = pair(listener=hook)
    link = connect(network, b, a)
    [(node_id, address, certificate, _)] = hook.asked
    assert node_id == b.node_id and certificate is None and address.startswith(network.host_of(b))
    network.clock.advance(1.0)
    link.flush()
    assert a.peers == {} and b.peers == {} and added(ra) == []
    hook.answer(True)
    link.flush()
    assert list(a.peers) == [b.node_id] and list(b.peers) == [a.node_id]
    a._check_invariants()
    b._check_invariants()


def test_a_dialer_decides_later_and_gets_what_the_listener_sent_meanwhile():
    """A message the listener sent before the dialer's hook said yes is delivered once it does."""
    hook = Hook()
    network, a, ra, b, rb = pair(dialer=hook, greeter=True)
    link = connect(network, b, a)
    assert list(a.peers) == [b.node_id]  # the listener did not wait: it sent its greeting
    assert b.peers == {} and rb.received() == []
    hook.answer(True)
    link.flush()
    assert rb.received(0x20) == [b"welcome"] and list(b.peers) == [a.node_id]
    b._check_invariants()


def test_a_later_no_closes_with_unauthorized_and_drops_what_was_held():
    """A later no closes with unauthorized; the held messages are never delivered and the refusal is counted."""
    hook = Hook()
    network, a, ra, b, rb = pair(dialer=hook, greeter=True)
    link = connect(network, b, a)
    hook.answer(False)
    link.flush()
    network.clock.advance(3.0)
    assert b.peers == {} and rb.calls == []
    [(_, reason)] = ra.removed()
    assert reason.code == "unauthorized" and "refused it" in reason.text
    assert b.refusals.get("unauthorized") == 1


def test_a_connection_gone_before_the_answer_is_left_alone():
    """An answer arriving after the connection was lost changes nothing: no peer, no reactor call."""
    hook = Hook()
    network, a, ra, b, rb = pair(listener=hook)
    link = connect(network, b, a)
    link.reset()
    network.clock.advance(1.0)
    hook.answer(True)
    assert a.peers == {} and a.connections == set() and ra.calls == []
    a._check_invariants()


def test_an_answer_that_is_not_a_bool_or_a_failure_refuses():
    """A hook that fails, or answers a truthy value other than True, refuses as unauthorized."""
    hook = Hook()
    network, a, ra, b, rb = pair(listener=hook)
    link = connect(network, b, a)
    [(*_, d)] = hook.asked
    d.errback(KeyError("no such policy"))
    link.flush()
    network.clock.advance(3.0)
    assert a.peers == {} and b.peers == {}
    assert a.refusals.get("unauthorized") == 1

    hook2 = Hook()
    c = network.switch([RecordingReactor(CHANNELS)], config=CONFIG, authorize=hook2)
    connect(network, b, c)
    [(*_, d2)] = hook2.asked
    d2.callback(1)  # truthy is not True
    network.flush()
    assert c.peers == {} and c.refusals.get("unauthorized") == 1


def test_no_answer_within_handshake_timeout_refuses_and_may_be_retried():
    """A hook that has not answered by handshake_timeout refuses the connection as authorize_timeout."""
    hook = Hook()
    network, a, ra, b, rb = pair(listener=hook)
    connect(network, b, a)
    network.clock.advance(CONFIG.handshake_timeout + 0.1)
    network.flush()
    assert a.peers == {} and a.refusals.get("authorize_timeout") == 1


def test_allowed_peers_without_tls_checks_the_declared_id():
    """Without TLS, allowed_peers admits only the node ids listed in the hello; others are unauthorized."""
    network = MemoryNetwork()
    rb = RecordingReactor(CHANNELS)
    b = network.switch([rb], config=CONFIG)
    a = network.switch([RecordingReactor(CHANNELS)], config=CONFIG, allowed_peers={b.node_id})
    c = network.switch([RecordingReactor(CHANNELS)], config=CONFIG)
    connect(network, b, a)
    connect(network, c, a)
    assert list(a.peers) == [b.node_id]
    assert a.refusals.get("unauthorized") == 1


def test_an_answer_already_made_counts_at_once():
    """A hook returning an already-fired yes admits the peer at once, with no held events lost."""
    network, a, ra, b, rb = pair(listener=lambda n, addr, cert: defer.succeed(True), greeter=True)
    link = connect(network, b, a)
    link.flush()
    assert list(a.peers) == [b.node_id] and rb.received(0x20) == [b"welcome"]
