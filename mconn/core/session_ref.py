"""A session's public name: what telemetry shows instead of its id (specs/telemetry.md section 2.2).

In plaintext mode a session id is the resume secret (specs/resume.md section 1.1):
whoever presents it with the peer's node id resumes the session and receives the
messages queued for it. Telemetry files, twistd's log and whatever else observes mconn's
events are read by people and programs that must not be able to do that, so every
event names a session by its *reference* instead: the first 16 bytes of SHA-256 over
``LABEL`` and the 16-byte id, as 32 lowercase hex characters.

No key: both ends of a link compute the same reference from the same id, so the
pipeline still joins the two ends of a session (specs/pipeline.md section 3). The hash
is one-way and the id is 128 random bits, so a reference gives back neither the id nor
a way to guess it. Stdlib only, so that the sans-I/O core may name sessions this way too.
"""

from __future__ import annotations

import hashlib

#: Prefixed to the id before hashing: a reference is never the hash of the id alone,
#: which another program might compute for another purpose.
LABEL = b"mconn session reference\x00"


def session_ref(session_id: bytes) -> str:
    """The reference of the session ``session_id`` (32 lowercase hex characters)."""
    return hashlib.sha256(LABEL + session_id).hexdigest()[:32]


def session_ref_of_hex(text: str) -> str:
    """The reference of the session whose id is the hex ``text``; text that is not hex
    (no session id mconn makes) is hashed as its UTF-8 bytes, so it is never shown either."""
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        raw = str(text).encode("utf-8", "surrogatepass")
    return session_ref(raw)
