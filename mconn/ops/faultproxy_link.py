"""The links of the fault proxy (mconn/ops/faultproxy.py): one proxied TCP connection each.

A Link joins two sockets, relays bytes between them and carries the faults that act on a
live connection: reset (RST both ends), black hole, a cut after exactly N bytes, and the
proxy's delay. The FaultProxy that accepts connections and makes links is in
mconn/ops/faultproxy.py; this module knows it only as the ``proxy`` a Link is made with
(its ``clock``, ``target_host``/``target_port``, ``delay``, byte counters and
``link_closed``).

Theory of operation
-------------------
A Link joins two sockets: the accepted one ("client") and the one the proxy dials to the
target ("server"). The client socket is not read until the server socket is connected.
Each direction is a _Pipe ("up" = client -> server, "down" = server -> client) that:

* forwards chunks in arrival order; with a delay set, through a FIFO of (due time, chunk)
  served by one timer for its head, due times never decreasing, so order survives a
  change of delay;
* is registered on its destination transport as a pull producer: Twisted calls its
  ``resumeProducing`` each time the transport's write buffer runs empty. The pipe counts
  the bytes written since then and stops reading its source (``pauseProducing``) while
  that count plus the FIFO reaches MAX_BUFFERED: a slow reader slows the writer through
  the proxy, and the proxy's memory stays bounded. The same count tells a cut when its
  last byte has left the proxy, so the abort does not drop it from the write buffer;
* carries the end of the stream as a marker through the same FIFO, so a close reaches the
  other side after every byte sent before it, delay included.

A FIN from one side half-closes the other (``loseWriteConnection``); when both directions
have ended, both sockets are closed. A reset (RST) of one side resets the other. A
black-holed link ignores all of this: it reads nothing, writes nothing, closes nothing,
until it is reset or the proxy stops.
"""

from __future__ import annotations

import collections
import itertools

from twisted.internet import defer, error, protocol
from twisted.internet.interfaces import IHalfCloseableProtocol, IPullProducer
from twisted.logger import Logger
from zope.interface import implementer

MAX_BUFFERED = 1024 * 1024  # bytes held by the proxy per direction before it stops reading
DIRECTIONS = ("up", "down", "both")
_EOF = object()  # end-of-stream marker in a pipe's FIFO

log = Logger(namespace="mconn.faultproxy")  # one log namespace for the whole proxy
_link_ids = itertools.count(1)


def check_cut(nbytes, direction):
    """Raise ValueError unless ``nbytes`` is a byte count >= 0 and ``direction`` is one
    of DIRECTIONS (the arguments of Link.cut_after and FaultProxy.cut_after)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"cut_after needs a byte count >= 0, got {nbytes!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"cut_after direction must be one of {DIRECTIONS}, got {direction!r}")


@implementer(IHalfCloseableProtocol)
class _Side(protocol.Protocol):
    """One socket of a link; hands every event to the link."""

    def __init__(self, link, name):
        self.link = link
        self.name = name  # "client" or "server"
        self.gone = False  # lost, or never connected

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)
        self.link._side_connected(self)

    def dataReceived(self, data):
        self.link._data_from(self, data)

    def readConnectionLost(self):
        self.link._eof_from(self)

    def writeConnectionLost(self):
        pass

    def connectionLost(self, reason):
        self.gone = True
        self.link._side_lost(self, reason)


@implementer(IPullProducer)
class _Pipe:
    """One direction of a link: what src sends, written to dst in order, maybe late."""

    def __init__(self, link, direction, src, dst):
        self.link = link
        self.direction = direction
        self.src = src
        self.dst = dst
        self.fifo = collections.deque()  # (due time, bytes or _EOF)
        self.queued = 0  # bytes in the FIFO
        self.unflushed = 0  # bytes written to dst since its write buffer was last empty
        self.timer = None
        self.reading = True  # a new transport reads
        self.registered = False
        self.eof_received = False
        self.ended = False  # the end of the stream was delivered (or dst is gone)

    @property
    def drained(self):
        return not self.fifo and self.unflushed == 0

    def may_read(self):
        link = self.link
        return (
            link._forwarding()
            and not self.eof_received
            and not self.dst.gone
            and not (link._cutting and self in link._cut_pipes())
            and self.queued + self.unflushed < MAX_BUFFERED
        )

    def update_reading(self):
        want = self.may_read()
        if want == self.reading or self.src.gone or self.src.transport is None:
            return
        self.reading = want
        if want:
            self.src.transport.resumeProducing()
        else:
            self.src.transport.pauseProducing()

    def push(self, item):
        """Forward bytes or _EOF now, or after the proxy's delay, behind what is queued."""
        clock = self.link._clock
        delay = self.link._proxy.delay
        if not self.fifo and delay <= 0:
            self._deliver(item)
        else:
            due = clock.seconds() + delay
            if self.fifo:
                due = max(due, self.fifo[-1][0])
            self.fifo.append((due, item))
            self.queued += 0 if item is _EOF else len(item)
            if self.timer is None:
                self.timer = clock.callLater(max(0.0, due - clock.seconds()), self._on_timer)
        self.update_reading()

    def _on_timer(self):
        self.timer = None
        now = self.link._clock.seconds()
        for i in range(len(self.fifo)):
            if not self.fifo or (i > 0 and self.fifo[0][0] > now):
                break  # the head (i == 0) is due: the timer was armed for it
            _, item = self.fifo.popleft()
            self.queued -= 0 if item is _EOF else len(item)
            self._deliver(item)
        if self.fifo and self.timer is None:
            delay = max(0.0, self.fifo[0][0] - now)
            self.timer = self.link._clock.callLater(delay, self._on_timer)
        self.update_reading()
        self.link._check_cut_done()

    def _deliver(self, item):
        if item is _EOF:
            self.ended = True
            self.link._pipe_ended(self)
        elif not self.dst.gone:
            self.dst.transport.write(item)
            self.unflushed += len(item)
            self.link._count(self.direction, len(item))

    def register(self):
        self.dst.transport.registerProducer(self, False)
        self.registered = True

    def unregister(self):
        if self.registered:
            self.registered = False
            if not self.dst.gone:
                self.dst.transport.unregisterProducer()

    def cancel(self):
        """Drop what is queued (in flight) and its timer."""
        if self.timer is not None:
            if self.timer.active():
                self.timer.cancel()
            self.timer = None
        self.fifo.clear()
        self.queued = 0

    # IPullProducer, as seen by dst's transport
    def resumeProducing(self):
        """dst's write buffer is empty: everything written has reached the socket."""
        self.unflushed = 0
        self.update_reading()
        self.link._check_cut_done()

    def stopProducing(self):
        pass


