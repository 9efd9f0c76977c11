"""The fabric of a MemoryNetwork: what its nodes and its links share.

One clock that everything runs on; the hosts, each with the node living there now; the
``Path`` between each pair of hosts, with its faults (a black hole, a delay), which
outlive the connections on it and the nodes at its ends; every link made so far; the
flow-control ``window``; and whether dials and listening ports are recorded on the clock
(a ``MemoryReactorClock``) instead of connected in memory.

The layers, each using only those below it: the fabric; the links and their transports
(mconn/testing/transport.py); the nodes, which listen and dial (mconn/testing/node.py);
and ``MemoryNetwork`` (mconn/testing/network.py), the public face over them all.
"""

from __future__ import annotations

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


class Fabric:
    """The clock, hosts, paths and links of one MemoryNetwork.

    :param clock: a ``task.Clock``, or a ``MemoryReactorClock`` that records dials and
        listening ports.
    :param window: bytes a transport may have on their way before it pauses its producer
        (None: never pause).
    :param max_calls_per_instant: zero-delay calls a node may schedule without the clock
        moving before its ``callLater`` raises RuntimeError.
    """

    def __init__(self, clock, *, window: int | None, max_calls_per_instant: int) -> None:
        self.clock = clock
        self.window = window
        self.max_calls_per_instant = max_calls_per_instant
        #: True if dials and listening ports go to the clock (``complete_dials`` connects them).
        self.recording = IReactorTCP.providedBy(clock)
        #: Every MemoryLink made, in order; one removed from here is detached.
        self.links: list = []
        #: host -> the node living there now.
        self.nodes: dict[str, _Host] = {}
        self._paths: dict[frozenset, Path] = {}

    def new_host(self) -> str:
        """The address of the next host (10.0.0.1, 10.0.0.2, ...)."""
        n = len(self.nodes) + 1
        return f"10.0.{n // 250}.{n % 250}"

    def ephemeral(self, host: str) -> IPv4Address:
        """A fresh client address at ``host``."""
        return IPv4Address("TCP", host, 40000 + len(self.links))

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
