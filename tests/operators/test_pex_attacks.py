"""Attacks on the addresses a node learns, on real sockets (specs/pex.md section 3.5).

Each test is an attack that worked before the address book of reactors/addrbook.py and
the rules of learnt addresses: made-up identities filling the book with targets of the
attacker's choosing (the node's own listener, the cloud metadata service, a private SSH
port, a scan of loopback ports) that the node then dialed; made-up identities growing
the ban table without bound; and a persistent peer's announced address steering its
re-dials past the proxy the user configured. Also: the book's buckets under made-up
sources, and hostile PEX peers (an address flood, unsolicited replies, a request flood)
between real Switches on the in-memory network. Real Switches on 127.0.0.1 (pytest-twisted)
and raw sockets that speak mconn bytes where the attacker is not a Switch; the rules one
at a time on the in-memory network with ``task.Clock`` time first. The victim's
dials are recorded where the Switch makes its client endpoint, and refused there without
touching the network, so no test ever sends a packet beyond 127.0.0.1. Every wait is
bounded; everything started is stopped.
"""

from __future__ import annotations

import random

import pytest
import pytest_twisted
from twisted.internet import defer, endpoints, task

from helpers import RawPeer, RecordingReactor, hello_packet, msg_packet, record_dials, sleep, the_reactor, until
from mconn import Config, PeerClosed, Switch
from mconn.core.address import PeerAddress
from mconn.ops.faultproxy import FaultProxy
from mconn.testing import FakePeer, MemoryNetwork
from operators.test_pex import CONFIG as MEMORY_CONFIG
from operators.test_pex import Solo, address_of, fake_address, pex_node
from reactors.addrbook import network_group
from reactors.pex import PexReactor
from reactors.pex_wire import PEX_CHANNEL, encode_addrs, encode_request

#: Made-up identities of one attacker (the report's figure).
IDENTITIES = 300
#: Raw connections open at once (below the per-IP and pending-handshake limits).
CONCURRENCY = 4
#: The PEX nodes end a broken session at once (no resume), so that the identities' sessions end as they
#: hang up instead of holding inbound slots while suspended.
PEX_CONFIG = Config(stats_interval=0, resume_grace=0)
#: The nodes of the persistent-peer tests resume broken sessions.
CONFIG = Config(stats_interval=0, resume_grace=30.0)


async def pex_switch(**pex_kwargs):
    pex_kwargs.setdefault("request_interval", 0.25)
    pex = PexReactor(rng=random.Random(1), **pex_kwargs)
    switch = Switch([pex], config=PEX_CONFIG, clock=the_reactor())
    switch.startService()
    port = (await switch.listen("tcp:0:interface=127.0.0.1")).getHost().port
    return switch, pex, port


async def sybil(port: int, greeting: bytes, done) -> RawPeer:
    """One made-up identity: connect, send ``greeting``, wait until ``done()``, hang up."""
    endpoint = endpoints.TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
    raw = await endpoints.connectProtocol(endpoint, RawPeer(greeting))
    try:
        await until(lambda: done(raw), "the victim to take the identity in", seconds=5.0, step=0.005)
    finally:
        raw.transport.abortConnection()
    return raw


async def swarm(port: int, greetings, done) -> None:
    """Run the identities of ``greetings`` (node id, bytes), CONCURRENCY at a time."""
    pending = list(greetings)

    async def worker():
        while pending:
            node_id, greeting = pending.pop()
            await sybil(port, greeting, lambda raw, n=node_id: done(n, raw))

    await defer.gatherResults([defer.ensureDeferred(worker()) for _ in range(CONCURRENCY)])


async def stop(*switches) -> None:
    await defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]).addTimeout(10, the_reactor())


# -- the rules one at a time, on the in-memory network ------------------------------------------


def memory_pex(config, **kwargs):
    """A started Switch with a PexReactor on the in-memory network, listening on 10.0.0.1:26656."""
    network = MemoryNetwork()
    pex = PexReactor(request_interval=1.0, rng=random.Random(3), **kwargs)
    switch = network.switch([pex], config=config)
    switch.startService()
    switch.listen("tcp:26656")
    return network, switch, pex


