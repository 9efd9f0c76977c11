"""Switch: the node's reactors, channel table and message router (specs/reactor-api.md).

The Switch owns the invariants between its parts: every channel id belongs to one
reactor (checked when it is built); a node id has at most one Peer; ``add_peer`` is
called on every reactor before any ``receive`` from that peer and ``remove_peer`` after
the last. The other jobs are its parts' (CometBFT splits its switch the same way into
transport, peer set and switch):

* ``mconn.switch.connection_set.ConnectionSet``: the live connections, the owner each connection
  talks to (``mconn.net.protocol.IConnectionOwner``);
* ``mconn.core.admission.Admission``: per-address and pending-handshake limits, peer limits;
* ``mconn.switch.authorize.Authorizer``: ``allowed_peers`` and the ``authorize`` hook;
* ``mconn.switch.session_manager.SessionManager``: the peer table and the session lifecycle, by the
  transition table of ``mconn.core.session_table``;
* ``mconn.switch.persistent.PersistentDialing``: persistent peers and re-dials;
* ``mconn.switch.routing.ReactorSet``: the reactors, their channels and names, their lifecycle,
  and every call into them with the error policy (specs/reactor-api.md sections 2-4).

``_check_invariants`` asks each part to check its own; tests call it.
"""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, serverFromString
from twisted.internet.task import LoopingCall

from mconn.switch import durable, telemetry
from mconn.core.address import PeerAddress, parse_address
from mconn.core.admission import Admission
from mconn.switch.authorize import Authorizer
from mconn.switch.bans import BanList
from mconn.config import Config
from mconn.switch.connection_set import ConnectionSet
from mconn.switch.dialer import default_reconnect_delay
from mconn.errors import ConnectionClosed, PeerRejected
from mconn.core.node_info import NodeInfo
from mconn.core.node_key import NodeKey
from mconn.switch.peer import Peer
from mconn.switch.persistent import PersistentDialing
from mconn.net.protocol import IConnectionOwner, MConnectionFactory
from mconn.switch.routing import ReactorSet
from mconn.core.session_table import PeerState
from mconn.net.socket_options import prepare_listening
from mconn.switch.session_manager import SessionManager
from mconn.net.tls_transport import tls_client_endpoint, tls_server_factory
from mconn.net.websocket_endpoints import dial_endpoint

#: Peers a stats tick handles per reactor turn: over many peers the tick is spread over
#: turns and never holds the event loop for long (specs/telemetry.md, ``channel_stats``).
STATS_SLICE = 256


