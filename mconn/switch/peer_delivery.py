"""A Peer's receiving side: whole messages handed to reactors, held for busy channels,
and acknowledged (specs/reactor-api.md section 4.1, specs/resume.md section 2.3).

A message counts as delivered, for the peer's recovery buffer, once its reactor has it:
``receive`` was called. An ack goes out when the session says one is due
(``ack_every_messages``, ``ack_every_bytes``), else after ``Config.ack_interval``.

A reactor whose ``receive`` returns a Deferred that has not fired makes its channel
*busy*: later messages of that channel wait here, in order, not counted delivered, until
the Deferred fires; then they go on until one makes the channel busy again. A held
message costs its payload and the Python objects that hold it, so the backlog is counted
twice: its cost in bytes (payload + ``MESSAGE_OVERHEAD`` per message) against
``Config.reactor_backlog_bytes``, and its messages against
``Config.reactor_backlog_messages``. At either bound the connection stops reading
(backpressure on the peer); it reads again once both are below. When the transport
goes, held messages are dropped: the peer re-sends them on a resume, as it never had
acks for them.
"""

from __future__ import annotations

import collections

from mconn.core.events import MessageReceived
from mconn.core.session import MESSAGE_OVERHEAD  # a held message costs what an unacknowledged one does
from mconn.core.session_table import PeerState

CONNECTED = PeerState.CONNECTED


