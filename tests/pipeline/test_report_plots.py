"""The report's plots draw no empty axes (an empty panel says "nothing to plot"), and keep their proportions."""

import io

import pytest

from mconn.pipeline import plots


def test_recovery_panel_without_breaks_says_nothing_to_plot():
    """Dial delays without any break: the recovery panel is blank with the words, the delay panel is drawn."""
    fig = plots.reconnects_figure({"connected": [0.0, 0.5], "failed": [1.0]}, [])
    delays, recovery = fig.axes[:2]
    assert [t.get_text() for t in recovery.texts] == ["nothing to plot"] and not recovery.axison
    assert recovery.get_title() == "Time to recover from a break"
    assert delays.axison and delays.patches and not delays.texts


def test_delay_panel_without_dial_delays_says_nothing_to_plot():
    """Recovery times without a dial delay: the delay panel is the blank one."""
    fig = plots.reconnects_figure({}, [1.5, 2.5])
    delays, recovery = fig.axes[:2]
    assert [t.get_text() for t in delays.texts] == ["nothing to plot"] and not delays.axison
    assert recovery.axison and recovery.patches


def test_no_reconnects_at_all_is_no_figure():
    """With neither, there is no figure: the report prints its own "nothing to plot" line."""
    assert plots.reconnects({}, []) is None
    assert plots.reconnects({"connected": [0.1]}, [])[:8] == b"\x89PNG\r\n\x1a\n"


def bar_thickness(fig) -> float:
    """The drawn height of the first bar, in inches (the figure laid out by a save first)."""
    fig.savefig(io.BytesIO(), format="png")
    bar = fig.axes[0].patches[0]
    return bar.get_window_extent().height / fig.dpi


def test_a_short_bar_chart_keeps_its_proportions():
    """One row draws a bar as thick as one of ten, in a figure no taller than four rows need: one bar does not
    fill the axes."""
    one = plots.bars_figure([("a - b", {"breaks": 2})], {}, "Most unstable links", "count")
    ten = plots.bars_figure([(f"{i}", {"breaks": i + 1}) for i in range(10)], {}, "Most unstable links", "count")
    assert bar_thickness(one) == pytest.approx(bar_thickness(ten), rel=0.05)
    assert bar_thickness(one) == pytest.approx(0.8 * plots.BAR_ROW_INCHES, rel=0.1)  # barh's 0.8 of a row
    width, height = one.get_size_inches()
    assert height == pytest.approx(plots.BAR_ROW_INCHES * plots.MIN_BAR_ROWS + plots.BAR_FRAME_INCHES)
    assert height < width
