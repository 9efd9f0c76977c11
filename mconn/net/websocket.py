"""The WebSocket transport: mconn's byte stream in binary WebSocket messages (specs/websocket.md).

autobahn (``autobahn.twisted.websocket``) speaks RFC 6455; the classes here stand
between it and the protocol above, which sees an ordinary Twisted transport. What is
above is the mconn protocol, or mconn's TLS around it (``ws://`` on a Switch with TLS
options). Their factories are at the end of this module; mconn.net.websocket_endpoints the endpoints
that use those. One idea, kept in one module: the carrier (its server and client sides,
the measured variant for plain TCP) and the factories that set it up; the upgrade
request's head checks and the client behind a proxy are mconn.net.http_upgrade.

Theory of operation
-------------------
*Bytes in.* Once the connection is open, a ``FrameReader`` (mconn.net.websocket_frames)
takes the binary frames and streams their payloads as they are read; control frames,
and any frame it does not take, go to autobahn, which parses the upgrade, answers pings,
runs the closing handshake and fails every frame that breaks RFC 6455 (its
``onMessageFrameData`` streams payloads the same way while it parses). The payloads of
one network read are given to the protocol above in one ``dataReceived``, as one bytes
object: a listener's reader unmasks the payload bytes of every frame in the read into one
new bytes (one pass with the compiled twin, mconn/net/_wsframe.pyx; two copies and the
XOR in place with the pure reader), however many frames it holds; a dialer's joins the
unmasked parts (one copy at most).
Nothing is reassembled: a message or frame boundary means nothing to mconn's framing
(specs/websocket.md section 3). What autobahn itself holds is bounded: the
HTTP upgrade (at most ``MAX_UPGRADE_BYTES``, within ``Config.ws_handshake_timeout``), a
frame header (14 bytes), a control frame (125 bytes). A text message, a message or frame
over ``Config.ws_max_message_bytes``, a compressed frame (no extension is ever
negotiated), pings past ``Config.max_pings_per_interval`` per ``ping_interval``, and
every RFC 6455 violation end only that connection, with a ``WebSocketError`` that says
which rule and values, as the reason the protocol above sees.

*Bytes out.* ``write`` frames the data as one binary message (split at
``SEND_MESSAGE_BYTES``; a client masks it, as RFC 6455 requires, as its frames are built:
headers and masked payload written in one pass into one new bytes by the compiled twin,
in place in a bytearray by the pure builder) and writes it straight to the transport beneath, in one
``write`` however many frames it took; autobahn's own send queue is used only for its chopped writes,
which are never asked for. Backpressure flows through: ``registerProducer`` registers the
protocol above as the producer of the transport beneath, so a full TCP buffer pauses
mconn's scheduler directly, and the WebSocket layer holds no bytes of its own. Pausing
reading is passed down the same way. On Twisted's own TCP (ws://, no TLS) the first write
of a read's handling goes to the kernel at once when nothing waits in the TCP
transport's buffer (write-through, as over TCP: mconn.net.write_through), and the carrier
also passes that transport's ``producerPaused`` flag through (``_MeasuredCarrier``), so
the protocol above measures the link and sizes its packets as over plain TCP.

*Ends.* ``loseConnection`` starts the closing handshake (code 1000), ``abortConnection``
drops the transport beneath. The protocol above learns of the end once the transport
beneath is gone, with the recorded ``WebSocketError`` if the WebSocket layer failed it.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from autobahn.twisted.websocket import (
    WebSocketAdapterProtocol,
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet import defer
from twisted.internet.abstract import FileDescriptor
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IProtocol, IPushProducer, ITransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.config import MAX_HTTP_HEAD_BYTES
from mconn.errors import ConnectionLost, WebSocketError
from mconn.net.tls_transport import tls_error_of
from mconn.net.http_upgrade import (
    canonical_addresses,
    forwarded_ip,
    head_problem,
    http_refusal,
    is_trusted_proxy,
    refusal_status,
)
from mconn.net.owner import IUpgradeAdmission
from mconn.net.websocket_frames import FrameReader, frames_of, mask_keys, parts_frames_of, reader_type
from mconn.net.write_through import IDirectWrites, idle, plain_tcp, send_buffers, unsent, write_now

log = Logger(namespace="mconn.websocket")

#: The WebSocket subprotocol a dialer asks for; a listener accepts a client that asks for
#: none too (specs/websocket.md section 2).
SUBPROTOCOL = "mconn"
#: Largest HTTP upgrade request (or response) read before its end: nginx's default header
#: buffers are 8 KiB; a node's own upgrade is a few hundred bytes.
MAX_UPGRADE_BYTES = MAX_HTTP_HEAD_BYTES
#: Largest message this side sends: the protocol above writes at most
#: ``Config.write_batch_bytes`` (64 KiB) at a time; a larger write becomes several messages.
SEND_MESSAGE_BYTES = 65536
#: RFC 6455 close code "normal closure": the closing handshake of loseConnection.
_NORMAL_CLOSE = 1000
_OPEN = WebSocketProtocol.STATE_OPEN
_CONNECTING = WebSocketProtocol.STATE_CONNECTING
_CLOSED = WebSocketProtocol.STATE_CLOSED
_CLOSING = WebSocketProtocol.STATE_CLOSING
#: The states in which the FrameReader reads (once closing, frames may still be on the way).
_READING = (_OPEN, _CLOSING)


if TYPE_CHECKING:
    # What _Carrier is mixed into, for the type checker only: autobahn's Twisted adapter
    # and its WebSocket protocol (at run time each carrier names its autobahn class itself).
    class _Autobahn(WebSocketAdapterProtocol, WebSocketProtocol):  # type: ignore[misc]  # autobahn's two bases disagree on peer and _transport_details
        pass
else:
    _Autobahn = object


@implementer(ITransport, IPushProducer)
class _Carrier(_Autobahn):
    """What the WebSocket protocols add to autobahn's: the transport of the protocol above.

    Mixed in before an autobahn protocol class; ``wrapped`` is the protocol above, built
    by the factory at connect time and connected once the upgrade succeeds.
    """

    #: Our factory: the carrier's limits, clock and options (None until buildProtocol).
    factory: WebSocketServerCarrierFactory | WebSocketClientCarrierFactory
    #: What carries the WebSocket: TCP, or TLS with wss (None until makeConnection); asked
    #: for abortConnection, getHandle and the producer methods, which ITransport does not declare.
    transport: Any
    #: ws_handshake_timeout, copied from the factory's options by autobahn at connect.
    openHandshakeTimeout: float
    wrapped: IProtocol | None = None
    #: Why the WebSocket layer failed the connection (a WebSocketError), once it did.
    error: WebSocketError | None = None
    #: Frame payloads of the network read being parsed.
    _gathered: list[bytes] | None = None
    #: Reads the data frames once the connection is open (mconn.net.websocket_frames).
    _reader: FrameReader | None = None
    _opened = False
    _lost = False
    _pings = 0
    _ping_window = 0.0
    #: Twisted's plain TCP beneath (ws://; set in onOpen): the first write of the protocol
    #: above while a read is handled goes to the kernel at once (``write``).
    _through_ok = False
    #: Set while a read is handled, until its first write.
    _through = False

    # -- bytes in -----------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._lost:
            return
        self._through = self._through_ok
        try:
            self._read(data)
        finally:
            self._through = False

    def _read(self, data: bytes) -> None:
        reader = self._reader
        if reader is not None and self.state in _READING and self.current_frame is None and not self.data:
            self._read_fast(reader, data)
            return
        if self.state == _CONNECTING and not self.data and data[:1] and not data[:1].isalpha():
            hint = "a tcp:// mconn dialer at a ws listener?" if self.factory.isServer else "a tcp mconn listener?"
            self._refuse_upgrade(f"not HTTP: the first byte is {data[0]:#04x} ({hint})", 400)
            return
        if self.state == _CONNECTING and len(self.data) + len(data) > MAX_UPGRADE_BYTES:
            if (self.data + data).find(b"\r\n\r\n", 0, MAX_UPGRADE_BYTES + 4) < 0:
                self._refuse_upgrade(f"the HTTP upgrade is over {MAX_UPGRADE_BYTES} bytes", 431)
                return
        self._deliver(self._read_slow(data))

    def _read_slow(self, data: bytes) -> list[bytes]:
        """autobahn parses ``data``; the payloads of its data frames, in order."""
        gathered: list[bytes] = []
        self._gathered = gathered
        try:
            super().dataReceived(data)
        finally:
            self._gathered = None
        return gathered

    def _read_fast(self, reader: FrameReader, data: bytes) -> None:
        """The data frames by the FrameReader; whatever else, by autobahn (websocket_frames.py)."""
        payloads: list[bytes] = []
        for _ in range(len(data) + 1):  # each turn consumes at least one frame
            got, stop, data = reader.read(data)
            payloads += got
            if stop is None:
                break
            kind, detail = stop
            self._deliver(payloads)  # what came before the stop goes first (a close, say)
            payloads = []
            if kind == "control":
                self._deliver(self._read_slow(detail))
            elif kind == "handoff":
                self._deliver(self._read_slow(data))
                return
            elif kind == "too_large":
                self._max_message_size_exceeded(
                    detail[0],
                    detail[1],
                    f"received WebSocket message size {detail[0]} exceeds payload limit of {detail[1]} octets",
                )
                return
            else:
                self._fail_connection(WebSocketProtocol.CLOSE_STATUS_CODE_PROTOCOL_ERROR, detail)
                return
            if self._lost or self.state == _CLOSED:
                return
        self._deliver(payloads)

    def _deliver(self, payloads: list[bytes]) -> None:
        if payloads and self.wrapped is not None and not self._lost and not self.failedByMe:
            self.wrapped.dataReceived(payloads[0] if len(payloads) == 1 else b"".join(payloads))

    def onMessageBegin(self, isBinary: bool) -> None:
        self.message_data_total_length = 0
        if not isBinary:
            self._fail_connection(
                WebSocketProtocol.CLOSE_STATUS_CODE_UNSUPPORTED_DATA,
                "a text message: mconn uses binary WebSocket messages only",
            )

    def onMessageFrameData(self, payload) -> None:
        if not self.failedByMe and self._gathered is not None:
            self._gathered.append(payload)

    def onMessageFrameEnd(self) -> None:
        # Nothing was kept: frame boundaries mean nothing here.
        self.frame_data = None  # type: ignore[assignment]  # autobahn types it a list, and sets None itself once a frame ends

    def onMessageEnd(self) -> None:
        self.message_data = None  # type: ignore[assignment]  # autobahn types it a list, and sets None itself once a message ends

    def onPing(self, payload: bytes) -> None:
        """Pings are answered (autobahn sends the pong) but bounded in number."""
        config = self.factory.config
        now = self.factory.clock.seconds()
        if now - self._ping_window > config.ping_interval:
            self._ping_window, self._pings = now, 0
        self._pings += 1
        if self._pings > config.max_pings_per_interval:
            self._fail_connection(
                WebSocketProtocol.CLOSE_STATUS_CODE_POLICY_VIOLATION,
                f"{self._pings} WebSocket pings within {config.ping_interval} s; at most "
                f"{config.max_pings_per_interval} are answered",
            )
        else:
            super().onPing(payload)

    # -- failures -----------------------------------------------------------------

    def _fail_connection(self, code: int = 1001, reason: str = "going away") -> None:
        """Every WebSocket failure after the upgrade: record it, send a close frame saying
        it (best effort), and drop the transport once that is flushed."""
        if self.state == _CLOSED:
            return
        self._note(f"WebSocket close {code}: {reason}")
        self.failedByMe = True
        self.wasClean = False
        self.wasNotCleanReason = reason  # what autobahn's warning on the drop names
        if self.state == _OPEN:
            self.sendCloseFrame(code=code, reasonUtf8=reason.encode("ascii", "replace")[:123], isReply=False)
        self.dropConnection(abort=False)

    def onOpenHandshakeTimeout(self) -> None:
        self._note(f"no WebSocket upgrade within ws_handshake_timeout ({self.openHandshakeTimeout} s)")
        super().onOpenHandshakeTimeout()

    def _note(self, message: str) -> None:
        if self.error is None:
            self.error = WebSocketError(f"{message} ({self._peer_text()})")
            log.info("{error}", error=str(self.error))

    def _peer_text(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        return f"peer {getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    # -- the protocol above ---------------------------------------------------------

    def onOpen(self) -> None:
        self._opened = True
        self._reader = reader_type(masked=self.factory.isServer, max_message=self.factory.config.ws_max_message_bytes)
        assert self.wrapped is not None  # built with the carrier by its factory
        measured = _MEASURED.get(type(self))
        if measured is not None and isinstance(self.transport, FileDescriptor):
            # Twisted's own TCP beneath (ws://, not wss:// nor a test's transport): the
            # protocol above may measure the link through us (``_MeasuredCarrier``),
            # which it decides from our class as it connects, just below.
            self.__class__ = measured
            self._through_ok = plain_tcp(self.transport)
        self.wrapped.makeConnection(self)

    def onClose(self, wasClean, code, reason) -> None:
        """autobahn's report of the end; the protocol above hears of it in connectionLost."""

    def connectionLost(self, reason=None) -> None:
        if self._lost:
            return
        self._lost = True
        super().connectionLost(reason)
        why = self._reason(reason)
        if self._opened:
            assert self.wrapped is not None  # connected in onOpen
            self.wrapped.connectionLost(why)
        self._not_opened(why)

    def _reason(self, reason) -> Failure:
        if self.error is not None:
            return Failure(self.error)
        if reason is not None and isinstance(reason.value, ConnectionLost):
            return reason  # a TLSError of mconn's TLS beneath says what failed
        tls_error = tls_error_of(reason, None)  # the TLS of a wss dial to a TLS-terminating proxy
        if tls_error is not None:
            return Failure(tls_error)
        text = reason.getErrorMessage() if reason is not None else "closed"
        return Failure(ConnectionLost(f"connection lost: {text}"))

    def _not_opened(self, why: Failure) -> None:
        """A client's hook: the upgrade failed (its connect Deferred fails)."""

    def _refuse_upgrade(self, why: str, code: int) -> None:
        """Each side's answer to a start that cannot be a WebSocket upgrade (``why``; a
        listener answers with HTTP status ``code``)."""
        raise NotImplementedError

    @property
    def websocket_scheme(self) -> str:
        """``ws`` or ``wss`` (mconn.net.websocket_endpoints.transport_kind asks)."""
        return "wss" if self.factory.isSecure else "ws"

    # -- ITransport for the protocol above --------------------------------------------

    def write(self, data: bytes) -> None:
        if self.state != _OPEN:
            return  # closing: nothing more goes out (the close packet went before)
        frames = frames_of(data, limit=SEND_MESSAGE_BYTES, keys=None if self.factory.isServer else mask_keys)
        if self._through:
            # Write-through, as over TCP (mconn.net.write_through): the first write of a
            # read's handling (a reply, an ack) is sent now when nothing waits in the TCP
            # transport's buffer, not after a watch for writability and a turn of the loop.
            self._through = False  # one send a read at most
            if idle(self.transport):
                write_now(self.transport, frames)
                return
        self.transport.write(frames)

    def writeSequence(self, parts) -> None:
        self.write(b"".join(parts))

    def loseConnection(self) -> None:
        """Start the closing handshake (code 1000); autobahn drops the transport once it
        is done, or at its closeHandshakeTimeout. A second call while it runs (TLS above
        calls once to send its close_notify and again when the peer's arrives) changes
        nothing: dropping now would cut the handshake short and make autobahn warn
        ``dropping connection ... abort=False`` on every clean close."""
        if self.state == _OPEN:
            self.sendClose(_NORMAL_CLOSE)
        elif self.state not in (_CLOSED, _CLOSING):  # the upgrade has not finished
            self.wasNotCleanReason = "closed by this side before the WebSocket upgrade finished"
            self.dropConnection(abort=False)

    def abortConnection(self) -> None:
        self.transport.abortConnection()

    def getPeer(self):
        forwarded = getattr(self, "_forwarded_peer", None)
        return forwarded if forwarded is not None else self.transport.getPeer()

    def getHost(self):
        return self.transport.getHost()

    def getHandle(self):
        """The handle beneath: the socket, or with wss the TLS connection (whose
        certificate proves the peer's node id, specs/tls.md)."""
        return self.transport.getHandle()

    def setTcpNoDelay(self, enabled: bool) -> None:
        setter = getattr(self.transport, "setTcpNoDelay", None)
        if setter is not None:
            setter(enabled)

    # -- IConsumer and IPushProducer: both pass through to the transport beneath -------

    def registerProducer(self, producer, streaming) -> None:
        self.transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        if self.transport is not None:
            self.transport.unregisterProducer()

    def pauseProducing(self) -> None:
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self.transport.stopProducing()


