"""The chat reactor's wire: its two channels, their messages and limits (specs/chat.md).

The construct declarations below are the source of truth for specs/chat.md. ``encode``
builds a message (a kind byte, then the fields); ``decode`` checks a message's length
against its channel's largest before it parses a byte, and raises a ChatProtocolError
subclass for anything specs/chat.md forbids. ``check_length`` and ``safe_file_name``
are the field checks the reactor (reactors/chat.py, reactors/chat_files.py) applies after
parsing.
"""

from __future__ import annotations

import unicodedata

from construct import (
    Bytes,
    ConstructError,
    ExprAdapter,
    GreedyBytes,
    Int8ub,
    Int16ub,
    Int32ub,
    Int64ub,
    OneOf,
    PascalString,
    Struct,
    Terminated,
)

from mconn import RemoteProtocolError

CHAT = 0x20
FILE = 0x21

#: Largest chat line text and node name, in UTF-8 bytes.
MAX_TEXT = 4000
MAX_NAME = 64
#: Largest file name in an offer, in UTF-8 bytes.
MAX_FILE_NAME = 255
CHUNK_SIZE = 64 * 1024
ID_SIZE = 16
NODE_ID_SIZE = 20
MAX_HOPS = 16
#: A CHAT message is never longer than a LINE with the longest name and text.
MAX_CHAT_MESSAGE = 1 + ID_SIZE + NODE_ID_SIZE + 1 + 1 + MAX_NAME + 2 + MAX_TEXT
#: A FILE message is never longer than a CHUNK.
MAX_FILE_MESSAGE = 1 + ID_SIZE + CHUNK_SIZE

#: Why a receiver refuses an offer or the rest of a transfer (REFUSE, specs/chat.md section 3.1).
TOO_LARGE, PEER_QUOTA, DOWNLOADS_QUOTA, DISK_FLOOR, CANNOT_STORE = 1, 2, 3, 4, 5
REFUSALS = {
    TOO_LARGE: "too_large",
    PEER_QUOTA: "peer_quota",
    DOWNLOADS_QUOTA: "downloads_quota",
    DISK_FLOOR: "disk_floor",
    CANNOT_STORE: "cannot_store",
}

# -- the messages (specs/chat.md) ---------------------------------------------------

# kind 0x01 | name: u8 length + UTF-8
NameMessage = Struct("name" / PascalString(Int8ub, "utf8"), Terminated)
# kind 0x02 | id[16] | origin node id[20] | hops: u8 | name: u8 length + UTF-8 | text: u16 length + UTF-8
LineMessage = Struct(
    "id" / Bytes(ID_SIZE),
    "origin" / Bytes(NODE_ID_SIZE),
    "hops" / Int8ub,
    "name" / PascalString(Int8ub, "utf8"),
    "text" / PascalString(Int16ub, "utf8"),
    Terminated,
)
# kind 0x01 | transfer id[16] | size: u64 | sha256[32] | name: u8 length + UTF-8
OfferMessage = Struct(
    "transfer" / Bytes(ID_SIZE),
    "size" / Int64ub,
    "sha256" / Bytes(32),
    "name" / PascalString(Int8ub, "utf8"),
    Terminated,
)
# kind 0x02 | transfer id[16] | data (the rest, 1..CHUNK_SIZE bytes)
ChunkMessage = Struct("transfer" / Bytes(ID_SIZE), "data" / GreedyBytes)
# kind 0x03 | transfer id[16] | reason: u8 length + UTF-8
CancelMessage = Struct("transfer" / Bytes(ID_SIZE), "reason" / PascalString(Int8ub, "utf8"), Terminated)
# A byte that must be 00 or 01 (construct's Flag reads any other byte as true).
Bool = ExprAdapter(OneOf(Int8ub, [0, 1]), lambda obj, ctx: bool(obj), lambda obj, ctx: int(obj))
# kind 0x04 | transfer id[16] | ok: u8 (0 or 1) | reason: u8 length + UTF-8
ReceiptMessage = Struct("transfer" / Bytes(ID_SIZE), "ok" / Bool, "reason" / PascalString(Int8ub, "utf8"), Terminated)
# kind 0x05 | transfer id[16] | code: u8 (a key of REFUSALS) | retry_after: u32 seconds (0: waiting
# will not help) | reason: u8 length + UTF-8
RefuseMessage = Struct(
    "transfer" / Bytes(ID_SIZE),
    "code" / OneOf(Int8ub, set(REFUSALS)),
    "retry_after" / Int32ub,
    "reason" / PascalString(Int8ub, "utf8"),
    Terminated,
)

