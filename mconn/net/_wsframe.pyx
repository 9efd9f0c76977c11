# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The compiled twin of the WebSocket copies: what ``mconn.net.websocket_frames`` uses when
this extension is built and ``MCONN_PURE`` is not 1.

Each function does exactly what its pure-Python reference in websocket_frames.py does,
byte for byte and error for error:

* ``binary_frames``: the frames of one write (RFC 6455 section 5.2), a dialer's masked
  (section 5.3). The reference joins headers and payloads into a bytearray, masks each
  payload there in place and copies the result into bytes (three passes over the data);
  here each frame's header is written and its payload copied and XORed with its key in
  the same pass, straight into the one new bytes object that goes to ``write``.
* ``binary_frames_of``: the same frames of a write given as a list of buffers (a bulk
  write's packet headers and payloads, unjoined); the reference joins them first, here
  each part is copied (and masked) straight into the frames.
* ``unmasked_payloads``: the payload bytes of the frames of one read, unmasked. The
  reference copies them into a bytearray, unmasks in place and copies out as bytes;
  here each is copied and XORed in one pass into the new bytes object.

tests/integration/test_websocket_twin.py proves both identical to the reference with
hypothesis, directly and through the FrameReader, on valid and malformed frames.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

#: The interface version websocket_frames.py expects (``WSFRAME_INTERFACE``); a stale
#: build is not used.
INTERFACE = 2

# RFC 6455 section 5.2: the first byte's FIN bit and reserved bits, the second's MASK bit;
# a control frame's payload is at most 125 bytes (section 5.5).
cdef enum:
    C_BINARY_FIN = 0x82
    C_FIN = 0x80
    C_RSV = 0x70
    C_MASK = 0x80
    C_MAX_CONTROL = 125

cdef tuple C_HANDOFF = ("handoff", None)


cdef inline void _xor_copy(
    unsigned char *dst, const unsigned char *src, Py_ssize_t n, const unsigned char *key, Py_ssize_t phase
) noexcept nogil:
    """``dst[i] = src[i] ^ key[(phase + i) % 4]`` for ``i < n``, 16 bytes a step: the key
    is repeated into a 64-bit word (its period 4 divides 8, so every word starts at the
    same key byte); the tail takes the same bytes of that word one at a time."""
    cdef unsigned char k[8]
    cdef uint64_t kw, w0, w1
    cdef Py_ssize_t i
    for i in range(8):
        k[i] = key[(phase + i) & 3]
    memcpy(&kw, k, 8)
    i = 0
    while i + 16 <= n:
        memcpy(&w0, src + i, 8)
        memcpy(&w1, src + i + 8, 8)
        w0 ^= kw
        w1 ^= kw
        memcpy(dst + i, &w0, 8)
        memcpy(dst + i + 8, &w1, 8)
        i += 16
    while i < n:
        dst[i] = src[i] ^ k[i & 7]
        i += 1


cdef inline Py_ssize_t _header_size(Py_ssize_t n) noexcept nogil:
    return 2 if n < 126 else 4 if n < 65536 else 10


cdef inline Py_ssize_t _frame_count(Py_ssize_t n, Py_ssize_t limit) noexcept nogil:
    """The frames of ``n`` payload bytes, at most ``limit`` each (b"" is one empty frame)."""
    cdef Py_ssize_t count = n // limit + (1 if n % limit else 0)  # not (n + limit - 1): limit may be near 2**63
    return count if count else 1


cdef inline Py_ssize_t _frames_size(Py_ssize_t n, Py_ssize_t limit, Py_ssize_t count, bint masked) noexcept nogil:
    """The bytes of ``count`` frames of ``n`` payload bytes: all but the last of ``limit``
    bytes, each with its header (and its 4-byte key when ``masked``)."""
    cdef Py_ssize_t key = 4 if masked else 0
    return n + (count - 1) * (_header_size(limit) + key) + _header_size(n - (count - 1) * limit) + key


cdef inline unsigned char *_put_header(unsigned char *p, Py_ssize_t n, unsigned char mask_bit) noexcept nogil:
    """A final binary frame's header for ``n`` payload bytes (RFC 6455 section 5.2:
    7-bit, 16-bit or 64-bit length, network order); where the masking key or payload goes."""
    cdef int j
    p[0] = C_BINARY_FIN
    if n < 126:
        p[1] = mask_bit | <unsigned char>n
        return p + 2
    if n < 65536:
        p[1] = mask_bit | 126
        p[2] = (n >> 8) & 0xFF
        p[3] = n & 0xFF
        return p + 4
    p[1] = mask_bit | 127
    for j in range(8):
        p[2 + j] = (<unsigned long long>n >> (56 - 8 * j)) & 0xFF
    return p + 10


def binary_frames(data, *, Py_ssize_t limit, keys=None):
    """``websocket_frames.binary_frames``: ``data`` as final binary frames of at most
    ``limit`` payload bytes each, in one bytes object; masked with ``keys(4 * count)``
    (4 bytes a frame) when ``keys`` is given."""
    cdef Py_buffer view, key_view
    cdef Py_ssize_t n, count, k, size, total, at
    cdef unsigned char *out
    cdef const unsigned char *src
    cdef const unsigned char *key = NULL
    cdef bint masked = keys is not None
    if limit < 1:
        raise ValueError(f"a WebSocket frame holds at least 1 payload byte; limit is {limit}")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        src = <const unsigned char *>view.buf
        count = _frame_count(n, limit)
        total = _frames_size(n, limit, count, masked)
        if not masked:
            result = PyBytes_FromStringAndSize(NULL, total)
            out = <unsigned char *>PyBytes_AS_STRING(result)
            for k in range(count):
                size = limit if k < count - 1 else n - k * limit
                out = _put_header(out, size, 0)
                memcpy(out, src + k * limit, size)
                out += size
            return result
        all_keys = keys(4 * count)
        PyObject_GetBuffer(all_keys, &key_view, PyBUF_SIMPLE)
        try:
            if key_view.len != 4 * count:
                raise ValueError(f"keys({4 * count}) gave {key_view.len} bytes: 4 are needed for each of {count} frames")
            key = <const unsigned char *>key_view.buf
            result = PyBytes_FromStringAndSize(NULL, total)
            out = <unsigned char *>PyBytes_AS_STRING(result)
            for k in range(count):
                size = limit if k < count - 1 else n - k * limit
                out = _put_header(out, size, C_MASK)
                memcpy(out, key + 4 * k, 4)
                _xor_copy(out + 4, src + k * limit, size, key + 4 * k, 0)
                out += 4 + size
            return result
        finally:
            PyBuffer_Release(&key_view)
    finally:
        PyBuffer_Release(&view)


def binary_frames_of(list parts, *, Py_ssize_t limit, keys=None):
    """``websocket_frames.binary_frames_of``: the bytes of ``parts`` (a list of buffers:
    a bulk write's packet headers and payload views, unjoined) as final binary frames, as
    ``binary_frames`` of them joined; here each payload byte is read once, straight from
    its part into the one new bytes object (copied, or copied and XORed with the key)."""
    cdef Py_ssize_t count_parts = len(parts)
    cdef Py_buffer *views
    cdef Py_buffer key_view
    cdef Py_ssize_t held = 0, n = 0, count, k, size, total, done, take, p = 0, o = 0
    cdef unsigned char *out
    cdef const unsigned char *key = NULL
    cdef bint masked = keys is not None
    if limit < 1:
        raise ValueError(f"a WebSocket frame holds at least 1 payload byte; limit is {limit}")
    views = <Py_buffer *>PyMem_Malloc((count_parts or 1) * sizeof(Py_buffer))
    if views == NULL:
        raise MemoryError(f"no memory for the views of {count_parts} buffers")
    try:
        for part in parts:
            PyObject_GetBuffer(part, &views[held], PyBUF_SIMPLE)
            held += 1
            n += views[held - 1].len
        count = _frame_count(n, limit)
        total = _frames_size(n, limit, count, masked)
        if masked:
            all_keys = keys(4 * count)
            PyObject_GetBuffer(all_keys, &key_view, PyBUF_SIMPLE)
            try:
                if key_view.len != 4 * count:
                    raise ValueError(
                        f"keys({4 * count}) gave {key_view.len} bytes: 4 are needed for each of {count} frames"
                    )
                result = PyBytes_FromStringAndSize(NULL, total)
            except BaseException:
                PyBuffer_Release(&key_view)
                raise
            key = <const unsigned char *>key_view.buf
        else:
            result = PyBytes_FromStringAndSize(NULL, total)
        out = <unsigned char *>PyBytes_AS_STRING(result)
        for k in range(count):
            size = limit if k < count - 1 else n - k * limit
            out = _put_header(out, size, C_MASK if masked else 0)
            if masked:
                memcpy(out, key + 4 * k, 4)
                out += 4
            done = 0
            while done < size:  # bounded: each turn takes a byte at least, or steps past an empty part
                if o == views[p].len:
                    p += 1
                    o = 0
                    continue
                take = size - done
                if take > views[p].len - o:
                    take = views[p].len - o
                if masked:
                    _xor_copy(out, <const unsigned char *>views[p].buf + o, take, key + 4 * k, done & 3)
                else:
                    memcpy(out, <const unsigned char *>views[p].buf + o, take)
                out += take
                o += take
                done += take
        if masked:
            PyBuffer_Release(&key_view)
        return result
    finally:
        for k in range(held):
            PyBuffer_Release(&views[k])
        PyMem_Free(views)


cdef struct Region:
    Py_ssize_t start
    Py_ssize_t end
    bint masked
    Py_ssize_t phase
    unsigned char key[4]


cdef struct Regions:
    Region *items
    Py_ssize_t count
    Py_ssize_t capacity
    Region small[8]


cdef inline Region *_add(Regions *regions) except NULL:
    """Room for one more region (8 in place; beyond, on the heap, doubling)."""
    cdef Region *grown
    if regions.count == regions.capacity:
        grown = <Region *>PyMem_Malloc(2 * regions.capacity * sizeof(Region))
        if grown == NULL:
            raise MemoryError(f"no memory for {2 * regions.capacity} payload regions")
        memcpy(grown, regions.items, regions.count * sizeof(Region))
        if regions.items != regions.small:
            PyMem_Free(regions.items)
        regions.items = grown
        regions.capacity *= 2
    regions.count += 1
    return &regions.items[regions.count - 1]


cdef inline void _init(Regions *regions) noexcept:
    regions.items = regions.small
    regions.count = 0
    regions.capacity = 8


cdef inline void _release(Regions *regions) noexcept:
    if regions.items != regions.small:
        PyMem_Free(regions.items)
    regions.items = regions.small


cdef list _payloads(object data, const unsigned char *src, Py_ssize_t n, Regions *regions):
    """The reference's ``unmasked_payloads`` over checked regions: [] for none, ``data``
    itself or its slice for one unmasked region, else one new bytes written in one pass."""
    cdef Py_ssize_t i, total = 0
    cdef Region *r
    cdef unsigned char *out
    if regions.count == 0:
        return []
    if regions.count == 1 and not regions.items[0].masked:
        r = &regions.items[0]
        return [data if r.start == 0 and r.end == n else data[r.start : r.end]]
    for i in range(regions.count):
        total += regions.items[i].end - regions.items[i].start
    result = PyBytes_FromStringAndSize(NULL, total)
    out = <unsigned char *>PyBytes_AS_STRING(result)
    for i in range(regions.count):
        r = &regions.items[i]
        if r.masked:
            _xor_copy(out, src + r.start, r.end - r.start, r.key, r.phase & 3)
        else:
            memcpy(out, src + r.start, r.end - r.start)
        out += r.end - r.start
    return [result]


def unmasked_payloads(data, list regions):
    """``websocket_frames.unmasked_payloads``: the bytes of ``regions`` of ``data`` (each
    ``(start, end, key, phase)``: ``key`` None, or 4 bytes applied from byte ``phase % 4``),
    unmasked, joined into one bytes object in a list; an empty list for no regions."""
    cdef Py_buffer view
    cdef Regions chosen
    cdef Region *r
    cdef const unsigned char *key_bytes
    if not regions:
        return []
    _init(&chosen)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        for start, end, key, phase in regions:
            if not 0 <= start <= end <= view.len:
                raise ValueError(f"payload region {start}:{end} is outside the {view.len} bytes read")
            if key is not None and len(key) != 4:
                raise ValueError(f"a masking key is 4 bytes, not {len(key)}")
            r = _add(&chosen)
            r.start, r.end, r.masked, r.phase = start, end, key is not None, phase & 3
            if key is not None:
                key_bytes = key
                memcpy(r.key, key_bytes, 4)
        return _payloads(data, <const unsigned char *>view.buf, view.len, &chosen)
    finally:
        PyBuffer_Release(&view)
        _release(&chosen)


#: RFC 6455 section 5.2: the most significant bit of a 64-bit length is 0.
cdef unsigned long long C_MAX_LENGTH = (1ULL << 63) - 1


cdef class FrameReader:
    """``websocket_frames.FrameReader``, the same state under the same names: reads the
    data frames of one open WebSocket connection (see that class and the module
    docstring there)."""

    cdef public bint masked
    cdef public unsigned long long max_message
    cdef public bytes _head
    cdef public unsigned long long _left
    cdef public bytes _key  # 4 bytes or None (typed: the C reads 4 bytes of it)
    cdef public unsigned long long _phase
    cdef public bint _fragmented
    cdef public unsigned long long _message

    def __init__(self, *, masked, max_message):
        if max_message < 0:
            raise ValueError(f"max_message is a size in bytes, not {max_message}")
        self.masked = masked
        self.max_message = min(max_message, C_MAX_LENGTH)
        self._head = b""
        self._left = 0
        self._key = None
        self._phase = 0
        self._fragmented = False
        self._message = 0

    @property
    def idle(self):
        """Between frames, nothing buffered: autobahn may take over."""
        return not self._head and not self._left

    def read(self, data):
        """``(payloads, stop, rest)``; see websocket_frames' module docstring."""
        cdef Regions regions
        cdef Region *r
        cdef Py_ssize_t i = 0, j, n, header, end, take
        cdef const unsigned char *p
        cdef unsigned char b0, b1, opcode
        cdef unsigned long long length, left, message
        cdef bint masked
        cdef object stop = None
        cdef object rest = b""
        if type(data) is not bytes:
            data = bytes(data)
        if self._head:
            data, self._head = self._head + data, b""
        n = len(data)
        p = <const unsigned char *>PyBytes_AS_STRING(data)
        _init(&regions)
        try:
            while i < n:
                left = self._left
                if left:
                    take = n - i if left > <unsigned long long>(n - i) else <Py_ssize_t>left
                    r = _add(&regions)
                    r.start, r.end, r.phase = i, i + take, self._phase & 3
                    r.masked = self._key is not None
                    if r.masked:
                        if len(self._key) != 4:
                            raise ValueError(f"a masking key is 4 bytes, not {len(self._key)}")
                        memcpy(r.key, PyBytes_AS_STRING(self._key), 4)
                    self._left = left - take
                    self._phase += take
                    i += take
                    continue
                if i + 1 >= n:
                    self._head = data[i:]
                    break
                b0, b1 = p[i], p[i + 1]
                opcode, length, masked = b0 & 0x0F, b1 & 0x7F, (b1 & C_MASK) != 0
                header = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if masked else 0)
                if n - i < header:
                    self._head = data[i:]
                    break
                if length == 126:
                    length = (<unsigned long long>p[i + 2] << 8) | p[i + 3]
                elif length == 127:
                    length = 0
                    for j in range(8):
                        length = (length << 8) | p[i + 2 + j]
                if opcode & 0x8:
                    if b0 & C_RSV or not b0 & C_FIN or length > C_MAX_CONTROL or masked != self.masked:
                        stop, rest = C_HANDOFF, data[i:]
                        break
                    if <unsigned long long>(n - i - header) < length:
                        self._head = data[i:]
                        break
                    end = i + header + <Py_ssize_t>length
                    stop, rest = ("control", data[i:end]), data[end:]
                    break
                if b0 & C_RSV or (opcode != 0 and opcode != 2) or masked != self.masked:
                    stop, rest = C_HANDOFF, data[i:]
                    break
                if opcode == 0 and not self._fragmented:
                    stop, rest = C_HANDOFF, data[i:]  # autobahn refuses it
                    break
                if opcode == 2 and self._fragmented:
                    stop = ("protocol", "a binary frame inside a fragmented message")
                    break
                # The message so far and this frame, against the limit (no overflow:
                # the message so far is at most max_message, itself below 2**63).
                message = self._message if opcode == 0 else 0
                if length > self.max_message - message:
                    stop = ("too_large", (<object>length + <object>message, self.max_message))
                    break
                if b0 & C_FIN:
                    self._fragmented, self._message = False, 0
                else:
                    self._fragmented, self._message = True, message + length
                self._key = data[i + header - 4 : i + header] if masked and length else None
                self._left, self._phase = length, 0
                i += header
            return _payloads(data, p, n, &regions), stop, rest
        finally:
            _release(&regions)
