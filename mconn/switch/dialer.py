"""Dialer: redialing a persistent peer over a pool of its addresses, with backoff.

A standalone piece of the Twisted layer: time comes from an injected ``clock``
(``IReactorTime``) and connections from an injected ``connect(address) -> Deferred``, so
the owner (the Switch) decides what a connection is. The model is the NATS client's
connector (``connector.rs`` of async-nats, the Rust client):
a server pool with per-address state, an exponential delay with jitter, an optional
limit on attempts, addresses learnt by discovery, and an application callback that may
pick the next address.

Theory of operation
-------------------
The Dialer makes one attempt at a time. Each attempt is chosen, then waited for, then
made:

1. *Choose.* ``choose_address(pool, last_info)`` may name the address and its own delay;
   an answer that is not a candidate of the pool (or None) falls back to the default
   (specs/resume.md section 7.1): first the address that connected last, while it has
   not failed since; then, among the candidates (not banned) with the fewest failed
   attempts, configured addresses before discovered ones, the first one after the
   address tried last, in pool order. So a break is re-dialed where the session last
   ran (the address the user gave, through a proxy, a NAT or a load balancer), an
   address a peer announced is tried only once the configured ones have failed, and
   when every address keeps failing this is plain round-robin. (nats.go starts on the
   next address after a success, to spread a fleet over the servers of a cluster; the
   addresses of a pool here all lead to one node.)
2. *Wait.* ``clock.callLater(delay, ...)``, with ``delay = reconnect_delay(attempt)``
   where ``attempt`` counts from 1 since the last success (or ``reset()``). The delay is
   per attempt, not per sweep of the pool (nats.java#1586: per-sweep jitter kept
   clients in lockstep).
3. *Connect.* Success marks the address ``did_connect``, clears its failures and the
   attempt counter, calls ``on_connected`` and stops: the owner calls ``start()`` again
   after the next break. Failure counts against the address; a permanent refusal
   (``is_not_retried``: another node id, unauthorized, incompatible, TLS required) bans
   it for good. The Dialer gives up, calling ``on_give_up`` with a reason, when
   ``max_reconnects`` attempts failed since the last success (``start(at_least_once=True)``
   owes one attempt first, whatever the limit) or when no candidate is left.

``stop()`` cancels the pending wait and bumps a generation number, so the outcome of an
attempt already in flight is ignored (its failure is swallowed, not left unhandled).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Iterator

from twisted.internet import defer
from twisted.logger import Logger

from mconn.core.address import PeerAddress, parse_address
from mconn.errors import AuthenticationError, PeerClosed, PeerIdMismatch, PeerRejected
from mconn.core.node_info import REFUSALS as INCOMPATIBLE_NODE

log = Logger(namespace="mconn.dialer")

#: Defaults of :func:`default_reconnect_delay` (async-nats: 0, 0, then 2**(n-1) ms up to 4 s).
DEFAULT_MAX_DELAY = 4.0
DEFAULT_JITTER = 0.25
#: 2.0 ** 1024 overflows a float; long before that the cap has been reached.
_MAX_EXPONENT = 1000


def default_reconnect_delay(
    attempt: int,
    *,
    max_delay: float = DEFAULT_MAX_DELAY,
    jitter: float = DEFAULT_JITTER,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before attempt number ``attempt`` (counting from 1).

    The NATS client's default, with multiplicative jitter so a fleet does not redial
    in lockstep (nats.go#563)::

        base  = 0                                         if attempt <= 2
        base  = min(2 ** (attempt - 1) / 1000, max_delay)  otherwise  (2**(n-1) ms)
        delay = base * (1 - jitter + 2 * jitter * u)       u = rng(), clamped to [0, 1]

    so ``0 <= delay <= max_delay * (1 + jitter)``; with ``jitter=0`` the schedule is
    0, 0, 0.004, 0.008, ... 2.048, then ``max_delay`` from attempt 13 on.

    :param max_delay: the cap on ``base``, in seconds (>= 0).
    :param jitter: the relative spread, from 0 (none) to 1.
    :param rng: returns a uniform float in [0, 1); ``random.Random(seed).random`` in tests.
    :raises ValueError: naming the argument that is out of range.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt {attempt!r} must be an int from 1 up")
    if not max_delay >= 0:
        raise ValueError(f"max_delay {max_delay!r} must be >= 0")
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter {jitter!r} must be from 0 to 1")
    if attempt <= 2:
        return 0.0
    base = min(2.0 ** min(attempt - 1, _MAX_EXPONENT) / 1000, max_delay)
    spread = min(max(rng(), 0.0), 1.0)
    return base * (1 - jitter + 2 * jitter * spread)


# -- which failures are not retried ----------------------------------------------------


#: Failures that ban an address (the NATS clients stop on repeated auth errors).
#: Read at call time, so an owner may extend it.
NOT_RETRIED: tuple[type[BaseException], ...] = (PeerIdMismatch, AuthenticationError)
#: ``PeerRejected.reason`` / ``PeerClosed.code`` values that ban an address: answers the
#: same address gives every time, because the node there (its key, its configuration)
#: decides them, not the network or the moment. ``id_mismatch``: another node answers
#: there; ``unauthorized``: its ``allowed_peers`` or ``authorize`` refuses this node;
#: ``self``: it leads back to this node; ``tls_required``: a TLS-only listener refuses
#: this node's plaintext start, and will again.
NOT_RETRIED_REASONS = frozenset({"unauthorized", "id_mismatch", "self", "tls_required"})
#: A node the compatibility rule refused (another network, block version, no common
#: channel, no node info: specs/handshake.md section 6.2) stays refused.
NOT_RETRIED_REASONS |= INCOMPATIBLE_NODE
#: Everything else is retried, with the backoff: connection errors and timeouts, a node
#: that is stopping (``shutdown``) or closed the session (``closed``), and refusals that
#: pass: ``session_held`` (the node holds the suspended session of this node's previous
#: process until its grace ends; specs/resume.md section 6.4), ``inbound_limit`` /
#: ``outbound_limit``, ``pending_limit`` / ``ip_limit``, ``authorize_timeout``,
#: ``unproven``, ``duplicate`` / ``simultaneous_dial`` (another connection brings the
#: session), protocol errors.


def is_not_retried(error: BaseException) -> bool:
    """Whether ``error`` means the address must not be dialed again (a permanent
    refusal: NOT_RETRIED, NOT_RETRIED_REASONS); any other failure is retried."""
    if isinstance(error, NOT_RETRIED):
        return True
    if isinstance(error, PeerRejected):
        return error.reason in NOT_RETRIED_REASONS
    if isinstance(error, PeerClosed):
        return error.code in NOT_RETRIED_REASONS
    return False


# -- the address pool ------------------------------------------------------------------


@dataclasses.dataclass
class AddressState:
    """One address of the pool and what dialing it has taught us (nats.rs ``Server``)."""

    address: PeerAddress
    #: Failures since the last success at this address.
    failed_attempts: int = 0
    #: Whether a connection to it ever succeeded.
    did_connect: bool = False
    last_error: BaseException | None = None
    #: ``clock.seconds()`` when it was last dialed.
    last_attempt: float | None = None
    #: Learnt from a peer, not configured.
    discovered: bool = False
    #: Never dialed again: it failed with an error in NOT_RETRIED.
    banned: bool = False


def _as_address(address: PeerAddress | str) -> PeerAddress:
    return address if isinstance(address, PeerAddress) else parse_address(address)


class AddressPool:
    """The addresses a Dialer may use, each with its AddressState, in dialing order.

    :param addresses: PeerAddress objects or their text; duplicates are dropped.
    :param retain_order: keep the given order instead of shuffling it (NATS's
        ``retain_servers_order``); a shuffled pool spreads a fleet over the addresses.
    :param ignore_discovered: make :meth:`add_discovered` a no-op.
    :param rng: the shuffler (a fresh ``random.Random()`` if None).
    :raises ValueError: for an address that does not parse.
    """

    def __init__(
        self,
        addresses: Iterable[PeerAddress | str],
        *,
        retain_order: bool = False,
        ignore_discovered: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.retain_order = retain_order
        self.ignore_discovered = ignore_discovered
        self._rng = rng if rng is not None else random.Random()
        self.states: list[AddressState] = self._ordered(AddressState(a) for a in self._unique(addresses))

    def __iter__(self) -> Iterator[AddressState]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def __contains__(self, address: object) -> bool:
        return self.get(address) is not None

    def get(self, address: object) -> AddressState | None:
        """The state of ``address`` (a PeerAddress, its text, or an AddressState), or None."""
        if isinstance(address, AddressState):
            return address if any(s is address for s in self.states) else None
        if not isinstance(address, (PeerAddress, str)):
            return None  # not an address at all
        try:
            wanted = _as_address(address)
        except ValueError:
            return None
        return next((s for s in self.states if s.address == wanted), None)

    def add_discovered(self, address: PeerAddress | str) -> bool:
        """Append an address learnt from a peer; False if ignored or already present."""
        if self.ignore_discovered:
            return False
        address = _as_address(address)
        if address in self:
            return False
        self.states.append(AddressState(address, discovered=True))
        return True

    def add_configured(self, address: PeerAddress | str) -> None:
        """Append a configured address, or mark a discovered one as configured."""
        address = _as_address(address)
        state = self.get(address)
        if state is None:
            self.states.append(AddressState(address))
        else:
            state.discovered = False

    def replace(self, addresses: Iterable[PeerAddress | str]) -> None:
        """Make ``addresses`` the pool (NATS ``set_server_pool``).

        An address in both pools keeps its AddressState (failures, ban, ``did_connect``),
        now marked as configured rather than discovered. Pair with ``Dialer.reset()``,
        or call ``Dialer.set_address_pool`` which does both.
        """
        kept = {s.address: s for s in self.states}
        states = []
        for address in self._unique(addresses):
            state = kept.get(address) or AddressState(address)
            state.discovered = False
            states.append(state)
        self.states = self._ordered(states)

    def candidates(self) -> list[AddressState]:
        """The addresses that may be dialed, fewest failed attempts first, else in pool order."""
        return sorted((s for s in self.states if not s.banned), key=lambda s: s.failed_attempts)

    def _unique(self, addresses: Iterable[PeerAddress | str]) -> list[PeerAddress]:
        return list(dict.fromkeys(_as_address(a) for a in addresses))

    def _ordered(self, states: Iterable[AddressState]) -> list[AddressState]:
        states = list(states)
        if not self.retain_order:
            self._rng.shuffle(states)
        return states


# -- the dialer ------------------------------------------------------------------------


class Dialer:
    """Dials the addresses of a pool, one attempt at a time, until one connects.

    :param clock: an ``IReactorTime``; all waiting is ``clock.callLater``.
    :param connect: ``connect(address: PeerAddress) -> Deferred`` firing with the
        connection (a Peer, say) or failing.
    :param pool: the AddressPool to dial.
    :param reconnect_delay: ``reconnect_delay(attempt) -> seconds``, attempt from 1.
    :param max_reconnects: give up after this many failed attempts since the last
        success; None never gives up (while a candidate is left).
    :param choose_address: ``choose_address(pool, last_info) -> (address, delay)``, where
        address is an AddressState, a PeerAddress or None and delay is seconds or None
        (NATS's ``reconnect_to_server_callback``); an address that is not a candidate of
        the pool, or None, means the default order; a delay of None (or negative) means
        ``reconnect_delay(attempt)``.
    :param on_attempt: ``on_attempt(info)`` after every attempt; ``info`` has ``address``
        (str), ``attempt`` (from 1 since the last success), ``delay`` (seconds waited
        before it), ``result`` (``connected``, ``failed`` or ``not_retried``) and
        ``error`` (str or None).
    :param on_connected: ``on_connected(result, address_state)`` after a success.
    :param on_give_up: ``on_give_up(reason: str)`` when the Dialer gives up.

    A callback that raises is logged and does not stop the Dialer.
    """

    def __init__(
        self,
        *,
        clock,
        connect: Callable[[PeerAddress], defer.Deferred],
        pool: AddressPool,
        reconnect_delay: Callable[[int], float] = default_reconnect_delay,
        max_reconnects: int | None = None,
        choose_address=None,
        on_attempt=None,
        on_connected=None,
        on_give_up=None,
    ) -> None:
        if max_reconnects is not None and max_reconnects < 0:
            raise ValueError(f"max_reconnects {max_reconnects!r} must be None or >= 0")
        self.clock = clock
        self.connect = connect
        self.pool = pool
        self.reconnect_delay = reconnect_delay
        self.max_reconnects = max_reconnects
        self.choose_address = choose_address
        self.on_attempt = on_attempt
        self.on_connected = on_connected
        self.on_give_up = on_give_up
        #: Attempts made since the last success or ``reset()``.
        self.attempts = 0
        self.running = False
        #: The ``info`` of the last attempt (as given to ``on_attempt``), or None.
        self.last_info: dict | None = None
        self._pending = None
        self._last_tried: AddressState | None = None
        #: The address of the last success: the first one tried after a break.
        self._last_connected: AddressState | None = None
        #: Bumped by stop(): outcomes of attempts from an older generation are ignored.
        self._generation = 0
        #: An attempt is owed whatever ``max_reconnects`` says (``start(at_least_once=True)``).
        self._owed_attempt = False

    def start(self, *, at_least_once: bool = False) -> None:
        """Begin attempting; the first attempt comes after ``reconnect_delay(attempts + 1)``.

        :param at_least_once: make one attempt even if ``max_reconnects`` allows none
            (a first dial: ``max_reconnects`` bounds the attempts after a failure).
        """
        if at_least_once and not self.attempts:
            self._owed_attempt = True
        if self.running:
            return
        self.running = True
        self._schedule_next()

    def stop(self) -> None:
        """Cancel the pending wait and ignore the outcome of an attempt in flight."""
        self.running = False
        self._owed_attempt = False
        self._generation += 1
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None

    def reset(self) -> None:
        """Set the attempt counter back to 0 (a success elsewhere, or a new pool)."""
        self.attempts = 0

    def set_address_pool(self, addresses: Iterable[PeerAddress | str]) -> None:
        """``pool.replace(addresses)`` and ``reset()``; a pending wait is kept."""
        self.pool.replace(addresses)
        self.reset()

    # -- one attempt ---------------------------------------------------------------

    def _schedule_next(self) -> None:
        reason = self._give_up_reason()
        if reason is not None:
            self._give_up(reason)
            return
        state, delay = self._choose()
        self._pending = self.clock.callLater(delay, self._attempt, state, delay)

    def _give_up_reason(self) -> str | None:
        if not self.pool.candidates():
            if not len(self.pool):
                return "the address pool is empty"
            banned = ", ".join(f"{s.address} ({_describe(s.last_error)})" for s in self.pool)
            return f"no address left to dial; all are banned: {banned}"
        if self._owed_attempt:
            return None
        if self.max_reconnects is not None and self.attempts >= self.max_reconnects:
            reason = f"gave up after {self.attempts} failed attempts (max_reconnects={self.max_reconnects})"
            if self.last_info is not None:
                reason += f"; the last, to {self.last_info['address']}, failed with {self.last_info['error']}"
            return reason
        return None

    def _choose(self) -> tuple[AddressState, float]:
        """The next address and the delay before dialing it."""
        attempt = self.attempts + 1
        choice, delay = None, None
        if self.choose_address is not None:
            answer = self._call("choose_address", self.choose_address, self.pool, self.last_info)
            if isinstance(answer, tuple) and len(answer) == 2:
                choice, delay = answer
        state = self._candidate(choice) or self._next_in_order()
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not delay >= 0:
            delay = self.reconnect_delay(attempt)
        return state, float(delay)

    def _candidate(self, choice: object) -> AddressState | None:
        """``choice`` as a candidate of the pool, or None if it is not one."""
        if choice is None:
            return None
        state = self.pool.get(choice)
        return state if state is not None and not state.banned else None

    def _next_in_order(self) -> AddressState:
        """The address that connected last while it has not failed since; else
        round-robin among the candidates with the fewest failures, configured first."""
        candidates = self.pool.candidates()
        last = self._last_connected
        if last is not None and last.failed_attempts == 0 and any(s is last for s in candidates):
            return last
        best = min((s.failed_attempts, s.discovered) for s in candidates)
        fewest = [s for s in candidates if (s.failed_attempts, s.discovered) == best]
        position = {id(s): i for i, s in enumerate(self.pool.states)}
        tried = position.get(id(self._last_tried))
        if tried is not None:
            after = [s for s in fewest if position[id(s)] > tried]
            if after:
                return after[0]
        return fewest[0]

    def _attempt(self, state: AddressState, delay: float) -> None:
        self._pending = None
        if self.pool.get(state) is None or state.banned:  # the pool changed during the wait
            reason = self._give_up_reason()
            if reason is not None:
                self._give_up(reason)
                return
            state = self._next_in_order()
        self.attempts += 1
        self._owed_attempt = False
        self._last_tried = state
        state.last_attempt = self.clock.seconds()
        info = {"address": str(state.address), "attempt": self.attempts, "delay": delay}
        generation = self._generation
        d = defer.maybeDeferred(self.connect, state.address)
        d.addCallbacks(
            self._connected,
            self._failed,
            callbackArgs=(state, info, generation),
            errbackArgs=(state, info, generation),
        )

    def _connected(self, result, state: AddressState, info: dict, generation: int) -> None:
        if generation != self._generation:
            return None
        state.did_connect = True
        state.failed_attempts = 0
        self._last_connected = state
        self.attempts = 0
        self.running = False
        self._report(info, "connected", None)
        if self.on_connected is not None:
            self._call("on_connected", self.on_connected, result, state)
        return None

    def _failed(self, failure, state: AddressState, info: dict, generation: int) -> None:
        if generation != self._generation:
            return None  # stopped: the failure is swallowed, not left unhandled
        error = failure.value
        state.failed_attempts += 1
        state.last_error = error
        state.banned = state.banned or is_not_retried(error)
        self._report(info, "not_retried" if state.banned else "failed", _describe(error))
        if self.running and generation == self._generation:  # on_attempt may have stopped us
            self._schedule_next()
        return None

    def _report(self, info: dict, result: str, error: str | None) -> None:
        info.update(result=result, error=error)
        self.last_info = info
        if self.on_attempt is not None:
            self._call("on_attempt", self.on_attempt, dict(info))

    def _give_up(self, reason: str) -> None:
        self.running = False
        if self.on_give_up is not None:
            self._call("on_give_up", self.on_give_up, reason)

    def _call(self, name: str, function, *args):
        """Call an owner's callback; log what it raises and return None instead."""
        try:
            return function(*args)
        except Exception:
            log.failure("dialer callback {callback} failed", callback=name)
            return None


def _describe(error: BaseException | None) -> str | None:
    """``Type: message`` for info dicts and give-up reasons."""
    if error is None:
        return None
    return f"{type(error).__name__}: {error}"
