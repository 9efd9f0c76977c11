"""The TLS transport of a Switch: the start before TLS, Twisted's TLSMemoryBIOProtocol
around the mconn protocol, and a TLS failure as a TLSError that says what failed
(specs/tls.md). A Switch builds its listening factory with ``tls_server_factory`` and
wraps its dials with ``tls_client_endpoint``; the ``mconn.net.tls.TLSOptions`` they take
hold the contexts and the certificate checks.

Theory of operation
-------------------
The listening factory is a ``TLSMemoryBIOFactory`` around the Switch's protocol factory;
a dial wraps its client endpoint the same way. Each new TLS connection asks the options
for an ``SSL.Connection`` made from the *current* context, so ``reload()`` only swaps the
contexts: connections already up keep theirs, and no peer is dropped. Each connection
carries its own verify callback (``mconn.net.tls.PeerCheck``), which records why a
certificate was refused so the error can say it rather than OpenSSL's "certificate verify
failed".

Before TLS, ``_TLSProtocol`` looks at the first bytes. A listener sees 16 (a ClientHello:
TLS first), 00 (a pre-hello: read exactly its 8 bytes, then hand what follows to TLS) or
anything else (plaintext mconn: refused). An upgrading dialer writes the pre-hello under
its ClientHello and then expects a TLS record (14..18); a plaintext close packet instead is
the listener's refusal, which goes to the mconn protocol as a plaintext close would.

The transport is Twisted's ``TLSMemoryBIOProtocol`` without its small-write aggregation
(the protocol's pump already writes in batches, and data should leave in the turn it was
queued in); on the way in, the records of one network read are handed to the protocol
as one ``dataReceived`` call, as a plaintext read would be (bench/tls_bench.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from OpenSSL import SSL
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import connectionDone
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.config import Config
from mconn.errors import MalformedPacket, PeerRejected, TLSError
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.pre_hello import PRE_HELLO_SIZE, decode_pre_hello, encode_pre_hello
from mconn.net.tls import REQUIRE_CERT, PeerCheck, TLSOptions, is_ip
from mconn.core.wire import PacketType, decode_close, encode_close, encode_extension

#: First byte of every TLS record that opens a connection (a handshake record).
TLS_HANDSHAKE_RECORD = 0x16
#: The close packet a TLS listener answers a plaintext mconn start with (and a pre-hello,
#: when it is ``tls_required``).
TLS_REQUIRED = "tls_required"
#: The close packet a listener answers a pre-hello that is not the 8 bytes of PreHello with.
MALFORMED_PRE_HELLO = "malformed_pre_hello"
#: What an upgrading dialer sends in clear before its ClientHello (specs/tls.md section 7).
PRE_HELLO = encode_pre_hello()
#: TLS record content types (change_cipher_spec, alert, handshake, application_data,
#: heartbeat): the first byte of anything a TLS peer sends.
TLS_RECORD_TYPES = frozenset(range(0x14, 0x19))
#: The largest plaintext refusal an upgrading dialer reads before TLS.
PLAINTEXT_ANSWER_LIMIT = 4096
#: OpenSSL reasons that mean the other side does not speak TLS at all.
_NOT_TLS = ("wrong version number", "packet length too long", "record layer failure", "http request")


# -- what a Switch builds ----------------------------------------------------------------


def tls_server_factory(
    options: TLSOptions, wrapped_factory, *, clock, on_plaintext, close_linger: float = Config().close_linger
):
    """The listening factory: TLS around ``wrapped_factory``.

    :param on_plaintext: ``on_plaintext(protocol, rejection)`` when a connection is
        refused before TLS: plaintext mconn bytes, a pre-hello where ``tls_required``,
        or a malformed pre-hello (``rejection.reason`` says which).
    :param close_linger: how long a close may take to flush before the connection is
        aborted (``Config.close_linger``).
    :raises ValueError: if this node has no certificate to present.
    """
    if options.context_factory is not None:
        creator = options.context_factory
    elif options.server_context is None:
        raise ValueError("a TLS listener needs a certificate: pass cert_file and key_file to TLSOptions.from_files")
    else:
        creator = _ServerCreator(options)
    factory = _TLSFactory(creator, False, wrapped_factory, clock=clock, close_linger=close_linger)
    factory.on_plaintext = on_plaintext
    factory.tls_required = options.tls_required
    return factory


def tls_client_endpoint(
    options: TLSOptions, endpoint, host: str, *, clock, close_linger: float = Config().close_linger
):
    """``endpoint`` with TLS on top; a CA-mode dial checks that the certificate names ``host``.

    :param close_linger: as for ``tls_server_factory``.
    """
    creator = options.context_factory if options.context_factory is not None else _ClientCreator(options, host)
    return _TLSClientEndpoint(endpoint, creator, clock, upgrade=options.upgrade, close_linger=close_linger)


# -- connection creators (the options' current contexts) --------------------------------


@implementer(IOpenSSLServerConnectionCreator)
class _ServerCreator:
    def __init__(self, options: TLSOptions) -> None:
        self.options = options

    def serverConnectionForTLS(self, tls_protocol) -> SSL.Connection:
        context = self.options.server_context
        # Made only for options with a certificate (tls_server_factory), and a reload
        # keeps the node id, so a certificate.
        assert context is not None
        connection = SSL.Connection(context, None)
        tls_protocol.peer_check = check = PeerCheck(by_ca=self.options.mode == "ca")
        connection.set_verify(context.get_verify_mode(), check)
        return connection


@implementer(IOpenSSLClientConnectionCreator)
class _ClientCreator:
    def __init__(self, options: TLSOptions, host: str) -> None:
        self.options = options
        self.host = host

    def clientConnectionForTLS(self, tls_protocol) -> SSL.Connection:
        context = self.options.client_context
        assert context is not None  # only custom options have none, and they bring their own creator
        connection = SSL.Connection(context, None)
        by_ca = self.options.mode == "ca"
        tls_protocol.peer_check = check = PeerCheck(by_ca=by_ca, host=self.host if by_ca else None)
        connection.set_verify(REQUIRE_CERT, check)
        if by_ca and not is_ip(self.host):
            connection.set_tlsext_host_name(self.host.encode("idna"))
        return connection


# -- the TLS transport -------------------------------------------------------------------


class _TLSProtocol(TLSMemoryBIOProtocol):
    """Twisted's TLS transport, plus: the start before TLS (a listener refuses plaintext
    mconn and reads the pre-hello; an upgrading dialer sends it and reads a refusal); a
    TLS failure reaches the mconn protocol as a TLSError that says what failed; and a close
    that the peer does not complete (no handshake, no close_notify) ends in an abort after
    the factory's ``close_linger``, as MConnectionProtocol's own closes do."""

    #: The factory is always ours (it builds this protocol): its policy is read from it.
    factory: _TLSFactory
    #: What carries the TLS records: TCP, a proxy's tunnel or a WebSocket carrier (None
    #: until makeConnection); asked for abortConnection too, which ITransport does not declare.
    transport: Any
    #: Why the connection ends, once known (an OpenSSL error, or a failed start before TLS).
    _reason: Failure | None = None  # type: ignore[assignment]  # Twisted's class leaves it unannotated: plain None
    peer_check: PeerCheck | None = None
    #: Bytes received before TLS started (a pre-hello in parts, a refusal in parts).
    _before = b""
    _tls_started = False
    _refused = False
    _answer: FrameBuffer | None = None
    _linger = None

    def makeConnection(self, transport) -> None:
        if self.factory.is_client and self.factory.upgrade:
            transport.write(PRE_HELLO)  # the only clear bytes; the ClientHello follows at once
        super().makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        if not self._tls_started:
            data = self._before_tls(data)
            if not data:
                return
        # The records of one network read (16 KiB each at most) reach the mconn protocol
        # as one call, as a plaintext read would: its per-call work is not repeated.
        protocol, gathered = self.wrappedProtocol, _Gathered()
        self.wrappedProtocol = gathered  # type: ignore[assignment]  # stands in for dataReceived only, during one call
        try:
            super().dataReceived(data)
        finally:
            self.wrappedProtocol = protocol
        if gathered.parts:
            protocol.dataReceived(b"".join(gathered.parts))

    # -- before TLS (specs/tls.md section 7) -------------------------------------------

    def _before_tls(self, data: bytes) -> bytes:
        """What of ``data`` is TLS, once the start is known; b"" while it is not (or never)."""
        if self._refused or not data:
            return b""
        if self.factory.is_client:
            return self._dialer_before_tls(data)
        data = self._before + data
        first = data[0]
        if first == TLS_HANDSHAKE_RECORD:
            self._tls_started = True
            return data
        if first != PRE_HELLO[0]:
            self._refuse(TLS_REQUIRED, "this node accepts TLS connections only, and the peer started in plaintext")
        elif self.factory.tls_required:
            self._refuse(
                TLS_REQUIRED,
                "this node accepts TLS-first connections only (tls_required), and the peer sent a pre-hello "
                "to start in plaintext and upgrade",
            )
        elif len(data) < PRE_HELLO_SIZE:
            self._before = data  # the rest may come; handshake_timeout bounds the wait
        else:
            try:
                decode_pre_hello(data[:PRE_HELLO_SIZE])
            except MalformedPacket as e:
                self._refuse(MALFORMED_PRE_HELLO, str(e))
                return b""
            self._tls_started, self._before = True, b""
            return data[PRE_HELLO_SIZE:]
        return b""

    def _refuse(self, reason: str, message: str) -> None:
        self._refused = True
        self._before = b""
        rejection = PeerRejected(reason, message)
        assert self.factory.on_plaintext is not None  # only a listener refuses, and tls_server_factory set it
        self.factory.on_plaintext(self.wrappedProtocol, rejection)
        self.transport.write(encode_extension(PacketType.CLOSE, encode_close(reason, str(rejection))))
        self.transport.loseConnection()

    def _dialer_before_tls(self, data: bytes) -> bytes:
        """A TLS-first dialer has nothing to look at; an upgrading one gets TLS records, or a
        plaintext close packet refusing its pre-hello, which goes to the mconn protocol."""
        if not self.factory.upgrade or (self._answer is None and data[0] in TLS_RECORD_TYPES):
            self._tls_started = True
            return data
        if self._answer is None:
            self._answer = FrameBuffer(max_payload=1, default_extension_limit=PLAINTEXT_ANSWER_LIMIT)
        packets, error = self._answer.feed(data)
        if not packets and error is None:
            return b""  # the rest of the refusal may come
        self._refused = True
        refusal, what = _plaintext_refusal(packets[0]) if packets else (None, str(error))
        if refusal is None:
            self._reason = Failure(
                TLSError(
                    f"the listener answered the pre-hello in plaintext ({what}), not with TLS: it does not "
                    "seem to speak TLS (is it listening without TLS?)"
                )
            )
            self.transport.abortConnection()
        else:
            self.wrappedProtocol.dataReceived(refusal)  # as a plaintext dialer reads it
        return b""

    def loseConnection(self) -> None:
        super().loseConnection()
        if self._linger is None and self.connected:
            self._linger = self.factory.clock.callLater(self.factory.close_linger, self.abortConnection)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        error = tls_error_of(reason if self._reason is None else self._reason, self.peer_check)
        if error is not None:
            self._reason = Failure(error)
        super().connectionLost(reason)


class _Gathered:
    """Stands in for the mconn protocol while one network read is decrypted."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.parts.append(data)


