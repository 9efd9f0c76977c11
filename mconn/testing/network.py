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
10.0.0.2, ..., or the one ``network.switch(..., host=...)`` names) and a Twisted
reactor of its own that keeps time with the shared clock and
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
``network.partition(side_a, side_b)``
    A black hole between every member of one side and every member of the other.
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
is described in mconn/testing/transport.py; the nodes, and how they listen and dial, in
mconn/testing/node.py; what they all share (clock, hosts, paths, links) in
mconn/testing/fabric.py.
"""

from __future__ import annotations

from twisted.internet.abstract import isIPAddress
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mconn.net.protocol import IConnectionOwner, MConnectionFactory
from mconn.switch.switch import Switch
from mconn.testing.fabric import Fabric, Path, check_delay
from mconn.testing.node import _Node
from mconn.testing.transport import MemoryLink, open_link

__all__ = ["MemoryNetwork", "connected_switches"]

#: The port ``Switch.listen("tcp:26656")`` uses in the examples, and dial_address's default.
DEFAULT_PORT = 26656


class _OfFabric:
    """An attribute of the network kept on its fabric, where the nodes and links read it."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, network, owner=None):
        return self if network is None else getattr(network.fabric, self.name)

    def __set__(self, network, value) -> None:
        setattr(network.fabric, self.name, value)


