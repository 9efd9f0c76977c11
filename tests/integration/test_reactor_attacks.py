"""Attacks on the blocksync and mempool reactors (reactors/blocksync.py, reactors/mempool.py)
over real Switches on loopback, by tcp, tls, ws and wss, IPv4 and IPv6.

* The blocksync wedge: a hostile peer's unsolicited 17-byte StatusResponse(base=2**62,
  height=2**63-1) made ``receive`` walk 2**62 heights, freezing the event loop for good.
  Now the hostile peer is dropped (ImplausibleStatus, naming both values) and a good peer
  that connects afterwards delivers every block: the loop was never held.
* The mempool flood: one peer sending thousands of distinct transactions filled the
  mempool for good and grew its seen set without bound. Now it gets its share
  (``max_peer_txs``), the honest peer's transactions are admitted while it floods, and
  the seen sets stay within ``seen_capacity``.

The reactors do not see the transport, so one cell of each family and transport is run,
not every product; tests/operators/test_reactor_bounds.py has the unit tests.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from helpers import bounded, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeKey, Reactor, ReactorError, Switch, TLSOptions
from mconn.core.address import PeerAddress
from reactors.blocksync import BLOCKSYNC_CHANNEL, BlocksyncReactor, BlocksyncType, encode
from reactors.mempool import MEMPOOL_CHANNEL, MempoolReactor, tx_key

pytestmark = pytest.mark.integration

CONFIG = Config(stats_interval=0, handshake_timeout=5.0, ws_handshake_timeout=5.0, http_proxy="")
PATH = "/mconn"
CELLS = [("tcp", "127.0.0.1"), ("tcp", "::1"), ("tls", "127.0.0.1"), ("ws", "::1"), ("wss", "127.0.0.1")]
BLOCKS = {h: b"block-%d:" % h + bytes([h % 251]) * 500 for h in range(1, 31)}
WEDGE = encode(BlocksyncType.STATUS_RESPONSE, base=2**62, height=2**63 - 1)


class Recording:
    """Wraps a reactor's remove_peer to keep ``(node_id, reason)`` of every removal."""

    def __init__(self, reactor) -> None:
        self.removed = []
        original = reactor.remove_peer

        def remove_peer(peer, reason):
            self.removed.append((peer.node_id, reason))
            original(peer, reason)

        reactor.remove_peer = remove_peer

    def reasons_for(self, node_id: str) -> list:
        return [reason for removed, reason in self.removed if removed == node_id]


class Raw(Reactor):
    """A hostile reactor: on a new peer it sends ``messages`` on ``channel_id``, in order,
    as fast as the channel queue takes them; it ignores what it receives."""

    def __init__(self, channel_id: int, messages, capacity: int) -> None:
        self.channel_id = channel_id
        self.messages = messages
        self.capacity = capacity
        self.sent = 0

    def get_channels(self):
        return [ChannelDescriptor(self.channel_id, send_queue_capacity=100, recv_message_capacity=self.capacity)]

    def add_peer(self, peer) -> None:
        self._send(peer, iter(self.messages))

    def _send(self, peer, messages) -> None:
        for message in messages:
            if peer.state == "closed":
                return
            if not peer.try_send(self.channel_id, message):  # full: wait for room, then go on
                peer.send(self.channel_id, message).addCallback(self._sent, peer, messages)
                return
            self.sent += 1

    def _sent(self, accepted: bool, peer, messages) -> None:
        if accepted:
            self.sent += 1
            self._send(peer, messages)

    def receive(self, channel_id, peer, message) -> None:
        pass


@pytest.fixture(params=CELLS, ids=lambda cell: f"{cell[0]}-{'v6' if ':' in cell[1] else 'v4'}")
def cell(request):
    return request.param


def switch(reactors, cell) -> Switch:
    tls = TLSOptions.identity(NodeKey.generate()) if cell[0] in ("tls", "wss") else None
    started = Switch(reactors, clock=the_reactor(), config=CONFIG, tls=tls)
    started.startService()
    return started


async def listen(target: Switch, cell) -> str:
    """Listen on ``cell``'s transport; the address a dialer of the same transport uses."""
    transport, host = cell
    tcp = f"{'tcp6' if ':' in host else 'tcp'}:0:interface={host.replace(':', chr(92) + ':')}"
    listening = await target.listen(f"{transport}:{tcp}:path={PATH}" if transport in ("ws", "wss") else tcp)
    port = listening.getHost().port
    if transport in ("ws", "wss"):
        return f"{target.node_id}@{PeerAddress(target.node_id, host, port, transport, PATH).url}"
    return f"{target.node_id}@[{host}]:{port}" if ":" in host else f"{target.node_id}@{host}:{port}"


