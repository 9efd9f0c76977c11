"""The reactors of a Switch and every call into them (specs/reactor-api.md sections 2-4).

``ReactorSet`` owns the channel table (each channel id belongs to one reactor, checked
when it is built), the reactors' names (``switch.reactor(name)``), their lifecycle
(``start_reactor`` once before the first peer, ``stop_reactor`` once after the last, in
reverse order) and the calls the Switch makes on them:

* ``route``: a whole message to the reactor owning its channel (the hot path). A
  ``receive`` that returns a Deferred, or is a coroutine, hands that Deferred back to the
  Peer, which holds the channel until it fires (section 4.1);
* ``notify``: ``add_peer``, ``peer_suspended``, ``peer_resumed``, ``remove_peer`` to every
  reactor in order.

An exception escaping a reactor is counted (``errors``), logged as ``reactor_error``, and
for ``add_peer``, ``receive`` and a per-peer routine (``Reactor.spawn``) judged by the
reactor's ``on_error`` or ``Config.reactor_errors``: "drop" stops the peer with a
``ReactorError`` (section 4).
"""

from __future__ import annotations

import inspect
from typing import Any

from twisted.internet import defer

from mconn.switch import telemetry
from mconn.core.codec import typed_receiver
from mconn.errors import ReactorError
from mconn.switch.reactor import reactor_name

#: The calls whose exceptions the reactor's error policy judges (the rest are logged).
_POLICY_METHODS = ("add_peer", "receive", "routine")


