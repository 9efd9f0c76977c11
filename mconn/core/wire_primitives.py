"""The primitives the wire format is built of (specs/wire.md section 2.1).

go-wire's unsigned varint (``GoWireUvarint``, ``uvarint``), byte slice (``ByteSlice``)
and string (``String``), declared with construct; a byte that must be 00 or 01
(``BoolByte``); the same uvarint written and read by hand for the codecs that skip
construct on hot paths (``uvarint_bytes``, ``read_uvarint``); and ``parse``, which turns
every failure of a declaration's parse into one ``MalformedPacket``. mconn/core/wire.py
composes the packets from them.
"""

from __future__ import annotations

from typing import IO, Any

from construct import (
    Adapter,
    Construct,
    ConstructError,
    GreedyBytes,
    PascalString,
    Prefixed,
    stream_read,
    stream_write,
)

from mconn.errors import MalformedPacket

#: A uvarint's size byte is at most this (64-bit values).
MAX_UVARINT_SIZE = 8


class GoWireUvarint(Construct):
    """go-wire's unsigned varint: one size byte N (0..8), then N big-endian bytes.

    ``00`` is zero; ``02 01 2c`` is 300. A size byte over 8 (which includes go-wire's
    negative forms ``F1``...) fails. Non-minimal forms such as ``02 00 05`` are accepted
    on read, as go-wire does; writes are always minimal.
    """

    def _parse(self, stream: IO[bytes], context: Any, path: str) -> int:
        size = stream_read(stream, 1, path)[0]
        if size > MAX_UVARINT_SIZE:
            raise MalformedPacket(f"varint size byte {size:#04x} is over {MAX_UVARINT_SIZE}")
        if size == 0:
            return 0
        return int.from_bytes(stream_read(stream, size, path), "big")

    def _build(self, obj: object, stream: IO[bytes], context: Any, path: str) -> int:
        if not isinstance(obj, int) or obj < 0 or obj >= 1 << (8 * MAX_UVARINT_SIZE):
            raise MalformedPacket(f"varint value {obj!r} is not an integer in 0..2**64-1")
        size = (obj.bit_length() + 7) // 8
        stream_write(stream, bytes([size]) + obj.to_bytes(size, "big"), size + 1, path)
        return obj

    def _sizeof(self, context: Any, path: str) -> int:
        raise NotImplementedError("a go-wire varint has a variable size")


uvarint = GoWireUvarint()

#: go-wire byte slice: uvarint length, then the bytes.
ByteSlice = Prefixed(uvarint, GreedyBytes)
#: go-wire string: a byte slice holding UTF-8.
String = PascalString(uvarint, "utf8")


class BoolByte(Adapter):
    """A byte that must be 00 or 01 (the msg packet's eof, the session flags)."""

    def _decode(self, obj: int, context: Any, path: str) -> bool:
        return bool(obj)

    def _encode(self, obj: object, context: Any, path: str) -> int:
        return 1 if obj else 0


def parse(declaration: Any, data: bytes, what: str) -> Any:
    """Parse ``data`` with a declaration; every failure becomes MalformedPacket."""
    try:
        return declaration.parse(data)
    except MalformedPacket:
        raise
    except (ConstructError, IndexError, KeyError, ValueError, UnicodeDecodeError) as e:
        raise MalformedPacket(f"malformed {what} ({len(data)} bytes): {e}") from None


def uvarint_bytes(value: int) -> bytes:
    """go-wire uvarint bytes for ``value``, written by hand (no range check: callers check)."""
    size = (value.bit_length() + 7) // 8
    return bytes((size,)) + value.to_bytes(size, "big")


def read_uvarint(data: bytes, at: int) -> tuple[int, int]:
    """(value, next offset) of the uvarint at ``at``; IndexError if it does not fit."""
    size = data[at]
    end = at + 1 + size
    if size > MAX_UVARINT_SIZE or end > len(data):
        raise IndexError(at)
    return int.from_bytes(data[at + 1 : end], "big"), end
