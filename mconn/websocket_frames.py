"""FrameReader: the hot path of reading an open WebSocket (RFC 6455 section 5), sans I/O.

mconn's WebSocket peers send binary frames, one per write. autobahn parses every frame
through a chain of a dozen Python calls and debug-log arguments built on every read;
the reader here takes the binary and continuation frames of an open connection itself
and streams their payloads (unmasked) as they arrive, and stops at anything else, handing
it to autobahn, which keeps the rest of RFC 6455: control frames (ping, pong, close),
and failing every frame that breaks a rule (text, reserved bits, masking, opcodes).

Theory of operation
-------------------
``read(data)`` returns ``(payloads, stop, rest)``. While ``stop`` is None every byte was
taken: payloads of data frames (a frame may span reads: ``_left`` bytes of it are still
to come, unmasked with the same masker), and at most one incomplete frame header (14
bytes) or control frame (131 bytes) kept for the next read. Otherwise ``stop`` says why
reading stopped at ``rest``:

* ``("control", frame)``: a complete control frame, to be handled by autobahn before the
  reader is given ``rest``;
* ``("handoff", None)``: a frame the reader does not take; ``rest`` starts at its header
  and goes to autobahn, which fails it or parses it;
* ``("too_large", (declared, limit))``: a data frame whose message would exceed the
  limit, refused from its header before a byte of its payload;
* ``("protocol", text)``: a binary frame inside a fragmented message.

Limits before parsing: lengths are checked against ``max_message`` as soon as the header
is complete; nothing but a header or a control frame is ever buffered.
"""

from __future__ import annotations

from autobahn.websocket.xormasker import create_xor_masker

try:  # autobahn's native (SIMD) XOR routine, called on our own buffers
    from _nvx_xormasker import ffi as _ffi, lib as _lib
except ImportError:  # no native routine: autobahn's own maskers
    _ffi = _lib = None

#: Opcodes of RFC 6455 section 5.2.
CONTINUATION, BINARY = 0x0, 0x2
#: A control frame's payload is at most this long (RFC 6455 section 5.5).
MAX_CONTROL_PAYLOAD = 125
_RSV = 0x70
_FIN = 0x80
_MASK = 0x80


#: Below this many payload bytes a frame is (un)masked with Python's big integers: creating
#: autobahn's native masker costs about 30 us, XOR on integers about 3.5 us per KiB.
SMALL_MASKING = 8192


class _SmallMasker:
    """RFC 6455 masking of a short payload, which may come in parts (``process`` keeps
    the offset), as autobahn's maskers do."""

    __slots__ = ("_key", "_offset")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._offset = 0

    def process(self, data) -> bytes:
        n = len(data)
        shift = self._offset & 3
        self._offset += n
        key = self._key[shift:] + self._key[:shift] if shift else self._key
        pattern = (key * ((n >> 2) + 1))[:n]
        return (int.from_bytes(data, "little") ^ int.from_bytes(pattern, "little")).to_bytes(n, "little")


class _NativeMasker:
    """RFC 6455 masking of a large payload by autobahn's native SIMD routine, run in place
    on our own copy: autobahn's wrapper allocates a zeroed buffer, copies in, masks and
    copies out for every call, which cost more than the masking itself."""

    __slots__ = ("_key", "_masker")

    def __init__(self, key: bytes) -> None:
        self._key = _ffi.new("uint8_t[4]", key)  # the native masker keeps a pointer to it
        self._masker = _ffi.gc(_lib.nvx_xormask_new(self._key), _lib.nvx_xormask_free)
        _lib.nvx_xormask_set_impl(self._masker, 2)  # SSE2, as autobahn's XorMaskerShifted1

    def process(self, data) -> bytes:
        buffer = bytearray(data)
        _lib.nvx_xormask_process(self._masker, _ffi.from_buffer("uint8_t[]", buffer), len(buffer))
        return bytes(buffer)

    def process_into(self, buffer: bytearray, start: int) -> None:
        """Mask ``buffer[start:]`` in place."""
        _lib.nvx_xormask_process(self._masker, _ffi.from_buffer("uint8_t[]", buffer) + start, len(buffer) - start)


