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
* ``unmasked_payloads``: the payload bytes of the frames of one read, unmasked. The
  reference copies them into a bytearray, unmasks in place and copies out as bytes;
  here each is copied and XORed in one pass into the new bytes object.

tests/integration/test_websocket_twin.py proves both identical to the reference with
hypothesis, directly and through the FrameReader, on valid and malformed frames.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

#: The interface version websocket_frames.py expects (``WSFRAME_INTERFACE``); a stale
#: build is not used.
INTERFACE = 1

cdef enum:
    C_BINARY_FIN = 0x82
    C_MASK = 0x80


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
        count = (n + limit - 1) // limit
        if count == 0:
            count = 1  # b"" is one empty message
        total = n + (count - 1) * (_header_size(limit) + (4 if masked else 0))
        size = n - (count - 1) * limit
        total += _header_size(size) + (4 if masked else 0)
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


def unmasked_payloads(data, list regions):
    """``websocket_frames.unmasked_payloads``: the bytes of ``regions`` of ``data`` (each
    ``(start, end, key, phase)``: ``key`` None, or 4 bytes applied from byte ``phase % 4``),
    unmasked, joined into one bytes object in a list; an empty list for no regions."""
    cdef Py_buffer view
    cdef Py_ssize_t n, start, end, phase, total = 0, i, count
    cdef unsigned char *out
    cdef const unsigned char *src
    cdef const unsigned char *key_bytes
    if not regions:
        return []
    count = len(regions)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        src = <const unsigned char *>view.buf
        for i in range(count):
            start, end, key, phase = regions[i]
            if not 0 <= start <= end <= n:
                raise ValueError(f"payload region {start}:{end} is outside the {n} bytes read")
            if key is not None and len(key) != 4:
                raise ValueError(f"a masking key is 4 bytes, not {len(key)}")
            total += end - start
        if count == 1:
            start, end, key, phase = regions[0]
            if key is None:
                return [data if start == 0 and end == n else data[start:end]]
        result = PyBytes_FromStringAndSize(NULL, total)
        out = <unsigned char *>PyBytes_AS_STRING(result)
        for i in range(count):
            start, end, key, phase = regions[i]
            if key is None:
                memcpy(out, src + start, end - start)
            else:
                key_bytes = key
                _xor_copy(out, src + start, end - start, key_bytes, phase & 3)
            out += end - start
        return [result]
    finally:
        PyBuffer_Release(&view)
