"""Bulk writes straight to the kernel over ws:// on real loopback sockets
(mconn/net/write_through.py, "Bulk writes"; the carrier's ``IDirectWrites`` in
mconn/net/websocket.py): on a link measured fast, a write that fills the write-ahead is
framed (a dialer's masked) in one pass and handed to the kernel in one ``sendmsg`` when
the TCP transport beneath holds nothing; what the kernel does not take follows through
Twisted's buffer, in order.
"""

import os
import socket

import pytest
import pytest_twisted

from helpers import sleep
from mconn.net.write_through import IDirectWrites, TCPDirect, direct_writes
from mconn.net.websocket import WebSocketClientCarrier, WebSocketServerCarrier
from .test_websocket_write_through import ws_pair
from .write_paths import CH, Collector, SendLog, stop

pytestmark = pytest.mark.integration


def measured_fast(protocol) -> SendLog:
    """Tell ``protocol``'s write-ahead the link drains 1 GB/s (what it measures on
    loopback after its first bulk writes): bulk writes of up to 256 KiB go straight to
    the kernel. Returns the SendLog of the socket beneath its carrier."""
    protocol._ahead.rate = 1e9
    return SendLog(protocol, protocol.transport.transport)  # the TCP transport beneath the carrier


def listener_peer(switch, node_id):
    """The listener's Peer of the dialer ``node_id``."""
    return switch.peers[node_id]


def test_the_carrier_over_plain_tcp_declares_direct_writes():
    """The protocol asks its transport for the path (``direct_writes``): Twisted's plain
    TCP through ``TCPDirect``, a WebSocket carrier itself; anything else has none."""
    assert IDirectWrites.implementedBy(TCPDirect)
    assert direct_writes(object()) is None


@pytest_twisted.ensureDeferred
async def test_a_dialers_bulk_write_goes_to_the_kernel_framed_and_masked_in_one_send():
    """Eight 1 MiB messages from the dialer: its writes go to the kernel as one
    ``sendmsg`` of one bytes object each, masked binary frames (RFC 6455: 0x82, the mask
    bit set), and while the kernel drains them the pump goes on (two sends or more in a
    turn of the loop); all arrive in order. Without the carrier's direct path no write
    over ws is a ``sendmsg`` (Twisted's own sends are ``send``)."""
    listening = Collector()
    a, b, _, peer = await ws_pair(listening)
    try:
        await sleep(0.05)
        assert direct_writes(peer._protocol.transport) is peer._protocol.transport
        log = measured_fast(peer._protocol)
        messages = [bytes([i]) * (1 << 20) for i in range(8)]
        assert peer.try_send_many(CH, messages) == 8
        await listening.until(8)
        assert listening.messages == messages
        sends = log.sends()
        assert sends, "no bulk write went straight to the kernel"
        assert all(len(s[1]) == 1 and type(s[1][0]) is bytes for s in sends)
        assert all(s[1][0][0] == 0x82 and s[1][0][1] & 0x80 for s in sends)
        assert sum(s[2] for s in sends) > 4 << 20
        assert log.most_sends_in_a_turn() >= 2, log.events
    finally:
        await stop(a, b)


@pytest.mark.parametrize("sender", ["dialer", "listener"])
@pytest_twisted.ensureDeferred
async def test_bytes_arrive_intact_when_the_kernel_takes_part_of_a_direct_write(sender):
    """The sender's socket has a small SO_SNDBUF, so the kernel takes only part of a
    256 KiB direct write: the rest of its frames follows through Twisted's buffer and the
    protocol above waits for it. Random messages (no two frames alike) arrive byte for
    byte, in order, on both sides (a dialer masks, a listener does not). Without the
    carrier's direct path there is no ``sendmsg`` at all."""
    listening = Collector()
    a, b, dialing, peer = await ws_pair(listening)
    try:
        await sleep(0.05)
        sending = peer if sender == "dialer" else listener_peer(a, b.node_id)
        carrier = sending._protocol.transport
        assert isinstance(carrier, WebSocketClientCarrier if sender == "dialer" else WebSocketServerCarrier)
        carrier.transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        log = measured_fast(sending._protocol)
        messages = [os.urandom(300_000 + 4099 * i) for i in range(6)]
        assert sending.try_send_many(CH, messages) == 6
        receiving = listening if sender == "dialer" else dialing
        await receiving.until(6)
        assert receiving.messages == messages
        sends = log.sends()
        assert sends, "no bulk write went straight to the kernel"
        assert any(s[2] < len(s[1][0]) for s in sends), "the kernel took every direct write whole"
    finally:
        await stop(a, b)
