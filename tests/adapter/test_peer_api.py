"""What a reactor author relies on beyond send and receive (specs/reactor-api.md
sections 2.1, 4, 4.1, 5.4 and 6.1): the error policy, receive returning a Deferred,
the reactor lifecycle, and the Peer and Switch API a node needs. Real Switches over
mconn.testing's in-memory network, on one Clock.
"""

import pytest
from twisted.internet import defer

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, PeerClosed, ReactorError, Reactor
from mconn.testing import FakePeer, MemoryNetwork
from reactors.pex import PexReactor

CH = 0x40
OTHER = 0x41
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=64), ChannelDescriptor(OTHER, send_queue_capacity=64)]


@pytest.fixture
def network():
    return MemoryNetwork()


class Picky(RecordingReactor):
    """Raises ValueError on a message starting with b"bad"; ``policy`` is its on_error answer."""

    def __init__(self, channels=CHANNELS, policy=None):
        super().__init__(channels)
        self.policy = policy
        self.errors = []

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        if message.startswith(b"bad"):
            raise ValueError(f"garbage transaction {message!r}")

    def on_error(self, peer, channel_id, error):
        self.errors.append((peer.node_id, channel_id, type(error).__name__))
        return self.policy


class Slow(RecordingReactor):
    """receive returns a Deferred the test fires: ``pending[i]`` for the i-th message on CH."""

    def __init__(self, channels=CHANNELS):
        super().__init__(channels)
        self.pending = []

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        if channel_id == CH:
            d = defer.Deferred()
            self.pending.append(d)
            return d
        return None


def pair(network, reactor, *, config=None):
    """A Switch with ``reactor``, connected to one with a RecordingReactor; returns
    (our switch, their switch, their reactor, the link, their Peer at us, our Peer at them)."""
    ours = network.switch([reactor], config=config)
    theirs_reactor = RecordingReactor(CHANNELS)
    theirs = network.switch([theirs_reactor], config=config)
    link = network.connect(theirs, ours)
    return ours, theirs, theirs_reactor, link, link.peer_of(ours), link.peer_of(theirs)


def hub_and_two(network, reactor):
    """A hub Switch with ``reactor`` and two Switches with RecordingReactors connected to it; returns the hub and,
    for each of the two, (its Switch, its Peer of the hub)."""
    hub = network.switch([reactor])
    spokes = [network.switch([RecordingReactor(CHANNELS)]) for _ in range(2)]
    return hub, *((spoke, network.connect(spoke, hub).peer_of(spoke)) for spoke in spokes)


# -- the error policy (section 4) ----------------------------------------------------


def test_an_exception_in_receive_drops_the_peer_with_a_reactor_error(network):
    """By default a receive that raises drops the sender: remove_peer gets a ReactorError
    naming the reactor and channel, the sender gets PeerClosed("reactor_error"), nothing
    after the bad message is delivered, and the Switch counts it."""
    picky = Picky()
    ours, theirs, theirs_reactor, link, sender_here, sender = pair(network, picky)
    sender.try_send(CH, b"tx1")
    sender.try_send(CH, b"bad tx")
    sender.try_send(CH, b"tx3")
    network.flush()
    assert picky.received(CH) == [b"tx1", b"bad tx"]
    [(peer, reason)] = picky.removed()
    assert isinstance(reason, ReactorError) and reason.code == "reactor_error"
    assert (reason.reactor, reason.channel_id, reason.method) == ("Picky", CH, "receive")
    assert "Picky" in str(reason) and "0x40" in str(reason) and "garbage transaction" in str(reason)
    [(_, their_reason)] = theirs_reactor.removed()
    assert isinstance(their_reason, PeerClosed) and their_reason.code == "reactor_error"
    assert ours.reactor_errors == {"Picky": 1}
    assert ours.peers == {} and theirs.peers == {}
    ours._check_invariants()


def test_on_error_log_keeps_the_peer_and_config_log_does_too(network):
    """on_error returning "log" keeps the peer and later messages flow; with on_error
    returning None, Config.reactor_errors="log" decides the same."""
    for picky, config in ((Picky(policy="log"), None), (Picky(), Config(reactor_errors="log"))):
        net = MemoryNetwork()
        ours, _, _, _, _, sender = pair(net, picky, config=config)
        for message in (b"bad", b"tx2"):
            sender.try_send(CH, message)
        net.flush()
        assert picky.received(CH) == [b"bad", b"tx2"]
        assert picky.removed() == [] and len(ours.peers) == 1
        assert ours.reactor_errors == {"Picky": 1}


