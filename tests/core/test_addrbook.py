"""The PEX address book (reactors/addrbook.py) and the rules of learnt addresses
(mconn.core.address: host_scope, is_own_address, announced_address, discovered_problem), with
no Twisted: specs/pex.md sections 3.4 and 3.5.

Hypothesis drives the book through random sequences of adds, promotions, failures and
removals and checks its invariants after each step, and checks that any number of
sources behind one network group stay within that group's buckets.
"""

import pathlib
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core.address import (
    PeerAddress,
    announced_address,
    discovered_problem,
    host_of,
    host_scope,
    is_own_address,
    parse_address,
)
from reactors.addrbook import AddressBook, BanTable, network_group

KEY = bytes(range(32))


def node(i: int) -> str:
    return f"{i + 1:040x}"


def address(i: int, host: str | None = None, port: int = 26656) -> PeerAddress:
    return PeerAddress(node(i), host or f"8.{(i >> 8) & 255}.{i & 255}.1", port)


# -- the scope of a host and the rules of learnt addresses --------------------------------


@pytest.mark.parametrize(
    "host, scope",
    [
        ("8.8.8.8", "public"),
        ("2001:4860::1", "public"),
        ("10.0.0.1", "private"),
        ("172.16.5.5", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fc00::1", "private"),
        ("127.0.0.1", "loopback"),
        ("127.3.2.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "forbidden"),
        ("::ffff:169.254.169.254", "forbidden"),
        ("169.254.1.1", "forbidden"),
        ("fe80::1", "forbidden"),
        ("fe80::1%eth0", "forbidden"),
        ("100.100.100.200", "forbidden"),
        ("168.63.129.16", "forbidden"),
        ("fd00:ec2::254", "forbidden"),
        ("0.0.0.0", "forbidden"),
        ("::", "forbidden"),
        ("0.1.2.3", "forbidden"),
        ("224.0.0.1", "forbidden"),
        ("ff02::1", "forbidden"),
        ("240.0.0.1", "forbidden"),
        ("255.255.255.255", "forbidden"),
        ("example.com", "name"),
        ("localhost", "name"),
    ],
)
def test_host_scope(host, scope):
    """Each host is public, private, loopback, a name, or forbidden (link-local, metadata, unspecified,
    multicast, reserved, broadcast); an IPv4-mapped IPv6 address is judged as its IPv4 address."""
    assert host_scope(host) == scope


def test_own_addresses_are_the_listeners_and_loopback_for_a_wildcard_listener():
    """An address is our own if it is a listener's IP and port, or a loopback or unspecified IP with the
    port of a wildcard listener; another port or host is not."""
    assert is_own_address(parse_address("127.0.0.1:26656"), ["127.0.0.1:26656"])
    assert is_own_address(parse_address("[::ffff:127.0.0.1]:26656"), ["127.0.0.1:26656"])
    assert not is_own_address(parse_address("127.0.0.1:26657"), ["127.0.0.1:26656"])
    assert not is_own_address(parse_address("127.0.0.2:26656"), ["127.0.0.1:26656"])
    assert is_own_address(parse_address("127.0.0.9:26656"), ["0.0.0.0:26656"])
    assert is_own_address(parse_address("[::1]:26656"), ["[::]:26656"])
    assert not is_own_address(parse_address("8.8.8.8:26656"), ["0.0.0.0:26656"])
    assert is_own_address(parse_address("8.8.8.8:1"), ["bad", PeerAddress(None, "8.8.8.8", 1)])


@pytest.mark.parametrize(
    "host, source_host, allow_private, problem",
    [
        ("8.8.8.8", "9.9.9.9", False, None),
        ("8.8.8.8", None, False, None),
        ("169.254.169.254", "127.0.0.1", True, "forbidden"),
        ("0.0.0.0", "127.0.0.1", True, "forbidden"),
        ("seed.example.com", "9.9.9.9", True, "name"),
        ("127.0.0.1", "127.0.0.1", False, None),
        ("127.0.0.1", "::1", False, None),
        ("127.0.0.1", "9.9.9.9", True, "loopback"),
        ("127.0.0.1", None, True, "loopback"),
        ("10.0.0.1", "127.0.0.1", False, "private"),
        ("10.0.0.1", "10.0.0.2", False, "private"),
        ("10.0.0.1", "9.9.9.9", True, None),
        ("127.0.0.1:5", "127.0.0.1", True, "own"),
    ],
)
def test_discovered_problem_names_the_rule_an_address_breaks(host, source_host, allow_private, problem):
    """A learnt address may be dialed if public; a loopback one only when told over loopback; a private
    one only with allow_private; never a forbidden host, a DNS name or our own listen address."""
    text = host if ":" in host else f"{host}:26656"
    target = parse_address(f"{node(1)}@{text}")
    found = discovered_problem(
        target, source_host=source_host, allow_private=allow_private, listen_addresses=["127.0.0.1:5"]
    )
    assert found == problem


def test_announced_address_uses_the_connection_host_for_an_unspecified_one():
    """A hello's listen address becomes the node's address; an unspecified host is replaced by the host
    the connection comes from; nothing or garbage gives None."""
    assert announced_address(node(1), "10.0.0.5:26656", "1.2.3.4:999") == PeerAddress(node(1), "10.0.0.5", 26656)
    assert announced_address(node(1), "0.0.0.0:26656", "1.2.3.4:999") == PeerAddress(node(1), "1.2.3.4", 26656)
    assert announced_address(node(1), "[::]:7", "[::1]:999") == PeerAddress(node(1), "::1", 7)
    assert announced_address(node(1), "", "1.2.3.4:999") is None
    assert announced_address(node(1), "no port", "1.2.3.4:999") is None
    assert announced_address(node(1), "0.0.0.0:1", "") is None
    assert host_of("[::1]:5") == "::1" and host_of("") is None and host_of("junk") is None


def test_network_groups():
    """IPv4 groups are /16s, IPv6 groups /32s, every loopback address one group, a name its own."""
    assert network_group("1.2.3.4") == network_group("1.2.200.9") == "1.2.0.0/16"
    assert network_group("1.3.3.4") != network_group("1.2.3.4")
    assert network_group("::ffff:1.2.3.4") == "1.2.0.0/16"
    assert network_group("2001:db8:1::1") == network_group("2001:db8:ffff::2") == "2001:db8::/32"
    assert network_group("127.0.0.1") == network_group("127.9.9.9") == network_group("::1") == "loopback"
    assert network_group("Example.COM") == "name:example.com"


# -- the book ------------------------------------------------------------------------------


def small_book(**kwargs) -> AddressBook:
    kwargs.setdefault("new_buckets", 8)
    kwargs.setdefault("tried_buckets", 4)
    kwargs.setdefault("bucket_size", 4)
    kwargs.setdefault("new_buckets_per_group", 2)
    kwargs.setdefault("tried_buckets_per_group", 2)
    return AddressBook(key=KEY, **kwargs)


def test_bad_geometry_is_refused_by_name():
    """A key of the wrong size or a bucket count below 1 is a ValueError naming it."""
    with pytest.raises(ValueError, match="key must be 16 to 64 bytes"):
        AddressBook(key=b"short")
    with pytest.raises(ValueError, match="bucket_size 0 must be an integer >= 1"):
        AddressBook(key=KEY, bucket_size=0)


def test_add_known_capped_and_the_nodes_own_word():
    """An address is added once; a source past per_source_cap is capped; the node's own word replaces
    hearsay but not an address it was reached at that has not failed since."""
    book = small_book(per_source_cap=2, new_buckets=64, new_buckets_per_group=64, bucket_size=64)
    assert book.add(address(1), source=node(100), source_group="9.9.0.0/16", now=0) == "added"
    assert book.add(address(1, host="8.8.8.8"), source=node(100), source_group="9.9.0.0/16", now=0) == "known"
    assert book.add(address(2), source=node(100), source_group="9.9.0.0/16", now=0) == "added"
    assert book.add(address(3), source=node(100), source_group="9.9.0.0/16", now=0) == "capped"
    moved = address(1, host="8.8.4.4")
    assert book.add(moved, source=node(1), source_group="8.8.0.0/16", now=1) == "replaced"
    assert book.get(node(1)).address == moved and book.owned_by(node(100)) == 1 and book.owned_by(node(1)) == 1
    book.mark_good(node(1), 2)
    assert book.add(address(1, host="8.8.9.9"), source=node(1), source_group="8.8.0.0/16", now=3) == "known"
    book.get(node(1)).failures = 1
    assert book.add(address(1, host="8.8.9.9"), source=node(1), source_group="8.8.0.0/16", now=3) == "replaced"
    assert not book.get(node(1)).tried
    with pytest.raises(ValueError, match="needs its node id"):
        book.add(parse_address("1.2.3.4:5"), source=node(1), source_group="x", now=0)
    book.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1))