def test_learnt_addresses_are_skipped_by_the_rule_they_break():
    """Addresses a peer announces or lists in a solicited reply are skipped, unpenalised, when they name a
    forbidden host (metadata, link-local), a DNS name, a private host (allow_discovered_private off), or a
    loopback host told over a connection that is not loopback; a public one is kept."""
    network, switch, pex = memory_pex(Config(stats_interval=0))
    stranger = FakePeer(channels=pex.get_channels(), is_outbound=True, remote_address="9.9.9.9:26656")
    pex.add_peer(stranger)
    listed = [
        fake_address(1, host="169.254.169.254", port=80),
        fake_address(2, host="fe80::1"),
        fake_address(3, host="seed.example.com"),
        fake_address(4, host="10.0.0.1", port=22),
        fake_address(5, host="127.0.0.1", port=6379),
        fake_address(6, host="8.8.8.8"),
    ]
    pex.receive(PEX_CHANNEL, stranger, encode_addrs(listed))
    assert list(pex.book) == [fake_address(6).node_id]
    assert pex.skipped == {"forbidden": 2, "name": 1, "private": 1, "loopback": 1}
    assert pex.penalties == {} and stranger.state == "connected"
    local = FakePeer(channels=pex.get_channels(), remote_address="127.0.0.1:40000", listen_address="127.0.0.1:6379")
    pex.add_peer(local)  # a loopback address told over loopback is kept
    assert str(pex.book[local.node_id].address) == f"{local.node_id}@127.0.0.1:6379"


def test_our_own_listen_address_is_never_booked_nor_dialed():
    """A peer announcing our listen address as its own is not booked; an address that leads to ourselves
    anyway (a second listener) is forgotten after one dial and never booked or dialed again."""
    network, switch, pex = memory_pex(MEMORY_CONFIG)
    host = network.host_of(switch)
    liar = FakePeer(channels=pex.get_channels(), remote_address="10.0.0.9:40000", listen_address=f"{host}:26656")
    pex.add_peer(liar)
    assert liar.node_id not in pex.book and pex.skipped == {"own": 1}
    switch.listen("tcp:26657")
    ours = PeerAddress("ab" * 20, host, 26657)  # our second listener, under another id
    assert pex.add_address(ours, source="cd" * 20)
    pex.start()
    network.run(5.0)
    assert ours.node_id not in pex.book and pex.counters["dials"] == 1
    assert not pex.add_address(ours, source="cd" * 20) and pex.skipped["own"] == 2


def test_dials_of_learnt_addresses_are_rate_bounded():
    """However many addresses the book holds and however many outbound peers are wanted, PEX dials at most
    dial_burst at once and dial_rate per second after that."""
    network, switch, pex = memory_pex(MEMORY_CONFIG, target_outbound=50, dial_rate=0.5, dial_burst=4)
    for i in range(100):
        pex.add_address(fake_address(i, host=f"10.{i}.0.1"), source=f"{i + 1000:040x}", source_host=f"10.{i}.9.9")
    pex.start()
    network.run(0.99)
    first = pex.counters["dials"]
    network.run(20.0)
    assert first <= 4 and pex.counters["dials"] <= 4 + 0.5 * 21 + 1
    assert pex.counters["dials_deferred"] > 0


def test_an_outbound_session_moves_the_node_to_the_tried_table():
    """A node PEX completed an outbound session with is in the tried table; an inbound one stays new."""
    network = MemoryNetwork()
    a, pex, _ = pex_node(network)
    b, b_pex, _ = pex_node(network)
    a.dial(address_of(network, b))
    network.run(2.0)
    assert pex.book[b.node_id].tried and pex.address_book.counts() == {"new": 0, "tried": 1}
    assert not b_pex.book[a.node_id].tried


