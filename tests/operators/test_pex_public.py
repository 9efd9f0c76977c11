"""PEX for public networks (specs/pex.md sections 3.6-3.8): the address book file, seed
mode, private peer ids, and the Switch's bans and one-IP rule in PEX's dialing.

* The book file on real files in ``tmp_path``, on a ``task.Clock``: saved atomically with
  mode 0600 periodically and at stop, read back at start; a truncated, garbage, oversized
  or malformed file is refused with an error naming the file and the problem, and the
  node starts with an empty book.
* Private peer ids and seed mode, rule by rule, with FakePeers on the in-memory network.
* Real Switches on 127.0.0.1: a node restarts and dials a peer it learnt before; a seed
  crawls, answers and disconnects.
"""

from __future__ import annotations

import json
import os
import random
import stat

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import RecordingReactor, bounded, the_reactor, until
from mconn import Config, Switch
from mconn.core.address import PeerAddress
from mconn.testing import FakePeer, MemoryNetwork
from reactors.addrbook_file import MAX_BOOK_FILE_BYTES, BookFileError, read_book, save_book
from reactors.pex import PexReactor
from reactors.pex_wire import PEX_CHANNEL, PexType, decode_message, encode_addrs, encode_request

CONFIG = Config(stats_interval=0, max_connections_per_ip=64, allow_discovered_private=True)
INTERVAL = 10.0
TIMEOUT = 10.0


def fake_address(i: int, port: int = 26656) -> PeerAddress:
    return PeerAddress(f"{i + 1:040x}", f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", port)


def solo(**kwargs):
    """A started Switch with a PexReactor on the in-memory network: (network, switch, pex)."""
    kwargs.setdefault("request_interval", INTERVAL)
    kwargs.setdefault("rng", random.Random(7))
    network = MemoryNetwork()
    pex = PexReactor(**kwargs)
    switch = network.switch([pex], config=CONFIG)
    switch.startService()
    return network, switch, pex


def replies(peer):
    return [decode_message(m)[1] for m in peer.sent_on(PEX_CHANNEL) if m[0] == PexType.ADDRS]


def stop(network, switch):
    d = switch.stopService()
    network.run(1.0)
    return d


# -- the book file ---------------------------------------------------------------------


def test_the_book_is_saved_at_stop_with_mode_0600_and_read_back_at_start(tmp_path):
    """At stop the book goes to the file (0600 under umask 022, no temporary file left);
    a new reactor started with the file has the same entries in the same tables."""
    path = tmp_path / "addrbook.json"
    network, switch, pex = solo(addrbook_file=str(path), target_outbound=0)
    for i in range(20):
        pex.add_address(fake_address(i), source="ab" * 20)
    pex.address_book.mark_good(fake_address(3).node_id, 5.0)
    old = os.umask(0o022)
    try:
        stop(network, switch)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["addrbook.json"]
    network2, switch2, pex2 = solo(addrbook_file=str(path), target_outbound=0, rng=random.Random(99))
    assert {n: str(e.address) for n, e in pex2.book.items()} == {n: str(e.address) for n, e in pex.book.items()}
    assert len(pex.book) > 10 and pex.address_book.counts()["tried"] == 1
    assert pex2.book[fake_address(3).node_id].tried and pex2.address_book.counts() == pex.address_book.counts()
    assert pex2.address_book.key == pex.address_book.key and pex2.counters["addresses_loaded"] == len(pex.book)
    pex2.address_book.check_invariants()


def test_the_book_is_saved_every_save_interval(tmp_path):
    """Without a stop, the file appears after save_interval and follows the book at each interval."""
    path = tmp_path / "book.json"
    network, switch, pex = solo(addrbook_file=str(path), save_interval=60.0, target_outbound=0)
    pex.add_address(fake_address(1), source="ab" * 20)
    network.run(59.0)
    assert not path.exists()
    network.run(2.0)
    assert len(json.loads(path.read_text())["entries"]) == 1
    pex.add_address(fake_address(2), source="ab" * 20)
    network.run(60.0)
    assert len(json.loads(path.read_text())["entries"]) == 2 and pex.counters["book_saves"] == 2


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"version": 1, "key": "00', "not JSON"),
        (b"\x00\xff garbage \x13", "not JSON"),
        (b"[1, 2, 3]", "not a book file"),
        (b'{"version": 7, "key": "", "entries": []}', "version 7 without anchors; this node reads version 1"),
        (b'{"version": 1, "key": "abc", "entries": []}', "key must be 16 to 64 bytes"),
        (b"[" * 100_000, "not JSON"),
    ],
    ids=["truncated", "garbage", "not-an-object", "version", "key", "deep-nesting"],
)
def test_a_bad_file_is_refused_naming_it_and_the_node_starts_with_an_empty_book(tmp_path, content, problem):
    """A truncated or garbage book file: the error names the file and the problem, the node
    starts with an empty book and keeps the refused file as FILE.refused."""
    path = tmp_path / "addrbook.json"
    path.write_bytes(content)
    network, switch, pex = solo(addrbook_file=str(path))
    assert len(pex.book) == 0 and switch.running
    assert pex.book_file_error.startswith(f"address book {path}: ") and problem in pex.book_file_error
    assert (tmp_path / "addrbook.json.refused").read_bytes() == content and not path.exists()
    assert pex.status()["book_file_error"] == pex.book_file_error


