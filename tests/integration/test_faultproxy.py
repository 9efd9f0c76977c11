"""The fault proxy (tests/faultproxy.py) on real loopback sockets, with pytest-twisted.

Each test runs a small Twisted server behind a FaultProxy and Twisted clients in front of
it. Every wait is bounded (TIMEOUT seconds) and every proxy and server is stopped,
whatever the outcome.
"""

import hashlib
import os

import pytest
import pytest_twisted
from twisted.internet import defer, error, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IHalfCloseableProtocol
from zope.interface import implementer

from faultproxy import MAX_BUFFERED, FaultProxy
from helpers import sleep, the_reactor

pytestmark = pytest.mark.integration

TIMEOUT = 5.0
QUIET = 0.5  # how long "nothing happens" is watched for


def bounded(d, seconds=TIMEOUT):
    return d.addTimeout(seconds, the_reactor())


class Peer(protocol.Protocol):
    """Sends ``greeting`` on connect, collects what arrives, records how it ended."""

    def __init__(self, greeting=b""):
        self.greeting = greeting
        self.received = bytearray()
        self.arrivals = []  # (reactor time, bytes so far)
        self.made = defer.Deferred()
        self.lost = defer.Deferred()
        self._waiters = []

    def connectionMade(self):
        if self.greeting:
            self.transport.write(self.greeting)
        self.made.callback(self)

    def dataReceived(self, data):
        self.received += data
        self.arrivals.append((the_reactor().seconds(), len(self.received)))
        for n, d in list(self._waiters):
            if len(self.received) >= n:
                self._waiters.remove((n, d))
                d.callback(len(self.received))

    def connectionLost(self, reason):
        self.lost.callback(reason.value)  # the exception, so awaiting it does not raise

    def until(self, n):
        """Fires once ``n`` bytes have arrived in total."""
        if len(self.received) >= n:
            return defer.succeed(len(self.received))
        d = defer.Deferred()
        self._waiters.append((n, d))
        return bounded(d)

    @property
    def is_lost(self):
        return self.lost.called


@implementer(IHalfCloseableProtocol)
class Responder(Peer):
    """Answers once the client has half-closed (sent its FIN), then closes."""

    def readConnectionLost(self):
        self.transport.write(b"reply to " + bytes(self.received))
        self.transport.loseConnection()

    def writeConnectionLost(self):
        pass


class Server(protocol.Factory):
    """Builds a ``peer_class`` (greeting with ``greeting``) per connection, in ``peers``."""

    noisy = False

    def __init__(self, greeting=b"", peer_class=Peer):
        self.greeting = greeting
        self.peer_class = peer_class
        self.peers = []

    def buildProtocol(self, addr):
        peer = self.peer_class(self.greeting)
        self.peers.append(peer)
        return peer


class Setup:
    """A server on 127.0.0.1 (or ::1), a FaultProxy in front of it, clients through it."""

    def __init__(self, greeting=b"", host="127.0.0.1", peer_class=Peer):
        self.server = Server(greeting, peer_class)
        self.host = host
        self.clients = []
        self._claimed = 0  # server Peers already handed out by connect()

    async def start(self):
        clock = the_reactor()
        self.listening = clock.listenTCP(0, self.server, interface=self.host)
        self.proxy = FaultProxy(self.host, self.listening.getHost().port, clock=clock)
        await self.proxy.start()
        return self

    async def connect(self, greeting=b"", reaches_server=True):
        """A client through the proxy, and the server Peer it reached (or None)."""
        client = Peer(greeting)
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", self.proxy.port)
        await bounded(connectProtocol(endpoint, client))
        self.clients.append(client)
        if not reaches_server:
            return client, None
        return client, await self.next_server_peer()

    async def next_server_peer(self):
        for _ in range(100):  # bounded: the proxy dials the server within a few turns
            if len(self.server.peers) > self._claimed:
                self._claimed += 1
                return self.server.peers[self._claimed - 1]
            await sleep(0.01)
        raise AssertionError(f"the server got {len(self.server.peers)} connections, expected more")

    async def stop(self):
        await bounded(defer.ensureDeferred(self.proxy.stop()))
        for peer in self.clients + self.server.peers:
            if not peer.is_lost:
                peer.transport.abortConnection()
        await bounded(defer.maybeDeferred(self.listening.stopListening))


def started(greeting=b"", host="127.0.0.1", peer_class=Peer):
    return defer.ensureDeferred(Setup(greeting, host, peer_class).start())


