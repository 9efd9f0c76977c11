# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The compiled twin of the per-packet path: what ``mconn.core.frame_buffer`` and
``mconn.core.channel`` use when this extension is built and ``MCONN_PURE`` is not 1.

Each function here does exactly what its pure-Python reference does, byte for byte and
error for error (the same packets, positions, exception types and messages):

* ``decode_packets``: ``mconn.core.frame_buffer.decode_packets``, the frame buffer's
  decoder of a run of packets;
* ``msg_header``: ``mconn.core.channel.msg_header``, a msg packet's header;
* ``process_msgs``: ``mconn.core.connection.process_msgs``, the msg fast path of a
  connection's received packets (reassembly and one ``MessageReceived`` a message);
* ``schedule``: ``mconn.core.channel.schedule``, the scheduler's pick across channels and
  the framing of their packets (the same bytes: a run of small packets is framed into
  one bytes object where the reference lists headers and payloads to join);
* ``admit``, ``record_delivered``: ``mconn.core.session.Session``'s methods of those names
  (``session.reference_admit``, ``reference_record_delivered``), the per-message
  counters of a session's sending and receiving.

tests/core/test_speedups_twin.py, test_speedups_process.py, test_speedups_send.py and
test_speedups_session.py prove it with hypothesis on valid and malformed input; the pure
functions are the specification, this file only makes them cheaper (typed indexing of
the bytes instead of boxed integers, one C loop for a run's headers, slots read where
they are stored).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.math cimport INFINITY, exp, log
from libc.string cimport memcmp, memcpy

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
    C_COPY_MAX = 4096
    C_KEEP_VIEW_MIN = 4096

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

# The scheduler's constants (mconn.core.channel; test_speedups_send checks them).
cdef double C_DECAY_TAU = 2.0 / log(1.25)
cdef double C_RESCALE_EXPONENT = log(1e12)

#: Checked by mconn.core.speedups: a build of an older source is not used.
INTERFACE = 7