def test_any_number_of_sources_behind_one_group_stay_within_its_buckets(identities, seed):
    """However many made-up identities one network group has, the addresses they tell fill at most
    new_buckets_per_group buckets: at most new_buckets_per_group * bucket_size entries."""
    rng = random.Random(seed)
    book = small_book()
    for i in range(identities):
        target = address(i, host=f"{rng.randrange(1, 224)}.{rng.randrange(256)}.0.1", port=rng.randrange(1, 65536))
        book.add(target, source=node(10_000 + i), source_group="loopback", now=i)
    assert len({e.bucket for e in book.entries.values()}) <= 2
    assert len(book) <= 2 * 4
    book.check_invariants()


def test_tried_entries_keep_their_room_under_a_flood_of_new_addresses():
    """Nodes we completed sessions with are in the tried table; a flood of new addresses from every
    group cannot evict them."""
    book = small_book()
    for i in range(3):
        book.add(address(i), source=node(i), source_group=network_group(address(i).host), now=0)
        book.mark_good(node(i), 1)
    tried = {n for n, e in book.entries.items() if e.tried}
    assert len(tried) == 3
    for i in range(100, 2000):
        book.add(address(i), source=node(i), source_group=f"{i}.0.0.0/16", now=i)
    assert tried <= {n for n, e in book.entries.items() if e.tried}
    assert book.counts()["tried"] == 3 and book.counts()["new"] <= 8 * 4
    book.check_invariants()