class WebSocketServerCarrier(_Carrier, WebSocketServerProtocol):  # type: ignore[misc]  # autobahn's bases disagree on peer and _transport_details
    """A listener's WebSocket connection (specs/websocket.md section 2).

    Admitted at TCP accept by the owner of the connections above (``IUpgradeAdmission``,
    the factory's ``admission``), as the pending handshake of ``above``, the mconn
    protocol it will carry; a connection from a trusted proxy is counted by the client
    its upgrade names once the upgrade is read (specs/websocket.md section 4).
    """

    factory: WebSocketServerCarrierFactory
    #: The mconn protocol this connection will carry (the factory sets it).
    above: IProtocol | None = None
    #: The owner that admitted this connection at accept, or None.
    _admission: IUpgradeAdmission | None = None

    def connectionMade(self) -> None:
        factory = self.factory
        admission = factory.admission
        if admission is not None:
            peer = self.transport.getPeer()
            host = getattr(peer, "host", None)
            proxied = is_trusted_proxy(host, factory.trusted_proxies)
            refusal = admission.admit_upgrade(
                self.above, None if proxied else host, f"{host}:{getattr(peer, 'port', '')}", self._give_way
            )
            if refusal is not None:
                self._lost = True  # refused before anything: nothing above ever starts
                log.info("WebSocket connection from {peer} refused: {why}", peer=str(peer), why=str(refusal))
                self.transport.write(http_refusal(refusal))
                self.transport.loseConnection()
                return
            self._admission = admission
        super().connectionMade()

    def _give_way(self, rejection) -> None:
        """A newcomer evicted this pending upgrade: answer and drop it."""
        if self.state == _CONNECTING:
            self.failHandshake(f"{rejection.reason}: {rejection}", refusal_status(rejection.reason))
        else:
            self._note(f"{rejection.reason}: {rejection}")
            self.transport.abortConnection()

    def processHandshake(self):
        """The head is checked byte by byte before autobahn parses it (``head_problem``):
        its parser also splits lines at 0x85 and other line breaks of Unicode, so a byte
        that a proxy passes on inside a header's value could make a header of its own."""
        end = self.data.find(b"\r\n\r\n")
        if end >= 0:
            problem = head_problem(self.data[: end + 4])
            if problem is not None:
                return self.failHandshake(problem, 400)
        return super().processHandshake()

    def onConnect(self, request):
        factory = self.factory
        if request.path != factory.path:
            self._note(f"upgrade for path {request.path!r}; this listener's path is {factory.path!r}")
            raise ConnectionDeny(ConnectionDeny.NOT_FOUND, f"no mconn endpoint at {request.path!r}")
        allowed = factory.config.ws_allowed_origins
        origin = request.headers.get("origin")
        if origin is not None and not any(fnmatch.fnmatchcase(origin.lower(), p.lower()) for p in allowed):
            because = "" if allowed else " (ws_allowed_origins is empty: nodes send no Origin)"
            self._note(f"upgrade from origin {origin!r}, which ws_allowed_origins does not allow")
            raise ConnectionDeny(ConnectionDeny.FORBIDDEN, f"origin {origin!r} is not allowed{because}")
        tcp_peer = self.transport.getPeer()
        if is_trusted_proxy(getattr(tcp_peer, "host", None), factory.trusted_proxies):
            self._forwarded_peer = self._forwarded(request.headers.get("x-forwarded-for"))
            if self._admission is not None:
                refusal = self._admission.upgrade_addressed(self.above, self.getPeer().host)
                if refusal is not None:
                    self._note(f"{refusal.reason}: {refusal}")
                    raise ConnectionDeny(refusal_status(refusal.reason), f"{refusal.reason}: {refusal}")
        return SUBPROTOCOL if SUBPROTOCOL in request.protocols else None

    def _forwarded(self, header: str | None):
        """The client a trusted proxy names, as an address (port 0), or None (no header:
        the proxy itself is the peer). The head holds one X-Forwarded-For line at most
        (``head_problem``); its last hop is what the proxy wrote."""
        if header is None:
            return None
        try:
            ip = forwarded_ip(header)
        except ValueError as e:
            self._note(str(e))
            raise ConnectionDeny(ConnectionDeny.BAD_REQUEST, str(e)) from None
        return IPv6Address("TCP", str(ip), 0) if ip.version == 6 else IPv4Address("TCP", str(ip), 0)

    def failHandshake(self, reason: str, code: int = 400, responseHeaders=None):
        self._refuse_noted(f"bad HTTP upgrade ({code}): {reason}")
        super().failHandshake(reason, code, responseHeaders)

    def _refuse_upgrade(self, why: str, code: int) -> None:
        self.failHandshake(why, code)

    def _refuse_noted(self, message: str) -> None:
        self._note(message)

    def connectionLost(self, reason=None) -> None:
        if self._admission is not None:
            self._admission.upgrade_gone(self.above)  # nothing if the protocol above connected
        super().connectionLost(reason)