def test_sources_behind_one_network_group_share_its_buckets_however_many_they_are():
    """Made-up sources that all connect from one network group place addresses in at most
    new_buckets_per_group buckets of the new table; a source from another group still finds room."""
    solo = Solo(target_outbound=0, new_buckets=16, bucket_size=2, new_buckets_per_group=2)
    for i in range(200):
        address = fake_address(i, host=f"10.{i % 100}.{i // 100}.1")
        solo.pex.add_address(address, source=f"{i + 1:040x}", source_host=f"10.1.{i % 250}.9")
    used = {e.bucket for e in solo.pex.book.values()}
    assert len(used) <= 2 and len(solo.pex.book) <= 2 * 2 and solo.pex.counters["addresses_dropped"] >= 196
    book, group = solo.pex.address_book, network_group("10.2.0.1")
    others = [fake_address(500 + i, host=f"10.{i}.9.1") for i in range(100)]
    other = next(a for a in others if book.new_bucket(a, group) not in used)
    assert solo.pex.add_address(other, source="ab" * 20, source_host="10.2.0.1")
    solo.pex.address_book.check_invariants()


def test_a_full_bucket_evicts_the_entry_that_failed_most_or_keeps_its_entries():
    """A full bucket makes room by evicting the entry with the most dial failures; when none failed, the
    newcomer is dropped (the first address keeps its room)."""
    solo = Solo(target_outbound=0, new_buckets=1, tried_buckets=1, bucket_size=3)
    for i in range(3):
        solo.pex.add_address(fake_address(i), source="ab" * 20)
    assert not solo.pex.add_address(fake_address(9), source="ab" * 20)
    solo.pex.book[fake_address(1).node_id].failures = 2
    solo.pex.book[fake_address(2).node_id].failures = 1
    assert solo.pex.add_address(fake_address(3), source="ab" * 20)
    assert set(solo.pex.book) == {fake_address(i).node_id for i in (0, 2, 3)}
    assert solo.pex.counters["addresses_dropped"] == 1


# -- hostile peers with real Switches --------------------------------------------------


class FloodingPex(PexReactor):
    """Answers every request with as many made-up addresses as it may."""

    fresh = 100_000

    def _answer(self, state, wanted):
        start, self.fresh = self.fresh, self.fresh + wanted
        state.peer.try_send(PEX_CHANNEL, encode_addrs([fake_address(i) for i in range(start, start + wanted)]))


class UnsolicitedPex(PexReactor):
    """Sends addresses to every new peer without being asked."""

    def add_peer(self, peer):
        super().add_peer(peer)
        peer.try_send(PEX_CHANNEL, encode_addrs([fake_address(1)]))


class FloodingAsker(PexReactor):
    """Asks every 0.1 s."""

    def add_peer(self, peer):
        super().add_peer(peer)
        self.loop = task.LoopingCall(peer.try_send, PEX_CHANNEL, encode_request(10))
        self.loop.clock = self.switch.clock
        self.loop.start(0.1)

    def remove_peer(self, peer, reason):
        super().remove_peer(peer, reason)
        self.loop.stop()


def hostile_pair(network, hostile_class, **victim_kwargs):
    victim, pex, recorder = pex_node(network, **victim_kwargs)
    hostile_recorder = RecordingReactor()
    hostile = network.switch([hostile_class(request_interval=1.0), hostile_recorder], config=MEMORY_CONFIG)
    hostile.startService()
    return victim, pex, recorder, hostile, hostile_recorder


def test_a_hostile_peer_flooding_addresses_holds_at_most_per_source_cap_of_the_book():
    """A peer flooding addresses it was asked for holds at most per_source_cap book entries, unpenalised;
    honest peers still get in."""
    network = MemoryNetwork()
    victim, pex, _, hostile, _ = hostile_pair(
        network, FloodingPex, per_source_cap=8, max_addresses=50, target_outbound=0
    )
    honest, _, _ = pex_node(network)
    hostile.listen("tcp:26656")
    victim.dial(address_of(network, hostile))
    victim.dial(address_of(network, honest))
    network.run(30.0)
    from_hostile = [e for e in pex.book.values() if e.source == hostile.node_id]
    assert pex.counters["replies_received"] >= 10 and pex.counters["addresses_capped"] >= 400
    assert len(from_hostile) == 8 and honest.node_id in pex.book
    assert pex.penalties == {}  # it asked for 50 and got 50: capped, not penalised


