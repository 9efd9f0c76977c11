# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The compiled twin of the per-packet path: what ``mconn.core.frame_buffer`` and
``mconn.core.channel`` use when this extension is built and ``MCONN_PURE`` is not 1.

Each function here does exactly what its pure-Python reference does, byte for byte and
error for error (the same packets, positions, exception types and messages):

* ``decode_packets``: ``mconn.core.frame_buffer.decode_packets``, the frame buffer's
  decoder of a run of packets;
* ``msg_header``: ``mconn.core.channel.msg_header``, a msg packet's header;
* ``process_msgs``: ``mconn.core.connection.process_msgs``, the msg fast path of a
  connection's received packets (reassembly and one ``MessageReceived`` a message).

tests/core/test_speedups_twin.py and tests/core/test_speedups_process.py prove it with hypothesis on valid and malformed input;
the pure functions are the specification, this file only makes them cheaper (typed
indexing of the bytes instead of boxed integers, one C loop for a run's headers).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp

from mconn.core.events import MessageReceived
from mconn.errors import MalformedPacket, PacketTooLarge, UnknownChannel, UnknownPacketType

# The wire constants (specs/wire.md section 2); test_speedups_twin checks them against
# mconn.core.wire and mconn.core.wire_primitives.
cdef enum:
    C_PING = 0x01
    C_PONG = 0x02
    C_MSG = 0x03
    C_FIRST_EXTENSION_TYPE = 0x04
    C_MAX_UVARINT_SIZE = 8
    C_RUN = 0x100

#: Checked by mconn.core.speedups: a build of an older source is not used.
INTERFACE = 3

PING = C_PING
PONG = C_PONG
MSG = C_MSG
FIRST_EXTENSION_TYPE = C_FIRST_EXTENSION_TYPE
MAX_UVARINT_SIZE = C_MAX_UVARINT_SIZE
RUN = C_RUN

cdef tuple _PING_PACKET = (C_PING,)
cdef tuple _PONG_PACKET = (C_PONG,)


cdef object _bad_eof(int channel_id, int eof):
    return MalformedPacket(
        f"msg packet on channel {channel_id:#04x} has eof byte {eof:#04x}; only 0x00 and 0x01 are allowed"
    )


cdef object _bad_size(int size, str what):
    return MalformedPacket(f"{what} length has size byte {size:#04x}, over the go-wire maximum {C_MAX_UVARINT_SIZE}")


cdef object _check_partial_length(bytes head, int size, object limit, str what):
    lower_bound = int.from_bytes(head, "big") << (8 * (size - len(head)))
    if lower_bound > limit:
        return PacketTooLarge(f"{what} declares at least {lower_bound} bytes, over its limit {limit}")
    return None


cdef inline unsigned long long _be(const unsigned char *p, Py_ssize_t size):
    """A big-endian unsigned integer of ``size`` (at most 8) bytes."""
    cdef unsigned long long value = 0
    cdef Py_ssize_t i
    for i in range(size):
        value = (value << 8) | p[i]
    return value


def decode_packets(
    bytes data,
    Py_ssize_t pos,
    Py_ssize_t stop,
    bint stop_after_extension,
    Py_ssize_t base,
    object max_payload,
    bytes full_tail,
    Py_ssize_t stream_min,
    extension_limits,
    object default_extension_limit,
):
    """See ``mconn.core.frame_buffer.decode_packets``: the same arguments and result.

    A limit past what a C integer holds (tests use 1 << 64 for "none") works as in the
    reference: no length exceeds it, and no full packet is that long."""
    cdef const unsigned char *p = <const unsigned char *> PyBytes_AS_STRING(data)
    cdef const unsigned char *tail_p = <const unsigned char *> PyBytes_AS_STRING(full_tail)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t tail_len = PyBytes_GET_SIZE(full_tail)
    cdef Py_ssize_t full_skip = 2 + tail_len
    # A full packet's payload, capped where no packet of this read can be one that long.
    cdef Py_ssize_t payload = max_payload if max_payload <= n else n + 1
    cdef Py_ssize_t stride = full_skip + payload
    # The largest length accepted (a go-wire length has at most 8 bytes: 64 bits).
    cdef unsigned long long max_length = max_payload if max_payload < 0xFFFFFFFFFFFFFFFF else 0xFFFFFFFFFFFFFFFF
    cdef Py_ssize_t count, c, end, start, size, k, q
    cdef unsigned long long length
    cdef int t, eof, channel_id
    cdef int run_channel = -1
    cdef Py_ssize_t run_at = -1
    cdef list out = []
    cdef list run = None
    cdef list views
    cdef object mv = memoryview(data)
    cdef object error = None
    cdef object limit
    cdef object partial = None
    cdef bint stopped = False
    while pos < stop:
        t = p[pos]
        if t == C_MSG:
            # 03 | ch | eof | size | len (size bytes) | data
            if (
                pos + 2 + tail_len <= n
                and memcmp(p + pos + 2, tail_p, tail_len) == 0
                and pos + stride <= n
            ):
                # A full, not-last packet: the packets after it of the same channel that
                # are full too, up to those starting before ``stop``, join its run.
                channel_id = p[pos + 1]
                count = min((n - pos) // stride, (stop - pos - 1) // stride + 1)
                c = 1
                while c < count:
                    q = pos + c * stride
                    if p[q] != C_MSG or p[q + 1] != channel_id or memcmp(p + q + 2, tail_p, tail_len) != 0:
                        break
                    c += 1
                end = pos + c * stride
                views = [mv[k : k + payload] for k in range(pos + full_skip, end, stride)]
                if run_channel == channel_id and run_at == len(out) - 1:
                    run += views  # the run is the last packet out: it goes on
                else:
                    run_channel = channel_id
                    run = views
                    run_at = len(out)
                    out.append((C_RUN, run_channel, run))
                pos = end
                continue
            if pos + 4 > n:
                if pos + 2 < n and p[pos + 2] > 1:
                    error = _bad_eof(p[pos + 1], p[pos + 2])
                break
            eof = p[pos + 2]
            if eof > 1:
                error = _bad_eof(p[pos + 1], eof)
                break
            size = p[pos + 3]
            if size > C_MAX_UVARINT_SIZE:
                error = _bad_size(size, "msg")
                break
            start = pos + 4 + size
            if start > n:
                # The length is not all here; its leading bytes may already be too big.
                error = _check_partial_length(data[pos + 4 : n], size, max_payload, "msg")
                break
            length = _be(p + pos + 4, size)
            if length > max_length:
                error = PacketTooLarge(
                    f"msg packet on channel {p[pos + 1]:#04x} declares {length} payload "
                    f"bytes, over max_packet_payload {max_payload}"
                )
                break
            if length > <unsigned long long> (n - start):
                # Not all here. (Compared before adding: a length of 2**63 or more, which
                # only an unlimited max_payload lets through, would wrap a C sum.)
                if stream_min >= 0 and length >= <unsigned long long> stream_min:
                    # Stream the payload: out goes what is here (frame_buffer's docstring).
                    partial = [p[pos + 1], eof, (<object> length) - (n - start), n > start]
                    if n > start:
                        out.append((C_RUN, p[pos + 1], [mv[start:n]]))
                    pos = n
                break
            end = start + <Py_ssize_t> length
            if eof:
                out.append((C_MSG, p[pos + 1], 1, PyBytes_FromStringAndSize(<const char *> p + start, end - start)))
            else:
                out.append((C_MSG, p[pos + 1], 0, mv[start:end]))
            pos = end
        elif t == C_PING:
            out.append(_PING_PACKET)
            pos += 1
        elif t == C_PONG:
            out.append(_PONG_PACKET)
            pos += 1
        elif t >= C_FIRST_EXTENSION_TYPE:
            if pos + 2 > n:
                break
            size = p[pos + 1]
            if size > C_MAX_UVARINT_SIZE:
                error = _bad_size(size, f"extension {t:#04x}")
                break
            start = pos + 2 + size
            limit = extension_limits.get(t, default_extension_limit)
            if start > n:
                error = _check_partial_length(data[pos + 2 : n], size, limit, f"extension {t:#04x}")
                break
            length = _be(p + pos + 2, size)
            if length > limit:
                error = PacketTooLarge(f"extension packet {t:#04x} declares a {length}-byte body, over its limit {limit}")
                break
            if length > <unsigned long long> (n - start):
                break  # not all here (compared before adding, as for a msg packet)
            end = start + <Py_ssize_t> length
            out.append((t, PyBytes_FromStringAndSize(<const char *> p + start, end - start)))
            pos = end
            if stop_after_extension:
                stopped = pos < n
                break
        else:
            error = UnknownPacketType(f"unknown packet type {t:#04x} at stream offset +{base + pos}")
            break
    return out, pos, error, stopped, partial


def msg_header(int channel_id, eof, Py_ssize_t length):
    """See ``mconn.core.channel.msg_header``: 03 | ch | eof | uvarint length."""
    cdef unsigned char buf[4 + C_MAX_UVARINT_SIZE]
    cdef Py_ssize_t size = 0
    cdef unsigned long long value = <unsigned long long> length
    cdef Py_ssize_t i
    if length < 0 or not 0 <= channel_id <= 255:
        raise ValueError(f"msg header of channel {channel_id} and length {length}: out of range")
    while value:
        size += 1
        value >>= 8
    buf[0] = C_MSG
    buf[1] = <unsigned char> channel_id
    buf[2] = 1 if eof else 0
    buf[3] = <unsigned char> size
    value = <unsigned long long> length
    for i in range(size):
        buf[4 + size - 1 - i] = <unsigned char> (value & 0xFF)
        value >>= 8
    return PyBytes_FromStringAndSize(<const char *> buf, 4 + size)


def process_msgs(list packets, Py_ssize_t i, dict channels, object append):
    """See ``mconn.core.connection.process_msgs``: the same arguments, result, events,
    channel state and errors."""
    cdef Py_ssize_t n = len(packets)
    cdef Py_ssize_t size
    cdef tuple packet
    cdef object kind, channel, message, stats, channel_id, event
    cdef object new_event = MessageReceived.__new__
    while i < n:
        packet = packets[i]  # a tuple (the decoder's packets); anything else: TypeError
        kind = packet[0]
        if kind == C_MSG:
            channel_id = packet[1]
            channel = channels.get(channel_id)
            if channel is None:
                raise _unknown_channel(channel_id, channels)
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
            # MessageReceived(channel_id=channel_id, message=message), without running
            # the dataclass's __init__ in Python: the same two slots set on a new object.
            event = new_event(MessageReceived)
            event.channel_id = channel_id
            event.message = message
            append(event)
        elif kind == C_RUN:
            channel_id = packet[1]
            channel = channels.get(channel_id)
            if channel is None:
                raise _unknown_channel(channel_id, channels)
            channel.reassemble_run(packet[2])
        else:
            return i
        i += 1
    return n


cdef object _unknown_channel(object channel_id, dict channels):
    return UnknownChannel(
        f"msg packet on channel {channel_id:#04x}, which this node does not have "
        f"(channels: {', '.join([f'{c:#04x}' for c in channels]) or 'none'})"
    )
