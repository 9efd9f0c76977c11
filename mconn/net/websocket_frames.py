"""The hot paths of an open WebSocket (RFC 6455 section 5), sans I/O: FrameReader reads
frames, ``binary_frames`` builds them.

mconn's WebSocket peers send binary frames, one per write. autobahn parses every frame
through a chain of a dozen Python calls and debug-log arguments built on every read;
the reader here takes the binary and continuation frames of an open connection itself
and streams their payloads (unmasked) as they arrive, and stops at anything else, handing
it to autobahn, which keeps the rest of RFC 6455: control frames (ping, pong, close),
and failing every frame that breaks a rule (text, reserved bits, masking, opcodes).

Theory of operation
-------------------
``read(data)`` returns ``(payloads, stop, rest)``. While ``stop`` is None every byte was
taken: the payloads of data frames, as one bytes object in a list (empty if none: the
payload parts of the read are copied into one buffer and unmasked there in place; a
frame may span reads: ``_left`` bytes of it are still to come, unmasked with its key
from where the last read left it, ``_phase``), and at most one incomplete frame header (14 bytes) or control frame (131
bytes) kept for the next read. Otherwise ``stop`` says why
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

``binary_frames(data, limit=..., keys=...)`` is the sending side: the frames of one write
as one bytes object (``binary_frames_of(parts, ...)``: of a write given as a list of
buffers). A dialer's are masked where they are built: its headers, keys and
payload are joined into one buffer (one copy), each payload is masked there in place,
and the buffer becomes bytes (a second copy), since Twisted's ``write`` takes only bytes.

Compiled twin
-------------
``binary_frames``, ``binary_frames_of``, ``FrameReader`` and ``unmasked_payloads`` (the reader's copy of the
payloads) are the reference of mconn/net/_wsframe.pyx, an optional extension built beside
the core's (setup.py), which does the same with one pass over the data: header and
masked payload written straight into the new bytes, payloads unmasked straight into
theirs, and the headers of a read parsed in C. It replaces them where it is built and
current (``frames_of``, ``reader_type``), unless ``MCONN_PURE=1`` (``WSFRAME``,
``WSFRAME_WHY``, ``describe``; chosen as mconn.core.speedups chooses the core's);
tests/integration/test_websocket_twin.py proves the two byte-, state- and error-identical.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from mconn.core.speedups import load_extension

try:  # autobahn's native (SIMD) XOR routine, called on our own buffers
    from _nvx_xormasker import ffi as _ffi, lib as _lib
except ImportError:  # no native routine: XOR on Python's big integers, whatever the size
    _ffi = _lib = None

#: Opcodes of RFC 6455 section 5.2.
CONTINUATION, BINARY = 0x0, 0x2
#: A control frame's payload is at most this long (RFC 6455 section 5.5).
MAX_CONTROL_PAYLOAD = 125
#: No frame is longer (RFC 6455 section 5.2: a 64-bit length's most significant bit is 0).
MAX_LENGTH = (1 << 63) - 1
_RSV = 0x70
_FIN = 0x80
_MASK = 0x80
_BINARY = _FIN | BINARY


#: Below this many payload bytes a frame is (un)masked with Python's big integers, from
#: it on by autobahn's native SIMD routine in place in our buffer, which costs about 1.2
#: us a call whatever the size (its masker made and freed included); on integers 0.8 us
#: at 4 bytes, 1.3 at 128, 2.5 at 512 (measured, one process).
SMALL_MASKING = 128


def mask_in_place(buffer: bytearray, start: int, length: int, key: bytes, phase: int = 0) -> None:
    """RFC 6455 section 5.3: XOR ``buffer[start:start + length]`` in place with the 4-byte
    ``key`` repeated, the first byte taking key byte ``phase % 4`` (the part of a frame
    after ``phase`` of its payload bytes). Masking and unmasking are the same operation."""
    shift = phase & 3
    if shift:
        key = key[shift:] + key[:shift]
    if length >= SMALL_MASKING and _lib is not None:
        # The native routine, without autobahn's wrapper (which allocates a zeroed buffer
        # and copies in and out on every call) and without a garbage-collected masker.
        native = _lib.nvx_xormask_new(_ffi.from_buffer("uint8_t[]", key))  # it copies the key
        if native == _ffi.NULL:
            raise MemoryError(f"autobahn's native XOR masker could not be allocated ({length} bytes to mask)")
        try:
            _lib.nvx_xormask_process(native, _ffi.from_buffer("uint8_t[]", buffer) + start, length)
        finally:
            _lib.nvx_xormask_free(native)
        return
    end = start + length
    pattern = (key * ((length >> 2) + 1))[:length]
    masked = int.from_bytes(buffer[start:end], "little") ^ int.from_bytes(pattern, "little")
    buffer[start:end] = masked.to_bytes(length, "little")


class MaskKeys:
    """A dialer's masking keys (RFC 6455 section 5.3: each frame's key fresh and
    unpredictable): bytes of ``os.urandom`` drawn ``POOL`` at a time, each byte used
    once. One ``getrandom`` system call a write cost as much as masking its 64 KiB;
    drawn in advance it is one per 1,024 frames. Called on the reactor thread only; a
    forked child draws its own (``os.register_at_fork`` below), never the parent's."""

    #: Bytes drawn from the kernel at a time: the keys of 1,024 frames.
    POOL = 4096

    __slots__ = ("_pool", "_at")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self, n: int) -> bytes:
        """``n`` random bytes never handed out before."""
        at = self._at
        if at + n > len(self._pool):
            self._pool, at = os.urandom(max(self.POOL, n)), 0
        self._at = at + n
        return self._pool[at : at + n]

    def forget(self) -> None:
        """Drop the drawn bytes (a forked child must not reuse its parent's)."""
        self._pool, self._at = b"", 0


