"""PEX's dialing: the book entries a round dials, and what a failed dial does to its entry.

specs/pex.md section 3.1 step 2 (dial book entries up to ``target_outbound`` outbound
peers, within the dial budget, never a node that has a session, is being dialed, is
dialed by the Switch already or is our own address) and the dial rules of section 3.4
(a failed dial backs off exponentially; after ``max_dial_failures``, or at once for
another node's address or one that led back to this node, the entry is forgotten; a dial
refused as ``duplicate`` or ``simultaneous_dial`` is not a failure). Nodes the Switch
banned (``Switch.mark_bad``) are not dialed, nor, with ``Config.allow_duplicate_ip``
False, an IP address that has a session already (CometBFT's ``IsDialingOrExistingAddress``);
a dial the Switch refuses as ``banned`` or ``duplicate_ip`` is not a failure either,
and waits ``max_dial_backoff``.

Two rules for a restart (specs/pex.md section 3.11), where an eclipse attacker gets its
chance (Heilman et al. 2015): the *anchors* (the outbound peers the book file named
when it was saved) are dialed first; and a node that refuses us as ``session_held``
holds the session of this node's previous process (specs/resume.md section 6.4); if it
is in the tried table (we completed an outbound session with it: we chose it), it is
alive and was our peer: that is no failure, it is dialed again every ``HELD_RETRY``
seconds for up to ``held_wait`` (its grace ends meanwhile), and its outbound slot stays
reserved for it, not filled from the book. Only tried entries: any node can answer
``session_held``, and an attacker's nodes that dialed us would hold slots otherwise. A
node gets one wait: after ``held_wait`` a ``session_held`` is a failure like any. A
:class:`PexDialer` is a part of one ``reactors.pex.PexReactor``: it reads the reactor's
Switch, counters and dial settings when it uses them, and shares its book and random
generator.
"""

from __future__ import annotations

import ipaddress
import random

from twisted.logger import Logger

from mconn import PeerClosed, PeerIdMismatch, PeerRejected
from mconn.core.address import PeerAddress, is_own_address
from mconn.core.rate import TokenBucket
from reactors.addrbook import AddressBook, BookEntry

log = Logger(namespace="reactors.pex")

#: Errors of a dial that mean the node is connected anyway (specs/resume.md section 7).
_CONNECTED_ANYWAY = frozenset({"duplicate", "simultaneous_dial"})
#: Refusals of this node's own Switch: no fault of the address; it waits max_dial_backoff.
_REFUSED_HERE = frozenset({"banned", "duplicate_ip"})
#: Addresses that led to ourselves, remembered at most (CometBFT's "our addresses").
MAX_OWN_ADDRESSES = 16
#: The refusal of a node that holds the session of our previous process until its grace ends.
_HELD = "session_held"
#: Seconds between dials of a node that refused us as ``session_held`` (mconn's own
#: persistent dials retry as often: ``Config.max_reconnect_delay``, default 5 s).
HELD_RETRY = 5.0


