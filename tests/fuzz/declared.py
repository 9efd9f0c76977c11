"""Structure-aware fuzz inputs: messages built field by field from construct declarations.

A valid message is built from its declaration (mconn/core/wire.py, reactors/pex_wire.py,
reactors/chat_wire.py) one named field at a time, so that any field can be replaced by
``Raw`` bytes (a value the declaration would refuse to build: a 15-byte session id, a
boolean byte 02, a string that is not UTF-8) while the fields around it stay valid.
``mutate`` then flips, inserts, deletes and cuts bytes of the result.

The choices come from a *chooser*: ``Reader`` takes them from plain bytes (the atheris
harnesses, the seed corpus); tests/fuzz/strategies.py has one that draws them with
hypothesis. So one generator serves both. Imports no Twisted and no hypothesis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Raw:
    """Bytes that stand for a field's encoding, whatever its declaration says."""

    data: bytes


#: In an options list: "raw bytes instead of a value" (the chooser draws them).
RAW = object()


class Chooser(Protocol):
    def pick(self, options: Sequence[T]) -> T:
        """One of ``options``; the first when the input runs out (so a short input is valid)."""

    def number(self, limit: int) -> int:
        """An integer in 0..limit."""

    def blob(self, max_size: int) -> bytes:
        """At most ``max_size`` bytes."""


class Reader:
    """A chooser over fuzzer bytes: each choice consumes bytes; an exhausted input gives
    zeros (the first option, 0, empty), so every input decodes to something."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]

    def pick(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]

    def number(self, limit: int) -> int:
        size = (limit.bit_length() + 7) // 8
        value = int.from_bytes(bytes(self.byte() for _ in range(size)), "big")
        return value % (limit + 1)

    def blob(self, max_size: int) -> bytes:
        size = self.byte() % (max_size + 1)
        out = self.data[self.at : self.at + size]
        self.at += len(out)
        return out

    def rest(self) -> bytes:
        out, self.at = self.data[self.at :], len(self.data)
        return out


def value(chooser: Chooser, options: Sequence, raw_size: int = 24):
    """``options[0]`` (a valid value) three times in four, else any of ``options``, where
    a ``RAW`` option becomes ``Raw`` bytes. So most messages break one or two fields only."""
    choice = chooser.pick(options) if chooser.number(3) == 3 else options[0]
    return Raw(chooser.blob(raw_size)) if choice is RAW else choice


def build_struct(struct, **values) -> bytes:
    """``struct``'s bytes, field by field: each named field from ``values`` is built with
    its own declaration, or is the bytes of a ``Raw``. Unnamed parts (Terminated) add nothing."""
    out = bytearray()
    for sub in struct.subcons:
        if sub.name is None:
            continue
        field = values[sub.name]
        out += field.data if isinstance(field, Raw) else sub.build(field)
    return bytes(out)


#: Byte edits: (kind, position as a fraction of the length in 0..255, bytes).
EDITS = ("flip", "insert", "delete", "cut", "repeat")


def draw_edits(chooser: Chooser, most: int = 3) -> tuple:
    """None three times in four, else up to ``most`` byte edits; none from an exhausted input."""
    if chooser.number(3) != 3:
        return ()
    return tuple(
        (chooser.pick(EDITS), chooser.number(255), chooser.blob(8) or b"\x01") for _ in range(chooser.number(most))
    )


def mutate(data: bytes, edits) -> bytes:
    """``data`` with ``edits`` applied in order (see ``draw_edits``)."""
    out = bytearray(data)
    for kind, where, blob in edits:
        at = len(out) * where // 256
        if kind == "flip" and at < len(out):
            out[at] ^= blob[0] or 1
        elif kind == "insert":
            out[at:at] = blob
        elif kind == "delete":
            del out[at : at + len(blob)]
        elif kind == "cut":
            del out[at:]
        elif kind == "repeat":
            out[at:at] = out[max(0, at - len(blob) * 2) : at]
    return bytes(out)