class WebSocketClientCarrier(_Carrier, WebSocketClientProtocol):  # type: ignore[misc]  # autobahn's bases disagree on peer and _transport_details
    """A dialer's WebSocket connection; ``opened`` fires with the protocol above once
    the upgrade succeeded, or fails with a WebSocketError saying why it did not."""

    factory: WebSocketClientCarrierFactory

    def __init__(self) -> None:
        super().__init__()
        self.opened: defer.Deferred[IProtocol | None] = defer.Deferred()

    def onConnect(self, response) -> None:
        if response.protocol not in (SUBPROTOCOL, None, ""):
            self._fail_connection(
                WebSocketProtocol.CLOSE_STATUS_CODE_PROTOCOL_ERROR,
                f"the listener chose subprotocol {response.protocol!r}; mconn asked for {SUBPROTOCOL!r}",
            )

    def failHandshake(self, reason):
        self._note(f"the listener refused the WebSocket upgrade: {reason}")
        super().failHandshake(reason)

    def _refuse_upgrade(self, why: str, code: int) -> None:
        self._note(f"the listener's answer to the upgrade: {why}")
        self.dropConnection(abort=True)

    def onOpen(self) -> None:
        super().onOpen()
        if not self.opened.called:
            self.opened.callback(self.wrapped)

    def _not_opened(self, why: Failure) -> None:
        if not self.opened.called:
            if type(why.value) is ConnectionLost:  # nothing more specific (a TLSError) is known
                why = Failure(
                    WebSocketError(f"the connection ended before the WebSocket upgrade: {why.getErrorMessage()}")
                )
            self.opened.errback(why)


