"""The address book on disk: CometBFT's ``addrbook.json`` for reactors/addrbook.py (specs/pex.md 3.6).

A PexReactor with an ``addrbook_file`` saves its book every ``save_interval`` and when
the Switch stops, and reads it back when the Switch starts, so a restarted node dials
the nodes it knew instead of starting over from its configured peers.

* *Saving is atomic*: the JSON goes to a temporary file in the same directory (mode
  0600: the file holds the book's secret placement key), is fsynced, then
  ``os.replace``\\ d over the old file, and the directory is fsynced. A crash leaves the
  old file or the new one, never half of one.
* *Reading is bounded*: only a regular file is opened (a FIFO would block the node); at
  most ``MAX_BOOK_FILE_BYTES`` are read, and a larger file is refused before it is
  parsed; the list may hold at most as many entries as the book has room for; every
  entry is checked (its address parses and names a node, each field has its type and
  range) before one is used. Anything wrong refuses the whole file with a
  :class:`BookFileError` naming the file and the problem; the reactor then starts with
  an empty book (and keeps the refused file as ``FILE.refused``).

The file also names the book's *anchors* (PEX's outbound peers when it was saved, which
a restarted node dials first: specs/pex.md section 3.11), each the node id of an entry.

The entries then go into the book through its ordinary rules (buckets, per-source cap,
the address rules of specs/pex.md section 3.5): a file written by hand cannot place more,
or other, addresses than peers could.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from collections.abc import Sequence

from mconn.core.address import PeerAddress, parse_address
from mconn.core.private_file import write_private_file
from reactors.addrbook import AddressBook

#: The largest book file read: 1280 entries (the default book's room) of at most about
#: 900 bytes each (an address with a 255-byte host and path, its source and fields).
MAX_BOOK_FILE_BYTES = 2 * 1024 * 1024
#: The format this module writes (version 1, without anchors, is read too).
VERSION = 2
#: Anchors a file may name at most (the outbound peers PEX dials first after a restart).
MAX_SAVED_ANCHORS = 64
#: Failures an entry may carry (a book forgets an entry long before that).
MAX_SAVED_FAILURES = 1000

_NODE_ID = re.compile(r"[0-9a-f]{40}")
_ENTRY_KEYS = frozenset(
    {"address", "source", "source_group", "added", "tried", "did_connect", "failures", "last_success"}
)


class BookFileError(ValueError):
    """A book file that cannot be used; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class SavedEntry:
    """One entry of a book file, checked."""

    address: PeerAddress
    source: str
    source_group: str
    added: float
    tried: bool
    did_connect: bool
    failures: int
    last_success: float | None


@dataclasses.dataclass(frozen=True)
class SavedBook:
    """A book file, checked: the placement key and the entries."""

    key: bytes
    entries: tuple[SavedEntry, ...]
    #: Node ids of entries to dial first after a restart (PEX's anchors), oldest first.
    anchors: tuple[str, ...] = ()


def book_json(book: AddressBook, anchors: Sequence[str] = ()) -> dict:
    """The JSON-ready form of ``book``: its key, every entry and the ``anchors`` (node ids
    of entries: those not in the book, and past MAX_SAVED_ANCHORS, are left out)."""
    return {
        "version": VERSION,
        "key": book.key.hex(),
        "anchors": [n for n in anchors if n in book][:MAX_SAVED_ANCHORS],
        "entries": [
            {
                "address": str(e.address),
                "source": e.source,
                "source_group": e.source_group,
                "added": e.added,
                "tried": e.tried,
                "did_connect": e.did_connect,
                "failures": e.failures,
                "last_success": e.last_success,
            }
            for e in book.entries.values()
        ],
    }


def save_book(path: str, book: AddressBook, *, anchors: Sequence[str] = ()) -> None:
    """Write ``book`` (and its ``anchors``) to ``path`` atomically, mode 0600 (the book's
    secret key lets a reader aim addresses at buckets), with
    ``mconn.core.private_file.write_private_file``: a temporary file, fsynced, renamed
    over the old one, the directory fsynced.

    :raises OSError: if it cannot be written; the old file, if any, is left as it was.
    """
    data = json.dumps(book_json(book, anchors), separators=(",", ":")).encode()
    write_private_file(path, data)