#: The masking keys of every dialer of this process (``binary_frames(keys=mask_keys)``).
mask_keys = MaskKeys()
os.register_at_fork(after_in_child=mask_keys.forget)


def _header(first: int, mask_bit: int, n: int) -> bytes:
    if n < 126:
        return struct.pack("!BB", first, mask_bit | n)
    if n < 65536:
        return struct.pack("!BBH", first, mask_bit | 126, n)
    return struct.pack("!BBQ", first, mask_bit | 127, n)


def binary_frames(data, *, limit: int, keys=None) -> bytes:
    """``data`` as binary WebSocket messages of one frame each, at most ``limit`` bytes
    of payload apiece, ready to write (RFC 6455 section 5.2): one bytes object, so the
    transport beneath gets one write whatever the number of frames.

    ``keys`` (a dialer's): a function of ``n`` giving ``n`` random bytes (``mask_keys``),
    4 per frame for its masking key; the frames are then masked, in place in the one
    buffer they are built in. None (a listener's): unmasked, one copy of ``data``.
    """
    if limit < 1:
        raise ValueError(f"a WebSocket frame holds at least 1 payload byte; limit is {limit}")
    view = memoryview(data)
    n = view.nbytes
    count = (n + limit - 1) // limit or 1  # b"" is one empty message
    if keys is None:
        if count == 1:
            return _header(_BINARY, 0, n) + data
        parts: list[bytes | memoryview] = []
        for start in range(0, n, limit):
            chunk = view[start : start + limit]
            parts += (_header(_BINARY, 0, len(chunk)), chunk)
        return b"".join(parts)
    all_keys = keys(4 * count)
    if len(all_keys) != 4 * count:
        raise ValueError(f"keys({4 * count}) gave {len(all_keys)} bytes: 4 are needed for each of {count} frames")
    parts, regions, at = [], [], 0
    for k in range(count):
        chunk = view[k * limit : (k + 1) * limit]
        key = all_keys[4 * k : 4 * k + 4]
        head = _header(_BINARY, _MASK, len(chunk)) + key
        at += len(head)
        parts += (head, chunk)
        regions.append((at, len(chunk), key))
        at += len(chunk)
    frames = bytearray().join(parts)  # one copy, no zero fill
    for start, length, key in regions:
        if length:
            mask_in_place(frames, start, length, key)
    return bytes(frames)


def binary_frames_of(parts: list, *, limit: int, keys=None) -> bytes:
    """``binary_frames`` of the bytes of ``parts`` (a list of buffers: a bulk write's
    packet headers and payload views, as ``Connection.buffers_to_send`` gives them), joined
    first here; the compiled twin reads each part straight into the frames."""
    return binary_frames(b"".join(parts), limit=limit, keys=keys)


