"""Peer exchange (specs/pex.md, reactors/pex.py and reactors/pex_wire.py).

* The golden vectors of specs/vectors/pex.json, and a hypothesis fuzz of the decoder.
* The rules, one at a time, on a Switch of the in-memory network (``task.Clock`` time)
  with FakePeers fed to the reactor: answering, rate limits both ways, bad replies,
  the book's caps, dial backoff, timers.
* Real Switches on the in-memory network: a ten-node fleet whose rounds are counted
  (hostile peers and the book under made-up sources are in test_pex_attacks.py).
* Ten real Switches on 127.0.0.1 (pytest-twisted): each knows only the seed; all end up
  connected to all. Three ``twistd mconn`` processes likewise.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import random
import signal

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer, task

from helpers import RecordingReactor, the_reactor
from mconn import Config, Switch
from mconn.core.address import PeerAddress, parse_address
from mconn.testing import FakePeer, MemoryNetwork
from operators.twistd_nodes import LOOPBACK, Node
from reactors.pex import PexReactor
from reactors.pex_wire import (
    MAX_WIRE_ADDRESSES,
    PEX_CHANNEL,
    PexMisbehaved,
    PexType,
    decode_message,
    encode_addrs,
    encode_request,
    max_message_bytes,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "specs" / "vectors" / "pex.json").read_text())
CONFIG = Config(stats_interval=0, max_connections_per_ip=64, allow_discovered_private=True)
INTERVAL = 10.0


def _ids(vectors):
    return [v["name"] for v in vectors]


def fake_address(i: int, host: str | None = None, port: int = 26656) -> PeerAddress:
    node_id = f"{i + 1:040x}"
    return PeerAddress(node_id, host or f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", port)


# -- golden vectors (specs/pex.md section 2) -------------------------------------------


def _expected(decoded: dict):
    if decoded["type"] == "request":
        return PexType.REQUEST, decoded["max_addresses"]
    return PexType.ADDRS, tuple(parse_address(a) for a in decoded["addresses"])


def test_vector_names_are_unique_and_limits_match_the_code():
    """The PEX vector names are unique, and the limits in the vectors file are the code's own."""
    names = _ids(VECTORS["valid"]) + _ids(VECTORS["invalid"])
    assert len(names) == len(set(names))
    limits = VECTORS["limits"]
    assert limits["max_wire_addresses"] == MAX_WIRE_ADDRESSES
    assert (
        limits["recv_message_capacity_for_100"]
        == max_message_bytes(100)
        == PexReactor().get_channels()[0].recv_message_capacity
    )


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=_ids(VECTORS["valid"]))
def test_valid_vector_decodes_to_its_values_and_encodes_to_its_bytes(vector):
    """Each valid PEX vector decodes to its values and encodes back to its exact bytes."""
    data = bytes.fromhex(vector["hex"])
    kind, value = _expected(vector["decoded"])
    assert decode_message(data) == (kind, value)
    assert (encode_request(value) if kind == PexType.REQUEST else encode_addrs(value)) == data


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=_ids(VECTORS["invalid"]))
def test_invalid_vector_is_refused_with_its_reason(vector):
    """Each invalid PEX vector is refused with PexMisbehaved carrying the vector's reason."""
    with pytest.raises(PexMisbehaved) as caught:
        decode_message(bytes.fromhex(vector["hex"]))
    assert caught.value.reason == vector["reason"]
    assert str(caught.value).startswith(f"pex {vector['reason']}: ")


def test_a_message_over_the_limit_is_refused_before_it_is_parsed():
    """A PEX message over the size limit is refused as oversized before any parsing."""
    with pytest.raises(PexMisbehaved, match=r"oversized: a PEX message of 11 bytes; the limit is 10"):
        decode_message(b"\x03" * 11, limit=10)  # would be malformed if parsed


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_or_fail_with_pex_misbehaved(data):
    """Any bytes either decode or fail with PexMisbehaved and one of its known reasons; nothing else escapes."""
    try:
        decode_message(data, limit=200)
    except PexMisbehaved as e:
        assert e.reason in ("oversized", "malformed", "unroutable_address")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1 << 20), unique=True, max_size=MAX_WIRE_ADDRESSES), st.integers(1, 65535))
def test_address_lists_round_trip(ids, port):
    """Any list of addresses up to the wire maximum encodes and decodes back to itself."""
    addresses = tuple(fake_address(i, port=port) for i in ids)
    assert decode_message(encode_addrs(addresses)) == (PexType.ADDRS, addresses)


# -- one reactor on a clock, fed by FakePeers -------------------------------------------


