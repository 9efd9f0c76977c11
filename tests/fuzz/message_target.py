"""PEX and chat messages as fuzz targets: the public decoders fed any bytes, with checks.

Shared by the hypothesis tests (tests/core/test_fuzz_pex_chat.py) and the atheris
harnesses (fuzz_pex.py, fuzz_chat.py). ``check_pex`` feeds one message to
``reactors.pex_wire.decode_message``, ``check_chat`` one to ``reactors.chat_wire.decode``;
for every input:

* a failure is the module's own error and nothing else: ``PexMisbehaved`` with one of
  the reasons decoding gives (specs/pex.md section 4), or the ``ChatProtocolError``
  subclasses decoding raises (specs/chat.md); construct's errors, a bare ValueError or
  anything else escaping is a bug;
* a success round-trips: the value re-encodes (``encode_request`` / ``encode_addrs``,
  ``chat_wire.encode``) to bytes that decode to the same value. Chat fields have one
  encoding each, so the bytes must be the input's; PEX accepts non-minimal varints
  (go-wire), so its re-encoding may only be shorter, and re-encodes to itself;
* work is bounded by the input, not by what it declares: every decode takes less than
  ``MAX_SECONDS``, and when tracemalloc is tracing (the CI tests) allocates at most
  ``MEMORY_BASE + MEMORY_PER_BYTE`` times the input size.

Structure-aware inputs are built from the declarations (``PexMessage``, ``PexAddress``,
``chat_wire.DECLARATIONS``) field by field, as tests/fuzz/declared.py describes. Imports
no Twisted and no hypothesis.
"""

from __future__ import annotations

import time
import tracemalloc

from construct import Bytes, FormatField, GreedyBytes, StringEncoded

from mconn.core import wire
from reactors import chat_wire, pex_wire
from reactors.pex_wire import PexMisbehaved, PexType

from tests.fuzz.declared import RAW, Chooser, Raw, Reader, build_struct, draw_edits, mutate, value

#: The reasons decode_message gives (the others are the reactor's: unsolicited_reply...).
PEX_DECODE_REASONS = frozenset({"malformed", "oversized", "unroutable_address"})
#: The errors chat_wire.decode raises (the others are the reactor's field checks).
CHAT_DECODE_ERRORS = frozenset({chat_wire.MalformedChatMessage, chat_wire.ChatMessageTooLarge})
#: Generous for a loaded machine and atheris's instrumentation; a decode that sized its
#: work from a declared count (2**32 entries) would take far longer.
MAX_SECONDS = 1.0
MEMORY_BASE = 512 * 1024
MEMORY_PER_BYTE = 64
#: The ``limit`` a PEX message is decoded with: none, the default channel capacity, small.
PEX_LIMITS = (None, pex_wire.max_message_bytes(100), None, 40)


