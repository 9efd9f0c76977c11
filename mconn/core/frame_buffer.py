"""Bytes in, whole packets out: the incremental decoder of the inbound stream.

Theory of operation. MConnection packets carry no outer length (specs/wire.md section 2),
so the buffer walks each packet's header as bytes arrive: the type byte; for a msg
packet the channel, eof and go-wire length; for an extension packet its length. Every
length is checked against its limit *before* a byte of the body is kept (as h2's
``h2/frame_buffer.py`` does), and every header byte is validated as soon as it arrives,
so a one-byte-at-a-time stream fails at the same byte as a whole one. Only an incomplete
packet's bytes stay buffered between calls, so the buffer never holds more than one
packet's header plus its limit.

Decoded packets are plain tuples for speed; tests/core/test_codec_equivalence.py proves
this decoder agrees with the construct declarations of wire.py:

    (PING,)  (PONG,)  (MSG, channel_id, eof, data)  (type, body: bytes)
    (RUN, channel_id, [data: memoryview or bytes, ...])

A msg packet's data is bytes when eof is set (a message's last packet, the whole of a
small one: passed on without another copy; a view only for the end of a streamed
payload, below), otherwise a memoryview into the read. RUN stands for consecutive whole
msg packets of one channel with eof 00 (the middle of a message, whatever their sizes),
one tuple for the lot, so that a read costs the reassembly one step per run instead of
one per packet; only a lone not-last packet under ``KEEP_VIEW_MIN`` bytes comes as the
msg packet it is (packets of channels that alternate). A payload of ``KEEP_VIEW_MIN``
bytes or more (channel.py) is a memoryview into the read (no copy before the message's
join); consecutive smaller ones are copied together, in one pass, into one bytes object
(the reassembly would copy them anyway, one call each: a peer that announces 1024, or a
sender that cuts small packets, costs per read what 64 KiB packets do). That copy holds
only bytes of whole packets of the read, so it is bounded by the read, not by a length.
Full packets (``max_payload`` bytes) are found many headers at a time.

A run holds no last packet, so no message completes inside it: a channel's
``recv_message_capacity`` is checked once for the run (``Channel.reassemble_run``), and
``MessageTooLarge`` names the size the message would reach with the whole run (a packet
by packet check would name the first size over the capacity); it is raised at the same
place among the events, and the messages before it are delivered. A bad packet ends the
run before it: the decoder stops there with the error that packet alone gives.

Streaming (``stream_payloads``, what a Connection uses): a msg packet of at least
``STREAM_MIN`` payload bytes whose payload a read leaves incomplete is not kept until it
is whole. The payload bytes that have arrived come out at once as a RUN of one view (bytes
of the channel's message in progress, whatever packet they belong to), and the next feeds
continue that payload: a RUN for each part, and the packet's end as a msg packet (eof 01:
with the rest of the payload; eof 00: a RUN, one with the run of not-last packets after
it when that is the same channel's, so that the reassembly sees the parts of the read
together). Its header was checked in full before
(length within max_payload), so nothing but the header of one packet is ever kept, and
a large packet split by the reads is copied once, into the reassembly buffer, instead of
kept, joined and copied again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from mconn.errors import MalformedPacket, PacketTooLarge, UnknownPacketType
from mconn.core.channel import KEEP_VIEW_MIN
from mconn.core.wire import FIRST_EXTENSION_TYPE, PacketType
from mconn.core.wire_primitives import MAX_UVARINT_SIZE
from mconn.core.speedups import SPEEDUPS

#: Not a wire type: a run of not-last msg packets of one channel (module docstring).
RUN = 0x100
PING = PacketType.PING.value
PONG = PacketType.PONG.value
MSG = PacketType.MSG.value

_PING_PACKET = (PING,)
_PONG_PACKET = (PONG,)


class FrameBuffer:
    """Splits the inbound byte stream into packets, enforcing size limits early.

    :param max_payload: the largest msg packet payload accepted.
    :param extension_limits: the largest body accepted per extension type; types not
        listed use ``default_extension_limit``. A dict is copied; a read-only mapping
        (``types.MappingProxyType``) is shared.
    """

    def __init__(
        self,
        *,
        max_payload: int,
        default_extension_limit: int,
        extension_limits: Mapping[int, int] | None = None,
        stream_payloads: bool = False,
    ) -> None:
        self.max_payload = max_payload
        self.default_extension_limit = default_extension_limit
        # A read-only mapping is kept as it is (connections with one Config share one).
        limits = extension_limits
        self.extension_limits: Mapping[int, int] = limits if type(limits) is MappingProxyType else dict(limits or {})
        self.stream_payloads = stream_payloads
        #: The msg packet whose payload is being streamed: [channel id, eof, bytes still
        #: to come, whether any came out], or None.
        self._partial: list[Any] | None = None
        self._tail = b""
        #: True when the last ``feed`` stopped after an extension packet with bytes left.
        self.paused = False

    @property
    def max_payload(self) -> int:
        """The largest msg packet payload accepted."""
        return self._max_payload

    @max_payload.setter
    def max_payload(self, value: int) -> None:
        self._max_payload = value
        size = (value.bit_length() + 7) // 8
        # eof 00 | size | length: how a full (not last) packet of a message continues
        # after its channel byte. Spotting it with one comparison is the bulk fast path.
        self._full_tail = bytes((0, size)) + value.to_bytes(size, "big")

    @property
    def buffered(self) -> int:
        """Bytes held back because their packet is not complete yet."""
        return len(self._tail)

    def discard(self) -> None:
        """Drop what is held: an incomplete packet, or the rest of a read kept after an
        extension packet (``paused``). For a stream that has ended: nothing more is decoded."""
        self._tail = b""
        self._partial = None
        self.paused = False

    #: Fed more than this many bytes while an incomplete packet is buffered, ``feed``
    #: completes that packet from a bounded prefix of the new bytes and decodes the rest
    #: in place, instead of copying all of them behind it (a bulk stream leaves a tail
    #: after nearly every read). Tests set it to 0 to run that path on every feed.
    SPLICE_MIN = 4096
    #: With ``stream_payloads``, a msg packet's payload is streamed once it declares at
    #: least this many bytes (smaller ones are kept until whole, as without streaming).
    STREAM_MIN = 4096

    def feed(self, data: bytes, *, stop_after_extension: bool = True) -> tuple[list[Any], MalformedPacket | None]:
        """Decode as many whole packets as ``data`` completes.

        Returns ``(packets, error)``. ``error`` is a MalformedPacket subclass when the
        stream broke the format; the packets before the bad bytes are still returned, and
        the buffer must not be fed again. With ``stop_after_extension`` decoding pauses
        after each extension packet (the caller may change limits after a hello); call
        ``feed(b"")`` to go on.
        """
        if self._partial is not None:
            head, start = self._continue_payload(data)
            if start == len(data):
                return head, None
            out, pos, error, stopped = self._decode(data, start, len(data), stop_after_extension, 0)
            # The end of one packet and the packets after it, of one channel, in one run:
            # the reassembly sees how much of this read they are together.
            _join_runs(head, out)
            return head + out, self._keep(data, pos, error, stopped)
        tail = self._tail
        if tail:
            if len(data) > self.SPLICE_MIN:
                done = self._feed_spliced(tail, data, stop_after_extension)
                if done is not None:
                    return done
            data = tail + data
        out, pos, error, stopped = self._decode(data, 0, len(data), stop_after_extension, 0)
        if error is None and pos == len(data) and not stopped:
            self.paused = False  # the usual end: nothing kept
            self._tail = b""
            return out, None
        return out, self._keep(data, pos, error, stopped)

    def _continue_payload(self, data: bytes) -> tuple[list[Any], int]:
        """The next bytes of the payload being streamed: its packets, and where in
        ``data`` the packets after it begin (``len(data)`` when it goes on past it)."""
        partial = self._partial
        assert partial is not None
        channel_id, eof, left, streamed = partial
        take = min(left, len(data))
        if take < left:
            partial[2] = left - take
            partial[3] = streamed or take > 0
            return ([(RUN, channel_id, [memoryview(data)])] if take else []), take
        self._partial = None
        if not eof:
            return ([(RUN, channel_id, [memoryview(data)[:take]])] if take else []), take
        # The message's last packet ends here: its first bytes are already in the
        # reassembly buffer (a view of the rest), or none came out (bytes, whole).
        rest = memoryview(data)[:take] if streamed else data[:take]
        return [(MSG, channel_id, 1, rest)], take

    def _keep(self, data: bytes, pos: int, error: MalformedPacket | None, stopped: bool) -> MalformedPacket | None:
        """Keep what follows ``pos`` (an incomplete packet, or bytes after a pause)."""
        self.paused = stopped
        self._tail = b"" if error is not None or pos >= len(data) else bytes(memoryview(data)[pos:])
        return error

    def _feed_spliced(
        self, tail: bytes, data: bytes, stop_after_extension: bool
    ) -> tuple[list[Any], MalformedPacket | None] | None:
        """``feed`` of ``tail + data`` without building it: the packet that ``tail``
        begins is completed from at most one packet's worth of ``data``, the rest is
        decoded from ``data`` itself. None when that does not apply (after a pause
        ``tail`` holds whole packets): the caller joins the two instead."""
        if self.paused:
            return None
        t = tail[0]  # the type of the one incomplete packet kept
        limit = self._max_payload + 2 if t == MSG else self.extension_limits.get(t, self.default_extension_limit)
        head = tail + data[: 2 + MAX_UVARINT_SIZE + limit]
        kept = len(tail)
        # Only packets that start inside ``tail``: the last of them ends inside ``head``.
        out, pos, error, stopped = self._decode(head, 0, kept, stop_after_extension, 0)
        if error is not None:
            return out, self._keep(head, pos, error, stopped)
        if pos < kept:
            return None
        pos -= kept
        if not stopped:
            more, pos, error, stopped = self._decode(data, pos, len(data), stop_after_extension, kept)
            _join_runs(out, more)  # the completed packet and the run after it: one step
            out += more
        return out, self._keep(data, pos, error, stopped)

    def _decode(
        self, data: bytes, pos: int, stop: int, stop_after_extension: bool, base: int
    ) -> tuple[list[Any], int, MalformedPacket | None, bool]:
        """Decode the packets of ``data`` that start at ``pos`` up to ``stop``:
        ``(packets, position after the last whole one, error, paused)``. ``base`` is
        where ``data`` starts in what ``feed`` was given (for error messages). The
        compiled twin of ``decode_packets`` takes bytes only; anything else (a bytearray
        a test feeds) goes to the pure function."""
        decode = _decode_packets if type(data) is bytes else decode_packets
        out, pos, error, stopped, partial = decode(
            data,
            pos,
            stop,
            stop_after_extension,
            base,
            self._max_payload,
            self._full_tail,
            self.STREAM_MIN if self.stream_payloads else -1,
            self.extension_limits,
            self.default_extension_limit,
        )
        if partial is not None:
            self._partial = partial
        return out, pos, error, stopped


def _join_runs(first: list[Any], then: list[Any]) -> None:
    """When ``first`` ends with a run and ``then`` begins with one of the same channel
    (the packets of one read decoded in two parts), make them one: the payloads of the
    second go to the first, and it leaves ``then``."""
    if first and then and first[-1][0] == RUN and then[0][0] == RUN and first[-1][1] == then[0][1]:
        first[-1][2].extend(then[0][2])
        del then[0]


def decode_packets(
    data: bytes,
    pos: int,
    stop: int,
    stop_after_extension: bool,
    base: int,
    max_payload: int,
    full_tail: bytes,
    stream_min: int,
    extension_limits: Mapping[int, int],
    default_extension_limit: int,
) -> tuple[list[Any], int, MalformedPacket | None, bool, list[Any] | None]:
    """Decode the packets of ``data`` that start at ``pos`` up to ``stop`` (the reference
    of the compiled twin, mconn/core/_speedups.pyx): ``(packets, position after the last
    whole one, error, paused, partial)``. ``base`` is where ``data`` starts in what
    ``feed`` was given (for error messages); ``full_tail`` what follows the channel byte
    of a full, not-last packet (``FrameBuffer.max_payload``); ``stream_min`` the payload
    from which an incomplete msg packet is streamed (-1: none is), and then ``partial``
    is the streamed packet's state (``FrameBuffer.feed`` goes on with it), else None."""
    mv = memoryview(data)
    n = len(data)
    out: list[Any] = []
    append = out.append
    partial: list[Any] | None = None
    error: MalformedPacket | None = None
    stopped = False
    while pos < stop:
        t = data[pos]
        if t == MSG:
            # 03 | ch | eof | size | len (size bytes) | data
            if pos + 4 > n:
                if pos + 2 < n and data[pos + 2] > 1:
                    error = _bad_eof(data[pos + 1], data[pos + 2])
                break
            eof = data[pos + 2]
            if eof > 1:
                error = _bad_eof(data[pos + 1], eof)
                break
            size = data[pos + 3]
            if size > MAX_UVARINT_SIZE:
                error = _bad_size(size, "msg")
                break
            start = pos + 4 + size
            if start > n:
                # The length is not all here; its leading bytes may already be too big.
                error = _check_partial_length(data[pos + 4 : n], size, max_payload, "msg")
                break
            if size == 1:
                length = data[pos + 4]
            elif size == 2:
                length = (data[pos + 4] << 8) | data[pos + 5]
            else:
                length = int.from_bytes(data[pos + 4 : start], "big")
            if length > max_payload:
                error = PacketTooLarge(
                    f"msg packet on channel {data[pos + 1]:#04x} declares {length} payload "
                    f"bytes, over max_packet_payload {max_payload}"
                )
                break
            end = start + length
            if end > n:
                if stream_min >= 0 and length >= stream_min:
                    # Stream the payload (see the module docstring): out goes what is here.
                    partial = [data[pos + 1], eof, end - n, n > start]
                    if n > start:
                        append((RUN, data[pos + 1], [mv[start:n]]))
                    pos = n
                break
            if eof:
                # A message's last packet comes as bytes: usually the whole message,
                # which the connection hands on as it is.
                append((MSG, data[pos + 1], 1, data[start:end]))
                pos = end
            elif length < KEEP_VIEW_MIN and not (
                end < stop
                and end + 4 <= n
                and data[end] == MSG
                and data[end + 1] == data[pos + 1]
                and data[end + 2] == 0
            ):
                # A small not-last packet alone (no packet of its run follows): a view.
                append((MSG, data[pos + 1], 0, mv[start:end]))
                pos = end
            else:
                # It and the whole not-last packets of its channel after it: one run.
                packet, pos = _run(data, mv, pos, stop, max_payload, full_tail)
                append(packet)
        elif t == PING:
            append(_PING_PACKET)
            pos += 1
        elif t == PONG:
            append(_PONG_PACKET)
            pos += 1
        elif t >= FIRST_EXTENSION_TYPE:
            if pos + 2 > n:
                break
            size = data[pos + 1]
            if size > MAX_UVARINT_SIZE:
                error = _bad_size(size, f"extension {t:#04x}")
                break
            start = pos + 2 + size
            limit = extension_limits.get(t, default_extension_limit)
            if start > n:
                error = _check_partial_length(data[pos + 2 : n], size, limit, f"extension {t:#04x}")
                break
            length = int.from_bytes(data[pos + 2 : start], "big")
            if length > limit:
                error = PacketTooLarge(
                    f"extension packet {t:#04x} declares a {length}-byte body, over its limit {limit}"
                )
                break
            end = start + length
            if end > n:
                break
            append((t, bytes(mv[start:end])))
            pos = end
            if stop_after_extension:
                stopped = pos < n
                break
        else:
            error = UnknownPacketType(f"unknown packet type {t:#04x} at stream offset +{base + pos}")
            break
    return out, pos, error, stopped, partial