def entry_json(i: int, **changes) -> dict:
    entry = {
        "address": str(fake_address(i)),
        "source": "ab" * 20,
        "source_group": "10.0.0.0/16",
        "added": 1.0,
        "tried": False,
        "did_connect": False,
        "failures": 0,
        "last_success": None,
    }
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    "change, problem",
    [
        (dict(address="not an address"), "entry 1: "),
        (dict(address=f"10.0.0.1:{26656}"), "entry 1: address 10.0.0.1:26656 has no node id"),
        (dict(source="me"), "entry 1: source 'me' must be a node id"),
        (dict(failures=-1), "entry 1: failures -1 must be an integer from 0 to 1000"),
        (dict(tried="yes"), "entry 1: tried 'yes' must be true or false"),
        (dict(added=float("nan")), "entry 1: added nan must be a finite number"),
        (dict(extra=1), "entry 1: must be an object of exactly"),
    ],
    ids=["address", "no-node-id", "source", "failures", "tried", "added", "extra-key"],
)
def test_a_malformed_entry_refuses_the_whole_file_naming_the_entry(tmp_path, change, problem):
    """One malformed entry refuses the file with an error naming the file, the entry's index and the field."""
    path = tmp_path / "addrbook.json"
    document = {"version": 1, "key": "11" * 32, "entries": [entry_json(0), entry_json(1, **change)]}
    path.write_text(json.dumps(document))
    with pytest.raises(BookFileError) as caught:
        read_book(str(path), capacity=1280)
    assert str(caught.value).startswith(f"address book {path}: ") and problem in str(caught.value)


def test_an_oversized_file_or_too_many_entries_or_a_fifo_is_refused_unread(tmp_path):
    """A file over MAX_BOOK_FILE_BYTES is refused without being parsed, a list longer than the
    book's room is refused before an entry is read, and a FIFO is refused without blocking."""
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BOOK_FILE_BYTES + 1))
    with pytest.raises(BookFileError, match=rf"big.json: over {MAX_BOOK_FILE_BYTES} bytes"):
        read_book(str(big), capacity=1280)
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"version": 1, "key": "11" * 32, "entries": [0] * 11}))
    with pytest.raises(BookFileError, match=r"many.json: 11 entries; the book holds at most 10"):
        read_book(str(many), capacity=10)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(BookFileError, match=r"fifo.json: not a regular file"):
        read_book(str(fifo), capacity=10)
    assert read_book(str(tmp_path / "absent.json"), capacity=10) is None


def test_saved_entries_go_through_the_books_rules_again(tmp_path):
    """A hand-edited file cannot place what peers could not: a link-local (metadata) address,
    a private peer id, and entries past the per-source cap are not loaded."""
    path = tmp_path / "addrbook.json"
    entries = [entry_json(i) for i in range(5)]
    entries.append(entry_json(5, address=f"{'cd' * 20}@169.254.169.254:26656"))
    path.write_text(json.dumps({"version": 1, "key": "11" * 32, "entries": entries}))
    network, switch, pex = solo(
        addrbook_file=str(path), per_source_cap=3, private_peer_ids=[fake_address(0).node_id], target_outbound=0
    )
    assert sorted(pex.book) == sorted(fake_address(i).node_id for i in (1, 2, 3))
    assert pex.book_file_error is None