def digest(data):
    return hashlib.sha256(data).hexdigest()


def assert_reset(reason):
    assert isinstance(reason, error.ConnectionLost), f"expected a reset, got {reason!r}"


def assert_clean(reason):
    assert isinstance(reason, error.ConnectionDone), f"expected a clean close, got {reason!r}"


@pytest_twisted.ensureDeferred
async def test_forwards_5_mb_each_way_intact_and_closes_cleanly():
    """5 MB each way pass through intact, counted per link and per proxy; a clean close ends both sides and
    the link."""
    down = os.urandom(5 * 1024 * 1024)
    up = os.urandom(5 * 1024 * 1024)
    s = await started(greeting=down)
    try:
        client, server = await s.connect(greeting=up)
        await server.until(len(up))
        await client.until(len(down))
        assert digest(server.received) == digest(up)
        assert digest(client.received) == digest(down)
        assert (s.proxy.bytes_up, s.proxy.bytes_down) == (len(up), len(down))
        [link] = s.proxy.links
        assert (link.bytes_up, link.bytes_down) == (len(up), len(down))
        client.transport.loseConnection()
        assert_clean(await bounded(server.lost))
        assert_clean(await bounded(client.lost))
        await bounded(link.when_closed())
        assert link.closed and s.proxy.links == []
        assert s.proxy.connections_accepted == 1
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_server_close_reaches_the_client_after_the_data():
    """A server's close reaches the client cleanly, after the bytes written before it."""
    s = await started()
    try:
        client, server = await s.connect()
        server.transport.write(b"last words")
        server.transport.loseConnection()
        assert_clean(await bounded(client.lost))
        assert bytes(client.received) == b"last words"
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_half_close_is_forwarded_and_the_other_direction_keeps_flowing():
    """A client FIN is forwarded as a half-close: the server's reply still flows back before both ends close
    cleanly."""
    s = await started(peer_class=Responder)
    try:
        client, server = await s.connect()
        client.transport.write(b"request")
        client.transport.loseWriteConnection()  # FIN: the server answers, then closes
        assert_clean(await bounded(client.lost))
        assert bytes(client.received) == b"reply to request"
        assert_clean(await bounded(server.lost))
        assert bytes(server.received) == b"request"
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_reset_one_link_then_all_aborts_both_ends_promptly():
    """Resetting one link aborts both of its ends (once) and leaves the others working; reset_all aborts the
    rest within a second."""
    s = await started()
    try:
        (client, server), *pairs = [await s.connect(greeting=b"hi") for _ in range(3)]
        for _, peer in [(client, server)] + pairs:
            await peer.until(2)
        assert s.proxy.links[0].reset() and not s.proxy.links[0].reset()
        assert_reset(await bounded(client.lost, 1.0))
        assert_reset(await bounded(server.lost, 1.0))
        pairs[0][0].transport.write(b" there")
        await pairs[0][1].until(8)  # the other links are untouched
        clock = the_reactor()
        before = clock.seconds()
        assert s.proxy.reset_all() == 2
        for client, server in pairs:
            assert_reset(await bounded(client.lost, 1.0))
            assert_reset(await bounded(server.lost, 1.0))
        assert clock.seconds() - before < 1.0
        for _ in range(10):
            if not s.proxy.links:
                break
            await sleep(0.01)
        assert s.proxy.links == [] and s.proxy.reset_all() == 0
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_blackhole_drops_everything_closes_nothing_and_stop_ends_it():
    """A black hole forwards and closes nothing, new links included; after heal() only new links work, and
    stop() ends all."""
    s = await started()
    try:
        client, server = await s.connect(greeting=b"ping")
        await server.until(4)
        s.proxy.blackhole_all()
        client.transport.write(b"lost up" * 1000)
        server.transport.write(b"lost down" * 1000)
        await sleep(QUIET)
        assert bytes(server.received) == b"ping" and bytes(client.received) == b""
        assert not client.is_lost and not server.is_lost
        [old] = s.proxy.links
        assert not old.closed

        late, _ = await s.connect(reaches_server=False)  # opened during the hole
        await sleep(0.1)
        assert len(s.server.peers) == 1 and not late.is_lost
        s.proxy.heal()
        healed_client, healed_server = await s.connect(greeting=b"new")
        await healed_server.until(3)
        assert bytes(healed_server.received) == b"new"
        client.transport.write(b"still dead")
        await sleep(0.1)
        assert bytes(server.received) == b"ping"  # black-holed links stay dead

        await bounded(defer.ensureDeferred(s.proxy.stop()))
        for peer in (client, server, late, healed_client, healed_server):
            await bounded(peer.lost, 1.0)
        assert s.proxy.links == []
    finally:
        await s.stop()


