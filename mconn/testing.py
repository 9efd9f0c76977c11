"""Test doubles for reactor authors: a recording FakePeer, and Switches on an in-memory network.

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
    network.flush()                       # deliver everything that is due

The network
-----------
Each Switch made by ``network.switch`` lives on a *node*: a host address (10.0.0.1,
10.0.0.2, ...) and a Twisted reactor of its own that keeps time with the shared clock and
does TCP in memory. So the Switch's own code paths work unchanged: ``Switch.listen``
("tcp:26656"), ``Switch.dial`` ("ID@10.0.0.2:26656", see ``network.dial_address``) and
the re-dials of suspended sessions connect through ``HostnameEndpoint`` to whatever
listens at that host and port. A dial to a port nobody listens on fails with
ConnectionRefusedError; one to an unknown host, or through a black hole, times out.
``network.connect(a, b)`` skips the dial and joins two Switches directly (a session it
starts has no address to re-dial).

If the clock you pass is itself a fake TCP reactor (``MemoryReactorClock``), dials and
listening ports are recorded on it instead, and ``network.complete_dials()`` connects the
pending dials by port.

Bytes written to a transport travel on the shared clock: they are delivered when the
clock next runs (``network.flush()`` runs it without moving time; so does ``advance``),
or, over a path with a delay, that many seconds after they were written; never out of
order, never duplicated. With ``window`` set, a transport with more than ``window`` bytes
on their way pauses its producer until half of them have arrived, as TCP flow control
would.

Faults
------
These imitate a real network; iosim (Twisted's in-memory transports) never loses a
written byte, so it cannot test what mconn does when bytes are lost.

``link.reset()``
    Both ends of one connection get ``connectionLost`` at once (a reset). Bytes written
    but not yet delivered, in either direction, are lost.
``network.blackhole(a, b)`` (or ``link.blackhole()``)
    The unplugged cable: nothing moves between hosts a and b, on any connection or for
    new ones (a dial times out), and neither end is told. Bytes stay where TCP would
    keep them, unacknowledged at the sender: an end that gives up on its connection
    (the keepalive finds the hole and aborts) loses them, and the reset it sends is lost
    in the hole too, so the other end notices nothing.
``network.heal(a, b)`` (or ``link.heal()``; ``network.heal()`` heals every path)
    Traffic flows again. A connection whose two ends both survived the hole carries on:
    what was held is delivered, late and in order (TCP retransmission). A connection
    that one end gave up is reset at the other end.
``network.delay(a, b, seconds)`` (or ``link.delay(seconds)``)
    Every byte between a and b, each way, arrives ``seconds`` after it was written;
    connection set-up takes as long. 0 removes the delay.
``network.reset(a, b)``
    ``reset`` on every connection between a and b.
``network.kill(switch)``
    The node's process dies: nothing more runs in it (its timers are silenced, its
    protocols hear nothing), its ports refuse connections, and its connections are reset
    at the other ends, as the kernel of a dead process resets them (through a black hole,
    only on ``heal``). What it had written but not delivered is lost.
``network.kill(switch, silently=True)``
    The host goes down with the process (a power cut): no resets, dials to it time out,
    and the other ends learn from their keepalive, or from the reset the host answers
    their next bytes with once a new process runs there (``restart``).
``network.restart(switch, reactors, **kwargs)``
    Kills the node if it is alive and starts a new Switch with the same NodeKey and
    Config (unless ``kwargs`` say otherwise) at the same host, listening on the same
    ports; returns it. Its sessions are new: peers find their old ones unknown.

A fault of a path (black hole, delay) belongs to the pair of hosts: it outlives the
connections on it and a restart of either node.

A run repeats exactly when everything random is seeded: give each Switch a ``node_key``
(node ids decide simultaneous-dial tie-breaks) and a ``reconnect_delay`` whose jitter
comes from a seeded ``random.Random`` (tests/adapter/test_simulation.py does both).
``network.run(seconds)`` lets time pass with every timer firing on time.

This module defines its own transport (not iosim's), so it is the one place to change if
Twisted's testing helpers move.
"""

from __future__ import annotations

import collections
import secrets
from dataclasses import dataclass

