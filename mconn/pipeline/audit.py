"""The ``delivery_audit`` table: both ends of every link joined (specs/pipeline.md section 5).

One row per sender, receiver, session and channel. The sender's counters (``accepted``,
``acked``, and the ``undelivered`` count it reported when the session ended) are joined
with the receiver's ``delivered`` for the same session and channel, from the other
node's logs. With both ends final (both logged ``session_ended``)::

    lost       = max(0, accepted - delivered - undelivered)
    duplicated = max(0, delivered - accepted)
    in_doubt   = min(undelivered, max(0, delivered - (accepted - undelivered)))

``in_doubt`` counts messages reported undelivered that the receiver did deliver (its
ack had not arrived when the session ended): not a fault of mconn, but an application
that re-sends what was reported undelivered will see them twice. When an end is not
final its counters are its last ``channel_stats``; only what those prove is counted
(section 5.3 of the spec gives the cases), and ``unsettled`` counts the messages whose
fate the logs do not tell.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import Column, DataFrame, functions as F

#: specs/pipeline.md section 5.4.
VERDICTS = ("lost", "duplicated", "one_sided", "unsettled", "ok")
#: Seconds two ends of one session may disagree on its start before their clocks are
#: called skewed: both log ``session_started`` within a round trip and the time the
#: hello took to handle, far below this on any link worth auditing.
CLOCK_SKEW_BOUND = 2.0
#: Rows or sessions named at most, per finding.
NAMED = 10


def build(counters_df: DataFrame) -> DataFrame:
    keys = ["sender", "receiver", "session_id", "channel_id"]
    sent = counters_df.select(
        F.col("node_id").alias("sender"),
        F.col("peer_id").alias("receiver"),
        "session_id",
        "channel_id",
        "accepted",
        "acked",
        "undelivered",
        F.col("final").alias("sender_final"),
    )
    received = counters_df.select(
        F.col("peer_id").alias("sender"),
        F.col("node_id").alias("receiver"),
        "session_id",
        "channel_id",
        "delivered",
        F.col("final").alias("receiver_final"),
    )
    rows = sent.join(received, keys, "full_outer")
    counts = ("accepted", "acked", "undelivered", "delivered", "sender_final", "receiver_final")
    return rows.select(*keys, *counts, *_findings())


def _findings() -> list[F.Column]:
    accepted, acked, delivered = F.col("accepted"), F.col("acked"), F.col("delivered")
    undelivered = F.col("undelivered")
    both = F.col("sender_final") & F.col("receiver_final")
    zero = F.lit(0).cast("long")
    # Counters from one end only, with something to audit: the other node's logs are missing,
    # or it was killed before it logged counters for the channel (``findings`` tells which).
    one_sided = (accepted.isNull() & (delivered > 0)) | (delivered.isNull() & (accepted > 0))
    one_sided = F.coalesce(one_sided, F.lit(False))
    lost = (
        F.when(one_sided, zero)
        .when(both, F.greatest(accepted - delivered - undelivered, zero))
        # The sender's report is missing: what it saw confirmed and the receiver never
        # delivered (final delivered counts only; a snapshot's may have grown since).
        .when(F.col("receiver_final"), F.greatest(acked - delivered, zero))
        .otherwise(zero)
    )
    duplicated = (
        F.when(one_sided, zero)
        # The receiver's snapshot is a lower bound of its deliveries: still a proof.
        .when(F.col("sender_final"), F.greatest(delivered - accepted, zero))
        .otherwise(zero)
    )
    in_doubt = F.when(both & ~one_sided, F.least(undelivered, F.greatest(delivered - (accepted - undelivered), zero)))
    unsettled = F.when(one_sided | F.col("sender_final"), zero).otherwise(
        F.greatest(accepted - F.greatest(delivered, acked), zero)
    )
    lost, duplicated, in_doubt, unsettled = (F.coalesce(c, zero) for c in (lost, duplicated, in_doubt, unsettled))
    verdict = (
        F.when(lost > 0, F.lit("lost"))
        .when(duplicated > 0, F.lit("duplicated"))
        .when(one_sided, F.lit("one_sided"))
        .when(unsettled > 0, F.lit("unsettled"))
        .otherwise(F.lit("ok"))
    )
    return [
        lost.alias("lost"),
        duplicated.alias("duplicated"),
        in_doubt.alias("in_doubt"),
        unsettled.alias("unsettled"),
        verdict.alias("verdict"),
    ]


@dataclasses.dataclass
class Findings:
    """What the console and the report say beside the summary (specs/pipeline.md section 5.5).

    ``problems``: the audit rows with a lost or duplicated message (at most NAMED; all
    ``problem_rows`` of them counted). ``one_sided_killed``: one-sided rows whose silent
    end is in the logs (its node was killed before it logged counters);
    ``one_sided_missing``: those whose silent end is not (its logs are missing).
    ``skews``: (session_id, node, peer, seconds node's start is after peer's) beyond
    CLOCK_SKEW_BOUND, at most NAMED of ``skewed_sessions``. ``unstarted``: node -> its
    sessions seen without their start (files missing before them, or ``--since``: then
    ``starts_cut`` is True and none is counted, or None when not known). ``node_names``
    and ``channel_names``: what ``names.parts`` collected, empty when not asked for.
    """

    problems: list[dict]
    problem_rows: int
    one_sided_killed: int
    one_sided_missing: int
    skews: list[tuple]
    skewed_sessions: int
    unstarted: dict[str, int]
    starts_cut: bool | None = False
    skew_bound: float = CLOCK_SKEW_BOUND
    #: node id -> moniker, channel id -> name (``names.parts``): how the lines name them.
    node_names: dict[str, str] = dataclasses.field(default_factory=dict)
    channel_names: dict[int, str] = dataclasses.field(default_factory=dict)


def findings(audit_df: DataFrame, links_df: DataFrame, starts_cut: bool | None = False) -> Findings:
    """The findings of a run's ``delivery_audit`` and ``links`` tables. ``starts_cut``:
    ``--since`` was given (True: the sessions seen without their start are not counted),
    or not known (None). One Spark query: ``finding_counts`` and ``finding_parts`` side by
    side (the batch job folds the counts into its summary query instead)."""
    row = finding_counts(audit_df, links_df)
    for part in finding_parts(audit_df, links_df, starts_cut):
        row = row.crossJoin(part)
    collected = row.first()
    assert collected is not None  # aggregates without grouping: exactly one row
    return assemble(collected.asDict(), collected.asDict(), starts_cut)


def top(df: DataFrame, order: list[Column], rows: int, columns: list, name: str) -> DataFrame:
    """One row, one column ``name``: the first ``rows`` rows of ``df`` in ``order`` (columns
    sorted ascending, nulls first: negate a number for a descending order), each a struct
    of ``columns``; ``ranked`` gives them back as a list. Bounded (the top rows are taken
    first), so that many such rows side by side make one query collected at once."""
    keys = [key.alias(f"_k{i}") for i, key in enumerate(order)]
    picked = df.select(*keys, *columns).orderBy(*[f"_k{i}" for i in range(len(keys))]).limit(rows)
    return picked.agg(F.sort_array(F.collect_list(F.struct(*picked.columns))).alias(name))


def ranked(value) -> list:
    """The rows of a ``top`` column, in order."""
    return list(value or [])


def _problem_rows(audit_df: DataFrame) -> DataFrame:
    return audit_df.where((F.col("lost") > 0) | (F.col("duplicated") > 0))


def finding_counts(audit_df: DataFrame, links_df: DataFrame) -> DataFrame:
    """One row: ``problem_rows``, ``one_sided_killed``, ``one_sided_missing``,
    ``skewed_sessions`` (what ``Findings`` counts)."""
    problems = _problem_rows(audit_df).agg(F.count(F.lit(1)).alias("problem_rows"))
    skewed = _skewed(links_df).agg(F.count(F.lit(1)).alias("skewed_sessions"))
    return problems.crossJoin(_one_sided_causes(audit_df, links_df)).crossJoin(skewed)


def finding_parts(audit_df: DataFrame, links_df: DataFrame, starts_cut: bool | None = False) -> list[DataFrame]:
    """One-row frames of what ``Findings`` names: ``problems`` (the worst NAMED rows with a
    lost or duplicated message), ``skews`` (the NAMED largest clock skews), ``unstarted``
    (per node, its sessions seen without their start; empty when ``starts_cut``)."""
    problems = top(
        _problem_rows(audit_df),
        [
            -F.col("lost"),
            -F.col("duplicated"),
            F.col("sender"),
            F.col("receiver"),
            F.col("session_id"),
            F.col("channel_id"),
        ],
        NAMED,
        ["sender", "receiver", "session_id", "channel_id", "lost", "duplicated"],
        "problems",
    )
    skewed = _skewed(links_df)
    skews = top(
        skewed,
        [-F.abs("seconds"), F.col("session_id")],
        NAMED,
        ["session_id", "node_id", "peer_id", "seconds"],
        "skews",
    )
    unseen = links_df.where(F.lit(not starts_cut) & ~F.col("start_seen")).groupBy("node_id").count()
    unstarted = unseen.agg(F.map_from_entries(F.collect_list(F.struct("node_id", "count"))).alias("unstarted"))
    return [problems, skews, unstarted]


def assemble(counts: dict, parts: dict, starts_cut: bool | None = False) -> Findings:
    """``Findings`` from a collected ``finding_counts`` row and ``finding_parts`` row (with
    ``names.parts``' maps, if it has them)."""
    problems = [
        {k: r[k] for k in ("sender", "receiver", "session_id", "channel_id", "lost", "duplicated")}
        for r in ranked(parts["problems"])
    ]
    skews = [(r["session_id"], r["node_id"], r["peer_id"], r["seconds"]) for r in ranked(parts["skews"])]
    unstarted = {} if starts_cut else dict(parts["unstarted"] or {})
    return Findings(
        problems,
        counts["problem_rows"],
        counts["one_sided_killed"],
        counts["one_sided_missing"],
        skews,
        counts["skewed_sessions"],
        unstarted,
        starts_cut,
        node_names=dict(parts.get("node_names") or {}),
        channel_names=dict(parts.get("channel_names") or {}),
    )


def _one_sided_causes(audit_df: DataFrame, links_df: DataFrame) -> DataFrame:
    """One row: (silent end in the logs, silent end not in the logs) over the one-sided
    rows, as ``one_sided_killed`` and ``one_sided_missing``."""
    silent = audit_df.where(F.col("verdict") == "one_sided").select(
        F.when(F.col("accepted").isNull(), F.col("sender")).otherwise(F.col("receiver")).alias("node_id"),
        F.when(F.col("accepted").isNull(), F.col("receiver")).otherwise(F.col("sender")).alias("peer_id"),
        "session_id",
    )
    ends = links_df.select("node_id", "peer_id", "session_id", F.lit(True).alias("seen"))
    return silent.join(ends, ["node_id", "peer_id", "session_id"], "left").agg(
        F.count(F.when(F.col("seen"), 1)).alias("one_sided_killed"),
        F.count(F.when(F.col("seen").isNull(), 1)).alias("one_sided_missing"),
    )


def _skewed(links_df: DataFrame) -> DataFrame:
    """Sessions whose two ends logged their start more than CLOCK_SKEW_BOUND apart:
    session_id, node_id, peer_id, seconds (node's start after peer's)."""
    started = links_df.where(F.col("start_seen")).select(
        "node_id", "peer_id", "session_id", F.col("start").cast("double").alias("start")
    )
    other = started.select(
        F.col("node_id").alias("peer_id"),
        F.col("peer_id").alias("node_id"),
        "session_id",
        F.col("start").alias("peer_start"),
    )
    pairs = started.join(other, ["node_id", "peer_id", "session_id"]).where(F.col("node_id") < F.col("peer_id"))
    pairs = pairs.withColumn("seconds", F.col("start") - F.col("peer_start"))
    return pairs.where(F.abs("seconds") > CLOCK_SKEW_BOUND)
