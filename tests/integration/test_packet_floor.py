"""The floor on max_packet_payload on every transport (specs/handshake.md section 3).

A peer announcing a tiny ``max_packet_payload`` would have everything sent to it cut
into packets that small, each costing the sender a packet's work. Over tcp, tls, ws and
wss, by IPv4 and IPv6, a raw peer whose hello announces 1 or 1023 is refused with a
close packet ``PacketPayloadTooSmall`` naming its value and the floor, and no session
starts; one announcing 1024 gets its session. The hello is the only thing wrong with
the refused peers (tests/integration/raw_transports.py). Every wait is bounded; every
Switch stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from helpers import close_packets_in, stop_switches, until
from mconn import ChannelDescriptor, Config, Reactor
from mconn.config import MIN_PACKET_PAYLOAD
from tests.integration.raw_transports import CELL_IDS, CELLS, Cell, dialer_hello_announcing

pytestmark = pytest.mark.integration

CONFIG = Config(stats_interval=0, handshake_timeout=5.0, ws_handshake_timeout=5.0)


class Quiet(Reactor):
    def get_channels(self):
        return [ChannelDescriptor(0x20)]


@pytest.mark.parametrize("transport, host", CELLS, ids=CELL_IDS)
@pytest_twisted.ensureDeferred
async def test_a_hello_below_the_floor_is_refused_and_one_at_it_is_accepted(transport, host):
    """Hellos announcing 1 and 1023 are refused ``PacketPayloadTooSmall`` naming the value
    and 1024, with no session; a hello announcing 1024 gets a session."""
    cell = await Cell(transport, host, [Quiet()], CONFIG).listen()
    try:
        for payload in (1, MIN_PACKET_PAYLOAD - 1):
            raw, node_id = await cell.raw_peer(
                lambda node_id, payload=payload: dialer_hello_announcing(node_id, payload=payload)
            )
            await until(lambda raw=raw: raw.lost is not None, f"the peer announcing {payload} to be dropped")
            [(code, text)] = close_packets_in(bytes(raw.data))
            assert code == "PacketPayloadTooSmall"
            assert f"max_packet_payload {payload};" in text and str(MIN_PACKET_PAYLOAD) in text
            assert node_id not in cell.switch.peers
        raw, node_id = await cell.raw_peer(lambda node_id: dialer_hello_announcing(node_id, payload=MIN_PACKET_PAYLOAD))
        await until(lambda: cell.switch.peers.get(node_id) is not None, "the peer announcing 1024 to get a session")
        assert raw.lost is None and not close_packets_in(bytes(raw.data))
        raw.transport.loseConnection()
    finally:
        await stop_switches(cell.switch)