@pytest.mark.parametrize(
    "hostile_class, reason", [(UnsolicitedPex, "unsolicited_reply"), (FloodingAsker, "request_flood")]
)
def test_a_hostile_peer_is_dropped_with_a_specific_reason_on_both_sides(hostile_class, reason):
    """A peer sending unsolicited replies or flooding requests is dropped and banned, both sides told the
    specific reason."""
    network = MemoryNetwork()
    victim, pex, recorder, hostile, hostile_recorder = hostile_pair(network, hostile_class)
    hostile.dial(address_of(network, victim))
    network.run(2.0)
    [(_, ours)] = recorder.removed()
    [(_, theirs)] = hostile_recorder.removed()
    assert f"pex {reason}: " in str(ours)
    assert isinstance(theirs, PeerClosed) and theirs.code == "closed" and theirs.text.startswith(f"pex {reason}: ")
    assert pex.penalties == {reason: 1} and hostile.node_id in pex.banned
    victim._check_invariants()


# -- rule 7: Sybil poisoning of the book ---------------------------------------------------


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_made_up_identities_cannot_make_the_node_dial_their_targets_nor_crowd_out_its_peers():
    """300 made-up identities connect from 127.0.0.1, each announcing in its hello one target: the
    victim's own listener, 169.254.169.254:80 (metadata), 10.0.0.1:22 (a private SSH port) or a
    loopback port of a scan. The victim never dials its own listener, the metadata service or the
    private port; its dials stay within its dial budget (dial_burst + dial_rate per second); the
    identities fill at most their group's buckets; the honest peer it dialed keeps its tried entry."""
    victim, pex, port = await pex_switch()
    honest, _, honest_port = await pex_switch()
    try:
        await victim.dial(f"{honest.node_id}@127.0.0.1:{honest_port}")
        await until(lambda: honest.node_id in pex.book, "the honest peer's entry")
        dialed = record_dials(victim, passthrough=False)
        started = the_reactor().seconds()
        targets = [f"127.0.0.1:{port}", "169.254.169.254:80", "10.0.0.1:22"]
        identities = []
        for i in range(IDENTITIES):
            node_id = random.Random(i).randbytes(20).hex()
            target = targets[i % 4] if i % 4 < 3 else f"127.0.0.1:{20000 + i}"
            identities.append((node_id, hello_packet(node_id, pex.get_channels(), listen_address=target)))
        await swarm(port, identities, lambda node_id, raw: node_id in victim.peers or raw.lost is not None)
        await sleep(2.0)  # eight rounds of PEX after the flood
        elapsed = the_reactor().seconds() - started
        assert {host for host, _ in dialed} <= {"127.0.0.1"} and ("127.0.0.1", port) not in dialed, dialed
        assert len(dialed) <= pex.dial_burst + pex.dial_rate * elapsed + 1, (len(dialed), elapsed)
        flooded = [e for e in pex.book.values() if e.source_group == "loopback" and not e.tried]
        assert len(flooded) <= pex.address_book.new_buckets_per_group * pex.address_book.bucket_size
        assert pex.skipped["forbidden"] >= IDENTITIES // 4 and pex.skipped["private"] >= IDENTITIES // 4
        assert pex.skipped["own"] >= IDENTITIES // 4
        assert pex.book[honest.node_id].tried and honest.node_id in victim.peers
        pex.address_book.check_invariants()
        victim._check_invariants()
    finally:
        await stop(victim, honest)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_made_up_identities_cannot_grow_the_ban_table_without_bound():
    """300 made-up identities each send the victim an unsolicited PEX reply: each is penalised and closed,
    but the ban table holds at most max_bans node ids (default 128; the bans ending first give way)."""
    victim, pex, port = await pex_switch()
    try:
        greetings = []
        for i in range(IDENTITIES):
            node_id = random.Random(10_000 + i).randbytes(20).hex()
            reply = msg_packet(PEX_CHANNEL, encode_addrs([]))
            greetings.append((node_id, hello_packet(node_id, pex.get_channels()) + reply))
        await swarm(port, greetings, lambda node_id, raw: raw.lost is not None)
        await until(lambda: pex.penalties["unsolicited_reply"] == IDENTITIES, "every penalty", seconds=10.0)
        assert len(pex.banned) == 128
        assert pex.status()["bans_evicted"] == IDENTITIES - 128
        victim._check_invariants()
    finally:
        await stop(victim)


