"""Switch: the node's peer set and message router (specs/reactor-api.md).

The Switch owns the invariants between its collections: every channel id belongs to one
reactor (checked when it is built); a node id has at most one Peer; ``add_peer`` is
called on every reactor before any ``receive`` from that peer and ``remove_peer`` after
the last. ``_check_invariants`` asserts that the collections agree; tests call it.
"""

from __future__ import annotations

import dataclasses
import os

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, serverFromString
from twisted.internet.task import LoopingCall

from mconn import telemetry
from mconn.address import PeerAddress, parse_address
from mconn.config import Config
from mconn.connection import Connection, State, close_packet
from mconn.dialer import AddressPool, Dialer, default_reconnect_delay
from mconn.errors import (
    AuthenticationError,
    ConnectionClosed,
    DialGaveUp,
    ConnectionLost,
    PeerClosed,
    PeerIdMismatch,
    PeerRejected,
    PongTimeout,
    SessionExpired,
    SessionRejected,
    UnexpectedPacket,
)
from mconn.handshake import make_hello
from mconn.node_key import NodeKey
from mconn.peer import CLOSED, CONNECTED, CONNECTING, SUSPENDED, Peer
from mconn.protocol import MConnectionFactory
from mconn.session import Session
from mconn.tls_transport import tls_client_endpoint, tls_server_factory
from mconn.wire import (
    SESSION_ID_BYTES,
    HelloTag,
    SessionAnswer,
    SessionRequest,
    decode_session_request,
    encode_session_request,
)


#: The close code and PeerRejected reason of the connection that loses a simultaneous dial.
SIMULTANEOUS_DIAL = "simultaneous_dial"
#: Close codes that end a session a resume attempt was made for (the other node is
#: stopping or closed the session on purpose); any other close just fails the attempt.
ENDS_SESSION = frozenset({"shutdown", "closed"})
#: Per-node counters kept across sessions (``Switch.node_counters``, ``PeerStats``).
#: How many nodes' counters are kept; past it the oldest of nodes now unknown are dropped.
NODE_COUNTERS_KEPT = 1024
NODE_COUNTERS = ("resume_rejections", "grace_expiries", "duplicates_refused", "duplicates_replaced", "simultaneous_dials")


