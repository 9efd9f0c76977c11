"""Node info and the compatibility rule between real Switches on 127.0.0.1
(specs/handshake.md section 6, specs/reactor-api.md section 10).

Every wait is bounded (helpers.bounded / until) and every Switch started is stopped.
"""

import pytest
import pytest_twisted

from helpers import RecordingReactor, bounded, listening_switches, sleep, stop_switches, until
from mconn import ChannelDescriptor, IncompatibleNode, NodeInfo, PeerClosed, ProtocolVersion
from mconn.switch.dialer import is_not_retried

pytestmark = pytest.mark.integration

CHAIN_A = NodeInfo(
    network="chain-a",
    protocol=ProtocolVersion(p2p=8, block=11, app=3),
    version="1.2.3",
    moniker="alpha",
    other={"rpc_address": "tcp://127.0.0.1:26657", "tx_index": "on"},
)


def info(network="chain-a", block=11, moniker="beta") -> NodeInfo:
    return NodeInfo(network=network, protocol=ProtocolVersion(p2p=8, block=block, app=4), moniker=moniker)


class InfoReactor(RecordingReactor):
    """Records, at add_peer, the node info the peer already carries."""

    def __init__(self, channels=(ChannelDescriptor(0x20),)):
        super().__init__(channels)
        self.seen_at_add: list = []

    def add_peer(self, peer):
        super().add_peer(peer)
        self.seen_at_add.append(peer.node_info)


async def _nodes(*specs, **kwargs):
    """One started Switch per (node_info, channels) spec; the first listens. Returns
    (switches, reactors, port)."""
    reactors = [InfoReactor(channels) for _, channels in specs]
    switches, port = await listening_switches(reactors, [ni for ni, _ in specs], **kwargs)
    return switches, reactors, port


CH20 = (ChannelDescriptor(0x20),)


@pytest_twisted.ensureDeferred
async def test_compatible_nodes_connect_and_see_each_others_node_info():
    """Same network and block version, a common channel: the session starts, and each
    reactor sees the other's NodeInfo (every field) on peer.node_info from add_peer on."""
    beta = info(moniker="beta")
    (a, b), (ra, rb), port = await _nodes((CHAIN_A, CH20), (beta, (ChannelDescriptor(0x20), ChannelDescriptor(0x30))))
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert peer.node_info == CHAIN_A
        assert peer.node_info.other["rpc_address"] == "tcp://127.0.0.1:26657"
        await until(lambda: ra.seen_at_add, "a's add_peer")
        assert ra.seen_at_add == [beta] and rb.seen_at_add == [CHAIN_A]
        assert a.node_info == CHAIN_A and a.refusals == {} and b.refusals == {}
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_nodes_without_node_info_still_connect():
    """Two nodes without node info (hellos as before the field existed) connect; peer.node_info is None."""
    (a, b), (ra, rb), port = await _nodes((None, CH20), (None, (ChannelDescriptor(0x30),)))
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert peer.node_info is None
        await until(lambda: ra.seen_at_add, "a's add_peer")
        assert ra.seen_at_add == [None]
    finally:
        await stop_switches(a, b)


@pytest.mark.parametrize(
    "theirs, channels, reason, a_says, b_says",
    [
        (
            info(network="chain-b"),
            CH20,
            "network_mismatch",
            "on network 'chain-b'; this node is on 'chain-a'",
            "on network 'chain-a'; this node is on 'chain-b'",
        ),
        (info(block=12), CH20, "version_mismatch", "version 12; this node runs 11", "version 11; this node runs 12"),
        (info(), (ChannelDescriptor(0x30),), "no_common_channel", "ours 0x20, theirs 0x30", "ours 0x30, theirs 0x20"),
    ],
    ids=["another network", "another block version", "no common channel"],
)
@pytest_twisted.ensureDeferred
async def test_incompatible_peer_is_refused_on_both_sides(telemetry, theirs, channels, reason, a_says, b_says):
    """An incompatible node is refused at the handshake by both sides with the same
    reason: the dial fails with IncompatibleNode, both Switches count and log the
    refusal naming both values, and no reactor ever sees the peer."""
    (a, b), (ra, rb), port = await _nodes((CHAIN_A, CH20), (theirs, channels))
    try:
        with pytest.raises(IncompatibleNode) as caught:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert caught.value.reason == reason
        assert b_says in str(caught.value) and a.node_id in str(caught.value)
        assert is_not_retried(caught.value)
        await until(lambda: a.refusals.get(reason) == 1, f"a's {reason} refusal")
        assert b.refusals == {reason: 1}
        events = {e["node_id"]: e for e in telemetry.named("peer_rejected")}
        assert set(events) == {a.node_id, b.node_id}
        for node, other, says in ((a, b, a_says), (b, a, b_says)):
            assert events[node.node_id]["reason"] == reason and events[node.node_id]["peer_id"] == other.node_id
            assert says in events[node.node_id]["message"]
        assert ra.calls == [] and rb.calls == [] and a.peers == {} and b.peers == {}
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_a_node_without_node_info_is_refused_by_one_that_requires_it(telemetry):
    """A listener with node info refuses a dialer without any (node_info_missing); the
    dialer, requiring nothing, learns it from the close packet (PeerClosed with the code)."""
    (a, b), (ra, rb), port = await _nodes((CHAIN_A, CH20), (None, CH20))
    try:
        with pytest.raises(PeerClosed) as caught:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert caught.value.code == "node_info_missing"
        assert "sent no node info" in caught.value.text and "'chain-a'" in caught.value.text
        assert is_not_retried(caught.value)
        assert a.refusals == {"node_info_missing": 1} and b.refusals == {}
        assert ra.calls == [] and rb.calls == []
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_persistent_dialer_does_not_retry_an_incompatible_node(telemetry):
    """A persistent dial of a node on another network is attempted once: the address is
    banned (dial_attempt not_retried) and the listener sees no second connection."""
    (a, b), _, port = await _nodes(
        (CHAIN_A, CH20), (info(network="chain-b"), CH20), reconnect_delay=lambda attempt: 0.02
    )
    try:
        with pytest.raises(Exception) as caught:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}", persistent=True))
        assert "chain-b" in str(caught.value) or "banned" in str(caught.value)
        await sleep(0.3)  # fifteen reconnect delays: a retry would have come
        attempts = [e for e in telemetry.named("dial_attempt") if e["node_id"] == b.node_id]
        assert [e["result"] for e in attempts] == ["not_retried"], attempts
        assert a.refusals == {"network_mismatch": 1}
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_a_dialer_with_node_info_refuses_a_listener_without(telemetry):
    """A dialer with node info refuses a listener without any (IncompatibleNode
    node_info_missing, not retried). The listener, requiring nothing, may have started
    the session: if its reactor saw add_peer, remove_peer follows with PeerClosed naming
    the code, and no session is left."""
    (a, b), (ra, rb), port = await _nodes((None, CH20), (CHAIN_A, CH20))
    try:
        with pytest.raises(IncompatibleNode) as caught:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert caught.value.reason == "node_info_missing" and is_not_retried(caught.value)
        assert b.refusals == {"node_info_missing": 1} and a.refusals == {} and rb.calls == []
        await until(lambda: not a.peers and len(ra.calls) in (0, 2), "a's side to settle")
        if ra.calls:
            assert [c[0] for c in ra.calls] == ["add_peer", "remove_peer"]
            reason = ra.calls[1][2]
            assert isinstance(reason, PeerClosed) and reason.code == "node_info_missing"
    finally:
        await stop_switches(a, b)
