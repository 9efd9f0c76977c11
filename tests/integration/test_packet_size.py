"""Packet sizes on real loopback sockets (specs/wire.md section 4): two default nodes
carry a 1 MiB message in packets larger than 1 KiB, and a node configured with
``max_packet_payload=1024`` is sent nothing larger.

The dialer reaches the listener through a recording TCP relay (Twisted's portforward),
so the packets are read from the bytes that crossed the sockets. Bounded: every wait has
a timeout and every Switch and port is stopped.
"""

import os

import pytest
import pytest_twisted
from twisted.protocols import portforward

from helpers import RecordingReactor, bounded, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, Switch
from tests.helpers_core import msg_payload_sizes

pytestmark = pytest.mark.integration

BULK = 0x20
CHANNELS = [ChannelDescriptor(BULK, priority=1, send_queue_capacity=4)]


class RecordingRelay(portforward.ProxyServer):
    """Relays a connection to the listener, recording the bytes the dialer sent."""

    def dataReceived(self, data: bytes) -> None:
        self.factory.recorded.append(data)
        super().dataReceived(data)


async def sent_through_relay(listener_config: Config) -> tuple[bytes, bytes, list]:
    """A default dialer sends a 1 MiB message to a listener of ``listener_config``
    through the relay: (the message, what the listener got, the dialer's bytes)."""
    receiver = RecordingReactor(CHANNELS)
    listener = Switch([receiver], config=listener_config, clock=the_reactor())
    dialer = Switch([RecordingReactor(CHANNELS)], clock=the_reactor())
    relay_port = None
    try:
        for s in (listener, dialer):
            s.startService()
        port = await listener.listen("tcp:0:interface=127.0.0.1")
        factory = portforward.ProxyFactory("127.0.0.1", port.getHost().port)
        factory.protocol = RecordingRelay
        factory.recorded = []
        relay_port = the_reactor().listenTCP(0, factory, interface="127.0.0.1")
        peer = await bounded(dialer.dial(f"{listener.node_id}@127.0.0.1:{relay_port.getHost().port}"))
        message = os.urandom(1 << 20)
        assert await bounded(peer.send(BULK, message))
        await until(lambda: receiver.received(BULK), "the 1 MiB message")
        return message, receiver.received(BULK)[0], factory.recorded
    finally:
        if relay_port is not None:
            await bounded(relay_port.stopListening())
        await stop_switches(listener, dialer)


def packet_sizes(recorded: list) -> list[int]:
    """The payload sizes of the whole msg packets in the recorded bytes (the relay may
    have read part of a later packet, an ack, when the message arrived)."""
    return msg_payload_sizes(b"".join(recorded))


@pytest_twisted.ensureDeferred
async def test_two_default_nodes_send_a_large_message_in_large_packets():
    """Default Configs negotiate 64 KiB; on loopback the 1 MiB message crosses in
    packets larger than 1 KiB (none over 64 KiB) and arrives intact."""
    message, got, recorded = await sent_through_relay(Config())
    assert got == message
    sizes = packet_sizes(recorded)
    assert sum(sizes) == len(message)
    assert max(sizes) > 1024 and max(sizes) <= 65536


@pytest_twisted.ensureDeferred
async def test_a_node_configured_with_1024_receives_only_1024_byte_packets():
    """A listener announcing max_packet_payload 1024 (CometBFT's size) is sent no msg
    packet larger than that by a default dialer."""
    message, got, recorded = await sent_through_relay(Config(max_packet_payload=1024))
    assert got == message
    sizes = packet_sizes(recorded)
    assert sum(sizes) == len(message)
    assert max(sizes) == 1024