def _plaintext_refusal(packet: tuple) -> tuple[bytes | None, str]:
    """(the close packet to hand the mconn protocol, if ``packet`` (a FrameBuffer tuple) is
    a listener's refusal of a pre-hello, else None; what the packet is, for messages)."""
    if packet[0] == PacketType.HELLO:
        return None, "a plaintext mconn hello"
    if packet[0] != PacketType.CLOSE:
        return None, f"packet type {packet[0]:#04x}"
    try:
        code, text = decode_close(packet[1])
    except MalformedPacket as e:
        return None, str(e)
    if code not in (TLS_REQUIRED, MALFORMED_PRE_HELLO):
        return None, f"close {code!r}: {text}"
    return encode_extension(PacketType.CLOSE, packet[1]), f"close {code!r}"


class _TLSFactory(TLSMemoryBIOFactory):
    protocol = _TLSProtocol
    #: ``on_plaintext(protocol, rejection)`` (tls_server_factory), or None on a dialer.
    on_plaintext: Callable[[Any, PeerRejected], object] | None = None
    #: A listener's policy for the pre-hello start; a dialer's choice of it.
    tls_required = True
    upgrade = False

    def __init__(
        self, creator, is_client: bool, wrapped_factory, *, clock, close_linger: float, upgrade: bool = False
    ) -> None:
        super().__init__(creator, is_client, wrapped_factory, clock=clock)
        self.is_client = is_client
        self.clock = clock
        self.close_linger = close_linger
        self.upgrade = upgrade


