"""Peer: one session with another node, as reactors see it; sending happens here.

One class: the Peer's send API (``send``, ``try_send``, their batch and confirmed
forms), its queues and its state across transports are one object's; what it
delegates, delivery and its counters, is peer_delivery.py and peer_stats.py.

A Peer outlives its transports (specs/resume.md): its state is a ``PeerState``
(``mconn.core.session_table``; it compares equal to the strings ``"connected"``,
``"suspended"``: the transport broke and the session waits ``resume_grace`` to be resumed,
``"connecting"``: a new transport is up and the resume is being negotiated, and
``"closed"``). Only ``mconn.switch.session_manager.SessionManager`` changes it, by its transition table.
Reactors keep the same Peer object across a resume.

``send`` and ``try_send`` accept whole messages (specs/reactor-api.md section 3). An
accepted message is kept in the session's recovery buffer until the peer confirms it, so
it survives transport breaks; while suspended, up to ``send_queue_capacity`` messages
per channel are accepted and go out on resume. ``send`` waits up to
``Config.send_timeout`` for room, in FIFO order with other waiting sends on that
channel; ``try_send`` never waits and never overtakes a waiting ``send``.
``send_confirmed`` fires once the peer's reactor has the message. Receiving: ``mconn.switch.peer_delivery``.

The module is one class, ``Peer`` (with the small types its methods return): the session
as reactors see it and the send path they call, kept whole rather than cut to a length.
"""

from __future__ import annotations

import collections
import inspect
from typing import NamedTuple

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from mconn.core.address import transport_host
from mconn.core.connection import State
from mconn.errors import ConnectionClosed, DeliveryNotConfirmed, ReactorError
from mconn.core.handshake import make_hello
from mconn.core.node_info import node_info_of
from mconn.switch.peer_delivery import PeerDelivery
from mconn.switch.peer_stats import ChannelStatsSnapshot, PeerStats, snapshot
from mconn.core.session_table import PeerState
from mconn.core.wire import ChannelInfo, Hello
from mconn.net.owner import ICarriedSession

CONNECTING = PeerState.CONNECTING
CONNECTED = PeerState.CONNECTED
SUSPENDED = PeerState.SUSPENDED
CLOSED = PeerState.CLOSED
_OPEN = State.OPEN
_BYTES_ONLY = {bytes}

__all__ = ["ChannelStatsSnapshot", "DeliverySequence", "Peer", "PeerStats"]


class DeliverySequence(NamedTuple):
    """``Peer.delivery_seq``: a message's place in its session's stream on its channel."""

    #: The session's id (16 bytes; it names the session, and is its resume secret).
    session_id: bytes
    #: Messages delivered on the channel in this session, this one included (from 1).
    seq: int


class _NoConnection:
    """What ``Peer.restored`` builds a Peer on: a connection that is not there."""

    remote_address = ""
    transport = None
    core = None


_NO_CONNECTION = _NoConnection()


def _fire_all(result, deferreds: list) -> None:
    """Fire waiting sends once their commit is done: True, or the store's failure."""
    for d in deferreds:
        if isinstance(result, Failure):
            d.errback(result)
        else:
            d.callback(True)


class _Unstored:
    """Messages accepted while connected, with a session store, in one reactor turn: they
    go onto ``core`` once the store's commit covers them (``Peer._write_ahead``)."""

    __slots__ = ("core", "messages", "sealed")

    def __init__(self, core) -> None:
        self.core = core
        self.messages: dict[int, list[bytes]] = {}
        self.sealed = None

    def add(self, channel_id: int, message: bytes) -> None:
        self.messages.setdefault(channel_id, []).append(message)


