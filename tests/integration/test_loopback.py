"""Real Switches on 127.0.0.1 with the global Twisted reactor (pytest-twisted).

Few and bounded: every wait has a timeout (TIMEOUT seconds) and every Switch started is
stopped, whatever the outcome.
"""

import os

import pytest
import pytest_twisted
from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint

from helpers import RecordingReactor, bounded, close_packets_in, the_reactor
from mconn import ChannelDescriptor, ConnectionClosed, PeerClosed, Switch

pytestmark = pytest.mark.integration

TIMEOUT = 10.0

CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=4),  # bulk: a multi-MiB message
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=4),  # many small messages
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=4),  # many small, urgent
]


class Collector(RecordingReactor):
    """Fires ``until(n)`` Deferreds once n messages have arrived in total."""

    def __init__(self, channels):
        super().__init__(channels)
        self._waiters = []
        self.added = defer.Deferred()
        self.removed_d = defer.Deferred()

    def add_peer(self, peer):
        super().add_peer(peer)
        if not self.added.called:
            self.added.callback(peer)

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        count = len(self.received())
        for n, d in list(self._waiters):
            if count >= n:
                self._waiters.remove((n, d))
                d.callback(count)

    def remove_peer(self, peer, reason):
        super().remove_peer(peer, reason)
        if not self.removed_d.called:
            self.removed_d.callback(reason)

    def until(self, n):
        d = defer.Deferred()
        if len(self.received()) >= n:
            d.callback(n)
        else:
            self._waiters.append((n, d))
        return bounded(d)


async def start_pair(**switch_kwargs):
    """A listening Switch and a second one, with a Collector each."""
    ra, rb = Collector(CHANNELS), Collector(CHANNELS)
    a = Switch([ra], clock=the_reactor(), **switch_kwargs)
    b = Switch([rb], clock=the_reactor(), **switch_kwargs)
    a.startService()
    b.startService()
    port = await a.listen("tcp:0:interface=127.0.0.1")
    return a, b, ra, rb, port.getHost().port


async def stop(*switches):
    await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]))


async def send_all(peer, channel_id, messages):
    for message in messages:
        assert await peer.send(channel_id, message), f"send on {channel_id:#04x} timed out"


@pytest_twisted.ensureDeferred
async def test_three_channels_big_and_small_messages_arrive_intact_and_in_order():
    """A 3 MiB message and hundreds of small ones, both ways, on three priorities."""
    a, b, ra, rb, port = await start_pair()
    try:
        peer_of_a = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        peer_of_b = await bounded(ra.added)
        big = os.urandom(3 * 1024 * 1024)
        small = {0x21: [b"tx %d " % i * 20 for i in range(300)], 0x30: [b"vote %d" % i for i in range(300)]}
        sends = []
        for sender in (peer_of_a, peer_of_b):
            sends.append(defer.ensureDeferred(send_all(sender, 0x20, [big, b"after big"])))
            for channel_id, messages in small.items():
                sends.append(defer.ensureDeferred(send_all(sender, channel_id, messages)))
        await bounded(defer.gatherResults(sends))
        total = 2 + sum(len(m) for m in small.values())
        await ra.until(total)
        await rb.until(total)
        for receiver in (ra, rb):
            assert receiver.received(0x20) == [big, b"after big"]
            for channel_id, messages in small.items():
                assert receiver.received(channel_id) == messages
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_dial_by_host_and_port_without_id():
    """dial('127.0.0.1:port') learns the node id from the hello."""
    a, b, ra, rb, port = await start_pair()
    try:
        peer = await bounded(b.dial(f"127.0.0.1:{port}"))
        assert peer.node_id == a.node_id and peer.is_outbound
        assert peer.try_send(0x30, b"hi")
        await ra.until(1)
        assert ra.received(0x30) == [b"hi"]
        assert list(a.peers) == [b.node_id]
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_stop_service_sends_close_and_the_other_side_sees_peer_closed():
    """After stopService, the other side's remove_peer gets PeerClosed('shutdown')."""
    a, b, ra, rb, port = await start_pair()
    try:
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await bounded(ra.added)
        await stop(a)
        reason = await bounded(rb.removed_d)
        assert isinstance(reason, PeerClosed) and reason.code == "shutdown"
        own = await bounded(ra.removed_d)
        assert isinstance(own, ConnectionClosed) and own.code == "shutdown"
        assert a.peers == {} and b.peers == {}
        b._check_invariants()
    finally:
        await stop(a, b)


class Garbage(protocol.Protocol):
    """Sends bytes that are no packet at all, and records what comes back."""

    def __init__(self):
        self.data = b""
        self.lost = defer.Deferred()

    def connectionMade(self):
        self.transport.write(b"\x00GET / HTTP/1.1\r\n\r\n")

    def dataReceived(self, data):
        self.data += data

    def connectionLost(self, reason):
        self.lost.callback(None)


@pytest_twisted.ensureDeferred
async def test_hostile_client_is_dropped_while_a_good_peer_carries_on(telemetry):
    """Garbage from a raw TCP client: it gets close code UnknownPacketType and is dropped;
    the good peer keeps exchanging messages."""
    a, b, ra, rb, port = await start_pair()
    try:
        good = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await bounded(ra.added)
        hostile = Garbage()
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
        await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: hostile)))
        await bounded(hostile.lost)
        assert [code for code, _ in close_packets_in(hostile.data)] == ["UnknownPacketType"]
        [event] = telemetry.named("protocol_error")
        assert event["error_type"] == "UnknownPacketType" and event["peer_id"] is None
        assert good.try_send(0x21, b"still talking")
        await ra.until(1)
        assert ra.received(0x21) == [b"still talking"]
        assert list(a.peers) == [b.node_id]
        a._check_invariants()
    finally:
        await stop(a, b)
