"""Turning role results into figures, judging them against the targets, printing them.

Each round runs every measurement over raw, over prebuilt (the prebuilt-frames
baseline, bench/prebuilt.py) and then over mconn. The table shows the median of the
rounds for each, the medians of the per-round mconn/raw and mconn/prebuilt ratios, and
their spread, because on a small virtual machine one run can differ from the next by a
factor of two. Each ratio has its own targets: CHECKS (mconn/raw) and PREBUILT_CHECKS
(mconn/prebuilt, the limit).
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
    if scenario in ("small", "small_each"):
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
    """One round's rows: each figure over raw, prebuilt (where it ran) and mconn, and
    mconn/raw and mconn/prebuilt where they mean something."""
    raw, pre, mc = results.get("raw", {}), results.get("prebuilt", {}), results.get("mconn", {})
    rows = []

    def row(name, unit, a, b, ratio=True, p=None):
        rows.append(
            {
                "figure": name,
                "unit": unit,
                "raw": a,
                "prebuilt": p,
                "mconn": b,
                "mconn_over_raw": (b / a) if ratio and a and b is not None else None,
                "mconn_over_prebuilt": (b / p) if ratio and p and b is not None else None,
            }
        )

    def value(scenario, *keys):
        """The figure at ``keys`` of the prebuilt run of ``scenario``; None if it did not run."""
        v = pre.get(scenario)
        for key in keys:
            v = v.get(key) if v is not None else None
        return v

    def cpu_rows(scenario, unit):
        for side, name in (("send", "sender"), ("recv", "receiver")):
            p = value(scenario, "cpu_us", side)
            row(f"  CPU {name}", unit, raw[scenario]["cpu_us"][side], mc[scenario]["cpu_us"][side], p=p)

    both = {s for s in raw if s in mc}
    if "bulk" in both:
        row("bulk 1 MiB msgs", "MB/s", raw["bulk"]["MB_per_s"], mc["bulk"]["MB_per_s"], p=value("bulk", "MB_per_s"))
        cpu_rows("bulk", "us/MB")
    for scenario, name in (("small", "small 100 B msgs"), ("small_each", "small 100 B, one by one")):
        if scenario in both:
            a, b = raw[scenario]["messages_per_s"], mc[scenario]["messages_per_s"]
            row(name, "msg/s", a, b, p=value(scenario, "messages_per_s"))
            cpu_rows(scenario, "us/msg")
    if "rtt" in both:
        a, b = raw["rtt"]["rtt"], mc["rtt"]["rtt"]
        row("round trip p50", "ms", a["p50_ms"], b["p50_ms"], p=value("rtt", "rtt", "p50_ms"))
        row("round trip p99", "ms", a["p99_ms"], b["p99_ms"], p=value("rtt", "rtt", "p99_ms"))
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


#: figure -> (target, whether (mconn/raw, mconn value) meets it): the targets of
#: bench/RESULTS.md for bulk, small messages, the round trip and priority.
CHECKS = {
    "bulk 1 MiB msgs": ("mconn/raw >= 0.6", lambda ratio, value: ratio >= 0.6),
    "small 100 B msgs": ("mconn/raw >= 0.25", lambda ratio, value: ratio >= 0.25),
    "round trip p50": ("mconn/raw <= 1.2", lambda ratio, value: ratio <= 1.2),
    "priority probe p99": ("mconn <= 5 ms", lambda ratio, value: value <= 5.0),
    "  as fraction of unloaded": ("mconn >= 0.8", lambda ratio, value: value >= 0.8),
}


#: figure -> (target, check) on mconn/prebuilt, the prebuilt-frames baseline: the limit
#: a Python program reaches here (and the priority probe's bound on loopback).
PREBUILT_CHECKS = {
    "bulk 1 MiB msgs": ("mconn/pre >= 0.85", lambda ratio, value: ratio >= 0.85),
    "small 100 B msgs": ("mconn/pre >= 0.5", lambda ratio, value: ratio >= 0.5),
    "small 100 B, one by one": ("mconn/pre >= 0.3", lambda ratio, value: ratio >= 0.3),
    "round trip p50": ("mconn/pre <= 1.1", lambda ratio, value: ratio <= 1.1),
    "priority probe p99": ("mconn <= 1 ms", lambda ratio, value: value <= 1.0),
}


def _verdict(figure: str, ratio, value, checks: dict = CHECKS):
    check = checks.get(figure)
    if check is None or value is None or (ratio is None and "mconn/" in check[0]):
        return None
    return check[1](ratio, value)


def _median(values: list):
    return statistics.median(values) if values else None


def judge(rounds: list[dict]) -> list[dict]:
    """The rows over all rounds: raw, prebuilt and mconn are medians of the rounds,
    mconn/raw and mconn/prebuilt are medians of the per-round ratios (the three ran back
    to back in each round, so a ratio pairs like with like); each target is judged on
    those medians and per round.
    """
    per_round = [rows_of(figs) for figs in rounds]
    rows = []
    for i, first in enumerate(per_round[0]):
        column = [r[i] for r in per_round]
        row = {"figure": first["figure"], "unit": first["unit"]}
        for key in ("raw", "prebuilt", "mconn", "mconn_over_raw", "mconn_over_prebuilt"):
            values = [c[key] for c in column if c.get(key) is not None]
            row[key] = _median(values)
            if key.startswith("mconn"):
                row["rounds_" + key] = values
        for suffix, checks, ratio in (
            ("", CHECKS, "mconn_over_raw"),
            ("_prebuilt", PREBUILT_CHECKS, "mconn_over_prebuilt"),
        ):
            row["target" + suffix] = checks.get(first["figure"], (None,))[0]
            row["pass" + suffix] = _verdict(row["figure"], row[ratio], row["mconn"], checks)
            row["rounds_pass" + suffix] = [_verdict(row["figure"], c[ratio], c["mconn"], checks) for c in column]
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


def _verdict_text(r: dict, suffix: str) -> str:
    """PASS or MISS of a row's target (``suffix``: "" for mconn/raw, "_prebuilt"), with
    "(k/n rounds)" when it was judged in more than one round."""
    judged = r.get("pass" + suffix)
    if judged is None:
        return ""
    held = [p for p in r.get("rounds_pass" + suffix, []) if p is not None]
    return ("PASS" if judged else "MISS") + (f" ({sum(held)}/{len(held)} rounds)" if len(held) > 1 else "")


def _spread(values: list) -> str:
    return f"{_fmt(min(values), 2)}..{_fmt(max(values), 2)}" if len(values) > 1 else ""


def print_table(rows: list[dict]) -> None:
    """The report: medians, mconn/raw and mconn/prebuilt, per-round spread, targets and verdicts.

    The verdict is judged on the medians; "(k/n)" says in how many rounds it held alone.
    The spread is the per-round min..max of the ratio (of mconn where there is no ratio).
    """
    header = (
        f"{'figure':<26}{'unit':<7}{'raw':>11}{'prebuilt':>11}{'mconn':>11}"
        f"{'mconn/raw':>11}{'spread':>14}  {'target':<19}{'result':<20}"
        f"{'mconn/pre':>10}{'spread':>14}  {'target':<19}result"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        spread_raw = _spread(r.get("rounds_mconn_over_raw") or r.get("rounds_mconn") or [])
        pre_values = r.get("rounds_mconn_over_prebuilt") or (r.get("rounds_mconn") if r.get("target_prebuilt") else [])
        print(
            f"{r['figure']:<26}{r['unit']:<7}{_fmt(r['raw']):>11}{_fmt(r.get('prebuilt')):>11}{_fmt(r['mconn']):>11}"
            f"{_fmt(r['mconn_over_raw']):>11}{spread_raw:>14}  {r['target'] or '':<19}{_verdict_text(r, ''):<20}"
            f"{_fmt(r.get('mconn_over_prebuilt')):>10}{_spread(pre_values or []):>14}  "
            f"{r.get('target_prebuilt') or '':<19}{_verdict_text(r, '_prebuilt')}"
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
        if name.endswith(".prof") and "-mconn" in name:
            print(f"\n=== {name}: top {top} by tottime ===")
            pstats.Stats(os.path.join(directory, name)).strip_dirs().sort_stats("tottime").print_stats(top)


def print_py_spy(directory: str, top: int = 18) -> None:
    """Self and inclusive share of samples per function, from py-spy's collapsed stacks."""
    strip_line = re.compile(r":\d+\)$")
    for name in sorted(os.listdir(directory)):
        if not (name.endswith(".txt") and "-mconn" in name):
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
    """A sha256 over the package's .py files, its subpackages' included, and their newest
    mtime: which code ran."""
    h = hashlib.sha256()
    newest = 0.0
    for folder, dirs, files in os.walk(package_dir):  # top down, folders in name order
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    h.update(os.path.relpath(path, package_dir).encode() + b"\0" + f.read() + b"\0")
                newest = max(newest, os.path.getmtime(path))
    return {"sha256": h.hexdigest()[:16], "newest_mtime": newest}


