"""The report's plots: plain Python data in, PNG bytes out (matplotlib, Agg canvas).

``matplotlib.figure.Figure`` draws without pyplot and without a display, so nothing
here touches global state. Every function returns the PNG, or None when there is
nothing to plot.
"""

from __future__ import annotations

import io
import math

from matplotlib.figure import Figure

GREEN, ORANGE, RED, BLUE, GREY = "#2e9e44", "#f0a020", "#d62728", "#1f77b4", "#888888"
RESULT_COLORS = {"connected": GREEN, "failed": ORANGE, "not_retried": RED}
#: (unit, seconds per unit, largest span shown in it) for the timeline's axis.
_UNITS = (("seconds", 1, 180), ("minutes", 60, 3 * 3600), ("hours", 3600, math.inf))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return buf.getvalue()


def timeline(lanes: list[dict], origin: float) -> bytes | None:
    """One lane per link end: ``{"label", "sessions": [(start, end, outcome)], "breaks": [(start, end)]}``."""
    if not lanes:
        return None
    fig = Figure(figsize=(10, 0.32 * len(lanes) + 1.2))
    ax = fig.add_subplot()
    span = max(end for lane in lanes for _, end, _ in lane["sessions"]) - origin
    thinnest = max(span, 1e-3) / 400  # a short break stays visible, without hiding its neighbours
    unit, scale = next((u, s) for u, s, most in _UNITS if span <= most)

    def bar(y, start, end, color):
        ax.broken_barh([((start - origin) / scale, max(end - start, thinnest) / scale)], (y - 0.35, 0.7), color=color)

    for y, lane in enumerate(lanes):
        for start, end, outcome in lane["sessions"]:
            bar(y, start, end, GREEN)
            if outcome in ("expired", "fresh", "rejected", "restarted"):
                ax.plot((end - origin) / scale, y, marker="x", color=RED, markersize=8)
        for start, end in lane["breaks"]:
            bar(y, start, end, ORANGE)
    ax.set_yticks(range(len(lanes)), [lane["label"] for lane in lanes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit} since the first event")
    ax.set_title("Link timeline: connected (green), suspended (orange), session lost (x)")
    return _png(fig)


def log_histogram(ax, series: dict[str, list[float]], colors: dict, xlabel: str) -> None:
    """Stacked histogram on a log axis; values <= 0 go to a bar left of the smallest bin."""
    positive = [v for values in series.values() for v in values if v > 0]
    low = math.floor(math.log10(min(positive))) if positive else -3
    high = math.ceil(math.log10(max(positive))) if positive else 0
    high = max(high, low + 1)
    edges = [10 ** (low + i / 4) for i in range((high - low) * 4 + 1)]
    data = [[v if v > 0 else edges[0] * 0.7 for v in values] for values in series.values()]
    bins = [edges[0] * 0.5, edges[0] * 0.9] + edges
    ax.hist(data, bins=bins, stacked=True, label=list(series), color=[colors.get(k, GREY) for k in series])
    ax.set_xscale("log")
    ax.set_xlabel(xlabel + " (leftmost bar: 0)")
    ax.legend(fontsize=8)


def reconnects(delays: dict[str, list[float]], recovery: list[float]) -> bytes | None:
    """Dial delays by result beside the recovery time of breaks; None when both are empty."""
    if not any(delays.values()) and not recovery:
        return None
    return _png(reconnects_figure(delays, recovery))


def reconnects_figure(delays: dict[str, list[float]], recovery: list[float]) -> Figure:
    """The two panels of ``reconnects``; an empty one says "nothing to plot"."""
    fig = Figure(figsize=(10, 3.4))
    left, right = fig.subplots(1, 2)
    if any(delays.values()):
        log_histogram(left, delays, RESULT_COLORS, "delay before the attempt, s")
    else:
        nothing_to_plot(left)
    left.set_title("Dial attempts by delay and result")
    if recovery:
        log_histogram(right, {"breaks": recovery}, {"breaks": BLUE}, "break to data flowing again, s")
    else:
        nothing_to_plot(right)
    right.set_title("Time to recover from a break")
    return fig


def nothing_to_plot(ax) -> None:
    """An empty panel says so instead of drawing empty axes."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, "nothing to plot", ha="center", va="center", transform=ax.transAxes, color=GREY)


def round_trips(samples: list[float], p50: float | None, p99: float | None, source: str) -> bytes | None:
    if not samples:
        return None
    fig = Figure(figsize=(10, 3))
    ax = fig.add_subplot()
    log_histogram(ax, {f"{source} round trips": samples}, {f"{source} round trips": BLUE}, "seconds")
    for value, name in ((p50, "p50"), (p99, "p99")):
        if value:
            ax.axvline(value, color=RED, linestyle="--")
            ax.text(value, ax.get_ylim()[1] * 0.9, f" {name} {value * 1000:.1f} ms", color=RED, fontsize=8)
    ax.set_title(f"Round-trip distribution ({source})")
    return _png(fig)


def shares(points: list[dict]) -> bytes | None:
    """``{"priority_share", "bandwidth_share", "priority", "bytes"}`` per link channel."""
    if not points:
        return None
    fig = Figure(figsize=(5, 4.6))
    ax = fig.add_subplot()
    biggest = max(p["bytes"] for p in points) or 1
    scatter = ax.scatter(
        [p["priority_share"] for p in points],
        [p["bandwidth_share"] for p in points],
        s=[12 + 120 * p["bytes"] / biggest for p in points],
        c=[p["priority"] for p in points],
        cmap="viridis",
        alpha=0.7,
    )
    ax.plot([0, 1], [0, 1], color=GREY, linestyle="--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("priority share (what the scheduler promises)")
    ax.set_ylabel("bandwidth share (what was sent)")
    ax.set_title("Contended links: bandwidth against priority")
    fig.colorbar(scatter, ax=ax, label="priority")
    return _png(fig)


def bars(rows: list[tuple[str, dict[str, float]]], colors: dict, title: str, xlabel: str) -> bytes | None:
    """Horizontal stacked bars: ``[(label, {part: value})]``, first row on top."""
    if not rows:
        return None
    return _png(bars_figure(rows, colors, title, xlabel))


#: Rows of height a bar chart has at least: with fewer, the bars keep their thickness
#: and the chart its proportions instead of one bar filling the axes.
MIN_BAR_ROWS = 4
#: Inches per row of a bar chart; for its title and axis; for its legend (below the axis).
BAR_ROW_INCHES, BAR_FRAME_INCHES, BAR_LEGEND_INCHES = 0.3, 0.75, 0.3


def bars_figure(rows: list[tuple[str, dict[str, float]]], colors: dict, title: str, xlabel: str) -> Figure:
    """The figure of ``bars``: its height grows with the rows, at least MIN_BAR_ROWS of them."""
    slots = max(len(rows), MIN_BAR_ROWS)
    parts = list(dict.fromkeys(part for _, values in rows for part in values))
    frame = BAR_FRAME_INCHES + (BAR_LEGEND_INCHES if len(parts) > 1 else 0)
    fig = Figure(figsize=(5, BAR_ROW_INCHES * slots + frame), layout="constrained")
    ax = fig.add_subplot()
    left = [0.0] * len(rows)
    for part in parts:
        widths = [values.get(part, 0) for _, values in rows]
        ax.barh(range(len(rows)), widths, left=left, label=part, color=colors.get(part, GREY))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.set_ylim(slots - 0.5, -0.5)  # first row on top; empty slots below a short list
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if len(parts) > 1:  # below the axes, where it hides no bar
        fig.legend(fontsize=8, loc="outside lower center", ncol=len(parts), frameon=False)
    return fig