from twisted.internet import defer
from twisted.internet.abstract import isIPAddress
from twisted.internet.address import IPv4Address
from twisted.internet.error import (
    CannotListenError,
    ConnectionAborted,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
    TimeoutError,
    UserError,
)
from twisted.internet.interfaces import (
    IConnector,
    IConsumer,
    IHostnameResolver,
    IHostResolution,
    IListeningPort,
    IPushProducer,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorTime,
    ITCPTransport,
)
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.channel import ChannelDescriptor
from mconn.errors import ConnectionClosed
from mconn.protocol import MConnectionFactory
from mconn.switch import Switch
from mconn.wire import ChannelInfo

__all__ = ["FakePeer", "MemoryLink", "MemoryNetwork", "MemoryTransport", "connected_switches"]

#: What travels in a pipe: bytes, or the end of the connection (graceful or a reset).
_DATA, _FIN, _RST = "data", "fin", "rst"
LOOPBACK = "127.0.0.1"
#: The port ``Switch.listen("tcp:26656")`` uses in the examples, and dial_address's default.
DEFAULT_PORT = 26656


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


# -- the transport ---------------------------------------------------------------------


class _Pipe:
    """What one end of a link has written and the other has not yet received, in order."""

    __slots__ = ("items", "bytes", "last_due", "call")

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()  # (due, kind, data)
        self.bytes = 0
        self.last_due = 0.0
        self.call = None  # the DelayedCall that delivers the head

    def clear(self) -> int:
        """Forget everything in the pipe; returns the bytes lost."""
        lost = self.bytes
        self.items.clear()
        self.bytes = 0
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        return lost


@dataclass
class _Path:
    """The faults between two hosts (both ways)."""

    blackholed: bool = False
    delay: float = 0.0


@implementer(ITCPTransport, IConsumer, IPushProducer)
class MemoryTransport:
    """One end of a MemoryLink: what its protocol sees as a TCP transport.

    It is its protocol's consumer (``registerProducer``) and a push producer of the bytes
    it delivers (``pauseProducing`` stops delivery to the protocol, as a full TCP
    receive window would).
    """

    def __init__(self, link: MemoryLink, side: int, protocol, host: IPv4Address, peer: IPv4Address, node) -> None:
        self.link = link
        self.side = side
        self.protocol = protocol
        self.node = node
        #: False once the protocol was told the connection is gone (or its process died).
        self.connected = True
        #: True once writing is over (loseConnection, abortConnection, or gone).
        self.disconnecting = False
        self.producer = None
        self.streaming = False
        self.reading = True
        self.no_delay = False
        self.keep_alive = False
        self._host = host
        self._peer = peer
        self._producer_paused = False
        self._aborted = False

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed"
        return f"<MemoryTransport {self._host.host}:{self._host.port} -> {self._peer.host}:{self._peer.port} {state}>"

    def getHost(self) -> IPv4Address:
        return self._host

    def getPeer(self) -> IPv4Address:
        return self._peer

    @property
    def in_flight(self) -> int:
        """Bytes this end wrote that the other has not received yet."""
        return self.link._pipes[self.side].bytes

    def write(self, data) -> None:
        if not self.disconnecting and data:
            self.link._send(self.side, _DATA, bytes(data))

    def writeSequence(self, iovec) -> None:
        self.write(b"".join(iovec))

    def loseConnection(self) -> None:
        """Close after everything written so far has been delivered."""
        if not self.disconnecting:
            self.disconnecting = True
            self.link._send(self.side, _FIN, b"")

    def abortConnection(self) -> None:
        """Close now: what is not yet delivered is lost, the other end gets a reset."""
        if self.connected and not self._aborted:
            self._aborted = True
            self.link._abort(self.side)

    def registerProducer(self, producer, streaming) -> None:
        if not streaming:
            raise ValueError("MemoryTransport supports streaming (push) producers only")
        self.producer = producer
        self.streaming = streaming
        self._producer_paused = False

    def unregisterProducer(self) -> None:
        self.producer = None

    def pauseProducing(self) -> None:
        self.reading = False

    def resumeProducing(self) -> None:
        if not self.reading:
            self.reading = True
            self.link._schedule(1 - self.side)

    def stopProducing(self) -> None:
        self.loseConnection()

    def setTcpNoDelay(self, enabled) -> None:
        self.no_delay = bool(enabled)

    def getTcpNoDelay(self) -> bool:
        return self.no_delay

    def setTcpKeepAlive(self, enabled) -> None:
        self.keep_alive = bool(enabled)

    def getTcpKeepAlive(self) -> bool:
        return self.keep_alive

    def loseWriteConnection(self) -> None:
        self.loseConnection()  # no half-close in memory

    def logPrefix(self) -> str:
        return "memory"


