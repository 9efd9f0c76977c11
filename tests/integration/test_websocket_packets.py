"""Packet sizes over ws:// on real loopback sockets (specs/websocket.md section 5): a
WebSocket on Twisted's own TCP lets the mconn protocol above measure the link, as plain
TCP does, so bulk goes in packets larger than the unmeasured 16 KiB; the write-ahead's
pauses end, and the message arrives intact.

The dialer reaches the listener through a recording TCP relay (Twisted's portforward);
its bytes are unframed (RFC 6455, masked as a dialer sends them) and then parsed as mconn
packets. Bounded: every wait has a timeout and every Switch and port is stopped.
"""

import os

import pytest
import pytest_twisted
from twisted.protocols import portforward

from helpers import RecordingReactor, bounded, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, Switch
from mconn.core.packet_size import UNMEASURED
from mconn.net.websocket_frames import FrameReader
from tests.helpers_core import msg_payload_sizes

pytestmark = pytest.mark.integration

BULK = 0x20
CHANNELS = [ChannelDescriptor(BULK, priority=1, send_queue_capacity=4)]
PATH = "/mconn"


class RecordingRelay(portforward.ProxyServer):
    """Relays a connection to the listener, recording the bytes the dialer sent."""

    def dataReceived(self, data: bytes) -> None:
        self.factory.recorded.append(data)
        super().dataReceived(data)


async def sent_over_ws(dialer_config: Config, count: int) -> tuple[list, list, bytes]:
    """A dialer of ``dialer_config`` sends ``count`` messages of 1 MiB to a default ws
    listener through the relay: (the messages, what the listener got, the dialer's bytes)."""
    receiver = RecordingReactor(CHANNELS)
    listener = Switch([receiver], clock=the_reactor())
    dialer = Switch([RecordingReactor(CHANNELS)], config=dialer_config, clock=the_reactor())
    relay_port = None
    try:
        for s in (listener, dialer):
            s.startService()
        port = await listener.listen(f"ws:tcp:0:interface=127.0.0.1:path={PATH}")
        factory = portforward.ProxyFactory("127.0.0.1", port.getHost().port)
        factory.protocol = RecordingRelay
        factory.recorded = []
        relay_port = the_reactor().listenTCP(0, factory, interface="127.0.0.1")
        address = f"{listener.node_id}@ws://127.0.0.1:{relay_port.getHost().port}{PATH}"
        peer = await bounded(dialer.dial(address))
        messages = [os.urandom(1 << 20) for _ in range(count)]
        for message in messages:
            assert await bounded(peer.send(BULK, message))
        await until(lambda: len(receiver.received(BULK)) == count, "the bulk messages")
        return messages, receiver.received(BULK), b"".join(factory.recorded)
    finally:
        if relay_port is not None:
            await bounded(relay_port.stopListening())
        await stop_switches(listener, dialer)


def packet_sizes(stream: bytes) -> list[int]:
    """The payload sizes of the whole msg packets a dialer sent in ``stream``: its HTTP
    upgrade, then masked binary frames (the relay may have read a close frame too)."""
    head_end = stream.index(b"\r\n\r\n") + 4
    payloads, stop, _ = FrameReader(masked=True, max_message=1 << 20).read(stream[head_end:])
    assert stop is None or stop[0] == "control", stop
    return msg_payload_sizes(b"".join(payloads))


@pytest_twisted.ensureDeferred
async def test_ws_bulk_goes_in_packets_sized_by_the_measured_link():
    """Over ws on loopback the write-ahead measures the link (a write-ahead of 3 ms:
    rate samples over 30 ms, packets over 16 KiB from 22 MB/s up), so 32 MiB of bulk
    crosses in packets larger than the unmeasured size, none over the negotiated 64 KiB,
    and arrives intact. (With the compiled frames 16 MiB crossed in little more than one
    30 ms window, and a gap in the sending could leave the whole transfer unmeasured.)"""
    messages, got, stream = await sent_over_ws(Config(write_ahead_time=0.003), 32)
    assert got == messages
    sizes = packet_sizes(stream)
    assert sum(sizes) == sum(map(len, messages))
    assert UNMEASURED < max(sizes) <= 65536, max(sizes)


@pytest_twisted.ensureDeferred
async def test_ws_without_a_write_ahead_keeps_unmeasured_packets():
    """With ``write_ahead_time=None`` nothing is measured over ws either: every packet
    is at most the unmeasured size, and the messages arrive intact."""
    messages, got, stream = await sent_over_ws(Config(write_ahead_time=None), 2)
    assert got == messages
    sizes = packet_sizes(stream)
    assert sum(sizes) == sum(map(len, messages))
    assert max(sizes) <= UNMEASURED
