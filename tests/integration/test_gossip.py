"""Two CometBFT reactors ported to mconn (reactors/mempool.py, reactors/blocksync.py) on
four real Switches on 127.0.0.1, in a line, each link through a FaultProxy that resets it
while transactions gossip and blocks sync (specs/reactor-api.md section 9).

Every node ends with every transaction and every block; a peer sending a garbage
transaction is kept (as in CometBFT: only counted), one sending a block nobody asked it
for is dropped while the others carry on; a node of another network is refused at the
handshake (node info, specs/handshake.md section 6).
"""

import itertools

import pytest
import pytest_twisted
from twisted.internet import defer

from faultproxy import FaultProxy
from helpers import bounded, sleep, the_reactor, until
from mconn import Config, IncompatibleNode, NodeInfo, PeerClosed, ProtocolVersion, Switch
from reactors.blocksync import BLOCKSYNC_CHANNEL, BlocksyncReactor, BlocksyncType, encode
from reactors.mempool import MEMPOOL_CHANNEL, MempoolReactor

pytestmark = pytest.mark.integration

NODES = 4
BLOCKS = {h: b"block-%d:" % h + bytes([h % 251]) * 3000 for h in range(1, 41)}
TXS_PER_NODE = 30
CONFIG = Config(stats_interval=0, resume_grace=10.0, max_reconnect_delay=0.2, send_timeout=5.0)
CHAIN = NodeInfo(network="gossip-chain", protocol=ProtocolVersion(p2p=8, block=11))


def check_tx(tx: bytes) -> None:
    if not tx.startswith(b"tx-"):
        raise ValueError(f"not a transaction of this chain: {tx[:16]!r}")


class Node:
    """A Switch with a mempool and a blocksync reactor, listening on 127.0.0.1."""

    def __init__(self, blocks=None, node_info=CHAIN):
        self.mempool = MempoolReactor(check_tx=check_tx)
        self.blocksync = BlocksyncReactor(blocks, status_interval=0.2, request_timeout=1.0)
        self.switch = Switch([self.mempool, self.blocksync], clock=the_reactor(), config=CONFIG, node_info=node_info)
        self.removed = []

        remove_peer = self.mempool.remove_peer

        def recording(peer, reason):
            self.removed.append((peer.node_id, reason))
            remove_peer(peer, reason)

        self.mempool.remove_peer = recording

    async def start(self):
        self.switch.startService()
        self.port = (await self.switch.listen("tcp:0:interface=127.0.0.1")).getHost().port
        return self


async def line_of_nodes():
    """n0 (with every block) <- n1 <- n2 <- n3, each dialing its left neighbour persistently
    through a FaultProxy."""
    nodes = [await Node(BLOCKS if i == 0 else None).start() for i in range(NODES)]
    proxies = []
    for left, right in itertools.pairwise(nodes):
        proxy = FaultProxy("127.0.0.1", left.port)
        port = await proxy.start()
        proxies.append(proxy)
        await bounded(right.switch.dial(f"{left.switch.node_id}@127.0.0.1:{port}", persistent=True))
    return nodes, proxies


async def stop_all(nodes, proxies):
    for proxy in proxies:
        await proxy.stop()
    await bounded(defer.gatherResults([defer.maybeDeferred(n.switch.stopService) for n in nodes]))