class MemoryLink:
    """One in-memory connection between two Switches (or a Switch and a raw protocol).

    A link that a test removes from ``network.links`` is detached: the clock moves
    nothing on it any more (``link.flush()`` still does).

    :ivar outbound: the dialing side's protocol.
    :ivar inbound: the listening side's protocol.
    :ivar transports: ``(outbound's, inbound's)`` MemoryTransport.
    :ivar delivered_bytes: bytes delivered so far, both ways.
    :ivar lost_bytes: bytes written but never delivered (resets, aborts, dead ends).
    """

    def __init__(self, network: MemoryNetwork, outbound, inbound, path: _Path) -> None:
        self.outbound = getattr(outbound, "_wrappedProtocol", outbound)  # endpoints wrap it
        self.inbound = inbound
        self.transports: tuple[MemoryTransport, MemoryTransport] = ()
        self.delivered_bytes = 0
        self.lost_bytes = 0
        self._network = network
        self._clock = network.clock
        self._path = path
        self._pipes = (_Pipe(), _Pipe())  # _pipes[side]: written by side, for the other
        self._moved = 0

    def __repr__(self) -> str:
        client, server = self.transports
        return f"<MemoryLink {client.getHost().host} -> {server.getHost().host}:{server.getHost().port}>"

    @property
    def alive(self) -> bool:
        """Whether either end still has the connection."""
        return any(t.connected for t in self.transports)

    @property
    def in_flight(self) -> int:
        """Bytes written and not yet delivered, both ways."""
        return self._pipes[0].bytes + self._pipes[1].bytes

    def flush(self) -> bool:
        """Deliver what is due on this connection, both ways, until nothing moves.

        Only this link moves: other links and timers wait for the clock
        (``network.flush``). Returns True if anything was delivered.
        """
        before = self._moved
        for _ in range(10_000):
            moved = self._moved
            for side, pipe in enumerate(self._pipes):
                if pipe.items and pipe.items[0][0] <= self._clock.seconds():
                    if pipe.call is not None and pipe.call.active():
                        pipe.call.cancel()
                    pipe.call = None
                    self._move(side)
            if self._moved == moved:
                break
        return self._moved != before

    def peer_of(self, switch: Switch):
        """The Peer that ``switch`` holds for the other end (None before the handshake)."""
        for proto in (self.outbound, self.inbound):
            if getattr(proto, "switch", None) is switch:
                return proto.peer
        raise ValueError(f"{switch!r} is not on either end of this link")

    def disconnect(self) -> None:
        """Drop the connection as a network failure would (no close packet).

        The dialing end's socket closes once what it wrote has arrived; both protocols
        hear ``connectionLost``.
        """
        self.transports[0].loseConnection()
        self.flush()

    # -- faults ----------------------------------------------------------------------

    def reset(self) -> None:
        """Reset this connection: both ends lose it now, undelivered bytes are lost."""
        for pipe in self._pipes:
            self.lost_bytes += pipe.clear()
        gone = [side for side, t in enumerate(self.transports) if t.connected]
        for side in gone:
            self.transports[side].connected = False
            self.transports[side].disconnecting = True
        for side in gone:
            self._notify(side, ConnectionLost("connection reset by the network (MemoryLink.reset)"))

    def blackhole(self) -> None:
        """Black-hole the path under this link (see ``MemoryNetwork.blackhole``)."""
        self._network._set_blackhole(self._path, True)

    def heal(self) -> None:
        """Heal the path under this link (see ``MemoryNetwork.heal``)."""
        self._network._set_blackhole(self._path, False)

    def delay(self, seconds: float) -> None:
        """Delay the path under this link (see ``MemoryNetwork.delay``)."""
        self._path.delay = _check_delay(seconds)

    # -- moving bytes ----------------------------------------------------------------

    def _send(self, side: int, kind: str, data: bytes) -> None:
        far = self.transports[1 - side]
        if not far.connected or far._aborted:
            self.lost_bytes += len(data)
            if kind is not _RST and not far.connected and self._network._host_up(far):
                self._enqueue(1 - side, _RST, b"")  # its kernel answers with a reset
            return
        self._enqueue(side, kind, data)
        writer, window = self.transports[side], self._network.window
        pipe = self._pipes[side]
        if window is not None and pipe.bytes > window and writer.producer is not None and not writer._producer_paused:
            writer._producer_paused = True
            writer.producer.pauseProducing()

    def _enqueue(self, side: int, kind: str, data: bytes) -> None:
        pipe = self._pipes[side]
        due = max(self._clock.seconds() + self._path.delay, pipe.last_due)
        pipe.last_due = due
        pipe.items.append((due, kind, data))
        pipe.bytes += len(data)
        self._schedule(side)

    def _schedule(self, side: int) -> None:
        """Make sure a clock call will deliver the head of the pipe when it is due."""
        pipe = self._pipes[side]
        if not pipe.items or self._path.blackholed:
            return
        due, kind, _ = pipe.items[0]
        if kind is _DATA and not self.transports[1 - side].reading:
            return  # resumeProducing schedules again
        call = pipe.call
        if call is not None and call.active():
            if call.getTime() <= due:
                return
            call.cancel()
        pipe.call = self._clock.callLater(max(0.0, due - self._clock.seconds()), self._deliver, side)

    def _deliver(self, side: int) -> None:
        """The clock's call: deliver what is due, unless a test detached the link."""
        self._pipes[side].call = None
        if self in self._network.links:
            self._move(side)

    def _move(self, side: int) -> None:
        pipe = self._pipes[side]
        receiver = self.transports[1 - side]
        now = self._clock.seconds()
        while pipe.items and not self._path.blackholed and pipe.items[0][0] <= now:
            kind = pipe.items[0][1]
            if kind is _DATA and not receiver.reading:
                break
            self._moved += 1
            if kind is _DATA:
                chunks = []
                while pipe.items and pipe.items[0][1] is _DATA and pipe.items[0][0] <= now:
                    chunks.append(pipe.items.popleft()[2])
                data = b"".join(chunks)
                pipe.bytes -= len(data)
                self.delivered_bytes += len(data)
                receiver.protocol.dataReceived(data)
            elif kind is _FIN:
                pipe.items.popleft()
                self._close(1 - side, ConnectionDone("the other end closed the connection"))
                self._close(side, ConnectionDone("connection closed"))
            else:
                pipe.items.popleft()
                self._close(1 - side, ConnectionLost("connection reset by peer"))
        self._schedule(side)
        writer, window = self.transports[side], self._network.window
        if writer._producer_paused and writer.connected and (window is None or pipe.bytes <= window // 2):
            writer._producer_paused = False
            if writer.producer is not None:
                writer.producer.resumeProducing()

    def _abort(self, side: int) -> None:
        """``abortConnection`` at one end: it reads and writes no more, bytes on their way
        either way are lost, a reset goes to the other end."""
        self.transports[side].disconnecting = True
        self.lost_bytes += self._pipes[side].clear() + self._pipes[1 - side].clear()
        self._send(side, _RST, b"")
        self._clock.callLater(0, self._close, side, ConnectionAborted())

    def _vanish(self, side: int, *, silently: bool) -> None:
        """The process at one end died: it hears nothing; its kernel resets the connection
        (unless the host went down with it)."""
        transport = self.transports[side]
        if not transport.connected:
            return
        self.lost_bytes += self._pipes[side].clear() + self._pipes[1 - side].clear()
        if not silently:
            self._send(side, _RST, b"")
        transport.connected = False
        transport.disconnecting = True

    def _close(self, side: int, reason: Exception) -> None:
        transport = self.transports[side]
        if transport.connected:
            transport.connected = False
            transport.disconnecting = True
            self.lost_bytes += self._pipes[1 - side].clear()  # nobody left to read it
            self._notify(side, reason)

    def _notify(self, side: int, reason: Exception) -> None:
        transport = self.transports[side]
        if transport.node is None or transport.node.alive:
            transport.protocol.connectionLost(Failure(reason))


def _check_delay(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"a delay is a finite number of seconds >= 0, got {seconds!r}")
    return float(seconds)


# -- nodes: a host, its ports, and a reactor that dies with it ---------------------------


class _Node:
    """One process at one host. Once it is dead, nothing scheduled through it runs."""

    def __init__(self, network: MemoryNetwork, host: str) -> None:
        self.host = host
        self.alive = True
        #: False once the host went down with the process (``kill(..., silently=True)``).
        self.host_up = True
        self.switch = None
        #: port -> (factory, interface) of what listens here.
        self.ports: dict[int, tuple] = {}
        self.reactor = _NodeReactor(network, self)

    def run(self, function, args, kwargs) -> None:
        if self.alive:
            function(*args, **kwargs)


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:
        pass


@implementer(IHostnameResolver)
class _MemoryResolver:
    """Host names are IPv4 literals (and ``localhost``); nothing else resolves."""

    def resolveHostName(self, resolutionReceiver, hostName, portNumber=0, addressTypes=None, transportSemantics="TCP"):
        resolution = _Resolution(hostName)
        resolutionReceiver.resolutionBegan(resolution)
        host = LOOPBACK if hostName == "localhost" else hostName
        if isIPAddress(host):
            resolutionReceiver.addressResolved(IPv4Address("TCP", host, portNumber))
        resolutionReceiver.resolutionComplete()
        return resolution


@implementer(IReactorTime, IReactorTCP, IReactorPluggableNameResolver)
class _NodeReactor:
    """A node's Twisted reactor: the shared clock, and TCP over the memory network."""

    def __init__(self, network: MemoryNetwork, node: _Node) -> None:
        self._network = network
        self._node = node
        self._clock = network.clock
        recording = network._recording
        self.nameResolver = self._clock.nameResolver if recording else _MemoryResolver()
        self._instant, self._calls_now = None, 0

    def __repr__(self) -> str:
        return f"<node reactor {self._node.host}{'' if self._node.alive else ' (dead)'}>"

    def seconds(self) -> float:
        return self._clock.seconds()

    def callLater(self, delay, function, *args, **kwargs):
        if delay <= 0:
            self._spin_guard(function)
        return self._clock.callLater(delay, self._node.run, function, args, kwargs)

    def _spin_guard(self, function) -> None:
        """Fail loudly where a real reactor would spin: endless calls at one instant."""
        now = self._clock.seconds()
        if now != self._instant:
            self._instant, self._calls_now = now, 0
        self._calls_now += 1
        if self._calls_now > self._network.max_calls_per_instant:
            raise RuntimeError(
                f"livelock on {self._node.host}: {self._calls_now} calls scheduled at t={now!r} without time "
                f"moving, the last to {getattr(function, '__qualname__', function)}"
            )

    def getDelayedCalls(self):
        return [c for c in self._clock.getDelayedCalls() if c.func == self._node.run]

    def installNameResolver(self, resolver):
        old, self.nameResolver = self.nameResolver, resolver
        return old

    def listenTCP(self, port, factory, backlog=50, interface=""):
        if self._network._recording:
            return self._clock.listenTCP(port, factory, backlog, interface)
        return self._network._listen(self._node, port, factory, interface)

    def connectTCP(self, host, port, factory, timeout=30, bindAddress=None):
        if self._network._recording:
            return self._clock.connectTCP(host, port, factory, timeout, bindAddress)
        return self._network._connect(self._node, host, port, factory, timeout)


@implementer(IListeningPort)
class _MemoryPort:
    def __init__(self, node: _Node, port: int, factory, interface: str) -> None:
        self._node, self._port, self._factory = node, port, factory
        self._address = IPv4Address("TCP", interface if interface not in ("", "0.0.0.0") else node.host, port)

    def startListening(self) -> None:
        pass

    def stopListening(self) -> None:
        if self._node.ports.get(self._port, (None,))[0] is self._factory:
            del self._node.ports[self._port]
            self._factory.doStop()

    def getHost(self) -> IPv4Address:
        return self._address


@implementer(IConnector)
class _MemoryConnector:
    """A connection attempt: it connects, is refused, or times out, on the node's clock."""

    def __init__(self, node: _Node, host: str, port: int, factory, timeout: float) -> None:
        self.node, self.host, self.port, self.factory, self.timeout = node, host, port, factory, timeout
        self.state = "connecting"
        self.transport = None
        self.call = None

    def getDestination(self) -> IPv4Address:
        return IPv4Address("TCP", self.host, self.port)

    def connect(self) -> None:
        raise NotImplementedError("a memory connector is not reused")

    def stopConnecting(self) -> None:
        if self.state == "connecting":
            self.fail(UserError())

    def disconnect(self) -> None:
        if self.state == "connected":
            self.transport.loseConnection()
        else:
            self.stopConnecting()

    def fail(self, reason: Exception) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        self.state = "disconnected"
        self.factory.clientConnectionFailed(self, Failure(reason))


class MemoryNetwork:
    """Switches on one clock, connected by in-memory transports that can fail like a network.

    :param clock: a ``task.Clock`` (a new one if None), or a ``MemoryReactorClock`` to
        record dials and listening ports for ``complete_dials`` (see the module docstring).
    :param window: bytes a transport may have on their way before it pauses its producer
        (None: never pause).
    :param max_calls_per_instant: a node that schedules more zero-delay calls than this
        without the clock moving is spinning: its ``callLater`` raises RuntimeError
        (on a simulated clock the spin would never end).
    """

    def __init__(self, clock=None, *, window: int | None = None, max_calls_per_instant: int = 50_000) -> None:
        self.clock = clock if clock is not None else Clock()
        self.window = window
        self.max_calls_per_instant = max_calls_per_instant
        self.links: list[MemoryLink] = []
        self._recording = IReactorTCP.providedBy(self.clock)
        self._nodes: dict[str, _Node] = {}  # host -> the node living there now
        self._node_of_switch: dict[Switch, _Node] = {}
        self._paths: dict[frozenset, _Path] = {}

    # -- switches and nodes --------------------------------------------------------------

    def switch(self, reactors, **kwargs) -> Switch:
        """A new Switch on a new host; ``kwargs`` go to ``Switch`` (config, node_key)."""
        return self._start(_Node(self, self._new_host()), reactors, kwargs)

    def host_of(self, switch: Switch) -> str:
        """The host address of ``switch``'s node (10.0.0.n)."""
        return self._node(switch).host

    def dial_address(self, switch: Switch, port: int = DEFAULT_PORT) -> str:
        """``ID@host:port`` of ``switch``, to pass to another Switch's ``dial``."""
        return f"{switch.node_id}@{self.host_of(switch)}:{port}"

    def kill(self, switch: Switch, *, silently: bool = False) -> None:
        """End ``switch``'s process abruptly (see the module docstring).

        :param silently: the host goes down too (a power cut): no resets are sent and
            dials to it time out instead of being refused.
        """
        node = self._node(switch)
        if not node.alive:
            return
        node.alive = False  # its ports stay on record for restart; nobody answers on them
        node.host_up = not silently
        for link in self.links:
            for side, transport in enumerate(link.transports):
                if transport.node is node:
                    link._vanish(side, silently=silently)

    def restart(self, switch: Switch, reactors, **kwargs) -> Switch:
        """Kill ``switch`` (if alive) and start a new Switch with its NodeKey at its host.

        :returns: the new Switch, listening on the ports the old one listened on.
        """
        old = self._node(switch)
        listening = sorted((port, interface) for port, (_, interface) in old.ports.items())
        self.kill(switch)
        kwargs.setdefault("node_key", switch.node_key)
        kwargs.setdefault("config", switch.config)
        new = self._start(_Node(self, old.host), reactors, kwargs)
        for port, interface in listening:
            new.listen(f"tcp:{port}" + (f":interface={interface}" if interface else ""))
        if switch.running:
            new.startService()
        return new

    def is_alive(self, switch: Switch) -> bool:
        """False once ``switch`` was killed (or restarted)."""
        return self._node(switch).alive

    def _start(self, node: _Node, reactors, kwargs) -> Switch:
        switch = Switch(reactors, clock=node.reactor, **kwargs)
        node.switch = switch
        self._nodes[node.host] = node
        self._node_of_switch[switch] = node
        return switch

    def _node(self, switch: Switch) -> _Node:
        """The node of ``switch``; a Switch made elsewhere gets one (it keeps its own clock)."""
        node = self._node_of_switch.get(switch)
        if node is None:
            node = _Node(self, self._new_host())
            node.switch = switch
            self._nodes[node.host] = node
            self._node_of_switch[switch] = node
        return node

    def _new_host(self) -> str:
        n = len(self._nodes) + 1
        return f"10.0.{n // 250}.{n % 250}"

    # -- connecting ------------------------------------------------------------------------

    def connect(self, dialer: Switch, listener: Switch, *, expected_node_id: str | None = None) -> MemoryLink:
        """Connect ``dialer`` to ``listener`` directly (no dial) and deliver the hellos.

        :param expected_node_id: the node id the dialer insists on, as in ``ID@host:port``.
        :returns: the link; ``link.peer_of(dialer)`` is the dialer's Peer once accepted.
        """
        out_node, in_node = self._node(dialer), self._node(listener)
        outbound = MConnectionFactory(dialer, is_outbound=True, expected_node_id=expected_node_id).buildProtocol(None)
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        link = self._link(outbound, self._ephemeral(out_node.host), out_node, inbound, self._listening(in_node), in_node)
        link.flush()
        return link

    def connect_raw(self, protocol, listener: Switch) -> MemoryLink:
        """Connect any protocol (a scripted or hostile peer) to ``listener``.

        The listener's hello is delivered to ``protocol`` before this returns.
        """
        node = self._node(listener)
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        link = self._link(protocol, self._ephemeral("192.0.2.1"), None, inbound, self._listening(node), node)
        link.flush()
        return link

    def complete_dials(self) -> list[MemoryLink]:
        """Connect every pending ``Switch.dial`` to the ``Switch.listen`` port it names.

        Needs a ``MemoryReactorClock`` as the network's clock: it records the dials
        (``connectTCP``) and listening ports (``listenTCP``). A dial to a port nobody
        listens on fails with ConnectionRefusedError.
        """
        links = []
        if not self._recording:
            return links  # on a plain Clock, dials connect by themselves
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
            out_node = self._node(switch) if switch is not None else None
            listener = getattr(server_factory, "switch", None)
            in_node = self._node(listener) if listener is not None else None
            inbound = server_factory.buildProtocol(None)
            out_address = self._ephemeral(out_node.host if out_node is not None else "192.0.2.1")
            link = self._link(outbound, out_address, out_node, inbound, IPv4Address("TCP", host, port), in_node)
            link.flush()
            links.append(link)
        return links

    def _listening(self, node: _Node) -> IPv4Address:
        return IPv4Address("TCP", node.host, DEFAULT_PORT)

    def _ephemeral(self, host: str) -> IPv4Address:
        return IPv4Address("TCP", host, 40000 + len(self.links))

    def _link(self, outbound, out_address, out_node, inbound, in_address, in_node) -> MemoryLink:
        link = MemoryLink(self, outbound, inbound, self._path(out_address.host, in_address.host))
        client = MemoryTransport(link, 0, outbound, out_address, in_address, out_node)
        server = MemoryTransport(link, 1, inbound, in_address, out_address, in_node)
        link.transports = (client, server)
        self.links.append(link)
        inbound.makeConnection(server)
        outbound.makeConnection(client)
        return link

    def _listen(self, node: _Node, port: int, factory, interface: str) -> _MemoryPort:
        if port == 0:
            port = next(p for p in range(30000, 40000) if p not in node.ports)
        if port in node.ports:
            raise CannotListenError(interface, port, OSError(f"{node.host}:{port} is in use"))
        node.ports[port] = (factory, interface)
        factory.doStart()
        return _MemoryPort(node, port, factory, interface)

    def _connect(self, node: _Node, host: str, port: int, factory, timeout: float) -> _MemoryConnector:
        connector = _MemoryConnector(node, host, port, factory, timeout)
        started = getattr(factory, "startedConnecting", None)
        if started is not None:
            started(connector)
        target = node.host if host in (LOOPBACK, node.host) else host
        connector.call = node.reactor.callLater(self._path(node.host, target).delay, self._establish, connector)
        return connector

    def _establish(self, connector: _MemoryConnector) -> None:
        """The SYN arrives: connect to the listener, or be refused, or time out."""
        connector.call = None
        if connector.state != "connecting":
            return
        source = connector.node
        target = source if connector.host in (LOOPBACK, source.host) else self._nodes.get(connector.host)
        path = self._path(source.host, target.host if target is not None else connector.host)
        if target is None or not target.host_up or path.blackholed:
            wait = max(0.0, connector.timeout - path.delay)
            connector.call = source.reactor.callLater(wait, connector.fail, TimeoutError())
            return
        listening = target.ports.get(connector.port) if target.alive else None
        if listening is None:
            connector.fail(ConnectionRefusedError(f"{target.host}:{connector.port}"))
            return
        out_address = self._ephemeral(source.host)
        in_address = IPv4Address("TCP", target.host, connector.port)
        outbound = connector.factory.buildProtocol(in_address)
        inbound = listening[0].buildProtocol(out_address)
        connector.state = "connected"
        link = self._link(outbound, out_address, source, inbound, in_address, target)
        connector.transport = link.transports[0]

    # -- faults ------------------------------------------------------------------------------

    def blackhole(self, a, b) -> None:
        """Stop all traffic between ``a`` and ``b`` (Switches or hosts) without telling them."""
        self._set_blackhole(self._path(self._host(a), self._host(b)), True)

    def heal(self, a=None, b=None) -> None:
        """End the black hole between ``a`` and ``b``; with no arguments, every one."""
        if a is None and b is None:
            paths = list(self._paths.values())
        else:
            paths = [self._path(self._host(a), self._host(b))]
        for path in paths:
            self._set_blackhole(path, False)

    def delay(self, a, b, seconds: float) -> None:
        """Make traffic between ``a`` and ``b`` take ``seconds`` each way (0: none)."""
        self._path(self._host(a), self._host(b)).delay = _check_delay(seconds)

    def reset(self, a, b) -> int:
        """Reset every connection between ``a`` and ``b``; returns how many there were."""
        path = self._path(self._host(a), self._host(b))
        links = [link for link in self.links if link._path is path and link.alive]
        for link in links:
            link.reset()
        return len(links)

    def links_between(self, a, b) -> list[MemoryLink]:
        """The connections between ``a`` and ``b`` that at least one end still has."""
        path = self._path(self._host(a), self._host(b))
        return [link for link in self.links if link._path is path and link.alive]

    def in_flight(self) -> int:
        """Bytes written and not yet delivered, on every connection."""
        return sum(link.in_flight for link in self.links if link.alive)

    def _host_up(self, transport: MemoryTransport) -> bool:
        """Whether a kernel runs at the host of ``transport``'s end (to send resets)."""
        if transport.node is None:
            return True
        node = self._nodes.get(transport.node.host)
        return node is not None and (node.alive or node.host_up)

    def _host(self, end) -> str:
        return end if isinstance(end, str) else self._node(end).host

    def _path(self, host_a: str, host_b: str) -> _Path:
        key = frozenset((host_a, host_b))
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = _Path()
        return path

    def _set_blackhole(self, path: _Path, on: bool) -> None:
        path.blackholed = on
        if not on:
            for link in self.links:
                if link._path is path and link.alive:
                    link._schedule(0)
                    link._schedule(1)

    # -- time ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Deliver everything that is due, and run every timer that is due, without moving time."""
        self.clock.advance(0)

    def advance(self, seconds: float, *, step: float | None = None) -> None:
        """Let ``seconds`` pass in steps of ``step`` (all at once if None), flushing after each.

        Like ``task.Clock.advance``, a step runs every call due within it at the end of
        the step, late; ``run`` keeps time exactly.
        """
        remaining = seconds
        step = seconds if step is None else step
        while remaining > 1e-12:
            delta = min(step, remaining)
            self.clock.advance(delta)
            self.flush()
            remaining -= delta

    def run(self, seconds: float, *, each=None) -> None:
        """Let ``seconds`` pass, stopping at every scheduled call so each fires on time.

        :param each: called with no arguments at every stop (after the calls due then
            ran): a place to check invariants at every event.
        """
        end = self.clock.seconds() + seconds
        while True:
            now = self.clock.seconds()
            due = min((call.getTime() for call in self.clock.getDelayedCalls()), default=end)
            target = min(end, max(now, due))
            self.clock.advance(target - now)
            if each is not None:
                each()
            if target >= end:
                return


def connected_switches(reactors_a, reactors_b, *, config=None, clock=None) -> tuple[Switch, Switch, MemoryNetwork]:
    """Two Switches on one MemoryNetwork, ``a`` connected to ``b`` (handshake done).

    :returns: ``(a, b, network)``; ``network.links[0].peer_of(a)`` is a's Peer for b.
    """
    network = MemoryNetwork(clock)
    a = network.switch(reactors_a, config=config)
    b = network.switch(reactors_b, config=config)
    network.connect(a, b)
    return a, b, network