@implementer(IDirectWrites)
class _MeasuredCarrier:
    """What a carrier on Twisted's own TCP transport adds: the part of a FileDescriptor's
    producer contract that the protocol above uses to measure the link (its write-ahead,
    mconn.net.write_ahead, which sizes its packets by the measured rate: 64 KiB packets on
    loopback instead of the 16 KiB of an unmeasured link); and, on plain TCP, bulk writes
    straight to the kernel (``IDirectWrites``, mconn.net.write_through "Bulk writes"):
    the protocol above hands a write that fills its write-ahead to ``send_buffers`` as its
    packets' buffers, unjoined, which frames them (a dialer masks them) in one pass into
    one bytes object and sends it in one ``sendmsg`` when the TCP transport holds nothing.

    The protocol above is the producer of the TCP transport beneath (``registerProducer``
    passes through), and every ``write`` here is one ``write`` there; so its "pause until
    everything written is handed to the kernel" is the transport beneath's: setting
    ``producerPaused`` sets that transport's flag, and the transport resumes the protocol
    above once its buffer is empty, as it would with no WebSocket between them. The bytes
    it counts are mconn's, the frame headers left out (2 to 14 bytes in 64 KiB).
    """

    transport: Any
    state: int
    _through_ok: bool
    factory: Any

    def idle(self) -> bool:
        """Open, on plain TCP, and nothing waits in the TCP transport's buffer (autobahn's
        own frames, a pong or a close, go there too: a bulk write never overtakes them)."""
        return self._through_ok and self.state == _OPEN and idle(self.transport)

    def send_buffers(self, buffers: list, size: int) -> bool:
        """The frames of ``buffers`` (``size`` bytes; binary messages of at most
        ``SEND_MESSAGE_BYTES``, a dialer's masked) to the kernel now; what it does not
        take waits in the TCP transport. Whether it took them all."""
        frames = parts_frames_of(buffers, limit=SEND_MESSAGE_BYTES, keys=None if self.factory.isServer else mask_keys)
        return send_buffers(self.transport, [frames], len(frames)) == len(frames)

    def unsent(self) -> int | None:
        return unsent(self.transport)

    @property
    def producerPaused(self) -> bool:
        return bool(self.transport.producerPaused)

    @producerPaused.setter
    def producerPaused(self, paused: bool) -> None:
        transport = self.transport
        if paused and self._through_ok and idle(transport):
            # A write went through whole (``write``): Twisted holds nothing to send, so it
            # would never resume the protocol above; an empty send once the socket is
            # writable does, as after a drain (what the protocol does over TCP).
            transport.startWriting()
        transport.producerPaused = paused

    @property
    def disconnecting(self) -> bool:
        """Closing: the WebSocket's closing handshake started, or the TCP beneath is closing."""
        return self.state != _OPEN or bool(self.transport.disconnecting)


