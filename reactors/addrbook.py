"""The PEX address book: a new and a tried table of buckets (specs/pex.md section 3.4).

Pure: no Twisted, no clock reads (``now`` comes in), randomness from a ``random.Random``
passed in. The design is Bitcoin Core's address manager (``addrman``) as CometBFT carries
it in ``p2p/pex/addrbook.go``, after the eclipse attacks of Heilman et al. (2015), with
one entry per node id.

Theory of operation
-------------------
* *Two tables.* The **new** table holds addresses heard of; the **tried** table holds
  addresses we completed an outbound session with. Each entry sits in exactly one bucket
  of one table, and a bucket holds at most ``bucket_size`` entries.
* *Placement is a keyed hash* (blake2b keyed with the book's secret ``key``), so nobody
  outside can aim at a bucket. With ``group(host)`` the network group (IPv4 /16, IPv6
  /32, every loopback address one group; :func:`network_group`) and ``source_group`` the
  group of the host the connection that brought the address comes from, as its transport
  says (not the host it names, never the node id it claims; no host is one group)::

      new bucket   = H(source_group, H(group(address), source_group) % new_buckets_per_group) % new_buckets
      tried bucket = H(group(address), H(address) % tried_buckets_per_group) % tried_buckets

  Any number of identities behind one source group therefore reach at most
  ``new_buckets_per_group`` new buckets, ``new_buckets_per_group * bucket_size`` entries:
  a Sybil cannot multiply its share by making up identities.
* *Room.* A full new bucket evicts the entry of that bucket whose dials failed most
  (never one of a connected node); if none failed, the newcomer is dropped: the first
  address keeps its room, as addrman keeps an entry that is not "terrible". New
  addresses never evict tried ones.
* *Promotion.* A completed outbound session moves the entry to its tried bucket; if that
  is full, the entry there that succeeded least recently goes back to the new table (and
  is dropped if its new bucket has no room).
* *Picking* an address to dial: the tried or the new table with even odds (the other if
  one has no candidate), then a random bucket among those holding a candidate, then a
  random candidate in it. A source group's share of dials is its share of buckets.

:class:`BanTable` holds the node ids PEX banned, bounded too: made-up identities are
free, so a full table drops its bans that ended, then the ban that ends first.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import random
import types
from collections.abc import Callable, Collection

from mconn.core.address import LOOPBACK, NAME, PeerAddress, host_scope
from mconn.core.admission import address_group

#: Odds of picking from the tried table when both tables have a candidate (addrman's).
TRIED_BIAS = 0.5


#: The group of every source whose connection has no host (an in-memory transport, a
#: UNIX socket, an address added without one): one group for them all, so that made-up
#: node ids never make groups of their own (specs/pex.md section 3.4).
NO_HOST_GROUP = "no-host"


#: Hosts whose network group is remembered (parsing an IP costs more than placing it).
GROUP_CACHE = 8192


@functools.lru_cache(maxsize=GROUP_CACHE)
def network_group(host: str | None) -> str:
    """The network group of ``host``: ``a.b.0.0/16`` for IPv4, the /32 for IPv6 (an
    IPv4-mapped address is IPv4; ``mconn.core.admission.address_group`` with those prefixes),
    ``loopback`` for every loopback address (one host, however many of its addresses
    made-up identities bind), ``name:<host>`` for a DNS name, and ``NO_HOST_GROUP`` for
    None (no host is known). The /32 is Bitcoin addrman's unit, the block a registry
    gives one provider: addresses within it come free to whoever holds one of them, so
    a group must span it for made-up sources to share one group's buckets. Remembered
    for the last ``GROUP_CACHE`` hosts: a book asks for every address it places, every
    source and every dial."""
    if host is None:
        return NO_HOST_GROUP
    scope = host_scope(host)
    if scope == LOOPBACK:
        return "loopback"
    if scope == NAME:
        return f"name:{host.lower()}"
    return address_group(host, 16, 32)


@dataclasses.dataclass
class BookEntry:
    """One known node: where it listens, who told us, what dialing it taught us."""

    address: PeerAddress
    #: The node id that told us; the node itself for its own announced or dialed address.
    source: str
    #: The network group of the host the source's connection comes from (network_group).
    source_group: str
    #: The ``now`` at which it was added.
    added: float
    #: Failed dials since the last success (PEX's own dials).
    failures: int = 0
    last_error: str | None = None
    #: Not dialed before this time (the backoff after a failure).
    next_dial: float = 0.0
    #: Whether a session with it ever started.
    did_connect: bool = False
    #: In the tried table (an outbound session with it completed), else in the new one.
    tried: bool = False
    #: The ``now`` of the last completed outbound session.
    last_success: float | None = None
    #: The index of its bucket in its table.
    bucket: int = 0
    #: The end of the one wait PEX grants it after it refused us as ``session_held``
    #: (it holds the session of our previous process; reactors/pex_dial.py), or None.
    held_until: float | None = None


class AddressBook:
    """Known addresses, one entry per node id, in a new and a tried table of buckets.

    :param key: the secret that keys bucket placement (16 to 64 bytes).
    :param new_buckets: buckets of the new table.
    :param tried_buckets: buckets of the tried table.
    :param bucket_size: entries per bucket.
    :param new_buckets_per_group: new buckets one source group can reach.
    :param tried_buckets_per_group: tried buckets the addresses of one group can reach.
    :param per_source_cap: entries one source node id may own (its own address aside).
    """

    def __init__(
        self,
        *,
        key: bytes,
        new_buckets: int = 64,
        tried_buckets: int = 16,
        bucket_size: int = 16,
        new_buckets_per_group: int = 8,
        tried_buckets_per_group: int = 4,
        per_source_cap: int = 100,
    ) -> None:
        if not isinstance(key, bytes) or not 16 <= len(key) <= 64:
            raise ValueError(f"key must be 16 to 64 bytes, got {type(key).__name__} of {len(key)}")
        sizes = dict(
            new_buckets=new_buckets,
            tried_buckets=tried_buckets,
            bucket_size=bucket_size,
            new_buckets_per_group=new_buckets_per_group,
            tried_buckets_per_group=tried_buckets_per_group,
            per_source_cap=per_source_cap,
        )
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} must be an integer >= 1")
        self._key = key
        self.new_buckets, self.tried_buckets, self.bucket_size = new_buckets, tried_buckets, bucket_size
        self.new_buckets_per_group = min(new_buckets_per_group, new_buckets)
        self.tried_buckets_per_group = min(tried_buckets_per_group, tried_buckets)
        self.per_source_cap = per_source_cap
        self._entries: dict[str, BookEntry] = {}
        self._new: list[dict[str, BookEntry]] = [{} for _ in range(new_buckets)]
        self._tried: list[dict[str, BookEntry]] = [{} for _ in range(tried_buckets)]
        self._per_source: collections.Counter = collections.Counter()
        #: Changes to the tables so far (a Candidates list is good while it holds).
        self.version = 0

    # -- the view ------------------------------------------------------------------

    @property
    def entries(self) -> types.MappingProxyType:
        """Node id -> BookEntry, read-only."""
        return types.MappingProxyType(self._entries)

    @property
    def key(self) -> bytes:
        """The secret that keys placement (saved with the book: reactors/addrbook_file.py)."""
        return self._key

    @property
    def capacity(self) -> int:
        return (self.new_buckets + self.tried_buckets) * self.bucket_size

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._entries

    def get(self, node_id: str) -> BookEntry | None:
        return self._entries.get(node_id)

    def owned_by(self, source: str) -> int:
        """Entries ``source`` told us of (its own address included)."""
        return self._per_source[source]

    def counts(self) -> dict[str, int]:
        """Entries in each table."""
        tried = sum(len(b) for b in self._tried)
        return {"new": len(self._entries) - tried, "tried": tried}

    # -- placement -----------------------------------------------------------------

    def _hash(self, *parts) -> int:
        h = hashlib.blake2b(key=self._key, digest_size=8)
        for part in parts:
            h.update(str(part).encode() + b"\0")
        return int.from_bytes(h.digest(), "big")

    def new_bucket(self, address: PeerAddress, source_group: str) -> int:
        """The new bucket of ``address`` told by a source in ``source_group``."""
        slot = self._hash("new-slot", network_group(address.host), source_group) % self.new_buckets_per_group
        return self._hash("new", source_group, slot) % self.new_buckets

    def tried_bucket(self, address: PeerAddress) -> int:
        slot = self._hash("tried-slot", str(address)) % self.tried_buckets_per_group
        return self._hash("tried", network_group(address.host), slot) % self.tried_buckets

    # -- changes -------------------------------------------------------------------

    def add(
        self, address: PeerAddress, *, source: str, source_group: str, now: float, connected: Collection = ()
    ) -> str:
        """Learn ``address`` from ``source``, whose connection is in ``source_group``.

        A node's own word (``source`` is the node) replaces an address others told, or
        one that failed; an address we completed a session at and that has not failed
        since is kept. ``connected`` holds node ids whose entries are never evicted.

        :returns: ``added``, ``replaced`` (the node's own word), ``known`` (nothing
            changed), ``capped`` (``source`` owns ``per_source_cap`` entries) or
            ``full`` (the bucket has no room).
        """
        node_id = address.node_id
        if node_id is None:
            raise ValueError(f"a book address needs its node id (ID@host:port), got {address}")
        old = self._entries.get(node_id)
        if old is not None:
            own_word = source == node_id and old.address != address
            if not own_word or (old.tried and not old.failures):
                return "known"
        elif source != node_id and self._per_source[source] >= self.per_source_cap:
            return "capped"
        entry = BookEntry(address=address, source=source, source_group=source_group, added=now)
        entry.bucket = self.new_bucket(address, source_group)
        if old is not None:
            self._unlink(old)
        if not self._room(self._new[entry.bucket], connected):
            if old is not None:
                self._link(old)
            return "full"
        self._link(entry)
        return "added" if old is None else "replaced"

    def mark_good(self, node_id: str, now: float, *, connected: Collection = ()) -> BookEntry | None:
        """An outbound session with ``node_id`` completed: clear its failures and move it to
        the tried table (demoting the least recently good entry of a full tried bucket)."""
        entry = self._entries.get(node_id)
        if entry is None:
            return None
        entry.did_connect, entry.failures, entry.next_dial, entry.last_error = True, 0, 0.0, None
        entry.last_success = now
        if entry.tried:
            return entry
        self._unlink(entry)
        index = self.tried_bucket(entry.address)
        bucket = self._tried[index]
        if len(bucket) >= self.bucket_size:
            oldest = min(bucket.values(), key=lambda e: (e.last_success or 0.0, e.address.node_id))
            self._unlink(oldest)
            oldest.tried, oldest.bucket = False, self.new_bucket(oldest.address, oldest.source_group)
            if self._room(self._new[oldest.bucket], connected):
                self._link(oldest)
        entry.tried, entry.bucket = True, index
        self._link(entry)
        return entry

    def mark_connected(self, node_id: str) -> None:
        """A session with ``node_id`` started (either direction): clear its failures."""
        entry = self._entries.get(node_id)
        if entry is not None:
            entry.did_connect, entry.failures, entry.next_dial = True, 0, 0.0

    def remove(self, node_id: str) -> BookEntry | None:
        entry = self._entries.get(node_id)
        if entry is not None:
            self._unlink(entry)
        return entry

    def _room(self, bucket: dict, connected: Collection) -> bool:
        """Whether ``bucket`` has room, evicting its most failed unconnected entry if full."""
        if len(bucket) < self.bucket_size:
            return True
        failed = [e for n, e in bucket.items() if e.failures and n not in connected]
        if not failed:
            return False
        self._unlink(max(failed, key=lambda e: (e.failures, -e.added)))
        return True

    def _table(self, entry: BookEntry) -> list[dict[str, BookEntry]]:
        return self._tried if entry.tried else self._new

    def _link(self, entry: BookEntry) -> None:
        self.version += 1
        node_id = entry.address.node_id
        self._table(entry)[entry.bucket][node_id] = entry
        self._entries[node_id] = entry
        self._per_source[entry.source] += 1

    def _unlink(self, entry: BookEntry) -> None:
        self.version += 1
        node_id = entry.address.node_id
        del self._table(entry)[entry.bucket][node_id]
        del self._entries[node_id]
        self._per_source[entry.source] -= 1
        if not self._per_source[entry.source]:
            del self._per_source[entry.source]

    # -- choosing ------------------------------------------------------------------

    def pick(self, rng: random.Random, eligible: Callable[[BookEntry], bool]) -> BookEntry | None:
        """A random ``eligible`` entry: a table, then a bucket, then an entry (see above)."""
        return self.candidates(eligible).pick(rng)

    def candidates(self, eligible: Callable[[BookEntry], bool]) -> Candidates:
        """The ``eligible`` entries by table and bucket, to pick from more than once:
        ``eligible`` is asked once per entry here, not once per entry per pick."""
        tables = []
        for table in (self._tried, self._new):
            buckets = [[e for e in b.values() if eligible(e)] for b in table]
            tables.append([b for b in buckets if b])
        return Candidates(self.version, tables[0], tables[1])

    def check_invariants(self) -> None:
        """Every entry in the one bucket its table and hash name, buckets within size,
        each source group within its new buckets, the per-source counts exact."""
        seen = 0
        per_source: collections.Counter = collections.Counter()
        for tried, table in ((False, self._new), (True, self._tried)):
            for index, bucket in enumerate(table):
                assert len(bucket) <= self.bucket_size, f"bucket {index} holds {len(bucket)}"
                for node_id, entry in bucket.items():
                    assert self._entries.get(node_id) is entry and entry.tried is tried and entry.bucket == index
                    if tried:
                        expected = self.tried_bucket(entry.address)
                    else:
                        expected = self.new_bucket(entry.address, entry.source_group)
                    assert index == expected, f"{entry.address} is in bucket {index}, not {expected}"
                    per_source[entry.source] += 1
                    seen += 1
        assert seen == len(self._entries), f"{len(self._entries)} entries, {seen} in buckets"
        assert per_source == self._per_source, "the per-source counts disagree with the buckets"


class Candidates:
    """The eligible entries of a book at one moment, by table and bucket (``AddressBook.candidates``).

    ``pick`` draws as ``AddressBook.pick`` does, with the same calls to the random
    generator, so a caller that picks several entries in a row (PEX's dial round) gets
    what asking the book each time would give, as long as it drops (``discard``) what
    stopped being eligible and ``version`` still equals the book's (a change to the tables may
    move entries between buckets: then ask the book again).
    """

    __slots__ = ("version", "_tried", "_new")

    def __init__(self, version: int, tried: list[list[BookEntry]], new: list[list[BookEntry]]) -> None:
        self.version = version
        self._tried, self._new = tried, new

    def pick(self, rng: random.Random) -> BookEntry | None:
        tried, new = self._tried, self._new
        if not tried and not new:
            return None
        buckets = tried if tried and (not new or rng.random() < TRIED_BIAS) else new
        return rng.choice(rng.choice(buckets))

    def discard(self, entry: BookEntry) -> None:
        """``entry`` is no longer eligible: drop it (and its bucket, if that empties)."""
        buckets = self._tried if entry.tried else self._new
        for index, bucket in enumerate(buckets):
            if bucket[0].bucket != entry.bucket:
                continue
            bucket[:] = [e for e in bucket if e is not entry]
            if not bucket:
                del buckets[index]
            return


class BanTable:
    """Banned node ids, each with the time its ban ends; at most ``size`` of them.

    :param size: bans kept at most (>= 1).
    """

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size {size!r} must be an integer >= 1")
        self.size = size
        self._until: dict[str, float] = {}
        #: Bans dropped before they ended because the table was full.
        self.evicted = 0

    @property
    def view(self) -> types.MappingProxyType:
        """Node id -> the time its ban ends, read-only."""
        return types.MappingProxyType(self._until)

    def __len__(self) -> int:
        return len(self._until)

    def is_banned(self, node_id: str, now: float) -> bool:
        until = self._until.get(node_id)
        return until is not None and until > now

    def ban(self, node_id: str, until: float, now: float) -> None:
        """Ban ``node_id`` until ``until``, making room if the table is full."""
        self._until.pop(node_id, None)
        if len(self._until) >= self.size:
            self.lift_ended(now)
        while len(self._until) >= self.size:
            del self._until[min(self._until, key=self._until.__getitem__)]
            self.evicted += 1
        self._until[node_id] = until

    def lift_ended(self, now: float) -> None:
        """Forget the bans that ended by ``now``."""
        for node_id in [n for n, until in self._until.items() if until <= now]:
            del self._until[node_id]
