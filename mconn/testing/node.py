"""Nodes: one process at one host of a MemoryNetwork, with its ports and its own reactor.

Each Switch made by ``network.switch`` lives on a ``_Node``. Its ``_NodeReactor`` keeps
time with the network's shared clock and does TCP in memory (``listenTCP`` makes a
``_MemoryPort``, ``connectTCP`` a ``_MemoryConnector``; ``_MemoryResolver`` resolves
IPv4 literals and ``localhost``), so the Switch's own code paths (``listen``, ``dial``,
re-dials) work unchanged. A dial arrives after the path's delay: it makes a link to
whatever listens at that host and port, is refused if nothing does, and times out if the
host is unknown or down or the path is a black hole. Once the node is dead, nothing
scheduled through its reactor runs: that is how ``network.kill`` silences a process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.abstract import isIPAddress
from twisted.internet.address import IPv4Address
from twisted.internet.error import CannotListenError, ConnectionRefusedError, TimeoutError, UserError
from twisted.internet.interfaces import (
    IConnector,
    IDelayedCall,
    IHostnameResolver,
    IHostResolution,
    IListeningPort,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorTime,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.testing.transport import open_link

if TYPE_CHECKING:
    from mconn.switch.switch import Switch
    from mconn.testing.fabric import Fabric
    from mconn.testing.transport import MemoryTransport

LOOPBACK = "127.0.0.1"


class _Node:
    """One process at one host. Once it is dead, nothing scheduled through it runs."""

    def __init__(self, fabric: Fabric, host: str) -> None:
        self.host = host
        self.alive = True
        #: False once the host went down with the process (``kill(..., silently=True)``).
        self.host_up = True
        self.switch: Switch | None = None
        #: port -> (factory, interface) of what listens here.
        self.ports: dict[int, tuple] = {}
        self.reactor = _NodeReactor(fabric, self)

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

    def __init__(self, fabric: Fabric, node: _Node) -> None:
        self._fabric = fabric
        self._node = node
        self._clock = fabric.clock
        self.nameResolver = self._clock.nameResolver if fabric.recording else _MemoryResolver()
        self._instant, self._calls_now = None, 0

    def __repr__(self) -> str:
        return f"<node reactor {self._node.host}{'' if self._node.alive else ' (dead)'}>"

    def seconds(self) -> float:
        return self._clock.seconds()

    def callLater(self, delay: float, callable: Callable[..., Any], *args: object, **kwargs: object) -> IDelayedCall:
        # The parameter is named as IReactorTime.callLater names it.
        if delay <= 0:
            self._spin_guard(callable)
        return self._clock.callLater(delay, self._node.run, callable, args, kwargs)

    def _spin_guard(self, function) -> None:
        """Fail loudly where a real reactor would spin: endless calls at one instant."""
        now = self._clock.seconds()
        if now != self._instant:
            self._instant, self._calls_now = now, 0
        self._calls_now += 1
        if self._calls_now > self._fabric.max_calls_per_instant:
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
        if self._fabric.recording:
            return self._clock.listenTCP(port, factory, backlog, interface)
        node = self._node
        if port == 0:
            port = next(p for p in range(30000, 40000) if p not in node.ports)
        if port in node.ports:
            raise CannotListenError(interface, port, OSError(f"{node.host}:{port} is in use"))
        node.ports[port] = (factory, interface)
        factory.doStart()
        return _MemoryPort(node, port, factory, interface)

    def connectTCP(self, host, port, factory, timeout=30, bindAddress=None):
        if self._fabric.recording:
            return self._clock.connectTCP(host, port, factory, timeout, bindAddress)
        node = self._node
        connector = _MemoryConnector(node, host, port, factory, timeout)
        started = getattr(factory, "startedConnecting", None)
        if started is not None:
            started(connector)
        target = node.host if host in (LOOPBACK, node.host) else host
        connector.call = self.callLater(self._fabric.path(node.host, target).delay, self._establish, connector)
        return connector

    def _establish(self, connector: _MemoryConnector) -> None:
        """The SYN arrives: connect to the listener, or be refused, or time out."""
        connector.call = None
        if connector.state != "connecting":
            return
        fabric, source = self._fabric, self._node
        target = source if connector.host in (LOOPBACK, source.host) else fabric.nodes.get(connector.host)
        path = fabric.path(source.host, target.host if target is not None else connector.host)
        if target is None or not target.host_up or path.blackholed:
            wait = max(0.0, connector.timeout - path.delay)
            connector.call = self.callLater(wait, connector.fail, TimeoutError())
            return
        listening = target.ports.get(connector.port) if target.alive else None
        if listening is None:
            connector.fail(ConnectionRefusedError(f"{target.host}:{connector.port}"))
            return
        out_address = fabric.ephemeral(source.host)
        in_address = IPv4Address("TCP", target.host, connector.port)
        outbound = connector.factory.buildProtocol(in_address)
        inbound = listening[0].buildProtocol(out_address)
        connector.state = "connected"
        link = open_link(fabric, outbound, out_address, source, inbound, in_address, target)
        connector.transport = link.transports[0]


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
        self.transport: MemoryTransport | None = None
        self.call: IDelayedCall | None = None

    def getDestination(self) -> IPv4Address:
        return IPv4Address("TCP", self.host, self.port)

    def connect(self) -> None:
        raise NotImplementedError("a memory connector is not reused")

    def stopConnecting(self) -> None:
        if self.state == "connecting":
            self.fail(UserError())

    def disconnect(self) -> None:
        if self.state == "connected":
            assert self.transport is not None  # set with the state (_establish)
            self.transport.loseConnection()
        else:
            self.stopConnecting()

    def fail(self, reason: Exception) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        self.state = "disconnected"
        self.factory.clientConnectionFailed(self, Failure(reason))
