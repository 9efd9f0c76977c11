"""Reading telemetry files into the typed ``events`` table (specs/pipeline.md section 2).

Theory of operation. Files hold version 2 records (specs/telemetry.md section 2: JSON
Lines, one lean object a line, what mconn writes now) or version 1 records (Twisted's
``jsonFileLogObserver``: each an ASCII record separator ``\\x1e``, a JSON object, a
newline), or both: a node upgraded in place appends version 2 lines to its old file.

One scan reads them all: Spark's JSON source with an explicit schema
(``schema.record_schema()``: every scalar field, list fields kept as their JSON text, never
inferred) parses each line straight into typed columns. A version 1 line starts with
``\\x1e``, which Jackson does not take as whitespace, so it lands whole in the corrupt-record
column; only those lines are split on ``\\x1e`` (as Twisted's reader splits the file) and
each piece parsed with ``from_json`` and the same schema. So a record cut short by a killed
process spoils neither the record after it on its line (version 1) nor the next line
(version 2: the writer starts a new line after a cut one). Then each list field is parsed
with its own event's item schema, wrapped so that a wrong type inside an item is seen
(Spark's reader would give that item field null). No Python runs per row (the job runs
unchanged on a cluster whose executors know nothing of mconn).

A record is *malformed* when it is not a JSON object, lacks ``event``, ``node_id`` or a
numeric ``log_time``, has a version this reader does not know, or has a field whose JSON
value contradicts the field's type (a number field holding a string, a list field that is
not a list of the spec's items, an item field of the wrong type; Spark's reader takes any
JSON value as the text of a string field). A well-formed record whose ``event`` the spec
does not list is *unknown*. Both are kept in the ``_malformed`` and ``_unknown``
partitions of the events table (a malformed one with its text and file), counted and
reported, never fatal. A field that is absent is null (older nodes); only
``connection_lost.session_id``, where null has a meaning of its own, is told apart
(``session_id_logged``; version 2 records always carry it).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, functions as F

from mconn.pipeline import schema

RECORD_SEPARATOR = "\x1e"
MALFORMED = "_malformed"
UNKNOWN = "_unknown"
#: Longest record text kept for a malformed or unknown record.
KEPT_TEXT = 2000
#: The record versions this reader knows (specs/telemetry.md section 2); version 1
#: records have no ``v`` field.
VERSIONS = (1, 2)
_PIECE = "_piece"


def read_records(spark, inputs: list[str]) -> DataFrame:
    """One row per record of the input files: ``r`` (the record parsed with
    ``schema.record_schema()``), ``record`` (its text, for a version 1 record or a corrupt
    one; null for a well-formed version 2 record), ``source_file``, ``seq``.

    ``seq`` increases along each file; it breaks ties between equal ``log_time`` values.
    """
    record_schema = schema.record_schema()
    lines = (
        spark.read.schema(record_schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", schema.CORRUPT)
        .option("recursiveFileLookup", "true")
        .json(list(inputs))
    )
    corrupt = F.col(schema.CORRUPT)
    legacy = F.startswith(corrupt, F.lit(RECORD_SEPARATOR))
    pieces = F.when(legacy, F.split(corrupt, RECORD_SEPARATOR)).otherwise(F.array(F.lit(None).cast("string")))
    rows = lines.select(
        F.struct(*[F.col(f.name) for f in record_schema.fields]).alias("direct"),
        corrupt.alias("line"),
        F.col("_metadata.file_path").alias("source_file"),
        F.explode(pieces).alias(_PIECE),
    )
    # Bytes, not characters: counting characters would scan every record.
    rows = rows.where(F.col(_PIECE).isNull() | (F.octet_length(_PIECE) > 0))
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    piece = F.col(_PIECE)
    return rows.select(
        F.when(piece.isNull(), F.col("direct")).otherwise(F.from_json(piece, record_schema, options)).alias("r"),
        F.coalesce(piece, F.col("line")).alias("record"),
        "source_file",
        F.monotonically_increasing_id().alias("seq"),
    )


def parse(records: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """Typed events (one column per field of any event), classified; see the module doc."""
    scalars = [c for c in schema.scalar_fields() if c != "event"]
    events = records.select(
        "record", "source_file", "seq", "r.event", *[F.col("r." + c).alias(c) for c in scalars],
        *[F.col("r." + name).alias("_raw_" + name) for name in sorted(schema.list_fields())],
        F.col("r." + schema.LOG_TIME).alias("log_time"), F.col("r." + schema.CORRUPT).alias(schema.CORRUPT),
        F.col("r." + schema.VERSION).alias("_v"),
    )
    for (event, field), column in schema.LIST_COLUMNS.items():
        events = events.withColumn("_list_" + column, _parse_list(event, field))
    events = events.withColumn("reject_reason", _reject_reason())
    if since is not None:
        events = events.where(F.col("reject_reason").isNotNull() | (F.col("log_time") >= since))
    if until is not None:
        events = events.where(F.col("reject_reason").isNotNull() | (F.col("log_time") < until))
    known = F.col("event").isin(list(schema.EVENTS))
    kind = F.when(F.col("reject_reason").isNotNull(), F.lit(MALFORMED)).when(~known, F.lit(UNKNOWN))
    malformed = F.col("reject_reason").isNotNull()
    return events.select(
        F.coalesce(kind, F.col("event")).alias("event"),
        F.when(~known, F.col("event")).alias("unknown_event"),
        "log_time",
        "seq",
        F.coalesce(F.col("_v"), F.lit(1)).alias("version"),
        *scalars,
        *[F.col("_list_" + column + ".items").alias(column) for column in schema.LIST_COLUMNS.values()],
        "reject_reason",
        _session_id_logged().alias("session_id_logged"),
        F.when(malformed, F.col("source_file")).alias("source_file"),
        F.when(malformed, F.substring(F.trim(F.coalesce("record", _as_read(scalars))), 1, KEPT_TEXT)).alias("record"),
    )


def _as_read(scalars: list[str]) -> Column:
    """The text of a version 2 record that the JSON source read without keeping its line
    (one rejected for a list field): the fields it read, written back as JSON (the lists as
    they were, ``level`` and any field the spec does not list left out)."""
    fields = [F.col("_v").alias(schema.VERSION), "event", "node_id", "log_time"]
    fields += [F.col(c) for c in scalars if c != "node_id"]
    fields += [F.try_parse_json("_raw_" + name).alias(name) for name in sorted(schema.list_fields())]
    return F.to_json(F.struct(*fields))


def _session_id_logged() -> Column:
    """For ``connection_lost``: whether the record has ``session_id`` at all. Null there
    means the connection carried no session; absent, an older node that did not say.
    Version 2 records always carry it (specs/telemetry.md section 2)."""
    has = F.array_contains(F.json_object_keys(F.col("record")), "session_id")
    said = F.when(F.col("_v") == 2, F.lit(True)).otherwise(F.coalesce(has, F.lit(False)))
    return F.when(F.col("event") == "connection_lost", said)


def _parse_list(event: str, field: str) -> Column:
    """The event's list field parsed with its item schema, as a struct: ``items`` (the
    list) and ``_corrupt`` (set when a value inside it has the wrong JSON type); null for
    other events. The list is wrapped in an object so that Spark's reader reports a wrong
    type inside an item instead of making that item field null."""
    wrapped = F.concat(F.lit('{"items":'), F.col("_raw_" + field), F.lit("}"))
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    return F.when(F.col("event") == event, F.from_json(wrapped, schema.list_schema(event, field), options))


def _list_reason(event: str, field: str) -> Column:
    """Why the raw list is not a list of the spec's items, or null."""
    raw, parsed = F.col("_raw_" + field), F.col("_list_" + schema.LIST_COLUMNS[(event, field)])
    items = parsed["items"]
    if schema.EVENTS[event][field] == "list of int":
        bad_item = F.exists(items, lambda item: item.isNull())
    else:
        bad_item = F.exists(items, lambda item: item.isNull() | item["channel_id"].isNull())
    not_a_list = items.isNull() | ~F.startswith(raw, F.lit("[")) | bad_item
    type_name = schema.EVENTS[event][field]
    return (
        F.when(raw.isNull(), None)
        .when(not_a_list, F.lit(f"{field}: not a {type_name}"))
        .when(parsed[schema.CORRUPT].isNotNull(), F.lit(f"{field}[]: an item field of the wrong JSON type"))
    )


