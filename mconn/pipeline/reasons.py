"""What kind of failure a logged reason is, for logs that do not say (specs/pipeline.md section 4.6).

Nodes log ``reason_kind`` beside ``reason_type`` (``connection_lost``, ``session_ended``:
``link``, ``misbehaviour`` or ``other``, from ``mconn.errors.error_kind``). Older nodes
logged only the class name; the pipeline classifies it with this table, a copy of the
``kind`` of each class in mconn/errors.py: the pipeline imports nothing of mconn outside
itself (it runs on executors that have only the pipeline), and
tests/pipeline/test_names.py checks the copy against ``mconn.errors.error_kind`` for every
error class. A class name not listed (a Twisted exception, an application's) is ``other``,
as ``error_kind`` says of an exception that is not an MConnError.
"""

from __future__ import annotations

from pyspark.sql import Column, functions as F

LINK, MISBEHAVIOUR, OTHER = "link", "misbehaviour", "other"

#: Class names whose kind is ``link``: nothing arrived in time, or the transport broke.
LINK_TYPES = ("ConnectionLost", "HandshakeTimeout", "PongTimeout", "ProxyError", "TLSError", "WebSocketError")
#: Class names whose kind is ``misbehaviour``: the peer sent what the protocol forbids.
MISBEHAVIOUR_TYPES = (
    "AckError",
    "ControlFlood",
    "DecodeError",
    "HandshakeError",
    "IncompatiblePeer",
    "MalformedPacket",
    "MessageTooLarge",
    "PacketPayloadTooSmall",
    "PacketTooLarge",
    "RecvRateTooSmall",
    "RemoteProtocolError",
    "UnexpectedPacket",
    "UnknownChannel",
    "UnknownPacketType",
)


def kind_of_type(type_name: str | None) -> str:
    """The kind of an error class, by its name (``reason_type``, ``error_type``)."""
    if type_name in LINK_TYPES:
        return LINK
    return MISBEHAVIOUR if type_name in MISBEHAVIOUR_TYPES else OTHER


def kind_column(type_column: Column) -> Column:
    """``kind_of_type`` as a column expression."""
    return (
        F.when(type_column.isin(*LINK_TYPES), F.lit(LINK))
        .when(type_column.isin(*MISBEHAVIOUR_TYPES), F.lit(MISBEHAVIOUR))
        .otherwise(F.lit(OTHER))
    )


def reason_kind() -> Column:
    """A record's ``reason_kind``: as logged, else classified from its ``reason_type``."""
    return F.coalesce(F.col("reason_kind"), kind_column(F.col("reason_type")))