# -- the acks scenario: mconn before the session layer, now, and now with rare acks ----

#: The session layer's budget: acknowledgements cost at most 5% of throughput.
ACK_TARGET = 0.95


def _ack_values(figs: dict) -> list[tuple[str, str, float | None]]:
    """(figure, unit, value) of one variant's figures, in table order."""
    out = []
    for scenario, name, key, unit in (
        ("bulk", "bulk 1 MiB msgs", "MB_per_s", "MB"),
        ("small", "small 100 B msgs", "messages_per_s", "msg"),
    ):
        f = figs.get(scenario)
        if f is None:
            continue
        out.append((name, f"{unit}/s", f[key]))
        out.append(("  CPU sender", f"us/{unit}", f["cpu_us"]["send"]))
        out.append(("  CPU receiver", f"us/{unit}", f["cpu_us"]["recv"]))
    return out


def _variant_row(figure: str, unit: str, col: dict, ratios: dict, judged: str | None) -> dict:
    """One row over the variants: the median of each variant's values (``col``) and of
    each list of per-round ratios (``ratios``: key -> list); ``judged`` names the ratio
    held against ACK_TARGET (None: not judged)."""
    row = {"figure": figure, "unit": unit, **{v: statistics.median(values) for v, values in col.items()}}
    for key, values in ratios.items():
        row[key] = statistics.median(values) if values else None
        row["rounds_" + key] = values
    row["target"] = f"{judged.replace('_over_', '/').replace('rare_acks', 'rare')} >= {ACK_TARGET}" if judged else None
    row["pass"] = row[judged] >= ACK_TARGET if judged and row[judged] is not None else None
    row["rounds_pass"] = [r >= ACK_TARGET for r in ratios[judged]] if judged else []
    return row


