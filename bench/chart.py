"""The current figures as a chart (bench/ratios.png) and as bench/RESULTS.md's table.

Reads bench/current.json, the newest measurement of each figure. The chart's upper panel
has the figures whose target bounds the ratio mconn/raw, each bar against its own target;
the lower one the figures whose target bounds the value itself, as value / bound, so 1 is
the target for every bar. ``--markdown`` prints the table RESULTS.md holds.

Before drawing, every figure is checked: its source section must be a heading of the
history file it names, and its result must say PASS or MISS as its target decides.
"""

from __future__ import annotations

import argparse
import json
import operator
import pathlib

BENCH = pathlib.Path(__file__).resolve().parent
COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt, ">": operator.gt}


def measured(fig: dict) -> float:
    """What the target bounds: the ratio mconn/raw or the value."""
    return fig[fig["target"]["on"]]


def passes(fig: dict) -> bool:
    target = fig["target"]
    return COMPARE[target["compare"]](measured(fig), target["bound"])


def check(figures: list[dict]) -> None:
    """Refuse a figure whose source heading is gone or whose result its target contradicts."""
    for fig in figures:
        src = fig["source"]
        headings = [line for line in (BENCH / src["file"]).read_text().splitlines() if line.startswith("#")]
        if not any(src["section"] in h for h in headings):
            raise SystemExit(f"{fig['figure']}: no heading of {src['file']} contains {src['section']!r}")
        if fig["target"] is not None:
            verdict = "PASS" if passes(fig) else "MISS"
            if not fig["result"].startswith(verdict):
                raise SystemExit(f"{fig['figure']}: the target says {verdict}, the result {fig['result']!r}")


def shown_value(fig: dict) -> str:
    parts = []
    if fig["value"] is not None:
        value = f"{fig['value']:,}" if isinstance(fig["value"], int) else str(fig["value"])
        parts.append(f"{value} {fig['unit']}".strip())
    if fig["ratio"] is not None:
        parts.append(f"{fig['ratio']:.3f} of raw")
    return parts[0] if len(parts) == 1 else f"{parts[0]} ({parts[1]})"


def shown_target(fig: dict) -> str:
    target = fig["target"]
    if target is None:
        return "-"
    unit = "of raw" if target["on"] == "ratio" else fig["unit"]
    return f"{target['compare']} {target['bound']:g} {unit}".strip()


def markdown(figures: list[dict]) -> str:
    rows = ["| figure | value | target | result | measured | command | from |", "|---|---|---|---|---|---|---|"]
    for fig in figures:
        src = fig["source"]
        cells = [
            fig["figure"],
            shown_value(fig),
            shown_target(fig),
            fig["result"],
            fig["date"],
            f"`{fig['command']}`",
            f'[{pathlib.Path(src["file"]).name}]({src["file"]}), "{src["section"]}"',
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def panel(ax, figures: list[dict], of_bound: bool) -> None:
    """Horizontal bars, one per figure, each with its target drawn across it."""
    names = [f["figure"] for f in figures]
    ys = range(len(figures))[::-1]
    for y, fig in zip(ys, figures, strict=True):
        bound = fig["target"]["bound"]
        length = measured(fig) / bound if of_bound else measured(fig)
        mark = 1.0 if of_bound else bound
        ax.barh(y, length, height=0.6, color="#4c9a5b" if passes(fig) else "#c0504d")
        ax.plot([mark, mark], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.annotate(
            f"{shown_value(fig)}; target {shown_target(fig)}",
            (max(length, mark), y),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.set_xlim(0, 1.9)
    ax.grid(axis="x", alpha=0.3)


def draw(figures: list[dict], out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    on_ratio = [f for f in figures if f["target"] and f["target"]["on"] == "ratio"]
    on_value = [f for f in figures if f["target"] and f["target"]["on"] == "value"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), height_ratios=[len(on_ratio), len(on_value)])
    panel(top, on_ratio, of_bound=False)
    top.set_title("mconn / raw Twisted, measured in the same run (black: the target; green passes)", fontsize=10)
    top.set_xlabel("mconn / raw")
    panel(bottom, on_value, of_bound=True)
    bottom.set_title("figures with a bound of their own: value / bound (black: 1, the bound)", fontsize=10)
    bottom.set_xlabel("value / bound")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, default=BENCH / "current.json")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH / "ratios.png")
    parser.add_argument("--markdown", action="store_true", help="print RESULTS.md's table instead of drawing")
    args = parser.parse_args()
    figures = json.loads(args.json.read_text())["figures"]
    check(figures)
    if args.markdown:
        print(markdown(figures))
    else:
        draw(figures, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
