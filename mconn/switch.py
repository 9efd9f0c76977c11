"""Switch: the node's peer set and message router (specs/reactor-api.md).

The Switch owns the invariants between its collections: every channel id belongs to one
reactor (checked when it is built); a node id has at most one Peer; ``add_peer`` is
called on every reactor before any ``receive`` from that peer and ``remove_peer`` after
the last. ``_check_invariants`` asserts that the collections agree; tests call it.
"""

from __future__ import annotations

import functools
import os

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, serverFromString
from twisted.internet.task import LoopingCall

from mconn import telemetry
from mconn.address import parse_address
from mconn.config import Config
from mconn.connection import Connection
from mconn.dialer import AddressPool, Dialer, default_reconnect_delay
from mconn.errors import (
    ConnectionClosed,
    ConnectionLost,
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
from mconn.wire import (
    SESSION_ID_BYTES,
    HelloTag,
    SessionAnswer,
    SessionRequest,
    decode_session_request,
    encode_session_request,
)


class Switch(Service):
    """Routes every inbound message to the Reactor that owns its channel.

    :param reactors: the node's reactors; their channel ids must not overlap.
    :param node_key: the node's identity (a fresh one if None).
    :param config: a Config (defaults if None).
    :param clock: the Twisted reactor to use (``twisted.internet.reactor`` if None).
    """

    def __init__(self, reactors, *, node_key: NodeKey | None = None, config: Config | None = None, clock=None) -> None:
        if clock is None:
            from twisted.internet import reactor as clock
        self.clock = clock
        self.config = config or Config()
        self.node_key = node_key or NodeKey.generate()
        self.node_id = self.node_key.node_id
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
        self._closed_all = []
        self._grace_timers = {}
        self._dialers = {}
        self._stopping = False

    # -- service -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        if self.config.stats_interval:
            self._stats_loop = LoopingCall(self._emit_stats)
            self._stats_loop.clock = self.clock
            self._stats_loop.start(self.config.stats_interval, now=False)

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
        for dialer in list(self._dialers.values()):
            dialer.stop()
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
        endpoint = serverFromString(self.clock, endpoint_description)
        d = endpoint.listen(MConnectionFactory(self, is_outbound=False))

        def listening(port):
            self._ports.append(port)
            host = port.getHost()
            address = f"[{host.host}]:{host.port}" if ":" in host.host else f"{host.host}:{host.port}"
            if not self.listen_address:
                self.listen_address = address
            telemetry.emit("listening", node_id=self.node_id, address=address)
            return port

        return d.addCallback(listening)

    def dial(self, address: str) -> defer.Deferred:
        """Connect to ``ID@host:port`` or ``host:port``.

        :returns: a Deferred firing with the Peer once the handshake is accepted, or
            failing with PeerRejected (self, duplicate, id mismatch, limits), a
            RemoteProtocolError, or the connection error.
        """
        try:
            target = parse_address(address)
        except ValueError:
            return defer.fail()
        if target.node_id == self.node_id:
            return defer.fail(PeerRejected("self", f"refusing to dial ourselves ({address})"))
        if target.node_id is not None and target.node_id in self.peers:
            return defer.fail(PeerRejected("duplicate", f"node {target.node_id} is already connected"))
        endpoint = HostnameEndpoint(self.clock, target.host, target.port, timeout=self.config.dial_timeout)
        factory = MConnectionFactory(self, is_outbound=True, expected_node_id=target.node_id, address=target)
        d = endpoint.connect(factory)
        return d.addCallback(lambda proto: proto.handshake)

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

    # -- sessions (specs/resume.md) ------------------------------------------------

    def _hello_received(self, proto, event) -> None:
        """The peer's hello: the listener decides the session now; the dialer waits."""
        hello = event.hello
        if hello.node_id == self.node_id:
            raise PeerRejected("self", f"connected to ourselves (node id {self.node_id})")
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
            elif existing.state == CONNECTED:
                raise PeerRejected(
                    "duplicate",
                    f"node {hello.node_id} is already connected ({existing.remote_address}, "
                    f"{'outbound' if existing.is_outbound else 'inbound'})",
                )
            refusal = refusal or ("unknown session" if request is not None and request.resume else "new session")
            self._end_session(existing, SessionRejected(refusal, existing.session.undelivered()))
        elif request is not None and request.resume:
            refusal = "unknown session (expired, or this node restarted)"
        self._check_limits(proto)
        session_id = request.session_id if request is not None else os.urandom(SESSION_ID_BYTES)
        proto.core.send_session_answer(SessionAnswer(session_id=session_id, resumed=False, reason=refusal))
        self._start_session(proto, hello, session_id, refusal)

    def _session_answered(self, proto, answer: SessionAnswer) -> None:
        """The listener's answer to our session request."""
        request, resuming = proto.session_request, proto.resuming
        if not proto.is_outbound or proto.peer is not None or request is None or proto.hello is None:
            raise UnexpectedPacket("session packet where none was asked for")
        if answer.session_id != request.session_id:
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
            self._end_session(resuming, SessionRejected(reason, resuming.session.undelivered()))
        existing = self.peers.get(proto.hello.node_id)
        if existing is not None:
            raise PeerRejected("duplicate", f"node {proto.hello.node_id} is already connected")
        self._check_limits(proto)
        self._start_session(proto, proto.hello, request.session_id, answer.reason)

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
        return peer

    def _resume(self, proto, peer: Peer, peer_delivered: dict, *, answer: bool) -> None:
        old = peer._protocol
        if old is not None and old is not proto:
            # A newcomer that proves the session takes over the live transport at once.
            old.peer = None
            old.end_reason = ConnectionClosed("replaced", "the session moved to a new connection")
            old.transport.abortConnection()
            peer._suspend()
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

    def _suspend_session(self, peer: Peer, reason: Exception) -> None:
        peer._suspend()
        telemetry.emit(
            "session_suspended",
            node_id=self.node_id,
            peer_id=peer.node_id,
            session_id=peer.session.id.hex(),
            reason_type=type(reason).__name__,
            reason=str(reason),
            grace=self.config.resume_grace,
        )
        self._grace_timers[peer.node_id] = self.clock.callLater(self.config.resume_grace, self._grace_expired, peer)
        for reactor in self.reactors:
            self._call_reactor(reactor, "peer_suspended", peer, peer)
        if peer.address is not None:
            self._redial(peer)

    def _grace_expired(self, peer: Peer) -> None:
        self._grace_timers.pop(peer.node_id, None)
        if peer.state in (SUSPENDED, CONNECTING):
            self._end_session(peer, SessionExpired(self.config.resume_grace, peer.session.undelivered()))

    def _stop_waiting(self, peer: Peer, *, dialer: bool = True) -> None:
        timer = self._grace_timers.pop(peer.node_id, None)
        if timer is not None and timer.active():
            timer.cancel()
        if dialer:
            running = self._dialers.pop(peer.node_id, None)
            if running is not None:
                running.stop()

    def _end_session(self, peer: Peer, reason: Exception) -> None:
        """The session is over: the reactors get remove_peer with the reason."""
        if peer.state == CLOSED:
            return
        self._stop_waiting(peer)
        if not reason.undelivered:
            reason.undelivered = peer.session.undelivered()
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

    def _close_peer(self, peer: Peer, reason: Exception) -> None:
        if peer._protocol is not None:
            peer._protocol.close(reason)  # the session ends when the transport goes
        else:
            self._end_session(peer, reason)

    def _redial(self, peer: Peer) -> None:
        """The side that dialed re-dials a suspended session (specs/resume.md section 4)."""

        def attempt(address):
            endpoint = HostnameEndpoint(self.clock, address.host, address.port, timeout=self.config.dial_timeout)
            factory = MConnectionFactory(
                self, is_outbound=True, expected_node_id=peer.node_id, resuming=peer, address=peer.address
            )
            return endpoint.connect(factory).addCallback(lambda proto: proto.handshake)

        dialer = Dialer(
            clock=self.clock,
            connect=attempt,
            pool=AddressPool([peer.address], retain_order=True),
            reconnect_delay=functools.partial(default_reconnect_delay, max_delay=self.config.max_reconnect_delay),
            max_reconnects=self.config.max_reconnects,
            on_attempt=lambda info: telemetry.emit("dial_attempt", node_id=self.node_id, peer_id=peer.node_id, **info),
            on_connected=lambda result, state: self._dialers.pop(peer.node_id, None),
            on_give_up=lambda reason: self._dialers.pop(peer.node_id, None),
        )
        self._dialers[peer.node_id] = dialer
        dialer.start()

    def _peer_rejected(self, proto, hello, rejection: PeerRejected) -> None:
        telemetry.emit(
            "peer_rejected",
            node_id=self.node_id,
            peer_id=hello.node_id,
            remote_address=proto.remote_address,
            reason=rejection.reason,
            message=str(rejection),
        )

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
        )
        if peer is not None and peer._protocol is proto:
            if self._resumable(reason):
                self._suspend_session(peer, reason)
            else:
                self._end_session(peer, reason)
        elif proto.resuming is not None and proto.resuming.state == CONNECTING:
            proto.resuming.state = SUSPENDED  # this attempt failed; the dialer tries again
        if not proto.handshake.called:
            proto.handshake.errback(reason)
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
        for peer in list(self.peers.values()):
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
                )

    def _check_invariants(self) -> None:
        """Assert that the Switch's collections agree (tests call this)."""
        live = {p.peer for p in self.connections if p.peer is not None}
        assert set(self.peers.values()) <= live, "a Peer outlived its connection"
        for node_id, peer in self.peers.items():
            assert peer.node_id == node_id and peer.state == "connected", f"peer table corrupt at {node_id}"
        owned = {d.id for d in self.channels}
        assert owned == set(self._reactor_by_channel), "channel table corrupt"
        assert len(owned) == len(self.channels), "duplicate channel ids"


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
