"""HTML of the sync-health page: server-rendered, every value escaped, charts as inline SVG.

One inline style sheet (allowed by hash in the page's Content-Security-Policy), no script, nothing
loaded from anywhere. Airflow's state colours (success, upstream_failed, failed, up_for_retry, none,
as its UI's tokens define them), a light and a dark theme (``prefers-color-scheme``), and a layout
that fits 1280 px.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from airflow_provider_bos.plugins.health_access import HEALTH_PERMISSION_NOTE
from airflow_provider_bos.plugins.health_charts import (
    counts_chart,
    coverage_chart,
    rows_bar,
    source_bar,
    sparkline,
    timeline_chart,
)
from airflow_provider_bos.plugins.health_queries import COUNT_SERIES, MAX_RUN_POINTS, WINDOWS, Window
from airflow_provider_bos.plugins.health_views import TableView

__all__ = ["health_policy", "overview_page", "run_page", "table_page", "task_log_url"]

# Airflow 3's UI tokens (light / dark): its state colours are each palette's 600 in both themes.
_STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:oklch(0.23185 0.0323 266.44);--muted:oklch(0.45 0.055 251);
--border:oklch(0.915 0.01 253);--panel:oklch(0.985 0.004 253);--grid:oklch(0.915 0.01 253);
--link:oklch(0.546 0.245 262.881);--success:oklch(0.47 0.2 149);--failed:oklch(0.577 0.245 27.325);
--upstream-failed:oklch(0.666 0.179 58.318);--up-for-retry:oklch(0.681 0.162 75.834);
--none:oklch(0.63 0.042 252);--retired:oklch(0.75 0.025 252);--current:oklch(0.469 0.084 257.657);
--c0:oklch(0.546 0.245 262.881);--c1:oklch(0.609 0.126 221.723);--c2:oklch(0.558 0.288 302.321);
--c3:oklch(0.592 0.249 0.584);--c4:oklch(0.648 0.2 131.684);--c5:oklch(0.6 0.118 184.704);
--c6:oklch(0.511 0.262 276.966);--c7:oklch(0.553 0.195 38.402)}
@media (prefers-color-scheme:dark){:root{--bg:oklch(0.11 0.025 251);--fg:oklch(0.985 0.004 253);
--muted:oklch(0.75 0.025 252);--border:oklch(0.28 0.035 251);--panel:oklch(0.18 0.03 251);
--grid:oklch(0.28 0.035 251);--link:oklch(0.707 0.165 254.624);--retired:oklch(0.45 0.055 251);
--current:oklch(0.705 0.066 256.378);--c0:oklch(0.707 0.165 254.624);--c1:oklch(0.789 0.154 211.53);
--c2:oklch(0.714 0.203 305.504);--c3:oklch(0.718 0.202 349.761);--c4:oklch(0.841 0.238 128.85);
--c5:oklch(0.777 0.152 181.912);--c6:oklch(0.673 0.182 276.935);--c7:oklch(0.75 0.183 55.934)}}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:var(--bg);color:var(--fg);
font-size:14px;line-height:1.45}
main{max-width:1240px;margin:0 auto;padding:20px 20px 40px}
a{color:var(--link);text-decoration:none} a:hover{text-decoration:underline}
h1{font-size:1.45rem;margin:0 0 4px} h2{font-size:1.08rem;margin:26px 0 8px}
.crumbs{color:var(--muted);font-size:.85rem;margin-bottom:10px}
.muted{color:var(--muted)} .small{font-size:.82rem}
.windows{margin:10px 0 16px;display:flex;gap:6px;align-items:center}
.windows a,.windows span.on{border:1px solid var(--border);border-radius:6px;padding:3px 10px;font-size:.85rem}
.windows span.on{background:var(--fg);color:var(--bg);border-color:var(--fg)}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid var(--border);padding:8px 10px;text-align:left;vertical-align:middle}
th{font-size:.78rem;text-transform:uppercase;letter-spacing:.03em;color:var(--muted);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:999px;padding:1px 10px;font-size:.8rem;font-weight:600;color:#fff;
white-space:nowrap;background:var(--none)}
.b-complete,.b-on-time{background:var(--success)} .b-failed,.b-error{background:var(--failed)}
.b-partial{background:var(--upstream-failed)} .b-delayed{background:var(--up-for-retry)}
.cards{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:14px}
.card{border:1px solid var(--border);border-radius:8px;padding:12px 14px;background:var(--panel)}
.card h3{margin:0 0 8px;font-size:.8rem;text-transform:uppercase;letter-spacing:.03em;color:var(--muted)}
.panel{border:1px solid var(--border);border-radius:8px;padding:10px 12px;background:var(--panel)}
.notice{border:1px solid var(--border);border-left:4px solid var(--up-for-retry);padding:8px 12px;margin:10px 0;
background:var(--panel)}
.unreachable{border-left-color:var(--failed)}
svg.chart{width:100%;height:auto;display:block} svg.rowsbar{width:100%;height:26px;display:block;border-radius:4px}
svg text{fill:var(--muted);font-size:12px;font-family:inherit} svg .slabel{fill:var(--fg);font-size:12.5px}
svg .ylabel{font-size:11px}
svg .axis{stroke:var(--border);stroke-width:1} svg .grid{stroke:var(--grid);stroke-width:1;stroke-dasharray:2 4}
.st-complete{fill:var(--success)} .st-partial{fill:var(--upstream-failed)} .st-failed{fill:var(--failed)}
svg .track{fill:var(--border)} svg a rect:hover,svg a circle:hover{opacity:.75}
.c-inserted{fill:var(--c0)} .c-updated{fill:var(--c1)} .c-unchanged{fill:var(--none)} .c-retired{fill:var(--c7)}
.c-superseded{fill:var(--c2)} .c-withheld{fill:var(--c6)} .c-rejected{fill:var(--failed)}
.r-current{fill:var(--current)} .r-retired{fill:var(--retired)}
svg .line{fill:none;stroke-width:2} svg .threshold{stroke-width:1.5;stroke-dasharray:6 4}
svg .point{stroke:var(--bg);stroke-width:1.5} svg .tlabel{font-size:11px}
.cov-0{fill:var(--c0);stroke:var(--c0)} .cov-1{fill:var(--c1);stroke:var(--c1)} .cov-2{fill:var(--c2);stroke:var(--c2)}
.cov-3{fill:var(--c3);stroke:var(--c3)} .cov-4{fill:var(--c4);stroke:var(--c4)} .cov-5{fill:var(--c5);stroke:var(--c5)}
.cov-6{fill:var(--c6);stroke:var(--c6)} .cov-7{fill:var(--c7);stroke:var(--c7)}
svg .line.cov-0,svg .line.cov-1,svg .line.cov-2,svg .line.cov-3,svg .line.cov-4,svg .line.cov-5,svg .line.cov-6,
svg .line.cov-7,svg .threshold{fill:none} svg .tlabel{stroke:none} svg .swatch{stroke:none}
.legend{display:flex;gap:14px;flex-wrap:wrap;margin:4px 0 6px;font-size:.85rem}
.legend .key{display:inline-flex;gap:6px;align-items:center}
.legend .st{display:inline-block;width:12px;height:12px;border-radius:3px}
.legend .st.complete{background:var(--success)} .legend .st.partial{background:var(--upstream-failed)}
.legend .st.failed{background:var(--failed)} .legend .st.current{background:var(--current)}
.legend .st.retired{background:var(--retired)}
dl.words{display:grid;grid-template-columns:200px 1fr;gap:6px 14px;margin:0}
dl.words dt{color:var(--muted)} dl.words dd{margin:0}
p.prose{max-width:980px}
pre.notes,pre.error{white-space:pre-wrap;font-family:inherit;margin:0}
"""


