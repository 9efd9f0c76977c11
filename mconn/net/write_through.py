"""Write-through: the first write of a read's handling goes to the socket at once
(specs/connection.md section 7, "Write-through").

Twisted's TCP transport never sends in ``write``: it appends to its buffer, asks the
reactor to watch the socket for writability (an ``epoll_ctl``), and sends in ``doWrite``
once the reactor has returned from the read callback and polled again (an
``epoll_wait``), then stops watching (another ``epoll_ctl``). For a reply to a read (a
request answered, a round trip's next message, a pong, an ack), that is three system
calls and a turn of the event loop between the reply's write and its ``send``, and
everything the callback does after the write delays it too.

While a read is being handled, the protocol's first write therefore goes straight to
the kernel with the transport's own ``writeSomeData`` (the call its ``doWrite`` makes)
when the transport holds nothing, so no byte can overtake an earlier one; what the
kernel does not take, and every later write of the turn, goes through ``write`` as
before. One send per read at most: a loop of sends outside a read (a reactor's timer, a
bulk producer) keeps Twisted's coalescing of a turn's writes into one send. asyncio's
transports send in ``write`` whenever their buffer is empty; this is the same idea,
limited to replies.

Only Twisted's plain TCP transports qualify (``tcp.Server``, ``tcp.Client``), and only
before TLS is started on them: a TLS transport (``TLSMemoryBIOProtocol``) and a
WebSocket one write through their own layers.

Read at accept (``read_now``): a dialer speaks first, so by the time a busy listener
accepts a connection its hello is usually in the socket already. An inbound plain TCP
connection reads once as soon as it is set up, instead of a turn of the event loop
later: the hello is handled there, and the listener's hello and session answer go out
in one write-through send, with no watch for writability and no later read and write
callbacks (bench/history/2026-11-25.md, "read at accept, one timer per clock"). Nothing there yet, an end or an error
are left to the reactor, which finds them as it always does.

Bulk writes (``send_buffers``, ``unsent``). A write that fills the write-ahead's budget
(write_ahead.py) pauses the protocol until the transport has handed it to the kernel;
through Twisted that is a watch for writability, a turn of the loop, a ``send`` of the
whole write and a watch removed, and the write's packets joined into one bytes object
first (a copy of every payload byte). On a link measured faster than such a write per
write-ahead time (loopback, a LAN; ``protocol.burst_size``), when the transport holds
nothing, such a write goes to the kernel at once instead, as the connection's list of buffers in one
``sendmsg`` (no join: the kernel copies from the queued messages); and when the kernel
took it all and holds fewer than ``tcp_notsent_lowat`` bytes unsent (``unsent``: the
``SIOCOUTQNSD`` ioctl, the count the kernel's own writability test compares), the
socket is writable: the protocol goes on as if Twisted had resumed it, up to a bound
per turn of the loop (protocol.py), without the watch and the turn in between.

The protocol asks its transport for that path through ``IDirectWrites``
(``direct_writes``): plain TCP through ``TCPDirect``, this module's functions on
Twisted's transport; a WebSocket carrier over plain TCP provides it itself, framing the
buffers as it sends them (mconn/net/websocket.py). Any other transport has none.
"""

from __future__ import annotations

import errno
import fcntl
import sys

from twisted.internet import tcp
from zope.interface import Interface, implementer

#: The transports whose buffer and ``writeSomeData`` this module knows (exact types).
PLAIN_TCP = (tcp.Server, tcp.Client)
#: What Twisted's ``doWrite`` sets on a transport the first time it sends from its buffer
#: (class attributes of ``FileDescriptor`` until then).
BUFFER_ATTRIBUTES = ("dataBuffer", "offset")


def share_buffer_keys(classes=PLAIN_TCP) -> None:
    """Put ``BUFFER_ATTRIBUTES`` in the attribute keys each class's instances share,
    by setting them (to the class's own values) on one instance made for that.

    CPython (3.11 on) keeps an instance's attributes in an array laid out by keys its
    class shares, and closes those keys once its first instances have used up 30 slots
    (each name added takes one, each instance made one); an instance that then sets a
    name not among them gets a dict of its own, 832 bytes for a TCP transport. Without write-through every
    connection's first write went through ``doWrite``, so the first transports of a
    process put both names there. With write-through and read at accept a listener's
    first connections may never send from Twisted's buffer, and every later one whose
    buffer is used (the stats tick's probe, any send outside a read) built that dict:
    0.8 KiB a peer (bench/RESULTS.md, "Memory per peer"). Done at import, before the
    process has made any: where a class's keys are already closed, the one instance
    made here gets the dict, and nothing else changes."""
    for cls in classes:
        seed = cls.__new__(cls)  # never initialised or used: only its attributes are set
        for name in BUFFER_ATTRIBUTES:
            setattr(seed, name, getattr(cls, name))


share_buffer_keys()


def plain_tcp(transport) -> bool:
    """Whether ``transport`` is Twisted's TCP transport with its buffers as this module
    reads them (``dataBuffer``, ``_tempDataLen``); any other keeps the plain ``write``."""
    return (
        type(transport) in PLAIN_TCP
        and getattr(transport, "TLS", None) is False
        and isinstance(getattr(transport, "dataBuffer", None), bytes)
        and isinstance(getattr(transport, "_tempDataLen", None), int)
    )


