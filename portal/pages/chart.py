"""A bar chart laid out on the server, drawn by a template as inline SVG.

No JavaScript and nothing fetched: the page's Content-Security-Policy allows SVG
presentation attributes (x=, height=, fill=), so the chart is plain markup that any
browser shows and a test can read. Geometry is whole pixels; amounts stay integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.money import format_credits

WIDTH = 720
HEIGHT = 280
LEFT = 72  # room for the value axis labels
RIGHT = 12
TOP = 28  # room for the value axis title above it
BOTTOM = 56  # room for the category labels
MAX_LABELS = 16  # more bars than this: label every n-th so labels never overlap


@dataclass(frozen=True)
class Bar:
    label: str
    value: str  # decimal credits, exactly as the table shows them
    x: int
    y: int
    width: int
    height: int
    label_x: int
    show_label: bool


@dataclass(frozen=True)
class Tick:
    label: str
    y: int


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int  # y of the baseline
    label_y: int
    bars: list[Bar]
    ticks: list[Tick]


def bar_chart(rows: list[tuple[str, int]]) -> BarChart:
    """One bar per (label, micro-credits) row, scaled to the largest; negative rows
    (a group refunded more than it was charged) keep a bar of no height."""
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    baseline = HEIGHT - BOTTOM
    top_value = max([value for _label, value in rows] + [0]) or 1
    slot = plot_width // max(len(rows), 1)
    bar_width = max(1, slot * 7 // 10)
    every = -(-len(rows) // MAX_LABELS) or 1
    bars = []
    for index, (label, value) in enumerate(rows):
        height = max(0, value) * plot_height // top_value
        x = LEFT + index * slot + (slot - bar_width) // 2
        bars.append(
            Bar(
                label=label,
                value=format_credits(value),
                x=x,
                y=baseline - height,
                width=bar_width,
                height=height,
                label_x=x + bar_width // 2,
                show_label=index % every == 0,
            )
        )
    ticks = [
        Tick(format_credits(top_value * step // 4), baseline - plot_height * step // 4) for step in range(5)
    ]
    return BarChart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=WIDTH - RIGHT,
        top=TOP,
        bottom=baseline,
        label_y=baseline + 18,
        bars=bars,
        ticks=ticks,
    )