def test_saving_replaces_the_file_atomically(tmp_path):
    """save_book writes a temporary file in the same directory and renames it over the old one:
    the old file's inode is replaced, never rewritten in place."""
    path = tmp_path / "addrbook.json"
    network, switch, pex = solo(target_outbound=0)
    pex.add_address(fake_address(1), source="ab" * 20)
    save_book(str(path), pex.address_book)
    first = path.stat().st_ino
    pex.add_address(fake_address(2), source="ab" * 20)
    save_book(str(path), pex.address_book)
    assert path.stat().st_ino != first and len(read_book(str(path), capacity=1280).entries) == 2


# -- private peer ids --------------------------------------------------------------------


def test_private_peer_ids_are_never_booked_nor_shared():
    """An address of a private peer id in a reply is not booked; a private peer that connects
    is not booked either, so no reply ever names it."""
    secret = fake_address(100)
    network, switch, pex = solo(target_outbound=0, private_peer_ids=[secret.node_id])
    source = FakePeer(channels=pex.get_channels(), is_outbound=True)
    pex.add_peer(source)
    pex.receive(PEX_CHANNEL, source, encode_addrs([fake_address(1), secret]))
    assert fake_address(1).node_id in pex.book and secret.node_id not in pex.book
    validator = FakePeer(secret.node_id, channels=pex.get_channels(), listen_address="10.7.7.7:26656")
    pex.add_peer(validator)
    assert secret.node_id not in pex.book and pex.counters["addresses_private"] == 2
    asker = FakePeer(channels=pex.get_channels())
    pex.add_peer(asker)
    pex.receive(PEX_CHANNEL, asker, encode_request(100))
    [reply] = replies(asker)
    assert [a.node_id for a in reply] == [fake_address(1).node_id]


def test_a_private_peer_id_must_be_a_node_id():
    """A private peer id that is not 40 lowercase hex digits is refused, naming it."""
    with pytest.raises(ValueError, match=r"private peer id 'validator' is not a node id"):
        PexReactor(private_peer_ids=["validator"])


# -- seed mode, rule by rule ---------------------------------------------------------------


def test_a_seed_answers_an_inbound_peer_once_then_disconnects_it():
    """A seed answers an inbound peer's request and closes it, naming why; a peer that never
    asks is closed after seed_hold."""
    network, switch, pex = solo(seed_mode=True, seed_hold=30.0, target_outbound=0)
    for i in range(3):
        pex.add_address(fake_address(i), source="ab" * 20)
    asker, silent = (FakePeer(channels=pex.get_channels()) for _ in range(2))
    pex.add_peer(asker)
    pex.add_peer(silent)
    pex.receive(PEX_CHANNEL, asker, encode_request(100))
    assert len(replies(asker)[0]) == 3
    assert asker.state == "closed" and "seed node: addresses sent" in str(asker.close_reason)
    network.run(29.0)
    assert silent.state == "connected"
    network.run(2.0)
    assert silent.state == "closed" and "seed node: held seed_hold" in str(silent.close_reason)
    assert pex.counters["seed_disconnects"] == 2


def test_a_seed_asks_a_peer_it_dialed_and_disconnects_it_once_it_answered():
    """A seed asks each outbound peer at once, even with room to spare in no table, books its
    reply, closes it, and does not crawl that node again within crawl_interval."""
    network, switch, pex = solo(seed_mode=True, crawl_interval=120.0)
    crawled = FakePeer(channels=pex.get_channels(), is_outbound=True, listen_address="10.5.5.5:26656")
    pex.add_peer(crawled)
    [request] = [m for m in crawled.sent_on(PEX_CHANNEL) if m[0] == PexType.REQUEST]
    pex.receive(PEX_CHANNEL, crawled, encode_addrs([fake_address(7)]))
    assert fake_address(7).node_id in pex.book
    assert crawled.state == "closed" and "seed node: crawled" in str(crawled.close_reason)
    assert pex.book[crawled.node_id].next_dial >= network.clock.seconds() + 120.0