class _MeasuredServerCarrier(_MeasuredCarrier, WebSocketServerCarrier):  # type: ignore[misc]  # autobahn's bases, as WebSocketServerCarrier
    pass


class _MeasuredClientCarrier(_MeasuredCarrier, WebSocketClientCarrier):  # type: ignore[misc]  # autobahn's bases, as WebSocketClientCarrier
    pass


#: The class a carrier becomes once open on Twisted's own TCP transport (``onOpen``).
_MEASURED: dict[type, type] = {
    WebSocketServerCarrier: _MeasuredServerCarrier,
    WebSocketClientCarrier: _MeasuredClientCarrier,
}


# -- the factories: a listener's, around the factory above (mconn's, or mconn's TLS), and a
# dialer's; both take their limits from the Switch's Config (specs/websocket.md section 4).


def _set_options(factory, config) -> None:
    factory.setProtocolOptions(
        maxFramePayloadSize=config.ws_max_message_bytes,
        maxMessagePayloadSize=config.ws_max_message_bytes,
        openHandshakeTimeout=config.ws_handshake_timeout,
        closeHandshakeTimeout=config.close_linger,
        autoPingInterval=0,  # mconn's own pings keep the link alive (specs/connection.md 3)
        failByDrop=False,
        utf8validateIncoming=False,
        tcpNoDelay=config.tcp_nodelay,
    )