def _bad_eof(channel_id: int, eof: int) -> MalformedPacket:
    return MalformedPacket(
        f"msg packet on channel {channel_id:#04x} has eof byte {eof:#04x}; only 0x00 and 0x01 are allowed"
    )


def _bad_size(size: int, what: str) -> MalformedPacket:
    return MalformedPacket(f"{what} length has size byte {size:#04x}, over the go-wire maximum {MAX_UVARINT_SIZE}")


def _check_partial_length(head: bytes, size: int, limit: int, what: str) -> MalformedPacket | None:
    """With only the first bytes of a big-endian length, fail early if it must exceed ``limit``."""
    lower_bound = int.from_bytes(head, "big") << (8 * (size - len(head)))
    if lower_bound > limit:
        return PacketTooLarge(f"{what} declares at least {lower_bound} bytes, over its limit {limit}")
    return None


def _run(data: bytes, mv: memoryview, pos: int, stop: int, max_payload: int, full_tail: bytes) -> tuple[Any, int]:
    """The run of not-last msg packets that starts at ``pos``: the whole, valid msg
    packets with eof 00 of the channel of the one at ``pos``, one after the other, that
    start before ``stop``. Returns ``(packet, position after the run)``: the position is
    ``pos`` (and the packet None) when the packet at ``pos`` is not one: incomplete, or
    malformed (``decode_packets`` reads it again and says what is wrong).

    The packet is ``(RUN, channel_id, payloads)``: a payload of ``KEEP_VIEW_MIN`` bytes or
    more is a view of ``data``; consecutive smaller ones are copied together into one
    bytes object, so that the reassembly takes a read's small packets in one step
    (mconn.core.channel: it would copy them anyway). A run of one small packet is the msg
    packet it is, ``(MSG, channel_id, 0, view)``: a copy of it alone would gain nothing.
    Full packets (``full_tail``: max_payload bytes) are found many at a time (_run_length).
    """
    n = len(data)
    channel_id = data[pos + 1]
    full_skip = 2 + len(full_tail)  # a full packet's header
    stride = full_skip + max_payload
    full_header = bytes((MSG, channel_id)) + full_tail
    pieces: list[Any] = []
    small: list[Any] = []  # the small payloads since the last view, to copy together
    while pos < stop and pos + 4 <= n and data[pos] == MSG and data[pos + 1] == channel_id:
        if data.startswith(full_tail, pos + 2) and pos + stride <= n:
            count = min((n - pos) // stride, (stop - pos - 1) // stride + 1)
            if count > 1:
                count = _run_length(data, pos, count, stride, full_header)
            end = pos + count * stride
            views = [mv[start : start + max_payload] for start in range(pos + full_skip, end, stride)]
        else:
            size = data[pos + 3]
            start = pos + 4 + size
            if data[pos + 2] != 0 or size > MAX_UVARINT_SIZE or start > n:
                break
            end = start + int.from_bytes(data[pos + 4 : start], "big")
            if end - start > max_payload or end > n:
                break
            views = [mv[start:end]]
        if len(views[0]) < KEEP_VIEW_MIN:
            small += views
        else:
            if small:
                pieces.append(b"".join(small))
                small = []
            pieces += views
        pos = end
    if small:
        if not pieces and len(small) == 1:
            return (MSG, channel_id, 0, small[0]), pos
        pieces.append(b"".join(small))
    return ((RUN, channel_id, pieces) if pieces else None), pos


def _run_length(data: bytes, pos: int, count: int, stride: int, header: bytes) -> int:
    """How many of the ``count`` packets spaced ``stride`` bytes apart from ``pos`` on
    (the first known to start with ``header``) all start with ``header``: at least
    one, at most ``count``, and only ever a prefix in which every one does.

    Each header byte is compared across the packets at once, as one strided slice,
    instead of one packet at a time; on a mismatch the count halves.
    """
    while count > 1:
        end = pos + count * stride
        for j in range(len(header)):
            if data[pos + j : end : stride] != header[j : j + 1] * count:
                break
        else:
            return count
        count //= 2
    return 1


#: What ``FrameBuffer`` decodes bytes with: the compiled twin when it is in use
#: (mconn.core.speedups), else the reference above.
_decode_packets: Callable[..., tuple[list[Any], int, MalformedPacket | None, bool, list[Any] | None]] = (
    decode_packets if SPEEDUPS is None else SPEEDUPS.decode_packets
)