def test_other_peers_carry_on_when_one_is_dropped(network):
    """Dropping the garbage sender leaves a second peer's session and messages alone."""
    picky = Picky()
    hub, (good_sw, good), (_, bad) = hub_and_two(network, picky)
    bad.try_send(CH, b"bad")
    good.try_send(CH, b"fine")
    network.flush()
    assert set(hub.peers) == {good_sw.node_id}
    good.try_send(CH, b"still fine")
    network.flush()
    assert picky.received(CH) == [b"bad", b"fine", b"still fine"]


class FailsInAddPeer(RecordingReactor):
    def add_peer(self, peer):
        super().add_peer(peer)
        raise RuntimeError("no room for this peer")


def test_an_exception_in_add_peer_drops_after_every_reactor_had_add_peer(network):
    """A raising add_peer drops the peer, but only once every reactor had its add_peer,
    so each also gets remove_peer with the ReactorError (method add_peer, no channel)."""
    first, second = FailsInAddPeer(CHANNELS[:1]), RecordingReactor(CHANNELS[1:])
    ours = network.switch([first, second])
    theirs = network.switch([RecordingReactor(CHANNELS)])
    network.connect(theirs, ours)
    network.flush()
    for reactor in (first, second):
        assert [c[0] for c in reactor.calls] == ["add_peer", "remove_peer"]
        reason = reactor.removed()[0][1]
        assert isinstance(reason, ReactorError) and (reason.method, reason.channel_id) == ("add_peer", None)


def test_stop_for_error_names_the_reason():
    """peer.stop_for_error(reason) ends the session with a ReactorError carrying reason;
    FakePeer does the same, and has the Peer's data, get, set and is_persistent."""
    network = MemoryNetwork()
    rec = RecordingReactor(CHANNELS)
    ours, _, theirs_reactor, _, peer, _ = pair(network, rec)
    peer.stop_for_error("sent a block we did not ask for")
    network.flush()
    [(_, reason)] = rec.removed()
    assert isinstance(reason, ReactorError) and reason.error == "sent a block we did not ask for"
    assert "sent a block we did not ask for" in theirs_reactor.removed()[0][1].text
    fake = FakePeer(is_persistent=True)
    fake.set("height", 7)
    assert (fake.get("height"), fake.get("nope", 0), fake.data, fake.is_persistent) == (7, 0, {"height": 7}, True)
    fake.stop_for_error(ValueError("bad"))
    assert fake.state == "closed" and isinstance(fake.close_reason, ReactorError)
    assert "ValueError: bad" in str(fake.close_reason) and not fake.try_send(CH, b"x")


# -- receive returning a Deferred (section 4.1) ------------------------------------


def test_a_pending_receive_holds_that_channel_only(network):
    """While receive's Deferred is pending, later messages of that peer on that channel
    wait (unacknowledged), the peer's other channel flows, and firing it delivers the held
    ones in order."""
    slow = Slow()
    ours, _, _, _, here, sender = pair(network, slow)
    for i in range(3):
        sender.try_send(CH, b"m%d" % i)
    sender.try_send(OTHER, b"other")
    network.advance(1.0, step=0.1)  # past ack_interval
    assert slow.received(CH) == [b"m0"]
    assert slow.received(OTHER) == [b"other"]
    assert sender.session.acked(CH) == 1  # the held two are not delivered, so not acked
    slow.pending[0].callback(None)
    assert slow.received(CH) == [b"m0", b"m1"]  # m1 made the channel busy again
    slow.pending[1].callback(None)
    assert slow.received(CH) == [b"m0", b"m1", b"m2"]
    slow.pending[2].callback(None)
    network.advance(1.0, step=0.1)
    assert sender.session.acked(CH) == 3
    assert here._delivery.busy == {} and here._delivery.backlog_bytes == 0


def test_a_pending_receive_for_one_peer_does_not_hold_another(network):
    """Two senders on the same channel: one's pending receive does not stop the other's
    messages from being delivered."""
    slow = Slow()
    _, (_, a), (_, b) = hub_and_two(network, slow)
    a.try_send(CH, b"a0")
    a.try_send(CH, b"a1")
    network.flush()
    for i in range(3):
        b.try_send(CH, b"b%d" % i)
        network.flush()
        slow.pending[-1].callback(None)
    assert slow.received(CH) == [b"a0", b"b0", b"b1", b"b2"]  # a1 still waits for a0's Deferred