class WebSocketServerCarrierFactory(WebSocketServerFactory):
    """Wraps the factory above (mconn's, or mconn's TLS): one WebSocket connection per
    TCP connection, upgraded at ``path``."""

    protocol = WebSocketServerCarrier  # type: ignore[assignment]  # Factory.protocol's type wants any Factory as the protocol's factory; a carrier's is this class
    noisy = False

    def __init__(self, wrapped_factory, *, path: str, secure: bool, config, clock) -> None:
        scheme = "wss" if secure else "ws"
        super().__init__(url=f"{scheme}://localhost{path}", protocols=[SUBPROTOCOL], reactor=clock)
        self.wrapped_factory = wrapped_factory
        self.path = path
        self.config = config
        self.clock = clock
        #: Who admits a connection at accept (the Switch's ConnectionSet), or None.
        self.admission = _admission_of(wrapped_factory)
        #: Config.ws_trusted_proxies, each address in its canonical form.
        self.trusted_proxies = canonical_addresses(config.ws_trusted_proxies)
        _set_options(self, config)
        # Origins are checked in onConnect against Config.ws_allowed_origins (autobahn's own
        # check is a browser's same-origin rule, which a node's listener has no use for).
        self.setProtocolOptions(webStatus=False, requireMaskedClientFrames=True)

    def buildProtocol(self, addr):
        carrier = super().buildProtocol(addr)
        carrier.wrapped = self.wrapped_factory.buildProtocol(addr)
        carrier.above = _innermost(carrier.wrapped)
        return carrier

    def startFactory(self) -> None:
        self.wrapped_factory.doStart()
        super().startFactory()

    def stopFactory(self) -> None:
        self.wrapped_factory.doStop()
        super().stopFactory()


