"""Test doubles for reactor authors: a recording FakePeer and Switches connected in memory.

Two ways to test a Reactor without sockets (specs/reactor-api.md section 8).

Unit tests call the reactor's methods directly and pass it a ``FakePeer``, which records
what the reactor sends::

    peer = FakePeer(channels=reactor.get_channels())
    reactor.add_peer(peer)
    reactor.receive(0x20, peer, b"ping")
    assert peer.sent == [(0x20, b"pong")]

Two-node tests use real Switches. Their connections run over in-memory transports that
one ``task.Clock`` drives, so the tests are deterministic::

    network = MemoryNetwork()
    a = network.switch([EchoReactor()])
    b = network.switch([EchoReactor()])
    link = network.connect(a, b)          # handshake done when this returns
    link.peer_of(a).try_send(0x20, b"hi") # a sends to b
    network.flush()                       # deliver everything that was written

The in-memory transport is Twisted's iosim (``twisted.test.iosim``: ``FakeTransport`` and
``IOPump``). This module is the only place in mconn that imports it, so a Twisted upgrade
that moves it needs a fix here only. Like iosim, these transports never lose bytes that
were written before a disconnect.
"""

from __future__ import annotations

import secrets

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.test import iosim

from mconn.channel import ChannelDescriptor
from mconn.errors import ConnectionClosed
from mconn.protocol import MConnectionFactory
from mconn.switch import Switch
from mconn.wire import ChannelInfo

__all__ = ["FakePeer", "MemoryLink", "MemoryNetwork", "connected_switches"]