def test_async_receive_is_awaited(network):
    """An ``async def receive`` holds its channel until the coroutine finishes."""
    gate = defer.Deferred()
    got = []

    class Async(Reactor):
        def get_channels(self):
            return CHANNELS

        async def receive(self, channel_id, peer, message):
            got.append(message)
            if message == b"first":
                await gate

    _, _, _, _, _, sender = pair(network, Async())
    sender.try_send(CH, b"first")
    sender.try_send(CH, b"second")
    network.flush()
    assert got == [b"first"]
    gate.callback(None)
    assert got == [b"first", b"second"]


def test_a_failed_receive_deferred_drops_the_peer(network):
    """A Deferred from receive that fails is a reactor exception: the peer is dropped and
    the held messages are not delivered."""
    slow = Slow()
    ours, *_rest, sender = pair(network, slow)
    sender.try_send(CH, b"m0")
    sender.try_send(CH, b"m1")
    network.flush()
    slow.pending[0].errback(ValueError("signature does not verify"))
    network.flush()
    assert slow.received(CH) == [b"m0"]
    [(_, reason)] = slow.removed()
    assert isinstance(reason, ReactorError) and "signature does not verify" in str(reason)
    assert ours.reactor_errors == {"Slow": 1}


def test_a_backlog_past_its_bound_stops_reading_until_it_drains():
    """Past Config.reactor_backlog_bytes of held messages the connection is not read (the
    sender's window fills and it pauses); firing the Deferreds drains the backlog, reading
    resumes and every message arrives once, in order."""
    network = MemoryNetwork(window=4096)
    slow = Slow()
    ours, _, _, _, here, sender = pair(network, slow, config=Config(reactor_backlog_bytes=2000))
    messages = [b"%03d" % i + b"x" * 497 for i in range(80)]
    assert sender.try_send_many(CH, messages[:40]) == 40
    network.flush()
    protocol = here._protocol
    assert protocol._backlogged and not protocol.transport.reading
    held = here._delivery.backlog_bytes
    assert held > 2000  # one read's worth (here everything in flight) is held
    assert sender.try_send_many(CH, messages[40:]) == 40
    network.advance(1, step=0.1)
    assert here._delivery.backlog_bytes == held  # nothing more is read: the bytes wait in the pipe
    assert sender._protocol._paused  # and the sender's window is full
    assert len(slow.received(CH)) == 1
    for _ in range(100):  # each round: fire what is pending, let bytes move
        for d in [d for d in slow.pending if not d.called]:
            d.callback(None)
        network.flush()
        if len(slow.received(CH)) == 80:
            break
    assert slow.received(CH) == messages
    assert not protocol._backlogged and protocol.transport.reading


def test_held_messages_survive_a_reset_exactly_once():
    """A reset while messages are held drops them unacknowledged; after the resume the
    sender re-sends them and, once the pending receive fires, each is delivered once."""
    network = MemoryNetwork()
    slow = Slow()
    ours = network.switch([slow])
    theirs = network.switch([RecordingReactor(CHANNELS)])
    listening = ours.listen("tcp:26656")
    assert listening.called
    d = theirs.dial(network.dial_address(ours))
    network.flush()
    sender = d.result
    for i in range(4):
        sender.try_send(CH, b"m%d" % i)
    network.flush()
    assert slow.received(CH) == [b"m0"]
    network.reset(theirs, ours)
    network.advance(5, step=0.05)
    assert sender.state == "connected" and sender.resumes == 1
    slow.pending[0].callback(None)
    for _ in range(10):
        for p in [p for p in slow.pending if not p.called]:
            p.callback(None)
        network.advance(0.2, step=0.05)
    assert slow.received(CH) == [b"m0", b"m1", b"m2", b"m3"]
    assert sender.session.acked(CH) == 4


# -- lifecycle (section 2.1) -----------------------------------------------------------


class Lifecycle(RecordingReactor):
    def __init__(self, channels, log, name=None):
        super().__init__(channels)
        self.log = log
        self.name = name

    def start_reactor(self):
        self.log.append(("start", self.name))

    def stop_reactor(self):
        self.log.append(("stop", self.name))

    def add_peer(self, peer):
        super().add_peer(peer)
        self.log.append(("add_peer", self.name))

    def remove_peer(self, peer, reason):
        super().remove_peer(peer, reason)
        self.log.append(("remove_peer", self.name))