@implementer(IStreamClientEndpoint)
class _TLSClientEndpoint:
    """A client endpoint with TLS on top; ``connect`` fires with the wrapped protocol."""

    def __init__(self, endpoint, creator, clock, *, close_linger: float, upgrade: bool = False) -> None:
        self._endpoint = endpoint
        self._creator = creator
        self._clock = clock
        self._close_linger = close_linger
        self._upgrade = upgrade

    def connect(self, factory):
        tls_factory = _TLSFactory(
            self._creator, True, factory, clock=self._clock, close_linger=self._close_linger, upgrade=self._upgrade
        )
        return self._endpoint.connect(tls_factory).addCallback(lambda tls_protocol: tls_protocol.wrappedProtocol)


def tls_error_of(reason, check: PeerCheck | None) -> TLSError | None:
    """The TLSError for a connection that ended on an OpenSSL error, else None."""
    if reason is None or not isinstance(reason.value, SSL.Error):
        return None
    if check is not None and check.failure is not None:
        return TLSError(f"TLS handshake failed: {check.failure}")
    reasons = [r[2] for r in reason.value.args[0] if isinstance(r, tuple) and len(r) == 3] if reason.value.args else []
    text = "; ".join(str(r) for r in reasons) or str(reason.value) or type(reason.value).__name__
    hint = ""
    if any(word in text for word in _NOT_TLS):
        hint = " (the peer does not seem to speak TLS: is it listening without TLS?)"
    elif "certificate required" in text:
        hint = " (the peer requires a client certificate and this node presented none)"
    elif "unknown ca" in text or "bad certificate" in text or "certificate expired" in text:
        hint = " (the peer refused this node's certificate)"
    return TLSError(f"TLS failed: {text}{hint}")