class MemoryNetwork:
    """Switches on one clock, connected by in-memory transports that can fail like a network.

    :param clock: a ``task.Clock`` (a new one if None), or a ``MemoryReactorClock`` to
        record dials and listening ports for ``complete_dials`` (see the module docstring).
    :param window: bytes a transport may have on their way before it pauses its producer
        (None: never pause).
    :param max_calls_per_instant: a node that schedules more zero-delay calls than this
        without the clock moving is spinning: its ``callLater`` raises RuntimeError
        (on a simulated clock the spin would never end).
    :param keep_closed_links: keep every link made in ``links`` (tests read a closed
        link's bytes); False drops a link once neither end has it, as a network of many
        nodes needs (bench/sim_network.py: at 1,000 nodes, 23,000 links held 1.5 GB).
    :ivar links: every MemoryLink made, in order (with ``keep_closed_links`` False, only
        those an end still has); one removed from here is detached.
    """

    clock = _OfFabric()
    window = _OfFabric()
    max_calls_per_instant = _OfFabric()
    links = _OfFabric()

    def __init__(
        self,
        clock=None,
        *,
        window: int | None = None,
        max_calls_per_instant: int = 50_000,
        keep_closed_links: bool = True,
    ) -> None:
        clock = clock if clock is not None else Clock()
        self.fabric = Fabric(
            clock, window=window, max_calls_per_instant=max_calls_per_instant, keep_closed_links=keep_closed_links
        )
        self._node_of_switch: dict[Switch, _Node] = {}

    # -- switches and nodes --------------------------------------------------------------

    def switch(self, reactors, *, host: str | None = None, **kwargs) -> Switch:
        """A new Switch on a new host; ``kwargs`` go to ``Switch`` (config, node_key).

        :param host: the host's IPv4 address (the next 10.0.0.n if None). The default
            hosts all share the private group 10.0.0.0/16; a simulation of a public network
            gives each node a public address in a group of its own (bench/sim_network.py).
        :raises ValueError: for a host that is not an IPv4 literal or already has a node.
        """
        if host is None:
            host = self.fabric.new_host()
        elif not isIPAddress(host) or host in self.fabric.nodes:
            raise ValueError(f"host {host!r} must be an IPv4 address no node of this network has yet")
        return self._start(_Node(self.fabric, host), reactors, kwargs)

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
        for link in list(self.links):  # a link both ends lost leaves the list (keep_closed_links)
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
        new = self._start(_Node(self.fabric, old.host), reactors, kwargs)
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
        self.fabric.nodes[node.host] = node
        self._node_of_switch[switch] = node
        return switch

    def _node_of_owner(self, owner) -> _Node | None:
        """The node whose Switch owns a protocol or factory (``IConnectionOwner``), if any."""
        if owner is None:
            return None
        switch = next((s for s in self._node_of_switch if IConnectionOwner(s) is owner), None)
        return self._node(switch) if switch is not None else None

    def _node(self, switch: Switch) -> _Node:
        """The node of ``switch``; a Switch made elsewhere gets one (it keeps its own clock)."""
        node = self._node_of_switch.get(switch)
        if node is None:
            node = _Node(self.fabric, self.fabric.new_host())
            node.switch = switch
            self.fabric.nodes[node.host] = node
            self._node_of_switch[switch] = node
        return node

    # -- connecting ------------------------------------------------------------------------

    def connect(self, dialer: Switch, listener: Switch, *, expected_node_id: str | None = None) -> MemoryLink:
        """Connect ``dialer`` to ``listener`` directly (no dial) and deliver the hellos.

        :param expected_node_id: the node id the dialer insists on, as in ``ID@host:port``.
        :returns: the link; ``link.peer_of(dialer)`` is the dialer's Peer once accepted.
        """
        out_node, in_node = self._node(dialer), self._node(listener)
        outbound = MConnectionFactory(dialer, is_outbound=True, expected_node_id=expected_node_id).buildProtocol(None)
        # No dial waits on this handshake (Switch.dial would): a refusal shows in
        # link.peer_of(dialer) and the reactors' calls, not as an unhandled Deferred
        # error logged whenever the garbage collector gets to it (in a later test).
        outbound.handshake.addErrback(lambda failure: None)
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        out_address = self.fabric.ephemeral(out_node.host)
        link = open_link(self.fabric, outbound, out_address, out_node, inbound, self._listening(in_node), in_node)
        link.flush()
        return link

    def connect_raw(self, protocol, listener: Switch) -> MemoryLink:
        """Connect any protocol (a scripted or hostile peer) to ``listener``.

        The listener's hello is delivered to ``protocol`` before this returns.
        """
        node = self._node(listener)
        inbound = MConnectionFactory(listener, is_outbound=False).buildProtocol(None)
        out_address = self.fabric.ephemeral("192.0.2.1")
        link = open_link(self.fabric, protocol, out_address, None, inbound, self._listening(node), node)
        link.flush()
        return link

    def complete_dials(self) -> list[MemoryLink]:
        """Connect every pending ``Switch.dial`` to the ``Switch.listen`` port it names.

        Needs a ``MemoryReactorClock`` as the network's clock: it records the dials
        (``connectTCP``) and listening ports (``listenTCP``). A dial to a port nobody
        listens on fails with ConnectionRefusedError.
        """
        links: list[MemoryLink] = []
        if not self.fabric.recording:
            return links  # on a plain Clock, dials connect by themselves
        while self.clock.tcpClients:
            host, port, client_factory, _, _ = self.clock.tcpClients.pop(0)
            connector = self.clock.connectors.pop(0)
            server_factory = next((s[1] for s in self.clock.tcpServers if s[0] == port), None)
            if server_factory is None:
                client_factory.clientConnectionFailed(connector, Failure(ConnectionRefusedError(f"{host}:{port}")))
                continue
            outbound = client_factory.buildProtocol(None)
            # Endpoints wrap the protocol; its owner sits on the wrapped one.
            out_node = self._node_of_owner(getattr(getattr(outbound, "_wrappedProtocol", outbound), "owner", None))
            in_node = self._node_of_owner(getattr(server_factory, "owner", None))
            inbound = server_factory.buildProtocol(None)
            out_address = self.fabric.ephemeral(out_node.host if out_node is not None else "192.0.2.1")
            in_address = IPv4Address("TCP", host, port)
            link = open_link(self.fabric, outbound, out_address, out_node, inbound, in_address, in_node)
            link.flush()
            links.append(link)
        return links

    def _listening(self, node: _Node) -> IPv4Address:
        return IPv4Address("TCP", node.host, DEFAULT_PORT)

    # -- faults ------------------------------------------------------------------------------

    def blackhole(self, a, b) -> None:
        """Stop all traffic between ``a`` and ``b`` (Switches or hosts) without telling them."""
        self.fabric.set_blackhole(self._path(a, b), True)

    def heal(self, a=None, b=None) -> None:
        """End the black hole between ``a`` and ``b``; with no arguments, every one."""
        if a is None and b is None:
            paths = self.fabric.paths()
        else:
            paths = [self._path(a, b)]
        self.fabric.set_blackholes(paths, False)

    def partition(self, side_a, side_b) -> int:
        """Black-hole every path between a Switch (or host) of ``side_a`` and one of
        ``side_b``: the network splits in two without telling anyone; ``heal()`` joins it.

        :returns: the number of paths cut.
        """
        hosts_b = [self._host(b) for b in side_b]
        paths = [self.fabric.path(self._host(a), host) for a in side_a for host in hosts_b]
        self.fabric.set_blackholes(paths, True)
        return len(paths)

    def delay(self, a, b, seconds: float) -> None:
        """Make traffic between ``a`` and ``b`` take ``seconds`` each way (0: none)."""
        self._path(a, b).delay = check_delay(seconds)

    def reset(self, a, b) -> int:
        """Reset every connection between ``a`` and ``b``; returns how many there were."""
        links = self.links_between(a, b)
        for link in links:
            link.reset()
        return len(links)

    def links_between(self, a, b) -> list[MemoryLink]:
        """The connections between ``a`` and ``b`` that at least one end still has."""
        return self.fabric.links_on(self._path(a, b))

    @property
    def links_opened(self) -> int:
        """Links made so far, those dropped from ``links`` included."""
        return self.fabric.opened

    def delivered_bytes(self) -> int:
        """Bytes delivered on every link made so far, those dropped from ``links`` included."""
        return self.fabric.delivered_bytes()

    def in_flight(self) -> int:
        """Bytes written and not yet delivered, on every connection."""
        return sum(link.in_flight for link in self.links if link.alive)

    def _path(self, a, b) -> Path:
        """The path between ``a`` and ``b`` (Switches or hosts)."""
        return self.fabric.path(self._host(a), self._host(b))

    def _host(self, end) -> str:
        return end if isinstance(end, str) else self._node(end).host

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