def masker(key: bytes, length: int):
    """A masker for a payload of ``length`` bytes with this 4-byte ``key``."""
    if length < SMALL_MASKING:
        return _SmallMasker(key)
    return _NativeMasker(key) if _lib is not None else create_xor_masker(key, length)


def masked_frame(header: bytes, key: bytes, payload) -> bytes:
    """``header``, ``key`` and ``payload`` masked with ``key``: one client frame."""
    n = len(payload)
    m = masker(key, n)
    if not isinstance(m, _NativeMasker):
        return header + key + m.process(payload)
    start = len(header) + 4
    frame = bytearray(start + n)
    frame[:start] = header + key
    frame[start:] = payload
    m.process_into(frame, start)
    return bytes(frame)


class FrameReader:
    """Reads the data frames of one open WebSocket connection.

    :param masked: whether frames must be masked (a listener reads a dialer's frames).
    :param max_message: the largest message accepted, in bytes (``ws_max_message_bytes``).
    """

    def __init__(self, *, masked: bool, max_message: int) -> None:
        self.masked = masked
        self.max_message = max_message
        self._head = b""  # an incomplete header or control frame
        self._left = 0  # payload bytes of the current data frame still to come
        self._masker = None
        self._fragmented = False  # inside a message whose last frame has not come
        self._message = 0  # bytes of that message so far

    @property
    def idle(self) -> bool:
        """Between frames, nothing buffered: autobahn may take over."""
        return not self._head and not self._left

    def read(self, data: bytes):
        """``(payloads, stop, rest)``; see the module docstring."""
        payloads = []
        if self._head:
            data, self._head = self._head + data, b""
        i, n = 0, len(data)
        while i < n:
            left = self._left
            if left:
                end = i + left if i + left < n else n
                if self._masker is not None:  # the masker copies: a view is enough to read from
                    chunk = self._masker.process(data if i == 0 and end == n else memoryview(data)[i:end])
                else:
                    chunk = data if i == 0 and end == n else data[i:end]
                payloads.append(chunk)
                self._left = left - (end - i)
                i = end
                continue
            b0, b1 = data[i], data[i + 1] if i + 1 < n else None
            if b1 is None:
                self._head = data[i:]
                break
            opcode, length, masked = b0 & 0x0F, b1 & 0x7F, b1 & _MASK
            header = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if masked else 0)
            if n - i < header:
                self._head = data[i:]
                break
            if length == 126:
                length = int.from_bytes(data[i + 2 : i + 4], "big")
            elif length == 127:
                length = int.from_bytes(data[i + 2 : i + 10], "big")
            if opcode & 0x8:
                if b0 & _RSV or not b0 & _FIN or length > MAX_CONTROL_PAYLOAD or bool(masked) != self.masked:
                    return payloads, ("handoff", None), data[i:]
                end = i + header + length
                if end > n:
                    self._head = data[i:]
                    break
                return payloads, ("control", data[i:end]), data[end:]
            if b0 & _RSV or opcode not in (CONTINUATION, BINARY) or bool(masked) != self.masked:
                return payloads, ("handoff", None), data[i:]
            if opcode == CONTINUATION and not self._fragmented:
                return payloads, ("handoff", None), data[i:]  # autobahn refuses it
            if opcode == BINARY and self._fragmented:
                return payloads, ("protocol", "a binary frame inside a fragmented message"), b""
            total = length + (self._message if opcode == CONTINUATION else 0)
            if total > self.max_message:
                return payloads, ("too_large", (total, self.max_message)), b""
            fin = b0 & _FIN
            self._fragmented, self._message = not fin, 0 if fin else total
            self._masker = masker(data[i + header - 4 : i + header], length) if masked and length else None
            self._left = length
            i += header
        return payloads, None, b""