def test_reactors_start_before_the_first_peer_and_stop_after_the_last_in_reverse(network):
    """start_reactor runs once, in order, before any add_peer (here on the first session,
    startService coming later changes nothing); stopService ends the sessions, then runs
    stop_reactor in reverse order."""
    log = []
    ours = network.switch({"mempool": Lifecycle(CHANNELS[:1], log), "blocksync": Lifecycle(CHANNELS[1:], log)})
    theirs = network.switch([RecordingReactor(CHANNELS)])
    network.connect(theirs, ours)
    ours.startService()
    d = ours.stopService()
    network.flush()
    assert d.called
    assert log == [
        ("start", "mempool"),
        ("start", "blocksync"),
        ("add_peer", "mempool"),
        ("add_peer", "blocksync"),
        ("remove_peer", "mempool"),
        ("remove_peer", "blocksync"),
        ("stop", "blocksync"),
        ("stop", "mempool"),
    ]


def test_reactors_are_found_by_name(network):
    """switch.reactor(name) finds a reactor by its dict key, its name or its class name;
    an unknown or ambiguous name is a KeyError naming the known ones; two reactors with one
    explicit name are refused."""
    mempool = Lifecycle(CHANNELS[:1], [])
    switch = network.switch({"mempool": mempool, "other": RecordingReactor(CHANNELS[1:])})
    assert switch.reactor("mempool") is mempool
    with pytest.raises(KeyError, match="'nope'.*mempool"):
        switch.reactor("nope")
    twins = network.switch([RecordingReactor(CHANNELS[:1]), RecordingReactor(CHANNELS[1:])])
    with pytest.raises(KeyError, match="share that class name"):
        twins.reactor("RecordingReactor")
    with pytest.raises(ValueError, match="two reactors are named 'x'"):
        network.switch([Lifecycle(CHANNELS[:1], [], "x"), Lifecycle(CHANNELS[1:], [], "x")])


# -- Peer and Switch API (sections 5 and 6.1) -------------------------------------


def test_peer_data_is_shared_across_reactors(network):
    """What one reactor sets on a peer, another reads (peer.set/get, peer.data)."""

    class Setter(RecordingReactor):
        def add_peer(self, peer):
            peer.set("height", 42)

    class Getter(RecordingReactor):
        def add_peer(self, peer):
            self.seen = peer.get("height"), peer.get("missing", "none")

    getter = Getter(CHANNELS[1:])
    ours = network.switch([Setter(CHANNELS[:1]), getter])
    network.connect(network.switch([RecordingReactor(CHANNELS)]), ours)
    assert getter.seen == (42, "none")
    assert list(ours.peers.values())[0].data == {"height": 42}


def test_is_persistent_follows_dial_persistent(network):
    """peer.is_persistent is True for a node dialed persistent=True, False for others and
    after stop_dialing."""
    a, b, c = (network.switch([RecordingReactor(CHANNELS)]) for _ in range(3))
    b.listen("tcp:26656")
    c.listen("tcp:26656")
    persistent = a.dial(network.dial_address(b), persistent=True)
    plain = a.dial(network.dial_address(c))
    network.flush()
    assert persistent.result.is_persistent and not plain.result.is_persistent
    a.stop_dialing(b.node_id)
    assert not persistent.result.is_persistent


def test_unconditional_peers_bypass_the_peer_limits(network):
    """At max_inbound_peers a node in Config.unconditional_peers is still accepted (and one
    dialed with unconditional=True at max_outbound_peers), while others are refused."""
    others = [network.switch([RecordingReactor(CHANNELS)]) for _ in range(3)]
    hub = network.switch(
        [RecordingReactor(CHANNELS)],
        config=Config(max_inbound_peers=1, max_outbound_peers=0, unconditional_peers={others[2].node_id}),
    )
    network.connect(others[0], hub)
    refused = network.connect(others[1], hub)
    network.connect(others[2], hub)
    assert refused.inbound.end_reason is not None
    assert set(hub.peers) == {others[0].node_id, others[2].node_id}
    target = network.switch([RecordingReactor(CHANNELS)])
    target.listen("tcp:26656")
    d = hub.dial(network.dial_address(target), unconditional=True)
    network.flush()
    assert d.result.node_id == target.node_id and target.node_id in hub.config.unconditional_peers
    assert hub.dial("127.0.0.1:1", unconditional=True).addErrback(lambda f: f.check(ValueError)).result