class FakePeer:
    """A stand-in for ``mconn.Peer`` that records what a reactor sends to it.

    It follows the Peer contract of specs/reactor-api.md section 5: ``try_send`` and
    ``send`` refuse (False) a channel the peer did not announce, a channel in
    ``full_channels``, and everything once the peer is closed; a message larger than the
    channel's ``recv_message_capacity`` raises ValueError. Accepted messages are appended
    to ``sent``. ``send`` does not wait: where a real Peer would wait ``send_timeout`` for
    room, the fake fires False at once.

    :param node_id: 40 hex characters (a random one if None).
    :param channels: the ChannelDescriptors the peer announced; None accepts any channel
        and any size.
    :param is_outbound: whether "we" dialed this peer.
    :param remote_address: the ``host:port`` the connection comes from.
    :param listen_address: the address the peer says it listens on.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        channels: list[ChannelDescriptor] | None = None,
        is_outbound: bool = False,
        remote_address: str = "127.0.0.1:26656",
        listen_address: str = "",
    ) -> None:
        self.node_id = node_id if node_id is not None else secrets.token_hex(20)
        self.is_outbound = is_outbound
        self.remote_address = remote_address
        self.listen_address = listen_address
        #: Channels the peer announced, by id (None: any channel is accepted).
        self.channels: dict[int, ChannelInfo] | None = None
        if channels is not None:
            self.channels = {
                c.id: ChannelInfo(id=c.id, priority=c.priority, recv_message_capacity=c.recv_message_capacity)
                for c in channels
            }
        #: "connected" or "closed".
        self.state = "connected"
        self.round_trip: float | None = None
        #: Every accepted message, in order, as ``(channel_id, message)``.
        self.sent: list[tuple[int, bytes]] = []
        #: Channel ids whose queue the test wants to look full.
        self.full_channels: set[int] = set()
        #: The ``reason`` given to ``close``, once it was called.
        self.close_reason = None

    def __repr__(self) -> str:
        return f"<FakePeer {self.node_id} {self.state}>"

    def sent_on(self, channel_id: int) -> list[bytes]:
        """The accepted messages of one channel, in order."""
        return [message for channel, message in self.sent if channel == channel_id]

    def try_send(self, channel_id: int, message: bytes) -> bool:
        """Record ``message`` unless the peer would refuse it (see the class docstring)."""
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise TypeError(f"messages are bytes, got {type(message).__name__}")
        message = bytes(message)
        if self.state != "connected" or channel_id in self.full_channels:
            return False
        if self.channels is not None:
            info = self.channels.get(channel_id)
            if info is None:
                return False
            if len(message) > info.recv_message_capacity:
                raise ValueError(
                    f"message of {len(message)} bytes on channel {channel_id:#04x} is larger than its "
                    f"recv_message_capacity {info.recv_message_capacity}"
                )
        self.sent.append((channel_id, message))
        return True

    def send(self, channel_id: int, message: bytes) -> defer.Deferred:
        """Like ``try_send``, as a Deferred that has already fired."""
        return defer.succeed(self.try_send(channel_id, message))

    def close(self, reason=None) -> None:
        """Mark the peer closed; later sends return False."""
        if self.state == "connected":
            self.state = "closed"
            self.close_reason = ConnectionClosed("closed", "" if reason is None else str(reason))


class MemoryLink:
    """One in-memory connection between two Switches (or a Switch and a raw protocol).

    :ivar outbound: the dialing side's protocol.
    :ivar inbound: the listening side's protocol.
    :ivar pump: the iosim IOPump that moves bytes between them.
    """

    def __init__(self, outbound, inbound, pump) -> None:
        self.outbound = outbound
        self.inbound = inbound
        self.pump = pump

    def flush(self) -> bool:
        """Deliver written bytes both ways until none are left; True if any moved."""
        return self.pump.flush()

    def peer_of(self, switch: Switch):
        """The Peer that ``switch`` holds for the other end (None before the handshake)."""
        for proto in (self.outbound, self.inbound):
            if getattr(proto, "switch", None) is switch:
                return proto.peer
        raise ValueError(f"{switch!r} is not on either end of this link")

    def disconnect(self) -> None:
        """Drop the connection as a network failure would (no close packet)."""
        self.pump.clientIO.loseConnection()
        self.flush()


class MemoryNetwork:
    """Switches that share one Clock and connect over in-memory transports.

    :param clock: an IReactorTime provider, e.g. ``task.Clock`` or
        ``twisted.internet.testing.MemoryReactorClock`` (a new Clock if None).
    """

    def __init__(self, clock=None) -> None:
        self.clock = clock if clock is not None else Clock()
        self.links: list[MemoryLink] = []
        self._hosts: dict[Switch, str] = {}

    def switch(self, reactors, **kwargs) -> Switch:
        """A Switch on this network's clock; ``kwargs`` go to ``Switch`` (config, node_key)."""
        switch = Switch(reactors, clock=self.clock, **kwargs)
        self._address_of(switch)
        return switch

    def connect(self, dialer: Switch, listener: Switch, *, expected_node_id: str | None = None) -> MemoryLink:
        """Connect ``dialer`` to ``listener`` and deliver the hellos both ways.

        :param expected_node_id: the node id the dialer insists on, as in ``ID@host:port``.
        :returns: the link; ``link.peer_of(dialer)`` is the dialer's Peer once accepted.
        """
        outbound = MConnectionFactory(dialer, is_outbound=True, expected_node_id=expected_node_id).buildProtocol(None)
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        return self._link(outbound, self._ephemeral(self._address_of(dialer)), inbound, self._listen_address(listener))

    def connect_raw(self, protocol, listener: Switch) -> MemoryLink:
        """Connect any protocol (a scripted or hostile peer) to ``listener``.

        The listener's hello is delivered to ``protocol`` before this returns.
        """
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        return self._link(protocol, self._ephemeral("192.0.2.1"), inbound, self._listen_address(listener))

    def complete_dials(self) -> list[MemoryLink]:
        """Connect every pending ``Switch.dial`` to the ``Switch.listen`` port it names.

        Needs a ``MemoryReactorClock`` as the network's clock: it records the dials
        (``connectTCP``) and listening ports (``listenTCP``). A dial to a port nobody
        listens on fails with ConnectionRefusedError.
        """
        links = []
        while self.clock.tcpClients:
            host, port, client_factory, _, _ = self.clock.tcpClients.pop(0)
            connector = self.clock.connectors.pop(0)
            server_factory = next((s[1] for s in self.clock.tcpServers if s[0] == port), None)
            if server_factory is None:
                client_factory.clientConnectionFailed(connector, Failure(ConnectionRefusedError(f"{host}:{port}")))
                continue
            outbound = client_factory.buildProtocol(None)
            # Endpoints wrap the protocol; the switch sits on the wrapped one.
            switch = getattr(getattr(outbound, "_wrappedProtocol", outbound), "switch", None)
            outbound_host = self._address_of(switch) if switch is not None else "192.0.2.1"
            inbound = server_factory.buildProtocol(None)
            links.append(self._link(outbound, self._ephemeral(outbound_host), inbound, IPv4Address("TCP", host, port)))
        return links

    def flush(self) -> None:
        """Deliver written bytes on every link until the whole network is quiet."""
        moved = True
        while moved:
            moved = False
            for link in list(self.links):
                moved = link.flush() or moved

    def advance(self, seconds: float, *, step: float | None = None) -> None:
        """Let ``seconds`` pass in steps of ``step`` (all at once if None), flushing after each."""
        remaining = seconds
        step = seconds if step is None else step
        while remaining > 1e-12:
            delta = min(step, remaining)
            self.clock.advance(delta)
            self.flush()
            remaining -= delta

    def _address_of(self, switch: Switch) -> str:
        if switch not in self._hosts:
            self._hosts[switch] = f"10.0.0.{len(self._hosts) + 1}"
        return self._hosts[switch]

    def _listen_address(self, switch: Switch) -> IPv4Address:
        return IPv4Address("TCP", self._address_of(switch), 26656)

    def _ephemeral(self, host: str) -> IPv4Address:
        return IPv4Address("TCP", host, 40000 + len(self.links))

    def _link(self, outbound, outbound_address, inbound, inbound_address) -> MemoryLink:
        client_io = iosim.FakeTransport(outbound, False, hostAddress=outbound_address, peerAddress=inbound_address)
        server_io = iosim.FakeTransport(inbound, True, hostAddress=inbound_address, peerAddress=outbound_address)
        pump = iosim.connect(inbound, server_io, outbound, client_io, greet=False, clock=self.clock)
        link = MemoryLink(getattr(outbound, "_wrappedProtocol", outbound), inbound, pump)
        self.links.append(link)
        link.flush()
        return link


def connected_switches(reactors_a, reactors_b, *, config=None, clock=None) -> tuple[Switch, Switch, MemoryNetwork]:
    """Two Switches on one MemoryNetwork, ``a`` connected to ``b`` (handshake done).

    :returns: ``(a, b, network)``; ``network.links[0].peer_of(a)`` is a's Peer for b.
    """
    network = MemoryNetwork(clock)
    a = network.switch(reactors_a, config=config)
    b = network.switch(reactors_b, config=config)
    network.connect(a, b)
    return a, b, network