@pytest.mark.timeout(120)  # before the fix the wedge froze the loop: pytest-timeout ends the test
@pytest_twisted.ensureDeferred
async def test_the_blocksync_wedge_drops_the_hostile_peer_and_a_good_peer_still_syncs(cell):
    """The hostile peer's 17-byte status is refused with ImplausibleStatus naming both
    values, by mconn's default policy (a ReactorError of the blocksync reactor); then a
    good peer connects and every one of its 30 blocks arrives: receive returned."""
    assert len(WEDGE) == 17
    target_reactor = BlocksyncReactor(status_interval=0.2, request_timeout=1.0)
    record = Recording(target_reactor)
    target = switch([target_reactor], cell)
    hostile = switch([Raw(BLOCKSYNC_CHANNEL, [WEDGE], 1 << 20)], cell)
    good_reactor = BlocksyncReactor(BLOCKS, status_interval=0.2)
    good = switch([good_reactor], cell)
    try:
        address = await listen(target, cell)
        await bounded(hostile.dial(address))
        await until(lambda: record.reasons_for(hostile.node_id), "the hostile peer to be dropped")
        [reason] = record.reasons_for(hostile.node_id)
        assert isinstance(reason, ReactorError) and reason.reactor == "blocksync", reason
        assert "ImplausibleStatus" in str(reason) and f"base {2**62}, height {2**63 - 1}" in str(reason), str(reason)
        assert hostile.node_id not in target.peers and hostile.node_id not in target_reactor.peer_status

        await bounded(good.dial(address))
        await until(lambda: target_reactor.height == len(BLOCKS), "every block of the good peer", 20)
        assert target_reactor.blocks == BLOCKS and target_reactor.received_blocks == len(BLOCKS)
        assert record.reasons_for(good.node_id) == [] and target.reactor_errors == {"blocksync": 1}
        assert len(target_reactor.pending) <= target_reactor.max_pending
    finally:
        await stop_switches(target, hostile, good)


def flood(running: list):
    """Distinct transactions for as long as ``running`` holds True."""
    count = 0
    while running[0]:
        count += 1
        yield b"flood-%d" % count


@pytest.mark.timeout(120)
@pytest_twisted.ensureDeferred
async def test_a_mempool_flood_gets_its_share_and_honest_transactions_are_admitted(cell):
    """A peer sends distinct transactions without end into a mempool of 200 whose per-peer
    share is 20; while it floods, an honest peer's 15 transactions are all admitted. The
    flooder is charged 20, everything else it sent is refused without an error (it stays
    connected), and no seen set holds more than seen_capacity keys."""
    target_reactor = MempoolReactor(max_txs=200, max_peer_txs=20, seen_capacity=64)
    target = switch([target_reactor], cell)
    running = [True]
    flooding = Raw(MEMPOOL_CHANNEL, flood(running), 64 * 1024)
    flooder = switch([flooding], cell)
    honest_reactor = MempoolReactor()
    honest = switch([honest_reactor], cell)
    honest_txs = [b"honest-%d" % i for i in range(15)]
    try:
        address = await listen(target, cell)
        await bounded(flooder.dial(address))
        await until(lambda: target_reactor.refused_share > 100, "the flood to pass its share")
        await bounded(honest.dial(address))
        for tx in honest_txs:
            assert honest_reactor.add_tx(tx)
        await until(lambda: all(tx_key(tx) in target_reactor.txs for tx in honest_txs), "the honest transactions", 20)
        refused = target_reactor.refused_share
        await until(lambda: target_reactor.refused_share > refused, "the flood to go on")
        running[0] = False
        await until(lambda: target_reactor.refused_share == flooding.sent - 20, "every flooded transaction", 30)
        assert target_reactor.charged(flooder.node_id) == 20 and target_reactor.charged(honest.node_id) == 15
        footprint = target_reactor.footprint()
        assert footprint["txs"] == 35 and footprint["largest_seen"] <= 64 and footprint["seen_sets"] == 2, footprint
        assert target.reactor_errors == {} and flooder.node_id in target.peers
    finally:
        running[0] = False
        await stop_switches(target, flooder, honest)
