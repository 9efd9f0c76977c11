"""Peer exchange with scheme-qualified addresses (specs/pex.md section 2.1).

A node that announces channel 0x01 is answered with ``addrs_schemes`` (ws:// and wss://
addresses with their paths); one that does not (an older node) gets ``addrs`` with the
tcp addresses only, so it never sees a message type it does not know. Then real Switches
on 127.0.0.1 that listen on ws:// only find each other through a seed by PEX.
"""

from __future__ import annotations

import random

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import the_reactor, until
from mconn import ChannelDescriptor, Config, Switch
from mconn.core.address import PeerAddress, parse_address
from mconn.testing import FakePeer, MemoryNetwork
from mconn.net.websocket_endpoints import transport_kind
from reactors.pex import PexReactor
from reactors.pex_wire import PEX_CHANNEL, PexType, decode_message, encode_request

CONFIG = Config(stats_interval=0, max_connections_per_ip=64, allow_discovered_private=True)
SOURCE = "ab" * 20
WS = PeerAddress("01" * 20, "10.0.0.1", 8080, "ws", "/mconn")
WSS = PeerAddress("02" * 20, "10.0.0.2", 443, "wss", "/p2p")
TCP = PeerAddress("03" * 20, "10.0.0.3", 26656)


def solo():
    pex = PexReactor(request_interval=10.0, target_outbound=0, rng=random.Random(3))
    switch = MemoryNetwork().switch([pex], config=CONFIG)
    switch.startService()
    for address in (WS, WSS, TCP):
        assert pex.add_address(address, source=SOURCE)
    return pex


def answer(pex, peer):
    pex.add_peer(peer)
    pex.receive(PEX_CHANNEL, peer, encode_request(100))
    [message] = peer.sent_on(PEX_CHANNEL)
    return message


def test_an_asker_that_announces_channel_0x01_gets_every_address_with_its_scheme_and_path():
    """The reply to a node listing channel 0x01 is addrs_schemes (type 03) holding the
    ws and wss addresses, paths included, beside the tcp one."""
    pex = solo()
    message = answer(pex, FakePeer(channels=pex.get_channels()))
    assert message[0] == PexType.ADDRS_SCHEMES
    kind, addresses = decode_message(message)
    assert kind == PexType.ADDRS and sorted(map(str, addresses)) == sorted(map(str, (WS, WSS, TCP)))


def test_an_older_asker_gets_addrs_with_the_tcp_addresses_only():
    """A node that lists channel 0x00 but not 0x01 (one that predates schemes) is sent
    the old addrs message (type 02) with only the tcp address: nothing it cannot parse."""
    pex = solo()
    old_channels = [ChannelDescriptor(PEX_CHANNEL, priority=1, send_queue_capacity=10)]
    message = answer(pex, FakePeer(channels=old_channels))
    assert message[0] == PexType.ADDRS
    assert decode_message(message) == (PexType.ADDRS, (TCP,))


def test_a_message_on_channel_0x01_is_malformed_and_its_sender_is_closed():
    """Channel 0x01 carries nothing: a message on it closes the sender with pex malformed."""
    pex = solo()
    peer = FakePeer(channels=pex.get_channels())
    pex.add_peer(peer)
    pex.receive(0x01, peer, b"x")
    assert peer.state == "closed"
    assert "pex malformed" in str(peer.close_reason) and "channel 0x01" in str(peer.close_reason)
    assert pex.penalties == {"malformed": 1}


def test_an_announced_ws_listen_address_keeps_its_scheme_and_path():
    """A hello announcing ws://0.0.0.0:PORT/PATH is learnt as ws://REMOTE_HOST:PORT/PATH."""
    pex = solo()
    peer = FakePeer(
        channels=pex.get_channels(), remote_address="10.0.0.9:40000", listen_address="ws://0.0.0.0:8080/mconn"
    )
    pex.add_peer(peer)
    assert pex.book[peer.node_id].address == parse_address(f"{peer.node_id}@ws://10.0.0.9:8080/mconn")


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_switches_listening_on_ws_only_find_each_other_through_the_seed():
    """Three Switches on 127.0.0.1 that listen on ws:// only; n1 and n2 are given only the
    seed's ws address, learn each other's (announced ws://host:port/path) by PEX, and
    dial each other over ws."""
    clock = the_reactor()
    nodes = []
    try:
        for i in range(3):
            pex = PexReactor(request_interval=0.2, rng=random.Random(i))
            switch = Switch([pex], config=CONFIG, clock=clock)
            switch.startService()
            port = await switch.listen(f"ws:tcp:0:interface=127.0.0.1:path=/n{i}")
            nodes.append((switch, pex, port.getHost().port))
        seed, seed_port = nodes[0][0], nodes[0][2]
        for switch, _, _ in nodes[1:]:
            switch.dial(f"{seed.node_id}@ws://127.0.0.1:{seed_port}/n0", persistent=True).addErrback(lambda f: None)
        (n1, _, port1), (n2, _, _) = nodes[1], nodes[2]
        await until(
            lambda: n1.node_id in n2.peers and n2.peers[n1.node_id].state == "connected",
            "n2 and n1 to meet through PEX",
            seconds=15,
        )
        peer = n2.peers[n1.node_id]
        assert transport_kind(peer._protocol.transport) == "ws"
        learnt = {str(e.address) for _, pex, _ in nodes for e in pex.book.values()}
        assert f"{n1.node_id}@ws://127.0.0.1:{port1}/n1" in learnt
        for switch, pex, _ in nodes:
            assert pex.penalties == {}
            switch._check_invariants()
    finally:
        stops = [defer.maybeDeferred(s.stopService) for s, _, _ in nodes]
        await defer.gatherResults(stops).addTimeout(10, clock)