def judge_acks(rounds: list[dict]) -> list[dict]:
    """Rows of the acks table: medians per variant, medians of the per-round ratios
    now/before (the cost of the session layer) and now/rare_acks (of acks alone).
    Throughput rows are judged against ACK_TARGET on now/before."""
    per_round = [{v: _ack_values(figs[v]) for v in figs} for figs in rounds]
    rows = []
    for i, (figure, unit, _) in enumerate(per_round[0]["now"]):
        col = {v: [r[v][i][2] for r in per_round] for v in per_round[0]}
        ratios = {
            f"now_over_{other}": [n / o for n, o in zip(col["now"], col[other], strict=True) if n is not None and o]
            for other in ("before", "rare_acks")
        }
        rows.append(_variant_row(figure, unit, col, ratios, "now_over_before" if unit.endswith("/s") else None))
    return rows


def judge_msgcost(rounds: list[dict]) -> list[dict]:
    """Rows of msgcost.py's figures: medians per variant and of the per-round ratios.

    CPU per message is the inverse of a CPU-bound throughput, so before/now is the
    throughput ratio the target speaks of; the totals are judged against ACK_TARGET.
    """
    rows = []
    for scenario, unit in (("bulk", "us/MiB"), ("small", "us/msg")):
        for phase in ("send_us", "deliver_us", "total_us"):
            col = {v: [r[v][scenario][phase] for r in rounds] for v in rounds[0]}
            ratios = {
                f"{other}_over_now": [b / n for n, b in zip(col["now"], col[other], strict=True)]
                for other in ("before", "rare_acks")
            }
            judged = "before_over_now" if phase == "total_us" else None
            rows.append(_variant_row(f"{scenario} {phase[:-3]}", unit, col, ratios, judged))
    return rows