class PexDialer:
    """The dials of one PexReactor: those in flight, the dial budget, our own addresses."""

    def __init__(self, pex, book: AddressBook, rng: random.Random) -> None:
        self._pex, self._book, self._rng = pex, book, rng
        self._dialing: set[str] = set()
        #: Addresses that led to ourselves (dict as an ordered set).
        self._own: dict[PeerAddress, None] = {}
        self._dial_tokens: TokenBucket | None = None
        #: Whether each book address leads to our own listeners (is_own_address parses
        #: every listen address each time), for the listen addresses of ``_own_for``.
        self._own_cache: dict[PeerAddress, bool] = {}
        self._own_for: tuple = ()
        #: Node ids to dial before any pick from the book (the anchors of the book file).
        self.anchors: list[str] = []
        #: Node ids that refused us as ``session_held``, each with the end of its wait;
        #: each keeps an outbound slot reserved until it connects or the wait ends.
        self.held: dict[str, float] = {}
        #: The one timer that dials held nodes again (HELD_RETRY after a refusal).
        self._retry = None

    def listen_addresses(self) -> list:
        """Our own addresses: the Switch's listen address and those that led to ourselves."""
        listening = getattr(self._pex.switch, "listen_address", "")
        return ([listening] if listening else []) + list(self._own)

    def _is_own(self, address: PeerAddress, listening: list) -> bool:
        """``is_own_address``, remembered until the listen addresses change (bounded by
        twice the book's capacity: past it the memory starts again)."""
        key = tuple(listening)
        if key != self._own_for or len(self._own_cache) > 2 * self._book.capacity:
            self._own_cache, self._own_for = {}, key
        own = self._own_cache.get(address)
        if own is None:
            own = self._own_cache[address] = is_own_address(address, listening)
        return own

    def dial_more(self, now: float) -> None:
        """Dial book entries until ``target_outbound`` outbound peers are up or being
        dialed, as far as the dial budget (``dial_rate``, ``dial_burst``) allows.

        The eligible entries are gathered once (``AddressBook.candidates``) and each
        dialed one dropped from them; they are gathered again only if the dial changed
        the book (a dial that fails at once may forget its entry)."""
        pex, switch = self._pex, self._pex.switch
        if not getattr(switch, "running", False):
            return
        target = pex.target_outbound if pex.target_outbound is not None else switch.config.max_outbound_peers
        for node_id, until in list(self.held.items()):
            if until <= now or node_id in switch.peers or node_id not in self._book:
                del self.held[node_id]
        first = [n for n in self.anchors if n not in self._dialing and n not in switch.peers and n in self._book]
        first += [n for n in self.held if n not in self._dialing and n not in first]
        outbound = sum(1 for p in switch.peers.values() if p.is_outbound) + len(self._dialing) + len(first)
        if self._dial_tokens is None:
            self._dial_tokens = TokenBucket(pex.dial_rate, now, burst=pex.dial_burst)
        listening = self.listen_addresses()
        bans = getattr(switch, "bans", None)
        in_use = None if getattr(switch.config, "allow_duplicate_ip", True) else _ips_in_use(switch.peers)

        def eligible(entry: BookEntry) -> bool:
            node_id = entry.address.node_id
            return (
                node_id not in switch.peers
                and node_id not in self._dialing
                and entry.next_dial <= now
                and switch.address_pool(node_id) is None  # the Switch dials it already
                and not self._is_own(entry.address, listening)
                and (bans is None or not bans.is_banned(node_id))
                and (in_use is None or _ip(entry.address.host) not in in_use)
            )

        for node_id in first:  # anchors, then the nodes that hold our old sessions: their slots are theirs
            entry = self._book.get(node_id)
            if entry is None or not eligible(entry):
                if node_id in self.anchors:  # banned, our own, dialed by the Switch: no anchor
                    self.anchors.remove(node_id)
                continue  # a held node's next retry is not due yet
            if self._dial_tokens.available(now) < 1:
                pex.counters["dials_deferred"] += 1
                return
            if node_id in self.anchors:
                self.anchors.remove(node_id)
                pex.counters["anchor_dials"] += 1
            self._dial_tokens.spend(1, now)
            self._dial(entry)
        candidates = None
        for _ in range(max(0, target - outbound)):
            if candidates is None or candidates.version != self._book.version:
                candidates = self._book.candidates(eligible)
            if self._dial_tokens.available(now) < 1:
                if candidates.pick(self._rng) is not None:
                    pex.counters["dials_deferred"] += 1
                return
            entry = candidates.pick(self._rng)
            if entry is None:
                return
            self._dial_tokens.spend(1, now)
            self._dial(entry)
            if not eligible(entry):  # it is being dialed (or a refusal left it eligible)
                candidates.discard(entry)

    def _dial(self, entry: BookEntry) -> None:
        node_id = entry.address.node_id
        self._dialing.add(node_id)
        self._pex.counters["dials"] += 1
        d = self._pex.switch.dial(str(entry.address), retry_initial_dial=False)
        d.addCallbacks(self._dialed, self._dial_failed, callbackArgs=(node_id,), errbackArgs=(node_id, entry.address))

    def _retry_held(self) -> None:
        self._retry = None
        if self.held:
            self.dial_more(self._pex.switch.clock.seconds())

    def _dialed(self, peer, node_id: str) -> None:
        self._dialing.discard(node_id)
        self.held.pop(node_id, None)

    def _dial_failed(self, failure, node_id: str, address: PeerAddress) -> None:
        pex = self._pex
        self._dialing.discard(node_id)
        error = failure.value
        entry = self._book.get(node_id)
        if not getattr(pex.switch, "running", False) or entry is None:
            return
        word = getattr(error, "reason", None) if isinstance(error, PeerRejected) else None
        word = error.code if isinstance(error, PeerClosed) else word
        if word in _CONNECTED_ANYWAY:
            return
        if word in _REFUSED_HERE:
            entry.next_dial = pex.switch.clock.seconds() + pex.max_dial_backoff
            return
        now = pex.switch.clock.seconds()
        if word == _HELD and entry.tried:  # a node we chose (any node can answer session_held)
            if entry.held_until is None:  # once per entry: a node that keeps refusing so is failing
                entry.held_until = self.held[node_id] = now + pex.held_wait_for(pex.switch)
            if entry.held_until > now:
                pex.counters["dials_held"] += 1  # alive, and our peer before: its slot waits for it
                entry.next_dial = now + HELD_RETRY
                if self._retry is None or not self._retry.active():  # rounds may be further apart
                    self._retry = pex.switch.clock.callLater(HELD_RETRY, self._retry_held)
                return
        pex.counters["dial_failures"] += 1
        entry.failures += 1
        entry.last_error = f"{type(error).__name__}: {error}"
        if word == "self":  # the address leads to ourselves: never again
            self._own[address] = None
            while len(self._own) > MAX_OWN_ADDRESSES:
                del self._own[next(iter(self._own))]
        if word == "self" or isinstance(error, PeerIdMismatch) or entry.failures >= pex.max_dial_failures:
            self._book.remove(node_id)
            pex.counters["addresses_forgotten"] += 1
            log.info("pex forgets {address}: {error}", address=str(entry.address), error=entry.last_error)
            return
        backoff = min(pex.dial_backoff * 2 ** min(entry.failures - 1, 30), pex.max_dial_backoff)
        entry.next_dial = pex.switch.clock.seconds() + backoff


def _ip(host: str | None):
    """``host`` as an IP address (an IPv4-mapped one as IPv4), or None for a name."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _ips_in_use(peers) -> set:
    """The IP addresses the sessions in ``peers`` come from."""
    return {ip for ip in (_ip(getattr(p, "remote_host", None)) for p in peers.values()) if ip is not None}
