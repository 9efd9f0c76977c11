"""The one family of mconn errors.

``MConnError`` is the root. ``LocalProtocolError`` means the caller misused the API;
``RemoteProtocolError`` means the peer misbehaved and its connection is dropped. Every
message names what was wrong and the values involved (specs/wire.md, specs/handshake.md).

Each class says what kind of failure it is in ``kind`` (``error_kind`` reads it from any
exception), so that logs, metrics and telemetry tell a network blip from a peer that
broke the rules (specs/telemetry.md, ``link_failed`` and ``protocol_error``):

* ``LINK``: the path to the peer failed, and nothing says the peer did wrong: nothing
  arrived in time (``PongTimeout``, ``HandshakeTimeout``) or the transport broke under
  mconn's protocol (``ConnectionLost``: a reset, TCP_USER_TIMEOUT, an I/O error, and its
  TLS, WebSocket and proxy forms). Expected now and then on any network; the session
  suspends and resumes.
* ``MISBEHAVIOUR``: the peer sent what the protocol forbids: every other
  ``RemoteProtocolError`` (malformed or oversize packets, unknown channels, impossible
  acks, floods, an incompatible hello, undecodable messages).
* ``OTHER``: everything else: closes on purpose, refusals, session ends, local misuse.
"""

import warnings

#: The values of ``MConnError.kind`` (a fixed set: metrics may use it as a label).
LINK = "link"
MISBEHAVIOUR = "misbehaviour"
OTHER = "other"
KINDS = (LINK, MISBEHAVIOUR, OTHER)


class MConnError(Exception):
    """Base class of every error mconn raises.

    When an error ends a session, ``unconfirmed`` maps each channel id to the number of
    messages accepted for sending whose delivery the peer had not confirmed when the
    session ended (specs/resume.md section 5). Not confirmed is not undelivered: a
    message the peer's reactor got whose acknowledgement was still on its way when the
    connection broke is counted too. Each instance has its own dict, empty until the
    session's end fills it in. ``undelivered`` is its old name, deprecated.

    ``kind`` is ``LINK``, ``MISBEHAVIOUR`` or ``OTHER`` (the module's docstring).
    """

    kind = OTHER

    @property
    def unconfirmed(self) -> dict[int, int]:
        # Made on first use, per instance: a dict on the class would be one dict shared
        # by every error, so filling in one reason's counts would fill in all of them.
        try:
            return self._unconfirmed
        except AttributeError:
            self._unconfirmed: dict[int, int] = {}
            return self._unconfirmed

    @unconfirmed.setter
    def unconfirmed(self, value: dict[int, int]) -> None:
        self._unconfirmed = value

    @property
    def undelivered(self) -> dict[int, int]:
        """Deprecated name of :attr:`unconfirmed` (it counts messages not confirmed delivered)."""
        warn_renamed("MConnError.undelivered", "MConnError.unconfirmed")
        return self.unconfirmed

    @undelivered.setter
    def undelivered(self, value: dict[int, int]) -> None:
        warn_renamed("MConnError.undelivered", "MConnError.unconfirmed")
        self.unconfirmed = value