def print_variants(rows: list[dict], ratios: tuple[str, str]) -> None:
    """The acks or msgcost table: values per variant, then the two ratios (row keys)."""
    labels = [key.replace("_over_", "/").replace("rare_acks", "rare") for key in ratios]
    header = (
        f"{'figure':<20}{'unit':<8}{'before':>11}{'now':>11}{'rare acks':>11}"
        f"{labels[0]:>11}{'spread':>12}{labels[1]:>10}{'spread':>12}  {'target':<21}result"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = []
        for key, width in zip(ratios, (11, 10), strict=True):
            values = r["rounds_" + key]
            spread = f"{_fmt(min(values), 2)}..{_fmt(max(values), 2)}" if len(values) > 1 else ""
            cells.append(f"{_fmt(r[key]):>{width}}{spread:>12}")
        verdict = ""
        if r["pass"] is not None:
            verdict = "PASS" if r["pass"] else "MISS"
            if len(r["rounds_pass"]) > 1:
                verdict += f" ({sum(r['rounds_pass'])}/{len(r['rounds_pass'])} rounds)"
        print(
            f"{r['figure']:<20}{r['unit']:<8}{_fmt(r['before']):>11}{_fmt(r['now']):>11}"
            f"{_fmt(r['rare_acks']):>11}{''.join(cells)}  {r['target'] or '':<21}{verdict}"
        )


# -- the resume scenario -----------------------------------------------------------

#: The resume target: the first re-delivered message within 50 ms of a reset (loopback).
RESUME_TARGET_MS = 50.0


def percentiles(values: list[float]) -> dict:
    """n, min, p50, p95 (nearest rank) and max of ``values``."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(p: float) -> float:
        return ordered[max(0, -(-int(p * 100) * n // 100) - 1)]

    return {"n": n, "min": ordered[0], "p50": rank(0.50), "p95": rank(0.95), "max": ordered[-1]}


def resume_figures(result: dict) -> dict:
    """Pair the dialer's reset times with the receiver's arrival times (milliseconds).

    Raises if the stream lost, duplicated or reordered a message, or if resets and
    resumes do not pair up one to one.
    """
    recv, send = result["recv"], result["send"]
    resets, resumes = send["resets"], recv["resumes"]
    if recv["out_of_order"] or recv["epoch_ahead"] or recv["stream_messages"] != send["stream_messages"]:
        raise RuntimeError(
            f"resume: stream broken: {recv['out_of_order']} out of order, {recv['epoch_ahead']} epoch errors, "
            f"{recv['stream_messages']} delivered of {send['stream_messages']} accepted"
        )
    if len(resets) != len(resumes):
        raise RuntimeError(f"resume: {len(resets)} resets but the receiver saw {len(resumes)} resumes")

    def since_reset(key: str, source: list[dict]) -> list[float]:
        return [(s[key] - r["reset_ns"]) / 1e6 for r, s in zip(resets, source, strict=True) if s[key] is not None]

    def fresh(mode: str, side: str, key: str) -> list[float]:
        samples = recv["fresh"] if side == "recv" else send["fresh"]
        return [(s[key] - s["dial_ns"]) / 1e6 for s in samples if s["mode"] == mode]

    lists = {
        "reset -> first re-delivered msg": since_reset("first_resent_ns", resumes),
        "reset -> first new msg": since_reset("first_new_ns", resumes),
        "reset -> resumed, dialer": since_reset("resumed_ns", resets),
        "reset -> resumed, receiver": since_reset("resumed_ns", resumes),
        "fresh dial -> first msg (proxy)": fresh("proxy", "recv", "arrival_ns"),
        "fresh dial -> handshake (proxy)": fresh("proxy", "send", "handshake_ns"),
        "fresh dial -> first msg (direct)": fresh("direct", "recv", "arrival_ns"),
    }

    # The longest event-loop stall of each process that overlaps reset -> first delivery,
    # as [length ms, CPU ms the process used during it].
    def stalled(stalls: list, start: int, end: int | None) -> list:
        end = end if end is not None else start
        return max(
            ([late / 1e6, cpu / 1e6] for at, late, cpu in stalls if at - late < end and at > start), default=[0.0, 0.0]
        )

    stall_ms = {
        side: [
            stalled(result[side].get("stalls", []), r["reset_ns"], s["first_ns"])
            for r, s in zip(resets, resumes, strict=True)
        ]
        for side in ("send", "recv")
    }
    events = sorted(
        {e for r in resets for e in r.get("timeline_ns", {})},
        key=lambda e: statistics.median((r["timeline_ns"][e] - r["reset_ns"]) for r in resets if e in r["timeline_ns"]),
    )
    timeline = {
        e: percentiles([(r["timeline_ns"][e] - r["reset_ns"]) / 1e6 for r in resets if e in r.get("timeline_ns", {})])
        for e in events
    }
    return {
        "ms": {name: percentiles(values) for name, values in lists.items()},
        "dialer_timeline_ms": timeline,
        "stall_ms": {"dialer": stall_ms["send"], "receiver": stall_ms["recv"]},
        "samples_ms": lists,
        "dial_attempts": {
            "per_resume_max": max((len(r.get("dial_attempts", ())) for r in resets), default=0),
            "delays": sorted({a["delay"] for r in resets for a in r.get("dial_attempts", ())}),
        },
        "resent_per_resume": percentiles([r["resent"] for r in resumes]),
        "lost_at_reset": percentiles([r["unsent_at_reset"] for r in resets]),
        "stream_messages": recv["stream_messages"],
        "refused": send["refused"],
        "process": {side: result[side]["process"] for side in ("send", "recv")},
    }


#: The baseline row of the resume table: what a resume is compared with.
RESUME_BASELINE = "fresh dial -> first msg (proxy)"


def print_resume(figs: dict) -> None:
    """Milliseconds per figure, x the fresh baseline (p50 over p50), and the target."""
    base = figs["ms"][RESUME_BASELINE].get("p50")
    header = f"{'figure':<34}{'n':>4}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'x fresh':>9}  {'target':<13}result"
    print(header)
    print("-" * len(header))
    for name, p in figs["ms"].items():
        ratio = p["p50"] / base if p.get("n") and base else None
        target = verdict = ""
        if name == "reset -> first re-delivered msg" and p.get("n"):
            target = f"<= {RESUME_TARGET_MS:.0f} ms"
            verdict = ", ".join(f"{k} {'PASS' if p[k] <= RESUME_TARGET_MS else 'MISS'}" for k in ("p50", "p95", "max"))
        print(
            f"{name:<34}{p.get('n', 0):>4}{_fmt(p.get('p50')):>9}{_fmt(p.get('p95')):>9}{_fmt(p.get('max')):>9}"
            f"{_fmt(ratio, 2):>9}  {target:<13}{verdict}"
        )
    timeline = figs.get("dialer_timeline_ms") or {}
    if timeline:
        print(
            "dialer's telemetry after a reset, p50 (p95) ms: "
            + ", ".join(f"{e} {_fmt(p['p50'], 2)} ({_fmt(p['p95'], 2)})" for e, p in timeline.items())
        )
    stalls = figs.get("stall_ms")
    if stalls:
        first = figs["samples_ms"]["reset -> first re-delivered msg"]
        worst = max(range(len(first)), key=first.__getitem__, default=None)
        print(
            "longest event-loop stall between a reset and its first delivery, p50 / max ms: "
            + ", ".join(
                f"{side} {_fmt(percentiles([x[0] for x in v]).get('p50'), 2)} / "
                f"{_fmt(percentiles([x[0] for x in v]).get('max'), 2)}"
                for side, v in stalls.items()
            )
            + (
                ""
                if worst is None
                else f"; in the slowest resume ({first[worst]:.1f} ms): "
                + ", ".join(f"{side} {_fmt(v[worst][0], 2)} (CPU {_fmt(v[worst][1], 2)})" for side, v in stalls.items())
            )
        )
    attempts = figs["dial_attempts"]
    print(f"dial attempts per resume: at most {attempts['per_resume_max']}, after delays {attempts['delays']} s")
    resent, lost = figs["resent_per_resume"], figs["lost_at_reset"]
    print(
        f"re-delivered per resume: p50 {resent.get('p50')} (max {resent.get('max')}); accepted in the reset's "
        f"own turn: {lost.get('p50')}; stream: {figs['stream_messages']} messages exactly once and in order, "
        f"{figs['refused']} refused while suspended"
    )
