"""The Reactor contract: what node software subclasses (specs/reactor-api.md).

A Reactor owns one or more channels. The Switch calls ``start_reactor`` once before the
first peer, ``add_peer`` once a peer's handshake is done and before any ``receive`` from
it, ``receive`` for every whole message on the reactor's channels, ``remove_peer`` once
after the last ``receive``, and ``stop_reactor`` once after the last ``remove_peer``.
Sending is done on the Peer (``peer.send`` / ``peer.try_send``) or with
``switch.broadcast``. Methods run in the Twisted reactor thread and should return
quickly; a ``receive`` with slow work returns a Deferred (or is ``async def``) and mconn
holds that peer's later messages on that channel until it fires (section 4.1).
"""

from __future__ import annotations

from mconn.core.channel import ChannelDescriptor


class Reactor:
    """Base class with no-op defaults; override what you need.

    ``switch`` is set by the Switch that the reactor is given to; ``name`` is how
    ``switch.reactor(name)`` finds it (the class name if None).
    """

    switch = None
    name: str | None = None

    def get_channels(self) -> list[ChannelDescriptor]:
        """The channels this reactor owns; their ids must be unique across the Switch."""
        return []

    def start_reactor(self) -> None:
        """Called once by the Switch before its first ``add_peer``: at ``startService``,
        or at the first ``listen``, ``dial`` or session if one comes first."""

    def stop_reactor(self) -> None:
        """Called once by ``stopService`` after every session has ended (the last
        ``remove_peer``), in the reverse order of ``start_reactor``."""

    def add_peer(self, peer) -> None:
        """A peer's handshake is done; it can be sent to from now on."""

    def remove_peer(self, peer, reason) -> None:
        """The peer is gone; ``reason`` is an mconn error saying why."""

    def receive(self, channel_id: int, peer, message: bytes):
        """A whole message arrived from ``peer`` on one of our channels.

        Return None when done, or a Deferred (an ``async def receive`` is wrapped in one):
        until it fires, this peer's later messages on this channel wait (section 4.1).
        """

    def on_error(self, peer, channel_id: int | None, error: Exception) -> str | None:
        """An exception escaped ``add_peer`` (``channel_id`` None) or ``receive``, or the
        Deferred ``receive`` returned failed. Return ``"drop"`` to end the session with a
        ``ReactorError``, ``"log"`` to keep the peer, or None for ``Config.reactor_errors``."""
        return None

    def spawn(self, peer, routine):
        """Run a per-peer routine (a coroutine, e.g. ``self.spawn(peer, self.gossip(peer))``
        in ``add_peer``) until the session ends: it is cancelled then, before
        ``remove_peer``; an exception escaping it is handled like one from ``receive``
        (``on_error`` with ``channel_id`` None). Returns a Deferred firing with its result,
        or None if it was cancelled or failed (section 5.8; ``Peer.spawn``)."""
        return peer.spawn(routine, reactor=self)

    def mark_good(self, peer) -> None:
        """``switch.mark_good(peer)``: another reactor vouches for ``peer`` (an address
        book moves it to its tried table)."""

    def peer_suspended(self, peer) -> None:
        """The peer's transport broke; its session waits ``resume_grace`` to resume."""

    def peer_resumed(self, peer) -> None:
        """The peer's session resumed on a new transport; nothing was lost."""


def reactor_name(reactor) -> str:
    """The name the Switch knows ``reactor`` by: its ``name``, or its class name."""
    return getattr(reactor, "name", None) or type(reactor).__name__
