"""The HTTP side of a WebSocket upgrade that is not autobahn's: whether a request's head
is well formed before autobahn parses it, which client stands behind a trusted proxy
(X-Forwarded-For), and the answer to a connection refused at accept (specs/websocket.md
sections 4 and 6). Plain functions of bytes and text, used by mconn.net.websocket's
listener carrier and its factory.
"""

from __future__ import annotations

import ipaddress
import re

#: The HTTP status of an upgrade refused by admission: 429 for the per-address limit
#: (this client has too many), 503 for the others (the node is busy).
_REFUSAL_STATUS = {"ip_limit": 429}
#: A header line's name: an RFC 9110 token, then the colon at once.
_HEADER_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:")
#: Any byte that is not printable ASCII, a tab, or part of a CRLF line end.
_NOT_HEAD = re.compile(rb"[^\t\x20-\x7e\r\n]|\r(?!\n)|(?<!\r)\n")


def head_problem(head: bytes) -> str | None:
    """What is wrong with an HTTP upgrade's head (request line and headers, ending in
    CRLF CRLF), or None: every byte printable ASCII or a tab, every line ended by CRLF,
    every header line ``NAME: VALUE`` (no folded line), at most one X-Forwarded-For line.
    A byte that a proxy passes on inside a value must not become a line break here."""
    bad = _NOT_HEAD.search(head)
    if bad is not None:
        byte, at = head[bad.start()], bad.start()
        what = {0x0D: "a CR without LF", 0x0A: "an LF without CR"}.get(byte) or (
            "a non-ASCII byte" if byte >= 0x80 else "a control byte"
        )
        return f"{what} ({byte:#04x}) at offset {at} of the HTTP head; header lines are printable ASCII ending in CRLF"
    forwarded = 0
    for number, line in enumerate(head[:-4].split(b"\r\n")[1:], start=2):
        if _HEADER_NAME.match(line) is None:
            return f"header line {number} is not NAME: VALUE: {line[:60].decode('ascii')!r}"
        forwarded += line[: line.index(b":")].lower() == b"x-forwarded-for"
    if forwarded > 1:
        return f"{forwarded} X-Forwarded-For header lines; a proxy writes one"
    return None


def forwarded_ip(header: str):
    """The last hop of an X-Forwarded-For value (what the proxy in front of us wrote):
    an IP address and nothing else.

    :raises ValueError: naming the value.
    """
    hop = header.rpartition(",")[2].strip()
    try:
        if "%" in hop:
            raise ValueError
        return ipaddress.ip_address(hop)
    except ValueError:
        raise ValueError(f"X-Forwarded-For's last hop {hop[:60]!r} is not an IP address") from None


def is_trusted_proxy(host: str | None, trusted: frozenset) -> bool:
    """Whether ``host`` is one of ``trusted`` (IP addresses in their canonical form)."""
    if not trusted or host is None:
        return False
    return _canonical(host) in trusted


def canonical_addresses(addresses) -> frozenset:
    """IP addresses in their canonical form (``Config.ws_trusted_proxies``); any other
    text as it is."""
    return frozenset(_canonical(text) for text in addresses)


def _canonical(text: str) -> str:
    """``text`` as an IP address in its canonical form, or as it is if it is none."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def refusal_status(reason: str) -> int:
    """The HTTP status of an upgrade that admission refused for ``reason``."""
    return _REFUSAL_STATUS.get(reason, 503)


def http_refusal(refusal) -> bytes:
    """An HTTP answer to a connection that admission refused at accept, before its request."""
    status = refusal_status(refusal.reason)
    text = f"{refusal.reason}: {refusal}".encode("ascii", "replace")
    return b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n" % (status, text)
