"""The MConnection state machine, sans I/O: bytes and ``now`` in, events and bytes out.

The Twisted adapter (protocol.py) feeds ``receive_data``, writes ``data_to_send``, and
calls ``handle_timeout`` at ``next_deadline()``. Nothing here reads a clock or touches a
socket, as in h2 and h11: any event loop, or a test, can drive it.

States and transitions are the table ``TRANSITIONS`` (``mconn.core.connection_table``; specs/connection.md
section 1 is derived from it); a (state, input) pair missing from it is a protocol error.

Keepalive (specs/connection.md section 3): after ``ping_interval`` with nothing received a
ping goes out; if nothing at all arrives within ``pong_timeout`` after it, the connection
failed. Only received bytes prove the peer alive. Every ping is answered with a pong, and
control packets go out before data.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from mconn.core.channel import Channel, ChannelDescriptor, Scheduler, active_schedule
from mconn.config import MIN_PACKET_PAYLOAD, Config
from mconn.errors import (
    ControlFlood,
    HandshakeTimeout,
    LocalProtocolError,
    PongTimeout,
    RemoteProtocolError,
    UnexpectedPacket,
    UnknownChannel,
    UnknownPacketType,
)
from mconn.core.events import (
    AckReceived,
    CloseReceived,
    ConnectionFailed,
    HelloReceived,
    MessageReceived,
    PongReceived,
    SessionAnswered,
)
from mconn.core.frame_buffer import MSG, PING, PONG, RUN, FrameBuffer
from mconn.core.handshake import (
    announcing_recv_rate,
    asks_for_session,
    check_hello,
    fresh_answer_parts,
    hello_packet,
    recv_rate_of,
)
from mconn.core.packet_size import payload_for_pace
from mconn.core.rate import TokenBucket
from mconn.core.speedups import SPEEDUPS

# State, Input, TRANSITIONS: also mconn.core.connection's names (``X as X`` re-exports them).
from mconn.core.connection_table import TRANSITIONS as TRANSITIONS, Input as Input, State as State
from mconn.core.wire import (
    FIRST_OPTIONAL_TYPE,
    SESSION_ID_BYTES,
    Hello,
    PacketType,
    SessionAnswer,
    decode_ack,
    decode_close,
    decode_hello,
    decode_session_answer,
    encode_ack,
    encode_close,
    encode_extension,
    encode_session_answer,
)

#: Room for per-channel counts (ack, session answer): 256 channels, each a channel byte
#: and a count of up to 10 uvarint bytes.
CHANNEL_COUNTS_LIMIT = 256 * 11
#: Close texts are cut to this many characters so that they fit max_control_size.
CLOSE_TEXT_LIMIT = 200
PING_BYTES = bytes([PING])
PONG_BYTES = bytes([PONG])


#: The states as module constants: on Python 3.11 ``State.OPEN`` is a descriptor call
#: (~0.3 us), and the per-message path tests the state several times.
_HANDSHAKING, _OPEN, _CLOSING, _CLOSED = State.HANDSHAKING, State.OPEN, State.CLOSING, State.CLOSED

_INPUT_OF_TYPE = {PING: Input.PING, PONG: Input.PONG, MSG: Input.MSG, RUN: Input.MSG}


def process_msgs(packets: list[Any], i: int, channels: dict[int, Channel], append: Callable[[object], None]) -> int:
    """The msg fast path of ``Connection._process`` on an open connection: from
    ``packets[i]`` on, each msg packet ``(MSG, channel_id, eof, data)`` and each run
    ``(RUN, channel_id, payloads)`` (frame_buffer.py) is reassembled on its channel, and a
    ``MessageReceived`` for each whole message goes to ``append``; returns the index of
    the first packet of another type (``len(packets)`` when there is none).

    Raises UnknownChannel for a channel this node does not have and MessageTooLarge
    (``Channel.too_large``) past a channel's ``recv_message_capacity`` (for a run: the
    size with the whole run); the messages before the bad packet have been appended.
    The reference of the compiled twin (mconn/core/_speedups.pyx,
    tests/core/test_speedups_process.py).
    """
    n = len(packets)
    while i < n:
        packet = packets[i]
        kind = packet[0]
        if kind == MSG:
            channel = channels.get(packet[1])
            if channel is None:
                raise unknown_channel(packet[1], channels)
            if packet[2] and channel.receiving is None:
                # A whole message in one packet (its data is bytes): Channel.reassemble inlined.
                message = packet[3]
                size = len(message)
                if size > channel.recv_capacity:
                    raise channel.too_large(size)
                stats = channel.stats
                stats.bytes_received += size
                stats.messages_received += 1
            else:
                message = channel.reassemble(packet[2], packet[3])
                if message is None:
                    i += 1
                    continue
            append(MessageReceived(channel_id=packet[1], message=message))
        elif kind == RUN:
            channel = channels.get(packet[1])
            if channel is None:
                raise unknown_channel(packet[1], channels)
            channel.reassemble_run(packet[2])
        else:
            return i
        i += 1
    return n


def unknown_channel(channel_id: int, channels: dict[int, Channel]) -> UnknownChannel:
    """The error of a msg packet on a channel not in ``channels``."""
    return UnknownChannel(
        f"msg packet on channel {channel_id:#04x}, which this node does not have "
        f"(channels: {', '.join(f'{c:#04x}' for c in channels) or 'none'})"
    )


#: What ``Connection._process`` runs its msg packets through: the compiled twin when it
#: is in use (mconn.core.speedups), else the reference above.
_process_msgs: Callable[[list[Any], int, dict[int, Channel], Callable[[object], None]], int] = (
    process_msgs if SPEEDUPS is None else SPEEDUPS.process_msgs
)


@functools.lru_cache(maxsize=16)
def _extension_limits(max_hello_size: int, max_control_size: int) -> MappingProxyType[int, int]:
    """The frame buffer's body limits per extension type: read-only, so every connection
    with these sizes shares one (FrameBuffer keeps a read-only mapping as it is)."""
    counts = max_control_size + CHANNEL_COUNTS_LIMIT
    return MappingProxyType({PacketType.HELLO: max_hello_size, PacketType.ACK: counts, PacketType.SESSION: counts})


def close_packet(code: str, text: str = "") -> bytes:
    """A whole close packet (specs/wire.md section 3.2), for a connection refused before
    a Connection was built for it (specs/connection.md section 6)."""
    return encode_extension(PacketType.CLOSE, encode_close(code, text[:CLOSE_TEXT_LIMIT]))


class Connection:
    """One MConnection between us and a peer, as a plain object.

    :param config: limits and timers.
    :param hello: what we announce (handshake.make_hello); with ``config.recv_rate`` the
        hello announces it (``handshake.announcing_recv_rate``), and ``self.hello`` is that one.
    :param channels: our channel descriptors, in priority tie-break order.
    :param now: the current time, in seconds, from the caller's clock.
    """

    def __init__(self, *, config: Config, hello: Hello, channels: list[ChannelDescriptor], now: float) -> None:
        self.config = config
        hello = announcing_recv_rate(hello, config.recv_rate)
        self.hello = hello
        self.state = _HANDSHAKING
        self.peer_hello: Hello | None = None
        self.max_packet_payload = config.max_packet_payload
        #: What msg packets are cut at (set_packet_payload), and what was asked for.
        self._payload_cap: int | None = None
        self._payload = config.max_packet_payload
        self.channels: dict[int, Channel] = {d.id: Channel(d) for d in channels}
        self._channel_list = list(self.channels.values())
        self._scheduler = Scheduler(self._channel_list, now)
        self._buffer = FrameBuffer(
            max_payload=config.max_packet_payload,
            default_extension_limit=config.max_control_size,
            extension_limits=_extension_limits(config.max_hello_size, config.max_control_size),
            stream_payloads=True,
        )
        self._control: list[bytes] = [hello_packet(hello)]
        self._started = now
        self._last_received = now
        self._ping_sent_at: float | None = None
        # Both buckets count every byte on the wire, control packets and headers included
        # (specs/connection.md section 5), so that a sender pacing at the rate its peer
        # announced never sends more than the peer reads.
        self._send_bucket = TokenBucket(config.send_rate, now) if config.send_rate else None
        self._recv_bucket = TokenBucket(config.recv_rate, now) if config.recv_rate else None
        #: Bytes per second this connection sends at most: ``send_rate``, lowered to the
        #: recv_rate the peer's hello announces once it arrives (None: unlimited).
        self.send_pace: float | None = config.send_rate
        self.bytes_received = 0
        self.bytes_sent = 0
        #: False when the last ``data_to_send`` left nothing it could send now (its
        #: queues empty, or send_rate's budget spent): another call at the same time
        #: would return b"" unless something is queued meanwhile. The adapter's pump
        #: stops on it instead of paying for that empty call.
        self.more_to_send = True
        self.error: RemoteProtocolError | None = None
        #: The dialer's hello asks for a session: its handshake ends with the listener's
        #: session answer, which handshake_timeout bounds too (section 6).
        self._awaiting_answer = asks_for_session(hello)
        #: Pings received in the current ping_interval window, and when it began (at
        #: the window's first ping).
        self._pings = 0
        self._ping_window = -math.inf

    # -- inbound -----------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[object]:
        """Feed bytes from the transport; returns the events they complete.

        A protocol violation ends the list with ConnectionFailed; the events before it
        (whole messages that arrived before the bad bytes) are still valid.
        """
        if self.state is _CLOSED or not data:
            return []
        self._last_received = now
        self.bytes_received += len(data)
        if self._recv_bucket is not None:
            self._recv_bucket.spend(len(data), now)
        events: list[object] = []
        error: RemoteProtocolError | None
        packets, error = self._buffer.feed(data)
        while True:
            try:
                self._process(packets, events, now)
            except RemoteProtocolError as e:
                error = e
            if error is not None:
                self._fail(error, events)
                break
            if not self._buffer.paused or self.state is _CLOSED:
                break
            # Decoding paused after an extension packet (limits may have changed): go on.
            packets, error = self._buffer.feed(b"")
        if self.state is _CLOSED:
            # Closed (a close received, a failure): nothing more is read, so the rest of
            # the read the buffer kept after an extension packet goes too.
            self._buffer.discard()
        return events

    def _process(self, packets: list[Any], events: list[object], now: float) -> None:
        channels = self.channels
        append = events.append
        i = 0
        n = len(packets)
        while i < n:
            if self.state is _OPEN:
                # The hot path: the msg and run packets up to the next of another type.
                i = _process_msgs(packets, i, channels, append)
                if i == n:
                    return
            packet = packets[i]
            i += 1
            self._process_other(packet[0], packet, events, now)
            if self.state is _CLOSED:
                return  # the peer closed: whatever follows is ignored

    def _process_other(self, kind: int, packet: tuple[Any, ...], events: list[object], now: float) -> None:
        """Every packet but a msg packet on an open connection."""
        append = events.append
        if kind in _INPUT_OF_TYPE:
            self._transition(_INPUT_OF_TYPE[kind], packet)
            if self.state is not _OPEN:
                return  # closing: read and ignore
            if kind == PING:
                self._answer_ping(now)
            elif self._ping_sent_at is not None:
                append(PongReceived(round_trip=now - self._ping_sent_at))
                self._ping_sent_at = None
        elif kind == PacketType.HELLO:
            self._transition(Input.HELLO, packet)
            if self.state is _OPEN:
                self._open(decode_hello(packet[1]), events, now)
        elif kind == PacketType.CLOSE:
            code, text = decode_close(packet[1])
            self._transition(Input.CLOSE_RECEIVED, packet)
            append(CloseReceived(code=code, text=text))
        elif kind == PacketType.ACK:
            delivered = decode_ack(packet[1])
            self._transition(Input.ACK, packet)
            if self.state is _OPEN:
                append(AckReceived(delivered=delivered))
        elif kind == PacketType.SESSION:
            answer = decode_session_answer(packet[1])
            self._transition(Input.SESSION, packet)
            if self.state is _OPEN:
                self._awaiting_answer = False
                append(SessionAnswered(answer=answer))
        elif kind >= FIRST_OPTIONAL_TYPE:
            return  # an optional extension we do not know: step over it
        else:
            raise UnknownPacketType(f"unknown critical extension packet type {kind:#04x}")

    def _answer_ping(self, now: float) -> None:
        """Queue the pong for a ping, within the ping rate and backlog limits (section 6)."""
        config = self.config
        if now - self._ping_window >= config.ping_interval:
            self._ping_window, self._pings = now, 0
        self._pings += 1
        if self._pings > config.max_pings_per_interval:
            raise ControlFlood(
                f"{self._pings} pings within {now - self._ping_window:.3f}s, over max_pings_per_interval "
                f"{config.max_pings_per_interval} per ping_interval {config.ping_interval}s"
            )
        if len(self._control) >= config.max_control_backlog:
            raise ControlFlood(
                f"{len(self._control)} control packets queued unsent (the peer does not read them), "
                f"over max_control_backlog {config.max_control_backlog}"
            )
        self._control.append(PONG_BYTES)

    def _transition(self, event: Input, packet: tuple[Any, ...]) -> None:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            if event is Input.MSG and self.state is _HANDSHAKING:
                raise UnexpectedPacket(f"msg packet on channel {packet[1]:#04x} before the hello")
            raise UnexpectedPacket(f"{event.value} packet not allowed while the connection is {self.state.value}")
        self.state = new

    def _open(self, hello: Hello, events: list[object], now: float) -> None:
        self.max_packet_payload = check_hello(self.hello, hello)
        self._buffer.max_payload = self.max_packet_payload
        announced = recv_rate_of(hello)
        if announced is not None and (self.send_pace is None or announced < self.send_pace):
            # Send no faster than the peer reads: what it cannot take yet waits in our
            # scheduler, where a higher-priority message overtakes it, not in the
            # kernels' buffers between us (specs/connection.md section 5).
            self.send_pace = float(announced)
            if self._send_bucket is None:
                self._send_bucket = TokenBucket(announced, now)
            else:
                self._send_bucket.set_rate(announced, now)
        self.set_packet_payload(self._payload_cap)
        self.peer_hello = hello
        events.append(HelloReceived(hello=hello, max_packet_payload=self.max_packet_payload))

    def _fail(self, error: RemoteProtocolError, events: list[object]) -> None:
        """The connection is over; the only thing left to send is a close naming why."""
        self.error = error
        if isinstance(error, PongTimeout):
            # The peer is presumed gone. If only our direction failed, a close packet would
            # end its session at once; a plain drop lets it suspend and resume instead.
            self._control[:] = []
        elif self.state is not _CLOSING:  # a close of ours already on its way says why
            text = str(error)[:CLOSE_TEXT_LIMIT]
            self._control[:] = [encode_extension(PacketType.CLOSE, encode_close(type(error).__name__, text))]
        self.state = _CLOSED
        self._buffer.discard()  # nothing more is read (a pong timeout fails between reads)
        events.append(ConnectionFailed(error=error))

    # -- outbound ----------------------------------------------------------------

    def _open_channel(self, channel_id: int, doing: str) -> Channel:
        """Channel ``channel_id`` of an open connection, else LocalProtocolError."""
        if self.state is not _OPEN:
            raise LocalProtocolError(f"cannot {doing} on channel {channel_id:#04x}: connection is {self.state.value}")
        channel = self.channels.get(channel_id)
        if channel is None:
            raise LocalProtocolError(f"channel {channel_id:#04x} is not one of this connection's channels")
        return channel

    def room(self, channel_id: int) -> int:
        """How many more messages channel ``channel_id``'s queue takes now (its
        ``send_queue_capacity`` less those waiting); 0 unless the connection is open.

        The send path asks first, so that a message is admitted to the session only when
        the queue will take it (mconn.switch.peer)."""
        channel = self.channels.get(channel_id)
        if channel is None:
            raise LocalProtocolError(f"channel {channel_id:#04x} is not one of this connection's channels")
        if self.state is not _OPEN:
            return 0
        room = channel.capacity - len(channel.queue)
        # Never below 0: re-sent messages (requeue) may fill a queue past its capacity.
        return room if room > 0 else 0  # (not max(): a builtin call per message sent)

    def queue_message(self, channel_id: int, message: bytes) -> bool:
        """Queue a whole message on one of our channels; False when its queue is full.

        On the per-message send path (after ``room``): ``Channel.enqueue`` inlined."""
        channel = self.channels.get(channel_id)
        if channel is None or self.state is not _OPEN:
            channel = self._open_channel(channel_id, "send")  # raises, naming which
        queue = channel.queue
        if len(queue) >= channel.capacity:
            return False
        if isinstance(queue, tuple) or channel.send_delay is not None:
            queue = channel.writable_queue()  # makes the deque; stamps a delay sample
        queue.append(message)
        return True

    def queue_messages(self, channel_id: int, messages: list[bytes]) -> int:
        """Queue whole messages in order while the channel's queue has room.

        :returns: how many were queued (a prefix of ``messages``): all of them when
            ``room(channel_id)`` said they fit.
        """
        channel = self._open_channel(channel_id, "send")
        taken = max(0, min(len(messages), channel.capacity - len(channel.queue)))
        if taken:
            queue = channel.writable_queue()
            queue.extend(messages if taken == len(messages) else messages[:taken])
        return taken

    def requeue(self, channel_id: int, messages: list[bytes]) -> None:
        """Put messages at the end of a channel's queue regardless of its capacity.

        For resumed sessions: re-sent messages were accepted before, so they never wait
        for room; new sends wait until the queue is back under its capacity.
        """
        self._open_channel(channel_id, "requeue").writable_queue().extend(messages)

    def send_ack(self, delivered: dict[int, int]) -> None:
        """Queue an ack packet (control: it goes out before data).

        Counts are cumulative, so an ack still queued unsent is replaced, not followed:
        acks never pile up behind a peer that does not read.
        """
        if self.state is _OPEN:
            packet = encode_extension(PacketType.ACK, encode_ack(delivered))
            control = self._control
            for i, queued in enumerate(control):
                if queued[0] == PacketType.ACK:
                    control[i] = packet
                    return
            control.append(packet)

    def send_session_answer(self, answer: SessionAnswer) -> None:
        """Queue the listener's session answer (before any data, specs/resume.md)."""
        if self.state is _OPEN:
            self._control.append(encode_extension(PacketType.SESSION, encode_session_answer(answer)))

    def send_fresh_session_answer(self, session_id: bytes, reason: str = "") -> None:
        """``send_session_answer`` of a fresh session's answer (not resumed, ``reason``
        why a resume was refused, if one was), from bytes encoded once per reason."""
        if self.state is _OPEN:
            if type(session_id) is not bytes or len(session_id) != SESSION_ID_BYTES:
                self.send_session_answer(SessionAnswer(session_id=session_id, resumed=False, reason=reason))
                return
            head, tail = fresh_answer_parts(reason)
            self._control.append(head + session_id + tail)

    def transport_lost(self) -> None:
        """The transport beneath is gone: the connection is closed, whatever its state."""
        self.state = TRANSITIONS[(self.state, Input.TRANSPORT_LOST)]

    def close(self, code: str, text: str = "") -> None:
        """Queue a close packet; nothing but it goes out afterwards."""
        if self.state in (_CLOSING, _CLOSED):
            return
        self.state = TRANSITIONS[(self.state, Input.CLOSE_SENT)]
        self._control.append(encode_extension(PacketType.CLOSE, encode_close(code, text[:CLOSE_TEXT_LIMIT])))

    @property
    def messages_taken(self) -> int:
        """Messages ``data_to_send`` has taken off the channel queues so far: when it has
        not grown, no queue has more room than before (the adapter's drain test)."""
        return self._scheduler.taken

    def wants_to_send(self) -> bool:
        return bool(self._control) or (self.state is _OPEN and self._scheduler.pending())

    def set_packet_payload(self, payload: int | None) -> None:
        """Cut msg packets of at most ``payload`` bytes from the next ``data_to_send`` on
        (``mconn.core.packet_size``; None: the negotiated ``max_packet_payload``), never above
        the negotiated size (specs/wire.md section 4) nor below ``MIN_PACKET_PAYLOAD``,
        which bounds the work per byte sent whatever is asked (both hellos announce at
        least that, so the floor is never above the negotiated size), nor above what
        ``send_pace`` drains in a quarter of its burst (``packet_size.payload_for_pace``)."""
        self._payload_cap = payload
        limit = self.max_packet_payload
        if self.send_pace is not None:
            limit = min(limit, payload_for_pace(self.send_pace))
        self._payload = limit if payload is None else max(MIN_PACKET_PAYLOAD, min(payload, limit))

    def data_to_send(self, now: float, budget: int | None = None) -> bytes:
        """The next bytes for the transport: control packets first, then scheduled data.

        ``budget`` caps the data bytes (default ``config.write_batch_bytes``); ``send_pace``
        caps it further: its bucket counts every byte returned, control packets included
        (they are never held back: they spend tokens, and data waits for them to be
        repaid). Msg packets are cut at ``set_packet_payload``'s size. Returns b"" when
        there is nothing to send now.
        """
        return b"".join(self.buffers_to_send(now, budget))

    def buffers_to_send(self, now: float, budget: int | None = None) -> list[Any]:
        """What ``data_to_send`` joins, unjoined: bytes and memoryviews (of queued
        messages, which are never changed) whose concatenation is the next bytes for the
        transport; [] when there is nothing to send now. A transport that can send a
        list of buffers at once (``socket.sendmsg``) skips the join's copy of a bulk
        write's payloads (``mconn.net.write_through.send_buffers``)."""
        if not self._control:
            for channel in self._channel_list:
                if channel.sending is not None or channel.queue:
                    break
            else:
                self.more_to_send = False  # the common call after a write: nothing left
                return []
        parts: list[Any] = []
        if self._control:
            parts.extend(self._control)
            self._control.clear()
        more = False
        if self.state is _OPEN:
            limit = self.config.write_batch_bytes if budget is None else budget
            if self._send_bucket is not None:
                tokens = self._send_bucket.available(now)
                if parts:
                    tokens -= sum(map(len, parts))  # the control packets go first
                limit = min(limit, int(tokens))
            if limit > 0:
                # The packets go straight after the control ones (channel.schedule).
                sent = active_schedule(self._scheduler, parts, now, self._payload, limit)
                # Short of the budget only when no channel has anything left.
                more = sent >= limit
        self.more_to_send = more
        if parts:
            size = sum(map(len, parts))
            self.bytes_sent += size
            if self._send_bucket is not None:
                self._send_bucket.spend(size, now)
        return parts

    # -- time --------------------------------------------------------------------

    def next_deadline(self, sending: bool = True) -> float | None:
        """When ``handle_timeout`` must next be called (None: no timer needed).

        ``sending=False`` (the transport paused us) leaves out send_pace's wake-up: the
        adapter pumps again when the transport resumes, so that time would be a busy loop.
        """
        if self.state is _CLOSED or self.state is _CLOSING:
            return None  # the adapter bounds the close itself (Config.close_linger)
        if self.state is _HANDSHAKING:
            return self._started + self.config.handshake_timeout
        if self._ping_sent_at is not None and self._awaiting_pong():
            deadline = self._ping_sent_at + self.config.pong_timeout
        else:
            deadline = self._last_received + self.config.ping_interval
        if self._awaiting_answer:
            deadline = min(deadline, self._started + self.config.handshake_timeout)
        if self._send_bucket is not None and self._scheduler.pending() and sending:
            # Only when the rate is what holds data back (not a paused transport).
            ready = self._send_bucket.ready_time()
            if ready is not None:
                deadline = min(deadline, ready)
        return deadline

    def probe(self, now: float) -> float:
        """Send a ping now (unless one is already out): is the peer still there?

        Used on a duplicate connection (specs/resume.md section 7). Returns the time the
        probe counts from; the peer answered if ``last_received`` passes it.
        """
        if self.state is _OPEN and not self._awaiting_pong():
            self._ping_sent_at = now
            self._queue_ping()
        return self._ping_sent_at if self._ping_sent_at is not None else now

    @property
    def last_received(self) -> float:
        """When bytes last arrived from the peer (the connection's start before any)."""
        return self._last_received

    def _awaiting_pong(self) -> bool:
        """A ping is out and nothing at all has arrived since."""
        return self._ping_sent_at is not None and self._last_received < self._ping_sent_at

    def receive_ready_at(self, now: float) -> float:
        """When recv_rate allows reading again (``now`` when it does already)."""
        ready = None if self._recv_bucket is None else self._recv_bucket.ready_time()
        return now if ready is None else max(now, ready)

    def handle_timeout(self, now: float) -> list[object]:
        """Run the timers that are due; returns the events they cause."""
        events: list[object] = []
        if self.state is _HANDSHAKING and now >= self._started + self.config.handshake_timeout:
            self._fail(
                HandshakeTimeout(f"no hello from the peer within handshake_timeout {self.config.handshake_timeout}s"),
                events,
            )
        elif self.state is _OPEN and self._awaiting_answer and now >= self._started + self.config.handshake_timeout:
            self._fail(
                HandshakeTimeout(
                    f"no session answer from the listener within handshake_timeout {self.config.handshake_timeout}s"
                ),
                events,
            )
        elif self.state is _OPEN:
            if self._ping_sent_at is not None and self._awaiting_pong():
                if now >= self._ping_sent_at + self.config.pong_timeout:
                    self._fail(
                        PongTimeout(
                            f"nothing received within pong_timeout {self.config.pong_timeout}s after our ping "
                            f"(last data {now - self._last_received:.3f}s ago)"
                        ),
                        events,
                    )
            elif now >= self._last_received + self.config.ping_interval:
                self._ping_sent_at = now
                self._queue_ping()
        return events

    def overdue(self, now: float) -> bool:
        """Whether ``handle_timeout(now)`` would fail the connection: its handshake or the
        pong of our ping overdue. After a stall of its own event loop the adapter gives
        such a verdict one more loop turn (specs/connection.md section 3); a ping due needs
        none."""
        config = self.config
        handshaking = self.state is _HANDSHAKING or (self.state is _OPEN and self._awaiting_answer)
        if handshaking and now >= self._started + config.handshake_timeout:
            return True
        sent = self._ping_sent_at
        return (
            self.state is _OPEN
            and sent is not None
            and self._last_received < sent
            and now >= sent + config.pong_timeout
        )

    def _queue_ping(self) -> None:
        """Queue our ping, unless one is still queued unsent: a peer that sends now and
        then but never reads would otherwise make us keep one more ping every interval
        (the queue holds at most ``max_control_backlog`` pongs and one ping of ours)."""
        if PING_BYTES not in self._control:
            self._control.append(PING_BYTES)
