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

from pyspark.sql import DataFrame, functions as F

#: specs/pipeline.md section 5.4.
VERDICTS = ("lost", "duplicated", "one_sided", "unsettled", "ok")


def build(counters_df: DataFrame) -> DataFrame:
    keys = ["sender", "receiver", "session_id", "channel_id"]
    sent = counters_df.select(
        F.col("node_id").alias("sender"), F.col("peer_id").alias("receiver"), "session_id", "channel_id",
        "accepted", "acked", "undelivered", F.col("final").alias("sender_final"),
    )
    received = counters_df.select(
        F.col("peer_id").alias("sender"), F.col("node_id").alias("receiver"), "session_id", "channel_id",
        "delivered", F.col("final").alias("receiver_final"),
    )
    rows = sent.join(received, keys, "full_outer")
    counts = ("accepted", "acked", "undelivered", "delivered", "sender_final", "receiver_final")
    return rows.select(*keys, *counts, *_findings())


def _findings() -> list[F.Column]:
    accepted, acked, delivered = F.col("accepted"), F.col("acked"), F.col("delivered")
    undelivered = F.col("undelivered")
    both = F.col("sender_final") & F.col("receiver_final")
    zero = F.lit(0).cast("long")
    # Counters from one end only, with something to audit: the other node's logs are missing.
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
    return [lost.alias("lost"), duplicated.alias("duplicated"), in_doubt.alias("in_doubt"),
            unsettled.alias("unsettled"), verdict.alias("verdict")]