def warn_renamed(old: str, new: str) -> None:
    """Warn that ``old`` is the deprecated name of ``new`` (the count is of messages
    not confirmed delivered, some of which the peer may have received)."""
    warnings.warn(
        f"{old} is deprecated: it counts messages not confirmed delivered, some of which the peer "
        f"may have received; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


class ProtocolError(MConnError):
    """The MConnection protocol was violated, by one side or the other."""


class LocalProtocolError(ProtocolError):
    """This side misused the API (for example, sent on a closed connection)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; its connection is closed."""

    kind = MISBEHAVIOUR


class MalformedPacket(RemoteProtocolError):
    """A packet's bytes do not follow specs/wire.md."""


class UnknownPacketType(MalformedPacket):
    """A packet type byte that this node does not know and may not skip."""


class PacketTooLarge(MalformedPacket):
    """A declared length exceeds the limit for its packet type."""


class UnexpectedPacket(RemoteProtocolError):
    """A well-formed packet arrived in a state that does not allow it."""


class UnknownChannel(RemoteProtocolError):
    """A msg packet named a channel this node does not have."""


class MessageTooLarge(RemoteProtocolError):
    """A reassembled message grew past the channel's recv_message_capacity."""


class AckError(RemoteProtocolError):
    """An ack or resume count that the sender's own counts make impossible: a channel
    outside the session, more messages than were sent, or a count that went backwards
    (specs/resume.md section 2.3)."""


class HandshakeError(RemoteProtocolError):
    """The handshake failed: an incompatible hello, or none in time.

    A hello whose bytes are malformed is a MalformedPacket, like any other packet.
    """


class HandshakeTimeout(HandshakeError):
    """No hello within handshake_timeout (a link failure: a stalled link looks the same)."""

    kind = LINK


class IncompatiblePeer(HandshakeError):
    """The peer's hello is well-formed but cannot work with ours."""


class PacketPayloadTooSmall(IncompatiblePeer):
    """The peer's hello announces a max_packet_payload below ``config.MIN_PACKET_PAYLOAD``
    (1024): everything sent to it would be cut into packets that small, each costing a
    packet's work (specs/handshake.md section 3). The close code is the class name."""


class RecvRateTooSmall(IncompatiblePeer):
    """The peer's hello announces a receive rate below ``config.MIN_RECV_RATE`` (1000
    bytes per second): what we send it would be held in our queues for that long
    (specs/handshake.md section 7). The close code is the class name."""


class PongTimeout(RemoteProtocolError):
    """Nothing was received within pong_timeout after a ping (a link failure: a frozen
    peer and a dead link look the same)."""

    kind = LINK


class ControlFlood(RemoteProtocolError):
    """The peer sent pings faster than ``max_pings_per_interval`` allows, or let more than
    ``max_control_backlog`` of our answers pile up unread."""


class DecodeError(RemoteProtocolError):
    """A message on a typed channel did not decode with the channel's codec
    (specs/reactor-api.md section 11): the peer sent bytes its channel does not allow."""

    def __init__(self, channel_id: int, codec, size: int, error: Exception) -> None:
        super().__init__(
            f"message of {size} bytes on channel {channel_id:#04x} does not decode with {codec!r}: "
            f"{type(error).__name__}: {error}"
        )
        self.channel_id = channel_id
        self.codec = codec


class PeerRejected(MConnError):
    """The Switch refused a peer (duplicate, self, limits, id mismatch).

    ``reason`` is the close code (specs/wire.md section 3.2): a short stable word
    (``duplicate``, ``self``, ``inbound_limit``...) that telemetry and the close packet carry.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class AuthenticationError(PeerRejected):
    """The address answered but refused our credentials: dialing it again is pointless.

    A dial that fails with it (or with a PeerRejected / PeerClosed whose close code,
    ``reason`` / ``code``, is ``unauthorized``) bans that address from the peer's address pool.
    """

    def __init__(self, message: str) -> None:
        super().__init__("unauthorized", message)


class PeerIdMismatch(PeerRejected):
    """The peer's node id is not the one that was dialed."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(
            "id_mismatch",
            f"dialed node id {expected} but the peer says it is {actual}",
        )
        self.expected = expected
        self.actual = actual


class CertificateMismatch(PeerIdMismatch):
    """The node id of the peer's TLS certificate key is not the one its hello names
    (specs/tls.md section 4)."""

    def __init__(self, certificate_id: str, hello_id: str) -> None:
        PeerRejected.__init__(
            self,
            "id_mismatch",
            f"the peer's TLS certificate key is node {certificate_id} but its hello says it is {hello_id}",
        )
        self.expected = certificate_id
        self.actual = hello_id


class IncompatibleNode(PeerRejected):
    """The peer's node info fails the compatibility rule (specs/handshake.md section 6.2):
    another network (``network_mismatch``), another block protocol version
    (``version_mismatch``), no channel in common (``no_common_channel``), or no node info
    where ours requires it (``node_info_missing``). Dialing it again is pointless."""