NAME, LINE = 0x01, 0x02
OFFER, CHUNK, CANCEL, RECEIPT, REFUSE = 0x01, 0x02, 0x03, 0x04, 0x05
DECLARATIONS = {
    CHAT: {NAME: NameMessage, LINE: LineMessage},
    FILE: {
        OFFER: OfferMessage,
        CHUNK: ChunkMessage,
        CANCEL: CancelMessage,
        RECEIPT: ReceiptMessage,
        REFUSE: RefuseMessage,
    },
}
LIMITS = {CHAT: MAX_CHAT_MESSAGE, FILE: MAX_FILE_MESSAGE}


class ChatProtocolError(RemoteProtocolError):
    """A chat peer sent something specs/chat.md forbids; it is dropped."""


class MalformedChatMessage(ChatProtocolError):
    """A message that does not parse, or breaks a field's limit."""


class ChatMessageTooLarge(ChatProtocolError):
    """A message longer than the largest its channel can carry."""


class UnsafeFileName(ChatProtocolError):
    """An offered file name that is a path (separators, '..', NUL)."""


class UnexpectedFileMessage(ChatProtocolError):
    """A FILE message that does not fit the transfer in progress (specs/chat.md section 3)."""


def encode(channel_id: int, kind: int, **fields) -> bytes:
    return bytes([kind]) + DECLARATIONS[channel_id][kind].build(fields)


def decode(channel_id: int, message: bytes):
    """(kind, fields) of one message; the length is checked before a byte is parsed."""
    if len(message) > LIMITS[channel_id]:
        raise ChatMessageTooLarge(
            f"a message of {len(message)} bytes on channel {channel_id:#04x}; the largest is {LIMITS[channel_id]}"
        )
    if not message:
        raise MalformedChatMessage(f"an empty message on channel {channel_id:#04x}")
    declaration = DECLARATIONS[channel_id].get(message[0])
    if declaration is None:
        raise MalformedChatMessage(f"unknown message kind {message[0]:#04x} on channel {channel_id:#04x}")
    try:
        fields = declaration.parse(message[1:])
    except (ConstructError, UnicodeDecodeError) as e:
        raise MalformedChatMessage(f"kind {message[0]:#04x} on channel {channel_id:#04x}: {e}") from None
    return message[0], fields


def clip_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    return text.encode("utf8")[:limit].decode("utf8", errors="ignore")


def check_length(what: str, text: str, limit: int) -> None:
    size = len(text.encode("utf8"))
    if size > limit:
        raise MalformedChatMessage(f"{what} of {size} bytes; the largest is {limit}")


def safe_file_name(name: str) -> str:
    """The name to store an offered file under.

    :raises UnsafeFileName: for a name that is a path: empty, '.' or '..', or containing
        '/', '\\' or NUL. A correct sender sends a base name only.
    """
    if name in ("", ".", "..") or any(c in name for c in "/\\\x00"):
        raise UnsafeFileName(f"offered file name {name!r} is a path, not a file name")
    cleaned = "".join("_" if unicodedata.category(c).startswith("C") else c for c in name)
    return "_" + cleaned[1:] if cleaned.startswith(".") else cleaned
