"""The bench's synthetic fleet (bench/pipeline_bench.py) logs only what real nodes can log.

A fleet generated without injected faults must audit clean twice: in batch (every end
final) and as the follower audits while the fleet runs (mconn-pipeline --follow rebuilds
``delivery_audit`` from the events it has read so far: some ends final, others only
their last ``channel_stats`` snapshot). A snapshot a node cannot produce (an expired
session's snapshot showing acked or delivered messages that its final counters never
confirm) makes the live audit report a loss that never happened. With faults injected,
the batch audit finds exactly them.
"""

import argparse
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import pipeline_bench  # noqa: E402 -- bench/ is not a package

#: Enough links that several sessions expire (one in twenty) and several break.
NODES, DEGREE, EVENTS = 24, 6, 16000
#: Whose logs the follower has read only up to an expired session's grace period (the
#: session suspended, its counters final but not yet logged as such): its dialer's or
#: its listener's. The other nodes' logs are read whole (their files close at different
#: times).
CUT_ENDS = ("dialer", "listener")


def _fleet(directory, lost: int = 0, duplicated: int = 0):
    args = argparse.Namespace(
        nodes=NODES, degree=DEGREE, events_target=EVENTS, lost=lost, duplicated=duplicated, seed=7, workers=1
    )
    plans = pipeline_bench.make_plans(args)
    expired = [(p, s) for p in plans.values() for s in p.sessions if s["grace_end"] is not None]
    events, faults = pipeline_bench.generate(args, str(directory))
    return events, faults, expired


def _audit(events):
    from mconn.pipeline import audit, sessions

    spans = sessions.sessions(events)
    return audit.build(sessions.counters(events, spans))


def _events(spark, directory, out):
    from pyspark.sql import functions as F

    from mconn.pipeline import ingest

    table = ingest.write_events(spark, [str(directory)], str(out))
    everything = ingest.load_events(spark, str(out), table.schema)
    # The channel ids the read observed (what the channels stage's one time order needs).
    assert table.channel_ids == [c for c, _ in pipeline_bench.CHANNELS]
    return everything.where(~F.col("event").isin(ingest.MALFORMED, ingest.UNKNOWN))


@pytest.fixture(scope="module")
def clean_fleet(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("bench-fleet")
    _, _, expired = _fleet(base / "logs")
    return _events(spark, base / "logs", base / "events").cache(), expired


def test_fleet_has_expired_sessions(clean_fleet):
    _, expired = clean_fleet
    assert len(expired) >= 2


def test_clean_fleet_audits_clean_in_batch(clean_fleet):
    from pyspark.sql import functions as F

    events, _ = clean_fleet
    rows = _audit(events).where((F.col("lost") > 0) | (F.col("duplicated") > 0)).collect()
    assert rows == []


@pytest.mark.parametrize("end", CUT_ENDS)
def test_clean_fleet_audits_clean_live(clean_fleet, end):
    from pyspark.sql import functions as F

    events, expired = clean_fleet
    # One end of each expired session read up to the middle of its grace period.
    cuts = {}
    for plan, session in expired:
        node = plan.dialer if end == "dialer" else plan.listener
        cuts[pipeline_bench.node_id(node)] = pipeline_bench.ORIGIN + (session["grace_end"] + session["end"]) / 2
    until = F.create_map(*[x for n, t in sorted(cuts.items()) for x in (F.lit(n), F.lit(t))])
    seen = events.where(until[F.col("node_id")].isNull() | (F.col("log_time") < until[F.col("node_id")]))
    table = _audit(seen)
    live = table.agg(
        F.count(F.when(~F.col("sender_final") | ~F.col("receiver_final"), 1)).alias("snapshot_rows"),
        F.count(F.when(F.col("sender_final") != F.col("receiver_final"), 1)).alias("one_end_final"),
        F.count(F.when((F.col("lost") > 0) | (F.col("duplicated") > 0), 1)).alias("faults"),
    ).first()
    assert live is not None
    assert live["one_end_final"] > 0  # the cases a snapshot can mislead
    assert live["faults"] == 0, table.where((F.col("lost") > 0) | (F.col("duplicated") > 0)).collect()[:5]


def test_injected_faults_found_exactly(spark, tmp_path):
    from pyspark.sql import functions as F

    _, faults, _ = _fleet(tmp_path / "logs", lost=3, duplicated=3)
    events = _events(spark, tmp_path / "logs", tmp_path / "events")
    rows = _audit(events).where((F.col("lost") > 0) | (F.col("duplicated") > 0)).collect()
    found = {(r["sender"], r["receiver"], r["session_id"], r["channel_id"], r["duplicated"] - r["lost"]) for r in rows}
    assert found == set(faults)
    assert all(r["lost"] + r["duplicated"] == 1 for r in rows)