class FrameReader:
    """Reads the data frames of one open WebSocket connection.

    :param masked: whether frames must be masked (a listener reads a dialer's frames).
    :param max_message: the largest message accepted, in bytes (``ws_max_message_bytes``).
    """

    def __init__(self, *, masked: bool, max_message: int) -> None:
        if max_message < 0:
            raise ValueError(f"max_message is a size in bytes, not {max_message}")
        self.masked = masked
        # RFC 6455 section 5.2: a 64-bit length's top bit is 0, so no frame is longer.
        self.max_message = min(max_message, MAX_LENGTH)
        self._head = b""  # an incomplete header or control frame
        self._left = 0  # payload bytes of the current data frame still to come
        self._key: bytes | None = None  # the current data frame's masking key (None: unmasked)
        self._phase = 0  # payload bytes of the current data frame taken so far
        self._fragmented = False  # inside a message whose last frame has not come
        self._message = 0  # bytes of that message so far

    @property
    def idle(self) -> bool:
        """Between frames, nothing buffered: autobahn may take over."""
        return not self._head and not self._left

    def read(self, data: bytes):
        """``(payloads, stop, rest)``; see the module docstring."""
        regions = []  # (start, end, key, phase) of the payload bytes in ``data``
        if self._head:
            data, self._head = self._head + data, b""
        i, n = 0, len(data)
        while i < n:
            left = self._left
            if left:
                end = i + left if i + left < n else n
                regions.append((i, end, self._key, self._phase))
                self._left = left - (end - i)
                self._phase += end - i
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
                    return _payloads(data, regions), ("handoff", None), data[i:]
                end = i + header + length
                if end > n:
                    self._head = data[i:]
                    break
                return _payloads(data, regions), ("control", data[i:end]), data[end:]
            if b0 & _RSV or opcode not in (CONTINUATION, BINARY) or bool(masked) != self.masked:
                return _payloads(data, regions), ("handoff", None), data[i:]
            if opcode == CONTINUATION and not self._fragmented:
                return _payloads(data, regions), ("handoff", None), data[i:]  # autobahn refuses it
            if opcode == BINARY and self._fragmented:
                return _payloads(data, regions), ("protocol", "a binary frame inside a fragmented message"), b""
            total = length + (self._message if opcode == CONTINUATION else 0)
            if total > self.max_message:
                return _payloads(data, regions), ("too_large", (total, self.max_message)), b""
            fin = b0 & _FIN
            self._fragmented, self._message = not fin, 0 if fin else total
            self._key = data[i + header - 4 : i + header] if masked and length else None
            self._left, self._phase = length, 0
            i += header
        return _payloads(data, regions), None, b""


def unmasked_payloads(data: bytes, regions: list) -> list:
    """The payload bytes of ``regions`` of ``data`` (each ``(start, end, key, phase)``:
    ``key`` None or 4 bytes, applied from its byte ``phase % 4``), unmasked, as one bytes
    object (in a list; empty if none): a masked read costs two copies (into one buffer
    unmasked in place, out as bytes) whatever the number of frames in it, an unmasked one
    at most one.

    :raises ValueError: a region outside ``data`` or a key not 4 bytes long (the reader
        never makes one; the compiled twin must not read outside the buffer).
    """
    if not regions:
        return []
    n = len(data)
    for start, end, key, _ in regions:
        if not 0 <= start <= end <= n:
            raise ValueError(f"payload region {start}:{end} is outside the {n} bytes read")
        if key is not None and len(key) != 4:
            raise ValueError(f"a masking key is 4 bytes, not {len(key)}")
    if len(regions) == 1:
        start, end, key, phase = regions[0]
        if key is None:
            return [data if start == 0 and end == len(data) else data[start:end]]
        buffer = bytearray(memoryview(data)[start:end])
        mask_in_place(buffer, 0, end - start, key, phase)
        return [bytes(buffer)]
    view = memoryview(data)
    if all(key is None for _, _, key, _ in regions):
        return [b"".join([view[start:end] for start, end, _, _ in regions])]
    buffer = bytearray().join([view[start:end] for start, end, _, _ in regions])
    at = 0
    for start, end, key, phase in regions:
        if key is not None:
            mask_in_place(buffer, at, end - start, key, phase)
        at += end - start
    return [bytes(buffer)]


#: The interface version of mconn/net/_wsframe.pyx this source expects.
WSFRAME_INTERFACE = 2
#: The compiled twin when it is in use, else None; and why not, when it is not.
WSFRAME, WSFRAME_WHY = load_extension("mconn.net._wsframe", WSFRAME_INTERFACE)
#: "accelerated" or "pure Python" (the status document's ``ws_frames``).
IMPLEMENTATION = "accelerated" if WSFRAME is not None else "pure Python"


def describe() -> str:
    """Which copies WebSocket frames run on: ``accelerated``, or ``pure Python (why)``."""
    return IMPLEMENTATION if WSFRAME is not None else f"{IMPLEMENTATION} ({WSFRAME_WHY})"


#: What the carrier frames a write with, and reads frames with (``reader_type(masked=...,
#: max_message=...)``): the compiled twin's when it is in use, else the references above.
frames_of: Callable[..., bytes] = binary_frames if WSFRAME is None else WSFRAME.binary_frames
#: What the carrier frames a bulk write's buffers with (unjoined), likewise.
parts_frames_of: Callable[..., bytes] = binary_frames_of if WSFRAME is None else WSFRAME.binary_frames_of
reader_type: Callable[..., Any] = FrameReader if WSFRAME is None else WSFRAME.FrameReader
#: What the reference FrameReader copies payloads with.
_payloads: Callable[[Any, list], list] = unmasked_payloads if WSFRAME is None else WSFRAME.unmasked_payloads
