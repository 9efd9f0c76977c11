"""How the report and the console name nodes and channels (specs/pipeline.md section 7).

Nodes log their moniker in ``node_started`` (specs/telemetry.md); ``channel_stats`` logs
each channel's name. A node is shown as its logs and status page show it,
``moniker (abcd1234)`` (the moniker, then the first 8 hex digits of its id, as
``mconn.core.node_info.display_name``); a node that logged no moniker (no node info, or
an older node whose ``node_started`` has no such field, or no ``node_started`` at all) by
the 8 digits alone in the report, by its whole id in the console. A channel is shown as
``0x20 votes``, or ``0x20`` when no ``channel_stats`` gave it a name.

The names come with the report's one query (``parts``: one map of node id to moniker,
one of channel id to name) and are applied in Python to the few rows the report and
the console show. The console imports this module for ``node`` and ``channel`` before
Spark is needed, so Spark is imported by the functions that build frames.
"""

from __future__ import annotations

import typing

if typing.TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Hex digits of a node id shown after its moniker, or alone (``display_name``'s).
SHORT_ID_DIGITS = 8
#: Characters of a moniker a chart's label keeps (a moniker may be 64 bytes long; two of
#: them in one label would squeeze the chart's bars).
CHART_MONIKER = 20


def node_names(events: DataFrame) -> DataFrame:
    """One row per node that has a name: ``node_id``, ``moniker``, from its latest
    ``node_started`` (a node restarted under a new moniker is shown by the new one; one
    whose latest start logged none has no name)."""
    from pyspark.sql import functions as F

    from mconn.pipeline.sessions import of

    started = of(events, "node_started")
    latest = started.groupBy("node_id").agg(F.max_by(F.col("moniker"), F.struct("log_time", "seq")).alias("moniker"))
    return latest.where(F.col("moniker").isNotNull() & (F.col("moniker") != ""))


def channel_names(events: DataFrame) -> DataFrame:
    """One row per channel id that has a name: ``channel_id``, ``channel_name``, the latest
    non-empty ``channel_stats.channel_name`` of the id."""
    from pyspark.sql import functions as F

    from mconn.pipeline.sessions import of

    named = of(events, "channel_stats").where(F.col("channel_name").isNotNull() & (F.col("channel_name") != ""))
    return named.groupBy("channel_id").agg(
        F.max_by(F.col("channel_name"), F.struct("log_time", "seq")).alias("channel_name")
    )


def parts(events: DataFrame) -> list[DataFrame]:
    """One-row frames for the report's query: ``node_names`` (node id -> moniker) and
    ``channel_names`` (channel id -> name), as maps (empty when no one logged any)."""
    from pyspark.sql import functions as F

    nodes = node_names(events).agg(
        F.map_from_entries(F.collect_list(F.struct("node_id", "moniker"))).alias("node_names")
    )
    channels = channel_names(events).agg(
        F.map_from_entries(F.collect_list(F.struct("channel_id", "channel_name"))).alias("channel_names")
    )
    return [nodes, channels]


def collected(got: dict) -> tuple[dict[str, str], dict[int, str]]:
    """The two maps of ``parts`` from a collected row (empty when it has none)."""
    return dict(got.get("node_names") or {}), dict(got.get("channel_names") or {})


def node(node_id: str | None, names: dict[str, str], whole: bool = False, most: int | None = None) -> str:
    """A node as people read it: ``moniker (abcd1234)``; without a moniker its first 8 hex
    digits, or its whole id when ``whole``; ``-`` for no node. ``most``: the moniker cut
    to that many characters (a chart's label)."""
    if node_id is None:
        return "-"
    moniker = names.get(node_id)
    if not moniker:
        return node_id if whole else node_id[:SHORT_ID_DIGITS]
    if most is not None and len(moniker) > most:
        moniker = moniker[: most - 1] + "\u2026"
    return f"{moniker} ({node_id[:SHORT_ID_DIGITS]})"


def channel(channel_id: int | None, names: dict[int, str]) -> str:
    """A channel as people read it: ``0x20 votes``, or ``0x20`` without a name; ``-`` for none."""
    if channel_id is None:
        return "-"
    name = names.get(channel_id)
    return f"{channel_id:#04x} {name}" if name else f"{channel_id:#04x}"
