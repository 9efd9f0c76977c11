"""The fabric of a MemoryNetwork: what its nodes and its links share.

One clock that everything runs on; the hosts, each with the node living there now; the
``Path`` between each pair of hosts, with its faults (a black hole, a delay), which
outlive the connections on it and the nodes at its ends; the links made so far (with
``keep_closed_links`` False, only those an end still has: a network of many nodes makes
tens of thousands, each holding its two protocols and all they reference); the
flow-control ``window``; and whether dials and listening ports are recorded on the clock
(a ``MemoryReactorClock``) instead of connected in memory.

The layers, each using only those below it: the fabric; the links and their transports
(mconn/testing/transport.py); the nodes, which listen and dial (mconn/testing/node.py);
and ``MemoryNetwork`` (mconn/testing/network.py), the public face over them all.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Protocol

from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IReactorTCP


class _Host(Protocol):
    """What the fabric and the links read of a node (``mconn.testing.node._Node``,
    which imports this module)."""

    host: str
    alive: bool
    host_up: bool
    ports: dict[int, tuple]


@dataclass
class Path:
    """The faults between two hosts (both ways)."""

    blackholed: bool = False
    delay: float = 0.0


def check_delay(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"a delay is a finite number of seconds >= 0, got {seconds!r}")
    return float(seconds)


class LinkList(list):
    """The links of a fabric: a list (tests index it, and remove a link from it to detach
    it) that also answers ``link in links`` in constant time, by identity; a link's
    clock calls ask it at every delivery, and a large network holds tens of thousands."""

    def __init__(self) -> None:
        super().__init__()
        self._ids: collections.Counter = collections.Counter()

    def __contains__(self, link: object) -> bool:
        return self._ids[id(link)] > 0

    def append(self, link) -> None:
        super().append(link)
        self._ids[id(link)] += 1

    def remove(self, link) -> None:
        if link not in self:
            raise ValueError(f"{link!r} is not in the links")
        super().remove(link)  # links compare by identity: the one held is the one removed
        self._forget(link)

    def __delitem__(self, index) -> None:
        gone = self[index] if isinstance(index, slice) else [self[index]]
        super().__delitem__(index)
        for link in gone:
            self._forget(link)

    def pop(self, index=-1):
        link = super().pop(index)
        self._forget(link)
        return link

    def clear(self) -> None:
        super().clear()
        self._ids.clear()

    def _forget(self, link) -> None:
        self._ids[id(link)] -= 1
        if self._ids[id(link)] <= 0:
            del self._ids[id(link)]

    # A list's other ways to change it would bypass the count: refused, not silently wrong.
    def _refuse(self, *args, **kwargs):
        raise TypeError("the links are changed by append, remove, pop, del and clear only")

    insert = extend = __setitem__ = __iadd__ = __imul__ = sort = reverse = _refuse


class Fabric:
    """The clock, hosts, paths and links of one MemoryNetwork.

    :param clock: a ``task.Clock``, or a ``MemoryReactorClock`` that records dials and
        listening ports.
    :param window: bytes a transport may have on their way before it pauses its producer
        (None: never pause).
    :param max_calls_per_instant: zero-delay calls a node may schedule without the clock
        moving before its ``callLater`` raises RuntimeError.
    :param keep_closed_links: keep every link made in ``links``; if False, a link no end
        has any more leaves ``links`` (its bytes still count in ``delivered_bytes``).
    """

    def __init__(
        self, clock, *, window: int | None, max_calls_per_instant: int, keep_closed_links: bool = True
    ) -> None:
        self.clock = clock
        self.window = window
        self.max_calls_per_instant = max_calls_per_instant
        #: True if dials and listening ports go to the clock (``complete_dials`` connects them).
        self.recording = IReactorTCP.providedBy(clock)
        #: Every MemoryLink made, in order (but the closed ones dropped, with
        #: keep_closed_links False); one removed from here is detached.
        self.links: LinkList = LinkList()
        self.keep_closed_links = keep_closed_links
        #: Links made so far (dropped ones included); numbers the ephemeral ports.
        self.opened = 0
        #: Bytes delivered on the links dropped from ``links`` (closed_link).
        self.dropped_delivered_bytes = 0
        #: host -> the node living there now.
        self.nodes: dict[str, _Host] = {}
        self._paths: dict[frozenset, Path] = {}

    def new_host(self) -> str:
        """The address of the next host (10.0.0.1, 10.0.0.2, ...)."""
        n = len(self.nodes) + 1
        return f"10.0.{n // 250}.{n % 250}"

    def ephemeral(self, host: str) -> IPv4Address:
        """A fresh client address at ``host``."""
        return IPv4Address("TCP", host, 40000 + self.opened)

    def closed_link(self, link) -> None:
        """No end has ``link`` any more: drop it from ``links`` unless they are kept.
        Nothing more crosses it (both ends are closed, their pipes were cleared), so a
        clock call still scheduled on it finds it detached and does nothing."""
        if self.keep_closed_links or link not in self.links:
            return
        self.links.remove(link)
        self.dropped_delivered_bytes += link.delivered_bytes

    def delivered_bytes(self) -> int:
        """Bytes delivered on every link made, dropped ones included."""
        return self.dropped_delivered_bytes + sum(link.delivered_bytes for link in self.links)

    def host_up(self, node) -> bool:
        """Whether a kernel runs at the host of ``node`` (to send resets); a raw protocol's has one."""
        if node is None:
            return True
        current = self.nodes.get(node.host)
        return current is not None and (current.alive or current.host_up)

    # -- paths -------------------------------------------------------------------------------

    def path(self, host_a: str, host_b: str) -> Path:
        """The path between two hosts (made on first use)."""
        key = frozenset((host_a, host_b))
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = Path()
        return path

    def paths(self) -> list[Path]:
        """Every path used so far."""
        return list(self._paths.values())

    def set_blackhole(self, path: Path, on: bool) -> None:
        """Black-hole ``path``, or heal it: what its live links held moves again."""
        path.blackholed = on
        if not on:
            for link in self.links_on(path):
                link._schedule(0)
                link._schedule(1)

    def set_blackholes(self, paths, on: bool) -> None:
        """``set_blackhole`` for many paths, in one pass over the links (a partition of
        a large network cuts or heals thousands of paths at once)."""
        changed = set()
        for path in paths:
            path.blackholed = on
            changed.add(id(path))
        if not on:
            for link in self.links:
                if id(link._path) in changed and link.alive:
                    link._schedule(0)
                    link._schedule(1)

    def links_on(self, path: Path) -> list:
        """The links on ``path`` that at least one end still has."""
        return [link for link in self.links if link._path is path and link.alive]
