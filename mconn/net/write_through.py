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
"""

from __future__ import annotations

from twisted.internet import tcp

#: The transports whose buffer and ``writeSomeData`` this module knows (exact types).
PLAIN_TCP = (tcp.Server, tcp.Client)


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