def test_a_full_tried_bucket_sends_its_least_recently_good_entry_back_to_new():
    """Promoting into a full tried bucket demotes the entry of that bucket that succeeded least recently."""
    book = small_book(
        tried_buckets=1, tried_buckets_per_group=1, bucket_size=2, new_buckets=64, new_buckets_per_group=64
    )
    for i in range(3):
        book.add(address(i), source=node(i), source_group=f"{i}.0.0.0/16", now=0)
    book.mark_good(node(0), 5)
    book.mark_good(node(1), 3)
    book.mark_good(node(2), 7)
    assert {n for n, e in book.entries.items() if e.tried} == {node(0), node(2)}
    assert node(1) in book and not book.get(node(1)).tried
    book.check_invariants()


def test_a_full_new_bucket_evicts_the_most_failed_unconnected_entry_else_drops_the_newcomer():
    """A full new bucket evicts its entry with the most failures unless that node is connected; if no
    entry may go, the newcomer is dropped."""
    book = small_book(new_buckets=1, new_buckets_per_group=1, bucket_size=2)
    book.add(address(1), source=node(9), source_group="g", now=0)
    book.add(address(2), source=node(9), source_group="g", now=0)
    assert book.add(address(3), source=node(9), source_group="g", now=0) == "full"
    book.get(node(1)).failures = 3
    assert book.add(address(3), source=node(9), source_group="g", now=0, connected={node(1)}) == "full"
    assert book.add(address(3), source=node(9), source_group="g", now=0) == "added"
    assert set(book.entries) == {node(2), node(3)}
    book.check_invariants()


def test_picking_goes_by_bucket_so_a_crowded_group_gets_its_share_of_buckets_not_of_entries():
    """With 32 entries of one group in its buckets and one entry elsewhere, the lone entry is picked about
    as often as a whole bucket of the crowd, far more than 1 in 33."""
    book = AddressBook(key=KEY, new_buckets=64, bucket_size=16, new_buckets_per_group=2)
    for i in range(32):
        book.add(address(i, host=f"{i}.1.1.1"), source=node(500 + i), source_group="loopback", now=0)
    crowd = {e.bucket for e in book.entries.values()}
    lone = next(
        a
        for a in (address(900 + i, host=f"9.{i}.1.1") for i in range(100))
        if book.new_bucket(a, "7.7.0.0/16") not in crowd
    )
    book.add(lone, source=node(800), source_group="7.7.0.0/16", now=0)
    rng = random.Random(3)
    picks = [book.pick(rng, lambda e: True).address.node_id for _ in range(3000)]
    assert picks.count(lone.node_id) / len(picks) > 1 / (len(crowd) + 1) - 0.05
    assert book.pick(rng, lambda e: False) is None