class Switch(Service):
    """Routes every inbound message to the Reactor that owns its channel.

    :param reactors: the node's reactors; their channel ids must not overlap.
    :param node_key: the node's identity (a fresh one if None).
    :param config: a Config (defaults if None).
    :param clock: the Twisted reactor to use (``twisted.internet.reactor`` if None).
    :param reconnect_delay: ``reconnect_delay(attempt) -> seconds`` between dial attempts
        (``mconn.dialer.default_reconnect_delay`` capped at ``max_reconnect_delay`` if None).
    :param choose_address: ``choose_address(pool, last_info) -> (address, delay)``, the
        hook that may pick the next address to dial (``mconn.dialer.Dialer``).
    :param tls: a ``mconn.tls.TLSOptions``: every connection, both ways, runs TLS first and
        each peer's node id is proven by its certificate (specs/tls.md). None: plaintext.
    :param allowed_peers: node ids that may join (empty: anyone who proves a key).
    :param authorize: ``authorize(node_id, address, certificate) -> bool | Deferred[bool]``,
        asked once the node id is proven and before ``add_peer`` or a resume, inbound and
        outbound (specs/tls.md section 6).
    """

    def __init__(
        self,
        reactors,
        *,
        node_key: NodeKey | None = None,
        config: Config | None = None,
        clock=None,
        reconnect_delay=None,
        choose_address=None,
        tls=None,
        allowed_peers=(),
        authorize=None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor as clock
        self.clock = clock
        self.config = config or Config()
        tls_key = tls.node_key if tls is not None else None
        if node_key is not None and tls_key is not None and node_key.node_id != tls_key.node_id:
            raise ValueError(f"node_key is node {node_key.node_id} but the TLS certificate key is node {tls_key.node_id}")
        self.node_key = node_key or tls_key or NodeKey.generate()
        self.node_id = self.node_key.node_id
        self.tls = tls
        #: Node ids that may join (empty: anyone); a set that may be changed at any time.
        self.allowed_peers = set(allowed_peers)
        self.authorize = authorize
        self.reactors = list(reactors)
        self._reactor_by_channel = {}
        self.channels = []
        for reactor in self.reactors:
            for desc in reactor.get_channels():
                owner = self._reactor_by_channel.get(desc.id)
                if owner is not None:
                    raise ValueError(
                        f"channel {desc.id:#04x} is claimed by both {type(owner).__name__} and "
                        f"{type(reactor).__name__}"
                    )
                self._reactor_by_channel[desc.id] = reactor
                self.channels.append(desc)
            reactor.switch = self
        #: channel id -> the owning reactor's bound ``receive`` (the routing hot path).
        self._receivers = {ch: reactor.receive for ch, reactor in self._reactor_by_channel.items()}
        #: Connected peers by node id.
        self.peers: dict[str, Peer] = {}
        #: Every live connection, handshaking or not.
        self.connections: set = set()
        self.listen_address = ""
        self._ports = []
        self._stats_loop = None
        #: This run's random id, logged in node_started at startService or the first listen.
        self.run_id: str | None = None
        self._closed_all = []
        self._grace_timers = {}
        #: node id -> the _Redial keeping it connected (persistent) or resuming it.
        self._dialers: dict[str, _Redial] = {}
        #: First dials that retry (retry_initial_dial) without a node id to key them by.
        self._initial_dials: set = set()
        #: node id -> Deferreds waiting for a session with it (a dial that lost a race).
        self._session_waiters: dict[str, list] = {}
        #: newcomer protocol -> _Probe of the live connection it would replace.
        self._probes: dict = {}
        #: node id -> counters that outlive sessions (PeerStats, status page).
        self.node_counters: dict[str, dict[str, int]] = {}
        #: Connections refused, by reason: before a Connection was built (``pending_limit``,
        #: ``ip_limit``: connection_refused) or after the hello (peer_rejected).
        self.refusals: dict[str, int] = {}
        #: remote IP -> inbound connections from it (each protocol's ``ip_key``).
        self._connections_per_ip: dict[str, int] = {}
        #: Inbound connections admitted whose handshake Deferred has not fired yet.
        self._pending_inbound = 0
        self._stopping = False
        self.reconnect_delay = reconnect_delay or self._default_reconnect_delay
        self.choose_address = choose_address

    # -- service -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._begin_run()
        if self.config.stats_interval:
            self._stats_loop = LoopingCall(self._emit_stats)
            self._stats_loop.clock = self.clock
            self._stats_loop.start(self.config.stats_interval, now=False)

    def _begin_run(self) -> None:
        """Log node_started before this Switch's first event (a node may listen first)."""
        if self.run_id is None:
            self.run_id = telemetry.node_started(self.node_id)

    def stopService(self) -> defer.Deferred:
        """Stop listening, close every connection with a close packet, wait until gone."""
        super().stopService()
        self._stopping = True
        if self._stats_loop is not None and self._stats_loop.running:
            self._stats_loop.stop()
        waits = [defer.maybeDeferred(port.stopListening) for port in self._ports]
        self._ports = []
        # One reason per session: _end_session records each session's undelivered counts on it.
        def shutdown():
            return ConnectionClosed("shutdown", "the node is stopping")

        for peer in list(self.peers.values()):
            if peer._protocol is None:
                self._end_session(peer, shutdown())
        for redial in list(self._dialers.values()) + list(self._initial_dials):
            redial.stop(DialGaveUp(redial.node_id, "the node is stopping"))
        self._dialers.clear()
        self._initial_dials.clear()
        for probe in list(self._probes.values()):
            probe.cancel()
        for proto in list(self.connections):
            d = defer.Deferred()
            self._closed_all.append((proto, d))
            waits.append(d)
            proto.close(shutdown())
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    # -- listening and dialing -----------------------------------------------------

    def listen(self, endpoint_description: str) -> defer.Deferred:
        """Accept peers on a Twisted server endpoint string, e.g. ``tcp:0:interface=127.0.0.1``.

        :returns: a Deferred firing with the IListeningPort.
        """
        self._begin_run()
        endpoint = serverFromString(self.clock, endpoint_description)
        factory = MConnectionFactory(self, is_outbound=False)
        if self.tls is not None:  # TLS first; a plaintext start gets a close packet (specs/tls.md)
            try:
                factory = tls_server_factory(
                    self.tls, factory, clock=self.clock, on_plaintext=self._plaintext_refused,
                    close_linger=self.config.close_linger,
                )
            except ValueError:
                return defer.fail()
        d = endpoint.listen(factory)

        def listening(port):
            self._ports.append(port)
            host = port.getHost()
            address = f"[{host.host}]:{host.port}" if ":" in host.host else f"{host.host}:{host.port}"
            if not self.listen_address:
                self.listen_address = address
            telemetry.emit("listening", node_id=self.node_id, address=address)
            return port

        return d.addCallback(listening)

    def dial(self, address: str, *, persistent: bool = False, retry_initial_dial: bool | None = None) -> defer.Deferred:
        """Connect to ``ID@host:port`` or ``host:port``.

        :param persistent: keep this node connected for the Switch's lifetime: after any
            break or end of the session it is dialed again, over its address pool
            (specs/resume.md section 7). Needs the node id.
        :param retry_initial_dial: keep trying the first dial with the reconnect backoff
            instead of failing at the first error (``Config.retry_initial_dial`` if None).
        :returns: a Deferred firing with the Peer once a session is up, or failing with
            PeerRejected (self, duplicate, id mismatch, limits), a RemoteProtocolError,
            the connection error, or DialGaveUp (``max_reconnects``, or every address
            banned).
        """
        try:
            target = parse_address(address)
        except ValueError:
            return defer.fail()
        if target.node_id == self.node_id:
            return defer.fail(PeerRejected("self", f"refusing to dial ourselves ({address})"))
        if persistent and target.node_id is None:
            return defer.fail(ValueError(f"a persistent peer needs its node id (ID@host:port), got {address!r}"))
        retry = self.config.retry_initial_dial if retry_initial_dial is None else retry_initial_dial
        existing = self.peers.get(target.node_id) if target.node_id is not None else None
        if persistent:
            redial = self._dialers.get(target.node_id)
            if redial is None:
                redial = self._dialers[target.node_id] = _Redial(self, target.node_id, [target], persistent=True)
            else:
                redial.persistent = True
                redial.dialer.pool.add_configured(target)
            if existing is not None:
                return defer.succeed(existing)
            return redial.first_session(retry)
        if existing is not None:
            return defer.fail(PeerRejected("duplicate", f"node {target.node_id} is already connected"))
        if retry:
            redial = _Redial(self, target.node_id, [target], persistent=False, initial=True)
            self._initial_dials.add(redial)
            return redial.first_session(True)
        return self._connect(target, target.node_id)

    def set_address_pool(self, node_id: str, addresses) -> None:
        """Make ``addresses`` the address pool of the persistent peer ``node_id``.

        Addresses in both the old and the new pool keep what dialing them taught
        (failures, bans); the count of failed attempts toward ``max_reconnects`` starts
        again (NATS's set_server_pool).

        :raises KeyError: if ``node_id`` is not a persistent peer.
        :raises ValueError: for an address that does not parse or names another node.
        """
        redial = self._dialers.get(node_id)
        if redial is None or not redial.persistent:
            raise KeyError(f"node {node_id} is not a persistent peer; dial it with persistent=True first")
        redial.set_pool([_with_node_id(a, node_id) for a in addresses])

    def stop_dialing(self, node_id: str) -> None:
        """Forget that ``node_id`` is persistent: no more dials (its session goes on)."""
        redial = self._dialers.pop(node_id, None)
        if redial is not None:
            redial.stop(DialGaveUp(node_id, "stop_dialing was called"))

    def address_pool(self, node_id: str):
        """The AddressPool of ``node_id`` (persistent or being re-dialed), or None."""
        redial = self._dialers.get(node_id)
        return redial.dialer.pool if redial is not None else None

    def _default_reconnect_delay(self, attempt: int) -> float:
        return default_reconnect_delay(attempt, max_delay=self.config.max_reconnect_delay)

    def _endpoint(self, target: PeerAddress):
        """The client endpoint for one dial attempt (tests on a memory network replace it).

        HostnameEndpoint resolves the host on every attempt and tries each of its
        addresses, all within ``dial_timeout``.
        """
        bind = (self.config.local_address, 0) if self.config.local_address else None
        endpoint = HostnameEndpoint(self.clock, target.host, target.port, timeout=self.config.dial_timeout, bindAddress=bind)
        if self.tls is not None:
            endpoint = tls_client_endpoint(
                self.tls, endpoint, target.host, clock=self.clock, close_linger=self.config.close_linger
            )
        return endpoint

    def _connect(self, target: PeerAddress, node_id: str | None) -> defer.Deferred:
        """One dial attempt; fires with the Peer once its session is up (new or resumed)."""
        peer = self.peers.get(node_id) if node_id is not None else None
        if peer is not None and peer.state == CONNECTED:
            return defer.succeed(peer)  # a connection from that node won meanwhile
        resuming = peer if peer is not None and peer.state in (SUSPENDED, CONNECTING) else None
        factory = MConnectionFactory(
            self, is_outbound=True, expected_node_id=node_id, resuming=resuming, address=target
        )
        d = self._endpoint(target).connect(factory)
        d.addCallback(lambda proto: proto.handshake)
        return d.addErrback(self._lost_race, node_id)

    def _lost_race(self, failure, node_id: str | None):
        """A dial refused because a session with that node exists, or is being made by the
        other connection of a simultaneous dial: the caller gets that session's Peer."""
        error = failure.value
        word = getattr(error, "reason", None) if isinstance(error, PeerRejected) else getattr(error, "code", None)
        if node_id is None or word not in ("duplicate", SIMULTANEOUS_DIAL):
            return failure
        peer = self.peers.get(node_id)
        if peer is not None and peer.state != CLOSED:
            return peer
        d = defer.Deferred()
        waiters = self._session_waiters.setdefault(node_id, [])
        waiters.append(d)

        def timed_out():
            if d in waiters:
                waiters.remove(d)
                d.callback(failure)

        timer = self.clock.callLater(self.config.handshake_timeout, timed_out)
        return d.addBoth(_cancelling(timer))

    def _session_up(self, peer: Peer) -> None:
        """Fire the dials that wait for a session with this node; learn its address."""
        for d in self._session_waiters.pop(peer.node_id, []):
            d.callback(peer)
        redial = self._dialers.get(peer.node_id)
        if redial is not None and peer.listen_address and not self.config.ignore_discovered_addresses:
            try:
                redial.dialer.pool.add_discovered(_with_node_id(peer.listen_address, peer.node_id))
            except ValueError:
                pass  # an address we cannot dial is not worth keeping

    def broadcast(self, channel_id: int, message: bytes) -> defer.Deferred:
        """``send`` to every connected peer; fires with {node_id: bool}."""
        peers = list(self.peers.values())
        d = defer.gatherResults([p.send(channel_id, message) for p in peers])
        return d.addCallback(lambda results: {p.node_id: ok for p, ok in zip(peers, results)})

    # -- called by MConnectionProtocol ---------------------------------------------

    def _new_connection_core(self, now: float, proto) -> Connection:
        fields = ()
        if proto.is_outbound:
            resuming = proto.resuming
            if resuming is not None and resuming.state != CLOSED:
                session = resuming.session
                request = SessionRequest(session_id=session.id, resume=True, delivered=session.delivered_counts())
            else:
                request = SessionRequest(session_id=os.urandom(SESSION_ID_BYTES), resume=False)
            proto.session_request = request
            fields = ((HelloTag.SESSION, encode_session_request(request)),)
        hello = make_hello(
            node_id=self.node_id,
            channels=self.channels,
            max_packet_payload=self.config.max_packet_payload,
            listen_address=self.listen_address,
            fields=fields,
        )
        return Connection(config=self.config, hello=hello, channels=self.channels, now=now)

    def _connection_made(self, proto) -> None:
        self.connections.add(proto)
        if proto.resuming is not None and proto.resuming.state == SUSPENDED:
            proto.resuming.state = CONNECTING
        telemetry.emit(
            "connection_made",
            node_id=self.node_id,
            direction="outbound" if proto.is_outbound else "inbound",
            remote_address=proto.remote_address,
        )

    def _admit(self, proto) -> bool:
        """May this inbound connection start its handshake? (specs/connection.md section 6)

        Asked in connectionMade before a Connection is built. A refused connection gets
        a close packet naming the limit, is counted and logged, and costs nothing more.
        """
        if proto.is_outbound:
            return True
        config = self.config
        host = getattr(proto.transport.getPeer(), "host", None)
        pending = self._pending_inbound
        from_host = self._connections_per_ip.get(host, 0)
        if pending >= config.max_pending_handshakes:
            refusal = PeerRejected(
                "pending_limit",
                f"{pending} inbound connections are handshaking (max_pending_handshakes {config.max_pending_handshakes})",
            )
        elif host is not None and from_host >= config.max_connections_per_ip:
            refusal = PeerRejected(
                "ip_limit", f"{from_host} connections from {host} (max_connections_per_ip {config.max_connections_per_ip})"
            )
        else:
            if host is not None:
                self._connections_per_ip[host] = from_host + 1
                proto.ip_key = host  # released by this key in _connection_lost
            self._pending_inbound += 1
            proto.handshake.addBoth(self._handshake_over)  # a session, or the connection lost
            return True
        self.refusals[refusal.reason] = self.refusals.get(refusal.reason, 0) + 1
        telemetry.emit(
            "connection_refused",
            node_id=self.node_id,
            remote_address=proto.remote_address,
            reason=refusal.reason,
            message=str(refusal),
        )
        proto.end_reason = refusal
        proto.transport.write(close_packet(refusal.reason, str(refusal)))
        proto.transport.loseConnection()
        return False

    def _handshake_over(self, result):
        self._pending_inbound -= 1
        return result

    def _release_ip(self, proto) -> None:
        key, proto.ip_key = proto.ip_key, None
        if key is not None:
            left = self._connections_per_ip[key] - 1
            if left:
                self._connections_per_ip[key] = left
            else:
                del self._connections_per_ip[key]

    # -- sessions (specs/resume.md) ------------------------------------------------

    def _hello_received(self, proto, event):
        """The peer's hello: who it is (with TLS, proven by its certificate) and whether it
        may join; then the listener decides the session and the dialer waits for it.

        :returns: None, or a Deferred while an asynchronous ``authorize`` decides (the
            protocol holds the events that follow until it fires).
        """
        hello = event.hello
        if hello.node_id == self.node_id:
            raise PeerRejected("self", f"connected to ourselves (node id {self.node_id})")
        certificate = None
        if self.tls is not None:  # the hello's node id must be the certificate key's
            certificate = self.tls.peer_certificate(proto.transport, hello.node_id, inbound=not proto.is_outbound)
        if proto.expected_node_id is not None and proto.expected_node_id != hello.node_id:
            raise PeerIdMismatch(proto.expected_node_id, hello.node_id)
        telemetry.emit(
            "handshake_done",
            node_id=self.node_id,
            peer_id=hello.node_id,
            remote_address=proto.remote_address,
            direction="outbound" if proto.is_outbound else "inbound",
            max_packet_payload=event.max_packet_payload,
            channels=[c.id for c in hello.channels],
            listen_address=hello.listen_address,
        )
        verdict = self._authorize(proto, hello, certificate)
        if verdict is not None:
            return verdict.addCallback(self._authorized_later, proto, hello)
        self._hello_authorized(proto, hello)
        return None

    def _authorize(self, proto, hello, certificate):
        """``allowed_peers``, then the ``authorize`` hook (specs/tls.md section 6).

        :returns: None if the peer may join now, or a Deferred that fires once it may.
        :raises AuthenticationError: if it may not (the Deferred fails with it likewise).
        """
        node_id = hello.node_id
        if self.allowed_peers and node_id not in self.allowed_peers:
            raise AuthenticationError(f"node {node_id} is not in allowed_peers")
        if self.allowed_peers and self.tls is not None and certificate is None:
            raise AuthenticationError(f"node {node_id} presented no certificate, so it is not proven to be in allowed_peers")
        if self.authorize is None:
            return None
        try:
            verdict = self.authorize(node_id, proto.remote_address, certificate)
        except Exception as e:
            raise AuthenticationError(f"authorize({node_id}) raised {type(e).__name__}: {e}") from e
        if not isinstance(verdict, defer.Deferred):
            _check_verdict(node_id, verdict)
            return None
        timeout = self.config.handshake_timeout
        return verdict.addTimeout(timeout, self.clock).addCallbacks(
            lambda answer: _check_verdict(node_id, answer), _authorize_failed, errbackArgs=(node_id, timeout)
        )

    def _authorized_later(self, _, proto, hello) -> None:
        if proto.end_reason is None:  # it may have gone away while authorize was deciding
            self._hello_authorized(proto, hello)

    def _hello_authorized(self, proto, hello) -> None:
        """The peer may join: the listener decides the session now; the dialer waits."""
        if proto.is_outbound:
            return  # the listener answers with a session packet (_session_answered)
        request = _session_request(hello)
        existing = self.peers.get(hello.node_id)
        refusal = ""
        if existing is not None:
            if request is not None and request.resume and existing.session.proves(request.session_id):
                refusal = _channel_change(existing, hello)
                if not refusal:
                    self._resume(proto, existing, request.delivered, answer=True)
                    return
                self._drop_transport(existing, "the session's channels changed")
            elif existing.state == CONNECTED:
                self._probes[proto] = _Probe(self, proto, existing)  # decided in _probe_done
                return
            refusal = refusal or ("unknown session" if request is not None and request.resume else "new session")
            self._end_session(existing, SessionRejected(refusal, existing.session.undelivered()))
        elif request is not None and request.resume:
            refusal = "unknown session (expired, or this node restarted)"
        elif self._dialing(hello.node_id) and self.node_id < hello.node_id:
            self._count(hello.node_id, "simultaneous_dials")
            raise PeerRejected(
                SIMULTANEOUS_DIAL,
                f"node {hello.node_id} and this node dialed each other; both keep the connection "
                f"dialed by the smaller node id ({self.node_id})",
            )
        self._accept(proto, hello, request, refusal)

    def _accept(self, proto, hello, request, refusal: str) -> None:
        """The listener starts a fresh session on ``proto`` and answers it."""
        self._check_limits(proto)
        if request is None or request.resume:  # a refused resume starts under a new id
            session_id = os.urandom(SESSION_ID_BYTES)
        else:
            session_id = request.session_id
        proto.core.send_session_answer(SessionAnswer(session_id=session_id, resumed=False, reason=refusal))
        self._start_session(proto, hello, session_id, refusal)

    def _dialing(self, node_id: str) -> bool:
        """Whether an outbound connection of ours to ``node_id`` is still handshaking."""
        return any(
            p.is_outbound and p.peer is None and p.end_reason is None
            and node_id in (p.expected_node_id, p.hello.node_id if p.hello is not None else None)
            for p in self.connections
        )

    def _probe_done(self, probe: _Probe, alive: bool) -> None:
        """The duplicate rule (specs/resume.md section 7): the old connection answered the
        probe, and the newcomer is refused; or it did not, and the newcomer replaces it."""
        self._probes.pop(probe.newcomer, None)
        newcomer, peer, old = probe.newcomer, probe.peer, probe.old
        if newcomer.end_reason is not None or newcomer.core.state is not State.OPEN:
            return
        node_id = peer.node_id
        still_there = peer.state == CONNECTED and peer._protocol is old
        if alive and still_there:
            self._count(node_id, "duplicates_refused")
            self._duplicate_event(newcomer, old, "refused")
            rejection = PeerRejected(
                "duplicate",
                f"node {node_id} is already connected ({old.remote_address}, "
                f"{'outbound' if old.is_outbound else 'inbound'}) and that connection answered a probe",
            )
            self._peer_rejected(newcomer, newcomer.hello, rejection)
            newcomer.close(rejection)
            return
        self._count(node_id, "duplicates_replaced")
        self._duplicate_event(newcomer, old, "replaced")
        reason = (
            f"replaced: a new connection came from the node and the old one ({old.remote_address}) "
            f"did not answer a probe within {self.config.duplicate_probe_timeout}s"
        )
        if still_there:
            self._drop_transport(peer, "it did not answer a probe; a new connection replaced it")
        if peer.state != CLOSED:
            self._end_session(peer, SessionRejected(reason, peer.session.undelivered()))
        newcomer._decide(lambda proto, hello: self._accept(proto, hello, _session_request(hello), reason), newcomer.hello)
        newcomer.pump()

    def _drop_transport(self, peer: Peer, why: str) -> None:
        """Abort a session's live transport without ending the session."""
        old = peer._protocol
        if old is not None:
            old.peer = None
            old.end_reason = ConnectionClosed("replaced", why)
            old.transport.abortConnection()
            peer._suspend()

    def _duplicate_event(self, newcomer, old, outcome: str) -> None:
        telemetry.emit(
            "duplicate_connection",
            node_id=self.node_id,
            peer_id=newcomer.hello.node_id,
            remote_address=newcomer.remote_address,
            existing_address=old.remote_address,
            outcome=outcome,
        )

    def _session_answered(self, proto, answer: SessionAnswer) -> None:
        """The listener's answer to our session request."""
        request, resuming = proto.session_request, proto.resuming
        if not proto.is_outbound or proto.peer is not None or request is None or proto.hello is None:
            raise UnexpectedPacket("session packet where none was asked for")
        if answer.session_id != request.session_id and (answer.resumed or not request.resume):
            raise UnexpectedPacket(
                f"session answer names session {answer.session_id.hex()}, we asked for {request.session_id.hex()}"
            )
        if answer.resumed:
            if not request.resume or resuming is None or resuming.state == CLOSED:
                raise UnexpectedPacket("the peer resumed a session we did not ask to resume")
            self._resume(proto, resuming, answer.delivered, answer=False)
            return
        if resuming is not None and resuming.state != CLOSED:
            reason = answer.reason or "the peer started a new session"
            # The dialer goes on: this attempt connected, to a fresh session.
            self._end_session(resuming, SessionRejected(reason, resuming.session.undelivered()), stop_dialer=False)
        node_id = proto.hello.node_id
        existing = self.peers.get(node_id)
        if existing is not None and existing.state == CONNECTED:
            if existing.is_outbound:
                raise PeerRejected("duplicate", f"node {node_id} is already connected")
            # Both dialed, and each side's listener accepted: keep the connection dialed by
            # the smaller node id, as the other side does.
            self._count(node_id, "simultaneous_dials")
            why = (
                f"node {node_id} and this node dialed each other; both keep the connection "
                f"dialed by the smaller node id ({min(node_id, self.node_id)})"
            )
            if node_id < self.node_id:
                raise PeerRejected(SIMULTANEOUS_DIAL, why)
            old = existing._protocol
            self._end_session(existing, SessionRejected("simultaneous dial: " + why, existing.session.undelivered()))
            old.close(PeerRejected(SIMULTANEOUS_DIAL, why))
        elif existing is not None:
            self._end_session(existing, SessionRejected("a new session replaced it", existing.session.undelivered()))
        self._check_limits(proto)
        self._start_session(proto, proto.hello, answer.session_id, answer.reason)

    def _check_limits(self, proto) -> None:
        same_direction = sum(1 for p in self.peers.values() if p.is_outbound == proto.is_outbound)
        limit = self.config.max_outbound_peers if proto.is_outbound else self.config.max_inbound_peers
        if same_direction >= limit:
            kind = "outbound" if proto.is_outbound else "inbound"
            raise PeerRejected(f"{kind}_limit", f"already {same_direction} {kind} peers (max_{kind}_peers {limit})")

    def _start_session(self, proto, hello, session_id: bytes, refusal: str) -> Peer:
        session = Session(
            session_id,
            [d.id for d in self.channels],
            recovery_buffer_bytes=self.config.recovery_buffer_bytes,
            ack_every_messages=self.config.ack_every_messages,
            ack_every_bytes=self.config.ack_every_bytes,
        )
        peer = Peer(
            switch=self, protocol=proto, hello=hello, session=session, is_outbound=proto.is_outbound, address=proto.address
        )
        self.peers[peer.node_id] = peer
        proto.peer = peer
        telemetry.emit(
            "session_started",
            node_id=self.node_id,
            peer_id=peer.node_id,
            session_id=session_id.hex(),
            remote_address=proto.remote_address,
            direction="outbound" if peer.is_outbound else "inbound",
            resume_refused=refusal,
        )
        for reactor in self.reactors:
            self._call_reactor(reactor, "add_peer", peer, peer)
        if not proto.handshake.called:
            proto.handshake.callback(peer)
        self._session_up(peer)
        return peer

    def _resume(self, proto, peer: Peer, peer_delivered: dict, *, answer: bool) -> None:
        old = peer._protocol
        if old is not None and old is not proto:
            # A newcomer that proves the session takes over the live transport at once.
            self._drop_transport(peer, "the session moved to a new connection")
            self._suspended_event(peer, old.end_reason)
        self._stop_waiting(peer, dialer=False)  # a dialer that got here stops by itself
        proto.peer = peer
        if answer:
            proto.core.send_session_answer(
                SessionAnswer(session_id=peer.session.id, resumed=True, delivered=peer.session.delivered_counts())
            )
        resent_before = peer.session.resent
        peer._attach(proto, peer_delivered)
        peer.resumes += 1
        telemetry.emit(
            "session_resumed",
            node_id=self.node_id,
            peer_id=peer.node_id,
            session_id=peer.session.id.hex(),
            remote_address=proto.remote_address,
            resent=peer.session.resent - resent_before,
            resumes=peer.resumes,
        )
        for reactor in self.reactors:
            self._call_reactor(reactor, "peer_resumed", peer, peer)
        proto.pump()
        if not proto.handshake.called:
            proto.handshake.callback(peer)
        self._session_up(peer)

    def _suspend_session(self, peer: Peer, reason: Exception) -> None:
        peer._suspend()
        self._suspended_event(peer, reason)
        self._grace_timers[peer.node_id] = self.clock.callLater(self.config.resume_grace, self._grace_expired, peer)
        if peer.address is not None:
            self._redial(peer)

    def _suspended_event(self, peer: Peer, reason: Exception) -> None:
        """session_suspended and peer_suspended (every suspension, takeovers included)."""
        telemetry.emit(
            "session_suspended",
            node_id=self.node_id,
            peer_id=peer.node_id,
            session_id=peer.session.id.hex(),
            reason_type=type(reason).__name__,
            reason=str(reason),
            grace=self.config.resume_grace,
        )
        for reactor in self.reactors:
            self._call_reactor(reactor, "peer_suspended", peer, peer)

    def _grace_expired(self, peer: Peer) -> None:
        self._grace_timers.pop(peer.node_id, None)
        if peer.state in (SUSPENDED, CONNECTING):
            self._count(peer.node_id, "grace_expiries")
            self._end_session(peer, SessionExpired(self.config.resume_grace, peer.session.undelivered()))

    def _stop_waiting(self, peer: Peer, *, dialer: bool = True) -> None:
        timer = self._grace_timers.pop(peer.node_id, None)
        if timer is not None and timer.active():
            timer.cancel()
        redial = self._dialers.get(peer.node_id)
        if dialer and redial is not None:
            redial.dialer.stop()
            if not redial.persistent:
                del self._dialers[peer.node_id]

    def _count(self, node_id: str, counter: str) -> None:
        counters = self.node_counters.get(node_id)
        if counters is None:
            if len(self.node_counters) >= NODE_COUNTERS_KEPT:
                self._forget_counters()
            counters = self.node_counters[node_id] = dict.fromkeys(NODE_COUNTERS, 0)
        counters[counter] += 1

    def _forget_counters(self) -> None:
        """Bound the table: strangers come and go (a flood of hellos from made-up node
        ids); drop the oldest entries of nodes with no session and no dialer."""
        for node_id in list(self.node_counters):
            if len(self.node_counters) < NODE_COUNTERS_KEPT // 2:
                break
            if node_id not in self.peers and node_id not in self._dialers:
                del self.node_counters[node_id]

    def _end_session(self, peer: Peer, reason: Exception, *, stop_dialer: bool = True) -> None:
        """The session is over: the reactors get remove_peer with the reason."""
        if peer.state == CLOSED:
            return
        self._stop_waiting(peer, dialer=stop_dialer)
        if not reason.undelivered:
            reason.undelivered = peer.session.undelivered()
        if isinstance(reason, SessionRejected):
            self._count(peer.node_id, "resume_rejections")
        proto = peer._protocol
        if proto is not None:
            proto.peer = None
        peer._end(reason)
        if self.peers.get(peer.node_id) is peer:
            del self.peers[peer.node_id]
        telemetry.emit(
            "session_ended",
            node_id=self.node_id,
            peer_id=peer.node_id,
            session_id=peer.session.id.hex(),
            reason_type=type(reason).__name__,
            reason=str(reason),
            undelivered=[{"channel_id": c, "count": n} for c, n in sorted(reason.undelivered.items())],
            resumes=peer.resumes,
            channels=_session_counters(peer),
        )
        for reactor in self.reactors:
            self._call_reactor(reactor, "remove_peer", peer, peer, reason)
        redial = self._dialers.get(peer.node_id)
        if redial is not None and redial.persistent and not self._stopping:
            redial.start()  # a persistent peer gets a fresh session

    def _close_peer(self, peer: Peer, reason: Exception) -> None:
        if peer._protocol is not None:
            peer._protocol.close(reason)  # the session ends when the transport goes
        else:
            self._end_session(peer, reason)

    def _redial(self, peer: Peer) -> None:
        """The side that dialed re-dials a suspended session (specs/resume.md section 4)."""
        redial = self._dialers.get(peer.node_id)
        if redial is None:
            redial = self._dialers[peer.node_id] = _Redial(self, peer.node_id, [peer.address], persistent=False)
        redial.start()

    def _loop_stalled(self, proto, late: float) -> None:
        telemetry.emit(
            "loop_stalled",
            node_id=self.node_id,
            peer_id=proto.hello.node_id if proto.hello is not None else None,
            late=late,
        )

    def _peer_rejected(self, proto, hello, rejection: PeerRejected) -> None:
        self.refusals[rejection.reason] = self.refusals.get(rejection.reason, 0) + 1
        telemetry.emit(
            "peer_rejected",
            node_id=self.node_id,
            peer_id=hello.node_id if hello is not None else None,
            remote_address=proto.remote_address,
            reason=rejection.reason,
            message=str(rejection),
        )

    def _plaintext_refused(self, proto, rejection: PeerRejected) -> None:
        """A TLS listener refused a start before TLS (plaintext mconn bytes, a pre-hello
        where TLS first is required, a malformed pre-hello); mconn.tls answers with a
        plaintext close packet naming ``rejection.reason`` (specs/tls.md section 7)."""
        self._peer_rejected(proto, None, rejection)
        proto.end_reason = rejection

    def _protocol_error(self, proto, error) -> None:
        telemetry.emit(
            "protocol_error",
            node_id=self.node_id,
            peer_id=proto.peer.node_id if proto.peer is not None else None,
            remote_address=proto.remote_address,
            error_type=type(error).__name__,
            error=str(error),
        )

    def _route(self, channel_id: int, peer: Peer, message: bytes) -> None:
        try:
            self._receivers[channel_id](channel_id, peer, message)
        except Exception:
            telemetry.emit_failure(
                "reactor_error",
                node_id=self.node_id,
                reactor=type(self._reactor_by_channel[channel_id]).__name__,
                method="receive",
                peer_id=peer.node_id,
            )

    def _connection_lost(self, proto, reason: Exception) -> None:
        self.connections.discard(proto)
        self._release_ip(proto)
        peer = proto.peer
        duration = self.clock.seconds() - proto.started
        peer_id = proto.hello.node_id if proto.hello is not None else None
        telemetry.emit(
            "connection_lost",
            node_id=self.node_id,
            peer_id=peer_id,
            remote_address=proto.remote_address,
            direction="outbound" if proto.is_outbound else "inbound",
            reason_type=type(reason).__name__,
            reason=str(reason),
            duration=duration,
            bytes_sent=proto.core.bytes_sent,
            bytes_received=proto.core.bytes_received,
            channels=_channel_counters(proto.core),
            session_id=_session_of(proto),
        )
        if peer is not None and peer._protocol is proto:
            if self._resumable(reason):
                self._suspend_session(peer, reason)
            else:
                self._end_session(peer, reason)
        elif proto.resuming is not None and proto.resuming.state == CONNECTING:
            if isinstance(reason, PeerClosed) and reason.code in ENDS_SESSION:
                self._end_session(proto.resuming, reason)  # the node is going away: no resume
            else:
                proto.resuming.state = SUSPENDED  # this attempt failed; the dialer tries again
        if not proto.handshake.called:
            proto.handshake.errback(reason)
        for probe in list(self._probes.values()):
            if probe.newcomer is proto:
                probe.cancel()
                del self._probes[proto]
            elif probe.old is proto:
                probe.finish(alive=False)  # the old connection is gone: the newcomer may have it
        for entry in [e for e in self._closed_all if e[0] is proto]:
            self._closed_all.remove(entry)
            entry[1].callback(None)

    def _resumable(self, reason: Exception) -> bool:
        """A break that is not a close suspends the session (specs/resume.md section 1)."""
        return not self._stopping and self.config.resume_grace > 0 and isinstance(reason, (ConnectionLost, PongTimeout))

    def _call_reactor(self, reactor, method: str, peer: Peer, *args) -> None:
        """Call a reactor method; an exception is logged, and the node carries on."""
        try:
            callback = getattr(reactor, method, None)
            if callback is not None:
                callback(*args)
        except Exception:
            telemetry.emit_failure(
                "reactor_error",
                node_id=self.node_id,
                reactor=type(reactor).__name__,
                method=method,
                peer_id=peer.node_id,
            )

    def _emit_stats(self) -> None:
        """Log channel_stats for every peer, then ping each connected one, so that a busy
        link (which the keepalive never pings) has a round trip too (specs/connection.md
        section 3): the next tick logs it."""
        peers = list(self.peers.values())
        for peer in peers:
            for c in peer.stats.channels:
                telemetry.emit(
                    "channel_stats",
                    node_id=self.node_id,
                    peer_id=peer.node_id,
                    channel_id=c.channel_id,
                    priority=c.priority,
                    queue_depth=c.queue_depth,
                    bytes_sent=c.bytes_sent,
                    messages_sent=c.messages_sent,
                    bytes_received=c.bytes_received,
                    messages_received=c.messages_received,
                    accepted=c.accepted,
                    acked=c.acked,
                    delivered=c.delivered,
                    session_id=peer.session.id.hex(),
                    connection=peer.connects,
                    round_trip=peer.round_trip,
                )
        now = self.clock.seconds()
        for peer in peers:
            proto = peer._protocol
            if proto is not None and peer.state == CONNECTED:
                proto.core.probe(now)
                proto.pump()

    def _check_invariants(self) -> None:
        """Assert that the Switch's collections agree (tests call this)."""
        for node_id, peer in self.peers.items():
            assert peer.node_id == node_id and peer.state != CLOSED, f"peer table corrupt at {node_id}"
            if peer.state == CONNECTED:
                proto = peer._protocol
                assert proto in self.connections and proto.peer is peer, f"{node_id}: connected without a connection"
            else:
                assert peer._protocol is None, f"{node_id}: {peer.state} but holds a connection"
                assert self.config.resume_grace > 0, f"{node_id}: {peer.state} although resume is off"
        per_ip: dict[str, int] = {}
        for proto in self.connections:
            if proto.peer is not None:
                assert self.peers.get(proto.peer.node_id) is proto.peer, "a connection carries a forgotten Peer"
            if proto.ip_key is not None:
                per_ip[proto.ip_key] = per_ip.get(proto.ip_key, 0) + 1
        assert per_ip == self._connections_per_ip, f"per-IP counts {self._connections_per_ip} != live {per_ip}"
        pending = sum(1 for p in self.connections if not p.is_outbound and not p.handshake.called)
        assert pending == self._pending_inbound, f"{self._pending_inbound} pending handshakes counted, {pending} live"
        owned = {d.id for d in self.channels}
        assert owned == set(self._reactor_by_channel), "channel table corrupt"
        assert len(owned) == len(self.channels), "duplicate channel ids"


def _session_of(proto) -> str | None:
    """The session a connection carries, or was resuming; None (specs/telemetry.md connection_lost)."""
    peer = proto.peer if proto.peer is not None else proto.resuming
    return peer.session.id.hex() if peer is not None else None


def _channel_counters(core) -> list[dict]:
    return [
        {
            "channel_id": c.id,
            "bytes_sent": c.stats.bytes_sent,
            "messages_sent": c.stats.messages_sent,
            "bytes_received": c.stats.bytes_received,
            "messages_received": c.stats.messages_received,
        }
        for c in core.channels.values()
    ]


def _check_verdict(node_id: str, verdict) -> None:
    """``authorize`` must say True to let a peer in; anything else refuses it."""
    if verdict is not True:
        why = "refused it" if verdict is False else f"returned {verdict!r}, not True or False"
        raise AuthenticationError(f"authorize({node_id}) {why}")


def _authorize_failed(failure, node_id: str, timeout: float):
    if failure.check(PeerRejected):
        return failure
    if failure.check(defer.TimeoutError):
        raise PeerRejected("authorize_timeout", f"authorize({node_id}) did not answer within {timeout}s")
    error = failure.value
    raise AuthenticationError(f"authorize({node_id}) failed with {type(error).__name__}: {error}")


def _session_request(hello) -> SessionRequest | None:
    """The dialer's session request from its hello (None if it sent none)."""
    for tag, value in hello.fields:
        if tag == HelloTag.SESSION:
            return decode_session_request(value)
    return None


def _channel_change(peer: Peer, hello) -> str:
    """Why the channel set no longer matches the session's ('' if it does)."""
    before = {(c.id, c.priority) for c in peer.channels.values()}
    now = {(c.id, c.priority) for c in hello.channels}
    if before == now:
        return ""
    return "channels changed: " + ", ".join(
        f"{c:#04x} prio {p}" + (" added" if (c, p) in now else " removed") for c, p in sorted(before ^ now)
    )


def _session_counters(peer: Peer) -> list[dict]:
    session = peer.session
    return [
        {
            "channel_id": c,
            "accepted": session.accepted(c),
            "acked": session.acked(c),
            "delivered": session.delivered(c),
        }
        for c in sorted(session.channel_ids)
    ]


class _Probe:
    """Is the live connection of a session still there, now that a newcomer claims the
    node? A ping goes out on it; any bytes back within ``duplicate_probe_timeout`` say yes."""

    def __init__(self, switch: Switch, newcomer, peer: Peer) -> None:
        self.switch = switch
        self.newcomer = newcomer
        self.peer = peer
        self.old = peer._protocol
        self.old.core.probe(switch.clock.seconds())
        self.old.probe_answered = self._answered
        self.old.pump()
        self._timer = switch.clock.callLater(switch.config.duplicate_probe_timeout, self.finish, False)

    def _answered(self, old) -> None:
        self.finish(alive=True)

    def cancel(self) -> None:
        if self._timer.active():
            self._timer.cancel()
        if self.old.probe_answered == self._answered:
            self.old.probe_answered = None

    def finish(self, alive: bool) -> None:
        self.cancel()
        if self.switch._probes.get(self.newcomer) is self:
            self.switch._probe_done(self, alive)


class _Redial:
    """The Dialer of one node (or one address), and the ``dial`` calls waiting on it.

    Persistent ones live as long as the Switch and are started again after every break
    and every end of the session; the others end with the first session they make.
    """

    def __init__(self, switch: Switch, node_id: str | None, addresses, *, persistent: bool, initial: bool = False):
        self.switch = switch
        self.node_id = node_id
        self.persistent = persistent
        self.initial = initial
        self.ever_connected = False
        self._waiters: list[tuple[defer.Deferred, bool]] = []
        config = switch.config
        pool = AddressPool(
            addresses, retain_order=config.retain_address_order, ignore_discovered=config.ignore_discovered_addresses
        )
        self.dialer = Dialer(
            clock=switch.clock,
            connect=lambda address: switch._connect(address, node_id),
            pool=pool,
            reconnect_delay=lambda attempt: switch.reconnect_delay(attempt),
            max_reconnects=config.max_reconnects,
            choose_address=self._choose,
            on_attempt=self._attempted,
            on_connected=self._connected,
            on_give_up=self._gave_up,
        )

    def start(self) -> None:
        self.dialer.start()

    def stop(self, error: Exception) -> None:
        self.dialer.stop()
        self._fail_waiters(error, everyone=True)

    def first_session(self, retry: bool) -> defer.Deferred:
        d = defer.Deferred()
        self._waiters.append((d, retry))
        self.start()
        return d

    def set_pool(self, addresses) -> None:
        self.dialer.set_address_pool(addresses)

    def _choose(self, pool, last_info):
        hook = self.switch.choose_address
        return hook(pool, last_info) if hook is not None else None

    def _attempted(self, info: dict) -> None:
        switch = self.switch
        telemetry.emit("dial_attempt", node_id=switch.node_id, peer_id=self.node_id, **info)
        if info["result"] == "connected" or self.ever_connected or not self._waiters:
            return  # a re-dial of a session tries until max_reconnects or the grace ends
        state = self.dialer.pool.get(info["address"])
        error = state.last_error if state is not None and state.last_error is not None else ConnectionLost(info["error"])
        self._fail_waiters(error, everyone=False)
        if not self._waiters:
            self._forget()
            self.dialer.stop()

    def _connected(self, peer, state) -> None:
        self.ever_connected = True
        waiters, self._waiters = self._waiters, []
        for d, _ in waiters:
            d.callback(peer)
        if not self.persistent:
            self._forget()

    def _gave_up(self, reason: str) -> None:
        switch = self.switch
        telemetry.emit("dial_gave_up", node_id=switch.node_id, peer_id=self.node_id, reason=reason)
        self._forget()
        self._fail_waiters(DialGaveUp(self.node_id, reason), everyone=True)
        peer = switch.peers.get(self.node_id) if self.node_id is not None else None
        if peer is not None and peer.state in (SUSPENDED, CONNECTING):
            switch._end_session(peer, SessionRejected(f"gave up re-dialing: {reason}", peer.session.undelivered()))

    def _forget(self) -> None:
        switch = self.switch
        if self.node_id is not None and switch._dialers.get(self.node_id) is self:
            del switch._dialers[self.node_id]
        switch._initial_dials.discard(self)

    def _fail_waiters(self, error: Exception, *, everyone: bool) -> None:
        keep = []
        for d, retry in self._waiters:
            if everyone or not retry:
                d.errback(error)
            else:
                keep.append((d, retry))
        self._waiters = keep


def _with_node_id(address, node_id: str) -> PeerAddress:
    """``address`` (text or PeerAddress) as an address of ``node_id``.

    :raises ValueError: if it does not parse or names another node.
    """
    parsed = address if isinstance(address, PeerAddress) else parse_address(address)
    if parsed.node_id is not None and parsed.node_id != node_id:
        raise ValueError(f"address {address} names node {parsed.node_id}, not {node_id}")
    return dataclasses.replace(parsed, node_id=node_id)


def _cancelling(timer):
    def cancel(result):
        if timer.active():
            timer.cancel()
        return result

    return cancel
