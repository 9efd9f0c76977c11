"""Peer-controlled text made safe to show in a terminal (specs/chat.md section 5).

A chat name, a line, a file name or a refusal's reason is whatever a peer sent. Written
to a terminal as is, its control characters are commands: ``ESC ] 0 ; ... BEL`` retitles
the window, ``ESC [ 2 J`` clears the screen, ``CR`` or a newline lets a line pose as
another peer's, and prompt_toolkit's ``ANSI()`` even passes ``\\x01...\\x02`` through
raw. :func:`printable` turns every such character into its visible Python escape, so a
peer's text reaches the screen only as printable characters.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories that are commands or invisible structure, not text: controls (C0,
#: DEL, C1), format characters (bidi overrides, zero-width marks), line and paragraph
#: separators, and lone surrogates.
UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: Format characters kept: the zero-width joiner and non-joiner that emoji and some
#: scripts are written with.
KEPT = frozenset({"\u200c", "\u200d"})


def printable(text: str) -> str:
    """``text`` with every control or format character replaced by its escape (``\\x1b``,
    ``\\u202e``); everything else unchanged."""
    return "".join(_escape(c) if c not in KEPT and unicodedata.category(c) in UNPRINTABLE else c for c in text)


#: The escapes Python writes as a letter.
NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(c: str) -> str:
    if c in NAMED:
        return NAMED[c]
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