PING = C_PING
PONG = C_PONG
MSG = C_MSG
FIRST_EXTENSION_TYPE = C_FIRST_EXTENSION_TYPE
MAX_UVARINT_SIZE = C_MAX_UVARINT_SIZE
RUN = C_RUN
KEEP_VIEW_MIN = C_KEEP_VIEW_MIN
DECAY_TAU = C_DECAY_TAU
RESCALE_EXPONENT = C_RESCALE_EXPONENT

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
    reference: no length exceeds it. ``full_tail`` is not needed here: a run's headers
    are walked one by one in C, full packets or not (the reference compares them many
    at a time instead)."""
    cdef const unsigned char *p = <const unsigned char *> PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    # The largest length accepted (a go-wire length has at most 8 bytes: 64 bits).
    cdef unsigned long long max_length = max_payload if max_payload < 0xFFFFFFFFFFFFFFFF else 0xFFFFFFFFFFFFFFFF
    cdef Py_ssize_t end, start, size
    cdef unsigned long long length
    cdef int t, eof
    cdef list out = []
    cdef object packet
    cdef object mv = memoryview(data)
    cdef object error = None
    cdef object limit
    cdef object partial = None
    cdef bint stopped = False
    while pos < stop:
        t = p[pos]
        if t == C_MSG:
            # 03 | ch | eof | size | len (size bytes) | data
            if pos + 4 <= n and p[pos + 2] == 0:
                # A not-last packet: it and the whole not-last packets of its channel
                # right after it are one run (_run); anything else is read below.
                packet = _run(p, n, pos, stop, max_length, mv, &end)
                if end > pos:
                    out.append(packet)
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
            # A message's last packet (a whole not-last one is a run's, above), as bytes.
            end = start + <Py_ssize_t> length
            out.append((C_MSG, p[pos + 1], 1, PyBytes_FromStringAndSize(<const char *> p + start, end - start)))
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


cdef object _run(
    const unsigned char *p,
    Py_ssize_t n,
    Py_ssize_t pos,
    Py_ssize_t stop,
    unsigned long long max_length,
    object mv,
    Py_ssize_t *end_at,
):
    """``frame_buffer._run``: the run of not-last msg packets of one channel from ``pos``
    as one packet, ``(RUN, channel_id, payloads)`` (views from ``KEEP_VIEW_MIN`` bytes on,
    smaller consecutive ones copied into one bytes object) or, for one small packet
    alone, ``(MSG, channel_id, 0, view)``; ``end_at`` gets the position after it (``pos``,
    and the packet is None, when the packet there is not one)."""
    cdef int channel_id = p[pos + 1]
    cdef Py_ssize_t size, start, end
    cdef unsigned long long length
    cdef Py_ssize_t small_at = 0
    cdef Py_ssize_t small_count = 0
    cdef Py_ssize_t small_bytes = 0
    cdef list pieces = None  # made with its first payload: a small packet alone needs none
    while pos < stop and pos + 4 <= n and p[pos] == C_MSG and p[pos + 1] == channel_id and p[pos + 2] == 0:
        size = p[pos + 3]
        start = pos + 4 + size
        if size > C_MAX_UVARINT_SIZE or start > n:
            break
        length = _be(p + pos + 4, size)
        if length > max_length or length > <unsigned long long> (n - start):
            break  # (compared before adding: see decode_packets)
        end = start + <Py_ssize_t> length
        if length < C_KEEP_VIEW_MIN:
            if small_count == 0:
                small_at = pos
            small_count += 1
            small_bytes += <Py_ssize_t> length
        else:
            if pieces is None:
                pieces = []
            if small_count:
                pieces.append(_joined(p, small_at, small_count, small_bytes))
                small_count = 0
                small_bytes = 0
            pieces.append(mv[start:end])
        pos = end
    end_at[0] = pos
    if small_count:
        if pieces is None:
            if small_count == 1:
                start = small_at + 4 + p[small_at + 3]
                return (C_MSG, channel_id, 0, mv[start : start + small_bytes])
            pieces = []
        pieces.append(_joined(p, small_at, small_count, small_bytes))
    return None if pieces is None else (C_RUN, channel_id, pieces)


cdef bytes _joined(const unsigned char *p, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t total):
    """The payloads of the ``count`` msg packets from ``pos`` on (headers checked by
    ``_run``; ``total`` bytes in all), copied one after the other into one bytes object."""
    cdef bytes joined = PyBytes_FromStringAndSize(NULL, total)
    cdef char *out = PyBytes_AS_STRING(joined)
    cdef Py_ssize_t size, start, length, i
    cdef Py_ssize_t at = 0
    for i in range(count):
        size = p[pos + 3]
        start = pos + 4 + size
        length = <Py_ssize_t> _be(p + pos + 4, size)
        memcpy(out + at, p + start, length)
        at += length
        pos = start + length
    return joined


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
    if _Channel is None:
        _init_slots()
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
            elif not packet[2] and type(channel) is _Channel and len(packet[3]) < C_KEEP_VIEW_MIN:
                # A small not-last packet alone (channels that alternate packet by packet):
                # Channel.reassemble and _collect inlined, the payload copied at the end
                # of the message's trailing bytearray.
                _collect_small(channel, packet[3])
                i += 1
                continue
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


cdef int _collect_small(object channel, object data) except -1:
    """``Channel.reassemble(0, data)`` of a Channel for a payload under ``KEEP_VIEW_MIN``
    bytes (``_collect`` copies it): the same checks, error, state and counters."""
    cdef Py_ssize_t length = len(data)
    cdef object parts, last
    size = _get(channel, O_RECEIVING_SIZE) + length
    if size > _get(channel, O_RECV_CAPACITY):
        raise channel.too_large(size)
    stats = _get(channel, O_STATS)
    if type(stats) is _ChannelStats:
        _set(stats, O_BYTES_RECEIVED, _get(stats, O_BYTES_RECEIVED) + length)
    else:
        stats.bytes_received += length
    parts = _get(channel, O_RECEIVING)
    if parts is None:
        parts = []
        _set(channel, O_RECEIVING, parts)
    last = parts[len(parts) - 1] if parts else None  # (no negative indexing here)
    if type(last) is bytearray:
        last += data
    else:
        parts.append(bytearray(data))
    _set(channel, O_RECEIVING_SIZE, size)
    return 0


cdef object _unknown_channel(object channel_id, dict channels):
    return UnknownChannel(
        f"msg packet on channel {channel_id:#04x}, which this node does not have "
        f"(channels: {', '.join([f'{c:#04x}' for c in channels]) or 'none'})"
    )


# -- sending: the scheduler's pick and the packets' framing (channel.schedule) -----------

cdef extern from "Python.h":
    # Without Cython's reference counting: the output buffer is ours alone until it is
    # handed to ``parts`` (_PyBytes_Resize needs a bytes object nobody else holds).
    PyObject *_new_bytes "PyBytes_FromStringAndSize" (const char *v, Py_ssize_t size) except NULL
    int _PyBytes_Resize(PyObject **bytes, Py_ssize_t size) except -1
    char *_bytes_data "PyBytes_AS_STRING" (PyObject *bytes)
    # A __slots__ attribute's descriptor: where in the object its value is stored.
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    const int T_OBJECT_EX

#: A piece (a whole message, or a packet's chunk of one) of at most this many bytes is
#: copied into the bytes object of its run of packets; a longer one goes into ``parts``
#: as it is (the message, or a view of it), which the connection's join copies once.
COPY_MAX = C_COPY_MAX

# -- the slots of Channel and ChannelStats, read and written where they are stored -------
# A slotted object keeps each attribute at a fixed offset; reading it there instead of
# through getattr (a type lookup and a descriptor call, ~20 ns) is most of what this twin
# saves on a small message. Only objects of exactly these classes are read this way
# (``schedule`` hands anything else to the reference); the offsets come from the
# classes' own member descriptors, looked up once.

cdef object _Channel = None
cdef object _ChannelStats = None
cdef object _reference_schedule = None
cdef Py_ssize_t O_ID, O_PRIORITY, O_QUEUE, O_SENDING, O_OFFSET, O_STORED_SENT, O_STATS, O_STAMP_AT
cdef Py_ssize_t O_MESSAGES_SENT, O_BYTES_SENT
cdef Py_ssize_t O_RECEIVING, O_RECEIVING_SIZE, O_RECV_CAPACITY, O_BYTES_RECEIVED


cdef Py_ssize_t _offset(object cls, str name) except -1:
    descriptor = cls.__dict__[name]
    if type(descriptor).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef *member = (<PyMemberDescrObject *> descriptor).d_member
    if member.type != T_OBJECT_EX:
        raise TypeError(f"{cls.__name__}.{name} is not an object slot")
    return member.offset


cdef int _init_slots() except -1:
    global _Channel, _ChannelStats, _reference_schedule
    global O_ID, O_PRIORITY, O_QUEUE, O_SENDING, O_OFFSET, O_STORED_SENT, O_STATS, O_STAMP_AT
    global O_MESSAGES_SENT, O_BYTES_SENT
    global O_RECEIVING, O_RECEIVING_SIZE, O_RECV_CAPACITY, O_BYTES_RECEIVED
    from mconn.core import channel  # not at import: channel imports this module

    O_ID = _offset(channel.Channel, "id")
    O_PRIORITY = _offset(channel.Channel, "priority")
    O_QUEUE = _offset(channel.Channel, "queue")
    O_SENDING = _offset(channel.Channel, "sending")
    O_OFFSET = _offset(channel.Channel, "offset")
    O_STORED_SENT = _offset(channel.Channel, "stored_sent")
    O_STATS = _offset(channel.Channel, "stats")
    O_STAMP_AT = _offset(channel.Channel, "_stamp_at")
    O_MESSAGES_SENT = _offset(channel.ChannelStats, "messages_sent")
    O_BYTES_SENT = _offset(channel.ChannelStats, "bytes_sent")
    O_RECEIVING = _offset(channel.Channel, "receiving")
    O_RECEIVING_SIZE = _offset(channel.Channel, "receiving_size")
    O_RECV_CAPACITY = _offset(channel.Channel, "recv_capacity")
    O_BYTES_RECEIVED = _offset(channel.ChannelStats, "bytes_received")
    _reference_schedule = channel.schedule
    _ChannelStats = channel.ChannelStats
    _Channel = channel.Channel
    return 0


cdef inline object _get(object obj, Py_ssize_t offset):
    """The slot's value (an unset slot is getattr's AttributeError)."""
    cdef PyObject *value = (<PyObject **> ((<char *> <PyObject *> obj) + offset))[0]
    if value == NULL:
        raise _unset(obj, offset)
    return <object> value


cdef object _unset(object obj, Py_ssize_t offset):
    """The AttributeError getattr raises for the unset slot at ``offset``."""
    name = "?"
    for key, descriptor in type(obj).__dict__.items():
        if type(descriptor).__name__ == "member_descriptor":
            if (<PyMemberDescrObject *> descriptor).d_member.offset == offset:
                name = key
    return AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'")


cdef inline void _set(object obj, Py_ssize_t offset, object value):
    cdef PyObject **slot = <PyObject **> ((<char *> <PyObject *> obj) + offset)
    cdef PyObject *old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject *> value
    Py_XDECREF(old)


# -- the output: runs of packets framed into one bytes object --------------------------

cdef struct Out:
    PyObject *buf   # the bytes object being filled (ours alone), or NULL
    Py_ssize_t len  # bytes written
    Py_ssize_t cap  # its size


cdef int _reserve(Out *out, Py_ssize_t more) except -1:
    """Room for ``more`` bytes past ``out.len``: the buffer made or grown (doubling)."""
    cdef Py_ssize_t need = out.len + more
    cdef Py_ssize_t cap
    if need <= out.cap:
        return 0
    cap = max(need, 2 * out.cap, 64)
    if out.buf == NULL:
        out.buf = _new_bytes(NULL, cap)
    else:
        _PyBytes_Resize(&out.buf, cap)  # on failure: out.buf is NULL, MemoryError raised
    out.cap = cap
    return 0


cdef int _flush(Out *out, list parts) except -1:
    """The bytes written so far become one part (cut to their size)."""
    cdef PyObject *buf = out.buf
    if buf == NULL or out.len == 0:
        return 0
    out.buf = NULL
    out.cap = 0
    try:
        if out.len != PyBytes_GET_SIZE(<object> buf):
            _PyBytes_Resize(&buf, out.len)
        parts.append(<object> buf)
    finally:
        out.len = 0
        Py_XDECREF(buf)  # parts holds it now (or, on an error, nothing does)
    return 0


cdef inline Py_ssize_t _header_size(Py_ssize_t length):
    """The bytes of a msg packet's header: 4 and the length's uvarint."""
    cdef Py_ssize_t size = 4
    while length:
        size += 1
        length >>= 8
    return size


cdef inline void _header(Out *out, int channel_id, int eof, Py_ssize_t length, Py_ssize_t size):
    """Write a msg packet's header of ``size`` bytes (``_header_size``, room reserved):
    03 | ch | eof | uvarint length, as ``msg_header``."""
    cdef unsigned char *p = <unsigned char *> _bytes_data(out.buf) + out.len
    cdef Py_ssize_t i
    cdef unsigned long long value = <unsigned long long> length
    p[0] = C_MSG
    p[1] = <unsigned char> channel_id
    p[2] = <unsigned char> eof
    p[3] = <unsigned char> (size - 4)
    for i in range(size - 1, 3, -1):
        p[i] = <unsigned char> (value & 0xFF)
        value >>= 8
    out.len += size


cdef inline void _copy(Out *out, const char *data, Py_ssize_t size):
    """Append ``size`` bytes (room reserved by the caller)."""
    memcpy(_bytes_data(out.buf) + out.len, data, size)
    out.len += size


cdef Py_ssize_t _emit(
    object channel, list parts, Out *out, Py_ssize_t payload, Py_ssize_t budget, Py_ssize_t *popped
) except -1:
    """``Channel.emit`` of a Channel: the same packets (joined), wire bytes, channel state
    and statistics; ``popped``: how many messages it took off the queue."""
    cdef int channel_id = _get(channel, O_ID)
    cdef object queue = _get(channel, O_QUEUE)
    cdef object mv = _get(channel, O_SENDING)
    cdef object message
    cdef object source = None  # the bytes ``mv`` views, when they are bytes
    cdef object full = None  # the full packets' header as bytes, made when first needed
    cdef Py_ssize_t offset = _get(channel, O_OFFSET)
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t size, remaining, h
    cdef Py_ssize_t full_size = _header_size(payload)
    cdef Py_ssize_t wire = 0
    cdef Py_ssize_t data = 0
    cdef Py_ssize_t finished = 0
    if mv is not None:
        total = len(mv)
        if type(mv) is memoryview and type(mv.obj) is bytes and PyBytes_GET_SIZE(mv.obj) == total:
            source = mv.obj
    while True:
        if mv is None:
            message = queue.popleft()
            popped[0] += 1
            size = len(message)
            if size <= payload:  # the whole message is its last packet
                h = _header_size(size)
                if size <= C_COPY_MAX and type(message) is bytes:
                    _reserve(out, h + size)
                    _header(out, channel_id, 1, size, h)
                    _copy(out, PyBytes_AS_STRING(message), size)
                else:
                    _reserve(out, h)
                    _header(out, channel_id, 1, size, h)
                    _flush(out, parts)
                    parts.append(message)
                wire += h + size
                data += size
                finished += 1
                if not queue or wire >= budget:
                    break
                continue
            mv = memoryview(message)
            source = message if type(message) is bytes else None
            offset = 0
            total = size
        remaining = total - offset
        if remaining > payload:
            if payload <= C_COPY_MAX and source is not None:
                _reserve(out, full_size + payload)
                _header(out, channel_id, 0, payload, full_size)
                _copy(out, PyBytes_AS_STRING(source) + offset, payload)
            else:
                if full is None:
                    full = msg_header(channel_id, False, payload)
                _flush(out, parts)
                parts.append(full)
                parts.append(mv[offset : offset + payload])
            offset += payload
            wire += full_size + payload
            data += payload
            if wire >= budget:
                break
            continue
        h = _header_size(remaining)
        if remaining <= C_COPY_MAX and source is not None:
            _reserve(out, h + remaining)
            _header(out, channel_id, 1, remaining, h)
            _copy(out, PyBytes_AS_STRING(source) + offset, remaining)
        else:
            _reserve(out, h)
            _header(out, channel_id, 1, remaining, h)
            _flush(out, parts)
            parts.append(mv[offset:])
        wire += h + remaining
        data += remaining
        finished += 1
        mv = None
        source = None
        if not queue or wire >= budget:
            break
    _set(channel, O_SENDING, mv)
    _set(channel, O_OFFSET, offset)
    stats = _get(channel, O_STATS)
    if type(stats) is _ChannelStats:
        sent = _get(stats, O_MESSAGES_SENT) + finished
        _set(stats, O_MESSAGES_SENT, sent)
        _set(stats, O_BYTES_SENT, _get(stats, O_BYTES_SENT) + data)
    else:
        stats.messages_sent += finished
        stats.bytes_sent += data
        sent = stats.messages_sent
    stamp_at = _get(channel, O_STAMP_AT)
    if stamp_at >= 0 and sent > stamp_at:
        channel._observe()  # a send-queue delay sample is due (Channel.emit)
    return wire


cdef inline double _ratio(object channel) except? -1.0:
    return <double> _get(channel, O_STORED_SENT) / <double> _get(channel, O_PRIORITY)


cdef Py_ssize_t _limit(double room, Py_ssize_t left) except -1:
    """``max(1, min(left, int(room)))``, with int()'s errors."""
    cdef Py_ssize_t limit
    if room != room:
        raise ValueError("cannot convert float NaN to integer")
    if room == INFINITY or room == -INFINITY:
        raise OverflowError("cannot convert float infinity to integer")
    if room >= 9.2e18:
        limit = left
    elif room <= -9.2e18:
        limit = 1
    else:
        limit = min(left, <Py_ssize_t> room)
    return max(1, limit)