def test_try_broadcast_skips_the_sender_and_num_peers_skips_suspended(network):
    """try_broadcast sends to every peer but the excluded one and never waits;
    num_peers counts connected sessions only, by direction."""
    recs = [RecordingReactor(CHANNELS) for _ in range(3)]
    hub = network.switch([RecordingReactor(CHANNELS)])
    spokes = [network.switch([r]) for r in recs]
    links = [network.connect(s, hub) for s in spokes]
    excluded = links[0].peer_of(hub)
    result = hub.try_broadcast(CH, b"tx", exclude=excluded)
    network.flush()
    assert result == {spokes[1].node_id: True, spokes[2].node_id: True}
    assert [r.received(CH) for r in recs] == [[], [b"tx"], [b"tx"]]
    assert hub.num_peers() == (0, 3)
    links[1].reset()
    network.flush()
    assert len(hub.peers) == 3 and hub.num_peers() == (0, 2)


def test_mark_good_reaches_every_reactors_hook(network):
    """switch.mark_good(peer) calls mark_good on every reactor that has it."""
    marked = []

    class Book(RecordingReactor):
        def mark_good(self, peer):
            marked.append(peer.node_id)

    hub = network.switch([Book(CHANNELS)])
    spoke = network.switch([RecordingReactor(CHANNELS)])
    peer = network.connect(spoke, hub).peer_of(hub)
    hub.mark_good(peer)
    assert marked == [spoke.node_id]


def test_mark_good_moves_the_peer_to_the_pex_address_books_tried_table(network):
    """With the PEX reactor, switch.mark_good(peer) of an inbound peer (whose address is in
    the book's new table) moves its entry to the tried table."""
    config = Config(allow_discovered_private=True)  # the memory network's hosts are 10.0.0.x
    pex = PexReactor()
    hub = network.switch([pex], config=config)
    spoke = network.switch([PexReactor()], config=config)
    spoke.listen("tcp:26656")
    peer = network.connect(spoke, hub).peer_of(hub)
    assert pex.address_book.get(spoke.node_id).tried is False
    hub.mark_good(peer)
    assert pex.address_book.get(spoke.node_id).tried is True


def test_close_flush_delivers_what_is_queued_before_closing():
    """close(flush=True) sends what was accepted before the close packet and waits for the
    acks: the receiver gets every message and the reason's unconfirmed is empty; a plain
    close drops what is queued and counts it."""
    outcome = {}
    for flush in (True, False):
        network = MemoryNetwork(window=2048)
        receiver = RecordingReactor(CHANNELS)
        _, _, closer, _, _, peer = pair(network, receiver, config=Config(write_batch_bytes=2048))
        accepted = peer.try_send_many(CH, [b"%02d" % i + b"y" * 998 for i in range(30)])
        peer.close("done", flush=flush)
        assert not peer.try_send(CH, b"late")
        network.advance(12, step=0.05)
        [(_, reason)] = closer.removed()
        outcome[flush] = (accepted, len(receiver.received(CH)), reason.unconfirmed)
    assert outcome[True] == (30, 30, {})
    accepted, delivered, unconfirmed = outcome[False]
    assert delivered < accepted and unconfirmed[CH] >= accepted - delivered  # the queued ones were dropped


def test_close_flush_reason_counts_exactly_what_was_not_confirmed(network):
    """When the flush runs out of send_timeout (the receiver's reactor holds the channel and
    reading stopped), the close reason's unconfirmed counts exactly the messages not confirmed."""
    slow = Slow()
    config = Config(send_timeout=1.0, reactor_backlog_bytes=100)
    _, theirs, theirs_reactor, _, _, sender = pair(network, slow, config=config)
    for i in range(5):
        sender.try_send(CH, b"m%d" % i)
    network.flush()
    sender.close(flush=True)
    # The receiver reads nothing more (two held messages cost past 100 bytes), so the
    # close packet waits too: the session ends when close_linger aborts the transport.
    network.advance(config.send_timeout + config.close_linger + 0.5, step=0.05)
    [(_, reason)] = theirs_reactor.removed()
    assert reason.unconfirmed == {CH: 5 - sender.session.acked(CH)} and sender.session.acked(CH) == 1
