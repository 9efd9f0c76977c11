"""Turning role results into figures, judging them against the targets, printing them.

Each round runs every measurement over raw and then over mconn. The table shows the
median of the rounds for each, the median of the per-round mconn/raw ratios, and their
spread, because on a small virtual machine one run can differ from the next by a
factor of two.
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


def rows_of(results: dict) -> list[dict]:
    """One round's rows: each figure over raw and mconn, and mconn/raw where it means something."""
    raw, mc = results.get("raw", {}), results.get("mconn", {})
    rows = []

    def row(name, unit, a, b, ratio=True):
        rows.append({
            "figure": name,
            "unit": unit,
            "raw": a,
            "mconn": b,
            "mconn_over_raw": (b / a) if ratio and a and b is not None else None,
        })

    def cpu_rows(scenario, unit):
        for side, name in (("send", "sender"), ("recv", "receiver")):
            row(f"  CPU {name}", unit, raw[scenario]["cpu_us"][side], mc[scenario]["cpu_us"][side])

    both = {s for s in raw if s in mc}
    if "bulk" in both:
        row("bulk 1 MiB msgs", "MB/s", raw["bulk"]["MB_per_s"], mc["bulk"]["MB_per_s"])
        cpu_rows("bulk", "us/MB")
    if "small" in both:
        row("small 100 B msgs", "msg/s", raw["small"]["messages_per_s"], mc["small"]["messages_per_s"])
        cpu_rows("small", "us/msg")
    if "rtt" in both:
        a, b = raw["rtt"]["rtt"], mc["rtt"]["rtt"]
        row("round trip p50", "ms", a["p50_ms"], b["p50_ms"])
        row("round trip p99", "ms", a["p99_ms"], b["p99_ms"])
        cpu_rows("rtt", "us/rt")
    if "priority" in both:
        a, b = raw["priority"], mc["priority"]
        row("priority probe p50", "ms", a["probe"].get("p50_ms"), b["probe"].get("p50_ms"))
        row("priority probe p99", "ms", a["probe"].get("p99_ms"), b["probe"].get("p99_ms"))
        for q, name in (("sendq_at_probe", "sender"), ("recvq_at_probe", "receiver")):
            row(f"  kernel queue, {name}", "KiB", a[q].get("p50_KiB"), b[q].get("p50_KiB"))
        row("bulk while probing", "MB/s", a["bulk_MB_per_s"], b["bulk_MB_per_s"])
        if "bulk" in both:
            fa = a["bulk_MB_per_s"] / raw["bulk"]["MB_per_s"]
            fb = b["bulk_MB_per_s"] / mc["bulk"]["MB_per_s"]
            row("  as fraction of unloaded", "x", fa, fb, ratio=False)
    return rows


#: figure -> (target, whether (mconn/raw, mconn value) meets it), as the issue states them.
CHECKS = {
    "bulk 1 MiB msgs": ("mconn/raw >= 0.30", lambda ratio, value: ratio >= 0.30),
    "small 100 B msgs": ("mconn/raw >= 0.15", lambda ratio, value: ratio >= 0.15),
    "round trip p50": ("mconn/raw <= 1.4", lambda ratio, value: ratio <= 1.4),
    "priority probe p99": ("mconn <= 5 ms", lambda ratio, value: value <= 5.0),
    "  as fraction of unloaded": ("mconn >= 0.8", lambda ratio, value: value >= 0.8),
}


def _verdict(figure: str, ratio, value):
    check = CHECKS.get(figure)
    if check is None or value is None or (ratio is None and "mconn/raw" in check[0]):
        return None
    return check[1](ratio, value)


def judge(rounds: list[dict]) -> list[dict]:
    """The rows over all rounds: raw and mconn are medians of the rounds, mconn/raw is the
    median of the per-round ratios (raw and mconn ran back to back in each round, so a
    ratio pairs like with like); each target is judged on those medians and per round.
    """
    per_round = [rows_of(figs) for figs in rounds]
    rows = []
    for i, first in enumerate(per_round[0]):
        column = [r[i] for r in per_round]
        ratios = [c["mconn_over_raw"] for c in column if c["mconn_over_raw"] is not None]
        values = [c["mconn"] for c in column if c["mconn"] is not None]
        raws = [c["raw"] for c in column if c["raw"] is not None]
        row = {
            "figure": first["figure"],
            "unit": first["unit"],
            "raw": statistics.median(raws) if raws else None,
            "mconn": statistics.median(values) if values else None,
            "mconn_over_raw": statistics.median(ratios) if ratios else None,
            "rounds_mconn_over_raw": ratios,
            "rounds_mconn": values,
            "target": CHECKS.get(first["figure"], (None,))[0],
        }
        row["pass"] = _verdict(row["figure"], row["mconn_over_raw"], row["mconn"])
        row["rounds_pass"] = [_verdict(row["figure"], c["mconn_over_raw"], c["mconn"]) for c in column]
        rows.append(row)
    return rows


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}" if digits < 3 else f"{v:.1f}"
    return f"{v:.{digits}f}"


def print_table(rows: list[dict]) -> None:
    """The report: medians, mconn/raw, per-round spread, target and verdict.

    The verdict is judged on the medians; "(k/n)" says in how many rounds it held alone.
    The spread is the per-round min..max of mconn/raw (of mconn where there is no ratio).
    """
    header = (
        f"{'figure':<26}{'unit':<7}{'raw':>11}{'mconn':>11}{'mconn/raw':>11}{'spread':>14}  "
        f"{'target':<19}result"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = ""
        if r["pass"] is not None:
            verdict = "PASS" if r["pass"] else "MISS"
            held = [p for p in r.get("rounds_pass", []) if p is not None]
            if len(held) > 1:
                verdict += f" ({sum(held)}/{len(held)} rounds)"
        spread = r.get("rounds_mconn_over_raw") or r.get("rounds_mconn") or []
        spread_text = f"{_fmt(min(spread), 2)}..{_fmt(max(spread), 2)}" if len(spread) > 1 else ""
        print(
            f"{r['figure']:<26}{r['unit']:<7}{_fmt(r['raw']):>11}{_fmt(r['mconn']):>11}"
            f"{_fmt(r['mconn_over_raw']):>11}{spread_text:>14}  {r['target'] or '':<19}{verdict}"
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