class ReactorSet:
    """The reactors of ``switch`` (see the module docstring).

    :param reactors: a list, or a dict ``{name: reactor}``.
    :param decode_failed: ``decode_failed(peer, error)`` for a typed channel's message
        that does not decode (mconn.core.codec).
    """

    def __init__(self, reactors, switch, decode_failed) -> None:
        self._switch = switch
        self.reactors, self.by_name = _named(reactors)
        self.by_channel: dict[int, Any] = {}
        self.channels = []
        for reactor in self.reactors:
            for desc in reactor.get_channels():
                owner = self.by_channel.get(desc.id)
                if owner is not None:
                    raise ValueError(
                        f"channel {desc.id:#04x} is claimed by both {type(owner).__name__} and {type(reactor).__name__}"
                    )
                self.by_channel[desc.id] = reactor
                self.channels.append(desc)
            reactor.switch = switch
        #: channel id -> the owning reactor's bound ``receive`` (the routing hot path).
        self.receivers = {ch: reactor.receive for ch, reactor in self.by_channel.items()}
        for desc in self.channels:  # a typed channel decodes before receive (mconn.core.codec)
            if desc.codec is not None:
                self.receivers[desc.id] = typed_receiver(self.receivers[desc.id], desc.codec, decode_failed)
        #: Whether ``start_reactor`` ran (it runs once, before the first add_peer).
        self.started = False
        #: Exceptions that escaped reactors (and failed receive Deferreds), by reactor name.
        self.errors: dict[str, int] = {}

    def reactor(self, name: str):
        """The reactor called ``name``. :raises KeyError: naming the known names."""
        reactor = self.by_name.get(name)
        if reactor is None:
            why = "two reactors share that class name" if name in self.by_name else "no reactor has it"
            raise KeyError(f"no reactor named {name!r} ({why}); names: {sorted(self.by_name)}")
        return reactor

    # -- lifecycle (section 2.1) -------------------------------------------------------

    def start(self) -> None:
        """``start_reactor`` on every reactor, in order, once."""
        if self.started:
            return
        self.started = True
        for reactor in self.reactors:
            self._call_hook(reactor, "start_reactor")

    def stop(self) -> None:
        """``stop_reactor`` in reverse order, once (after the last remove_peer)."""
        if not self.started:
            return
        self.started = False
        for reactor in reversed(self.reactors):
            self._call_hook(reactor, "stop_reactor")

    def _call_hook(self, reactor, method: str) -> None:
        try:
            hook = getattr(reactor, method, None)
            if hook is not None:
                hook()
        except Exception:
            self._count(reactor)
            telemetry.emit_failure(
                "reactor_error",
                node_id=self._switch.node_id,
                reactor=reactor_name(reactor),
                method=method,
                peer_id=None,
                action="none",
            )

    # -- calls about peers -------------------------------------------------------------

    def route(self, channel_id: int, peer, message: bytes):
        """Hand a message to its reactor. Returns the Deferred its ``receive`` returned
        if that has not fired yet (the Peer holds the channel until it does), else None."""
        try:
            result = self.receivers[channel_id](channel_id, peer, message)
        except Exception as error:
            self._failed(self.by_channel[channel_id], "receive", peer, channel_id, error)
            return None
        if result is None:
            return None
        if inspect.iscoroutine(result):
            result = defer.Deferred.fromCoroutine(result)
        elif not isinstance(result, defer.Deferred):
            return None  # other return values are ignored
        result.addErrback(self._receive_failed, channel_id, peer)
        return None if result.called else result

    def _receive_failed(self, failure, channel_id: int, peer) -> None:
        try:
            failure.raiseException()
        except Exception as error:  # logged with its traceback, as a synchronous one
            self._failed(self.by_channel[channel_id], "receive", peer, channel_id, error)

    def notify(self, method: str, peer, *args) -> None:
        """Call ``method`` on every reactor, in order. An exception is logged and the
        others are still called; one from ``add_peer`` then drops the peer by the policy
        (after every reactor had its ``add_peer``, so that each gets its ``remove_peer``)."""
        if not self.started and method == "add_peer":
            self.start()
        drop = None
        for reactor in self.reactors:
            try:
                callback = getattr(reactor, method, None)
                if callback is not None:
                    callback(*args)
            except Exception as error:
                reason = self._failed(reactor, method, peer, None, error, drop_now=False)
                drop = drop or reason
        if drop is not None:
            peer.stop_for_error(drop)

    def mark_good(self, peer) -> None:
        """Every reactor's ``mark_good(peer)``."""
        for reactor in self.reactors:
            hook = getattr(reactor, "mark_good", None)
            if hook is not None:
                hook(peer)

    def routine_failed(self, reactor, peer, error: Exception) -> None:
        """An exception escaped a per-peer routine of ``reactor`` (``Reactor.spawn``):
        handled like one from ``receive`` (``on_error(peer, None, error)`` or
        ``Config.reactor_errors``) while the session lives; only counted and logged once
        it has ended (there is nothing left to drop)."""
        try:
            raise error
        except Exception:  # logged with its traceback, as one from receive
            self._failed(reactor, "routine", peer, None, error, drop_now=peer.close_reason is None)

    def _failed(self, reactor, method: str, peer, channel_id, error: Exception, *, drop_now=True):
        """An exception escaped a reactor (inside its ``except``): count and log it, and
        apply the reactor's ``on_error`` or ``Config.reactor_errors`` (section 4).
        Returns the ReactorError if the peer is to be dropped."""
        name = reactor_name(reactor)
        self._count(reactor)
        policy = "log"
        if method in _POLICY_METHODS:
            try:
                policy = reactor.on_error(peer, channel_id, error) or self._switch.config.reactor_errors
            except Exception:
                policy = self._switch.config.reactor_errors
        telemetry.emit_failure(
            "reactor_error",
            node_id=self._switch.node_id,
            reactor=name,
            method=method,
            peer_id=peer.node_id,
            action="dropped" if policy == "drop" else "kept" if method in _POLICY_METHODS else "none",
        )
        if policy != "drop":
            return None
        reason = ReactorError(name, channel_id, error, method=method)
        if drop_now:
            peer.stop_for_error(reason)
        return reason

    def _count(self, reactor) -> None:
        name = reactor_name(reactor)
        self.errors[name] = self.errors.get(name, 0) + 1

    def check_invariants(self) -> None:
        owned = {d.id for d in self.channels}
        assert owned == set(self.by_channel), "channel table corrupt"
        assert len(owned) == len(self.channels), "duplicate channel ids"


def _named(reactors) -> tuple[list, dict]:
    """The reactors in order, and by name; two reactors may not share an explicit name
    (two of one class without a ``name`` share their class name: ambiguous, None)."""
    if isinstance(reactors, dict):
        for name, reactor in reactors.items():
            if getattr(reactor, "name", None) is None:
                reactor.name = name
        reactors = list(reactors.values())
    else:
        reactors = list(reactors)
    by_name = {}
    for reactor in reactors:
        name = reactor_name(reactor)
        if name in by_name and getattr(reactor, "name", None) is not None:
            raise ValueError(f"two reactors are named {name!r}; give each its own Reactor.name (or pass a dict)")
        by_name[name] = None if name in by_name else reactor
    return reactors, by_name