def schedule(object scheduler, list parts, object now, object payload, object budget):
    """See ``mconn.core.channel.schedule``: the same bytes (joined ``parts``), result,
    channel and scheduler state and errors. Channels of a class other than Channel
    itself (a subclass) are scheduled by the reference."""
    cdef Out out
    cdef list pending = []
    cdef list channels = scheduler.channels
    cdef object c, chosen
    cdef double exponent, scale, ratio, chosen_ratio, runner_ratio, room, decay
    cdef bint has_runner
    cdef Py_ssize_t sent = 0
    cdef Py_ssize_t taken = 0
    cdef Py_ssize_t wire, limit, left, c_payload, c_budget, n, k, chosen_at, popped
    if _Channel is None:
        _init_slots()
    if payload < 1:
        raise ValueError(f"packet payload must be at least 1 byte, got {payload}")
    for c in channels:
        if type(c) is not _Channel:
            return _reference_schedule(scheduler, parts, now, payload, budget)
        if _get(c, O_SENDING) is not None or _get(c, O_QUEUE):
            pending.append(c)
    if not pending:
        return 0
    exponent = (<double> now - <double> scheduler.epoch) / C_DECAY_TAU
    if exponent > C_RESCALE_EXPONENT:
        # Fold the decay into the stored values (they may underflow to 0: fine).
        decay = exp(-exponent)
        for c in channels:
            _set(c, O_STORED_SENT, _get(c, O_STORED_SENT) * decay)
        scheduler.epoch = now
        exponent = 0.0
    scale = exp(exponent)
    # Sizes past what a C integer holds (no wire byte count reaches them) work as that.
    c_payload = payload if payload < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
    c_budget = budget if budget < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
    out.buf = NULL
    out.len = 0
    out.cap = 0
    try:
        while pending and sent < c_budget:
            left = c_budget - sent
            n = len(pending)
            chosen_at = 0
            if n == 1:
                limit = left
            else:
                # Lowest ratio wins; ties go to the channel declared first (min's order).
                chosen_ratio = _ratio(pending[0])
                for k in range(1, n):
                    ratio = _ratio(pending[k])
                    if ratio < chosen_ratio:
                        chosen_ratio = ratio
                        chosen_at = k
                runner_ratio = 0.0
                has_runner = False
                for k in range(n):
                    if k != chosen_at:
                        ratio = _ratio(pending[k])
                        if not has_runner or ratio < runner_ratio:
                            runner_ratio = ratio
                            has_runner = True
                # Bytes the chosen channel may send before its ratio passes the runner-up's.
                if scale == 0.0:
                    raise ZeroDivisionError("float division by zero")
                room = (runner_ratio - chosen_ratio) * <double> _get(pending[chosen_at], O_PRIORITY) / scale
                limit = _limit(room, left)
            chosen = pending[chosen_at]
            popped = 0
            wire = _emit(chosen, parts, &out, c_payload, limit, &popped)
            taken += popped
            _set(chosen, O_STORED_SENT, _get(chosen, O_STORED_SENT) + wire * scale)
            sent += wire
            if _get(chosen, O_SENDING) is None and not _get(chosen, O_QUEUE):
                del pending[chosen_at]
    finally:
        # What was framed goes into parts, as the reference's appends would have, also
        # when an error (a send-delay clock's) ends the run.
        try:
            _flush(&out, parts)
        finally:
            Py_XDECREF(out.buf)
        if taken:
            scheduler.taken += taken
    return sent


