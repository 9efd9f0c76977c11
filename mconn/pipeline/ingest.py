"""Reading telemetry files into the typed ``events`` table (specs/pipeline.md section 2).

Theory of operation. ``jsonFileLogObserver`` writes each event as an ASCII record
separator (``\\x1e``), one JSON object and a newline (specs/telemetry.md section 2).
Spark reads the files as text, one row per line, and each line is split on ``\\x1e``
(Twisted's own reader splits the file on it), so a record cut short by a killed process
does not spoil the record appended after it on the same line. Each record is parsed
once with an explicit schema (``schema.record_schema()``: all scalar fields, list fields
kept as JSON text), then each list field is parsed again with its own event's item
schema. No schema is ever inferred; no Python runs per row (the job runs unchanged on a
cluster whose executors know nothing of mconn).

A record is *malformed* when it is not a JSON object, lacks ``event``, ``node_id`` or a
numeric ``log_time``, or has a field whose JSON value contradicts the field's type (a
number field holding a string, a list field that is not a list of the spec's items;
Spark's reader takes any JSON value as the text of a string field). A well-formed record
whose ``event`` the spec does not list is *unknown*. Both are kept in the ``_malformed``
and ``_unknown`` partitions of the events table (a malformed one with its text and file),
counted and reported, never fatal. A field that is absent is null (older nodes); only
``connection_lost.session_id``, where null has a meaning of its own, is told apart
(``session_id_logged``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, functions as F

from mconn.pipeline import schema

RECORD_SEPARATOR = "\x1e"
MALFORMED = "_malformed"
UNKNOWN = "_unknown"
#: Longest record text kept for a malformed or unknown record.
KEPT_TEXT = 2000


def read_records(spark, inputs: list[str]) -> DataFrame:
    """One row per record of the input files: ``record`` (text), ``source_file``, ``seq``.

    Lines are split on the record separator, as Twisted's own reader splits the file;
    a line without one is taken as one record (JSON Lines read as well). ``seq``
    increases along each file; it breaks ties between equal ``log_time`` values.
    """
    lines = spark.read.option("recursiveFileLookup", "true").text(list(inputs))
    records = lines.select(
        F.explode(F.split(F.col("value"), RECORD_SEPARATOR)).alias("record"),
        F.col("_metadata.file_path").alias("source_file"),
    )
    # Bytes, not characters: counting characters would scan every record.
    records = records.where(F.octet_length("record") > 0)
    return records.withColumn("seq", F.monotonically_increasing_id())


def parse(records: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """Typed events (one column per field of any event), classified; see the module doc."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    parsed = records.select(
        "record", "source_file", "seq", F.from_json("record", schema.record_schema(), options).alias("r")
    )
    scalars = [c for c in schema.scalar_fields() if c != "event"]
    events = parsed.select(
        "record", "source_file", "seq", "r.event", *[F.col("r." + c).alias(c) for c in scalars],
        *[F.col("r." + name).alias("_raw_" + name) for name in sorted(schema.list_fields())],
        F.col("r." + schema.LOG_TIME).alias("log_time"), F.col("r." + schema.CORRUPT).alias(schema.CORRUPT),
    )
    for (event, field), column in schema.LIST_COLUMNS.items():
        events = events.withColumn(column, _parse_list(event, field))
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
        *scalars,
        *schema.LIST_COLUMNS.values(),
        "reject_reason",
        _session_id_logged().alias("session_id_logged"),
        F.when(malformed, F.col("source_file")).alias("source_file"),
        F.when(malformed, F.substring(F.trim("record"), 1, KEPT_TEXT)).alias("record"),
    )


def _session_id_logged() -> Column:
    """For ``connection_lost``: whether the record has ``session_id`` at all. Null there
    means the connection carried no session; absent, an older node that did not say."""
    has = F.array_contains(F.json_object_keys(F.col("record")), "session_id")
    return F.when(F.col("event") == "connection_lost", F.coalesce(has, F.lit(False)))


def _parse_list(event: str, field: str) -> Column:
    """The event's list field, parsed with its item schema (null for other events)."""
    return F.when(F.col("event") == event, F.from_json(F.col("_raw_" + field), schema.list_schema(event, field)))


def _list_is_bad(event: str, field: str) -> Column:
    """The raw list is there but is not a list of the spec's items."""
    raw, parsed = F.col("_raw_" + field), F.col(schema.LIST_COLUMNS[(event, field)])
    if schema.EVENTS[event][field] == "list of int":
        bad_item = F.exists(parsed, lambda item: item.isNull())
    else:
        bad_item = F.exists(parsed, lambda item: item.isNull() | item["channel_id"].isNull())
    return raw.isNotNull() & (parsed.isNull() | ~F.startswith(raw, F.lit("[")) | bad_item)


def _reject_reason() -> Column:
    """Why a record is malformed, or null."""
    required = [F.col(name).isNull() for name in schema.REQUIRED]
    missing = required[0] | required[1] | required[2]
    corrupt = F.col("_corrupt").isNotNull()
    reason = (
        F.when(corrupt & F.json_object_keys(F.col("record")).isNull(), F.lit("not a JSON object"))
        .when(missing, F.lit("no event, node_id or numeric log_time"))
        # Spark keeps the record in _corrupt when a value contradicts its field's type.
        .when(corrupt, F.lit("a field of the wrong JSON type"))
    )
    for event, field in schema.LIST_COLUMNS:
        wrong = F.lit(f"{field}: not a {schema.EVENTS[event][field]}")
        reason = reason.when((F.col("event") == event) & _list_is_bad(event, field), wrong)
    return reason


def write_events(events: DataFrame, path: str) -> None:
    """Write the events table, one Parquet partition per event name."""
    events.write.mode("overwrite").partitionBy("event").parquet(path)


def load_events(spark, path: str) -> DataFrame:
    return spark.read.parquet(path)