class PeerClosed(MConnError):
    """The peer closed the connection on purpose with a close packet."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"peer closed the connection: {code}" + (f" ({text})" if text else ""))
        self.code = code
        self.text = text


class ConnectionLost(MConnError):
    """The transport went away without a close packet (a link failure)."""

    kind = LINK


class WebSocketError(ConnectionLost):
    """The WebSocket layer ended a connection; the message says which rule and values
    (specs/websocket.md section 4)."""


class ProxyError(ConnectionLost):
    """An HTTP proxy did not open the tunnel; the message says which proxy and its answer
    (specs/websocket.md section 6.3)."""


class TLSError(ConnectionLost):
    """The TLS layer failed: the handshake (a certificate refused, a plaintext peer, no
    common version or cipher) or a record. The message says which (specs/tls.md)."""


class ConnectionClosed(MConnError):
    """This side closed the connection (``peer.close`` or the Switch stopping)."""

    def __init__(self, code: str, text: str = "") -> None:
        super().__init__(f"closed by this node: {code}" + (f" ({text})" if text else ""))
        self.code = code
        self.text = text


class ReactorError(ConnectionClosed):
    """This node dropped the peer for an error seen by a reactor: an exception escaped
    its ``add_peer``, its ``receive`` (or the Deferred ``receive`` returned failed) or a
    per-peer routine (``Reactor.spawn``) under ``Config.reactor_errors = "drop"``, or the
    reactor called ``peer.stop_for_error`` (CometBFT's StopPeerForError). The close
    packet's code is ``reactor_error``.

    :param reactor: the reactor's name (``Reactor.name``), or None if not known.
    :param channel_id: the channel the message came on, or None (``add_peer``, a routine).
    :param method: where it escaped: ``add_peer``, ``receive``, ``routine``, or
        ``stop_for_error``.
    :param error: the exception, or any reason given to ``stop_for_error``.
    """

    def __init__(self, reactor: str | None, channel_id: int | None, error, *, method: str = "receive") -> None:
        where = f"reactor {reactor}" if reactor is not None else "a reactor"
        if channel_id is not None:
            where += f" on channel {channel_id:#04x}"
        what = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        super().__init__("reactor_error", f"{where} ({method}) failed: {what}")
        self.reactor = reactor
        self.channel_id = channel_id
        self.method = method
        self.error = error


class SessionExpired(MConnError):
    """A suspended session was not resumed within ``resume_grace``."""

    def __init__(self, grace: float, unconfirmed: dict) -> None:
        super().__init__(
            f"session not resumed within resume_grace {grace}s; not confirmed delivered per channel: "
            + (", ".join(f"{c:#04x}={n}" for c, n in sorted(unconfirmed.items())) or "none")
        )
        self.grace = grace
        self.unconfirmed = dict(unconfirmed)


class SessionRejected(MConnError):
    """A resume was refused (unknown session, channels changed...); a fresh one starts."""

    def __init__(self, reason: str, unconfirmed: dict) -> None:
        super().__init__(
            f"session could not be resumed: {reason}; not confirmed delivered per channel: "
            + (", ".join(f"{c:#04x}={n}" for c, n in sorted(unconfirmed.items())) or "none")
        )
        self.reason = reason
        self.unconfirmed = dict(unconfirmed)


class DialGaveUp(MConnError):
    """Dialing a node ended without a session: ``max_reconnects`` failed attempts, every
    address banned, or the dialing was stopped."""

    def __init__(self, node_id: str | None, reason: str) -> None:
        super().__init__(f"gave up dialing {node_id or 'the peer'}: {reason}")
        self.node_id = node_id
        self.reason = reason


def error_kind(error: BaseException) -> str:
    """``LINK``, ``MISBEHAVIOUR`` or ``OTHER``: what kind of failure ``error`` is (its
    class's ``kind``; ``OTHER`` for an exception that is not an MConnError)."""
    kind = getattr(error, "kind", OTHER) if isinstance(error, MConnError) else OTHER
    return kind if kind in KINDS else OTHER


class DeliveryNotConfirmed(MConnError):
    """``send_confirmed``: the session ended before the peer confirmed the message."""

    def __init__(self, channel_id: int, sequence: int, reason: Exception) -> None:
        super().__init__(f"message {sequence} on channel {channel_id:#04x} not confirmed: the session ended ({reason})")
        self.channel_id = channel_id
        self.sequence = sequence
        self.reason = reason


class StoreError(MConnError):
    """The durable session store (``mconn.switch.session_store``, specs/resume.md section
    8) was misused or failed: a record its own counts make impossible (a negative or
    non-contiguous sequence number, an ack going backwards, an unknown session), or the
    file could not be written. The message names the store's path and the values."""


class StoreOwnedByOtherNode(StoreError):
    """The store file was written by another node key: a node resumes only its own
    sessions, so it refuses another node's store instead of taking it over."""

    def __init__(self, path: str, stored_node_id: str, our_node_id: str) -> None:
        super().__init__(
            f"session store {path} belongs to node {stored_node_id}, not to this node {our_node_id}: "
            "use this node's own store file (or remove it to start without stored sessions)"
        )
        self.path = path
        self.stored_node_id = stored_node_id
        self.our_node_id = our_node_id


class StoreCorrupt(StoreError):
    """The store file is not a session store this node can read: not sqlite, truncated,
    malformed, or holding a value out of range (``why`` names it)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"session store {path} is corrupt: {why}")
        self.path = path
        self.why = why


class StoreFull(StoreError):
    """A message would take the store past its ``max_bytes`` (message bytes plus
    ``MESSAGE_OVERHEAD`` each): nothing was recorded."""

    def __init__(self, path: str, used: int, limit: int, size: int = 0) -> None:
        wanted = f"; a message needing {size} more bytes was refused" if size else ""
        super().__init__(f"session store {path} is full: {used} of {limit} bytes used{wanted}")
        self.path = path
        self.used = used
        self.limit = limit
        self.size = size


class StoreFormatUnsupported(StoreError):
    """The store file was written in a format version this mconn does not read."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"session store {path} has format version {found}; this mconn reads version {supported} only: "
            "remove the file to start without stored sessions"
        )
        self.path = path
        self.found = found
        self.supported = supported