class Switch(Service):
    """Routes every inbound message to the Reactor that owns its channel.

    :param reactors: the node's reactors, a list or a dict ``{name: reactor}``; their
        channel ids must not overlap, nor their names (``switch.reactor(name)``).
    :param node_key: the node's identity (a fresh one if None).
    :param config: a Config (defaults if None).
    :param clock: the Twisted reactor to use (``twisted.internet.reactor`` if None).
    :param reconnect_delay: ``reconnect_delay(attempt) -> seconds`` between dial attempts
        (``mconn.switch.dialer.default_reconnect_delay`` capped at ``max_reconnect_delay`` if None).
    :param choose_address: ``choose_address(pool, last_info) -> (address, delay)``, the
        hook that may pick the next address to dial (``mconn.switch.dialer.Dialer``).
    :param tls: a ``mconn.net.tls.TLSOptions``: every connection, both ways, runs TLS first and
        each peer's node id is proven by its certificate (specs/tls.md). None: plaintext.
    :param allowed_peers: node ids that may join (empty: anyone who proves a key).
    :param authorize: ``authorize(node_id, address, certificate) -> bool | Deferred[bool]``,
        asked once the node id is proven and before ``add_peer`` or a resume, inbound and
        outbound (specs/tls.md section 6).
    :param node_info: a ``mconn.NodeInfo`` (network, protocol versions, moniker, other),
        announced in every hello; every peer must then send a compatible one
        (specs/handshake.md section 6). None: nothing announced, nothing required.
    """

    #: The session lifecycle (set last in __init__: the parts built before it reach it
    #: through lambdas).
    _sessions: SessionManager

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
        node_info: NodeInfo | None = None,
    ) -> None:
        if node_info is not None and not isinstance(node_info, NodeInfo):
            raise TypeError(f"node_info must be a mconn.NodeInfo or None, got {type(node_info).__name__}")
        if clock is None:
            from twisted.internet import reactor as clock
        self.clock = clock
        self._config = config = config or Config()
        tls_key = tls.node_key if tls is not None else None
        if node_key is not None and tls_key is not None and node_key.node_id != tls_key.node_id:
            raise ValueError(
                f"node_key is node {node_key.node_id} but the TLS certificate key is node {tls_key.node_id}"
            )
        self.node_key = node_key or tls_key or NodeKey.generate()
        self._node_id = node_id = self.node_key.node_id
        self.tls = tls
        #: The reactors, their channel table and names, and every call into them.
        self._reactor_set = reactor_set = ReactorSet(reactors, self, self._decode_failed)
        self.reactors = reactor_set.reactors
        self.channels = reactor_set.channels
        #: Exceptions that escaped reactors (and failed receive Deferreds), by reactor name.
        self.reactor_errors: dict[str, int] = reactor_set.errors
        self.listen_address = ""
        self._ports: list = []
        self._stats_loop: LoopingCall | None = None
        #: The stats tick's state: node id -> (sample_key, channel_samples) as last taken
        #: (this tick's, and the previous tick's), and the next slice of a tick under way.
        self._stats_samples: dict = {}
        self._stats_previous: dict = {}
        self._stats_call = None
        #: Our channels and their ids, which every session of ours has, for the tick.
        self._stats_channels = (tuple(self.channels), tuple(d.id for d in self.channels))
        #: This run's random id, logged in node_started at startService or the first listen.
        self.run_id: str | None = None
        self.reconnect_delay = reconnect_delay or self._default_reconnect_delay
        self.choose_address = choose_address
        self._admission = Admission(config)
        #: Node ids marked bad (``mark_bad``): refused and not dialed until their bans end.
        self.bans = BanList(clock)
        self._authorizer = Authorizer(
            allowed_peers,
            authorize,
            tls=tls is not None,
            clock=clock,
            timeout=config.handshake_timeout,
            bans=self.bans,
            peers=lambda: self.peers,
            config=lambda: self.config,
        )
        self._connections = ConnectionSet(
            node_id=node_id,
            clock=clock,
            config=config,
            channels=self.channels,
            tls=tls,
            admission=self._admission,
            authorizer=self._authorizer,
            listen_address=lambda: self.listen_address,
            node_info=node_info,
        )
        self._dialing = PersistentDialing(
            node_id=node_id,
            clock=clock,
            config=config,
            connect=self._connect,
            session_for=lambda peer_id: self._sessions.peers.get(peer_id),
            gave_up=lambda peer_id, why: self._sessions.gave_up(peer_id, why),
            failed_attempt=lambda peer_id: self._sessions.redial_failed(peer_id),
            reconnect_delay=lambda attempt: self.reconnect_delay(attempt),
            choose_address=lambda: self.choose_address,
            listen_addresses=self._listening,
        )
        self._sessions = SessionManager(
            node_id=node_id,
            clock=clock,
            config=config,
            channels=self.channels,
            admission=self._admission,
            dialing=self._dialing,
            reactors=reactor_set,
            dialing_to=self._connections.dialing_to,
        )
        self._connections.sessions = self._sessions

    def __conform__(self, interface):
        """``IConnectionOwner(switch)``: the part every connection of this Switch talks to."""
        if interface is IConnectionOwner:
            return self._connections
        return None

    # -- what the parts hold ---------------------------------------------------------

    @property
    def node_id(self) -> str:
        """This node's id (its key's); every part names the node by it."""
        return self._node_id

    @node_id.setter
    def node_id(self, node_id: str) -> None:
        self._node_id = node_id
        for part in (self._connections, self._sessions, self._dialing):
            part.node_id = node_id

    @property
    def config(self) -> Config:
        """The Config; setting it applies to every part: to connections and sessions made
        from then on, and at once to the node-wide budget of unacknowledged bytes."""
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        self._config = config
        for part in (self._admission, self._connections, self._sessions, self._dialing):
            part.config = config
        self._authorizer.timeout = config.handshake_timeout

    @property
    def peers(self) -> dict:
        """Sessions by node id (connected, suspended or connecting; never closed)."""
        return self._sessions.peers

    @property
    def connections(self) -> set:
        """Every live connection, handshaking or not."""
        return self._connections.live

    @property
    def node_counters(self) -> dict[str, dict[str, int]]:
        """node id -> counters that outlive sessions (PeerStats, status page)."""
        return self._sessions.node_counters

    @property
    def node_info(self) -> NodeInfo | None:
        """The NodeInfo this node announces and requires compatibility with, or None."""
        return self._connections.node_info

    @property
    def refusals(self) -> dict[str, int]:
        """Connections refused, by close code: before a Connection was built (``pending_limit``,
        ``ip_limit``, ``pending_group_limit``: connection_refused), a pending handshake that
        gave way (``pending_evicted``) or after the hello (peer_rejected: ``duplicate``,
        ``unproven``, ``session_held``, a peer limit, ...)."""
        return self._admission.refusals

    @property
    def allowed_peers(self) -> set:
        """Node ids that may join (empty: anyone); a set that may be changed at any time."""
        return self._authorizer.allowed_peers

    @allowed_peers.setter
    def allowed_peers(self, node_ids) -> None:
        self._authorizer.allowed_peers = set(node_ids)

    @property
    def authorize(self):
        """The ``authorize`` hook, or None."""
        return self._authorizer.hook

    @authorize.setter
    def authorize(self, hook) -> None:
        self._authorizer.hook = hook

    # -- service -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._begin_run()
        self._reactor_set.start()
        if self.config.session_store and self._sessions.store is None:
            self._restore_sessions()
        if self.config.stats_interval:
            self._stats_loop = LoopingCall(self._emit_stats)
            self._stats_loop.clock = self.clock
            self._stats_loop.start(self.config.stats_interval, now=False)

    def _restore_sessions(self) -> None:
        """Open the session store and restore the sessions it holds, suspended, each
        with its grace from now (specs/resume.md section 9.2). A store of another node
        key refuses to open: its error stops the start."""
        store = durable.open_store(self.config, self.node_id, self.channels, self.clock)
        self._sessions.store = store
        reactor_set = self._reactor_set
        self._sessions.restore(
            store.load(), lambda peer_id, session_id: durable.committed_counts(reactor_set, peer_id, session_id)
        )

    def _close_store(self, _) -> defer.Deferred:
        """Commit what is written and close the session store (a dormant session stays in
        it: the peer holds it too, and the next start resumes it)."""
        store, self._sessions.store = self._sessions.store, None
        return store.close()

    def _begin_run(self) -> None:
        """Log node_started before this Switch's first event (a node may listen first)."""
        if self.run_id is None:
            self.run_id = telemetry.node_started(self.node_id, self.node_info)

    def stopService(self) -> defer.Deferred:
        """Stop listening, close every connection with a close packet, wait until gone."""
        super().stopService()
        if self._stats_loop is not None and self._stats_loop.running:
            self._stats_loop.stop()
        if self._stats_call is not None and self._stats_call.active():
            self._stats_call.cancel()
        waits = [defer.maybeDeferred(port.stopListening) for port in self._ports]
        self._ports = []
        self._sessions.stop()
        self._dialing.stop()
        # One reason per connection: the session's end records its undelivered counts on it.
        closes = self._connections.close_all(lambda: ConnectionClosed("shutdown", "the node is stopping"))
        # stop_reactor follows the last session, not the ports: with no connection it runs
        # now, so a node whose start failed stops its reactors before it exits.
        closed = defer.DeferredList(closes, consumeErrors=True).addCallback(lambda _: self._reactor_set.stop())
        if self._sessions.store is not None:  # after the last session's end is written
            closed.addCallback(self._close_store)
        return defer.DeferredList([*waits, closed], consumeErrors=True).addCallback(lambda _: None)

    # -- listening and dialing -----------------------------------------------------

    def listen(self, endpoint_description: str) -> defer.Deferred:
        """Accept peers on a Twisted server endpoint string, e.g. ``tcp:0:interface=127.0.0.1``.

        :returns: a Deferred firing with the IListeningPort. ``node_started`` is logged
            once the port is bound: a node whose port is in use never started. A listen
            that fails on a Switch not started, with nothing else open, undoes the
            ``start_reactor`` it ran: ``stop_reactor`` runs before the Deferred fails.
        """
        if self._reactor_set.started:
            return self._listen(endpoint_description)
        self._reactor_set.start()
        try:
            d = self._listen(endpoint_description)
        except Exception:  # a description serverFromString does not take
            self._unstart_reactors()
            raise
        return d.addErrback(self._unstart_reactors)

    def _unstart_reactors(self, failure=None):
        """A listen that started the reactors failed: stop them again, unless the Switch
        has been started since or holds a port, a session or a connection."""
        if not (self.running or self._ports or self.peers or self.connections):
            self._reactor_set.stop()
        return failure

    def _listen(self, endpoint_description: str) -> defer.Deferred:
        endpoint = serverFromString(self.clock, endpoint_description)
        factory = MConnectionFactory(self, is_outbound=False)
        if self.tls is not None:  # TLS first; a plaintext start gets a close packet (specs/tls.md)
            try:
                factory = tls_server_factory(
                    self.tls,
                    factory,
                    clock=self.clock,
                    on_plaintext=self._connections.plaintext_refused,
                    close_linger=self.config.close_linger,
                )
            except ValueError:
                return defer.fail()
        d = endpoint.listen(factory)

        def listening(port):
            self._begin_run()
            prepare_listening(port, self.config)  # options its connections inherit need not be set again
            self._ports.append(port)
            address = _address_of(port)
            if not self.listen_address:
                self.listen_address = address
            telemetry.emit("listening", node_id=self.node_id, address=address)
            return port

        return d.addCallback(listening)

    def _listening(self) -> list[str]:
        """``host:port`` of every port this Switch listens on (and the announced one)."""
        announced = [self.listen_address] if self.listen_address else []
        return announced + [_address_of(port) for port in self._ports]

    def dial(
        self,
        address: str,
        *,
        persistent: bool = False,
        retry_initial_dial: bool | None = None,
        unconditional: bool = False,
    ) -> defer.Deferred:
        """Connect to ``ID@host:port`` or ``host:port`` (specs/reactor-api.md section 6.3).

        :param persistent: keep this node connected for the Switch's lifetime: it is
            dialed, with the reconnect backoff, until a session is up, and after any
            break or end of the session it is dialed again, over its address pool
            (specs/resume.md section 7.1). Needs the node id. Only a permanent refusal of
            every address (``mconn.switch.dialer.is_not_retried``: another node id,
            unauthorized, incompatible node info, TLS required), ``Config.max_reconnects``
            failed attempts in a row (if set), ``stop_dialing`` or ``stopService`` end it.
        :param retry_initial_dial: a non-persistent dial keeps trying with the reconnect
            backoff instead of failing at the first error (``Config.retry_initial_dial``
            if None). A persistent dial always does: False with ``persistent`` fails
            with ValueError.
        :param unconditional: this node's sessions bypass the peer limits from now on
            (added to ``Config.unconditional_peers``). Needs the node id.
        :returns: a Deferred firing with the Peer once a session is up (at once if the
            node has one and ``persistent``). A persistent or retrying dial fails only
            with DialGaveUp (``max_reconnects``; every address banned, the refusal that
            banned the last one as its ``__cause__``; ``stop_dialing``; ``stopService``).
            A plain dial fails at its first error: PeerRejected (self, duplicate, id
            mismatch, limits), PeerClosed (the other side refused us), a
            RemoteProtocolError, or the connection error.
        """
        try:
            target = parse_address(address)
        except ValueError:
            return defer.fail()
        if target.node_id == self.node_id:
            return defer.fail(PeerRejected("self", f"refusing to dial ourselves ({address})"))
        if persistent and target.node_id is None:
            return defer.fail(ValueError(f"a persistent peer needs its node id (ID@host:port), got {address!r}"))
        if persistent and retry_initial_dial is False:
            return defer.fail(
                ValueError(
                    f"retry_initial_dial=False does not apply to a persistent dial of {address!r}: a persistent"
                    " peer is dialed until it answers; dial with persistent=False for one attempt"
                )
            )
        if unconditional:
            if target.node_id is None:
                return defer.fail(
                    ValueError(f"an unconditional peer needs its node id (ID@host:port), got {address!r}")
                )
            self.config = self.config.replace(unconditional_peers=self.config.unconditional_peers | {target.node_id})
        self._reactor_set.start()
        retry = self.config.retry_initial_dial if retry_initial_dial is None else retry_initial_dial
        return self._dialing.dial(target, persistent=persistent, retry=retry)

    def set_address_pool(self, node_id: str, addresses) -> None:
        """Make ``addresses`` the address pool of the persistent peer ``node_id``.

        Addresses in both the old and the new pool keep what dialing them taught
        (failures, bans); the count of failed attempts toward ``max_reconnects`` starts
        again (NATS's set_server_pool).

        :raises KeyError: if ``node_id`` is not a persistent peer.
        :raises ValueError: for an address that does not parse or names another node.
        """
        self._dialing.set_pool(node_id, addresses)

    def stop_dialing(self, node_id: str) -> None:
        """Forget that ``node_id`` is persistent: no more dials (its session goes on)."""
        self._dialing.stop_dialing(node_id)

    def address_pool(self, node_id: str):
        """The AddressPool of ``node_id`` (persistent or being re-dialed), or None."""
        return self._dialing.pool(node_id)

    def _default_reconnect_delay(self, attempt: int) -> float:
        return default_reconnect_delay(attempt, max_delay=self.config.max_reconnect_delay)

    def _endpoint(self, target: PeerAddress):
        """The client endpoint for one dial attempt (tests on a memory network replace it).

        HostnameEndpoint resolves the host on every attempt and tries each of its
        addresses, all within ``dial_timeout``.
        """
        if target.scheme != "tcp":  # ws:// and wss://, maybe through an HTTP proxy (specs/websocket.md)
            return dial_endpoint(target, clock=self.clock, config=self.config, tls=self.tls)
        bind = (self.config.local_address, 0) if self.config.local_address else None
        endpoint = HostnameEndpoint(
            self.clock, target.host, target.port, timeout=self.config.dial_timeout, bindAddress=bind
        )
        if self.tls is not None:
            endpoint = tls_client_endpoint(
                self.tls, endpoint, target.host, clock=self.clock, close_linger=self.config.close_linger
            )
        return endpoint

    def _connect(self, target: PeerAddress, node_id: str | None) -> defer.Deferred:
        """One dial attempt; fires with the Peer once its session is up (new or resumed)."""
        try:
            self._authorizer.check_dial(target, node_id)  # a banned node, an IP address in use
        except PeerRejected:
            return defer.fail()
        peer = self.peers.get(node_id) if node_id is not None else None
        if peer is not None and peer.state is PeerState.CONNECTED:
            return defer.succeed(peer)  # a connection from that node won meanwhile
        resuming = peer if peer is not None and peer.state in (PeerState.SUSPENDED, PeerState.CONNECTING) else None
        factory = MConnectionFactory(
            self, is_outbound=True, expected_node_id=node_id, resuming=resuming, address=target
        )
        d = self._endpoint(target).connect(factory)
        return d.addCallback(lambda protocol: protocol.handshake)

    def broadcast(self, channel_id: int, message: bytes) -> defer.Deferred:
        """``send`` to every connected peer; fires with {node_id: bool}."""
        peers = list(self.peers.values())
        d = defer.gatherResults([p.send(channel_id, message) for p in peers])
        return d.addCallback(lambda results: {p.node_id: ok for p, ok in zip(peers, results, strict=True)})

    def try_broadcast(self, channel_id: int, message: bytes, *, exclude=None) -> dict[str, bool]:
        """``try_send`` to every Peer in ``peers`` but ``exclude`` (a Peer or node id,
        e.g. the one a gossiped message came from): {node_id: accepted}, never waiting."""
        skip = getattr(exclude, "node_id", exclude)
        return {
            node_id: peer.try_send(channel_id, message) for node_id, peer in list(self.peers.items()) if node_id != skip
        }

    def num_peers(self) -> tuple[int, int]:
        """(outbound, inbound) sessions whose transport is up: suspended and connecting
        ones are left out (``len(peers)`` counts them)."""
        outbound = inbound = 0
        for peer in self.peers.values():
            if peer.state is PeerState.CONNECTED:
                if peer.is_outbound:
                    outbound += 1
                else:
                    inbound += 1
        return outbound, inbound

    def reactor(self, name: str):
        """The reactor called ``name`` (its ``name``, its key in a dict given to the
        Switch, or its class name). :raises KeyError: naming the known names."""
        return self._reactor_set.reactor(name)

    def mark_good(self, peer) -> None:
        """Vouch for ``peer`` (CometBFT's MarkPeerAsGood): every reactor's ``mark_good``
        is called; the PEX reactor's moves it to its address book's tried table."""
        self._reactor_set.mark_good(peer)

    def mark_bad(self, peer, seconds: float, reason: str = "") -> float:
        """Ban ``peer`` (a Peer or a node id) for ``seconds``: its session ends now (a close
        packet with the text ``banned for Ns: reason``), its hellos are refused with
        ``PeerRejected("banned")`` inbound and outbound, and it is not dialed (a dial
        fails at once with that error) until the ban ends (specs/reactor-api.md 6.5).

        :returns: the clock time the ban ends.
        :raises ValueError: for a ``seconds`` that is not a positive finite number.
        """
        node_id = getattr(peer, "node_id", peer)
        until = self.bans.ban(node_id, seconds, reason)
        session = self.peers.get(node_id)
        if session is not None:
            session.close(f"banned for {seconds}s" + (f": {reason}" if reason else ""))
        return until

    def _decode_failed(self, peer, error) -> None:
        """A message on a typed channel did not decode (a ``DecodeError``): the sender
        broke its channel's contract and is dropped like a malformed packet (a
        protocol_error, close code ``DecodeError``; specs/reactor-api.md section 11)."""
        protocol = peer.connection
        if protocol is not None and protocol.end_reason is None:
            protocol.fail(error)
        else:
            peer.close(error)

    def _emit_stats(self) -> None:
        """One stats tick. Each peer whose sample changed since its last ``channel_stats``
        logs it (specs/telemetry.md); then each connected peer whose link carried
        messages since the last tick, or whose round trip was never measured, gets a
        ping, so that a busy link (which the keepalive never pings) has a round trip too
        and the next tick logs it (specs/connection.md section 3). An idle link costs
        nothing here: the keepalive pings it. STATS_SLICE peers per reactor turn."""
        previous = self._stats_samples
        if self._stats_call is not None and self._stats_call.active():
            self._stats_call.cancel()  # a tick not done by now: its peers not reached keep their samples
            previous = {**self._stats_previous, **previous}
        self._stats_previous, self._stats_samples = previous, {}
        self._stats_slice(list(self.peers.values()), 0)

    def _stats_slice(self, peers: list[Peer], start: int) -> None:
        self._stats_call = None
        previous, samples, current_peers = self._stats_previous, self._stats_samples, self.peers
        descriptors, channel_ids = self._stats_channels
        for peer in peers[start : start + STATS_SLICE]:
            node_id = peer.node_id
            if current_peers.get(node_id) is not peer:
                continue  # its session ended since the tick began
            key = telemetry.sample_key(peer, channel_ids)
            before = previous.get(node_id)
            if before is not None and before[0] == key:
                samples[node_id] = before
                continue  # nothing moved: nothing to log, nothing to measure
            sample = telemetry.channel_samples(peer, descriptors)
            samples[node_id] = (key, sample)
            if before is not None and before[1] == sample:
                continue  # only our own pings and pongs moved
            carried = _carried_traffic(sample, before and before[1])
            # A new round trip alone (the keepalive's, on an idle link) is the peer's, not
            # a channel's: the first channel's record carries it, and the others, which
            # would repeat their last records, are not logged (specs/telemetry.md).
            telemetry.channel_stats(self.node_id, peer, sample if carried else sample[:1])
            protocol = peer.connection
            if protocol is not None and peer.state is PeerState.CONNECTED and (peer.round_trip is None or carried):
                protocol.probe()
        if start + STATS_SLICE < len(peers):
            self._stats_call = self.clock.callLater(0, self._stats_slice, peers, start + STATS_SLICE)

    def _check_invariants(self) -> None:
        """Assert that the Switch's parts agree (tests call this)."""
        self._sessions.check_invariants(self.connections)
        self._connections.check_invariants()
        self._reactor_set.check_invariants()


def _address_of(port) -> str:
    """``host:port`` of a listening port (an IPv6 host in brackets); a WebSocket port's
    ``ws://host:port/path``."""
    if getattr(port, "peer_address", None):
        return port.peer_address
    host = port.getHost()
    return f"[{host.host}]:{host.port}" if ":" in host.host else f"{host.host}:{host.port}"


def _carried_traffic(sample: tuple, before: tuple | None) -> bool:
    """Whether anything but the round trip differs between two channel_samples."""
    if before is None or len(before) != len(sample):
        return True
    return any(now[:-1] != then[:-1] for now, then in zip(sample, before, strict=True))
