"""The Reactor contract: what node software subclasses (specs/reactor-api.md).

A Reactor owns one or more channels. The Switch calls ``add_peer`` once a peer's
handshake is done and before any ``receive`` from it, ``receive`` for every whole message
on the reactor's channels, and ``remove_peer`` once after the last ``receive``. Sending is
done on the Peer (``peer.send`` / ``peer.try_send``) or with ``switch.broadcast``.
Methods run in the Twisted reactor thread and should return quickly.
"""

from __future__ import annotations

from mconn.channel import ChannelDescriptor


class Reactor:
    """Base class with no-op defaults; override what you need.

    ``switch`` is set by the Switch that the reactor is given to.
    """

    switch = None

    def get_channels(self) -> list[ChannelDescriptor]:
        """The channels this reactor owns; their ids must be unique across the Switch."""
        return []

    def add_peer(self, peer) -> None:
        """A peer's handshake is done; it can be sent to from now on."""

    def remove_peer(self, peer, reason) -> None:
        """The peer is gone; ``reason`` is an mconn error saying why."""

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        """A whole message arrived from ``peer`` on one of our channels."""

    def peer_suspended(self, peer) -> None:
        """The peer's transport broke; its session waits ``resume_grace`` to resume."""

    def peer_resumed(self, peer) -> None:
        """The peer's session resumed on a new transport; nothing was lost."""