# -- the Switch's bans and one IP per node in PEX's dialing ----------------------------------


def test_pex_does_not_dial_a_node_the_switch_banned():
    """A booked node that a reactor marked bad is not dialed by PEX while its ban lasts."""
    network = MemoryNetwork()
    pex = PexReactor(request_interval=1.0, rng=random.Random(1))
    a = network.switch([pex], config=CONFIG)
    b = network.switch([RecordingReactor()], config=CONFIG)
    a.startService()
    b.listen("tcp:26656")
    a.mark_bad(b.node_id, 100.0, "misbehaved")
    pex.add_address(f"{b.node_id}@{network.host_of(b)}:26656", source="ab" * 20)
    pex.start()
    network.run(50.0)
    assert a.peers == {} and pex.counters["dials"] == 0
    network.run(60.0)
    assert b.node_id in a.peers


def test_pex_does_not_dial_an_ip_address_in_use_without_allow_duplicate_ip():
    """With allow_duplicate_ip False, a booked node at the IP address of a connected peer is not dialed."""
    network, switch, pex = solo(target_outbound=5)
    switch.config = switch.config.replace(allow_duplicate_ip=False)
    peer = FakePeer(channels=pex.get_channels(), is_outbound=True, remote_address="10.0.0.9:4000")
    switch.peers[peer.node_id] = peer  # a session from 10.0.0.9, as far as the dialer looks
    try:
        pex.add_address(PeerAddress(fake_address(1).node_id, "10.0.0.9", 26656), source="ab" * 20)
        pex.start()
        network.run(30.0)
        assert pex.counters["dials"] == 0
    finally:
        del switch.peers[peer.node_id]


# -- real Switches on 127.0.0.1 -----------------------------------------------------------


async def pex_switch(switches, *, interface="127.0.0.1", **kwargs):
    kwargs.setdefault("request_interval", 0.2)
    pex = PexReactor(rng=random.Random(len(switches)), **kwargs)
    switch = Switch([pex], config=CONFIG, clock=the_reactor(), node_key=kwargs.pop("node_key", None))
    switch.startService()
    switches.append(switch)
    port = await switch.listen(f"tcp:0:interface={interface}")
    return switch, pex, f"{switch.node_id}@{interface}:{port.getHost().port}"


async def stop_all(switches):
    await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches if s.running]), TIMEOUT)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_restarted_node_dials_a_peer_it_learnt_before_the_restart(tmp_path):
    """Node A learns B (it dials B once, not persistently), stops, saves its book; a new A
    with the same key and file, given no peer, dials B from its book."""
    path = str(tmp_path / "addrbook.json")
    switches = []
    try:
        b, _, b_address = await pex_switch(switches)
        a, pex_a, _ = await pex_switch(switches, addrbook_file=path)
        await bounded(a.dial(b_address), TIMEOUT)
        assert b.node_id in pex_a.book
        key = a.node_key
        await bounded(a.stopService(), TIMEOUT)
        await until(lambda: a.node_id not in b.peers, "B to see A go")
        assert b.node_id in {e["address"].split("@")[0] for e in json.loads(open(path).read())["entries"]}

        pex_again = PexReactor(request_interval=0.2, rng=random.Random(5), addrbook_file=path)
        again = Switch([pex_again], config=CONFIG, clock=the_reactor(), node_key=key)
        switches.append(again)
        again.startService()
        assert b.node_id in pex_again.book and pex_again.book_file_error is None
        await until(lambda: b.node_id in again.peers, "the restarted node to dial B from its book")
        assert again.peers[b.node_id].is_outbound
    finally:
        await stop_all(switches)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_seed_hands_out_addresses_disconnects_and_crawls():
    """N1 and N2 each dial the seed once: the seed answers and disconnects them, N2 learns N1
    from it and connects to N1; the seed crawls (dials a booked node, asks, disconnects) and
    holds no session at the end."""
    switches = []
    try:
        seed, pex_seed, seed_address = await pex_switch(
            switches, seed_mode=True, seed_hold=5.0, crawl_interval=60.0, request_interval=0.3
        )
        n1, pex1, _ = await pex_switch(switches, request_interval=5.0)
        n2, pex2, _ = await pex_switch(switches, request_interval=5.0)
        await bounded(n1.dial(seed_address), TIMEOUT)
        await until(lambda: seed.node_id not in n1.peers, "the seed to disconnect N1")
        await bounded(n2.dial(seed_address), TIMEOUT)
        await until(lambda: n1.node_id in n2.peers, "N2 to dial N1, learnt from the seed")
        await until(lambda: seed.node_id not in n2.peers, "the seed to disconnect N2")
        await until(lambda: pex_seed.counters["replies_received"] >= 1, "the seed to crawl a node")
        await until(lambda: not seed.peers, "the seed to hold no session")
        assert {n1.node_id, n2.node_id} <= set(pex_seed.book)
        assert pex_seed.counters["replies_sent"] >= 2 and pex_seed.counters["seed_disconnects"] >= 3
        assert pex_seed.penalties == {} and pex1.penalties == {} and pex2.penalties == {}
    finally:
        await stop_all(switches)