def bounded(decode, size: int):
    """``decode()``'s result, or the exception it raised, checked for time and memory."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    try:
        outcome = decode()
    except Exception as error:  # judged by the caller, after the bounds
        outcome = error
    elapsed = time.perf_counter() - started
    assert elapsed < MAX_SECONDS, f"decoding {size} bytes took {elapsed:.3f}s"
    if tracing:
        peak = tracemalloc.get_traced_memory()[1] - base
        assert peak <= MEMORY_BASE + MEMORY_PER_BYTE * size, f"decoding {size} bytes allocated {peak} bytes"
    return outcome


# -- PEX ----------------------------------------------------------------------------------------


def check_pex(message: bytes, limit: int | None = None):
    """Decode ``message`` with every check; returns the decoded value or the PexMisbehaved."""
    outcome = bounded(lambda: pex_wire.decode_message(message, limit=limit), len(message))
    if isinstance(outcome, Exception):
        if type(outcome) is not PexMisbehaved:
            raise outcome
        assert outcome.reason in PEX_DECODE_REASONS, outcome.reason
        return outcome
    kind, decoded = outcome
    assert limit is None or len(message) <= limit
    again = pex_wire.encode_request(decoded) if kind is PexType.REQUEST else pex_wire.encode_addrs(decoded)
    assert pex_wire.decode_message(again) == outcome, (message.hex(), again.hex())
    assert len(again) <= len(message), "only non-minimal varints may re-encode shorter"
    if kind is PexType.ADDRS:
        assert pex_wire.encode_addrs(pex_wire.decode_message(again)[1]) == again
    return outcome


UNKNOWN_PEX_TYPES = (0x00, 0x03, 0xFF)
MAX_ADDRESSES = (100, 0, pex_wire.MAX_WIRE_ADDRESSES, pex_wire.MAX_WIRE_ADDRESSES + 1, 2**32, 2**64 - 1, RAW)
DECLARED = ("exact", "one more", "one less", pex_wire.MAX_WIRE_ADDRESSES + 1, 2**32, 2**64 - 1)
HOSTS = (
    "127.0.0.1",
    "::1",
    "example.com",
    "fe80::1%eth0",
    "a.",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "255.255.255.255",
    "",
    "a b",
    "-x.com",
    "é.example",
    "x" * 255,
    "1.2.3.4.5",
    "[::1]",
    "host:1",
    "a\x00b",
    "1.1.1.1 ",
    RAW,
)
PORTS = (26656, 0, 1, 65535, RAW)


def draw_pex(chooser: Chooser) -> bytes:
    """A PEX message built from pex_wire's declarations, each field valid or not."""
    known = chooser.number(3) != 3
    kind = chooser.pick((PexType.ADDRS, PexType.REQUEST) if known else UNKNOWN_PEX_TYPES)
    request = kind == PexType.REQUEST if known else bool(chooser.number(1))  # an unknown type: any body
    if request:
        body = build_struct(pex_wire.RequestBody, max_addresses=_count(value(chooser, MAX_ADDRESSES, raw_size=9)))
    else:
        addresses = [_address(chooser, i) for i in range(chooser.number(4))]
        declared = value(chooser, DECLARED)
        n = {"exact": len(addresses), "one more": len(addresses) + 1, "one less": max(0, len(addresses) - 1)}
        body = build_struct(
            pex_wire.AddrsBody, count=_count(n.get(declared, declared)), addresses=Raw(b"".join(addresses))
        )
    message = build_struct(pex_wire.PexMessage, type=kind, body=Raw(body))
    return mutate(message, draw_edits(chooser))


def _count(count):
    """A count the declaration builds (at most MAX_WIRE_ADDRESSES), else its raw varint."""
    if isinstance(count, Raw) or count <= pex_wire.MAX_WIRE_ADDRESSES:
        return count
    return Raw(wire.encode_uvarint(count))


def _address(chooser: Chooser, index: int) -> bytes:
    node_id = value(chooser, (bytes([0xA0 + index]) * 20, bytes([0xA0]) * 20, RAW))
    host = value(chooser, HOSTS, raw_size=12)
    return build_struct(pex_wire.PexAddress, node_id=node_id, host=host, port=value(chooser, PORTS, raw_size=3))


def fuzz_pex(data: bytes) -> None:
    """The atheris target: byte 0 chooses the limit (bits 0-1) and whether the rest is the
    message itself (bit 2) or the field choices of a structure-aware one."""
    mode = data[0] if data else 0
    message = data[1:] if mode & 4 else draw_pex(Reader(data[1:]))
    check_pex(message, PEX_LIMITS[mode & 3])


# -- chat ---------------------------------------------------------------------------------------


