"""Reading telemetry files into the typed ``events`` table (specs/pipeline.md section 2).

Theory of operation. Files hold version 2 records (specs/telemetry.md section 2: JSON
Lines, one lean object a line, what mconn writes now) or version 1 records (Twisted's
``jsonFileLogObserver``: each an ASCII record separator ``\\x1e``, a JSON object, a
newline), or both: a node upgraded in place appends version 2 lines to its old file.

One scan reads the lines of them all (Spark's text source). The fast path (``classify``)
takes a line that starts ``{"v":2,"event":"`` (how mconn writes a version 2 record: ``v``
and ``event`` first) and parses it once, with the general path's schema; a clean record of
an event without lists (no value of the wrong type, ``v`` 2, its event the one the prefix
names, ``node_id`` and ``log_time`` present) is final there: the general path would give it
no reject reason and the same columns. Every other line goes, whole, to a ``_recheck``
partition of the events table in the same scan; the general path reads those back
(``records`` then ``parse``), appends their rows and removes the partition. So only the
few other lines pay for the general path's checks and list parsing (what that saves:
bench/PIPELINE_RESULTS.md).

The general path parses each record with an explicit schema (``schema.record_schema()``:
every scalar field, list fields kept as their JSON text, never inferred) into typed
columns. A version 1 line starts with ``\\x1e``; only those lines are split on ``\\x1e`` (as
Twisted's reader splits the file) and each piece parsed. So a record cut short by a killed
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

import dataclasses

from pyspark.sql import Column, DataFrame, Observation, functions as F
from pyspark.sql.types import StringType, StructField, StructType

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
_LINE = "line"
_LINE_ID = "_line_id"
#: What Jackson takes as whitespace: a line of only these holds no record.
_BLANKS = " \t\r\n"
#: ``seq`` is a line's id shifted left by this many bits, plus the record's place on it.
SEQ_BITS = 6
#: How a version 2 record as mconn writes it starts (specs/telemetry.md section 2: ``v``,
#: then ``event``, first).
FAST_PREFIX = '{"v":2,"event":"'
#: The events the fast path reads: those without a list field (their lists need the
#: general path's checks).
FAST_EVENTS = tuple(e for e in schema.EVENTS if not any(e == event for event, _ in schema.LIST_COLUMNS))
#: The partition where the fast path leaves the lines it does not read, for the general
#: path; it is gone from a written events table.
RECHECK = "_recheck"


def read_lines(spark, inputs: list[str]) -> DataFrame:
    """One row per line of the input files (Spark's text source, which splits lines as its
    JSON source does): ``line``, ``source_file``, ``line_id`` (increases along each file)."""
    return (
        spark.read.option("recursiveFileLookup", "true")
        .text(list(inputs))
        .select(
            F.col("value").alias(_LINE),
            F.col("_metadata.file_path").alias("source_file"),
            F.monotonically_increasing_id().alias(_LINE_ID),
        )
    )


def read_records(spark, inputs: list[str]) -> DataFrame:
    """One row per record of the input files, every line by the general path
    (``records``); what ``parse`` takes."""
    return records(read_lines(spark, inputs))


def records(lines: DataFrame) -> DataFrame:
    """The general path: one row per record of ``lines`` (``line``, ``source_file``,
    ``line_id``): ``r`` (the record parsed with ``schema.record_schema()``), ``record``
    (its text, for a version 1 record or a corrupt one; null for a well-formed version 2
    record), ``source_file``, ``seq``.

    A line of blanks holds no record (Spark's JSON source skips it too). ``seq`` increases
    along each file; it breaks ties between equal ``log_time`` values.
    """
    line = F.col(_LINE)
    legacy = F.startswith(line, F.lit(RECORD_SEPARATOR))
    lines = lines.where(legacy | (F.octet_length(F.btrim(line, F.lit(_BLANKS))) > 0))
    pieces = F.when(legacy, F.split(line, RECORD_SEPARATOR)).otherwise(F.array(line))
    rows = lines.select(
        F.col("source_file"), F.col(_LINE_ID), legacy.alias("_legacy"), F.posexplode(pieces).alias("_pos", _PIECE)
    )
    # Bytes, not characters: counting characters would scan every record.
    rows = rows.where(F.octet_length(_PIECE) > 0)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    rows = rows.select("*", F.from_json(F.col(_PIECE), schema.record_schema(), options).alias("r"))
    return rows.select(
        "r",
        F.when(F.col("_legacy"), F.col(_PIECE)).otherwise(F.col("r." + schema.CORRUPT)).alias("record"),
        "source_file",
        _seq(F.col(_LINE_ID), F.col("_pos")).alias("seq"),
    )


def _seq(line_id: Column, position: Column) -> Column:
    """A record's ``seq``: its line's id, then its place on the line (version 1 lines can
    hold more than one record; past ``2**SEQ_BITS - 1`` records on one line they tie)."""
    return line_id * (1 << SEQ_BITS) + F.least(position, F.lit((1 << SEQ_BITS) - 1))


def classify(lines: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """The fast path (specs/pipeline.md section 2.2): the rows of the events table for the
    lines that it reads, and one ``RECHECK`` row (the line in ``record``) for each other line.

    A line that starts with ``FAST_PREFIX`` is parsed with the same schema as the general
    path; it is final here when it is clean: no value of the wrong JSON type, ``v`` 2, an
    ``event`` of ``FAST_EVENTS`` equal to the one its prefix names, ``node_id`` and
    ``log_time`` present. Such a record has no reject reason in the general path either,
    so its row is the general path's row. Every other line (version 1, keys in another
    order, a list event, anything malformed) is left to the general path.
    """
    line = F.col(_LINE)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    parsed = F.when(F.startswith(line, F.lit(FAST_PREFIX)), F.from_json(line, schema.record_schema(), options))
    rows = lines.select(_LINE, "source_file", _LINE_ID, parsed.alias("r"))
    event = F.col("r.event")
    clean = (
        F.col("r." + schema.CORRUPT).isNull()
        & (F.col("r." + schema.VERSION) == 2)
        & event.isin(list(FAST_EVENTS))
        & F.col("r.node_id").isNotNull()
        & F.col("r." + schema.LOG_TIME).isNotNull()
        & F.startswith(line, F.concat(F.lit(FAST_PREFIX), event, F.lit('",')))
    )
    rows = rows.select("*", F.coalesce(clean, F.lit(False)).alias("_clean"))
    time = F.col("r." + schema.LOG_TIME)
    if since is not None:
        rows = rows.where(~F.col("_clean") | (time >= since))
    if until is not None:
        rows = rows.where(~F.col("_clean") | (time < until))
    fast = F.col("_clean")
    scalars = [c for c in schema.scalar_fields() if c != "event"]
    return rows.select(
        F.when(fast, event).otherwise(F.lit(RECHECK)).alias("event"),
        F.lit(None).cast("string").alias("unknown_event"),
        F.when(fast, time).alias("log_time"),
        _seq(F.col(_LINE_ID), F.lit(0)).alias("seq"),
        F.when(fast, F.lit(2)).cast("long").alias("version"),
        *[F.when(fast, F.col("r." + c)).alias(c) for c in scalars],
        *[F.lit(None).cast(schema.list_type(e, f)).alias(c) for (e, f), c in schema.LIST_COLUMNS.items()],
        F.lit(None).cast("string").alias("reject_reason"),
        F.lit(None).cast("boolean").alias("session_id_logged"),
        F.when(~fast, F.col("source_file")).alias("source_file"),
        F.when(~fast, line).alias("record"),
    )


def rechecked(spark, path: str, written: StructType | None = None) -> DataFrame:
    """The ``RECHECK`` rows written by ``classify`` under ``path``, back as ``read_lines``
    rows for the general path. ``written``: the schema ``classify`` wrote (no Spark job
    reads a footer for it); None: read from the files."""
    reader = spark.read if written is None else spark.read.schema(written)
    left = reader.parquet(path)
    return left.select(
        F.col("record").alias(_LINE), "source_file", F.shiftrightunsigned("seq", SEQ_BITS).alias(_LINE_ID)
    )


def parse(records: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """Typed events (one column per field of any event), classified; see the module doc."""
    scalars = [c for c in schema.scalar_fields() if c != "event"]
    events = records.select(
        "record",
        "source_file",
        "seq",
        "r.event",
        *[F.col("r." + c).alias(c) for c in scalars],
        *[F.col("r." + name).alias("_raw_" + name) for name in sorted(schema.list_fields())],
        F.col("r." + schema.LOG_TIME).alias("log_time"),
        F.col("r." + schema.CORRUPT).alias(schema.CORRUPT),
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
    """The text of a version 2 record rejected only for a list field (the parser keeps a
    record's text only when it is corrupt): the fields it read, written back as JSON (the lists as
    they were, ``level`` and any field the spec does not list left out)."""
    fields: list[Column | str] = [F.col("_v").alias(schema.VERSION), "event", "node_id", "log_time"]
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


@dataclasses.dataclass
class Written:
    """What ``write_events`` wrote: the table's ``schema`` as ``load_events`` reads it (the
    partition column ``event`` last), and ``channel_ids``, every ``channel_id`` of its
    ``channel_stats`` rows (None included when a row has none), observed while writing;
    None when one is outside ``OBSERVED_CHANNELS`` (not known: the channels stage then
    finds each channel's previous sample by a sort of its own)."""

    schema: StructType
    channel_ids: list | None


#: The channel ids the read stage observes: mconn's are one byte (specs/wire.md section 2.3).
OBSERVED_CHANNELS = range(256)
#: Bits of one mask of observed channel ids (a long).
_MASK_BITS = 64


def _observed(rows: DataFrame, name: str) -> tuple[DataFrame, Observation]:
    """``rows`` with an observation of their channel_stats rows' channel ids: one bit per
    id in four long masks (``bit_or``: a fixed-size aggregate, where a set of ids cost a
    set update per row), whether one had no id, and whether one was outside
    ``OBSERVED_CHANNELS``."""
    observation = Observation(name)
    stats = F.col("event") == "channel_stats"
    channel = F.col("channel_id")
    masks = [
        F.bit_or(
            F.when(
                stats & (F.shiftright(channel, 6) == low // _MASK_BITS),
                # A column shift (``F.shiftleft`` takes a constant only).
                F.call_function("shiftleft", F.lit(1).cast("long"), channel - low),
            )
        ).alias(f"channels_{low}")
        for low in range(OBSERVED_CHANNELS.start, OBSERVED_CHANNELS.stop, _MASK_BITS)
    ]
    outside = (channel < OBSERVED_CHANNELS.start) | (channel >= OBSERVED_CHANNELS.stop)
    observed = rows.observe(
        observation,
        *masks,
        F.max(stats & channel.isNull()).alias("null_channel"),
        F.max(stats & outside).alias("other_channel"),
    )
    return observed, observation


def _channel_ids(*observations: Observation) -> list | None:
    """The channel ids the observations saw (None last), or None if one was outside
    ``OBSERVED_CHANNELS``."""
    ids: set = set()
    for observation in observations:
        got = observation.get
        if got["other_channel"]:
            return None
        for low in range(OBSERVED_CHANNELS.start, OBSERVED_CHANNELS.stop, _MASK_BITS):
            mask = got[f"channels_{low}"] or 0
            ids.update(low + bit for bit in range(_MASK_BITS) if mask >> bit & 1)
        if got["null_channel"]:
            ids.add(None)
    return sorted(ids, key=lambda c: (c is None, c))


#: Columns of the events table written without Parquet's dictionary encoding: values
#: nearly all distinct (``seq``, times, the channel_stats counters), whose dictionary a
#: writer builds value by value (a hash lookup each) only to find at the row group's end
#: that it does not pay and write them plain anyway. Measured: bench/PIPELINE_RESULTS.md.
PLAIN_COLUMNS = (
    "seq",
    schema.LOG_TIME,
    "bytes_sent",
    "bytes_received",
    "messages_sent",
    "messages_received",
    "accepted",
    "acked",
    "delivered",
)


def _writer(rows: DataFrame, mode: str):
    """The events table's writer for ``rows``: partitioned by event name, ``PLAIN_COLUMNS``
    without dictionary encoding."""
    writer = rows.write.mode(mode).partitionBy("event")
    for column in PLAIN_COLUMNS:
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    return writer


def write_events(
    spark, inputs: list[str], path: str, since: float | None = None, until: float | None = None
) -> Written:
    """Write the events table, one Parquet partition per event name: the fast path's rows
    and the other lines in one scan, then those lines by the general path (appended), then
    their partition removed. Returns its schema, known without reading the table, and the
    channel ids observed on the way (``Written``)."""
    lines = read_lines(spark, inputs)
    rows, fast = _observed(classify(lines, since, until), "fast path")
    _writer(rows, "overwrite").parquet(path)
    data = StructType([f for f in rows.schema.fields if f.name != "event"])
    table = StructType([*data.fields, StructField("event", StringType())])
    left = path.rstrip("/") + "/event=" + RECHECK
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(left)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hadoop_path):
        return Written(table, _channel_ids(fast))
    general, rest = _observed(parse(records(rechecked(spark, left, data)), since, until), "general path")
    _writer(general, "append").parquet(path)
    fs.delete(hadoop_path, True)
    return Written(table, _channel_ids(fast, rest))


def load_events(spark, path: str, table: StructType | None = None) -> DataFrame:
    """The events table under ``path``; ``table``: its schema (``Written.schema``),
    so that no Spark job reads the files' footers for it."""
    return (spark.read if table is None else spark.read.schema(table)).parquet(path)