def read_book(path: str, *, capacity: int, limit: int = MAX_BOOK_FILE_BYTES) -> SavedBook | None:
    """The checked contents of the book file ``path``, or None if there is none.

    :param capacity: entries the book has room for; a file with more is refused.
    :param limit: the largest file read, in bytes.
    :raises BookFileError: naming ``path`` and the problem (not a regular file, over
        ``limit`` bytes, not JSON, another version, a malformed key or entry...).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BookFileError(f"address book {path}: cannot open it: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BookFileError(f"address book {path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # never more than the limit, whatever the file claims
    except OSError as e:
        raise BookFileError(f"address book {path}: cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise BookFileError(f"address book {path}: over {limit} bytes (MAX_BOOK_FILE_BYTES); refused unread")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BookFileError(f"address book {path}: not JSON ({type(e).__name__}: {e})") from None
    return _checked(path, document, capacity)


def _checked(path: str, document, capacity: int) -> SavedBook:
    where = f"address book {path}"
    if not isinstance(document, dict) or set(document) - {"anchors"} != {"version", "key", "entries"}:
        raise BookFileError(f"{where}: not a book file (an object of version, key, entries and anchors)")
    version = document["version"]
    if isinstance(version, bool) or version not in (1, VERSION) or ("anchors" in document) != (version == VERSION):
        raise BookFileError(
            f"{where}: version {version!r} {'with' if 'anchors' in document else 'without'} anchors; "
            f"this node reads version 1 (no anchors) and {VERSION} (anchors)"
        )
    key_text = document["key"]
    if not isinstance(key_text, str) or not re.fullmatch(r"(?:[0-9a-f]{2}){16,64}", key_text):
        raise BookFileError(f"{where}: key must be 16 to 64 bytes in lowercase hex")
    entries = document["entries"]
    if not isinstance(entries, list):
        raise BookFileError(f"{where}: entries must be a list")
    if len(entries) > capacity:
        raise BookFileError(f"{where}: {len(entries)} entries; the book holds at most {capacity}")
    checked = []
    for index, entry in enumerate(entries):
        try:
            checked.append(_entry(entry))
        except ValueError as e:
            raise BookFileError(f"{where}: entry {index}: {e}") from None
    anchors = document.get("anchors", [])
    if not isinstance(anchors, list) or len(anchors) > MAX_SAVED_ANCHORS:
        raise BookFileError(f"{where}: anchors must be a list of at most {MAX_SAVED_ANCHORS} node ids")
    known = {e.address.node_id for e in checked}
    for anchor in anchors:
        if not isinstance(anchor, str) or anchor not in known:
            raise BookFileError(f"{where}: anchor {anchor!r:.80} is not the node id of an entry")
    if len(set(anchors)) != len(anchors):
        raise BookFileError(f"{where}: anchors name a node twice")
    return SavedBook(bytes.fromhex(key_text), tuple(checked), tuple(anchors))


def _entry(entry) -> SavedEntry:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise ValueError(f"must be an object of exactly {', '.join(sorted(_ENTRY_KEYS))}")
    text = entry["address"]
    if not isinstance(text, str) or len(text) > 600:
        raise ValueError(f"address {text!r:.80} must be ID@HOST:PORT text")
    address = parse_address(text)  # ValueError names what is wrong
    if address.node_id is None:
        raise ValueError(f"address {text} has no node id")
    source = entry["source"]
    if not isinstance(source, str) or not _NODE_ID.fullmatch(source):
        raise ValueError(f"source {source!r:.80} must be a node id (40 lowercase hex digits)")
    group = entry["source_group"]
    if not isinstance(group, str) or not 0 < len(group) <= 300:
        raise ValueError(f"source_group {group!r:.80} must be a network group (text of 1 to 300 characters)")
    for name in ("tried", "did_connect"):
        if not isinstance(entry[name], bool):
            raise ValueError(f"{name} {entry[name]!r:.80} must be true or false")
    failures = entry["failures"]
    if isinstance(failures, bool) or not isinstance(failures, int) or not 0 <= failures <= MAX_SAVED_FAILURES:
        raise ValueError(f"failures {failures!r:.80} must be an integer from 0 to {MAX_SAVED_FAILURES}")
    added, last_success = entry["added"], entry["last_success"]
    if not _time(added):
        raise ValueError(f"added {added!r:.80} must be a finite number")
    if last_success is not None and not _time(last_success):
        raise ValueError(f"last_success {last_success!r:.80} must be a finite number or null")
    return SavedEntry(
        address=address,
        source=source,
        source_group=group,
        added=float(added),
        tried=entry["tried"],
        did_connect=entry["did_connect"],
        failures=failures,
        last_success=None if last_success is None else float(last_success),
    )


def _time(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