class Solo:
    """One started Switch with a PexReactor on the in-memory network."""

    def __init__(self, **kwargs):
        kwargs.setdefault("request_interval", INTERVAL)
        kwargs.setdefault("rng", random.Random(7))
        self.network = MemoryNetwork()
        self.pex = PexReactor(**kwargs)
        self.switch = self.network.switch([self.pex], config=CONFIG)
        self.switch.startService()

    def peer(self, *, outbound=False, **kwargs):
        peer = FakePeer(channels=self.pex.get_channels(), is_outbound=outbound, **kwargs)
        self.pex.add_peer(peer)
        return peer

    def feed(self, peer, message: bytes):
        self.pex.receive(PEX_CHANNEL, peer, message)

    def run(self, seconds):
        self.network.run(seconds)

    def sources(self, source):
        return [e for e in self.pex.book.values() if e.source == source]


def replies(peer):
    return [decode_message(m)[1] for m in peer.sent_on(PEX_CHANNEL) if m[0] == PexType.ADDRS]


def requests(peer):
    return [m for m in peer.sent_on(PEX_CHANNEL) if m[0] == PexType.REQUEST]


def test_pex_needs_no_arguments_and_owns_channel_0x00():
    """A PexReactor needs no arguments and owns channel 0x00, priority 1, sized for 100 addresses,
    and channel 0x01, which carries nothing (it says the node reads addrs_schemes)."""
    pex = PexReactor()
    channel, schemes = pex.get_channels()
    assert (channel.id, channel.priority, channel.recv_message_capacity) == (0x00, 1, max_message_bytes(100))
    assert (schemes.id, schemes.recv_message_capacity) == (0x01, 1)


def test_a_request_gets_known_addresses_but_never_the_askers_own_and_no_more_than_asked():
    """A request is answered with known addresses, never the asker's own and never more than it asked for."""
    solo = Solo(target_outbound=0)
    asker = FakePeer(channels=solo.pex.get_channels())
    for i in range(3):
        solo.pex.add_address(fake_address(i), source="ab" * 20)
    solo.pex.add_address(PeerAddress(asker.node_id, "10.9.9.9", 1), source="ab" * 20)
    solo.pex.add_peer(asker)
    solo.feed(asker, encode_request(100))
    [reply] = replies(asker)
    assert sorted(str(a) for a in reply) == sorted(str(fake_address(i)) for i in range(3))
    solo.run(INTERVAL)
    solo.feed(asker, encode_request(1))
    assert len(replies(asker)[1]) == 1
    assert solo.pex.counters["replies_sent"] == 2 and asker.state == "connected"


def test_a_request_within_min_request_interval_is_a_flood_and_the_node_is_banned():
    """A second request sooner than a third of the interval is a flood: the peer is closed and banned, and
    then ignored when it returns."""
    solo = Solo(target_outbound=0)
    polite, flooder = solo.peer(), solo.peer()
    for peer in (polite, flooder):
        solo.feed(peer, encode_request(10))
    solo.run(INTERVAL / 3 + 0.01)
    solo.feed(polite, encode_request(10))  # the limit is request_interval / 3
    solo.run(1.0)
    solo.feed(flooder, encode_request(10))  # 4.34 s after its first: answered
    solo.feed(flooder, encode_request(10))  # at once: a flood
    assert polite.state == "connected" and len(replies(polite)) == 2
    assert flooder.state == "closed" and len(replies(flooder)) == 2
    assert "pex request_flood: a request 0.000s after the previous one; at most one per" in str(flooder.close_reason)
    assert solo.pex.penalties == {"request_flood": 1} and solo.pex.counters["requests_dropped"] == 1
    assert flooder.node_id in solo.pex.banned
    # The banned node comes back: its PEX messages are ignored, its address is not kept.
    solo.pex.remove_peer(flooder, flooder.close_reason)
    again = FakePeer(flooder.node_id, channels=solo.pex.get_channels(), listen_address="10.1.1.1:26656")
    solo.pex.add_peer(again)
    solo.run(INTERVAL)
    solo.feed(again, encode_request(10))
    assert again.sent == [] and again.state == "connected"
    assert flooder.node_id not in solo.pex.book and solo.pex.counters["ignored"] == 2


