"""The telemetry schema, declared once (specs/telemetry.md section 4), and its Spark form.

``EVENTS`` copies the field tables of specs/telemetry.md: event name -> {field: type},
with the spec's own type names; ``ITEMS`` holds the item fields of the object lists.
tests/pipeline/test_schema.py parses the spec and checks that both agree with it, so
the pipeline cannot drift from the events mconn writes (no schema inference, ever).

Reading happens in two steps (specs/pipeline.md section 2). Every scalar field of every
event goes into one flat ``RECORD`` struct; a name means the same type in every event
that has it. List fields differ between events (``channels`` is a list of ints in
``handshake_done`` and a list of objects in ``connection_lost`` and ``session_ended``),
so the first step keeps each list as its raw JSON text and the second parses it with the
item schema of its own event into the column named in ``LIST_COLUMNS``.
"""

from __future__ import annotations

from pyspark.sql import types as T

_ID = {"event": "str", "node_id": "str"}

#: event -> {field: spec type}, in the order of specs/telemetry.md section 4.
EVENTS: dict[str, dict[str, str]] = {
    "node_started": {
        **_ID,
        "run_id": "str",
        "pid": "int",
        "process_started": "float",
        "moniker": "str or null",
        "network": "str or null",
    },
    "listening": {**_ID, "address": "str"},
    "connection_made": {**_ID, "direction": "str", "remote_address": "str", "transport": "str"},
    "handshake_done": {
        **_ID,
        "peer_id": "str",
        "remote_address": "str",
        "direction": "str",
        "max_packet_payload": "int",
        "channels": "list of int",
        "listen_address": "str",
    },
    "peer_rejected": {**_ID, "peer_id": "str or null", "remote_address": "str", "reason": "str", "message": "str"},
    "connection_refused": {**_ID, "remote_address": "str", "reason": "str", "message": "str"},
    "protocol_error": {
        **_ID,
        "peer_id": "str or null",
        "remote_address": "str",
        "error_type": "str",
        "error": "str",
    },
    "link_failed": {
        **_ID,
        "peer_id": "str or null",
        "remote_address": "str",
        "error_type": "str",
        "error": "str",
    },
    "connection_lost": {
        **_ID,
        "peer_id": "str or null",
        "remote_address": "str",
        "direction": "str",
        "reason_type": "str",
        "reason": "str",
        "reason_kind": "str",
        "duration": "float",
        "bytes_sent": "int",
        "bytes_received": "int",
        "channels": "list of object",
        "session_id": "str or null",
    },
    "session_started": {
        **_ID,
        "peer_id": "str",
        "session_id": "str",
        "remote_address": "str",
        "direction": "str",
        "resume_refused": "str",
    },
    "session_suspended": {
        **_ID,
        "peer_id": "str",
        "session_id": "str",
        "reason_type": "str",
        "reason": "str",
        "grace": "float",
    },
    "session_resumed": {
        **_ID,
        "peer_id": "str",
        "session_id": "str",
        "remote_address": "str",
        "resent": "int",
        "resumes": "int",
    },
    "session_ended": {
        **_ID,
        "peer_id": "str",
        "session_id": "str",
        "reason_type": "str",
        "reason": "str",
        "reason_kind": "str",
        "resumes": "int",
        "undelivered": "list of object",
        "channels": "list of object",
    },
    "dial_attempt": {
        **_ID,
        "peer_id": "str or null",
        "address": "str",
        "attempt": "int",
        "delay": "float",
        "result": "str",
        "error": "str or null",
    },
    "dial_gave_up": {**_ID, "peer_id": "str or null", "reason": "str"},
    "duplicate_connection": {
        **_ID,
        "peer_id": "str",
        "remote_address": "str",
        "existing_address": "str",
        "outcome": "str",
    },
    "loop_stalled": {**_ID, "peer_id": "str or null", "late": "float"},
    "channel_stats": {
        **_ID,
        "peer_id": "str",
        "channel_id": "int",
        "channel_name": "str",
        "priority": "int",
        "queue_depth": "int",
        "bytes_sent": "int",
        "messages_sent": "int",
        "bytes_received": "int",
        "messages_received": "int",
        "accepted": "int",
        "acked": "int",
        "delivered": "int",
        "session_id": "str",
        "connection": "int",
        "round_trip": "float or null",
    },
    "reactor_error": {**_ID, "reactor": "str", "method": "str", "peer_id": "str or null", "action": "str"},
}