# -- a restart: anchors and the wait for a node that holds our old session (section 3.11) -----------------


def restarted_victim(tmp_path, others: int = 3, **victim_options):
    """A victim whose one outbound peer ``a`` is saved as its anchor, with ``others`` more reachable nodes in
    its book; its process then restarts with the file (``a`` still holds its old session, suspended for
    ``resume_grace``). Returns (network, the new victim Switch, its PexReactor, a, the others)."""
    network = MemoryNetwork()
    path = str(tmp_path / "victim.json")

    def node(**options):
        pex = PexReactor(request_interval=INTERVAL, rng=random.Random(len(network.fabric.nodes) + 1), **options)
        switch = network.switch([pex], config=CONFIG)
        switch.startService()
        switch.listen("tcp:26656")
        return switch, pex

    victim, pex = node(addrbook_file=path, target_outbound=1, anchors=1)
    a, _ = node(target_outbound=0)  # only the victim dials
    rest = [node(target_outbound=0)[0] for _ in range(others)]
    pex.add_address(network.dial_address(a), source=a.node_id, source_host=network.host_of(a))
    pex.start()
    network.run(2 * INTERVAL)
    assert [n for n, p in victim.peers.items() if p.is_outbound] == [a.node_id]
    for other in rest:
        pex.add_address(network.dial_address(other), source=a.node_id, source_host=network.host_of(a))
    assert pex.save_book() and read_book(path, capacity=1280).anchors == (a.node_id,)
    options = dict(addrbook_file=path, target_outbound=1, request_interval=INTERVAL, rng=random.Random(50))
    new_pex = PexReactor(**{**options, **victim_options})
    victim = network.restart(victim, [new_pex])
    return network, victim, new_pex, a, rest


def test_a_restarted_node_dials_its_anchor_first_and_keeps_its_slot_while_it_holds_the_old_session(tmp_path):
    """The anchor refuses the restarted node as ``session_held`` until its grace ends: no failure, the node
    dials it again every HELD_RETRY seconds and fills its one outbound slot with nobody else meanwhile; once
    the grace ends it is connected to its anchor again."""
    network, victim, pex, a, rest = restarted_victim(tmp_path)
    network.run(CONFIG.resume_grace - 5.0)
    assert pex.counters["anchor_dials"] == 1 and pex.counters["dials_held"] >= 2
    assert pex.status()["held"] == [a.node_id] and not victim.peers
    assert pex.counters["dials"] == pex.counters["dials_held"]  # only the anchor was dialed
    assert pex.book[a.node_id].failures == 0
    network.run(20.0)
    assert [n for n, p in victim.peers.items() if p.is_outbound] == [a.node_id]
    assert not any(victim.node_id in other.peers for other in rest)
    assert pex.status()["held"] == [] and pex.book[a.node_id].failures == 0
    assert pex.counters["dials"] == pex.counters["dials_held"] + 1


