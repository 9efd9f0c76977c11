"""The in-memory TCP connection: MemoryLink, and the MemoryTransport at each of its ends.

Bytes written to a transport travel on the shared clock: they are delivered when the
clock next runs (``network.flush()`` runs it without moving time; so does ``advance``),
or, over a path with a delay, that many seconds after they were written; never out of
order, never duplicated. With ``window`` set, a transport with more than ``window`` bytes
on their way pauses its producer until half of them have arrived, as TCP flow control
would.

Each direction of a link is a ``_Pipe`` of what one end wrote and the other has not yet
received. A link lies on the ``Path`` between its two hosts (mconn/testing/fabric.py),
whose faults (a black hole, a delay) it obeys; ``reset``, ``abortConnection`` and a dying
process (``_vanish``) lose what is in the pipes. The faults themselves are described in
mconn/testing/network.py. ``open_link`` makes a link and connects both protocols to it.

This is mconn's own transport (not iosim's, which never loses a written byte), so this
package is the one place to change if Twisted's testing helpers move.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IConsumer, IPushProducer, ITCPTransport
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.net.protocol import IConnectionOwner
from mconn.testing.fabric import Path, check_delay

if TYPE_CHECKING:
    from mconn.switch.switch import Switch
    from mconn.testing.fabric import Fabric

__all__ = ["MemoryLink", "MemoryTransport"]

#: What travels in a pipe: bytes, or the end of the connection (graceful or a reset).
_DATA, _FIN, _RST = "data", "fin", "rst"


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
    nothing on it any more (``link.flush()`` still does). A network that does not keep
    closed links drops one from there once neither end has it.

    :ivar outbound: the dialing side's protocol.
    :ivar inbound: the listening side's protocol.
    :ivar transports: ``(outbound's, inbound's)`` MemoryTransport.
    :ivar delivered_bytes: bytes delivered so far, both ways.
    :ivar lost_bytes: bytes written but never delivered (resets, aborts, dead ends).
    """

    def __init__(self, fabric: Fabric, outbound, inbound, path: Path) -> None:
        self.outbound = getattr(outbound, "_wrappedProtocol", outbound)  # endpoints wrap it
        self.inbound = inbound
        #: Empty until open_link makes the pair.
        self.transports: tuple[MemoryTransport, ...] = ()
        self.delivered_bytes = 0
        self.lost_bytes = 0
        self._fabric = fabric
        self._clock = fabric.clock
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
            if getattr(proto, "owner", None) is IConnectionOwner(switch):
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
        self._fabric.closed_link(self)

    def blackhole(self) -> None:
        """Black-hole the path under this link (see ``MemoryNetwork.blackhole``)."""
        self._fabric.set_blackhole(self._path, True)

    def heal(self) -> None:
        """Heal the path under this link (see ``MemoryNetwork.heal``)."""
        self._fabric.set_blackhole(self._path, False)

    def delay(self, seconds: float) -> None:
        """Delay the path under this link (see ``MemoryNetwork.delay``)."""
        self._path.delay = check_delay(seconds)

    # -- moving bytes ----------------------------------------------------------------

    def _send(self, side: int, kind: str, data: bytes) -> None:
        far = self.transports[1 - side]
        if not far.connected or far._aborted:
            self.lost_bytes += len(data)
            if kind is not _RST and not far.connected and self._fabric.host_up(far.node):
                self._enqueue(1 - side, _RST, b"")  # its kernel answers with a reset
            return
        self._enqueue(side, kind, data)
        writer, window = self.transports[side], self._fabric.window
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
        if self in self._fabric.links:
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
        writer, window = self.transports[side], self._fabric.window
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
        if not self.alive:
            self._fabric.closed_link(self)

    def _close(self, side: int, reason: Exception) -> None:
        transport = self.transports[side]
        if transport.connected:
            transport.connected = False
            transport.disconnecting = True
            self.lost_bytes += self._pipes[1 - side].clear()  # nobody left to read it
            self._notify(side, reason)
            if not self.alive:
                self._fabric.closed_link(self)

    def _notify(self, side: int, reason: Exception) -> None:
        transport = self.transports[side]
        if transport.node is None or transport.node.alive:
            transport.protocol.connectionLost(Failure(reason))


def open_link(fabric: Fabric, outbound, out_address, out_node, inbound, in_address, in_node) -> MemoryLink:
    """Join two protocols by a new link on the path between their hosts; both get their transport."""
    link = MemoryLink(fabric, outbound, inbound, fabric.path(out_address.host, in_address.host))
    client = MemoryTransport(link, 0, outbound, out_address, in_address, out_node)
    server = MemoryTransport(link, 1, inbound, in_address, out_address, in_node)
    link.transports = (client, server)
    fabric.links.append(link)
    fabric.opened += 1
    inbound.makeConnection(server)
    outbound.makeConnection(client)
    return link
