"""Write-through on real loopback sockets (mconn/net/write_through.py, specs/connection.md
section 7): a reply written while a read is handled reaches the kernel before the
reactor's callback returns; a second write of the same read, and a send outside a read,
wait in Twisted's buffer like any other write; what the kernel does not take follows in order; a
write that fills the write-ahead and went through whole still resumes the protocol; a
keepalive ping goes to the kernel from the connection's timer. Bulk writes (the section
"Bulk writes" of write_through.py): a write that fills the write-ahead goes to the kernel
in one ``sendmsg`` of the queued message's views, the pump goes on while the kernel drains
them, and yields to the event loop after ``DIRECT_TURN_BYTES``.
"""

import socket
import types

import pytest
import pytest_twisted
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import CertificateOptions
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol

from helpers import bounded, buffered, sleep, the_reactor
from mconn import Config, Reactor, Switch
from mconn.net import protocol as protocol_module
from mconn.net.protocol import BURST_BYTES
from mconn.net.write_through import plain_tcp, unsent

from .write_paths import CH, CHANNELS, Collector, SendLog, stop

pytestmark = pytest.mark.integration


class Echo(Reactor):
    """Answers each message with ``reply(message)``, ``replies`` times, and records what
    the transport still held right after each answer."""

    def __init__(self, replies=1, reply=bytes, before=None):
        self.replies, self.reply, self.before = replies, reply, before
        self.held_after: list[int] = []
        self.paused_after: list[bool] = []

    def get_channels(self):
        return CHANNELS

    def receive(self, channel_id, peer, message):
        transport = peer._protocol.transport
        if self.before is not None:
            self.before(transport)
        for _ in range(self.replies):
            assert peer.try_send(channel_id, self.reply(message))
            self.held_after.append(buffered(transport))
            self.paused_after.append(peer._protocol._paused)


async def pair(echo, config=None):
    """A listening Switch answering with ``echo``, and a dialing one; the dialer's peer.
    ``config``: both Switches' (default Config())."""
    collector = Collector()
    a = Switch([echo], clock=the_reactor(), config=config)
    b = Switch([collector], clock=the_reactor(), config=config)
    a.startService()
    b.startService()
    port = await a.listen("tcp:0:interface=127.0.0.1")
    peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port.getHost().port}"))
    return a, b, collector, peer


@pytest_twisted.ensureDeferred
async def test_a_reply_goes_to_the_kernel_before_the_callback_returns():
    """The answer to a read is sent inside the read's callback: right after ``try_send``
    Twisted's buffer is empty, and the answer arrives. Without write-through it waits
    in that buffer (its packet's bytes) until the reactor's next turn."""
    echo = Echo()
    a, b, collector, peer = await pair(echo)
    try:
        for i in range(5):
            assert peer.try_send(CH, b"ping %d" % i)
            await collector.until(i + 1)
        assert collector.messages == [b"ping %d" % i for i in range(5)]
        assert echo.held_after == [0] * 5
        assert plain_tcp(peer._protocol.transport)
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_only_the_first_write_of_a_read_goes_through():
    """A second answer to the same read waits in Twisted's buffer (one send per read at
    most: a turn's later writes are still coalesced), and both arrive in order."""
    echo = Echo(replies=2)
    a, b, collector, peer = await pair(echo)
    try:
        assert peer.try_send(CH, b"twice")
        await collector.until(2)
        assert collector.messages == [b"twice", b"twice"]
        assert echo.held_after[0] == 0
        assert echo.held_after[1] > len(b"twice")
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_send_outside_a_read_waits_for_the_reactor_turn():
    """A send from outside a read (a timer of the reactor's) is left in Twisted's buffer,
    to be sent with the turn's other writes, and arrives."""
    echo = Echo()
    a, b, collector, peer = await pair(echo)
    try:
        await sleep(0.01)  # the dial's answer was a read: leave its handling first
        assert peer.try_send(CH, b"from a timer")
        assert buffered(peer._protocol.transport) > 0
        await collector.until(1)
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_keepalive_ping_goes_to_the_kernel_from_its_timer():
    """The connection's timer writes its ping through (one ``send`` from the timer): it
    never waits in Twisted's buffer for a watch for writability and a later turn."""
    listening = Collector()
    a = Switch([listening], clock=the_reactor(), config=Config(ping_interval=0.2, stats_interval=0))
    b = Switch([Collector()], clock=the_reactor(), config=Config(stats_interval=0))  # pings after 60 s
    a.startService()
    b.startService()
    try:
        port = await a.listen("tcp:0:interface=127.0.0.1")
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port.getHost().port}"))
        transport = (await bounded(listening.added))._protocol.transport
        assert plain_tcp(transport)
        through, buffered_writes = [], []
        write_some, write = transport.writeSomeData, transport.write
        transport.writeSomeData = lambda data: (through.append(bytes(data)), write_some(data))[1]
        transport.write = lambda data: (buffered_writes.append(bytes(data)), write(data))[1]
        for _ in range(50):  # pings at about 0.2 s intervals, each answered by a pong
            if through.count(b"\x01") >= 2:
                break
            await sleep(0.1)
        assert through.count(b"\x01") >= 2
        assert b"\x01" not in buffered_writes
    finally:
        await stop(a, b)


