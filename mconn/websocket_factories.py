"""The factories of WebSocket connections (mconn.websocket): a listener's, around the
factory above (mconn's, or mconn's TLS), and a dialer's; both take their limits from the
Switch's Config (specs/websocket.md section 4)."""

from __future__ import annotations

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketServerFactory

from mconn.websocket import SUBPROTOCOL, WebSocketClientCarrier, WebSocketServerCarrier, canonical_addresses
from mconn.websocket_common import IUpgradeAdmission


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

    protocol = WebSocketServerCarrier
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

    protocol = WebSocketClientCarrier
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
