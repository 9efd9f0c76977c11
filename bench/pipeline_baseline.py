"""The delivery audit in plain Python, one process: the baseline of bench/pipeline_bench.py.

    .venv/bin/python bench/pipeline_baseline.py LOGS_DIR

The straightforward implementation: read every line of every file (version 2 records are
one a line; version 1 lines are split on the record separator, specs/telemetry.md
section 2), parse each record with ``json.loads``, keep the per-channel counters of each ``session_ended``, then join the
two ends of every session and apply the formulas of specs/pipeline.md section 5 (both
ends final; the synthetic fleet has no crashed nodes, so the ``channel_stats`` fallback
of the real pipeline is not needed here). Prints one JSON object: events, sessions
audited, lost, duplicated, rows with a finding.
"""

from __future__ import annotations

import json
import os
import sys


def session_ends(directory: str) -> tuple[int, dict]:
    """(records, {(node, peer, session): {channel: (accepted, acked, delivered, undelivered)}})."""
    ends = {}
    events = 0
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            for text in f:
                for record in text.split("\x1e"):
                    record = record.strip()
                    if not record:
                        continue
                    try:
                        event = json.loads(record)
                    except ValueError:
                        continue
                    events += 1
                    if isinstance(event, dict) and event.get("event") == "session_ended":
                        try:
                            ends[(event["node_id"], event["peer_id"], event["session_id"])] = counters(event)
                        except (KeyError, TypeError):
                            continue  # malformed: the Spark pipeline counts those, this audit skips them
    return events, ends


def counters(event: dict) -> dict:
    undelivered = {u["channel_id"]: u["count"] for u in event["undelivered"]}
    return {
        c["channel_id"]: (c["accepted"], c["acked"], c["delivered"], undelivered.get(c["channel_id"], 0))
        for c in event["channels"]
    }


def audit(directory: str) -> dict:
    events, ends = session_ends(directory)
    lost = duplicated = rows = findings = 0
    for (sender, receiver, session), channels in ends.items():
        other = ends.get((receiver, sender, session))
        if other is None:
            continue
        for channel, (accepted, _acked, _delivered, undelivered) in channels.items():
            if channel not in other:
                continue
            delivered = other[channel][2]
            rows += 1
            lost_here = max(0, accepted - delivered - undelivered)
            duplicated_here = max(0, delivered - accepted)
            lost += lost_here
            duplicated += duplicated_here
            findings += bool(lost_here or duplicated_here)
    return {
        "events": events,
        "session_ends": len(ends),
        "rows": rows,
        "lost": lost,
        "duplicated": duplicated,
        "findings": findings,
    }


if __name__ == "__main__":
    print(json.dumps(audit(sys.argv[1])))