def _reject_reason() -> Column:
    """Why a record is malformed, or null."""
    required = [F.col(name).isNull() for name in schema.REQUIRED]
    missing = required[0] | required[1] | required[2]
    corrupt = F.col(schema.CORRUPT).isNotNull()
    version = F.col("_v")
    reason = (
        F.when(corrupt & F.json_object_keys(F.col("record")).isNull(), F.lit("not a JSON object"))
        .when(missing, F.lit("no event, node_id or numeric log_time"))
        # Spark keeps the record in _corrupt when a value contradicts its field's type.
        .when(corrupt, F.lit("a field of the wrong JSON type"))
        .when(
            version.isNotNull() & ~version.isin(*VERSIONS[1:]),
            F.format_string("record version %d: this reader knows 1 (no v) and 2", version),
        )
    )
    lists: dict[str, list[Column]] = {}
    for event, field in schema.LIST_COLUMNS:
        lists.setdefault(event, []).append(_list_reason(event, field))
    for event, reasons in lists.items():  # last: the first bad list of the event, or null
        reason = reason.when(F.col("event") == event, F.coalesce(*reasons))
    return reason


def write_events(events: DataFrame, path: str) -> None:
    """Write the events table, one Parquet partition per event name."""
    events.write.mode("overwrite").partitionBy("event").parquet(path)


def load_events(spark, path: str) -> DataFrame:
    return spark.read.parquet(path)