def check_chat(channel_id: int, message: bytes):
    """Decode ``message`` with every check; returns ``(kind, fields)`` or the ChatProtocolError."""
    outcome = bounded(lambda: chat_wire.decode(channel_id, message), len(message))
    if isinstance(outcome, Exception):
        if type(outcome) not in CHAT_DECODE_ERRORS:
            raise outcome
        return outcome
    kind, parsed = outcome
    fields = {name: v for name, v in parsed.items() if not name.startswith("_")}
    again = chat_wire.encode(channel_id, kind, **fields)
    assert again == message, f"{message.hex()} decodes to {fields}, which encodes to {again.hex()}"
    kind_again, parsed_again = chat_wire.decode(channel_id, again)
    assert (kind_again, {n: v for n, v in parsed_again.items() if not n.startswith("_")}) == (kind, fields)
    return kind, fields


SHORT_TEXTS = ("alice", "", "é" * 3, "x" * 64, "x" * 65, "../x", "a\x00b", "\x1b]0;title\x07", "x" * 255, RAW)
LONG_TEXTS = ("hello", "x" * chat_wire.MAX_TEXT, "x" * (chat_wire.MAX_TEXT + 1), *SHORT_TEXTS)
DATA = (b"chunk", b"", bytes(chat_wire.CHUNK_SIZE), bytes(chat_wire.CHUNK_SIZE + 1), RAW)
KIND_EXTRAS = (0x00, 0x06, 0xFF)


def draw_chat(chooser: Chooser, channel_id: int) -> bytes:
    """A message of ``channel_id`` built from chat_wire.DECLARATIONS, each field valid or not."""
    kinds = sorted(chat_wire.DECLARATIONS[channel_id])
    kind = chooser.pick(kinds) if chooser.number(3) != 3 else chooser.pick(KIND_EXTRAS)
    declarations = chat_wire.DECLARATIONS[channel_id]
    declaration = declarations.get(kind, declarations[kinds[0]])  # an unknown kind: any body
    message = bytes([kind]) + _body(chooser, declaration) + chooser.blob(2) * chooser.number(1)
    return mutate(message, draw_edits(chooser))


def chat_examples() -> list[tuple[int, bytes]]:
    """``(channel id, message)``: one valid message of every kind, each field at its first
    option (the seeds of fuzz_chat.py; specs/vectors has no chat vectors)."""
    return [
        (channel_id, bytes([kind]) + _body(Reader(b""), declaration))
        for channel_id, declarations in chat_wire.DECLARATIONS.items()
        for kind, declaration in sorted(declarations.items())
    ]


def _body(chooser: Chooser, declaration) -> bytes:
    fields = {sub.name: _field(chooser, sub.subcon) for sub in declaration.subcons if sub.name is not None}
    return build_struct(declaration, **fields)


def _field(chooser: Chooser, con):
    """A value for one field, chosen by its construct type (so new message kinds get one too)."""
    if isinstance(con, Bytes):
        return value(chooser, (bytes(range(con.length)), bytes(con.length), RAW))
    if isinstance(con, FormatField):
        top = 2 ** (8 * con.length) - 1
        return value(chooser, (1, 0, top, top // 2 + 1))
    if isinstance(con, StringEncoded):
        return value(chooser, SHORT_TEXTS if con.subcon.lengthfield.sizeof() == 1 else LONG_TEXTS)
    if con is GreedyBytes:
        return value(chooser, DATA)
    inner = con  # a validated or adapted integer (OneOf, a boolean byte): its raw encodings
    while not isinstance(inner, FormatField) and hasattr(inner, "subcon"):
        inner = inner.subcon
    if isinstance(inner, FormatField):
        return Raw(inner.build(value(chooser, (1, 0, 2, 5, 6, 2 ** (8 * inner.length) - 1))))
    return Raw(chooser.blob(8))


def fuzz_chat(data: bytes) -> None:
    """The atheris target: byte 0 chooses the channel (bit 0: FILE) and whether the rest is
    the message itself (bit 1) or the field choices of a structure-aware one."""
    mode = data[0] if data else 0
    channel_id = chat_wire.FILE if mode & 1 else chat_wire.CHAT
    message = data[1:] if mode & 2 else draw_chat(Reader(data[1:]), channel_id)
    check_chat(channel_id, message)