# -- rule 8: an announced address does not steer persistent re-dials -------------------------


async def plain_switch(config=CONFIG):
    recorder = RecordingReactor()
    switch = Switch([recorder], config=config, clock=the_reactor())
    switch.startService()
    port = (await switch.listen("tcp:0:interface=127.0.0.1")).getHost().port
    return switch, port


def connected(switch, node_id) -> bool:
    peer = switch.peers.get(node_id)
    return peer is not None and peer.state == "connected"


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_persistent_peer_is_re_dialed_through_the_configured_proxy_not_at_its_announced_address():
    """A is given B through a proxy (persistent); B announces its direct listen address, which joins A's
    pool as discovered. After a break A re-dials the proxy (the address that last worked), not the
    announced address; only when the proxy refuses does A try the announced one."""
    a, _ = await plain_switch()
    b, b_port = await plain_switch()
    proxy = FaultProxy("127.0.0.1", b_port, clock=the_reactor())
    proxy_port = await proxy.start()
    dialed = record_dials(a, passthrough=True)
    try:
        await a.dial(f"{b.node_id}@127.0.0.1:{proxy_port}", persistent=True)
        pool = a.address_pool(b.node_id)
        await until(lambda: len(pool) == 2, "B's announced address in A's pool")
        assert [(s.address.port, s.discovered) for s in pool] == [(proxy_port, False), (b_port, True)]
        for n in range(3):  # three breaks: each re-dial goes through the proxy
            proxy.reset_all()
            await until(lambda n=n: len(dialed) == n + 2 and connected(a, b.node_id), "the re-dial", seconds=10.0)
            assert dialed[-1] == ("127.0.0.1", proxy_port), f"re-dialed {dialed[-1]}, past the proxy"
        assert [p for _, p in dialed] == [proxy_port] * 4 and proxy.connections_accepted == 4
        proxy.refuse(True)  # the proxy goes down: the announced address is the way left
        proxy.reset_all()
        await until(lambda: any(p == b_port for _, p in dialed), "a dial of the announced address", seconds=10.0)
        assert dialed[4][1] == proxy_port  # tried after the configured address failed
        await until(lambda: connected(a, b.node_id), "the session over the direct address", seconds=10.0)
    finally:
        await proxy.stop()
        await stop(a, b)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_persistent_peer_cannot_announce_a_forbidden_or_private_address_into_its_pool():
    """A persistent peer announcing the metadata service or a private SSH port in its hello: neither joins
    the dialer's pool; a loopback address it announces over loopback does."""
    a, _ = await plain_switch()
    try:
        for announced, joins in [("169.254.169.254:80", False), ("10.0.0.1:22", False), ("127.0.0.1:9", True)]:
            b, b_port = await plain_switch()
            b.listen_address = announced  # what b announces in its hellos
            try:
                await a.dial(f"{b.node_id}@127.0.0.1:{b_port}", persistent=True)
                await sleep(0.05)  # the dial fires before the pool learns the hello's address
                learnt = [str(s.address) for s in a.address_pool(b.node_id) if s.discovered]
                assert learnt == ([f"{b.node_id}@{announced}"] if joins else []), announced
            finally:
                a.stop_dialing(b.node_id)
                await stop(b)
    finally:
        await stop(a)
