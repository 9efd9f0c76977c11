"""Turning role results into figures, judging them against the targets, printing them.

Figures of several rounds are combined leaf by leaf with the median; the table shows
the medians, mconn/raw, and the per-round spread of that ratio, because on a small
virtual machine one run can differ from the next by a factor of two.
"""

from __future__ import annotations

import collections
import hashlib
import os
import platform
import pstats
import re
import statistics

#: scenarios.BULK_SIZE (not imported: scenarios imports mconn and Twisted).
BULK_SIZE = 1 << 20

#: The targets of the issue, as printed.
TARGETS = {
    "bulk": "mconn/raw >= 0.30",
    "small": "mconn/raw >= 0.15",
    "rtt": "p50 mconn/raw <= 1.4",
    "priority_p99": "mconn p99 <= 5 ms",
    "priority_bulk": "mconn >= 0.8",
}


def figures(scenario: str, r: dict) -> dict:
    """The numbers one measurement reduces to, with each process's CPU share and cost.

    ``cpu_us`` is CPU time per unit of work (per MB, per message, per round trip) from
    connection to report: steadier than rates on a machine whose two vCPUs contend.
    """
    recv, send = r["recv"], r["send"]
    if recv.get("malformed"):
        raise RuntimeError(f"{scenario}: the receiver got {recv['malformed']} messages of the wrong length")
    out, units = _figures(scenario, recv, send)
    out["cpu_share"] = {side: round(r[side]["process"]["cpu_share"], 3) for side in ("send", "recv")}
    out["minor_faults"] = {side: r[side]["process"]["minor_faults"] for side in ("send", "recv")}
    if units:
        out["cpu_us"] = {side: r[side]["process"]["cpu_s"] * 1e6 / units for side in ("send", "recv")}
    return out


def _figures(scenario: str, recv: dict, send: dict) -> tuple[dict, float | None]:
    """(figures, units of work for the CPU cost) of one measurement."""
    if scenario == "bulk":
        b = recv["B"]
        figs = {"MB_per_s": b["bytes_per_s"] / 1e6, "messages": b["messages"], "seconds": b["seconds"]}
        return figs, b["messages"] * BULK_SIZE / 1e6
    if scenario == "small":
        m = recv["S"]
        figs = {"messages_per_s": m["messages_per_s"], "messages": m["messages"], "seconds": m["seconds"]}
        return figs, m["messages"]
    if scenario == "priority":
        return {
            "bulk_MB_per_s": recv["B"]["bytes_per_s"] / 1e6,
            "probe": recv.get("probe", {"n": 0}),
            "probes_sent": send.get("probes_sent", 0),
            "probes_refused": send.get("probes_refused", 0),
            "sendq_at_probe": send.get("sendq_at_probe", {}),
            "recvq_at_probe": recv.get("recvq_at_probe", {}),
        }, None
    return {"rtt": send["rtt"], "round_trips": send["round_trips"]}, send["round_trips"]


