"""An in-process TCP fault proxy for loopback networks: a small toxiproxy written with Twisted.

The integration tests and the fleet demo (examples/fleet.py) break links with it, and
operators with ``mconn faultproxy`` (mconn/ops/cli.py), which runs one on a schedule.

A FaultProxy listens on the loopback (127.0.0.1 unless told ::1) and relays every accepted
connection to one target on the loopback (127.0.0.1 or ::1). Faults are injected on demand, by the caller, in the
caller's own reactor: reset (RST both ends), black hole (the unplugged cable: nothing is
forwarded and nothing is closed), latency, a cut after exactly N bytes (a break at any
byte offset, in the middle of a frame) and refusal (a node that is down). These are
toxiproxy's toxics reset_peer, timeout=0, latency and limit_data, and its "enabled: false",
which the kernel here cannot do.

This module is the proxy: it listens, accepts, refuses and hands each accepted connection
to a new Link, and it holds the fault settings that apply to every link or to new ones.
The links (a pipe each way, delay, backpressure, half-close, reset, black hole and cut)
are in mconn/ops/faultproxy_link.py; ``Link``, ``MAX_BUFFERED`` and ``DIRECTIONS`` are
importable from here too.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IListeningPort

from mconn.ops.faultproxy_link import DIRECTIONS, MAX_BUFFERED, Link, check_cut, log

__all__ = ["DIRECTIONS", "MAX_BUFFERED", "FaultProxy", "Link"]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Refused(protocol.Protocol):
    """Accepted, then aborted at once: a node that is down."""

    def connectionMade(self):
        self.transport.abortConnection()


class _ListenFactory(protocol.Factory):
    noisy = False

    def __init__(self, proxy):
        self.proxy = proxy

    def buildProtocol(self, addr):
        return self.proxy._accept()


class FaultProxy:
    """Relays TCP connections from a loopback ``port`` to a loopback target, with faults.

    Fault settings (``refuse``, ``blackhole_all``/``heal``, ``set_delay``, ``cut_after``)
    last until changed; each says whether it touches live links or only new ones.
    """

    def __init__(self, target_host: str, target_port: int, *, clock=None):
        if not _is_loopback(target_host):
            raise ValueError(f"FaultProxy targets loopback IP addresses only, got {target_host!r}")
        if clock is None:
            from twisted.internet import reactor as clock
        self.target_host = target_host
        self.target_port = target_port
        self.clock = clock
        self.port: int | None = None
        self.links: list[Link] = []
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections_accepted = 0
        self.delay = 0.0
        self._refusing = False
        self._blackholed = False
        self._cut: list[Any] | None = None  # [nbytes, direction, links left or None for every new link]
        self._listening: IListeningPort | None = None
        self._stop_state = "running"  # -> "stopping" -> "stopped"
        self._stop_waiters: list[defer.Deferred[None]] = []

    async def start(self, listen_port: int = 0, interface: str = "127.0.0.1") -> int:
        """Listen on ``interface``:``listen_port`` (0: any free port); return the port.

        :param interface: a loopback IP address (127.0.0.1, ::1, ...).
        :raises ValueError: for an interface that is not a loopback IP address.
        :raises twisted.internet.error.CannotListenError: the port is in use.
        """
        if self._listening is not None or self._stop_state != "running":
            raise RuntimeError("a FaultProxy starts once")
        if not _is_loopback(interface):
            raise ValueError(f"FaultProxy listens on loopback IP addresses only, got {interface!r}")
        listening = self.clock.listenTCP(listen_port, _ListenFactory(self), interface=interface)
        self._listening = listening
        self.port = port = listening.getHost().port
        return port

    async def stop(self):
        """Stop listening, abort every live link and wait until all are gone. Idempotent."""
        if self._stop_state == "stopped":
            return
        if self._stop_state == "stopping":
            d = defer.Deferred()
            self._stop_waiters.append(d)
            await d
            return
        self._stop_state = "stopping"
        try:
            waits = []
            if self._listening is not None:
                waits.append(defer.maybeDeferred(self._listening.stopListening))
            for link in list(self.links):
                link.reset()
                waits.append(link.when_closed())
            await defer.gatherResults(waits, consumeErrors=True)
        finally:
            self._stop_state = "stopped"
            waiters, self._stop_waiters = self._stop_waiters, []
            for d in waiters:
                d.callback(None)

    def reset_all(self) -> int:
        """Abort (RST) both sockets of every live link; return how many links."""
        return sum(1 for link in list(self.links) if link.reset())

    def blackhole_all(self) -> None:
        """Black-hole every live link (see Link.blackhole) and every new one until heal():
        new connections are accepted but never reach the target."""
        self._blackholed = True
        for link in list(self.links):
            link.blackhole()

    def heal(self) -> None:
        """New links forward normally again. Links black-holed stay dead, as a real
        cable's connections do: what was dropped during the hole is gone; reset them
        or let the endpoints time out and reconnect."""
        self._blackholed = False

    def set_delay(self, seconds: float) -> None:
        """Delay every chunk forwarded from now on, on every link, by ``seconds``
        (0 = none). Order is kept per direction: a chunk never overtakes an older one."""
        if not seconds >= 0:
            raise ValueError(f"set_delay needs seconds >= 0, got {seconds!r}")
        self.delay = float(seconds)

    def cut_after(self, nbytes, direction: str = "both", *, links=1) -> None:
        """Arm a cut for the next ``links`` new links (None: every new link until
        disarmed): each is aborted after forwarding exactly ``nbytes`` bytes 'up'
        (client -> server), 'down' or 'both' (the sum). ``cut_after(None)`` disarms.
        Live links are untouched; use Link.cut_after for them."""
        if nbytes is None:
            self._cut = None
            return
        check_cut(nbytes, direction)
        if links is not None and links < 1:
            raise ValueError(f"cut_after needs links >= 1 or None, got {links!r}")
        self._cut = [nbytes, direction, links]

    def refuse(self, on: bool) -> None:
        """While on, accept each new connection and abort it at once (a node that is
        down). Live links are untouched."""
        self._refusing = bool(on)

    # -- from the factory and the links --

    def _accept(self):
        self.connections_accepted += 1
        if self._refusing or self._stop_state != "running":
            return _Refused()
        link = Link(self, blackholed=self._blackholed, cut=self._take_cut())
        self.links.append(link)
        log.debug("fault proxy: link {link_id} accepted", link_id=link.id)
        return link.client

    def _take_cut(self):
        if self._cut is None:
            return None
        nbytes, direction, left = self._cut
        if left is not None:
            self._cut[2] = left - 1
            if left == 1:
                self._cut = None
        return nbytes, direction

    def link_closed(self, link):
        """A link's two sockets are gone: the proxy forgets it."""
        if link in self.links:
            self.links.remove(link)
        log.debug("fault proxy: link {link_id} closed", link_id=link.id)
