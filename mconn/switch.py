"""Switch: the node's peer set and message router (specs/reactor-api.md).

The Switch owns the invariants between its collections: every channel id belongs to one
reactor (checked when it is built); a node id has at most one Peer; ``add_peer`` is
called on every reactor before any ``receive`` from that peer and ``remove_peer`` after
the last. ``_check_invariants`` asserts that the collections agree; tests call it.
"""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, serverFromString
from twisted.internet.task import LoopingCall

from mconn import telemetry
from mconn.address import parse_address
from mconn.config import Config
from mconn.connection import Connection
from mconn.errors import ConnectionClosed, PeerIdMismatch, PeerRejected
from mconn.handshake import make_hello
from mconn.node_key import NodeKey
from mconn.peer import Peer
from mconn.protocol import MConnectionFactory


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
        if self._stats_loop is not None and self._stats_loop.running:
            self._stats_loop.stop()
        waits = [defer.maybeDeferred(port.stopListening) for port in self._ports]
        self._ports = []
        for proto in list(self.connections):
            d = defer.Deferred()
            self._closed_all.append((proto, d))
            waits.append(d)
            proto.close(ConnectionClosed("shutdown", "the node is stopping"))
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
        factory = MConnectionFactory(self, is_outbound=True, expected_node_id=target.node_id)
        d = endpoint.connect(factory)
        return d.addCallback(lambda proto: proto.handshake)

    def broadcast(self, channel_id: int, message: bytes) -> defer.Deferred:
        """``send`` to every connected peer; fires with {node_id: bool}."""
        peers = list(self.peers.values())
        d = defer.gatherResults([p.send(channel_id, message) for p in peers])
        return d.addCallback(lambda results: {p.node_id: ok for p, ok in zip(peers, results)})

    # -- called by MConnectionProtocol ---------------------------------------------

    def _new_connection_core(self, now: float) -> Connection:
        hello = make_hello(
            node_id=self.node_id,
            channels=self.channels,
            max_packet_payload=self.config.max_packet_payload,
            listen_address=self.listen_address,
        )
        return Connection(config=self.config, hello=hello, channels=self.channels, now=now)

    def _connection_made(self, proto) -> None:
        self.connections.add(proto)
        telemetry.emit(
            "connection_made",
            node_id=self.node_id,
            direction="outbound" if proto.is_outbound else "inbound",
            remote_address=proto.remote_address,
        )

    def _hello_received(self, proto, event) -> Peer:
        hello = event.hello
        if hello.node_id == self.node_id:
            raise PeerRejected("self", f"connected to ourselves (node id {self.node_id})")
        if proto.expected_node_id is not None and proto.expected_node_id != hello.node_id:
            raise PeerIdMismatch(proto.expected_node_id, hello.node_id)
        existing = self.peers.get(hello.node_id)
        if existing is not None:
            raise PeerRejected(
                "duplicate",
                f"node {hello.node_id} is already connected ({existing.remote_address}, "
                f"{'outbound' if existing.is_outbound else 'inbound'})",
            )
        same_direction = sum(1 for p in self.peers.values() if p.is_outbound == proto.is_outbound)
        limit = self.config.max_outbound_peers if proto.is_outbound else self.config.max_inbound_peers
        if same_direction >= limit:
            kind = "outbound" if proto.is_outbound else "inbound"
            raise PeerRejected(f"{kind}_limit", f"already {same_direction} {kind} peers (max_{kind}_peers {limit})")
        peer = Peer(
            protocol=proto,
            hello=hello,
            is_outbound=proto.is_outbound,
            remote_address=proto.remote_address,
            clock=self.clock,
            config=self.config,
        )
        self.peers[peer.node_id] = peer
        proto.peer = peer
        telemetry.emit(
            "handshake_done",
            node_id=self.node_id,
            peer_id=peer.node_id,
            remote_address=proto.remote_address,
            direction="outbound" if peer.is_outbound else "inbound",
            max_packet_payload=event.max_packet_payload,
            channels=[c.id for c in hello.channels],
            listen_address=hello.listen_address,
        )
        for reactor in self.reactors:
            self._call_reactor(reactor, "add_peer", peer, peer)
        if not proto.handshake.called:
            proto.handshake.callback(peer)
        return peer

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
        telemetry.emit(
            "connection_lost",
            node_id=self.node_id,
            peer_id=peer.node_id if peer is not None else None,
            remote_address=proto.remote_address,
            direction="outbound" if proto.is_outbound else "inbound",
            reason_type=type(reason).__name__,
            reason=str(reason),
            duration=duration,
            bytes_sent=proto.core.bytes_sent,
            bytes_received=proto.core.bytes_received,
            channels=_channel_counters(proto.core),
        )
        if peer is not None:
            peer.state = "closed"
            peer._fail_waiting()
            if self.peers.get(peer.node_id) is peer:
                del self.peers[peer.node_id]
            for reactor in self.reactors:
                self._call_reactor(reactor, "remove_peer", peer, peer, reason)
        if not proto.handshake.called:
            proto.handshake.errback(reason)
        for entry in [e for e in self._closed_all if e[0] is proto]:
            self._closed_all.remove(entry)
            entry[1].callback(None)

    def _call_reactor(self, reactor, method: str, peer: Peer, *args) -> None:
        """Call a reactor method; an exception is logged, and the node carries on."""
        try:
            getattr(reactor, method)(*args)
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