def test_an_unsolicited_reply_is_dropped_and_its_sender_closed():
    """A reply we did not ask for is dropped unbooked, and its sender is closed with unsolicited_reply."""
    solo = Solo(target_outbound=0)
    sender = solo.peer()  # inbound: never asked
    solo.feed(sender, encode_addrs([fake_address(1)]))
    assert sender.state == "closed"
    assert "pex unsolicited_reply: a reply of 1 addresses we did not ask for" in str(sender.close_reason)
    assert fake_address(1).node_id not in solo.pex.book
    assert solo.pex.counters["replies_dropped"] == 1 and solo.pex.penalties == {"unsolicited_reply": 1}


def test_a_second_reply_to_one_request_is_unsolicited():
    """Only the first reply to a request is booked; a second one is unsolicited and closes the peer."""
    solo = Solo(target_outbound=0)
    peer = solo.peer(outbound=True)
    assert len(requests(peer)) == 1  # a new outbound peer is asked at once
    solo.feed(peer, encode_addrs([fake_address(1)]))
    solo.feed(peer, encode_addrs([fake_address(2)]))
    assert fake_address(1).node_id in solo.pex.book and fake_address(2).node_id not in solo.pex.book
    assert solo.pex.penalties == {"unsolicited_reply": 1} and peer.state == "closed"


def _bad_replies(limit):
    good = fake_address(1)
    return {
        "too_many_addresses": encode_addrs([good] + [fake_address(i) for i in range(2, 4)]),
        "oversized": b"\x02" + b"\x00" * limit,
        "malformed": encode_addrs([good])[:-1],
        "unroutable_address": encode_addrs([good, fake_address(2, host="0.0.0.0")]),
    }


@pytest.mark.parametrize("reason", ["too_many_addresses", "oversized", "malformed", "unroutable_address"])
def test_a_bad_reply_is_dropped_whole_and_its_sender_closed_with_the_reason(reason):
    """A bad reply is dropped whole, good addresses in it included, and its sender is closed and banned with
    the specific reason."""
    solo = Solo(target_outbound=0, max_addresses=2)
    peer = solo.peer(outbound=True)
    assert decode_message(requests(peer)[0]) == (PexType.REQUEST, 2)
    solo.feed(peer, _bad_replies(solo.pex.max_message_bytes)[reason])
    assert peer.state == "closed" and f"pex {reason}: " in str(peer.close_reason)
    assert fake_address(1).node_id not in solo.pex.book  # the good address in it is dropped too
    assert solo.pex.penalties == {reason: 1} and solo.pex.counters["replies_dropped"] == 1
    assert peer.node_id in solo.pex.banned


def test_the_sender_asks_a_peer_only_once_it_answered_and_never_within_half_an_interval():
    """A peer is asked again only after it answered, and never sooner than half a request interval."""
    solo = Solo(target_outbound=0)
    mute = solo.peer(outbound=True)
    solo.run(10 * INTERVAL)
    assert len(requests(mute)) == 1 and solo.pex.rounds >= 9  # unanswered: never asked again

    chatty = solo.peer(outbound=True)
    asked_at = []
    for _ in range(200):  # answer every request at once; look every 0.5 s for 100 s
        if len(requests(chatty)) > len(asked_at):
            asked_at.append(solo.network.clock.seconds())
            solo.feed(chatty, encode_addrs([]))
        solo.run(0.5)
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert len(asked_at) >= 5 and min(gaps) >= INTERVAL / 2
    assert chatty.state == "connected" and solo.pex.penalties == {}


def test_one_source_cannot_take_more_than_per_source_cap():
    """One source holds at most per_source_cap book entries however much it sends; another source still
    gets its own share."""
    solo = Solo(target_outbound=0, per_source_cap=5, max_addresses=20)
    hostile = solo.peer(outbound=True)
    fresh = iter(range(10_000))
    answered = 0
    for _ in range(40):  # replies of 20 new addresses each, each to a request
        if len(requests(hostile)) > answered:
            answered += 1
            solo.feed(hostile, encode_addrs([fake_address(next(fresh)) for _ in range(20)]))
        solo.run(INTERVAL / 2)
    assert answered >= 10 and solo.pex.counters["replies_received"] == answered
    assert len(solo.sources(hostile.node_id)) == 5
    assert solo.pex.counters["addresses_capped"] == 20 * answered - 5 and hostile.state == "connected"
    honest = solo.peer(outbound=True, remote_address="10.7.0.1:26656")
    solo.feed(honest, encode_addrs([fake_address(20_000 + i) for i in range(20)]))
    assert len(solo.sources(honest.node_id)) == 5
    solo.pex.address_book.check_invariants()