class PeerDelivery:
    """The receiving side of one ``mconn.switch.peer.Peer``; it reads the Peer's current
    transport and state when it uses them."""

    __slots__ = (
        "_peer",
        "_session",
        "_route",
        "_clock",
        "_config",
        "_ack_timer",
        "busy",
        "backlog_bytes",
        "backlog_messages",
        "_store",
    )

    def __init__(self, peer, *, reactors, clock, config, store=None) -> None:
        self._peer = peer
        self._session = peer.session
        #: ``ReactorSet.route`` (mconn.switch.routing) of the node's reactors, bound once:
        #: it calls the ``receive`` of the reactor owning the channel.
        self._route = reactors.route
        self._clock = clock
        self._config = config
        self._ack_timer = None
        #: Busy channels (their reactor's receive returned a Deferred not yet fired), each
        #: with the messages read since, waiting in order (specs/reactor-api.md 4.1).
        self.busy: dict[int, collections.deque] = {}
        #: What the messages held in ``busy`` cost, in bytes: payloads plus
        #: ``MESSAGE_OVERHEAD`` each; and how many they are.
        self.backlog_bytes = 0
        self.backlog_messages = 0
        #: The node's session store, or None (specs/resume.md section 9): each delivery is
        #: written to it, and an ack goes out once the store holds what it covers.
        self._store = store

    def deliver(self, channel_id: int, message: bytes) -> None:
        """Hand a whole message to its reactor, count it, and acknowledge when due; on a
        busy channel, hold it until the reactor's Deferred fires (specs/reactor-api.md 4.1)."""
        if self.busy and channel_id in self.busy:
            self._hold(channel_id, message)
            return
        pending = self._hand(channel_id, message)
        if pending is not None:
            self.busy[channel_id] = collections.deque()
            pending.addBoth(self._receive_done, channel_id)

    def deliver_run(self, protocol, events: list, start: int) -> int:
        """``deliver`` each ``MessageReceived`` of ``events`` from ``start`` on, in order,
        in one loop, while ``protocol`` carries this Peer and has not ended; returns the
        index of the first event not handled (another kind, or the connection changed).

        Each message is what ``deliver`` makes of it: held on a busy channel, else counted
        delivered, routed (``ReactorSet.route``), written to the store, and acknowledged
        when due, in that order; a receive that returns a Deferred makes its channel busy
        for the messages that follow. Only the calls between them are saved: a read of
        100-byte messages is mostly this loop (bench/RESULTS.md).
        """
        session = self._session
        record = session.record_delivered
        route = self._route
        store = self._store
        peer = self._peer
        for i in range(start, len(events)):
            event = events[i]
            if type(event) is not MessageReceived or protocol.end_reason is not None or protocol.peer is not peer:
                return i
            channel_id = event.channel_id
            message = event.message
            busy = self.busy
            if busy and channel_id in busy:
                self._hold(channel_id, message)
                continue
            # As ``_hand``: counted as it is handed over, acknowledged once receive returned.
            due = record(channel_id, len(message))
            pending = route(channel_id, peer, message)
            if store is not None:
                store.delivered(session.id, channel_id, session.delivered(channel_id))
            if due:
                self.send_ack()
            elif self._ack_timer is None:
                self._ack_timer = self._clock.callLater(self._config.ack_interval, self.send_ack)
            if pending is not None:
                self.busy[channel_id] = collections.deque()
                pending.addBoth(self._receive_done, channel_id)
        return len(events)

    def _hand(self, channel_id: int, message: bytes):
        """Route one message, count it delivered: the reactor has it (specs/resume.md 2.3).
        Returns the Deferred its ``receive`` returned, if that has not fired yet."""
        session = self._session
        # Counted as it is handed over, so that inside receive the channel's delivered
        # count includes it (``Peer.delivery_seq``); the ack waits until receive returned.
        due = session.record_delivered(channel_id, len(message))
        pending = self._route(channel_id, self._peer, message)
        if self._store is not None:
            self._store.delivered(session.id, channel_id, session.delivered(channel_id))
        if due:
            self.send_ack()
        elif self._ack_timer is None:
            self._ack_timer = self._clock.callLater(self._config.ack_interval, self.send_ack)
        return pending

    def _hold(self, channel_id: int, message: bytes) -> None:
        """Keep a message for a busy channel; at ``reactor_backlog_bytes`` of cost or
        ``reactor_backlog_messages`` held, stop reading. It is not counted delivered (nor
        acknowledged) until its reactor has it."""
        self.busy[channel_id].append(message)
        self.backlog_bytes += len(message) + MESSAGE_OVERHEAD
        self.backlog_messages += 1
        if not self._below_bounds():
            protocol = self._peer.connection
            if protocol is not None:
                protocol.stop_reading()

    def _below_bounds(self) -> bool:
        """Whether the backlog is below both bounds (reading may go on)."""
        config = self._config
        return (
            self.backlog_bytes < config.reactor_backlog_bytes
            and self.backlog_messages < config.reactor_backlog_messages
        )

    def _receive_done(self, _, channel_id: int) -> None:
        """The reactor's Deferred fired: the channel's held messages go on, in order,
        until one makes it busy again; reading resumes once the backlog is small."""
        backlog = self.busy.get(channel_id)
        if backlog is None:
            return  # the session ended meanwhile
        pending = None
        while backlog and pending is None:
            protocol = self._peer.connection
            if protocol is None or protocol.end_reason is not None:
                break  # not delivered: resent on a resume, or counted undelivered by the peer
            message = backlog.popleft()
            self.backlog_bytes -= len(message) + MESSAGE_OVERHEAD
            self.backlog_messages -= 1
            pending = self._hand(channel_id, message)
        if self.busy.get(channel_id) is not backlog:
            return  # the session ended inside that receive
        if pending is not None:
            pending.addBoth(self._receive_done, channel_id)  # busy again, with what is still held
        else:
            self.backlog_bytes -= sum(map(len, backlog)) + len(backlog) * MESSAGE_OVERHEAD
            self.backlog_messages -= len(backlog)
            del self.busy[channel_id]
        protocol = self._peer.connection
        if protocol is not None and self._below_bounds():
            protocol.resume_reading()

    def send_ack(self) -> None:
        """Acknowledge the deliveries not acknowledged yet, if connected."""
        self.cancel_ack_timer()
        if self._peer.state is CONNECTED and self._session.ack_pending:
            protocol = self._peer.connection
            if self._store is None:
                protocol.send_ack(self._session.take_ack())
                return
            # An ack lets the peer drop what it covers: it goes out only once the store
            # holds these delivered counts, so a restart never resumes below them
            # (specs/resume.md section 9.3). Commits, and so acks, keep their order.
            counts = self._session.take_ack()
            self._store.durable().addCallback(self._stored, protocol, counts)

    def _stored(self, _, protocol, counts: dict[int, int]) -> None:
        """The store holds ``counts``: acknowledge them on ``protocol`` if it still carries
        the session (otherwise the resume counts of the next one do)."""
        if self._peer.connection is protocol and self._peer.state is CONNECTED:
            protocol.send_ack(counts)

    def cancel_ack_timer(self) -> None:
        if self._ack_timer is not None and self._ack_timer.active():
            self._ack_timer.cancel()
        self._ack_timer = None

    def detach(self) -> None:
        """The transport is gone: no ack is due on it, and held messages were never
        counted delivered, so the peer re-sends them on a resume; the channels stay busy
        until their Deferreds fire."""
        self.cancel_ack_timer()
        for backlog in self.busy.values():
            backlog.clear()
        self.backlog_bytes = self.backlog_messages = 0

    def end(self) -> None:
        """The session is over: as ``detach``, and no channel is busy any more."""
        self.detach()
        self.busy = {}