def health_policy() -> str:
    """The page's Content-Security-Policy: its one style sheet, nothing else, never framed."""
    digest = base64.b64encode(hashlib.sha256(_STYLE.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; style-src 'sha256-{digest}'; img-src 'self'; frame-ancestors 'none'; "
            "base-uri 'none'; form-action 'none'")


def _layout(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="referrer" content="same-origin"><style>{_STYLE}</style></head>'
            f"<body><main>{body}</main></body></html>")


def _when(moment: Any, now: datetime | None = None) -> str:
    if not isinstance(moment, datetime):
        return "-"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if now is not None:
        text += f" ({_ago(now - moment)})"
    return text


def _ago(delta: Any) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _status(status: str | None) -> str:
    word = status or "-"
    return f'<span class="badge b-{escape(word)}" data-status="{escape(word)}">{escape(word)}</span>'


def _state(state: str | None, detail: str = "") -> str:
    if not state:
        return '<span class="muted">-</span>'
    slug = state.lower().replace(" ", "-")
    return (f'<span class="badge b-{slug}" data-state="{escape(state)}" title="{escape(detail)}">{escape(state)}'
            "</span>")


def task_log_url(ui_base: str, dag_id: str, airflow_run_id: str, task_id: str) -> str:
    """The Airflow 3 UI's page of one task instance (its Logs tab): /dags/{dag}/runs/{run}/tasks/{task}."""
    return (f"{ui_base}/dags/{quote(dag_id, safe='')}/runs/{quote(airflow_run_id, safe='')}"
            f"/tasks/{quote(task_id, safe='')}")


def _task_link(ui_base: str, run: Mapping[str, Any]) -> str:
    dag, task, airflow_run = run.get("dag_id"), run.get("task_id"), run.get("airflow_run_id")
    if not dag:
        return '<span class="muted">outside Airflow</span>'
    who = f"{escape(dag)} / {escape(task or '-')}"
    if task and airflow_run:
        url = task_log_url(ui_base, dag, airflow_run, task)
        return f'<a class="task-log" href="{escape(url)}" title="The task instance and its log">{who}</a>'
    return who


def _windows(days: int, href: Callable[[int], str]) -> str:
    items = "".join(f'<span class="on">{w} days</span>' if w == days else f'<a href="{escape(href(w))}">{w} days</a>'
                     for w in WINDOWS)
    return f'<nav class="windows" aria-label="Window"><span class="muted small">Window:</span>{items}</nav>'


def _legend() -> str:
    return ('<div class="legend">' + "".join(
        f'<span class="key"><span class="st {s}"></span>{s}</span>' for s in ("complete", "partial", "failed"))
        + "</div>")


class Links:
    """The page's own URLs (under the plugin's mount) and the Airflow UI's."""

    def __init__(self, home: str, ui_base: str, days: int) -> None:
        self.home, self.ui_base, self.days = home, ui_base, days

    def overview(self, days: int | None = None) -> str:
        return f"{self.home}health/?window={days or self.days}"

    def table(self, key: str, days: int | None = None) -> str:
        return f"{self.home}health/tables/{key}?window={days or self.days}"

    def run(self, key: str, run_id: str) -> str:
        return f"{self.home}health/tables/{key}/runs/{quote(run_id, safe='')}?window={self.days}"


def overview_page(views: Sequence[TableView], *, window: Window, links: Links,
                  unlocatable: Sequence[tuple[str, str]] = ()) -> str:
    rows = []
    for view in views:
        d, health = view.destination, view.health
        name = (f'<a href="{escape(links.table(d.key))}" data-key="{escape(d.key)}">{escape(d.label)}</a>'
                f'<div class="muted small">{escape(d.conn_id)} / {escape(d.audit_table)}</div>')
        if view.error or health is None:
            badge = ('<span class="badge" data-state="No runs">No runs</span>' if view.no_audit_table else
                     '<span class="badge b-error" data-state="Unreachable">Unreachable</span>')
            rows.append(f'<tr data-table="{escape(d.label)}" data-conn-id="{escape(d.conn_id)}"><td>{name}</td>'
                        f'<td colspan="5">{badge} <span class="small muted">{escape(view.error or "")}</span>'
                        "</td></tr>")
            continue
        latest = health.latest
        state = view.state
        rows.append(
            f'<tr data-table="{escape(d.label)}" data-conn-id="{escape(d.conn_id)}"><td>{name}</td>'
            f"<td>{_status(latest['status']) if latest else '<span class=muted>no run</span>'}"
            f'<div class="muted small">{_when(latest["finished_at"], window.now) if latest else ""}</div></td>'
            f'<td class="num">{_duration(latest["duration_s"]) if latest else "-"}</td>'
            f"<td>{_task_link(links.ui_base, latest) if latest else '-'}</td>"
            f"<td>{_state(state.state, state.detail) if state else _state(None)}"
            f'<div class="muted small">{escape(state.detail) if state else "no DAG writes it"}</div></td>'
            f'<td><a href="{escape(links.table(d.key))}">{sparkline(health.timeline)}</a>'
            f'<div class="muted small">{health.runs_in_window} runs</div></td></tr>')
    body = "".join(rows) or (
        '<tr><td colspan="6" class="muted">No destination table you may see: no DAG you may read has a '
        "BosFederatedReadOperator task, and no destination is listed for you.</td></tr>")
    hidden = ""
    if unlocatable:
        tasks = ", ".join(f"{escape(dag)}.{escape(task)}" for dag, task in unlocatable)
        hidden = (f'<div class="notice">These BOS read tasks write a table the page cannot locate (their '
                  f"destination connection is not in the serialized DAG): {tasks}. List them in [bos] "
                  "health_destinations.</div>")
    content = f"""<div class="crumbs"><a href="{escape(links.ui_base)}/">Airflow</a> / BOS sync health</div>
<h1>BOS sync health</h1>
<p class="muted">Every table BOS syncs write that you may see: its latest run, whether it is on time against its
DAG's schedule, and its runs per day over the window.</p>
{_windows(window.days, links.overview)}{hidden}
<table class="overview"><thead><tr><th>Destination</th><th>Latest run</th><th class="num">Took</th>
<th>DAG / task</th><th>Schedule</th><th>Runs per day ({window.days} days)</th></tr></thead>
<tbody>{body}</tbody></table>{_legend()}
<p class="muted small">{escape(HEALTH_PERMISSION_NOTE)}</p>"""
    return _layout("BOS sync health", content)


def _rows_card(health: Any) -> str:
    if health.rows is None:
        return f'<p class="muted">{escape(health.rows_error or "not counted")}</p>'
    rows = health.rows
    retired = rows.get("retired")
    return (f'{rows_bar(int(rows["current"] or 0), retired)}<div class="legend"><span class="key"><span '
            f'class="st current"></span>{rows["current"]} current</span><span class="key"><span class="st retired">'
            f'</span>{"?" if retired is None else retired} retired</span>'
            f'<span class="key muted">of which {"?" if rows.get("superseded") is None else rows["superseded"]} '
            "superseded</span></div>")


def _codes(codes: Mapping[str, int]) -> str:
    return ", ".join(f'<span class="code" data-code="{escape(code)}" data-times="{times}">{escape(code)}</span> '
                     f"&times;{times}" for code, times in codes.items())


def _sources(health: Any) -> str:
    if not health.sources:
        return ('<p class="muted sources-none">No source failed in this window (counted from the runs\' '
                "source_errors; a run that failed before its final result names no source: see its notes).</p>")
    runs = max(health.runs_in_window, 1)
    rows = "".join(
        f'<tr class="source" data-source="{escape(s["source_type"])}/{escape(s["source_identity"])}" '
        f'data-runs-failed="{s["runs_failed"]}"><td>{escape(s["source_type"])} / {escape(s["source_identity"])}</td>'
        f'<td>{source_bar(s["runs_failed"], runs)}</td><td class="num">{s["runs_failed"]} of {runs}</td>'
        f"<td>{_codes(s['codes'])}</td></tr>"
        for s in health.sources)
    return ('<table class="sources"><thead><tr><th>Source</th><th>Share of runs failed</th><th class="num">Runs '
            f"failed</th><th>Error codes</th></tr></thead><tbody>{rows}</tbody></table>")


def _recent(health: Any, key: str, links: Links) -> str:
    if not health.recent:
        return '<p class="muted">No run in this window.</p>'
    rows = "".join(
        f'<tr data-run-id="{escape(r["run_id"])}"><td><a href="{escape(links.run(key, r["run_id"]))}">'
        f'{escape(r["run_id"][:8])}</a></td><td>{_status(r["status"])}</td><td>{_when(r["finished_at"])}</td>'
        f'<td class="num">{_duration(r["duration_s"])}</td><td>{_task_link(links.ui_base, r)}</td></tr>'
        for r in health.recent)
    return ('<table class="recent"><thead><tr><th>Run</th><th>Status</th><th>Finished</th><th class="num">Took</th>'
            f"<th>DAG / task (log)</th></tr></thead><tbody>{rows}</tbody></table>")


def table_page(view: TableView, *, window: Window, links: Links) -> str:
    d, health = view.destination, view.health
    head = (f'<div class="crumbs"><a href="{escape(links.ui_base)}/">Airflow</a> / <a href="'
            f'{escape(links.overview())}">BOS sync health</a> / {escape(d.label)}</div>'
            f'<h1>{escape(d.label)}</h1><p class="muted">Connection {escape(d.conn_id)}, audit table '
            f"{escape(d.audit_table)}; written by "
            + (", ".join(f"{escape(dag)}.{escape(task)}" for dag, task in view.writers) or "no DAG (listed in [bos] "
               "health_destinations)") + "</p>")
    window_nav = _windows(window.days, lambda w: links.table(d.key, w))
    if view.error or health is None:
        kind, prefix = ("notice", "") if view.no_audit_table else ("notice unreachable", "Unreachable: ")
        return _layout(f"BOS sync health: {d.label}", head + window_nav
                       + f'<div class="{kind}" role="alert">{prefix}{escape(view.error or "")}</div>')
    latest = health.latest
    latest_html = (
        f"{_status(latest['status'])} <a href=\"{escape(links.run(d.key, latest['run_id']))}\">run "
        f"{escape(latest['run_id'][:8])}</a><dl class=\"words\"><dt>Finished</dt><dd>"
        f"{_when(latest['finished_at'], window.now)}</dd><dt>Took</dt><dd>{_duration(latest['duration_s'])}</dd>"
        f"<dt>DAG / task</dt><dd>{_task_link(links.ui_base, latest)}</dd></dl>"
        if latest else '<p class="muted">No run recorded that you may see.</p>')
    schedule = "".join(
        f'<div class="sched" data-dag-id="{escape(dag)}">{escape(dag)}: {_state(p.state, p.detail)}'
        f'<div class="muted small">{escape(p.detail)}</div></div>' for dag, p in view.per_dag.items()
    ) or '<p class="muted">No DAG you may read writes this table.</p>'
    counts_caption = (
        f"one bar per run ({health.runs_in_window} in the window); click a bar for the run"
        if health.counts_mode == "run" else
        f"per day: the sums of the day's runs ({health.runs_in_window} runs, more than {MAX_RUN_POINTS})")
    coverage = (
        coverage_chart(health.coverage, health.coverage_columns, d.thresholds,
                       run_href=(lambda r: links.run(d.key, r)) if health.coverage_mode == "run" else None)
        if health.coverage else '<p class="muted">No coverage recorded in this window (complete and partial runs '
        "record it; a table whose audit table lacks the column does not).</p>")
    thresholds = ("dashed lines: the min_coverage of the DAG's sensor" if d.thresholds else
                  "no min_coverage threshold is readable from the serialized DAG")
    missing = (f'<div class="notice">The audit table lacks {escape(", ".join(health.missing_columns))} (made by an '
               "earlier release): those counts are empty.</div>" if health.missing_columns else "")
    body = f"""{head}{window_nav}{missing}
<section class="cards">
<div class="card latest"><h3>Latest run</h3>{latest_html}</div>
<div class="card schedule"><h3>Schedule</h3>{schedule}</div>
<div class="card rows"><h3>Rows now</h3>{_rows_card(health)}</div>
</section>
<h2>Runs per day</h2><p class="muted small">{health.runs_in_window} runs in the last {window.days} days, by status.</p>
<div class="panel">{_legend()}{timeline_chart(health.timeline)}</div>
<h2>Counts per {"run" if health.counts_mode == "run" else "day"}</h2>
<p class="muted small">What each run did to the table: {counts_caption}. Each row has its own scale.</p>
<div class="panel">{counts_chart(health.counts, mode=health.counts_mode,
                                 run_href=lambda r: links.run(d.key, r))}</div>
<h2>Coverage per watched column</h2><p class="muted small">The share of each run's records with a value in the
column ({"per run" if health.coverage_mode == "run" else "per day: the day's last run"}); {thresholds}.</p>
<div class="panel">{coverage}</div>
<h2>Source failures</h2><p class="muted small">Per source: in how many of the window's runs it failed, and with
which error code.</p>{_sources(health)}
<h2>Recent runs</h2>{_recent(health, d.key, links)}
<p class="muted small">{escape(HEALTH_PERMISSION_NOTE)}</p>"""
    return _layout(f"BOS sync health: {d.label}", body)


def _coverage_words(coverage: Mapping[str, Any] | None) -> str:
    if not coverage or not isinstance(coverage.get("columns"), Mapping):
        return "none recorded"
    records = coverage.get("records")
    parts = []
    for column, filled in coverage["columns"].items():
        share = f" ({filled / records:.0%})" if isinstance(records, int) and records else ""
        parts.append(f"{escape(str(column))} {escape(str(filled))} of {escape(str(records))}{share}")
    return "; ".join(parts)


def _in_words(run: Mapping[str, Any]) -> str:
    who = (f"task {run['task_id']} of DAG {run['dag_id']} (Airflow run {run['airflow_run_id']})"
           if run.get("dag_id") else "a writer outside Airflow")
    counts = ", ".join(f"{run.get(c) if run.get(c) is not None else 'no count for'} {c}" for c in COUNT_SERIES)
    reported = (f"BOS reported the read {run.get('completeness') or 'without a completeness'} with "
                f"{run.get('result_count') if run.get('result_count') is not None else 'no'} records"
                if run.get("status") != "failed" or run.get("completeness") else
                "no final result was written (the run failed before or while writing)")
    return escape(
        f"This run was written by {who}, read {run.get('tool_name') or 'an unnamed tool'} on connection "
        f"{run.get('conn_id') or '-'} in context {run.get('context_handle') or '-'}, started "
        f"{_when(run.get('started_at'))}, finished {_when(run.get('finished_at'))} after "
        f"{_duration(run.get('duration_s'))}, and is {run.get('status')}: {reported}. In the table: {counts}; "
        f"{run.get('skipped_stale') or 0} records older than the stored rows were skipped and "
        f"{run.get('duplicates') or 0} duplicates resolved. The streamed pages counted "
        f"{run.get('provisional_records') or 0} provisional records on {run.get('provisional_pages') or 0} pages.")


def run_page(view: TableView, run: Mapping[str, Any], *, links: Links) -> str:
    d = view.destination
    errors = "".join(
        f'<tr class="source-error"><td>{escape(e["source_type"])} / {escape(e["source_identity"])}</td>'
        f'<td><span class="code">{escape(e["code"])}</span></td></tr>' for e in run["source_errors"]
    ) or '<tr><td colspan="2" class="muted">None.</td></tr>'
    error, notes = (f'<pre class="{column}">{escape(run[key])}</pre>' if run.get(key) else '<p class="muted">None.</p>'
                    for column, key in (("error", "error_message"), ("notes", "notes")))
    log_link = ""
    if run.get("dag_id") and run.get("task_id") and run.get("airflow_run_id"):
        url = task_log_url(links.ui_base, run["dag_id"], run["airflow_run_id"], run["task_id"])
        log_link = f'<p><a class="task-log" href="{escape(url)}">Open the task instance and its log in Airflow</a></p>'

    counts = "".join(f'<tr><td>{c}</td><td class="num" data-count="{c}">'
                     f'{"-" if run.get(c) is None else run[c]}</td></tr>' for c in COUNT_SERIES)
    body = f"""<div class="crumbs"><a href="{escape(links.ui_base)}/">Airflow</a> /
<a href="{escape(links.overview())}">BOS sync health</a> /
<a href="{escape(links.table(d.key))}">{escape(d.label)}</a> / run</div>
<h1>Run {escape(run["run_id"])} {_status(run.get("status"))}</h1>
<p class="prose run-words">{_in_words(run)}</p>{log_link}
<section class="cards"><div class="card"><h3>Counts</h3><table class="counts">{counts}</table></div>
<div class="card"><h3>Coverage</h3><p class="coverage-words">{_coverage_words(run.get("coverage"))}</p></div>
<div class="card"><h3>When</h3><dl class="words"><dt>Started</dt><dd>{_when(run.get("started_at"))}</dd>
<dt>Finished</dt><dd>{_when(run.get("finished_at"))}</dd><dt>Took</dt><dd>{_duration(run.get("duration_s"))}</dd>
<dt>Confirmed at</dt><dd>{_when(run.get("confirmed_at"))}</dd></dl></div></section>
<h2>Source errors</h2><table class="source-errors"><thead><tr><th>Source</th><th>Error code</th></tr></thead>
<tbody>{errors}</tbody></table>
<h2>Why partial or failed</h2><div class="panel">{error}</div>
<h2>Notes</h2><div class="panel">{notes}</div>
<p class="muted small">These are the audit row's error_message and notes, with quoted text, addresses and
phone-like numbers replaced: the page shows no record value.</p>"""
    return _layout(f"BOS sync health: run {run['run_id']}", body)