def send_buffer(size: int):
    """A ``before`` hook that sets the answering socket's SO_SNDBUF to ``size``."""
    return lambda transport: transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def answer_big(body: bytes, sndbuf: int, config=None) -> Echo:
    """Ask for ``body`` as the answer over a socket with SO_SNDBUF ``sndbuf``; it must
    arrive whole. Returns the answering reactor (what its transport held after)."""
    echo = Echo(reply=lambda m: body, before=send_buffer(sndbuf))
    a, b, collector, peer = await pair(echo, config)
    try:
        assert peer.try_send(CH, b"big")
        await collector.until(1)
        assert collector.messages == [body]
    finally:
        await stop(a, b)
    return echo


@pytest_twisted.ensureDeferred
async def test_what_the_kernel_does_not_take_follows_in_order():
    """With a 4 KiB send buffer the kernel takes only part of a 256 KiB answer's first
    write; the rest waits in Twisted's buffer and the answer arrives whole."""
    echo = await answer_big(bytes(range(256)) * 1024, 4096)
    assert 0 < echo.held_after[0] < 65536  # less than the first write: part went through


@pytest_twisted.ensureDeferred
async def test_a_write_ahead_that_went_through_whole_still_resumes():
    """A 1 MiB answer's first write fills the write-ahead (64 KiB on loopback) and the
    kernel takes it all; without ``tcp_notsent_lowat`` the pump cannot tell whether the
    kernel drains it, so it pauses with nothing in Twisted's buffer and asks the
    transport for a writable socket to resume it. Without that it would wait forever
    for a drain that never comes; the answer arrives whole."""
    echo = await answer_big(bytes(range(256)) * 4096, 4 << 20, Config(tcp_notsent_lowat=None))
    assert echo.held_after == [0] and echo.paused_after == [True]


async def bulk_pair():
    """A pair whose dialer sends; the listener's Collector, the dialer's peer and the
    SendLog of its socket, once the handshake's reads and writes are over. The dialer's
    write-ahead is told the link drains 1 GB/s (what it measures on loopback after its
    first 10 ms of bulk writes): bulk writes of up to 256 KiB go straight to the kernel.
    (The receiving socket's buffer is left to the kernel's autotuning: a SO_RCVBUF set
    would turn it off and cap the window at rmem_max.)"""
    receiving = Collector()
    a, b, _, peer = await pair(receiving)
    await sleep(0.05)
    peer._protocol._ahead.rate = 1e9
    return a, b, receiving, peer, SendLog(peer._protocol)