# -- the session's per-message counters (session.Session.admit, record_delivered) ---------

cdef object _Session = None
cdef object _Stream = None
cdef object _Budget = None
cdef object _IDLE = None
cdef object _MESSAGE_OVERHEAD = None
cdef object _reference_admit = None
cdef object _reference_record_delivered = None
cdef Py_ssize_t O_STREAMS, O_UNACKED_BYTES, O_BUDGET, O_RECOVERY_BUFFER_BYTES, O_CHANNEL_RESERVE_BYTES
cdef Py_ssize_t O_ACK_MESSAGES_LEFT, O_ACK_BYTES_LEFT
cdef Py_ssize_t O_S_ACKED, O_S_UNACKED, O_S_UNACKED_BYTES, O_S_DELIVERED, O_B_LIMIT, O_B_USED


cdef int _init_session_slots() except -1:
    global _Session, _Stream, _Budget, _IDLE, _MESSAGE_OVERHEAD, _reference_admit, _reference_record_delivered
    global O_STREAMS, O_UNACKED_BYTES, O_BUDGET, O_RECOVERY_BUFFER_BYTES, O_CHANNEL_RESERVE_BYTES
    global O_ACK_MESSAGES_LEFT, O_ACK_BYTES_LEFT
    global O_S_ACKED, O_S_UNACKED, O_S_UNACKED_BYTES, O_S_DELIVERED, O_B_LIMIT, O_B_USED
    from mconn.core import session  # not at import: session imports this module

    O_STREAMS = _offset(session.Session, "_streams")
    O_UNACKED_BYTES = _offset(session.Session, "unacked_bytes")
    O_BUDGET = _offset(session.Session, "_budget")
    O_RECOVERY_BUFFER_BYTES = _offset(session.Session, "recovery_buffer_bytes")
    O_CHANNEL_RESERVE_BYTES = _offset(session.Session, "channel_reserve_bytes")
    O_ACK_MESSAGES_LEFT = _offset(session.Session, "_ack_messages_left")
    O_ACK_BYTES_LEFT = _offset(session.Session, "_ack_bytes_left")
    O_S_ACKED = _offset(session._Stream, "acked")
    O_S_UNACKED = _offset(session._Stream, "unacked")
    O_S_UNACKED_BYTES = _offset(session._Stream, "unacked_bytes")
    O_S_DELIVERED = _offset(session._Stream, "delivered")
    O_B_LIMIT = _offset(session.Budget, "limit")
    O_B_USED = _offset(session.Budget, "used")
    _IDLE = session._IDLE
    _MESSAGE_OVERHEAD = session.MESSAGE_OVERHEAD
    _reference_admit = session.reference_admit
    _reference_record_delivered = session.reference_record_delivered
    _Stream = session._Stream
    _Budget = session.Budget
    _Session = session.Session
    return 0


