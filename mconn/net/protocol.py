"""The Twisted adapter: a thin Protocol around the sans-I/O Connection.

One class, ``MConnectionProtocol``, with its small factory: it is long because it is
the one place where a transport's bytes, pauses and timers meet the core; its parts
(write-ahead, write-through, timers, socket options) already live in modules of their own.

As Twisted's HTTP/2 protocol wraps h2, this module only moves bytes, events and time
between the transport and ``mconn.core.connection.Connection``; every decision about the
connection's peer is its owner's (``IConnectionOwner``, provided for a Switch by
``mconn.switch.connection_set.ConnectionSet``), and its per-connection facts come in one frozen
``ConnectionContext``.

``dataReceived`` hands bytes to the core and dispatches the events it returns (and
pumps only when the read left something to send: a bulk read delivers and returns);
``pump`` writes what the core has to send until the transport pauses us (we are the
transport's IPushProducer, so a slow peer stops the scheduler instead of growing a
buffer); one timer (``mconn.net.timers``) follows ``core.next_deadline()``. Data reaches
the transport in the same reactor turn it was queued in (no flush timer); on plain TCP
the first write of a read's handling goes to the kernel at once, and an accepted
connection reads what its dialer already sent as it is set up (``mconn.net.write_through``).

The write-ahead (``mconn.net.write_ahead``, specs/connection.md section 7): ``pump`` pauses
itself once its writes since Twisted last resumed it reach ``Config.write_ahead_time``
at the link's measured drain rate, so that Twisted resumes it only once the kernel has
taken them: what waits below the scheduler stays within ``tcp_notsent_lowat`` and two writes.
On plain TCP, or a WebSocket carrier over it (``IDirectWrites``), over a link measured
fast (``burst_size``) a write that fills it goes to the kernel at once in one ``sendmsg``,
and while the kernel drains what it is given the pump goes on without waiting for a turn
of the event loop, up to ``DIRECT_TURN_BYTES`` (write_through.py, "Bulk writes").

One class, one module, past 500 lines: the adapter's duties (bytes, events, time,
backpressure, the owner's decisions) share the protocol's state, and a mixin carved out
to meet a line count would only hide which attributes they share.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, cast

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.core.admission import limit_key
from mconn.core.connection import Connection, State, close_packet
from mconn.errors import ConnectionLost, PeerClosed, PeerRejected, RemoteProtocolError, UnexpectedPacket
from mconn.core.wire import Hello
from mconn.core.events import (
    AckReceived,
    CloseReceived,
    ConnectionFailed,
    HelloReceived,
    MessageReceived,
    PongReceived,
    SessionAnswered,
)
from mconn.net.owner import ConnectionContext, IConnectionOwner
from mconn.core.packet_size import payload_for_rate
from mconn.net.socket_options import bytes_acked, set_socket_options, socket_of
from mconn.net.timers import timers_of
from mconn.net.write_ahead import WriteAhead
from mconn.net.write_through import IDirectWrites, direct_writes, idle, plain_tcp, read_now, write_now

log = Logger(namespace="mconn")
#: The states the per-message path tests, as module constants (``State.OPEN`` is a
#: descriptor call on Python 3.11).
_OPEN, _CLOSING, _CLOSED = State.OPEN, State.CLOSING, State.CLOSED

#: Bytes of bulk writes the pump sends on, the kernel draining them, before it waits for
#: the transport to resume it in a later turn of the event loop (``_drained_now``): at
#: loopback's rates a few hundred microseconds, so timers and reads are not held up long.
DIRECT_TURN_BYTES = 1 << 20
#: The most one bulk write straight to the kernel carries, where the write-ahead's
#: measured rate drains it within ``write_ahead_time`` (``burst_size``): four of Twisted's
#: 64 KiB buffers, in one ``sendmsg``.
BURST_BYTES = 256 * 1024

#: A timer that fires this much later than due means the event loop stalled: the
#: keepalive verdict waits one loop turn so that bytes already received are read first.
LOOP_STALL = 0.05


@implementer(IPushProducer)
class MConnectionProtocol(Protocol):
    """One connection of a Switch. ``peer`` is set once the handshake is accepted."""

    #: Rarely set (a stall, a close): class defaults, as CPython builds a dict per connection past ~30 attributes.
    _after_stall, _linger = False, None
    #: Bulk bytes sent on since the transport last resumed us (``_drained_now``).
    _direct_bytes = 0
    #: Reading is paced (``Config.recv_rate`` set; rarely): set per connection only then.
    _recv_limited = False

    #: What carries the bytes: TCP, mconn's TLS, a WebSocket carrier or a test's
    #: StringTransport (None until makeConnection). Beyond ITransport it is asked for
    #: abortConnection, the producer methods and, on TCP, a FileDescriptor's attributes
    #: (``connected``, ``startWriting``, ``producerPaused``), which no one interface declares.
    transport: Any

    def __init__(self, owner, context: ConnectionContext) -> None:
        self.owner = owner
        self.context = context
        self.core: Connection | None = None
        #: The Peer whose session this connection carries, once decided (``carry``): an
        #: ``ICarriedSession`` that is also given ``round_trip`` (a Switch's Peer, of a layer above).
        self.peer: Any = None
        self.hello: Hello | None = None
        self.session_request = None  #: ours (outbound connections), sent in our hello
        self.remote_address = ""
        #: The key this inbound connection counts against (set once admitted): its remote
        #: host's ``limit_key``, an IPv4 address or an IPv6 /64.
        self.ip_key: str | None = None
        #: Why the connection ended, once known (an mconn error instance).
        self.end_reason: Exception | None = None
        self._clock = owner.clock
        self._config = owner.config
        self.started = self._clock.seconds()
        self._paused = False
        #: Reading stopped because the peer's messages for busy reactors passed
        #: ``Config.reactor_backlog_bytes`` or ``reactor_backlog_messages`` (PeerDelivery._hold in
        #: mconn/switch/peer_delivery.py; specs/reactor-api.md 4.1).
        self._backlogged = False
        #: Sizes the writes while ``_pause_after_write`` (set in connectionMade).
        self._ahead = WriteAhead(owner.config.write_ahead_time or 1.0, owner.config.write_batch_bytes)
        self._pause_after_write = False
        #: The TCP socket beneath the transport, asked for its acknowledged bytes (or None).
        self._socket: socket.socket | None = None
        #: Plain TCP; a read is handled and its first write may go through (write_through.py).
        self._through_ok = self._through = False
        #: How a bulk write reaches the kernel at once (write_through.py), or None.
        self._direct: IDirectWrites | None = None
        #: Sending is paced (``Connection.send_pace``): our send_rate, or from the peer's
        #: hello on, the lower recv_rate it announced.
        self._rate_limited = owner.config.send_rate is not None
        if owner.config.recv_rate is not None:
            self._recv_limited = True
        #: Our entry in the clock's Timers while one is armed (mconn/net/timers.py).
        self._timer: list[Any] | None = None
        self._timer_due = 0.0
        #: Called with this protocol when bytes arrive (a duplicate probe waits), or None.
        self._on_bytes: Callable[[MConnectionProtocol], object] | None = None
        #: Events received while a decision is pending (an asynchronous authorize), or None.
        self._held: list[object] | None = None

    #: The handshake's Deferred once asked for, and its outcome once known (the Peer,
    #: or why it failed): an inbound one is rarely waited on, so none is made unless asked.
    _handshake: Deferred[Any] | None = None
    _outcome: object = None

    @property
    def handshake(self) -> Deferred:
        """Fires with the Peer once the handshake is accepted, or fails with why not."""
        if self._handshake is None:
            self._handshake = Deferred()
            if not self.context.is_outbound:
                self._handshake.addErrback(_ignore)  # nobody waits on inbound ones
            if self._outcome is not None:
                self._fire(self._outcome)
        return self._handshake

    handshake_ended = property(lambda self: self._outcome is not None, doc="Whether the handshake ended, either way.")

    def end_handshake(self, outcome) -> None:
        """The handshake ended with ``outcome``, the Peer or an exception (only the first counts)."""
        if self._outcome is None:
            self._outcome = outcome
            if self._handshake is not None:
                self._fire(outcome)

    def _fire(self, outcome) -> None:
        assert self._handshake is not None  # made by ``handshake`` before any call
        (self._handshake.errback if isinstance(outcome, BaseException) else self._handshake.callback)(outcome)

    #: The context's facts, read through the protocol.
    is_outbound = property(lambda self: self.context.is_outbound)
    expected_node_id = property(lambda self: self.context.expected_node_id)
    resuming = property(lambda self: self.context.resuming)
    address = property(lambda self: self.context.address)

    # -- what the owner may do ----------------------------------------------------

    def carry(self, peer) -> None:
        """Carry ``peer``'s session from now on (None: none any more)."""
        self.peer = peer

    def abort(self, reason: Exception) -> None:
        """Drop the transport at once, without a close packet, for ``reason``."""
        self.end_reason = reason
        self.transport.abortConnection()

    def ended_beneath(self, reason: Exception) -> None:
        """A layer beneath (TLS) refused the connection for ``reason`` before mconn began."""
        self.end_reason = reason

    def probe(self) -> float:
        """Ping the peer now, unless a ping is out, and arm the timer for its pong
        deadline (a probe of the stats tick or of a duplicate connection); returns
        the time the probe counts from (``Connection.probe``)."""
        assert self.core is not None  # the owner probes connections it was handed in connection_made
        since = self.core.probe(self._clock.seconds())
        self.pump()
        self._rearm()
        return since

    def watch_bytes(self, callback) -> None:
        """Call ``callback(self)`` whenever bytes arrive (None: stop)."""
        self._on_bytes = callback

    def watching(self, callback) -> bool:
        return self._on_bytes == callback

    # -- Protocol ----------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.remote_address = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        host = getattr(peer, "host", None)
        refusal = self.owner.admit(self, host)
        if refusal is not None:  # refused before a Connection was built (specs/connection.md section 6)
            self.end_reason = refusal
            self.transport.write(close_packet(refusal.reason, str(refusal)))
            self.transport.loseConnection()
            return
        if not self.context.is_outbound:  # released by this key, whatever the transport says later;
            # Admission.key_of: an IPv4 address, an IPv6 /64 (specs/connection.md section 6)
            self.ip_key = limit_key(host, self._config.ip_limit_prefix_v4, self._config.ip_limit_prefix_v6)
        core: Connection
        core, self.session_request = self.owner.new_core(self, self._clock.seconds())
        self.core = core
        set_socket_options(self.transport, self._config)
        # Twisted's TCP transport (a FileDescriptor) pauses its producer past bufferSize
        # and resumes it once its buffer is empty; we pause it after every write that
        # fills the write-ahead instead.
        # Asked of the class: a TLS wrapper forwards unknown attributes to the TCP
        # transport beneath it, whose producer is not us.
        self._pause_after_write = self._config.write_ahead_time is not None and hasattr(
            type(self.transport), "producerPaused"
        )
        self._socket = socket_of(self.transport) if self._pause_after_write else None
        self._through_ok = plain_tcp(self.transport)
        self._direct = direct_writes(self.transport) if self._pause_after_write else None
        # Packets of the unmeasured size until the write-ahead has measured the link.
        core.set_packet_payload(payload_for_rate(None, self._config.write_ahead_time))
        self.transport.registerProducer(self, True)
        self.owner.connection_made(self)
        if not (self._through_ok and not self.context.is_outbound and self._read_at_accept()):
            self.pump()
            self._rearm()

    def _read_at_accept(self) -> bool:
        """Read what the dialer sent before we accepted it, now (write_through.py); whether
        it had sent anything. An exception is logged and drops the connection, as in the
        reactor's own read."""
        data = read_now(self.transport)
        if data is None:
            return False
        try:
            self.dataReceived(data)
        except Exception:
            log.failure("reading {address} failed", address=self.remote_address)
            self.transport.abortConnection()
        return True

    def dataReceived(self, data: bytes) -> None:
        if self._on_bytes is not None:
            self._on_bytes(self)
        core = self.core
        if core is None:
            return  # refused in connectionMade: nothing is read until the transport closes
        now = self._clock.seconds()
        handlers = _HANDLERS
        self._through = self._through_ok
        events = core.receive_data(data, now)
        i, n = 0, len(events)
        while i < n:  # bounded: each turn handles one event at least, or a run of messages
            event = events[i]
            if self.end_reason is not None and type(event) is not ConnectionFailed:
                i += 1
                continue  # we are closing: nothing more reaches the reactors
            if type(event) is MessageReceived and self.peer is not None:  # the hot path
                if i + 1 < n and type(events[i + 1]) is MessageReceived:
                    # A run of messages from here, in one loop of the Peer's receiving side;
                    # it stops at another event, or once we close or carry another session.
                    i = max(self.peer.deliver_run(self, events, i), i + 1)
                    continue
                self.peer.deliver(event.channel_id, event.message)  # one alone: no loop to set up
            elif self._held is not None and type(event) is not ConnectionFailed:
                self._held.append(event)  # after the pending decision (decide)
            else:
                handlers[type(event)](self, event)
            i += 1
        if core.state is not _OPEN or core.wants_to_send():
            # A pong, a close, a handshake step: something to write. A read that queued
            # nothing skips the pump (a send queues through Peer, which pumps itself).
            self.pump()
        self._through = False
        if self._timer is None or self._timer_due > now + self._config.ping_interval or self._rate_limited:
            # A read only moves the keepalive deadline later (to now + ping_interval):
            # a timer due before that fires early, finds nothing due and re-arms.
            self._rearm()
        if self._recv_limited:
            ready = core.receive_ready_at(now)
            if ready > now and self.transport is not None and core.state is _OPEN:
                self.transport.pauseProducing()
                self._clock.callLater(ready - now, self._resume_reading)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.core is None:
            return  # refused in connectionMade: the Switch never took it on
        self._paused = True
        self._cancel_timer()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        if self.end_reason is None:
            error = reason.value  # the TLS layer says what failed with an mconn TLSError
            self.end_reason = (
                error
                if isinstance(error, ConnectionLost)
                else ConnectionLost(f"connection lost: {reason.getErrorMessage()}")
            )
        self.core.transport_lost()
        self.owner.connection_lost(self, self.end_reason)

    # -- IPushProducer -------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._pause_after_write:
            if self._direct_bytes:  # a class default until a bulk write: set only then (a late name)
                self._direct_bytes = 0  # a turn of the loop came between: a new bound
            self._drained()
        self.pump(room_only=True)

    def _bytes_acked(self) -> int | None:
        return None if self._socket is None else bytes_acked(self._socket)

    def stopProducing(self) -> None:
        self._paused = True

    def _resume_reading(self) -> None:
        assert self.core is not None  # reading is held only on a connection with a core
        if self.transport is not None and self.core.state is State.OPEN and self._held is None and not self._backlogged:
            self.transport.resumeProducing()

    def stop_reading(self) -> None:
        """Read nothing more until ``resume_reading``: busy reactors hold too much of
        this peer's messages (TCP's window then slows the peer down)."""
        if not self._backlogged and self.transport is not None:
            self._backlogged = True
            self.transport.pauseProducing()

    def resume_reading(self) -> None:
        """The busy reactors' backlog drained: read again (unless the receive rate limit
        or a pending decision holds reading, which resume it themselves)."""
        if self._backlogged:
            assert self.core is not None  # only a connection with a core was stopped
            self._backlogged = False
            if self.core.receive_ready_at(self._clock.seconds()) <= self._clock.seconds():
                self._resume_reading()

    # -- sending -------------------------------------------------------------------

    def send_ack(self, delivered: dict[int, int]) -> None:
        """Acknowledge ``delivered`` (per channel, how many messages the reactors have,
        cumulatively; specs/resume.md section 2.3) and write it: an ack still unsent is
        replaced by this one."""
        core = self.core
        assert core is not None, "an ack on a connection refused before it had a core"
        core.send_ack(delivered)
        self.pump()

    def pump(self, room_only: bool = False) -> None:
        """Write what the core has to send until it has nothing or the transport is full.

        Sends waiting for room are then offered it; with ``room_only`` (the transport's
        resume, which changes nothing else) only if a write took a message off a queue:
        every other change that makes room (an ack, a new session) pumps without it.
        """
        core = self.core
        assert core is not None  # a refused connection (no core) is never pumped
        if self._paused and core.state is _OPEN:
            # Nothing can be written (most sends of a fast sender come here, between the
            # transport's resumes): no write took a message, so only a change that made
            # room by itself (an ack; not ``room_only``) offers it to waiting sends.
            if not room_only and self.peer is not None:
                self.peer.room_made()
            if core.state is _CLOSING or core.state is _CLOSED:
                self._disconnect()  # a waiting send's callback closed the connection
            elif self._rate_limited:
                self._rearm()
            return
        transport = self.transport
        write = self._write_first if self._through else transport.write
        now = self._clock.seconds()
        ahead = self._ahead if self._pause_after_write else None
        budget = None
        taken = core.messages_taken if room_only else -1
        while True:
            while not self._paused or core.state is not _OPEN:
                # Once closing, only the close packet is left, and it goes out even when paused.
                direct = False
                if ahead is not None:
                    budget = ahead.budget()
                    if self._direct is not None and core.state is _OPEN:
                        # On a link measured faster than a write per write-ahead time, and
                        # while the transport holds nothing: straight to the kernel, up to
                        # ``burst_size`` (write_through.py, "Bulk writes"). ``budget`` is
                        # what is left of ``size`` (a write that reaches it pauses); what
                        # is left of the burst is as much larger.
                        extra = burst_size(ahead) - ahead.size
                        if extra > 0 and self._direct.idle():
                            direct = True
                            budget += extra
                buffers = core.buffers_to_send(now, budget)
                if not buffers:
                    break
                if ahead is None or core.state is not _OPEN:
                    write(b"".join(buffers))
                else:
                    size = sum(map(len, buffers))
                    full = core.more_to_send
                    if direct and (full or size >= ahead.size):
                        if self._send_bulk(buffers, size, full):
                            continue  # the kernel drains it: on, as if resumed
                    else:
                        write(b"".join(buffers))
                        if ahead.wrote(size, full):
                            self._wait_until_written()
                if not core.more_to_send:
                    break  # everything that could go out now went out
            # Sends waiting for room take the room just made, and go out too.
            # (Without ``room_only`` every pass offers it, and the property is not read.)
            moved = self.peer is not None and (taken < 0 or taken != core.messages_taken) and self.peer.room_made()
            if not moved or self._paused:
                break
        if core.state is _CLOSING or core.state is _CLOSED:
            self._disconnect()
        elif self._rate_limited:
            self._rearm()  # the pace may have left data for later

    def _write_first(self, data: bytes) -> None:
        """The pump's write while a read is handled: the first goes through."""
        transport = self.transport
        if self._through and idle(transport):
            write_now(transport, data)
        else:
            transport.write(data)
        self._through = False

    def _send_bulk(self, buffers: list, size: int, full: bool) -> bool:
        """A write that fills the write-ahead (``size`` bytes; ``full``: it used its whole
        budget), to the kernel now, unjoined (write_through.py, "Bulk writes"). Returns
        whether the pump may go on at once (``_drained_now``); otherwise it has paused
        until the transport has handed everything to the kernel."""
        assert self._direct is not None  # the pump sends bulk writes only with a direct path
        whole = self._direct.send_buffers(buffers, size)
        self._ahead.wrote(size, full)
        if whole and self._drained_now(size):
            return True
        self._wait_until_written()
        return False

    def _drained_now(self, size: int) -> bool:
        """After a bulk write of ``size`` bytes the kernel took whole: whether the socket is writable
        already (fewer than ``tcp_notsent_lowat`` bytes unsent), so that the pump may go
        on as if the transport had resumed it; at most ``DIRECT_TURN_BYTES`` of writes
        between two resumes by the transport, so the event loop still gets its turns."""
        lowat = self._config.tcp_notsent_lowat
        self._direct_bytes += size
        if lowat is None or self._direct_bytes >= DIRECT_TURN_BYTES:
            return False
        assert self._direct is not None  # only after a bulk write straight to the kernel
        queued = self._direct.unsent()
        if queued is None or queued >= lowat:
            return False
        self._drained()
        return True

    def _drained(self) -> None:
        """The kernel took everything written: a measure of the link (write_ahead.py)."""
        ahead = self._ahead
        if ahead.resumed(self._clock.seconds(), self._bytes_acked):
            assert self.core is not None  # only a connection with a core writes
            # Packets follow the measured rate (mconn/core/packet_size.py).
            self.core.set_packet_payload(payload_for_rate(ahead.rate, self._config.write_ahead_time))

    def _wait_until_written(self) -> None:
        """Pause until the transport has handed everything written to the kernel (it
        resumes us then, as after its own pause past ``bufferSize``)."""
        transport = self.transport
        if not self._paused and transport.connected and not transport.disconnecting:
            if self._through_ok and idle(transport):
                # All went through: an empty send once writable resumes us, as a drain would.
                transport.startWriting()
            transport.producerPaused = True
            self.pauseProducing()

    def close(self, reason: Exception) -> None:
        """Close on purpose: a close packet naming ``reason``, then disconnect."""
        if self.end_reason is None:
            self.end_reason = reason
        if isinstance(reason, RemoteProtocolError):
            code = type(reason).__name__  # specs/wire.md section 3.2
        else:
            # mconn's errors name their close code in ``code`` or ``reason``, a str.
            code = cast(str, getattr(reason, "code", None) or getattr(reason, "reason", "closed"))
        text = getattr(reason, "text", None)
        assert self.core is not None  # the owner closes connections it was handed in connection_made
        self.core.close(code, str(reason) if text is None else text)
        self.pump()

    def _disconnect(self) -> None:
        if self._linger is None:
            # Done producing: a TLS transport closes only once its producer is gone.
            self.transport.unregisterProducer()
            self.transport.loseConnection()
            self._linger = self._clock.callLater(self._config.close_linger, self.transport.abortConnection)

    # -- timers --------------------------------------------------------------------

    def _rearm(self) -> None:
        """Follow the core's next deadline (one entry in the clock's ``Timers``)."""
        assert self.core is not None  # timers run only on a connection with a core
        deadline = self.core.next_deadline(sending=not self._paused)
        if self._timer is not None:
            if deadline is not None and self._timer_due <= deadline:
                return  # it fires early, finds nothing due, and re-arms
            self._cancel_timer()
        if deadline is not None:
            self._timer_due = deadline
            self._timer = timers_of(self._clock).arm(deadline, self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            timers_of(self._clock).cancel(self._timer)
            self._timer = None

    def _on_timer(self, fired_at: float) -> None:
        """The timer's deadline came; ``fired_at`` is when the clock's Timers began the
        run that ran it, so the timers run before this one in it do not count as the
        loop's lateness (mconn/net/timers.py)."""
        now = self._clock.seconds()
        late = fired_at - self._timer_due
        assert self.core is not None  # timers run only on a connection with a core
        if late > LOOP_STALL and not self._after_stall and self.core.overdue(now):
            # The event loop itself stalled (a reactor blocked it): the peer's answer may
            # be sitting unread in the socket. One turn of the loop reads it before the
            # keepalive verdict, so our stall does not make a healthy peer look dead. A
            # ping due is no verdict: it goes out now, however late.
            self._after_stall = True
            self.owner.loop_stalled(self, late)
            self._timer_due = now
            self._timer = timers_of(self._clock).arm(now, self)  # the next turn
            return
        if self._after_stall:
            # Set only after a stall: an instance attribute set on every run would be a
            # 29th name, and past the one spare key it builds a dict per connection
            # (bench/RESULTS.md, "Memory per peer").
            self._after_stall = False
        for event in self.core.handle_timeout(now):
            _HANDLERS[type(event)](self, event)
        # A keepalive ping is one byte alone in its turn: it goes to the socket at once
        # (write-through), not by a watch for writability and a send in the next turn
        # (specs/connection.md section 7). A paced sender's timer keeps the coalescing.
        self._through = self._through_ok and not self._rate_limited
        self.pump()
        self._through = False
        self._rearm()

    # -- events --------------------------------------------------------------------

    def _on_hello(self, event: HelloReceived) -> None:
        self.hello = event.hello
        assert self.core is not None  # events come from the core
        self._rate_limited = self.core.send_pace is not None
        self.decide(self.owner.hello_received, event)

    def _on_session(self, event: SessionAnswered) -> None:
        assert self.core is not None  # events come from the core
        if self.core.state is not State.OPEN:
            return  # a close or an error came in the same read: nothing can be resumed on it
        self.decide(self.owner.session_answered, event.answer)

    def _handle(self, event) -> None:
        _HANDLERS[type(event)](self, event)

    def _on_message(self, event: MessageReceived) -> None:
        if self.peer is None:
            self.fail(
                UnexpectedPacket(f"msg packet on channel {event.channel_id:#04x} before the session was established")
            )
            return
        self.peer.deliver(event.channel_id, event.message)

    def _on_ack(self, event: AckReceived) -> None:
        if self.peer is None:
            self.fail(UnexpectedPacket("ack packet before the session was established"))
            return
        try:
            self.peer.acknowledged(event.delivered)
        except RemoteProtocolError as error:
            self.fail(error)

    def fail(self, error: RemoteProtocolError) -> None:
        """The peer broke the protocol above the core (sessions, acks): drop it."""
        if self.end_reason is None:
            self.owner.protocol_error(self, error)
        self.close(error)

    def _on_pong(self, event: PongReceived) -> None:
        if self.peer is not None:
            self.peer.round_trip = event.round_trip
        # The wait for the pong is over: the timer armed at its deadline (pong_timeout
        # after the ping) would fire for nothing and re-arm; re-arm it now instead, at
        # ping_interval after this read (specs/connection.md section 3).
        self._cancel_timer()
        self._rearm()

    def _on_close(self, event: CloseReceived) -> None:
        self.end_reason = PeerClosed(event.code, event.text)
        self._disconnect()

    def _on_failed(self, event: ConnectionFailed) -> None:
        self.end_reason = event.error
        self.owner.protocol_error(self, event.error)

    # -- the owner's decisions ---------------------------------------------------------
    # A decision (the hello's: who the peer is, whether it may join; the session
    # answer's) is the owner's (``IConnectionOwner``). One that returns a Deferred, an
    # asynchronous ``authorize``, is pending: reading stops and the events that follow
    # are held, then go on in order once it is made, or are dropped if it refuses the
    # peer (specs/connection.md).

    def decide(self, decision, argument) -> None:
        """Run ``decision(self, argument)``, a decision of the owner; a refusal closes it.

        A decision that returns a Deferred (an asynchronous ``authorize``) is pending: the
        events that follow are held, and reading stops, until it fires.
        """
        try:
            pending = decision(self, argument)
        except (PeerRejected, RemoteProtocolError) as error:
            self._refuse(error)
            return
        if isinstance(pending, Deferred):
            self._held = []
            self.transport.pauseProducing()
            pending.addCallbacks(self._decided, self._decision_failed)

    def _refuse(self, error) -> None:
        if isinstance(error, PeerRejected):
            self.owner.peer_rejected(self, self.hello, error)
            self.close(error)
        else:
            self.fail(error)

    def _decision_failed(self, failure) -> None:
        """The pending decision refused the peer: the held events are dropped."""
        self._held = None
        if not failure.check(PeerRejected, RemoteProtocolError):
            log.failure("a decision about {address} failed", failure, address=self.remote_address)
            failure = Failure(PeerRejected("internal_error", f"deciding failed: {failure.getErrorMessage()}"))
        if self.end_reason is None and self.transport is not None:
            self._refuse(failure.value)

    def _decided(self, _) -> None:
        """The pending decision is made: the held events go on, in order."""
        held, self._held = self._held or [], None
        if self.end_reason is not None or self.transport is None:
            return
        if not self._backlogged:
            self.transport.resumeProducing()
        for index, event in enumerate(held):
            if self._held is not None:  # an event started another pending decision
                self._held.extend(held[index:])
                break
            if self.end_reason is None or type(event) is ConnectionFailed:
                self._handle(event)
        self.pump()
        self._rearm()


def burst_size(ahead: WriteAhead) -> int:
    """The write-ahead's size for a bulk write straight to the kernel: what the measured
    rate drains in ``write_ahead_time``, at most BURST_BYTES (or ``write_batch_bytes``
    when larger), at least the transport's ``size``; ``size`` until a rate is measured.
    Only where it is larger than ``size`` (a link that drains more than
    ``write_batch_bytes`` in ``write_ahead_time``) do bulk writes go straight to the kernel:
    on slower links every write keeps the path through Twisted's buffer."""
    if ahead.rate is None:
        return ahead.size
    return max(ahead.size, min(max(ahead.batch, BURST_BYTES), int(ahead.rate * ahead.ahead_time)))


def _ignore(failure) -> None:
    """An inbound connection's failed handshake: nobody waits on it (one function for all)."""


#: Event type -> its handler, one table for every connection (a dict of bound methods per
#: connection cost eight objects and ~700 bytes each, and the collector's time in a storm).
_HANDLERS: dict[type, Callable[[MConnectionProtocol, Any], None]] = {
    HelloReceived: MConnectionProtocol._on_hello,
    MessageReceived: MConnectionProtocol._on_message,
    PongReceived: MConnectionProtocol._on_pong,
    CloseReceived: MConnectionProtocol._on_close,
    ConnectionFailed: MConnectionProtocol._on_failed,
    AckReceived: MConnectionProtocol._on_ack,
    SessionAnswered: MConnectionProtocol._on_session,
}


class MConnectionFactory(Factory):
    """Builds the protocols of one owner (a Switch, or an ``IConnectionOwner``), all
    with the same context."""

    #: No "Starting factory <... at 0x...>" line per listen and per dial.
    noisy = False

    def __init__(
        self, owner, *, is_outbound: bool, expected_node_id: str | None = None, resuming=None, address=None
    ) -> None:
        self.owner = IConnectionOwner(owner)
        self.context = ConnectionContext(
            is_outbound=is_outbound, expected_node_id=expected_node_id, resuming=resuming, address=address
        )

    def buildProtocol(self, addr):
        return MConnectionProtocol(self.owner, self.context)