@implementer(ICarriedSession)
class Peer:
    """A session with a node. Created by the Switch when a session starts; never by users.

    :param sessions: the ``SessionManager`` that owns it (clock, config, channels,
        routing, closing, node counters).

    Slotted and light until used (a connect storm builds one per handshake): our
    channels' facts are shared (``mconn.switch.channel_shape``), the receiving side is built at the
    first message received.
    """

    __slots__ = (
        "node_id",
        "is_outbound",
        "listen_address",
        "remote_address",
        "address",
        "_announced",
        "_channels",
        "node_info",
        "remote_host",
        "state",
        "proven",
        "ip_key",
        "suspended_at",
        "round_trip",
        "session",
        "connects",
        "disconnects",
        "resumes",
        "_sessions",
        "_protocol",
        "_clock",
        "_config",
        "_shape",
        "_limits",
        "_core",
        "_connected_at",
        "_waiting",
        "_held",
        "_confirms",
        "data",
        "_receiving",
        "_flush_timer",
        "_flush_reason",
        "close_reason",
        "_removal_waiters",
        "_routines",
        "_store",
        "_unstored",
    )

    def __init__(self, *, sessions, protocol, hello: Hello, session, is_outbound: bool, address=None) -> None:
        self.node_id = hello.node_id
        #: True if this node dialed when the session started (it re-dials after breaks).
        self.is_outbound = is_outbound
        self.listen_address = hello.listen_address
        self.remote_address = protocol.remote_address
        #: The host the connection comes from, as its transport says (``getPeer().host``;
        #: a trusted proxy's client for a proxied WebSocket), or None if it has none: what
        #: a peer is grouped by (specs/pex.md section 3.4), never the node id it claims.
        self.remote_host = transport_host(protocol.transport)
        #: The address this node dialed (outbound sessions), for re-dialing.
        self.address = address
        #: The ChannelInfos of the peer's hello (``channels`` by id, when first read).
        self._announced = hello.channels
        self._channels: dict[int, ChannelInfo] | None = None
        #: What the peer said it is (a ``mconn.NodeInfo``: network, protocol versions,
        #: moniker, other), or None if its hello carried none (specs/handshake.md 6).
        self.node_info = node_info_of(hello)
        self.state: PeerState = CONNECTED
        #: The node id is proven by a TLS certificate (not merely claimed in the hello);
        #: only a connection proving it too may resume, probe for or replace the session.
        self.proven = False
        #: The key an inbound session counts against (``mconn.core.admission.limit_key`` of
        #: its host: an IPv4 address, an IPv6 /64; None for outbound ones).
        self.ip_key: str | None = None
        #: When the session was last suspended (clock seconds).
        self.suspended_at = 0.0
        #: Last measured ping round trip, in seconds (None before the first pong).
        self.round_trip: float | None = None
        self.session = session
        self.connects = 1
        self.disconnects = 0
        self.resumes = 0
        self._sessions = sessions
        self._protocol = protocol
        self._clock = sessions.clock
        self._config = sessions.config
        #: Our channels' send and receive capacities and codecs (``ChannelShape``, shared).
        self._shape = sessions.shape
        #: Per channel both sides have: the largest message it accepts (the smaller
        #: recv_message_capacity). Channels outside it are refused.
        self._limits = self._shape.limits(hello.channels)
        #: The connection's core (``mconn.core.connection.Connection``) while connected,
        #: else None: sends go into its channel queues through ``room``, ``queue_message``
        #: and ``queue_messages``.
        self._core = protocol.core
        self._connected_at = self._clock.seconds()
        self._waiting: dict[int, collections.deque] = {}
        self._held: dict[int, int] = {}  # accepted while suspended, per channel
        self._confirms: dict[int, collections.deque] = {}
        #: Data the node's reactors share about this peer (CometBFT's peer.Set / Get).
        self.data: dict = {}
        #: The receiving side (``_delivery``), None until the first message comes.
        self._receiving: PeerDelivery | None = None
        #: While ``close(flush=True)`` waits for the peer's acks: its timeout, else None.
        self._flush_timer = None
        self._flush_reason = ""
        #: Why the session ended (the reason ``remove_peer`` gets), None until it has.
        self.close_reason: Exception | None = None
        #: ``when_removed`` Deferreds not fired yet, and the routines running (``spawn``):
        #: None until the first.
        self._removal_waiters: list | None = None
        self._routines: dict | None = None
        #: The node's session store (``Config.session_store``), or None: every message
        #: accepted and every ack is written to it (specs/resume.md section 9).
        self._store = sessions.store
        #: With a store: the messages accepted this turn, waiting for the commit that lets
        #: them onto the connection (``_write_ahead``), else None.
        self._unstored: _Unstored | None = None

    @classmethod
    def restored(cls, *, sessions, node_id: str, session, is_outbound: bool) -> Peer:
        """A session read back from the node's session store after a restart, suspended as
        if its transport had just broken (specs/resume.md section 9.2). Until it resumes,
        the node's hello is not known: the Peer assumes the peer has our channels, and
        takes its hello (``adopt_hello``) on the resume."""
        config = sessions.config
        hello = make_hello(node_id=node_id, channels=sessions.channels, max_packet_payload=config.max_packet_payload)
        peer = cls(sessions=sessions, protocol=_NO_CONNECTION, hello=hello, session=session, is_outbound=is_outbound)
        peer._protocol = peer._core = None
        peer.connects = 0
        peer.state = SUSPENDED
        return peer

    def adopt_hello(self, hello: Hello) -> None:
        """A restored session resumes: what the node says of itself now replaces what
        ``restored`` assumed (its channels and their limits, node info, listen address)."""
        self.listen_address = hello.listen_address
        self._announced = hello.channels
        self._channels = None
        self._limits = self._shape.limits(hello.channels)
        self.node_info = node_info_of(hello)

    @property
    def channels(self) -> dict[int, ChannelInfo]:
        """Channels the peer announced when the session started, by id."""
        channels = self._channels
        if channels is None:
            channels = self._channels = {c.id: c for c in self._announced}
        return channels

    @property
    def connection(self):
        """The connection (``MConnectionProtocol``) that carries the session now, or None
        while it has none (suspended, connecting, closed). Read-only: the session manager
        alone gives a Peer its connection and takes it away. Status pages and metrics read
        its facts (byte counters, transport); reactors send through the Peer, not through it."""
        return self._protocol

    @property
    def _delivery(self) -> PeerDelivery:
        """The receiving side: delivery to reactors, busy channels, acks
        (mconn.switch.peer_delivery), built when first needed."""
        delivery = self._receiving
        if delivery is None:
            sessions = self._sessions
            delivery = self._receiving = PeerDelivery(
                self, reactors=sessions.reactors, clock=self._clock, config=self._config, store=self._store
            )
        return delivery

    def deliver(self, channel_id: int, message: bytes) -> None:
        """A whole message the connection read (``ICarriedSession``): the receiving side
        hands it to its reactor.

        The route of a message, read to receive: ``MConnectionProtocol.dataReceived``
        (mconn.net.protocol) feeds ``Connection.receive_data`` (mconn.core.connection),
        whose ``MessageReceived`` events come here; ``PeerDelivery.deliver``
        (mconn.switch.peer_delivery) holds it if its channel is busy, else
        ``ReactorSet.route`` (mconn.switch.routing) calls the owning ``Reactor.receive``.
        """
        delivery = self._receiving
        if delivery is None:
            delivery = self._delivery
        delivery.deliver(channel_id, message)

    def deliver_run(self, protocol, events: list, start: int) -> int:
        """The ``MessageReceived`` events of a read from ``events[start]`` on
        (``ICarriedSession``): each one as ``deliver`` would, in one loop of the receiving
        side (``PeerDelivery.deliver_run``), while ``protocol`` carries this Peer and has
        not ended. Returns the index of the first event not handled."""
        delivery = self._receiving
        if delivery is None:
            delivery = self._delivery
        return delivery.deliver_run(protocol, events, start)

    def delivery_seq(self, channel_id: int) -> DeliverySequence:
        """Inside ``receive`` (before its first ``await``): the sequence of the message
        being delivered, the channel's delivered count including it, with the session's
        id. A reactor that commits it with its own effect, and returns it from
        ``Reactor.committed_deliveries``, gets each message exactly once across a restart
        of a node with a session store; a message re-delivered after a crash carries the
        sequence it had (specs/resume.md section 9.4). Outside ``receive``: the count of
        messages delivered on the channel so far (a message is counted as its ``receive``
        is called)."""
        if channel_id not in self.session.channel_ids:
            raise ValueError(f"channel {channel_id:#04x} is not one of this session's channels")
        return DeliverySequence(self.session.id, self.session.delivered(channel_id))

    def __repr__(self) -> str:
        direction = "outbound" if self.is_outbound else "inbound"
        return f"<Peer {self.node_id} {direction} {self.remote_address} {self.state}>"

    # -- sending -------------------------------------------------------------------

    def _live(self) -> bool:
        """Connected, and the connection still carries messages."""
        core = self._core
        return core is not None and core.state is _OPEN

    def _closing(self) -> bool:
        """Over, or ending: nothing more can be accepted.

        A connection that is going away for a break (a keepalive failure, a reset)
        before the session is suspended does not count: from the moment the transport
        fails, sends are held for the resume exactly as while suspended (specs/resume.md
        section 1.3). A close, ours or the peer's, or a protocol error does.
        """
        core = self._core
        if core is not None:
            return core.state is not _OPEN and not self._sessions.would_suspend(self._protocol.end_reason)
        return self.state is CLOSED

    def _accepts(self, channel_id: int, message) -> bool:
        """False for channels either side lacks; ValueError for oversized messages."""
        if self._closing() or self._flush_timer is not None:
            return False
        limit = self._limits.get(channel_id)
        if limit is None:
            return False
        if len(message) > limit:
            raise ValueError(
                f"message of {len(message)} bytes on channel {channel_id:#04x} is larger than its "
                f"recv_message_capacity {limit} (ours {self._shape.recv_capacity[channel_id]}, "
                f"peer's {self.channels[channel_id].recv_message_capacity})"
            )
        return True

    def _accept(self, channel_id: int, message: bytes) -> int | None:
        """Take a checked message into the session; its sequence number, or None if full.

        The per-message path, in order: room in the connection's channel queue
        (``Connection.room``), then the session (``Session.admit``: the recovery buffer),
        then the queue (``Connection.queue_message``); a message the session refuses was
        never queued.
        """
        core = self._core
        if core is not None and core.state is _OPEN:
            if self._store is not None:
                return self._write_ahead(core, channel_id, message)
            if not core.room(channel_id):
                return None
            sequence = self.session.admit(channel_id, message)
            if sequence is not None:
                core.queue_message(channel_id, message)
            return sequence
        held = self._held.get(channel_id, 0)
        if held >= self._shape.send_capacity[channel_id]:
            return None
        sequence = self.session.admit(channel_id, message)
        if sequence is not None:
            self._held[channel_id] = held + 1
            if self._store is not None:
                self._store.accepted(self.session.id, channel_id, sequence, message)
        return sequence

    def _write_ahead(self, core, channel_id: int, message: bytes) -> int | None:
        """``_accept`` with a session store, while connected: the message is admitted and
        recorded now, and queued on the connection once the store's commit covers it, so
        the peer never holds a message the store does not (specs/resume.md section 9.1).
        Messages waiting for their commit are bounded by the recovery buffer, like those
        held while suspended; the queue's room is asked as without a store."""
        unstored = self._unstored
        if unstored is not None and unstored.core is not core:
            unstored = None  # a batch of a transport that has gone: dropped when it fires
        if not core.room(channel_id):
            return None
        sequence = self.session.admit(channel_id, message)
        if sequence is None:
            return None
        self._store.accepted(self.session.id, channel_id, sequence, message)
        if unstored is None:
            unstored = self._unstored = _Unstored(core)
        unstored.add(channel_id, message)
        if unstored.sealed is None:  # the commit is asked for at the end of this turn
            unstored.sealed = self._clock.callLater(0, self._seal, unstored)
        return sequence

    def _seal(self, unstored: _Unstored) -> None:
        """Ask the store for the commit covering ``unstored``'s messages; what is accepted
        from now on waits for the next one (commits, hence batches, keep their order)."""
        if self._unstored is unstored:
            self._unstored = None
        self._store.durable().addCallback(self._committed, unstored)

    def _committed(self, _, unstored: _Unstored) -> None:
        """``unstored``'s messages are in the store: queue them on their connection, if it
        still carries the session (else they wait in the recovery buffer for the resume)."""
        core = unstored.core
        if self._core is not core or core.state is not _OPEN:
            return
        for channel_id, messages in unstored.messages.items():
            core.requeue(channel_id, messages)  # accepted already: they do not wait for room
        self._protocol.pump()

    def try_send(self, channel_id: int, message: bytes) -> bool:
        """Queue ``message`` now if there is room; True if it was accepted."""
        if type(message) is not bytes:
            message = self._bytes_of(channel_id, message)
        core = self._core
        if core is not None and core.state is _OPEN and self._store is None and self._flush_timer is None:
            # Connected, no store, no flush: ``_accepts`` then ``_accept`` reduce to these
            # tests, in their order, without their calls (the one-by-one sender's path).
            limit = self._limits.get(channel_id)
            if limit is None:
                return False
            if len(message) > limit:
                self._accepts(channel_id, message)  # raises the ValueError naming the sizes
            if (self._waiting and self._waiting.get(channel_id)) or not core.room(channel_id):
                return False
            if self.session.admit(channel_id, message) is None:
                return False
            core.queue_message(channel_id, message)
            self._protocol.pump()
            return True
        if not self._accepts(channel_id, message) or self._waiting.get(channel_id):
            return False
        if self._accept(channel_id, message) is None:
            return False
        core = self._core
        if core is not None and core.state is _OPEN:
            self._protocol.pump()
        return True

    def try_send_many(self, channel_id: int, messages) -> int:
        """``try_send`` each of ``messages`` in order until one is not accepted, writing
        once at the end instead of once per message.

        While connected, what does not depend on the message (the session's state, the
        channel, waiting sends) is checked once per batch and again after each write,
        not once per message; each message is then one size test and one
        ``Session.admit``, and what was admitted goes into the connection's queue in one
        ``Connection.queue_messages`` before each write (the per-message cost of a batch).
        A list of bytes that fits the queue and the recovery buffer whole is taken in one
        step (``Session.admit_many``).

        :returns: how many were accepted (a prefix of ``messages``: the rest were not).
        """
        core = self._core
        if core is None or core.state is not _OPEN or self._store is not None:
            return self._try_send_each(channel_id, messages)  # a store writes each message ahead
        if not self._accepts(channel_id, b"") or self._waiting.get(channel_id):
            return 0
        limit = self._limits[channel_id]
        room = core.room(channel_id)
        if (
            type(messages) is list
            and messages
            and len(messages) <= room
            and set(map(type, messages)) == _BYTES_ONLY
            and max(map(len, messages)) <= limit
            and self.session.admit_many(channel_id, messages, sum(map(len, messages))) is not None
        ):
            core.queue_messages(channel_id, messages)
            self._protocol.pump()
            return len(messages)
        admit = self.session.admit
        admitted: list[bytes] = []  # admitted, not yet queued: they go in before each write
        accepted = 0
        try:
            for message in messages:
                if type(message) is not bytes:
                    message = self._bytes_of(channel_id, message)
                if len(message) > limit:
                    self._accepts(channel_id, message)  # raises the ValueError naming the sizes
                if not room:
                    if not admitted:
                        break
                    core.queue_messages(channel_id, admitted)
                    admitted = []
                    self._protocol.pump()  # the queue is full: what fits goes out, then try again
                    room = core.room(channel_id)
                    if not room:
                        break
                    if not self._accepts(channel_id, b"") or self._waiting.get(channel_id):
                        break
                if admit(channel_id, message) is None:
                    break  # the recovery buffer is full
                admitted.append(message)
                room -= 1
                accepted += 1
        finally:  # what the session admitted is queued, whatever ends the batch
            if admitted:
                core.queue_messages(channel_id, admitted)
        if admitted and core.state is _OPEN:
            self._protocol.pump()
        return accepted

    def _try_send_each(self, channel_id: int, messages) -> int:
        """``try_send_many`` while not connected (sends are held for the resume)."""
        accepted = pending = 0
        for message in messages:
            if type(message) is not bytes:
                message = self._bytes_of(channel_id, message)
            if not self._accepts(channel_id, message) or self._waiting.get(channel_id):
                break
            if self._accept(channel_id, message) is None:
                if not pending or not self._live():
                    break
                self._protocol.pump()  # the queue is full: what fits goes out, then try again
                pending = 0
                if self._accept(channel_id, message) is None:
                    break
            accepted += 1
            pending += 1
        if pending and self._live():
            self._protocol.pump()
        return accepted

    def send(self, channel_id: int, message: bytes) -> defer.Deferred:
        """Queue ``message``, waiting up to send_timeout for room.

        :returns: a Deferred that fires True once the message is accepted, False if no
            room came within ``send_timeout`` or the session ended.
        """
        if type(message) is not bytes:
            message = self._bytes_of(channel_id, message)
        return self._send(channel_id, message, confirm=False)

    def send_confirmed(self, channel_id: int, message: bytes) -> defer.Deferred:
        """Send, and fire once the peer has delivered the message to its reactor.

        :returns: a Deferred firing True on confirmation, False if the message could not
            even be accepted (as ``send``), or failing with DeliveryNotConfirmed if the
            session ends first.
        """
        if type(message) is not bytes:
            message = self._bytes_of(channel_id, message)
        return self._send(channel_id, message, confirm=True)

    def _send(self, channel_id: int, message: bytes, *, confirm: bool) -> defer.Deferred:
        if not self._accepts(channel_id, message):
            return defer.succeed(False)
        if not self._waiting.get(channel_id):
            sequence = self._accept(channel_id, message)
            if sequence is not None:
                if self._live():
                    self._protocol.pump()
                return self._confirmation(channel_id, sequence) if confirm else self._stored()
        entry: list = [message, None, None, confirm]
        d: defer.Deferred[bool] = defer.Deferred(canceller=lambda _: self._cancel_waiting(channel_id, entry))
        entry[1] = d
        entry[2] = self._clock.callLater(self._config.send_timeout, self._send_timed_out, channel_id, entry)
        self._waiting.setdefault(channel_id, collections.deque()).append(entry)
        return d

    def _stored(self) -> defer.Deferred[bool]:
        """What ``send`` fires with once it accepted a message: True, at once without a
        session store, else once the store's commit covers the message (section 9.1)."""
        if self._store is None:
            return defer.succeed(True)
        return self._store.durable().addCallback(lambda _: True)

    def _bytes_of(self, channel_id: int, message) -> bytes:
        return self._shape.bytes_of(channel_id, message)

    def _confirmation(self, channel_id: int, sequence: int) -> defer.Deferred[bool]:
        d: defer.Deferred[bool] = defer.Deferred(canceller=self._cancel_confirmation)
        self._confirms.setdefault(channel_id, collections.deque()).append((sequence, d))
        return d

    def _cancel_waiting(self, channel_id: int, entry: list) -> None:
        """A waiting send's Deferred was cancelled (a routine cancelled at the session's
        end, or its caller): it stops waiting; the message was never accepted."""
        waiting = self._waiting.get(channel_id)
        if waiting is not None and entry in waiting:
            waiting.remove(entry)
            if not waiting:
                del self._waiting[channel_id]
            entry[2].cancel()
        else:  # a send_confirmed accepted since: it waits for its confirmation now
            self._cancel_confirmation(entry[1])

    def _cancel_confirmation(self, d: defer.Deferred) -> None:
        """A ``send_confirmed`` Deferred was cancelled: nobody waits for that confirmation
        any more (the message itself stays accepted and is still delivered)."""
        for confirms in self._confirms.values():
            for item in confirms:
                if item[1] is d:
                    confirms.remove(item)
                    return

    def _send_timed_out(self, channel_id: int, entry: list) -> None:
        waiting = self._waiting[channel_id]
        waiting.remove(entry)
        if not waiting:
            del self._waiting[channel_id]  # room_made finds nothing to do at once
        entry[1].callback(False)

    def room_made(self) -> bool:
        """Accept waiting sends that now have room (``ICarriedSession``: called by the
        connection after each pump that took messages, and on resume).

        Returns True if any were accepted. Their Deferreds fire after the move, so a
        callback that sends again sees consistent queues.
        """
        if not self._waiting or not self._live():
            return False
        fired = []
        moved = 0
        for channel_id, waiting in list(self._waiting.items()):
            while waiting:
                sequence = self._accept(channel_id, waiting[0][0])
                if sequence is None:
                    break
                _, d, timer, confirm = waiting.popleft()
                timer.cancel()
                moved += 1
                if confirm:
                    self._confirms.setdefault(channel_id, collections.deque()).append((sequence, d))
                else:
                    fired.append(d)
            if not waiting:
                del self._waiting[channel_id]
        if fired and self._store is not None:  # a send fires once its message is stored
            self._store.durable().addBoth(_fire_all, fired)
        else:
            for d in fired:
                d.callback(True)
        return moved > 0

    # -- the peer's acks (called by the connection) ------------------------------------

    def acknowledged(self, delivered: dict[int, int]) -> None:
        """The peer confirmed deliveries (``ICarriedSession``): drop them from the recovery
        buffer, confirm."""
        for channel_id, _, acked in self.session.on_ack(delivered):
            self._confirm_up_to(channel_id, acked)
            if self._store is not None:
                self._store.acked(self.session.id, channel_id, acked)
        if self._waiting and self.state is CONNECTED:
            self._protocol.pump()  # room in the recovery buffer: waiting sends may go
        if self._flush_timer is not None:
            self._check_flushed()

    def _confirm_up_to(self, channel_id: int, acked: int) -> None:
        """Fire the send_confirmed Deferreds of messages before sequence ``acked``."""
        confirms = self._confirms.get(channel_id)
        while confirms and confirms[0][0] < acked:
            confirms.popleft()[1].callback(True)

    # -- lifecycle (called by the SessionManager, which sets ``state``) ----------------

    def _detach(self) -> None:
        """The transport is gone: sends are held for the next one."""
        self._protocol = None
        self._core = None
        self.disconnects += 1
        self._held = {}
        self._unstored = None  # its messages wait in the recovery buffer for the resume
        if self._receiving is not None:
            self._receiving.detach()

    def _attach(self, protocol, resend: dict[int, list[bytes]]) -> None:
        """A new transport carries the session on: re-send what the peer lacks
        (``resend``: ``Session.to_resend`` of the peer's delivered counts)."""
        self._protocol = protocol
        self._core = protocol.core
        self.remote_address = protocol.remote_address
        self.remote_host = transport_host(protocol.transport)
        self.connects += 1
        self._held = {}
        core = protocol.core
        if self._store is not None and resend:  # some may wait for their commit (_write_ahead)
            self._store.durable().addCallback(self._resend, core, resend, pump=True)
        else:
            self._resend(None, core, resend)
        for channel_id in list(self._confirms):  # to_resend applied the peer's counts
            self._confirm_up_to(channel_id, self.session.acked(channel_id))
        if self.session.ack_pending:
            self._delivery.send_ack()

    def _resend(self, _, core, resend: dict[int, list[bytes]], *, pump: bool = False) -> None:
        """Put what the peer lacks into the new connection's queue, ahead of the rest (the
        resume pumps; a resend that waited for a commit pumps itself)."""
        if self._core is core and core.state is _OPEN:  # a core that failed later in the same
            for channel_id, messages in resend.items():  # read takes nothing; the messages
                core.requeue(channel_id, messages)  # stay for the next resume
            if pump:
                self._protocol.pump()

    def _end(self, reason: Exception) -> None:
        """The session is over: cancel its routines, fail what waits on it, tell
        ``when_removed`` (all before the reactors' ``remove_peer``)."""
        self.close_reason = reason
        self._protocol = None
        self._core = None
        if self._receiving is not None:
            self._receiving.end()
        self._cancel_flush()
        routines = self._routines
        if routines:
            for d in list(routines):
                d.cancel()  # CancelledError at the routine's await; _routine_done drops it
        for waiting in self._waiting.values():
            while waiting:
                _, d, timer, _ = waiting.popleft()
                timer.cancel()
                d.callback(False)
        for channel_id, confirms in self._confirms.items():
            while confirms:
                sequence, d = confirms.popleft()
                d.errback(DeliveryNotConfirmed(channel_id, sequence, reason))
        waiters, self._removal_waiters = self._removal_waiters, None
        for d in waiters or ():
            d.callback(reason)

    # -- per-peer routines (specs/reactor-api.md section 5.8) ---------------------------

    def when_removed(self) -> defer.Deferred:
        """A Deferred that fires with the reason the session ended (the error
        ``remove_peer`` gets) when it ends, before ``remove_peer`` is called; at once if it
        has ended. CometBFT's ``peer.Quit()``. Each call gives a Deferred of its own;
        cancelling one stops only that one waiting."""
        if self.close_reason is not None:
            return defer.succeed(self.close_reason)
        d: defer.Deferred = defer.Deferred(canceller=self._cancel_removal_waiter)
        if self._removal_waiters is None:
            self._removal_waiters = []
        self._removal_waiters.append(d)
        return d

    def _cancel_removal_waiter(self, d: defer.Deferred) -> None:
        if self._removal_waiters is not None and d in self._removal_waiters:
            self._removal_waiters.remove(d)

    def spawn(self, routine, *, reactor) -> defer.Deferred:
        """Run ``routine`` (a coroutine, such as ``reactor.gossip(peer)``, or a Deferred)
        for as long as this session lives: ``Reactor.spawn(peer, routine)`` calls this.

        The routine is cancelled (``CancelledError`` at its ``await``) when the session
        ends, before ``remove_peer``; it keeps running while the session is suspended
        (sends are held for the resume). An exception that escapes it is ``reactor``'s
        error, handled like one from ``receive``: ``Reactor.on_error(peer, None, error)``
        or ``Config.reactor_errors`` (``"drop"`` ends the session with a ``ReactorError``).

        :returns: a Deferred firing with the routine's result, or None if it was
            cancelled or failed (the failure is handled as above, never left unhandled).
            On a session that has ended the routine is not started (a coroutine is
            closed) and the Deferred fires None at once.
        :raises TypeError: for anything but a coroutine or a Deferred.
        """
        if inspect.iscoroutine(routine):
            if self.close_reason is not None:
                routine.close()
                return defer.succeed(None)
            d = defer.Deferred.fromCoroutine(routine)
        elif isinstance(routine, defer.Deferred):
            d = routine
            if self.close_reason is not None:
                d.cancel()
                d.addErrback(lambda _: None)
                return defer.succeed(None)
        else:
            raise TypeError(
                f"a peer routine is a coroutine (call the async def: spawn(peer, self.gossip(peer))) "
                f"or a Deferred, not {type(routine).__name__}"
            )
        if d.called:  # it ended before its first wait
            return d.addBoth(self._routine_done, None, reactor)
        if self._routines is None:
            self._routines = {}
        self._routines[d] = reactor
        return d.addBoth(self._routine_done, d, reactor)

    def _routine_done(self, result, d, reactor):
        """A routine ended: forget it; hand its exception to the reactor error policy."""
        if d is not None and self._routines is not None:
            self._routines.pop(d, None)
        if not isinstance(result, Failure):
            return result
        if not result.check(defer.CancelledError):
            self._sessions.reactors.routine_failed(reactor, self, result.value)
        return None

    @property
    def routines(self) -> int:
        """How many routines (``spawn``) are running for this session now."""
        return len(self._routines) if self._routines else 0

    def close(self, reason=None, *, flush: bool = False) -> None:
        """End the session with a close packet; the reactors get ``remove_peer``.

        The other side ends the session at once, without a grace window. With
        ``flush=True`` nothing new is accepted, and the close waits (up to
        ``Config.send_timeout``) until every message accepted so far, and every waiting
        ``send``, is sent and confirmed delivered: the reason's ``unconfirmed`` is then
        empty, or counts exactly those the timeout cut off (specs/reactor-api.md 5.4).
        """
        text = "" if reason is None else str(reason)
        if not flush or self.state is CLOSED or self._closing():
            self._cancel_flush()
            self._sessions.close(self, ConnectionClosed("closed", text))
            return
        if self._flush_timer is None:
            self._flush_reason = text
            self._flush_timer = self._clock.callLater(self._config.send_timeout, self._flushed)
        self._check_flushed()

    def _check_flushed(self) -> None:
        if self._flush_timer is not None and not self._waiting and not self.session.unconfirmed():
            self._flushed()

    def _flushed(self) -> None:
        """Everything was confirmed, or send_timeout passed: close now."""
        self._cancel_flush()
        if self.state is not CLOSED:
            self._sessions.close(self, ConnectionClosed("closed", self._flush_reason))

    def _cancel_flush(self) -> None:
        timer, self._flush_timer = self._flush_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def stop_for_error(self, reason) -> None:
        """Drop the peer for misbehaving (CometBFT's StopPeerForError): like ``close``,
        but the reason reactors get in ``remove_peer`` is a ``ReactorError`` (code
        ``reactor_error``) carrying ``reason``; a ReactorError is used as it is."""
        if not isinstance(reason, ReactorError):
            reason = ReactorError(None, None, reason, method="stop_for_error")
        self._cancel_flush()
        self._sessions.close(self, reason)

    def get(self, key, default=None):
        """``peer.data.get(key, default)`` (CometBFT's peer.Get)."""
        return self.data.get(key, default)

    def set(self, key, value) -> None:
        """``peer.data[key] = value`` (CometBFT's peer.Set): shared by every reactor."""
        self.data[key] = value

    @property
    def is_persistent(self) -> bool:
        """Whether this node keeps the peer connected (``dial(..., persistent=True)``)."""
        return self._sessions.is_persistent(self.node_id)

    def force_reconnect(self) -> None:
        """Drop the transport and resume the session on a new one (outbound sessions)."""
        if self.state is CONNECTED:
            self._protocol.transport.abortConnection()

    @property
    def stats(self) -> PeerStats:
        """A ``PeerStats`` snapshot of the session's counters now (mconn.switch.peer_stats)."""
        sessions = self._sessions
        return snapshot(
            self,
            descriptors=sessions.channels,
            held=self._held,
            waiting=self._waiting,
            uptime=self._clock.seconds() - self._connected_at,
            node_counters=sessions.node_counters.get(self.node_id, {}),
        )