def admit(object self, object channel_id, object message):
    """See ``mconn.core.session.Session.admit`` (``reference_admit``): the same sequence
    number or None, the same recovery buffer, counts and errors. A session, stream or
    budget of another class (a subclass) is handled by the reference."""
    if _Session is None:
        _init_session_slots()
    if type(self) is not _Session:
        return _reference_admit(self, channel_id, message)
    stream = _get(self, O_STREAMS)[channel_id]
    if stream is _IDLE:  # the channel's first message: a stream of its own (rare)
        stream = self._own(channel_id)
    budget = _get(self, O_BUDGET)
    if type(stream) is not _Stream or type(budget) is not _Budget:
        return _reference_admit(self, channel_id, message)
    size = len(message) + _MESSAGE_OVERHEAD
    unacked = _get(stream, O_S_UNACKED)
    if (
        unacked
        and _get(stream, O_S_UNACKED_BYTES) + size > _get(self, O_CHANNEL_RESERVE_BYTES)
        and (
            _get(self, O_UNACKED_BYTES) + size > _get(self, O_RECOVERY_BUFFER_BYTES)
            or _get(budget, O_B_USED) + size > _get(budget, O_B_LIMIT)
        )
    ):
        return None
    unacked.append(message)
    _set(stream, O_S_UNACKED_BYTES, _get(stream, O_S_UNACKED_BYTES) + size)
    _set(self, O_UNACKED_BYTES, _get(self, O_UNACKED_BYTES) + size)
    _set(budget, O_B_USED, _get(budget, O_B_USED) + size)
    return _get(stream, O_S_ACKED) + len(unacked) - 1


def record_delivered(object self, object channel_id, object nbytes):
    """See ``mconn.core.session.Session.record_delivered`` (``reference_record_delivered``):
    the same counts, result and errors."""
    if _Session is None:
        _init_session_slots()
    if type(self) is not _Session:
        return _reference_record_delivered(self, channel_id, nbytes)
    stream = _get(self, O_STREAMS)[channel_id]
    if stream is _IDLE:  # the channel's first delivery: a stream of its own (rare)
        stream = self._own(channel_id)
    if type(stream) is not _Stream:
        return _reference_record_delivered(self, channel_id, nbytes)
    _set(stream, O_S_DELIVERED, _get(stream, O_S_DELIVERED) + 1)
    messages_left = _get(self, O_ACK_MESSAGES_LEFT) - 1
    _set(self, O_ACK_MESSAGES_LEFT, messages_left)
    bytes_left = _get(self, O_ACK_BYTES_LEFT) - nbytes
    _set(self, O_ACK_BYTES_LEFT, bytes_left)
    return messages_left <= 0 or bytes_left <= 0
