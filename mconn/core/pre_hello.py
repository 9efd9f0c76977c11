"""The pre-hello: the 8 bytes an upgrading dialer sends in clear before TLS (specs/tls.md section 7).

A dialer that starts in plaintext and upgrades (``TLSOptions(upgrade=True)``) sends them
first; its TLS ClientHello follows at once. A listener tells the three starts of a
connection apart by the first byte (``16`` TLS first, ``00`` this pre-hello, anything
else a plaintext mconn hello) and checks the pre-hello whole with ``decode_pre_hello``
(mconn/net/tls_transport.py). ``PreHello`` declares it; the golden vectors are
specs/vectors/tls.json.
"""

from __future__ import annotations

from construct import Const, ConstructError, Int8ub, OneOf, Struct, Terminated

from mconn.errors import MalformedPacket

# Pre-hello (specs/tls.md section 7): 8 bytes a dialer sends in clear, before anything
# else, when it starts in plaintext and upgrades; its TLS ClientHello follows at once.
#   00 | "MCONN" (4D 43 4F 4E 4E) | version (1) = 01 | next (1) = 01: TLS follows
# 00 is neither an mconn packet type nor a TLS record type (14..18), so a listener tells
# the starts apart by the first byte: 16 TLS first, 00 pre-hello, anything else plaintext.
PRE_HELLO_VERSION = 1
PRE_HELLO_NEXT_TLS = 1
PreHello = Struct(
    "marker" / Const(b"\x00MCONN"),
    "version" / OneOf(Int8ub, [PRE_HELLO_VERSION]),
    "next" / OneOf(Int8ub, [PRE_HELLO_NEXT_TLS]),
    Terminated,
)
PRE_HELLO_SIZE = 8


def encode_pre_hello() -> bytes:
    """The pre-hello (its only form: version 1, TLS follows)."""
    built: bytes = PreHello.build(dict(version=PRE_HELLO_VERSION, next=PRE_HELLO_NEXT_TLS))
    return built


def decode_pre_hello(data: bytes) -> None:
    """Check a pre-hello; MalformedPacket naming the bytes if ``data`` is not one."""
    try:
        PreHello.parse(data)
    except (ConstructError, IndexError, ValueError) as e:
        raise MalformedPacket(
            f"malformed pre-hello {data.hex(' ')}: expected {encode_pre_hello().hex(' ')} ({' '.join(str(e).split())})"
        ) from None
