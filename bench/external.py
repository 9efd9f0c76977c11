"""bench/run.py's ``storm`` and ``shaped`` scenarios: bench/many_peers.py and
bench/shaped.py run as they are, their JSON read back and judged against their
targets (bench/RESULTS.md), each figure a ratio to (or a bound from) a baseline of the same run.

* ``storm``: ``--storm-runs`` runs of many_peers.py (``--storm-peers`` peers over
  ``--storm-dialers`` dialer processes; --quick: 3,000 over 2, one run). Handshakes per
  second against the raw round (plain Twisted doing a handshake's socket work) measured
  just before the storm, and against the mean of that one and one just after it; the
  storm's wall time, refusals and failures; RSS per peer, idle CPU over 1 s, and the DelayedCalls
  the listener holds with every peer connected.
* ``shaped``: bench/shaped.py at 20 and 2 Mbit/s (8 x ``--duration`` per measurement,
  at least 10 s: 20 s by default): the probe's added p99 against its bound (the kernel's unsent bound plus
  two packets' serialization plus 5 ms) and the bulk goodput, with raw TCP's added
  delay in the same run. It needs root (network namespaces); without it the scenario
  says so and measures nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_script(command: list[str], marker: str, timeout: float) -> dict:
    """Run a bench script, echo its output, and load the JSON it names after ``marker``."""
    out = subprocess.run(
        [sys.executable, *command], cwd=os.path.dirname(HERE), capture_output=True, text=True, timeout=timeout
    )
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    paths = [line.split(marker, 1)[1].strip() for line in out.stdout.splitlines() if line.startswith(marker)]
    if not paths:
        raise RuntimeError(f"{command[0]} named no results file")
    with open(paths[-1]) as f:
        return json.load(f)


def _verdict(passed: int, runs: int) -> str:
    return f"{'PASS' if passed * 2 > runs else 'MISS'} ({passed}/{runs} runs)"


def run_storm(args) -> dict:
    peers, dialers, runs = (3000, 2, 1) if args.quick else (args.storm_peers, args.storm_dialers, args.storm_runs)
    results = []
    for index in range(runs):
        print(f"storm run {index + 1}/{runs}: {peers} peers, {dialers} dialers", flush=True)
        doc = _run_script(
            ["bench/many_peers.py", "--peers", str(peers), "--dialers", str(dialers), "--idle", "1", "--settle", "4"],
            "results:",
            timeout=900,
        )
        results.append(doc["results"]["now"])
    ratio = [r["handshake_ratio"] for r in results]
    bracketed = [r["handshake_ratio_bracketed"] for r in results]
    storms = [r["storm"] for r in results]
    rows = [
        ("handshakes / raw round before", statistics.median(ratio), ">= 0.5", sum(x >= 0.5 for x in ratio)),
        (
            "handshakes / mean of rounds before and after",
            statistics.median(bracketed),
            ">= 0.5",
            sum(x >= 0.5 for x in bracketed),
        ),
        (
            "storm wall, s (all connected, none refused)",
            statistics.median(s["wall"] for s in storms),
            "<= 30",
            sum(s["wall"] <= 30 and s["connected"] == peers and s["refused"] == 0 and s["failed"] == 0 for s in storms),
        ),
        (
            "RSS per peer, KiB",
            statistics.median(r["rss"]["per_peer"] / 1024 for r in results),
            "<= 10",
            sum(r["rss"]["per_peer"] <= 10 * 1024 for r in results),
        ),
        (
            # One second right after the storm, to keep the scenario short: it misses the
            # keepalive. The idle figure over two ping intervals is many_peers.py's own
            # (its default --idle, 130 s; bench/RESULTS.md).
            "idle CPU over 1 s (not the keepalive), %",
            statistics.median(r["idle"]["cpu_share"] * 100 for r in results),
            "< 5",
            sum(r["idle"]["cpu_share"] < 0.05 for r in results),
        ),
    ]
    print(f"\nstorm: {peers} peers, medians of {runs} run(s)")
    for name, value, target, passed in rows:
        print(f"  {name:48s} {value:10.3f}  {target:7s} {_verdict(passed, runs)}")
    print(
        f"  listener CPU per handshake, us: {[round(s['cpu_us_per_session']) for s in storms]}; "
        f"raw round's: {[round(r['round']['cpu_us_per_round']) for r in results]}; "
        f"DelayedCalls with every peer connected: {[r['idle']['delayed_calls'][1] for r in results]}"
    )
    return {
        "peers": peers,
        "dialers": dialers,
        "runs": results,
        "rows": [dict(zip(("figure", "median", "target", "passed"), row, strict=True)) for row in rows],
    }


def run_shaped(args) -> dict:
    if os.geteuid() != 0:
        reason = "shaped: not measured, it needs root to create network namespaces (sudo .venv/bin/python bench/run.py)"
        print(reason)
        return {"not_measured": reason}
    duration = max(10.0, args.duration * 8)
    doc = _run_script(
        ["bench/shaped.py", "--rates", "20,2", "--duration", str(duration), "--variants", "raw,mconn"],
        "wrote ",
        timeout=900,
    )
    print("\nshaped: the probe's added delay beyond the network's, p99 against its bound")
    rows = []
    for row in doc["rows"]:
        if row["variant"] == "raw":
            continue
        raw = next((r for r in doc["rows"] if r["variant"] == "raw" and r["mbit"] == row["mbit"]), None)
        passed = row["added_ms"]["p99"] <= row["bound_ms"] and row["goodput_of_shaped_rate"] >= 0.9
        rows.append(
            {
                "mbit": row["mbit"],
                "added_p99_ms": row["added_ms"]["p99"],
                "bound_ms": row["bound_ms"],
                "goodput": row["goodput_of_shaped_rate"],
                "raw_added_p99_ms": raw["added_ms"]["p99"] if raw else None,
                "passed": passed,
            }
        )
        raw_p99 = "-" if raw is None else f"{raw['added_ms']['p99']:.1f}"
        print(
            f"  {row['mbit']:4.0f} Mbit/s: added p99 {row['added_ms']['p99']:.1f} ms (bound {row['bound_ms']:.1f}; "
            f"raw TCP {raw_p99}), goodput {row['goodput_of_shaped_rate']:.3f} (>= 0.9)  {'PASS' if passed else 'MISS'}"
        )
    return {"rows": rows, "shaped": doc}