@pytest_twisted.ensureDeferred
async def test_every_node_ends_with_every_transaction_and_block_across_resets():
    """Transactions added at each of four nodes in a line reach all four, exactly the same
    set everywhere, and the 40 blocks of n0 reach n3 three hops away, while every link is
    reset three times; the sessions resume (no remove_peer) and the reactors stop last."""
    nodes, proxies = await line_of_nodes()
    try:
        expected = set()
        resets = 0
        for round_ in range(3):
            for i, node in enumerate(nodes):
                for k in range(TXS_PER_NODE // 3):
                    tx = b"tx-%d-%d-%d:" % (i, round_, k) + b"p" * 200
                    assert node.mempool.add_tx(tx)
                    expected.add(tx)
            await sleep(0.05)
            resets += sum(proxy.reset_all() for proxy in proxies)
        assert resets >= 3, "no link was up to reset: the test proved nothing"
        await until(lambda: all(len(n.mempool.txs) == len(expected) for n in nodes), "every transaction everywhere", 20)
        await until(lambda: all(n.blocksync.height == len(BLOCKS) for n in nodes), "every block everywhere", 20)
        for node in nodes:
            assert set(node.mempool.txs.values()) == expected
            assert node.blocksync.blocks == BLOCKS
            assert node.removed == [] and node.switch.reactor_errors == {}
            node.switch._check_invariants()
        assert sum(p.resumes for n in nodes for p in n.switch.peers.values()) >= 2
    finally:
        await stop_all(nodes, proxies)
    assert all(n.blocksync._loop is None for n in nodes)  # stop_reactor ran


@pytest_twisted.ensureDeferred
async def test_a_peer_sending_garbage_is_dropped_and_the_others_carry_on():
    """A peer whose transaction fails check_tx is kept, as in CometBFT (the transaction is
    counted and logged, the peer's next valid one is admitted); one that sends a block
    nobody asked it for is dropped by blocksync's stop_for_error; a node of another
    network is refused at the handshake (no reactor call); the honest nodes keep their
    sessions and gossip."""
    nodes, proxies = await line_of_nodes()
    evil = await Node().start()
    stranger = await Node(
        node_info=NodeInfo(network="another-chain", protocol=ProtocolVersion(p2p=8, block=11))
    ).start()
    try:
        target = nodes[0]
        bad_peer = await bounded(evil.switch.dial(f"{target.switch.node_id}@127.0.0.1:{target.port}"))
        assert bad_peer.try_send(MEMPOOL_CHANNEL, b"garbage that is no transaction")
        assert bad_peer.try_send(MEMPOOL_CHANNEL, b"tx-from-the-garbage-sender")
        await until(lambda: tx_in(target, b"tx-from-the-garbage-sender"), "its valid transaction to be admitted")
        assert target.mempool.invalid_txs == 1 and not tx_in(target, b"garbage that is no transaction")
        assert evil.removed == [] and target.removed == [] and target.switch.reactor_errors == {}
        assert target.switch.peers[evil.switch.node_id] is not None

        block = encode(BlocksyncType.BLOCK_RESPONSE, height=7, block=b"forged")
        assert bad_peer.try_send(BLOCKSYNC_CHANNEL, block)
        await until(lambda: len(evil.removed) == 1, "the forger to be dropped")
        assert "sent block 7, which we did not ask it for" in str(evil.removed[0][1])
        assert isinstance(evil.removed[0][1], PeerClosed) and evil.removed[0][1].code == "reactor_error"
        assert target.blocksync.blocks[7] == BLOCKS[7]

        with pytest.raises(IncompatibleNode) as refused:
            await bounded(stranger.switch.dial(f"{target.switch.node_id}@127.0.0.1:{target.port}"))
        assert refused.value.reason == "network_mismatch" and "another-chain" in str(refused.value)
        await until(lambda: target.switch.refusals.get("network_mismatch") == 1, "the listener's refusal")
        assert stranger.removed == [] and stranger.switch.peers == {}
        assert stranger.switch.node_id not in [node_id for node_id, _ in target.removed]  # no reactor saw it

        assert nodes[3].mempool.add_tx(b"tx-after")
        await until(lambda: all(tx_in(n, b"tx-after") for n in nodes), "gossip to go on")
        assert all(n.removed == [] for n in nodes[1:]) and evil.switch.node_id not in target.switch.peers
    finally:
        await stop_all(nodes + [evil, stranger], proxies)


def tx_in(node, tx):
    return tx in node.mempool.txs.values()