class Link:
    """One proxied connection: a client socket, a server socket and a pipe each way.

    ``bytes_up`` / ``bytes_down`` count the bytes forwarded (handed to the destination
    socket); ``closed`` is true once both sockets are gone.
    """

    def __init__(self, proxy, *, blackholed=False, cut=None):
        self.id = next(_link_ids)
        self._proxy = proxy
        self._clock = proxy.clock
        self.client = _Side(self, "client")
        self.server = _Side(self, "server")
        self.up = _Pipe(self, "up", self.client, self.server)
        self.down = _Pipe(self, "down", self.server, self.client)
        self.bytes_up = 0
        self.bytes_down = 0
        self.closed = False
        self._connector = None
        self._connected = False  # the server socket is up and the pipes are registered
        self._blackholed = blackholed
        self._aborted = False
        self._closing = False
        self._cut_left = None
        self._cut_direction = "both"
        self._cutting = False  # the cut budget is spent: abort once the cut pipes drain
        self._close_waiters = []
        if cut is not None:
            self.cut_after(*cut)

    def __repr__(self):
        return f"<Link {self.id} up={self.bytes_up} down={self.bytes_down} closed={self.closed}>"

    # -- faults --

    def reset(self):
        """Abort both sockets (RST), dropping what is in flight. True if it did anything."""
        if self.closed or self._aborted:
            return False
        log.debug("fault proxy: reset link {link_id}", link_id=self.id)
        self._aborted = True
        for pipe in (self.up, self.down):
            pipe.cancel()
        for side in (self.client, self.server):
            if side.transport is not None and not side.gone:
                side.transport.abortConnection()
        if self._connector is not None and self._connector.state == "connecting":
            self._connector.stopConnecting()  # -> _upstream_failed
        self._maybe_closed()
        return True

    def blackhole(self):
        """Forward nothing more, either way, and close nothing: an unplugged cable.

        Chunks held for a delay are dropped and both sockets stop being read, so senders
        see their own buffers fill, as over a dead wire. Bytes already handed to a socket
        before the call may still arrive. There is no way back: a black-holed link stays
        dead until it is reset or the proxy stops.
        """
        if self.closed or self._aborted or self._blackholed:
            return
        log.debug("fault proxy: black hole on link {link_id}", link_id=self.id)
        self._blackholed = True
        for pipe in (self.up, self.down):
            pipe.cancel()
            pipe.update_reading()

    def cut_after(self, nbytes, direction="both"):
        """Abort this link once ``nbytes`` more bytes are forwarded ('up', 'down' or
        'both' = the sum): exactly that many reach the destination socket first."""
        check_cut(nbytes, direction)
        self._cut_left = nbytes
        self._cut_direction = direction
        self._cutting = nbytes == 0
        for pipe in (self.up, self.down):
            pipe.update_reading()
        self._check_cut_done()

    def when_closed(self):
        """A Deferred that fires with this link once both of its sockets are gone."""
        if self.closed:
            return defer.succeed(self)
        d = defer.Deferred()
        self._close_waiters.append(d)
        return d

    # -- events from the sides and pipes --

    def _side_connected(self, side):
        if side is self.client:
            self._pipe_from(side).update_reading()  # not forwarding yet: pause
            if self._blackholed:
                self.server.gone = True  # the SYN is lost on the dead wire
            else:
                factory = _UpstreamFactory(self)
                host, port = self._proxy.target_host, self._proxy.target_port
                self._connector = self._clock.connectTCP(host, port, factory)
            return
        self._connector = None
        self.down.update_reading()  # pause until the pipes are registered
        if self._aborted:
            side.transport.abortConnection()
            return
        if self._blackholed:
            return
        self.up.register()
        self.down.register()
        self._connected = True
        self.up.update_reading()
        self.down.update_reading()
        self._check_cut_done()

    def _upstream_failed(self, reason):
        self._connector = None
        self.server.gone = True
        log.debug(
            "fault proxy: link {link_id} could not reach the target: {reason}", link_id=self.id, reason=reason.value
        )
        if not self.reset():
            self._maybe_closed()

    def _data_from(self, side, data):
        if not self._forwarding():
            return  # read before a fault stopped the reading: lost on the wire
        pipe = self._pipe_from(side)
        if self._cut_left is not None and pipe in self._cut_pipes():
            data = data[: self._cut_left]
            self._cut_left -= len(data)
            self._cutting = self._cut_left == 0
        if data:
            pipe.push(data)
        if self._cutting:
            for cut_pipe in self._cut_pipes():
                cut_pipe.update_reading()
            self._check_cut_done()

    def _eof_from(self, side):
        pipe = self._pipe_from(side)
        if self._forwarding() and not pipe.eof_received:
            pipe.eof_received = True
            pipe.push(_EOF)

    def _pipe_ended(self, pipe):
        pipe.unregister()
        other = self.down if pipe is self.up else self.up
        if other.ended or pipe.src.gone:
            self._close_both()
        else:
            pipe.dst.transport.loseWriteConnection()  # forward the FIN

    def _side_lost(self, side, reason):
        if self._aborted or self._closing or self._blackholed:
            pass  # our own doing, or a dead wire: the other side hears nothing
        elif self._connected and reason.check(error.ConnectionDone):
            self._end_streams_of(side)
        else:
            self.reset()  # an RST (or a loss before the link was up) resets the other side
        self._maybe_closed()

    def _end_streams_of(self, side):
        """``side`` closed cleanly: nothing more reaches it; its stream ends after the
        bytes it sent."""
        into, out = (self.down, self.up) if side is self.client else (self.up, self.down)
        into.cancel()
        into.registered = False
        into.ended = True
        if not out.eof_received:
            out.eof_received = True
            out.push(_EOF)
        elif out.ended:
            self._close_both()

    def _close_both(self):
        self._closing = True
        for pipe in (self.up, self.down):
            pipe.cancel()
            pipe.unregister()
        for side in (self.client, self.server):
            if side.transport is not None and not side.gone:
                side.transport.loseConnection()

    def _check_cut_done(self):
        if self._cutting and self._forwarding() and all(p.drained for p in self._cut_pipes()):
            log.debug("fault proxy: cut link {link_id}", link_id=self.id)
            self.reset()

    def _maybe_closed(self):
        if self.closed or not (self.client.gone and self.server.gone):
            return
        self.closed = True
        for pipe in (self.up, self.down):
            pipe.cancel()
        self._proxy.link_closed(self)
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self)

    # -- helpers --

    def _forwarding(self):
        return self._connected and not (self._blackholed or self._aborted or self._closing)

    def _pipe_from(self, side):
        return self.up if side is self.client else self.down

    def _cut_pipes(self):
        return {"up": (self.up,), "down": (self.down,), "both": (self.up, self.down)}[self._cut_direction]

    def _count(self, direction, n):
        if direction == "up":
            self.bytes_up += n
            self._proxy.bytes_up += n
        else:
            self.bytes_down += n
            self._proxy.bytes_down += n


class _UpstreamFactory(protocol.ClientFactory):
    noisy = False

    def __init__(self, link):
        self.link = link

    def buildProtocol(self, addr):
        return self.link.server

    def clientConnectionFailed(self, connector, reason):
        self.link._upstream_failed(reason)