async def _wait_for_links(proxy, n):
    for _ in range(100):
        if len(proxy.links) >= n:
            return
        await sleep(0.01)
    raise AssertionError(f"{len(proxy.links)} links, expected {n}")


@pytest_twisted.ensureDeferred
async def test_link_opened_during_blackhole_never_reaches_the_server():
    """A connection accepted during a black hole never reaches the target and stays open until the proxy
    stops."""
    s = await started()
    try:
        s.proxy.blackhole_all()
        client, _ = await s.connect(greeting=b"hello?", reaches_server=False)
        await _wait_for_links(s.proxy, 1)
        await sleep(0.2)
        assert s.server.peers == [] and not client.is_lost
    finally:
        await s.stop()
    assert client.is_lost


@pytest_twisted.ensureDeferred
async def test_delay_holds_each_chunk_at_least_that_long_and_keeps_order():
    """A delay holds each chunk at least that long, a later shorter delay never reorders chunks, and a close
    waits behind its data."""
    s = await started()
    try:
        client, server = await s.connect()
        clock = the_reactor()
        s.proxy.set_delay(0.2)
        sent_at = clock.seconds()
        client.transport.write(b"a" * 100)
        await sleep(0.05)
        s.proxy.set_delay(0.0)  # a later chunk with less delay must not overtake
        client.transport.write(b"b" * 100)
        await server.until(200)
        first_arrival = server.arrivals[0][0]
        assert first_arrival - sent_at >= 0.2
        assert bytes(server.received) == b"a" * 100 + b"b" * 100
        s.proxy.set_delay(0.15)
        closed_at = clock.seconds()
        client.transport.write(b"bye")
        client.transport.loseConnection()
        assert_clean(await bounded(server.lost))
        assert bytes(server.received).endswith(b"bye")
        assert clock.seconds() - closed_at >= 0.15  # the close waits behind the data
    finally:
        await s.stop()


@pytest.mark.parametrize("direction", ["up", "down", "both"])
@pytest.mark.parametrize("n", [0, 1, 4095, 150_000])
@pytest_twisted.ensureDeferred
async def test_cut_after_n_bytes_delivers_exactly_n_then_aborts(direction, n):
    """A cut after N bytes ('up', 'down' or 'both') delivers exactly the first N bytes, then resets both ends;
    the next link is uncut."""
    size = 300_000
    up, down = os.urandom(size), os.urandom(size)
    s = await started(greeting=down if direction != "up" else b"")
    try:
        s.proxy.cut_after(n, direction)
        client, server = await s.connect(greeting=up if direction != "down" else b"")
        assert_reset(await bounded(client.lost))
        assert_reset(await bounded(server.lost))
        if direction == "up":
            assert bytes(server.received) == up[:n]
        elif direction == "down":
            assert bytes(client.received) == down[:n]
        else:
            got_up, got_down = len(server.received), len(client.received)
            assert got_up + got_down == n
            assert bytes(server.received) == up[:got_up]
            assert bytes(client.received) == down[:got_down]
        forwarded = {"up": s.proxy.bytes_up, "down": s.proxy.bytes_down}
        forwarded["both"] = s.proxy.bytes_up + s.proxy.bytes_down
        assert forwarded[direction] == n
        # the cut was for the next link only: the one after it forwards normally
        again, again_server = await s.connect(greeting=b"x" * 10)
        await again_server.until(10)
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_cut_with_a_delay_still_lands_on_the_exact_byte():
    """With a delay set, a cut on a live link still delivers exactly the first N bytes before the reset."""
    s = await started()
    try:
        s.proxy.set_delay(0.05)
        client, server = await s.connect()
        s.proxy.links[0].cut_after(10, "up")
        for _ in range(5):
            client.transport.write(b"0123456")
        assert_reset(await bounded(server.lost))
        assert bytes(server.received) == b"0123456012"
        assert_reset(await bounded(client.lost))
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_refuse_accepts_and_drops_then_recovers():
    """While refusing, a connection is accepted and aborted without a link or a server connection;
    refuse(False) restores forwarding."""
    s = await started()
    try:
        s.proxy.refuse(True)
        client = Peer()
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", s.proxy.port)
        try:
            await bounded(connectProtocol(endpoint, client))
        except error.ConnectError:
            pass  # the abort may land before the client's connect completes
        else:
            assert_reset(await bounded(client.lost, 1.0))
        assert s.proxy.connections_accepted == 1 and s.proxy.links == []
        assert s.server.peers == []
        s.proxy.refuse(False)
        _, server = await s.connect(greeting=b"ok")
        await server.until(2)
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_target_down_drops_the_client():
    """When the target is not listening, the accepted client is reset and no link is left behind."""
    clock = the_reactor()
    port = clock.listenTCP(0, Server(), interface="127.0.0.1")
    dead_port = port.getHost().port
    await port.stopListening()
    proxy = FaultProxy("127.0.0.1", dead_port, clock=clock)
    await proxy.start()
    try:
        client = Peer()
        endpoint = TCP4ClientEndpoint(clock, "127.0.0.1", proxy.port)
        await bounded(connectProtocol(endpoint, client))
        assert_reset(await bounded(client.lost))
        await sleep(0.01)
        assert proxy.links == []
    finally:
        await bounded(defer.ensureDeferred(proxy.stop()))


