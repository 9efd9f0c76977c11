"""Persistent dialing: keep nodes connected, re-dial suspended sessions (specs/resume.md 7.1).

Theory of operation. One ``_Redial`` per node id: a ``mconn.switch.dialer.Dialer`` over the
node's ``AddressPool``, plus the ``dial`` calls waiting for a session with it. A
persistent one lives as long as the Switch: it re-dials a suspended session (the
resume of section 4) and, once a session has ended for any reason but the Switch
stopping, dials again for a fresh one. A first dial of a persistent node keeps trying
too, whatever ``retry_initial_dial`` says: the node may be down, or refuse us for a
while (``session_held``: it still holds the session of our previous process, until its
grace ends; a peer limit), and it is kept connected once it answers. Only a permanent
refusal (every address banned, ``mconn.switch.dialer.is_not_retried``), ``max_reconnects``
failed attempts in a row, ``stop_dialing`` or the Switch stopping end it; its waiting
dials then fail with ``DialGaveUp``. Other re-dialers serve one purpose: re-dialing one
suspended session (they end with it), or a non-persistent first dial that retries
(``retry_initial_dial``, keyed by nothing until the node answers).

``PersistentDialing`` sees the rest of the Switch through a few callables only:
``connect(address, node_id)`` (one attempt, firing with the Peer), ``session_for(node_id)``,
and ``gave_up``/``failed_attempt`` (the session manager's inputs from the dialer). A
dial that lost a race to a session being made by another connection (close code
``duplicate`` or ``simultaneous_dial``) waits up to ``handshake_timeout`` for that
session and fires with its Peer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet import defer

from mconn.switch import telemetry
from mconn.core.address import PeerAddress, announced_address, discovered_problem, parse_address
from mconn.switch.dialer import AddressPool, Dialer
from mconn.errors import DialGaveUp, PeerRejected
from mconn.core.session_table import PeerState

#: Refusals that mean another connection brings (or has) the session with that node.
LOST_RACE = frozenset({"duplicate", "simultaneous_dial"})


class PersistentDialing:
    """The re-dialers and waiting dials of one Switch.

    :param connect: ``connect(address, node_id) -> Deferred[Peer]``, one attempt.
    :param session_for: ``session_for(node_id) -> Peer | None``.
    :param gave_up: ``gave_up(node_id, why)``, called when a re-dialer gives up.
    :param failed_attempt: ``failed_attempt(node_id)``, called after each failed attempt.
    :param reconnect_delay: ``reconnect_delay(attempt) -> seconds``.
    :param choose_address: returns the ``choose_address(pool, last_info)`` hook in force,
        or None for the default order.
    :param listen_addresses: returns this node's listen addresses (``host:port``): a
        learnt address that leads back to one of them never joins a pool.
    """

    def __init__(
        self,
        *,
        node_id,
        clock,
        config,
        connect,
        session_for,
        gave_up,
        failed_attempt,
        reconnect_delay,
        choose_address,
        listen_addresses=lambda: (),
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.config = config
        self.connect = connect
        self.session_for = session_for
        self.gave_up = gave_up
        self.reconnect_delay = reconnect_delay
        self.choose_address = choose_address
        #: node id -> the _Redial keeping it connected (persistent) or resuming it.
        self.redials: dict[str, _Redial] = {}
        #: First dials that retry (retry_initial_dial) without a node id to key them by.
        self.initial: set = set()
        #: node id -> Deferreds waiting for a session with it (a dial that lost a race).
        self._waiters: dict[str, list] = {}
        self.failed_attempt = failed_attempt
        self.listen_addresses = listen_addresses

    # -- what Switch.dial and friends ask --------------------------------------------

    def dial(self, target: PeerAddress, *, persistent: bool, retry: bool) -> defer.Deferred:
        """``Switch.dial`` once the address is checked (specs/resume.md section 7.1).

        A persistent dial always retries (``retry`` is for the others): its Deferred
        fires with the Peer of the first session, or fails with DialGaveUp when the
        dialing ends without one."""
        existing = self.session_for(target.node_id) if target.node_id is not None else None
        if persistent:
            node_id = target.node_id
            assert node_id is not None, "Switch.dial refuses a persistent peer without a node id"
            redial = self.redials.get(node_id)
            if redial is None:
                redial = self.redials[node_id] = _Redial(self, node_id, [target], persistent=True)
            else:
                redial.persistent = True
                redial.dialer.pool.add_configured(target)
            if existing is not None:
                if existing.state is PeerState.SUSPENDED and existing.is_outbound:
                    # A session restored from the store is re-dialed by nobody yet: this
                    # dial carries its resume (specs/resume.md section 9.2).
                    redial.start()
                return defer.succeed(existing)
            return redial.first_session()
        if existing is not None:
            return defer.fail(PeerRejected("duplicate", f"node {target.node_id} is already connected"))
        if retry:
            redial = _Redial(self, target.node_id, [target], persistent=False)
            self.initial.add(redial)
            return redial.first_session()
        return self.attempt(target, target.node_id)

    def set_pool(self, node_id: str, addresses) -> None:
        redial = self.redials.get(node_id)
        if redial is None or not redial.persistent:
            raise KeyError(f"node {node_id} is not a persistent peer; dial it with persistent=True first")
        redial.dialer.set_address_pool([with_node_id(a, node_id) for a in addresses])

    def stop_dialing(self, node_id: str) -> None:
        redial = self.redials.pop(node_id, None)
        if redial is not None:
            redial.stop(DialGaveUp(node_id, "stop_dialing was called"))

    def pool(self, node_id: str):
        redial = self.redials.get(node_id)
        return redial.dialer.pool if redial is not None else None

    def is_persistent(self, node_id: str) -> bool:
        redial = self.redials.get(node_id)
        return redial is not None and redial.persistent

    def knows(self, node_id: str) -> bool:
        return node_id in self.redials

    def stop(self) -> None:
        """The Switch stops: every dialer stops, every waiting dial fails."""
        for redial in list(self.redials.values()) + list(self.initial):
            redial.stop(DialGaveUp(redial.node_id, "the node is stopping"))
        self.redials.clear()
        self.initial.clear()

    # -- one attempt -----------------------------------------------------------------

    def attempt(self, target: PeerAddress, node_id: str | None) -> defer.Deferred:
        """One dial attempt; a lost race waits for the winning session."""
        return self.connect(target, node_id).addErrback(self._lost_race, node_id)

    def _lost_race(self, failure, node_id: str | None):
        error = failure.value
        word = getattr(error, "reason", None) if isinstance(error, PeerRejected) else getattr(error, "code", None)
        if node_id is None or word not in LOST_RACE:
            return failure
        peer = self.session_for(node_id)
        if peer is not None and peer.state is not PeerState.CLOSED:
            return peer
        d: defer.Deferred[Any] = defer.Deferred()
        waiters = self._waiters.setdefault(node_id, [])
        waiters.append(d)

        def timed_out():
            if d in waiters:
                waiters.remove(d)
                d.callback(failure)

        timer = self.clock.callLater(self.config.handshake_timeout, timed_out)
        return d.addBoth(_cancelling(timer))

    # -- what the session manager tells ------------------------------------------------

    def session_up(self, peer) -> None:
        """A session started or resumed: fire the dials that wait for it; learn the
        node's listen address for its pool, if the rules of learnt addresses allow it
        (specs/pex.md section 3.5; the dialer tries it after the configured ones)."""
        for d in self._waiters.pop(peer.node_id, []):
            d.callback(peer)
        redial = self.redials.get(peer.node_id)
        if redial is None or self.config.ignore_discovered_addresses:
            return
        source_host, allow_private = peer.remote_host, self.config.allow_discovered_private
        address = announced_address(peer.node_id, peer.listen_address, remote_host=source_host)
        if address is None:
            return  # it announced none we could dial
        problem = discovered_problem(
            address, source_host=source_host, allow_private=allow_private, listen_addresses=self.listen_addresses()
        )
        if problem is not None:
            return  # specs/pex.md 3.5: never link-local, metadata, private (by default)...
        redial.dialer.pool.add_discovered(address)

    def redial(self, peer) -> None:
        """The side that dialed re-dials a suspended session (specs/resume.md section 4)."""
        redial = self.redials.get(peer.node_id)
        if redial is None:
            redial = self.redials[peer.node_id] = _Redial(self, peer.node_id, [peer.address], persistent=False)
        redial.start()

    def session_settled(self, node_id: str, *, stop_dialer: bool) -> None:
        """A session resumed or ended: its re-dialer stops (``stop_dialer``), and is
        forgotten unless persistent."""
        redial = self.redials.get(node_id)
        if stop_dialer and redial is not None:
            redial.dialer.stop()
            if not redial.persistent:
                del self.redials[node_id]

    def session_ended(self, node_id: str) -> None:
        """A session ended (not by the Switch stopping): a persistent node is dialed again."""
        redial = self.redials.get(node_id)
        if redial is not None and redial.persistent:
            redial.start()


class _Redial:
    """The Dialer of one node (or one address), and the ``dial`` calls waiting on it.

    A waiting dial fires with the Peer of the next session the Dialer connects, and fails
    only when the Dialer gives up (``DialGaveUp``: ``max_reconnects``, or every address
    banned, with the refusal that banned the last one as its ``__cause__``) or is
    stopped: a failed attempt that may be retried never fails it.
    """

    def __init__(self, owner: PersistentDialing, node_id: str | None, addresses, *, persistent: bool):
        self.owner = owner
        self.node_id = node_id
        self.persistent = persistent
        self._waiters: list[defer.Deferred] = []
        #: The error of the last attempt that banned its address (is_not_retried).
        self._refusal: BaseException | None = None
        config = owner.config
        pool = AddressPool(
            addresses, retain_order=config.retain_address_order, ignore_discovered=config.ignore_discovered_addresses
        )
        self.dialer = Dialer(
            clock=owner.clock,
            connect=lambda address: owner.attempt(address, node_id),
            pool=pool,
            reconnect_delay=lambda attempt: owner.reconnect_delay(attempt),
            max_reconnects=config.max_reconnects,
            choose_address=self._choose,
            on_attempt=self._attempted,
            on_connected=self._connected,
            on_give_up=self._gave_up,
        )

    def start(self) -> None:
        self.dialer.start()

    def stop(self, error: BaseException) -> None:
        self.dialer.stop()
        self._fail_waiters(error)

    def first_session(self) -> defer.Deferred:
        """A Deferred for the next session; the Dialer makes at least one attempt for it
        (even with ``max_reconnects`` 0, which allows no attempt after a break)."""
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiters.append(d)
        self.dialer.start(at_least_once=True)
        return d

    def _choose(self, pool, last_info):
        hook = self.owner.choose_address()
        return hook(pool, last_info) if hook is not None else None

    def _attempted(self, info: dict) -> None:
        telemetry.emit("dial_attempt", node_id=self.owner.node_id, peer_id=self.node_id, **info)
        if info["result"] == "not_retried":
            state = self.dialer.pool.get(info["address"])
            self._refusal = state.last_error if state is not None else None
        if info["result"] != "connected":
            self.owner.failed_attempt(self.node_id)

    def _connected(self, peer, state) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(peer)
        if not self.persistent:
            self._forget()

    def _gave_up(self, reason: str) -> None:
        telemetry.emit("dial_gave_up", node_id=self.owner.node_id, peer_id=self.node_id, reason=reason)
        self._forget()
        error = DialGaveUp(self.node_id, reason)
        if not self.dialer.pool.candidates():  # every address banned: say by what, last
            error.__cause__ = self._refusal
        self._fail_waiters(error)
        self.owner.gave_up(self.node_id, reason)

    def _forget(self) -> None:
        owner = self.owner
        if self.node_id is not None and owner.redials.get(self.node_id) is self:
            del owner.redials[self.node_id]
        owner.initial.discard(self)

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(error)


def with_node_id(address, node_id: str) -> PeerAddress:
    """``address`` (text or PeerAddress) as an address of ``node_id``.

    :raises ValueError: if it does not parse or names another node.
    """
    parsed = address if isinstance(address, PeerAddress) else parse_address(address)
    if parsed.node_id is not None and parsed.node_id != node_id:
        raise ValueError(f"address {address} names node {parsed.node_id}, not {node_id}")
    return dataclasses.replace(parsed, node_id=node_id)


def _cancelling(timer):
    def cancel(result):
        if timer.active():
            timer.cancel()
        return result

    return cancel