def median_of(rounds: list):
    """The per-leaf median of several rounds' figures (dicts of numbers, nested)."""
    first = rounds[0]
    if isinstance(first, dict):
        return {k: median_of([r[k] for r in rounds if k in r]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(rounds)
    return first


def judge(results: dict) -> list[dict]:
    """Rows of the report: each figure, mconn/raw, and pass/miss where a target applies."""
    raw, mc = results.get("raw", {}), results.get("mconn", {})
    rows = []

    def row(name, unit, a, b, target=None, passed=None, ratio=True):
        rows.append({
            "figure": name,
            "unit": unit,
            "raw": a,
            "mconn": b,
            "mconn_over_raw": (b / a) if ratio and a and b is not None else None,
            "target": target,
            "pass": passed,
        })

    def cpu_rows(scenario, unit):
        for side, name in (("send", "sender"), ("recv", "receiver")):
            row(f"  CPU {name}", unit, raw[scenario]["cpu_us"][side], mc[scenario]["cpu_us"][side])

    if "bulk" in raw and "bulk" in mc:
        a, b = raw["bulk"]["MB_per_s"], mc["bulk"]["MB_per_s"]
        row("bulk 1 MiB msgs", "MB/s", a, b, TARGETS["bulk"], b / a >= 0.30)
        cpu_rows("bulk", "us/MB")
    if "small" in raw and "small" in mc:
        a, b = raw["small"]["messages_per_s"], mc["small"]["messages_per_s"]
        row("small 100 B msgs", "msg/s", a, b, TARGETS["small"], b / a >= 0.15)
        cpu_rows("small", "us/msg")
    if "rtt" in raw and "rtt" in mc:
        a, b = raw["rtt"]["rtt"], mc["rtt"]["rtt"]
        row("round trip p50", "ms", a["p50_ms"], b["p50_ms"], TARGETS["rtt"], b["p50_ms"] / a["p50_ms"] <= 1.4)
        row("round trip p99", "ms", a["p99_ms"], b["p99_ms"])
        cpu_rows("rtt", "us/rt")
    if "priority" in raw and "priority" in mc:
        a, b = raw["priority"]["probe"], mc["priority"]["probe"]
        p99_ok = b.get("p99_ms", float("inf")) <= 5.0
        row("priority probe p50", "ms", a.get("p50_ms"), b.get("p50_ms"))
        row("priority probe p99", "ms", a.get("p99_ms"), b.get("p99_ms"), TARGETS["priority_p99"], p99_ok)
        a, b = raw["priority"], mc["priority"]
        for q, name in (("sendq_at_probe", "sender"), ("recvq_at_probe", "receiver")):
            row(f"  kernel queue, {name}", "KiB", a[q].get("p50_KiB"), b[q].get("p50_KiB"))
        row("bulk while probing", "MB/s", a["bulk_MB_per_s"], b["bulk_MB_per_s"])
        if "bulk" in raw and "bulk" in mc:
            fa = a["bulk_MB_per_s"] / raw["bulk"]["MB_per_s"]
            fb = b["bulk_MB_per_s"] / mc["bulk"]["MB_per_s"]
            row("  as fraction of unloaded", "x", fa, fb, TARGETS["priority_bulk"], fb >= 0.8, ratio=False)
    return rows


def print_table(rows: list[dict]) -> None:
    def fmt(v):
        if v is None:
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3f}"

    header = (
        f"{'figure':<26}{'unit':<7}{'raw':>12}{'mconn':>12}{'mconn/raw':>11}{'spread':>15}  "
        f"{'target':<46}result"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "" if r["pass"] is None else ("PASS" if r["pass"] else "MISS")
        spread = r.get("rounds_mconn_over_raw") or r.get("rounds_mconn") or []
        spread_text = f"{min(spread):.2f}..{max(spread):.2f}" if len(spread) > 1 else ""
        print(
            f"{r['figure']:<26}{r['unit']:<7}{fmt(r['raw']):>12}{fmt(r['mconn']):>12}"
            f"{fmt(r['mconn_over_raw']):>11}{spread_text:>15}  {r['target'] or '':<46}{verdict}"
        )


def machine() -> dict:
    """What the figures were measured on."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import twisted

    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "twisted": twisted.__version__,
    }


def print_profiles(directory: str, top: int = 18) -> None:
    """The top functions by own time of every mconn role profiled with cProfile."""
    for name in sorted(os.listdir(directory)):
        if name.endswith(".prof") and "-mconn-" in name:
            print(f"\n=== {name}: top {top} by tottime ===")
            pstats.Stats(os.path.join(directory, name)).strip_dirs().sort_stats("tottime").print_stats(top)


def print_py_spy(directory: str, top: int = 18) -> None:
    """Self and inclusive share of samples per function, from py-spy's collapsed stacks."""
    strip_line = re.compile(r":\d+\)$")
    for name in sorted(os.listdir(directory)):
        if not (name.endswith(".txt") and "-mconn-" in name):
            continue
        own, inclusive, total = collections.Counter(), collections.Counter(), 0
        with open(os.path.join(directory, name)) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                frames = [strip_line.sub(")", fr) for fr in stack.split(";")]
                n = int(count)
                total += n
                own[frames[-1]] += n
                for fr in set(frames):
                    inclusive[fr] += n
        print(f"\n=== py-spy {name}: {total} samples (1 kHz, idle excluded); top {top} by self ===")
        print(f"{'self %':>7} {'incl %':>7}  function")
        for fr, n in own.most_common(top):
            print(f"{100 * n / total:7.1f} {100 * inclusive[fr] / total:7.1f}  {fr}")


def source_digest(package_dir: str) -> dict:
    """A sha256 over the package's .py files, and their newest mtime: which code ran."""
    h = hashlib.sha256()
    newest = 0.0
    for name in sorted(os.listdir(package_dir)):
        if name.endswith(".py"):
            path = os.path.join(package_dir, name)
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
            newest = max(newest, os.path.getmtime(path))
    return {"sha256": h.hexdigest()[:16], "newest_mtime": newest}