@pytest_twisted.ensureDeferred
async def test_slow_reader_backpressure_bounds_the_proxy_then_all_arrives():
    """A server that stops reading stalls the sender with at most MAX_BUFFERED held in the proxy; once it
    reads, every byte arrives intact."""
    data = os.urandom(24 * 1024 * 1024)
    s = await started()
    try:
        client, server = await s.connect()
        server.transport.pauseProducing()  # the server stops reading
        client.transport.write(data)
        await sleep(0.3)
        stalled = s.proxy.bytes_up
        await sleep(0.1)
        assert s.proxy.bytes_up == stalled < len(data)
        [link] = s.proxy.links
        assert link.up.queued + link.up.unflushed <= MAX_BUFFERED + 65536
        server.transport.resumeProducing()
        await server.until(len(data))
        assert digest(server.received) == digest(data)
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_ipv6_target():
    """The proxy forwards to an IPv6 loopback target (::1), when the machine has one."""
    s = Setup(host="::1")
    try:
        await s.start()
    except error.CannotListenError:
        pytest.skip("no IPv6 loopback here")
    try:
        client, server = await s.connect(greeting=b"up")
        await server.until(2)
        assert bytes(server.received) == b"up"
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_stop_leaves_no_links_ports_or_timers_and_is_idempotent():
    """stop(), even called concurrently and again, ends every link, drops delayed chunks, cancels its timers
    and stops listening."""
    clock = the_reactor()
    baseline = set(clock.getDelayedCalls())
    s = await started()
    try:
        client, server = await s.connect()
        other, other_server = await s.connect()
        s.proxy.set_delay(5.0)  # chunks now wait in the proxy, behind timers
        client.transport.write(b"waiting")
        other_server.transport.write(b"waiting too")
        await sleep(0.1)
        assert any(call not in baseline for call in clock.getDelayedCalls())
        s.proxy.blackhole_all()
        s.proxy.heal()
        s.proxy.cut_after(3)
        stops = [defer.ensureDeferred(s.proxy.stop()) for _ in range(2)]  # concurrent
        await bounded(defer.gatherResults(stops))
        await s.proxy.stop()  # and again, once stopped
        assert s.proxy.links == []
        for peer in (client, server, other, other_server):
            await bounded(peer.lost, 1.0)
        assert server.received == b"" and other.received == b""
        await sleep(0)  # let Twisted's own callLater(0) for the aborts run
        leftover = [c for c in clock.getDelayedCalls() if c not in baseline and c.active()]
        assert leftover == [], leftover
        with pytest.raises(error.ConnectError):
            endpoint = TCP4ClientEndpoint(clock, "127.0.0.1", s.proxy.port)
            await bounded(connectProtocol(endpoint, Peer()))
    finally:
        await s.stop()


def test_rejects_non_loopback_targets_and_bad_arguments():
    """Non-loopback targets, an unknown cut direction, a negative byte count and a negative delay are refused
    with ValueError."""
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.0.0.1", 80, clock=object())
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("example.com", 80, clock=object())
    proxy = FaultProxy("::1", 80, clock=object())
    with pytest.raises(ValueError, match="direction"):
        proxy.cut_after(1, "sideways")
    with pytest.raises(ValueError, match="byte count"):
        proxy.cut_after(-1)
    with pytest.raises(ValueError, match="seconds"):
        proxy.set_delay(-0.1)