#: The events the spec logs above ``info``: the ``errors`` table holds them all.
WARNINGS: dict[str, str] = {
    "peer_rejected": "warn",
    "connection_refused": "warn",
    "protocol_error": "warn",
    "dial_gave_up": "warn",
    "loop_stalled": "warn",
    "reactor_error": "critical",
}

#: (event, list field) -> {item field: spec type}, for the lists of objects.
ITEMS: dict[tuple[str, str], dict[str, str]] = {
    ("connection_lost", "channels"): {
        "channel_id": "int",
        "bytes_sent": "int",
        "messages_sent": "int",
        "bytes_received": "int",
        "messages_received": "int",
    },
    ("session_ended", "undelivered"): {"channel_id": "int", "count": "int"},
    ("session_ended", "channels"): {"channel_id": "int", "accepted": "int", "acked": "int", "delivered": "int"},
}

#: (event, list field) -> the column that holds it, parsed, in the events table.
LIST_COLUMNS: dict[tuple[str, str], str] = {
    ("handshake_done", "channels"): "announced_channels",
    ("connection_lost", "channels"): "connection_channels",
    ("session_ended", "undelivered"): "undelivered",
    ("session_ended", "channels"): "session_channels",
}

#: When the event was logged: Twisted's own key in version 1 records, kept by name in
#: version 2 (specs/telemetry.md section 2).
LOG_TIME = "log_time"
#: The record's version (specs/telemetry.md section 2): absent in version 1 records.
VERSION = "v"

#: Fields without which a record cannot be placed: missing or mistyped, it is malformed.
REQUIRED = ("event", "node_id", LOG_TIME)

_SCALARS = {
    "str": T.StringType(),
    "str or null": T.StringType(),
    "int": T.LongType(),
    "float": T.DoubleType(),
    "float or null": T.DoubleType(),
}
_LISTS = ("list of int", "list of object")


def scalar_fields() -> dict[str, T.DataType]:
    """Every scalar field name of every event -> its Spark type (one type per name)."""
    fields: dict[str, T.DataType] = {}
    for event, table in EVENTS.items():
        for name, type_name in table.items():
            if type_name in _LISTS:
                continue
            spark_type = _SCALARS[type_name]
            if fields.setdefault(name, spark_type) != spark_type:
                raise ValueError(f"field {name!r} of {event} has type {type_name}, another event gives it another")
    return fields


def list_fields() -> set[str]:
    """Names of the list fields of any event (kept as raw JSON text by the first step)."""
    return {name for table in EVENTS.values() for name, type_name in table.items() if type_name in _LISTS}


#: Name of the column where Spark keeps a record whose JSON types contradict ``RECORD``.
CORRUPT = "_corrupt"


def record_schema() -> T.StructType:
    """The first step's schema: all scalar fields, the raw list fields, log_time, the
    version, CORRUPT."""
    fields = [T.StructField(name, spark_type) for name, spark_type in scalar_fields().items()]
    fields += [T.StructField(name, T.StringType()) for name in sorted(list_fields())]
    fields.append(T.StructField(LOG_TIME, T.DoubleType()))
    fields.append(T.StructField(VERSION, T.LongType()))
    fields.append(T.StructField(CORRUPT, T.StringType()))
    return T.StructType(fields)


def list_type(event: str, field: str) -> T.ArrayType:
    """The Spark type of one event's list field."""
    if EVENTS[event][field] == "list of int":
        return T.ArrayType(T.LongType())
    items = ITEMS[(event, field)]
    return T.ArrayType(T.StructType([T.StructField(n, _SCALARS[t]) for n, t in items.items()]))


def list_schema(event: str, field: str) -> T.StructType:
    """The second step's schema of one event's list field, wrapped in an object
    (``{"items": LIST}``) with CORRUPT, where Spark's reader keeps the text when a value
    inside the list has the wrong JSON type."""
    return T.StructType([T.StructField("items", list_type(event, field)), T.StructField(CORRUPT, T.StringType())])