def test_without_the_restart_rules_the_slot_goes_to_whoever_answers_first(tmp_path):
    """The same restart with no anchors and ``held_wait`` 0 (PEX before section 3.11): the anchor's refusal
    is a failure, and the slot goes to another node of the book while the old session is held."""
    network, victim, pex, a, rest = restarted_victim(tmp_path, anchors=0, held_wait=0.0)
    network.run(CONFIG.resume_grace + 15.0)
    outbound = [n for n, p in victim.peers.items() if p.is_outbound]
    assert len(outbound) == 1 and outbound[0] in {o.node_id for o in rest}
    assert pex.counters["anchor_dials"] == 0 and pex.counters["dials_held"] == 0


def test_a_node_gets_one_wait_and_a_held_refusal_after_it_is_a_failure():
    """``held_wait`` bounds what a node refusing ``session_held`` forever can take: one wait per tried entry;
    a refusal after it, or from a new entry (any node can answer so), counts as a failure with the usual
    backoff (a node cannot hold a slot for ever)."""
    from reactors.pex_dial import HELD_RETRY

    network, switch, pex = solo(target_outbound=1, held_wait=12.0, dial_backoff=1.0)
    from mconn import PeerClosed
    from twisted.python.failure import Failure

    target, stranger = fake_address(1), fake_address(2)
    pex.add_address(target, source="ab" * 20)
    pex.add_address(stranger, source="ab" * 20)
    pex.address_book.mark_good(target.node_id, 0.0)  # we chose it once: it gets its wait
    held = PeerClosed("session_held", "peer closed the connection: session_held")
    pex._dialer._dial_failed(Failure(held), stranger.node_id, stranger)  # a new entry gets none
    assert pex.book[stranger.node_id].failures == 1 and not pex.status()["held"]
    dialer = pex._dialer
    for when in (0.0, HELD_RETRY, 2 * HELD_RETRY):
        network.clock.advance(when - network.clock.seconds())
        dialer._dial_failed(Failure(held), target.node_id, target)
        dialer._retry.cancel()  # the re-dial itself is the restart tests' part; here only the rule
        entry = pex.book[target.node_id]
        assert entry.failures == 0 and entry.next_dial == when + HELD_RETRY and entry.held_until == 12.0
    network.clock.advance(12.0 - network.clock.seconds())
    dialer._dial_failed(Failure(held), target.node_id, target)
    assert pex.book[target.node_id].failures == 1 and pex.counters["dials_held"] == 3


def test_anchors_name_the_outbound_peers_held_longest_and_a_bad_anchor_refuses_the_file(tmp_path):
    """A save names up to ``anchors`` outbound peers that have entries, held longest first (kept through the
    stop, whose save comes after the last session ended); a file whose anchor is no entry is refused by name;
    a version 1 file (no anchors) is read."""
    path = tmp_path / "book.json"
    network, switch, pex = solo(addrbook_file=str(path), target_outbound=0, anchors=2)
    peers = []
    for i in range(3):
        pex.add_address(fake_address(i), source="ab" * 20)
        peer = FakePeer(fake_address(i).node_id, channels=pex.get_channels(), is_outbound=True)
        peer.address = fake_address(i)
        network.clock.advance(1.0)
        pex.add_peer(peer)
        peers.append(peer)
    inbound = FakePeer(fake_address(9).node_id, channels=pex.get_channels(), listen_address="10.9.9.9:26656")
    pex.add_peer(inbound)
    pex.remove_peer(peers[0], None)
    assert pex.anchor_ids() == [fake_address(1).node_id, fake_address(2).node_id]
    stop(network, switch)
    document = json.loads(path.read_text())
    assert document["version"] == 2 and document["anchors"] == [fake_address(1).node_id, fake_address(2).node_id]
    document["anchors"] = ["ee" * 20]
    path.write_text(json.dumps(document))
    with pytest.raises(BookFileError, match=r"anchor 'eeee.*' is not the node id of an entry"):
        read_book(str(path), capacity=1280)
    del document["anchors"]
    document["version"] = 1
    path.write_text(json.dumps(document))
    assert read_book(str(path), capacity=1280).anchors == ()
    with pytest.raises(ValueError, match="anchors 99 must be an integer from 0 to 64"):
        PexReactor(anchors=99)