class WebSocketClientCarrierFactory(WebSocketClientFactory):
    """A dialer's factory: upgrades at ``url`` (its host and port name the Host header)."""

    protocol = WebSocketClientCarrier  # type: ignore[assignment]  # Factory.protocol's type wants any Factory as the protocol's factory; a carrier's is this class
    noisy = False

    def __init__(self, wrapped_factory, *, url: str, config, clock) -> None:
        super().__init__(url=url, protocols=[SUBPROTOCOL], reactor=clock)
        self.wrapped_factory = wrapped_factory
        self.config = config
        self.clock = clock
        _set_options(self, config)

    def buildProtocol(self, addr):
        carrier = super().buildProtocol(addr)
        carrier.wrapped = self.wrapped_factory.buildProtocol(addr)
        return carrier


def _admission_of(factory):
    """The ``IUpgradeAdmission`` of the owner of ``factory``'s connections (through a TLS
    factory), or None: the protocol above is admitted once upgraded, by its own owner."""
    for _ in range(4):
        owner = IUpgradeAdmission(getattr(factory, "owner", None), None)
        if owner is not None:
            return owner
        factory = getattr(factory, "wrappedFactory", None)
    return None


def _innermost(protocol):
    """The mconn protocol at the top of ``protocol`` (mconn's TLS wraps it in ws+tls)."""
    for _ in range(4):
        inner = getattr(protocol, "wrappedProtocol", None)
        if inner is None:
            return protocol
        protocol = inner
    return protocol
