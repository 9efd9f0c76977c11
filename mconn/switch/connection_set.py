"""The live connections of a Switch, and the owner every connection talks to.

``ConnectionSet`` provides ``mconn.net.protocol.IConnectionOwner``: it admits inbound
connections (``mconn.core.admission``), builds each connection's core and hello, checks who
the peer is (its hello's node id, with TLS its certificate) and whether it may join
(``mconn.switch.authorize``), then hands the session decisions to ``mconn.switch.session_manager``. It logs
what happens to the transports (connection_made, handshake_done, connection_lost,
connection_refused, peer_rejected, protocol_error, loop_stalled; specs/telemetry.md).
A listener's WebSocket connection is admitted earlier, at TCP accept
(``IUpgradeAdmission``, specs/websocket.md section 4): its pending upgrade is counted
as the pending handshake of the mconn protocol it will carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.internet import defer
from zope.interface import implementer

from mconn.switch import telemetry
from mconn.core.connection import Connection
from mconn.errors import LINK, PeerIdMismatch, PeerRejected, error_kind
from mconn.core.handshake import make_hello
from mconn.core.node_info import check_compatible, node_info_of
from mconn.net.owner import IConnectionOwner
from mconn.net.owner import IUpgradeAdmission
from mconn.net.websocket_endpoints import transport_kind
from mconn.core.wire import Hello, HelloTag, encode_session_request

if TYPE_CHECKING:
    from mconn.switch.session_manager import SessionManager


@implementer(IConnectionOwner, IUpgradeAdmission)
class ConnectionSet:
    """Every live connection of one Switch, handshaking or not.

    :param listen_address: returns the address our hellos announce.
    :param sessions: the ``SessionManager`` (set once it exists).
    """

    def __init__(
        self, *, node_id, clock, config, channels, tls, admission, authorizer, listen_address, node_info=None
    ) -> None:
        self.node_id = node_id
        #: Our NodeInfo (``mconn.core.node_info``), announced in every hello, or None.
        self.node_info = node_info
        self.clock = clock
        self.config = config
        self.channels = channels
        self.tls = tls
        self.admission = admission
        self.authorizer = authorizer
        self.listen_address = listen_address
        self.sessions: SessionManager | None = None
        #: Every live connection (the protocols), handshaking or not.
        self.live: set = set()
        #: The live outbound ones (few: a simultaneous-dial check scans only these).
        self._outbound: set = set()
        #: protocol -> the Deferreds of close_all waiting for it to be gone (a dict: a
        #: list scanned per lost connection made stopping 10,000 peers quadratic).
        self._closed_all: dict = {}
        #: (what an inbound hello depends on, that hello), or None (_inbound_hello).
        self._inbound: tuple[tuple, Hello] | None = None
        #: The mconn protocols of WebSocket connections admitted at accept whose
        #: protocol has not connected yet -> their _Upgrade (IUpgradeAdmission).
        self._upgrading: dict = {}

    @property
    def _sessions(self) -> SessionManager:
        """The SessionManager: the Switch sets it right after building this set, before
        any connection can reach it."""
        sessions = self.sessions
        assert sessions is not None, "the Switch sets sessions before any connection"
        return sessions

    # -- IConnectionOwner ------------------------------------------------------------

    def admit(self, protocol, host):
        """Inbound connections are admitted by ``Admission`` (specs/connection.md section 6);
        a refusal is counted and logged, and costs nothing more. A pending handshake that
        gives way to this one (``pending_evicted``) is rejected like a peer (peer_rejected,
        a close packet) and its handshake fails at once: it is pending no more. A
        WebSocket connection's protocol was admitted at accept (``admit_upgrade``): it is
        not counted again."""
        if protocol.context.is_outbound:
            return None
        upgrade = self._upgrading.pop(protocol, None)
        if upgrade is not None:
            return self._admitted_at_accept(protocol, host, upgrade)
        return self._admit(protocol, host, protocol.remote_address)

    def _admit(self, protocol, host, remote_address: str):
        refusal, evicted = self.admission.admit(host, protocol)
        if refusal is None:
            # Pending until a session starts on it (SessionManager._handshake_done) or it is
            # gone (connection_lost); no callback on its handshake Deferred for that.
            if evicted is not None:
                self._give_way(evicted.handshake, evicted.rejection)
            return None
        self._refused(remote_address, refusal)
        return refusal

    def _refused(self, remote_address: str, refusal: PeerRejected) -> None:
        self.admission.refused(refusal)
        telemetry.emit(
            "connection_refused",
            node_id=self.node_id,
            remote_address=remote_address,
            reason=refusal.reason,
            message=str(refusal),
        )

    def _give_way(self, victim, rejection: PeerRejected) -> None:
        """``victim``'s pending handshake was evicted: drop it (a WebSocket connection
        still upgrading is dropped by its carrier)."""
        upgrade = self._upgrading.get(victim)
        if upgrade is not None:
            upgrade.pending = False
            self.admission.refused(rejection)
            telemetry.emit(
                "peer_rejected",
                node_id=self.node_id,
                peer_id=None,
                remote_address=upgrade.remote_address,
                reason=rejection.reason,
                message=str(rejection),
            )
            upgrade.give_way(rejection)
        elif victim.end_reason is None:
            self.peer_rejected(victim, victim.hello, rejection)
            victim.close(rejection)
        victim.end_handshake(rejection)

    def _admitted_at_accept(self, protocol, host, upgrade):
        """The protocol of an upgraded WebSocket connection connects: it was counted from
        accept (by ``upgrade.host``, which is its transport's host); it stays pending
        until its handshake ends, or was evicted and is refused."""
        if not upgrade.pending:
            rejection = PeerRejected("pending_evicted", "its pending upgrade gave way to a newcomer")
            self.admission.release(upgrade.host)
            return rejection
        if host != upgrade.host:  # a transport that names another host now: count that one
            self.admission.handshake_over(protocol)
            self.admission.release(upgrade.host)
            return self._admit(protocol, host, protocol.remote_address)
        return None

    # -- IUpgradeAdmission --------------------------------------------------------------

    def admit_upgrade(self, protocol, host, remote_address, give_way):
        refusal = self._admit(protocol, host, remote_address)
        if refusal is None:
            self._upgrading[protocol] = _Upgrade(host, remote_address, give_way)
        return refusal

    def upgrade_addressed(self, protocol, host):
        upgrade = self._upgrading.get(protocol)
        if upgrade is None or not upgrade.pending or host == upgrade.host:
            return None
        self.admission.handshake_over(protocol)
        self.admission.release(upgrade.host)
        upgrade.host, upgrade.pending = None, False
        # Admitted again by the new host (the count fell by one: no eviction); a
        # refusal leaves it counted nowhere.
        refusal = self._admit(protocol, host, upgrade.remote_address)
        if refusal is None:
            upgrade.host, upgrade.pending = host, True
        return refusal

    def upgrade_gone(self, protocol):
        upgrade = self._upgrading.pop(protocol, None)
        if upgrade is not None:
            self.admission.handshake_over(protocol)
            self.admission.release(upgrade.host)

    def new_core(self, protocol, now: float):
        request = None
        fields: tuple[tuple[HelloTag, bytes], ...] = ()
        if protocol.context.is_outbound:
            request = self._sessions.session_request(protocol.context.resuming)
            fields = ((HelloTag.SESSION, encode_session_request(request)),)
            hello = self._hello(fields)
        else:
            hello = self._inbound_hello()
        return Connection(config=self.config, hello=hello, channels=self.channels, now=now), request

    def _hello(self, fields) -> Hello:
        return make_hello(
            node_id=self.node_id,
            channels=self.channels,
            max_packet_payload=self.config.max_packet_payload,
            listen_address=self.listen_address(),
            fields=fields,
            node_info=self.node_info,
        )

    def _inbound_hello(self) -> Hello:
        """The hello of an inbound connection: the same for all of them while the node id,
        Config, listen address and node info stay (the channels are the Switch's, fixed
        when it is built), so built once and shared (a Hello is frozen); the core encodes
        the same object once too."""
        key = (self.node_id, self.config, self.listen_address(), self.node_info)
        cached = self._inbound
        if cached is None or cached[0] != key:
            cached = self._inbound = (key, self._hello(()))
        return cached[1]

    def connection_made(self, protocol) -> None:
        self.live.add(protocol)
        if protocol.context.is_outbound:
            self._outbound.add(protocol)
        if protocol.context.resuming is not None:  # a re-dial of a suspended session
            self._sessions.connection_made(protocol)
        telemetry.publish(  # emit's fields as a dict: one event a connection of a storm
            "connection_made",
            {
                "node_id": self.node_id,
                "direction": "outbound" if protocol.context.is_outbound else "inbound",
                "remote_address": protocol.remote_address,
                "transport": transport_kind(protocol.transport),
            },
        )

    def hello_received(self, protocol, event):
        """Who the peer is (with TLS, proven by its certificate) and whether it may join;
        then the listener decides the session and the dialer waits for the answer."""
        hello = event.hello
        if hello.node_id == self.node_id:
            raise PeerRejected("self", f"connected to ourselves (node id {self.node_id})")
        context = protocol.context
        certificate = None
        if self.tls is not None:  # the hello's node id must be the certificate key's
            certificate = self.tls.peer_certificate(protocol.transport, hello.node_id, inbound=not context.is_outbound)
        if context.expected_node_id is not None and context.expected_node_id != hello.node_id:
            raise PeerIdMismatch(context.expected_node_id, hello.node_id)
        if self.node_info is not None:  # without one nothing is required (the core checked the field decodes)
            check_compatible(  # specs/handshake.md section 6.2
                self.node_info,
                (c.id for c in self.channels),
                node_info_of(hello),
                (c.id for c in hello.channels),
                peer_id=hello.node_id,
            )
        fields = {  # emit's fields as a dict: one event a handshake of a storm
            "node_id": self.node_id,
            "peer_id": hello.node_id,
            "remote_address": protocol.remote_address,
            "direction": "outbound" if context.is_outbound else "inbound",
            "max_packet_payload": event.max_packet_payload,
            "channels": [c.id for c in hello.channels],
            "listen_address": hello.listen_address,
        }
        fields.update(telemetry.hello_peer_name(hello))
        telemetry.publish("handshake_done", fields)
        # With TLS a listener knows the node id for sure unless the dialer presented no
        # certificate (CA mode with anonymous clients): then it is only claimed.
        proven = self.tls is not None and (context.is_outbound or certificate is not None)
        verdict = self.authorizer.check(hello.node_id, protocol.remote_address, certificate)
        if verdict is not None:
            return verdict.addCallback(self._authorized_later, protocol, hello, proven)
        self._sessions.hello_authorized(protocol, hello, proven=proven)
        return None

    def _authorized_later(self, _, protocol, hello, proven: bool) -> None:
        if protocol.end_reason is None:  # it may have gone away while authorize was deciding
            self._sessions.hello_authorized(protocol, hello, proven=proven)

    def session_answered(self, protocol, answer) -> None:
        # A dialer always checks the listener's certificate: with TLS its id is proven.
        self._sessions.session_answered(protocol, answer, proven=self.tls is not None)

    def peer_rejected(self, protocol, hello, rejection: PeerRejected) -> None:
        self.admission.refused(rejection)
        telemetry.emit(
            "peer_rejected",
            node_id=self.node_id,
            peer_id=hello.node_id if hello is not None else None,
            remote_address=protocol.remote_address,
            reason=rejection.reason,
            message=str(rejection),
            **telemetry.hello_peer_name(hello),
        )

    def protocol_error(self, protocol, error) -> None:
        # A link failure (PongTimeout, HandshakeTimeout: nothing came in time) is not the
        # peer's protocol error: it is logged as link_failed, at info (mconn.errors kind).
        telemetry.emit(
            "link_failed" if error_kind(error) == LINK else "protocol_error",
            node_id=self.node_id,
            peer_id=protocol.peer.node_id if protocol.peer is not None else None,
            remote_address=protocol.remote_address,
            error_type=type(error).__name__,
            error=str(error),
            **telemetry.hello_peer_name(protocol.hello if protocol.peer is not None else None),
        )

    def loop_stalled(self, protocol, late: float) -> None:
        telemetry.emit(
            "loop_stalled",
            node_id=self.node_id,
            peer_id=protocol.hello.node_id if protocol.hello is not None else None,
            late=late,
        )

    def connection_lost(self, protocol, reason: Exception) -> None:
        self.live.discard(protocol)
        self._outbound.discard(protocol)
        self.admission.release(protocol.ip_key)
        telemetry.emit(
            "connection_lost",
            node_id=self.node_id,
            peer_id=protocol.hello.node_id if protocol.hello is not None else None,
            remote_address=protocol.remote_address,
            direction=_direction(protocol),
            reason_type=type(reason).__name__,
            reason=str(reason),
            reason_kind=error_kind(reason),
            duration=self.clock.seconds() - protocol.started,
            bytes_sent=protocol.core.bytes_sent,
            bytes_received=protocol.core.bytes_received,
            channels=telemetry.channel_counters(protocol.core),
            session_id=_session_of(protocol),
            **telemetry.hello_peer_name(protocol.hello),
        )
        self._sessions.connection_lost(protocol, reason)
        self.admission.handshake_over(protocol)
        protocol.end_handshake(reason)
        self._sessions.forget_probes(protocol)
        for d in self._closed_all.pop(protocol, ()):
            d.callback(None)

    # -- for the Switch --------------------------------------------------------------

    def plaintext_refused(self, protocol, rejection: PeerRejected) -> None:
        """A TLS listener refused a start before TLS (plaintext mconn bytes, a pre-hello
        where TLS first is required, a malformed pre-hello); mconn.net.tls_transport answers
        with a plaintext close packet naming ``rejection.reason`` (specs/tls.md section 7)."""
        self.peer_rejected(protocol, None, rejection)
        protocol.ended_beneath(rejection)

    def dialing_to(self, node_id: str) -> bool:
        """Whether an outbound connection of ours to ``node_id`` is still handshaking."""
        if not self._outbound:
            return False  # a listener that dials nobody: no generator per inbound hello
        return any(
            p.peer is None
            and p.end_reason is None
            and node_id in (p.context.expected_node_id, p.hello.node_id if p.hello is not None else None)
            for p in self._outbound
        )

    def close_all(self, reason_for) -> list:
        """Close every connection with ``reason_for()``; Deferreds that fire once each is gone.
        A WebSocket connection still upgrading is answered (an HTTP 503 naming the reason)
        and dropped by its carrier; nothing waits for it."""
        for upgrade in list(self._upgrading.values()):
            if upgrade.pending:
                reason = reason_for()
                upgrade.give_way(PeerRejected(getattr(reason, "code", "shutdown"), str(reason)))
        waits = []
        for protocol in list(self.live):
            d: defer.Deferred[None] = defer.Deferred()
            self._closed_all.setdefault(protocol, []).append(d)
            waits.append(d)
            protocol.close(reason_for())
        return waits

    def check_invariants(self) -> None:
        """The admission counts agree with the live connections and the WebSocket
        connections still upgrading."""
        live = self.live
        hosts = [p.ip_key for p in live if p.ip_key is not None]
        hosts += [u.host for u in self._upgrading.values() if u.host is not None]
        pending = sum(1 for p in live if not p.context.is_outbound and not p.handshake_ended)
        pending += sum(1 for u in self._upgrading.values() if u.pending)
        assert not self.live.intersection(self._upgrading), "a connected protocol is still upgrading"
        self.admission.check_invariants(hosts, pending)


class _Upgrade:
    """A WebSocket connection admitted at accept whose mconn protocol has not connected:
    the host it counts against (None: none), whether it is pending (not evicted), and
    how its carrier drops it."""

    __slots__ = ("host", "remote_address", "give_way", "pending")

    def __init__(self, host, remote_address: str, give_way) -> None:
        self.host = host
        self.remote_address = remote_address
        self.give_way = give_way
        self.pending = True


def _direction(protocol) -> str:
    return "outbound" if protocol.context.is_outbound else "inbound"


def _session_of(protocol) -> str | None:
    """The session a connection carries, or was resuming; None (specs/telemetry.md connection_lost)."""
    peer = protocol.peer if protocol.peer is not None else protocol.context.resuming
    return peer.session.id.hex() if peer is not None else None