def idle(transport) -> bool:
    """Nothing written waits in the transport's buffer, and it is connected and not closing."""
    return (
        transport.connected and not transport.disconnecting and not transport.dataBuffer and not transport._tempDataLen
    )


def write_now(transport, data: bytes) -> int:
    """Hand ``data`` to the kernel now; what it does not take goes to ``transport.write``.

    The transport must be ``idle``. A failed send (the peer reset the connection)
    leaves ``data`` to ``write``: the transport's next send fails the same way and
    closes the connection as it always does. Returns the bytes the kernel took.
    """
    sent = transport.writeSomeData(data)
    if type(sent) is not int:
        sent = 0  # an error: the transport reports it from its own next send
    if sent < len(data):
        transport.write(data[sent:] if sent else data)
    return sent


#: Linux's ioctl for the bytes a TCP socket holds not yet sent (linux/sockios.h); None
#: elsewhere, where ``unsent`` cannot say and bulk writes wait for writability as before.
SIOCOUTQNSD: int | None = 0x894B if sys.platform.startswith("linux") else None
#: A list of more buffers than this is joined into one before ``sendmsg`` (Linux's
#: IOV_MAX is 1024; a bulk write of 64 KiB packets has two a packet).
MAX_BUFFERS = 256
#: The send errors after which nothing was sent and the transport just waits to be
#: writable (Twisted's ``writeSomeData`` returns 0 for them too).
_RETRY_LATER = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})
#: Where ``unsent``'s ioctl writes its answer (an int), read at once: one for every socket.
_ANSWER = bytearray(4)


def send_buffers(transport, buffers: list, size: int) -> int:
    """Hand ``buffers`` (``size`` bytes together) to the kernel now, in one ``sendmsg``;
    what it does not take goes to ``transport.write``, as one bytes object.

    The transport must be ``idle``. As in ``write_now``, a failed send leaves the bytes
    to ``write``, whose next send fails the same way and closes the connection as
    Twisted always does. Returns the bytes the kernel took.
    """
    if len(buffers) > MAX_BUFFERS:
        buffers = [b"".join(buffers)]
    try:
        sent = transport.socket.sendmsg(buffers)
    except OSError as error:
        if error.errno not in _RETRY_LATER:
            transport.write(b"".join(buffers))
            return 0
        sent = 0
    if sent < size:
        transport.write(_rest(buffers, sent))
    return sent


def _rest(buffers: list, sent: int) -> bytes:
    """The bytes of ``buffers`` after the first ``sent``, as one bytes object."""
    for index, buffer in enumerate(buffers):  # bounded: one pass over the list
        length = len(buffer)
        if sent < length:
            head = buffer[sent:] if sent else buffer
            return b"".join([head, *buffers[index + 1 :]])
        sent -= length
    return b""


def unsent(transport) -> int | None:
    """The bytes the kernel holds for ``transport``'s socket not yet sent; None where
    the platform does not say or the socket refuses the question."""
    if SIOCOUTQNSD is None:
        return None
    scratch = _ANSWER
    try:
        fcntl.ioctl(transport.socket.fileno(), SIOCOUTQNSD, scratch, True)
    except (OSError, ValueError):  # ValueError: the socket was closed (fileno -1)
        return None
    return int.from_bytes(scratch, sys.byteorder, signed=True)


def read_now(transport) -> bytes | None:
    """What the peer has sent already, read from the socket of ``transport`` (the
    ``recv`` of its ``doRead``, which Twisted's own read then continues from); None if
    nothing has come yet, or if the socket reports an end or an error: both stay to be
    found, and reported as ever, by the reactor's next read of the socket (an error
    ``recv`` consumed is found as the end of the stream)."""
    try:
        data = transport.socket.recv(transport.bufferSize)
    except OSError:
        return None
    return data or None


class IDirectWrites(Interface):
    """A transport that can hand a bulk write to the kernel at once ("Bulk writes" above)."""

    def idle() -> bool:
        """Nothing written waits above the kernel, and the transport is open: a write
        handed to the kernel now cannot overtake an earlier one."""

    def send_buffers(buffers: list, size: int) -> bool:
        """Hand ``buffers`` (``size`` bytes together, unjoined) to the kernel now, as one
        send; what it does not take waits in the transport, which sends it once the
        socket is writable and then resumes its producer. Only when ``idle``. Returns
        whether the kernel took it all."""

    def unsent() -> int | None:
        """The bytes the kernel holds not yet sent (None: the platform does not say)."""


@implementer(IDirectWrites)
class TCPDirect:
    """``IDirectWrites`` of Twisted's plain TCP transport (``plain_tcp``)."""

    __slots__ = ("transport",)

    def __init__(self, transport) -> None:
        self.transport = transport

    def idle(self) -> bool:
        return idle(self.transport)

    def send_buffers(self, buffers: list, size: int) -> bool:
        return send_buffers(self.transport, buffers, size) == size

    def unsent(self) -> int | None:
        return unsent(self.transport)


def direct_writes(transport) -> IDirectWrites | None:
    """How bulk writes reach the kernel at once through ``transport``: ``TCPDirect`` on
    plain TCP, the transport itself if it provides ``IDirectWrites`` (a WebSocket
    carrier over plain TCP), else None (every write goes through ``write``)."""
    if plain_tcp(transport):
        return TCPDirect(transport)
    return IDirectWrites(transport, None)