def test_a_peer_announcing_an_unspecified_host_is_booked_at_the_host_it_came_from():
    """A peer announcing 0.0.0.0 is booked at the host it connected from, with its announced port."""
    solo = Solo(target_outbound=0)
    peer = solo.peer(listen_address="0.0.0.0:26656", remote_address="10.0.0.7:5555")
    entry = solo.pex.book[peer.node_id]
    assert str(entry.address) == f"{peer.node_id}@10.0.0.7:26656" and entry.source == peer.node_id


def test_our_own_address_is_never_booked_and_routable_only_skips_private_hosts():
    """Our own address is never booked, and routable_only skips private hosts."""
    solo = Solo(target_outbound=0, routable_only=True)
    assert not solo.pex.add_address(PeerAddress(solo.switch.node_id, "8.8.8.8", 1), source="ab" * 20)
    assert not solo.pex.add_address(fake_address(1, host="192.168.1.1"), source="ab" * 20)
    assert solo.pex.add_address(fake_address(2, host="8.8.4.4"), source="ab" * 20)
    assert list(solo.pex.book) == [fake_address(2).node_id] and solo.pex.counters["addresses_skipped"] == 1


# -- dialing on the in-memory network -------------------------------------------------


def pex_node(network, **kwargs):
    kwargs.setdefault("request_interval", 1.0)
    kwargs.setdefault("rng", random.Random(len(network.links) + 1))
    pex, recorder = PexReactor(**kwargs), RecordingReactor()
    switch = network.switch([pex, recorder], config=CONFIG)
    switch.startService()
    switch.listen("tcp:26656")
    return switch, pex, recorder


def address_of(network, switch, port=26656):
    return f"{switch.node_id}@{network.host_of(switch)}:{port}"


def test_a_refusing_address_backs_off_doubling_then_is_forgotten():
    """A booked address that refuses dials is retried after doubling delays, then forgotten after
    max_dial_failures."""
    network = MemoryNetwork()
    a, pex, _ = pex_node(network, dial_backoff=2.0, max_dial_failures=3)
    b, _, _ = pex_node(network)
    dead = PeerAddress(b.node_id, network.host_of(b), 9)  # b's host, a port nobody listens on
    pex.add_address(dead, source="ab" * 20)
    pex.start()
    backoffs = []
    for _ in range(40):
        network.run(0.25)
        entry = pex.book.get(dead.node_id)
        if entry is None:
            break
        if entry.failures > len(backoffs):
            backoffs.append(entry.next_dial - network.clock.seconds())
    assert dead.node_id not in pex.book
    assert [round(b) for b in backoffs] == [2, 4]  # then the third failure forgets it
    assert (
        pex.counters["dials"] == 3 and pex.counters["dial_failures"] == 3 and pex.counters["addresses_forgotten"] == 1
    )


def test_connected_peers_and_ourselves_are_not_dialed_and_pools_get_discovered_addresses():
    """PEX dials neither connected peers nor ourselves, and a connected peer's newly heard address joins its
    dial pool as discovered."""
    network = MemoryNetwork()
    a, pex, _ = pex_node(network)
    seed, _, _ = pex_node(network)
    got = []
    a.dial(address_of(network, seed), persistent=True).addBoth(got.append)
    network.run(5.0)
    assert got and got[0].node_id == seed.node_id
    assert not pex.add_address(PeerAddress(a.node_id, "10.0.0.1", 26656), source=seed.node_id)
    # Another address of the seed, heard from someone: the persistent dial's pool learns it.
    pex.add_address(PeerAddress(seed.node_id, "10.0.0.99", 26656), source="ab" * 20)
    pool = a.address_pool(seed.node_id)
    assert any(str(s.address) == f"{seed.node_id}@10.0.0.99:26656" and s.discovered for s in pool)
    network.run(10.0)
    assert pex.counters["dials"] == 0 and len(network.links) == 1 and pex.rounds >= 9


def test_ignore_discovered_addresses_keeps_pools_as_configured():
    """With ignore_discovered_addresses, a heard address does not join a peer's dial pool."""
    network = MemoryNetwork()
    pex = PexReactor(request_interval=1.0)
    a = network.switch([pex], config=CONFIG.replace(ignore_discovered_addresses=True))
    a.startService()
    seed, _, _ = pex_node(network)
    a.dial(address_of(network, seed), persistent=True)
    network.run(2.0)
    pex.add_address(PeerAddress(seed.node_id, "10.0.0.99", 26656), source="ab" * 20)
    assert [str(s.address) for s in a.address_pool(seed.node_id)] == [address_of(network, seed)]