@pytest_twisted.ensureDeferred
async def test_a_link_not_measured_fast_keeps_the_path_through_twisted():
    """Until the write-ahead has measured a link faster than a 64 KiB write per
    millisecond (and on any slower link: 20 Mbit/s, 2 Mbit/s), bulk writes keep the path
    through Twisted's buffer: no sendmsg; the message arrives."""
    receiving = Collector()
    a, b, _, peer = await pair(receiving)
    try:
        await sleep(0.05)
        log = SendLog(peer._protocol)
        peer._protocol._ahead.rate = 2.5e6  # 20 Mbit/s: writes of 2.5 KB, as measured there
        message = bytes(range(256)) * 4096
        assert peer.try_send(CH, message)
        await receiving.until(1)
        assert receiving.messages == [message]
        assert log.sends() == []
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_bulk_write_goes_to_the_kernel_unjoined_and_goes_on_while_it_drains():
    """Eight 1 MiB messages sent from outside a read: their writes go to the kernel as
    ``sendmsg`` of the packet headers and views of the messages themselves (no join),
    and while the kernel drains them the pump goes on: some turns of the event loop
    carry two writes or more, without a resume between them. All arrive in order.
    Without the bulk path no write is a sendmsg; without going on, one a turn."""
    a, b, collector, peer, log = await bulk_pair()
    try:
        messages = [bytes([i]) * (1 << 20) for i in range(8)]
        assert peer.try_send_many(CH, messages) == 8
        await collector.until(8)
        assert collector.messages == messages
        sends = log.sends()
        assert sends and all(any(type(x) is memoryview and x.obj in messages for x in s[1]) for s in sends)
        assert sum(s[2] for s in sends) > 4 << 20
        assert max(calls for calls, _ in log.turns()) >= 2, log.turns()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_bulk_sender_yields_to_the_event_loop_after_the_turn_bound(monkeypatch):
    """Eight 1 MiB messages queued at once: the pump goes on while the kernel drains, but
    sends at most DIRECT_TURN_BYTES (and the write that crosses it) between two resumes
    by the transport, so reads and timers get their turns; all arrive in order. (The
    bound is lowered to 128 KiB here, below what the receiver's window lets a turn send.)"""
    monkeypatch.setattr(protocol_module, "DIRECT_TURN_BYTES", 2 * 65536)
    a, b, collector, peer, log = await bulk_pair()
    try:
        messages = [bytes([i]) * (1 << 20) for i in range(8)]
        assert peer.try_send_many(CH, messages) == 8
        await collector.until(8)
        assert collector.messages == messages
        turns = log.turns()
        assert len(turns) >= 8, turns
        assert max(sent for _, sent in turns) <= 2 * 65536 + BURST_BYTES + 65536, turns
    finally:
        await stop(a, b)


def test_unsent_is_what_the_kernel_holds_not_yet_sent():
    """``unsent`` reads the kernel's count of a socket's unsent bytes: none on an idle
    connection, more than the peer's window once it stops reading, None once closed."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        as_transport = types.SimpleNamespace(socket=client)
        assert unsent(as_transport) == 0
        client.setblocking(False)
        sent = 0
        for _ in range(10000):  # until the kernel takes no more (bounded)
            try:
                sent += client.send(bytes(65536))
            except BlockingIOError:
                break
        assert 0 < unsent(as_transport) <= sent
        client.close()
        assert unsent(as_transport) is None
    finally:
        for s in (client, server, listener):
            s.close()


def test_only_twisteds_plain_tcp_transport_qualifies():
    """A TLS transport, and any transport that is not Twisted's TCP one, keep the plain
    write (their buffers are not Twisted's TCP buffers)."""
    tls = TLSMemoryBIOProtocol(TLSMemoryBIOFactory(CertificateOptions(), True, None), Protocol())
    assert not plain_tcp(tls)
    assert not plain_tcp(StringTransport())
