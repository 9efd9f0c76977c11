"""A set of bounded size that forgets its least recently used member first.

CometBFT's mempool keeps the keys of the transactions it saw in such a set
(``mempool/cache.go``, ``LRUTxCache``, of ``mempool.cache_size`` keys): what a peer
sends can then make it forget old keys, but never grow past its capacity.
"""

from __future__ import annotations

import collections


class LRUSet:
    """At most ``capacity`` members; adding one to a full set forgets the least recently
    added or touched one. ``in`` does not count as a use (a lookup by a peer's message
    must not keep a key alive)."""

    __slots__ = ("capacity", "_members", "evicted")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"an LRUSet's capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self._members: collections.OrderedDict = collections.OrderedDict()
        #: Members forgotten to make room.
        self.evicted = 0

    def add(self, member) -> None:
        """Add ``member`` (or make it the most recent one), forgetting the oldest if full."""
        if member in self._members:
            self._members.move_to_end(member)
            return
        self._members[member] = None
        if len(self._members) > self.capacity:
            self._members.popitem(last=False)
            self.evicted += 1

    def discard(self, member) -> None:
        self._members.pop(member, None)

    def __contains__(self, member) -> bool:
        return member in self._members

    def __len__(self) -> int:
        return len(self._members)