def test_stopping_the_switch_stops_the_rounds():
    """Stopping the Switch stops PEX rounds and cancels its timer."""
    network = MemoryNetwork()
    a, pex, _ = pex_node(network)
    b, _, _ = pex_node(network)
    a.dial(address_of(network, b))
    network.run(3.0)
    rounds = pex.rounds
    assert rounds >= 2 and pex._timer is not None
    a.stopService()
    network.run(10.0)
    assert pex.rounds == rounds and pex._timer is None


# -- ten nodes that each know only the seed ----------------------------------------------


def test_ten_nodes_knowing_only_the_seed_form_a_full_mesh_within_three_rounds():
    """Ten nodes that know only the seed form a full mesh within three PEX rounds, with no penalty (with a
    dial burst of 10, enough for every node to dial all the others at once)."""
    network = MemoryNetwork()
    nodes = [pex_node(network, request_interval=1.0, rng=random.Random(i), dial_burst=10) for i in range(10)]
    seed = nodes[0][0]
    for switch, _, _ in nodes[1:]:
        switch.dial(address_of(network, seed), persistent=True)
    everyone = {s.node_id for s, _, _ in nodes}
    for _ in range(30):
        network.run(0.1)
        if all(set(s.peers) == everyone - {s.node_id} for s, _, _ in nodes):
            break
    for switch, pex, _ in nodes:
        assert set(switch.peers) == everyone - {switch.node_id}, f"{switch.node_id} has {len(switch.peers)} peers"
        assert set(pex.book) == everyone - {switch.node_id}
        assert pex.rounds <= 3 and pex.penalties == {}
        switch._check_invariants()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_ten_real_switches_that_each_know_only_the_seed_all_connect_to_each_other():
    """Real TCP on 127.0.0.1: node 0 is the seed, nodes 1-9 are given only its address
    (as ``--peer``). Full mesh: every node ends with a session with each of the other 9."""
    clock = the_reactor()
    nodes, switches = [], []
    try:
        for i in range(10):
            pex = PexReactor(request_interval=0.3, rng=random.Random(i))
            switch = Switch([pex], config=CONFIG, clock=clock)
            switch.startService()
            switches.append(switch)
            port = await switch.listen("tcp:0:interface=127.0.0.1")
            nodes.append((switch, pex, port.getHost().port))
        seed_address = f"{nodes[0][0].node_id}@127.0.0.1:{nodes[0][2]}"
        for switch, _, _ in nodes[1:]:
            switch.dial(seed_address, persistent=True).addErrback(lambda f: None)
        everyone = {s.node_id for s, _, _ in nodes}

        def meshed():
            return all(
                set(s.peers) == everyone - {s.node_id} and all(p.state == "connected" for p in s.peers.values())
                for s, _, _ in nodes
            )

        for _ in range(400):  # at most 20 s
            if meshed():
                break
            await task.deferLater(clock, 0.05, lambda: None)
        for switch, pex, _ in nodes:
            assert set(switch.peers) == everyone - {switch.node_id}, f"{switch.node_id}: {len(switch.peers)} peers"
            assert pex.penalties == {}
            switch._check_invariants()
    finally:
        stops = [defer.maybeDeferred(s.stopService) for s in switches]
        await defer.gatherResults(stops).addTimeout(10, clock)


@pytest.mark.integration
def test_twistd_nodes_given_only_the_seed_find_each_other(tmp_path):
    """Three ``twistd -n mconn`` processes with ``--reactor reactors.pex:PexReactor``:
    n1 and n2 are given only ``--peer SEED``; n2 learns n1 from the seed and dials it."""
    pex = ("--reactor", "reactors.pex:PexReactor")
    started = []
    try:
        seed = Node(tmp_path, "seed").start("--listen", LOOPBACK, *pex)
        started.append(seed)
        seed_address = seed.address
        n1 = Node(tmp_path, "n1").start("--listen", LOOPBACK, *pex, "--peer", seed_address)
        started.append(n1)
        n1_id = n1.wait_event("listening")["node_id"]
        seed.wait_event("session_started", lambda e: e["peer_id"] == n1_id)
        n2 = Node(tmp_path, "n2").start("--listen", LOOPBACK, *pex, "--peer", seed_address)
        started.append(n2)
        n2_id = n2.wait_event("listening")["node_id"]
        n2.wait_event("session_started", lambda e: e["peer_id"] == n1_id and e["direction"] == "outbound")
        n1.wait_event("session_started", lambda e: e["peer_id"] == n2_id and e["direction"] == "inbound")
        for node in started:
            assert node.terminate() == -signal.SIGTERM
            assert "Traceback" not in node.log() and "pex penalises" not in node.log(), node.log()
    finally:
        for node in started:
            node.kill()
