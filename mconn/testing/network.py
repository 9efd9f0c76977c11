"""MemoryNetwork: real Switches on one clock, over in-memory transports that fail like a network.

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

How bytes travel on a connection (delivery on the shared clock, delays, the ``window``)
is described in mconn/testing/transport.py; the nodes in mconn/testing/node.py.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.error import CannotListenError, ConnectionRefusedError, TimeoutError
from twisted.internet.interfaces import IReactorTCP
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mconn.protocol import MConnectionFactory
from mconn.switch import Switch
from mconn.testing.node import LOOPBACK, _MemoryConnector, _MemoryPort, _Node
from mconn.testing.transport import MemoryLink, MemoryTransport, _check_delay, _Path

__all__ = ["MemoryNetwork", "connected_switches"]

#: The port ``Switch.listen("tcp:26656")`` uses in the examples, and dial_address's default.
DEFAULT_PORT = 26656


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