def test_picking_mixes_the_tried_and_new_tables():
    """Either table is picked from when both have candidates; only the one that has them otherwise."""
    book = small_book(new_buckets=64, new_buckets_per_group=64, bucket_size=64)
    book.add(address(1), source=node(1), source_group="a", now=0)
    book.add(address(2), source=node(2), source_group="b", now=0)
    book.mark_good(node(1), 1)
    rng = random.Random(5)
    picks = {book.pick(rng, lambda e: True).address.node_id for _ in range(100)}
    assert picks == {node(1), node(2)}
    assert {book.pick(rng, lambda e: not e.tried).address.node_id for _ in range(20)} == {node(2)}


OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["add", "own", "good", "fail", "remove"]), st.integers(0, 60), st.integers(0, 5)),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_the_book_keeps_its_invariants_under_any_sequence_of_operations(operations):
    """Any sequence of adds (hearsay or the node's own word), promotions, failures and removals leaves every
    entry in the one bucket its hash names, buckets within their size and the per-source counts exact."""
    book = small_book(per_source_cap=5)
    for now, (operation, i, group) in enumerate(operations):
        if operation == "add":
            book.add(address(i), source=node(100 + group), source_group=f"{group}.0.0.0/16", now=now)
        elif operation == "own":
            book.add(address(i, port=1000 + group), source=node(i), source_group=f"{group}.1.0.0/16", now=now)
        elif operation == "good":
            book.mark_good(node(i), now, connected={node(i + 1)})
        elif operation == "fail" and node(i) in book:
            book.get(node(i)).failures += 1
        elif operation == "remove":
            book.remove(node(i))
        book.check_invariants()
        assert len(book) <= book.capacity


# -- the ban table ---------------------------------------------------------------------------


def test_the_ban_table_is_bounded_dropping_ended_bans_then_the_one_ending_first():
    """A full ban table drops bans that ended, then the one that ends first; it never exceeds its size."""
    bans = BanTable(3)
    for i in range(3):
        bans.ban(node(i), until=100 + i, now=0)
    bans.ban(node(9), until=200, now=0)
    assert set(bans.view) == {node(1), node(2), node(9)} and bans.evicted == 1
    bans.ban(node(10), until=300, now=101.5)  # node(1)'s ban has ended
    assert set(bans.view) == {node(2), node(9), node(10)} and bans.evicted == 1
    assert bans.is_banned(node(9), 150) and not bans.is_banned(node(9), 200) and not bans.is_banned(node(1), 0)
    for i in range(1000):
        bans.ban(node(1000 + i), until=400, now=102)
    assert len(bans) == 3
    with pytest.raises(ValueError, match="size 0"):
        BanTable(0)


def test_the_book_and_the_address_rules_import_without_twisted():
    """reactors.addrbook and mconn.core.address are pure: importing them loads no twisted module."""
    program = (
        "import sys, reactors.addrbook, mconn.core.address; "
        "print(sorted(m for m in sys.modules if m.startswith('twisted')))"
    )
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, cwd=root)
    assert result.stdout.strip() == "[]"


def test_candidates_pick_as_the_book_does_and_discard_drops_an_entry_and_its_emptied_bucket():
    """``candidates(eligible).pick(rng)`` draws exactly what ``pick(rng, eligible)`` draws (same calls to the
    random generator), so PEX's dial round can gather the eligible entries once; a discarded entry is never
    picked again, and a bucket it leaves empty is no longer drawn (as asking the book again would do)."""
    book = AddressBook(key=KEY, new_buckets=16, tried_buckets=4, bucket_size=8, new_buckets_per_group=4)
    for i in range(60):
        book.add(address(i, host=f"{i}.9.0.1"), source=node(300 + i), source_group=f"{i % 7}.0.0.0/16", now=0)
    for i in range(0, 60, 5):
        book.mark_good(node(i), now=1)
    eligible = lambda e: int(e.address.node_id, 16) % 3 != 0  # noqa: E731
    for seed in range(20):
        a, b = random.Random(seed), random.Random(seed)
        candidates = book.candidates(eligible)
        assert candidates.version == book.version
        gone: set = set()
        for _ in range(40):
            picked = candidates.pick(a)
            expected = book.pick(b, lambda e, gone=gone: eligible(e) and e.address.node_id not in gone)
            assert picked is expected
            if picked is None:
                break
            candidates.discard(picked)
            gone.add(picked.address.node_id)
        assert a.random() == b.random()
    assert book.candidates(lambda e: False).pick(random.Random(1)) is None
    version = book.version
    book.remove(node(1))
    assert book.version > version  # a change to the tables: a caller gathers again
