"""The sync-health page's charts: inline SVG drawn on the server, no script, no external file.

Colours are CSS classes of the page's one style sheet (so the light and dark themes recolour them);
every mark carries its data point in ``data-*`` attributes and a ``<title>`` (the browser's tooltip),
and a mark that stands for one run links to that run's detail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from airflow_provider_bos.plugins.health_queries import COUNT_SERIES, RUN_STATUSES

__all__ = ["counts_chart", "coverage_chart", "rows_bar", "source_bar", "sparkline", "timeline_chart"]

WIDTH = 1160
LEFT = 118
RIGHT = 16


def _n(value: float) -> str:
    """A coordinate: two decimals at most, no trailing zeros."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _attr(name: str, value: Any) -> str:
    return f' {name}="{escape("" if value is None else str(value))}"'


def _label_every(count: int, room: float, width: float = 64.0) -> int:
    """Label every k-th of ``count`` slots ``room`` wide so that labels ``width`` wide do not overlap."""
    per = room / max(count, 1)
    return max(1, int(width // per) + (1 if width % per else 0)) if per < width else 1


def timeline_chart(timeline: Sequence[Mapping[str, Any]], *, height: int = 190) -> str:
    """Runs per day, stacked by status (complete, partial, failed), one column per day of the window."""
    top, bottom = 14, 34
    plot_h = height - top - bottom
    room = WIDTH - LEFT - RIGHT
    slot = room / max(len(timeline), 1)
    bar = max(2.0, slot * 0.72)
    peak = max([sum(int(d.get(s) or 0) for s in RUN_STATUSES) for d in timeline] + [1])
    every = _label_every(len(timeline), room)
    parts = [(f'<svg class="chart timeline" viewBox="0 0 {WIDTH} {height}" role="img" '
              'aria-label="Runs per day by status">'),
             f'<line class="axis" x1="{LEFT}" y1="{top + plot_h}" x2="{WIDTH - RIGHT}" y2="{top + plot_h}"/>',
             f'<text class="tick" x="{LEFT - 8}" y="{top + 4}" text-anchor="end">{peak}</text>',
             f'<text class="tick" x="{LEFT - 8}" y="{top + plot_h}" text-anchor="end">0</text>',
             f'<text class="ylabel" x="8" y="{top + plot_h / 2}">runs</text>']
    for i, day in enumerate(timeline):
        x = LEFT + i * slot + (slot - bar) / 2
        counts = {s: int(day.get(s) or 0) for s in RUN_STATUSES}
        parts.append(f'<g class="day"{_attr("data-day", day["day"])}'
                     + "".join(_attr(f"data-{s}", counts[s]) for s in RUN_STATUSES) + ">")
        y: float = top + plot_h
        for status in RUN_STATUSES:
            if not counts[status]:
                continue
            h = plot_h * counts[status] / peak
            y -= h
            parts.append(f'<rect class="bar st-{status}" x="{_n(x)}" y="{_n(y)}" width="{_n(bar)}" '
                         f'height="{_n(h)}"{_attr("data-status", status)}{_attr("data-count", counts[status])}>'
                         f"<title>{escape(day['day'])}: {counts[status]} {status}</title></rect>")
        if i % every == 0:
            parts.append(f'<text class="tick" x="{_n(x + bar / 2)}" y="{height - 12}" text-anchor="middle">'
                         f"{escape(str(day['day'])[5:])}</text>")
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def sparkline(timeline: Sequence[Mapping[str, Any]], *, width: int = 220, height: int = 36) -> str:
    """The timeline in little, for the overview (no labels)."""
    slot = width / max(len(timeline), 1)
    bar = max(1.0, slot * 0.7)
    peak = max([sum(int(d.get(s) or 0) for s in RUN_STATUSES) for d in timeline] + [1])
    parts = [(f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
              'aria-label="Runs per day">')]
    for i, day in enumerate(timeline):
        y: float = height - 2
        parts.append(f'<g class="day"{_attr("data-day", day["day"])}>')
        for status in RUN_STATUSES:
            count = int(day.get(status) or 0)
            if count:
                h = (height - 4) * count / peak
                y -= h
                parts.append(f'<rect class="st-{status}" x="{_n(i * slot)}" y="{_n(y)}" width="{_n(bar)}" '
                             f'height="{_n(h)}"><title>{escape(day["day"])}: {count} {status}</title></rect>')
        parts.append("</g>")
    parts.append(f'<line class="axis" x1="0" y1="{height - 2}" x2="{width}" y2="{height - 2}"/></svg>')
    return "".join(parts)


def counts_chart(points: Sequence[Mapping[str, Any]], *, mode: str,
                 run_href: Callable[[str], str] | None = None) -> str:
    """What each run did, one row per count (inserted ... rejected), one bar per run (or per day)."""
    row_h, gap, top, bottom = 40, 8, 6, 28
    height = top + len(COUNT_SERIES) * (row_h + gap) + bottom
    room = WIDTH - LEFT - RIGHT
    slot = room / max(len(points), 1)
    bar = max(2.0, min(slot * 0.72, 40.0))
    every = _label_every(len(points), room)
    parts = [(f'<svg class="chart counts" viewBox="0 0 {WIDTH} {height}" role="img" '
              f'aria-label="Counts per {"run" if mode == "run" else "day"}">')]
    for k, series in enumerate(COUNT_SERIES):
        y0 = top + k * (row_h + gap)
        values = [p.get(series) for p in points]
        peak = max([int(v) for v in values if v is not None] + [1])
        parts.append(f'<g class="series"{_attr("data-series", series)}{_attr("data-max", peak)}>'
                     f'<text class="slabel" x="8" y="{y0 + row_h / 2 + 4}">{series}</text>'
                     f'<text class="tick" x="{LEFT - 8}" y="{y0 + 10}" text-anchor="end">{peak}</text>'
                     f'<line class="axis" x1="{LEFT}" y1="{y0 + row_h}" x2="{WIDTH - RIGHT}" y2="{y0 + row_h}"/>')
        for i, point in enumerate(points):
            value = point.get(series)
            x = LEFT + i * slot + (slot - bar) / 2
            h = (row_h - 4) * int(value) / peak if value else 0.0
            what = (f"run {point.get('run_id')}" if mode == "run" else f"{point.get('day')} ({point.get('runs')} runs)")
            title = f"{series}: {'-' if value is None else value}, {what}"
            mark = (f'<rect class="bar c-{series}" x="{_n(x)}" y="{_n(y0 + row_h - h)}" width="{_n(bar)}" '
                    f'height="{_n(max(h, 0.0))}"{_attr("data-series", series)}{_attr("data-value", value)}'
                    f'{_attr("data-run-id", point.get("run_id"))}{_attr("data-day", point.get("day"))}>'
                    f"<title>{escape(title)}</title></rect>")
            if mode == "run" and run_href and point.get("run_id"):
                mark = f'<a href="{escape(run_href(str(point["run_id"])))}">{mark}</a>'
            parts.append(mark)
        parts.append("</g>")
    axis_y = top + len(COUNT_SERIES) * (row_h + gap) + 14
    for i, point in enumerate(points):
        if i % every == 0:
            x = LEFT + i * slot + slot / 2
            label = str(point.get("day") or "")[5:]
            if mode == "run" and point.get("finished_at"):
                label = str(point["finished_at"])[5:16].replace("T", " ")
            parts.append(f'<text class="tick" x="{_n(x)}" y="{axis_y}" text-anchor="middle">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def coverage_chart(points: Sequence[Mapping[str, Any]], columns: Sequence[str], thresholds: Mapping[str, float],
                   *, run_href: Callable[[str], str] | None = None, height: int = 230) -> str:
    """Each watched column's share of the run's records that had a value, over the runs (0-100 %),
    with a dashed line at each ``min_coverage`` threshold the DAG's sensor sets."""
    top, bottom = 14, 30
    plot_h = height - top - bottom
    room = WIDTH - LEFT - RIGHT
    slot = room / max(len(points), 1)
    every = _label_every(len(points), room)

    def y_of(share: float) -> float:
        return top + plot_h * (1 - share)

    parts = [(f'<svg class="chart coverage" viewBox="0 0 {WIDTH} {height}" role="img" '
              'aria-label="Coverage per watched column">')]
    parts.extend(f'<line class="grid" x1="{LEFT}" y1="{_n(y_of(share))}" x2="{WIDTH - RIGHT}" '
                 f'y2="{_n(y_of(share))}"/><text class="tick" x="{LEFT - 8}" y="{_n(y_of(share) + 4)}" '
                 f'text-anchor="end">{int(share * 100)}%</text>' for share in (0.0, 0.5, 1.0))
    for c, column in enumerate(columns):
        if column in thresholds:
            y = y_of(thresholds[column])
            parts.append(f'<line class="threshold cov-{c % 8}" x1="{LEFT}" y1="{_n(y)}" x2="{WIDTH - RIGHT}" '
                         f'y2="{_n(y)}"{_attr("data-column", column)}{_attr("data-threshold", thresholds[column])}>'
                         f"<title>{escape(column)}: min_coverage {thresholds[column]:.0%}</title></line>"
                         f'<text class="tlabel cov-{c % 8}" x="{WIDTH - RIGHT - 4}" y="{_n(y - 4)}" '
                         f'text-anchor="end">{escape(column)} min {thresholds[column]:.0%}</text>')
    for c, column in enumerate(columns):
        marks, line = [], []
        for i, point in enumerate(points):
            filled, records = point["columns"].get(column), point.get("records")
            if filled is None or not records:
                continue
            share = min(max(filled / records, 0.0), 1.0)
            x, y = LEFT + i * slot + slot / 2, y_of(share)
            line.append(f"{_n(x)},{_n(y)}")
            mark = (f'<circle class="point cov-{c % 8}" cx="{_n(x)}" cy="{_n(y)}" r="4"{_attr("data-column", column)}'
                    f'{_attr("data-run-id", point.get("run_id"))}{_attr("data-day", point.get("day"))}'
                    f'{_attr("data-filled", filled)}{_attr("data-records", records)}'
                    f'{_attr("data-ratio", round(filled / records, 6))}>'
                    f"<title>{escape(column)}: {filled} of {records} ({share:.1%}), {escape(str(point.get('day')))}"
                    "</title></circle>")
            if run_href and point.get("run_id"):
                mark = f'<a href="{escape(run_href(str(point["run_id"])))}">{mark}</a>'
            marks.append(mark)
        if line:
            parts.append(f'<polyline class="line cov-{c % 8}" points="{" ".join(line)}"/>')
        parts.extend(marks)
    for i, point in enumerate(points):
        if i % every == 0:
            label = str(point.get("finished_at") or point.get("day") or "")[5:16].replace("T", " ")
            parts.append(f'<text class="tick" x="{_n(LEFT + i * slot + slot / 2)}" y="{height - 10}" '
                         f'text-anchor="middle">{escape(label)}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><svg viewBox="0 0 14 14" width="14" height="14"><rect class="swatch '
                     f'cov-{c % 8}" width="14" height="14" rx="3"/></svg>{escape(column)}</span>'
                     for c, column in enumerate(columns))
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def rows_bar(current: int, retired: int | None, *, width: int = 520, height: int = 26) -> str:
    """The records table now: current rows against retired ones (counts only)."""
    total = max(current + (retired or 0), 1)
    w_current = width * current / total
    return (f'<svg class="rowsbar" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
            f'aria-label="Current and retired rows"{_attr("data-current", current)}{_attr("data-retired", retired)}>'
            f'<rect class="r-current" x="0" y="0" width="{_n(w_current)}" height="{height}"><title>{current} current'
            f'</title></rect><rect class="r-retired" x="{_n(w_current)}" y="0" width="{_n(width - w_current)}" '
            f'height="{height}"><title>{retired if retired is not None else "?"} retired</title></rect></svg>')


def source_bar(failed: int, runs: int, *, width: int = 240, height: int = 14) -> str:
    share = failed / runs if runs else 0.0
    return (f'<svg class="srcbar" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="Share of runs this source failed in"><rect class="track" width="{width}" height="{height}" '
            f'rx="3"/><rect class="st-failed" width="{_n(width * min(share, 1.0))}" height="{height}" rx="3"/></svg>')
