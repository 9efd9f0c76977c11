"""Write-through over ws:// on real loopback sockets (mconn/net/websocket.py, ``write``;
mconn/net/write_through.py): as over TCP, the first write of the protocol above while a
read is handled (a reply, an ack) reaches the kernel before the read's callback returns,
when nothing waits in the TCP transport's buffer; a later write of the same read, and a
send outside a read, wait in Twisted's buffer; a write-ahead that went through whole
still resumes the protocol above.
"""

import socket

import pytest
import pytest_twisted

from helpers import bounded, buffered, sleep, the_reactor
from mconn import Config, Reactor, Switch
from mconn.net.websocket import WebSocketClientCarrier, WebSocketServerCarrier

from .write_paths import CH, CHANNELS, Collector, stop

pytestmark = pytest.mark.integration

PATH = "/mconn"


class Echo(Reactor):
    """Answers each message with ``reply(message)``, ``replies`` times, and records what
    the TCP transport beneath the carrier still held right after each answer."""

    def __init__(self, replies=1, reply=bytes, sndbuf=None):
        self.replies, self.reply, self.sndbuf = replies, reply, sndbuf
        self.held_after: list[int] = []
        self.paused_after: list[bool] = []

    def get_channels(self):
        return CHANNELS

    def receive(self, channel_id, peer, message):
        carrier = peer._protocol.transport
        assert isinstance(carrier, WebSocketServerCarrier)
        if self.sndbuf is not None:
            carrier.transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        for _ in range(self.replies):
            assert peer.try_send(channel_id, self.reply(message))
            self.held_after.append(buffered(carrier.transport))
            self.paused_after.append(peer._protocol._paused)


async def ws_pair(echo, config=None):
    """A ws:// listener answering with ``echo`` and a dialer; the dialer's peer."""
    collector = Collector()
    a = Switch([echo], clock=the_reactor(), config=config)
    b = Switch([collector], clock=the_reactor(), config=config)
    a.startService()
    b.startService()
    port = await a.listen(f"ws:tcp:0:interface=127.0.0.1:path={PATH}")
    peer = await bounded(b.dial(f"{a.node_id}@ws://127.0.0.1:{port.getHost().port}{PATH}"))
    assert isinstance(peer._protocol.transport, WebSocketClientCarrier)
    return a, b, collector, peer


@pytest_twisted.ensureDeferred
async def test_a_reply_over_ws_goes_to_the_kernel_before_the_callback_returns():
    """Right after the answer's ``try_send``, inside the read's handling, the TCP
    transport beneath the listener's carrier holds nothing: the frame went to the kernel.
    Without write-through it waits there until the reactor's next turn."""
    echo = Echo()
    a, b, collector, peer = await ws_pair(echo)
    try:
        for i in range(5):
            assert peer.try_send(CH, b"ping %d" % i)
            await collector.until(i + 1)
        assert collector.messages == [b"ping %d" % i for i in range(5)]
        assert echo.held_after == [0] * 5
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_only_the_first_write_of_a_read_goes_through_over_ws():
    """A second answer to the same read waits in Twisted's buffer (its frame at least),
    and both arrive in order."""
    echo = Echo(replies=2)
    a, b, collector, peer = await ws_pair(echo)
    try:
        assert peer.try_send(CH, b"twice")
        await collector.until(2)
        assert collector.messages == [b"twice", b"twice"]
        assert echo.held_after[0] == 0
        assert echo.held_after[1] > len(b"twice")
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_send_outside_a_read_waits_for_the_reactor_turn_over_ws():
    """A send from outside a read is left in Twisted's buffer and arrives."""
    echo = Echo()
    a, b, collector, peer = await ws_pair(echo)
    try:
        await sleep(0.01)  # the dial's last read: leave its handling first
        assert peer.try_send(CH, b"from a timer")
        assert buffered(peer._protocol.transport.transport) > 0
        await collector.until(1)
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_write_ahead_that_went_through_whole_still_resumes_over_ws():
    """A 1 MiB answer's first write fills the write-ahead and the kernel (a 4 MiB send
    buffer) takes it all; the protocol above pauses with nothing in Twisted's buffer, and
    the carrier asks the TCP transport for a writable socket to resume it. Without that
    it would wait forever for a drain that never comes; the answer arrives whole."""
    body = bytes(range(256)) * 4096
    echo = Echo(reply=lambda m: body, sndbuf=4 << 20)
    a, b, collector, peer = await ws_pair(echo, Config(tcp_notsent_lowat=None))
    try:
        assert peer.try_send(CH, b"big")
        await collector.until(1)
        assert collector.messages == [body]
        assert echo.held_after == [0] and echo.paused_after == [True]
    finally:
        await stop(a, b)
