"""``bench/run``: plan the measurements, run each in its own process, print ONE table, set the exit code.

Exit status: 0 every selected target passed; 1 a target failed or a measurement it needs errored;
2 nothing failed but some target could not be measured (e.g. our path "not available yet");
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.data import ScenarioParams, final_record_count, scenario
from bench.procs import ChildFailed, ReferenceServerProcess, ReplayProcess, run_child

DIALECTS = ("postgres", "sqlite", "mysql", "duckdb")
P2_DIALECTS = ("postgres", "duckdb")  # the dialects whose sync's peak RSS P2 measures
TARGETS = ("P1", "P2", "P3", "P4")
DEFAULT_URLS = {
    "postgres": os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mysql": os.environ.get("BENCH_MYSQL_URL", "mysql+pymysql://root:@127.0.0.1:3306/test?charset=utf8mb4"),
    # Empty: a DuckDB file in the run's temporary directory (like SQLite's).
    "duckdb": os.environ.get("BENCH_DUCKDB_URL", ""),
}

# Targets (verdicts on medians of interleaved repeats).
P1_VS_COPY = 0.8
P1_VS_NAIVE = 2.0
P1_VS_STAGE_MERGE = 0.6  # a first sync into a table holding as many other rows
P2_MAX_RATIO = 1.3
P2_MAX_MIB = 300.0
P2_FULL_SIZE = 1_000_000
P3_SPEEDUP = 3.0
P3_DUCKDB_SPEEDUP = 2.0  # DuckDB's unchanged re-run against its first sync
P3_CHURN_RATIO = 1.3  # a full re-run with 1 % changed and 1 % gone, against the re-stamped re-run
P3_RESTAMPED_SPEEDUP = 2.0  # nobody changed, every observed_at moved: against the first sync
# --pii: a first sync under the personal-data policy against the same sync without one, and its
# unchanged re-run against that first sync.
PII_VS_PLAIN = 0.9
PII_RERUN_SPEEDUP = 2.0
P4_MB_S = 200.0
OTHER_VS_RAW = 0.5  # SQLite and MariaDB first syncs against their raw bulk baselines


@dataclass
class Row:
    """One line of the table."""

    target: str  # "P1".."P4", or "-" for a figure reported without a target
    name: str
    db: str = "-"
    records: int | None = None
    seconds: float | None = None
    cpu_seconds: float | None = None  # the measuring process's CPU time in the timed part (syncs, drains)
    mbytes: float | None = None  # MB (10^6 bytes) moved: wire bytes (sync), row payload (baselines), stream (SSE)
    rss_mib: float | None = None
    vs_copy: float | None = None
    vs_naive: float | None = None
    goal: str = ""
    check: str = ""
    result: str = ""  # PASS | FAIL | N/A | ERROR | "" (figure only)
    note: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return self.records / self.seconds if self.records and self.seconds else None

    @property
    def mb_s(self) -> float | None:
        return self.mbytes / self.seconds if self.mbytes and self.seconds else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(rows: list[Row]) -> str:
    headers = ("target", "measurement", "db", "records", "time s", "cpu s", "records/s", "MB/s", "peak RSS MiB",
               "vs COPY/raw", "vs naive", "goal", "observed", "result")
    table = [headers]
    for r in rows:
        table.append((
            r.target, r.name, r.db, _fmt(r.records, ","), _fmt(r.seconds, ".2f"), _fmt(r.cpu_seconds, ".2f"),
            _fmt(r.rate, ",.0f"),
            _fmt(r.mb_s, ".1f"), _fmt(r.rss_mib, ".0f"),
            "-" if r.vs_copy is None else f"{r.vs_copy:.2f}x", "-" if r.vs_naive is None else f"{r.vs_naive:.2f}x",
            r.goal or "-", r.check or "-", r.result or "-",
        ))
    widths = [max(len(str(line[i])) for line in table) for i in range(len(headers))]
    numeric = {3, 4, 5, 6, 7, 8, 9, 10}
    out = []
    for n, line in enumerate(table):
        cells = [str(c).rjust(widths[i]) if i in numeric else str(c).ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# --- the plan --------------------------------------------------------------------------------------


@dataclass
class Config:
    records: int
    records_min: int
    records_max: int
    dialects: list[str]
    targets: list[str]
    style: str
    sources: int
    shared_people: int
    sse_mb: int
    notifications: int
    notification_records: int
    urls: dict[str, str]
    profile: Path | None
    timeout_s: float
    json_out: Path | None = None
    quick: bool = False
    #: Each round also runs the first sync and its unchanged re-run under the personal-data policy.
    pii: bool = False
    feed: str = "replay"
    repeat: int = 1
    duckdb_memory_limit: str | None = None  # P2's DuckDB syncs; None: DuckDB's own default

    def params(self, records: int) -> ScenarioParams:
        shared = min(self.shared_people, records // max(self.sources, 1))
        return ScenarioParams(records=records, sources=self.sources, shared_people=shared)


class Bench:
    def __init__(self, config: Config, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.rows: list[Row] = []
        self.server: ReferenceServerProcess | None = None
        # By (scenario day, read of that day): one captured read each. A day's second read is the
        # server's re-stamped one (every provenance observed_at moved, content the same).
        self.replays: dict[tuple[int, int], ReplayProcess] = {}
        self._primed: set[tuple[int, int, int]] = set()  # (records, day, read)
        self.token: str | None = None
        self.notes: list[str] = []
        self._tables: list[tuple[str, str]] = []  # (url, table) to drop at the end
        self._current_records: int | None = None
        self._current_day = 1

    # -- infrastructure ------------------------------------------------------------------------
    def _live(self, params: ScenarioParams) -> str:
        """The reference server, serving ``params``' scenario; returns its MCP URL."""
        from bench.grant import mint_access_token

        doc = scenario(params).model_dump_json()
        if self.server is None:
            self.server = ReferenceServerProcess(doc, self.workdir)
            self.server.start()
            self.token = mint_access_token(self.server.mcp_url)
        elif self._current_records != params.records:
            self.server.set_scenario(doc)
            self._current_day = 1
            for replay in self.replays.values():
                replay.reset()
            self._primed.clear()
        self._current_records = params.records
        if self._current_day != params.day:
            self.server.set_day(params.day)
            self._current_day = params.day
        return self.server.mcp_url

    def _feed(self, params: ScenarioParams) -> str:
        """The MCP URL a sync reads from: the live server, or the primed replay feed in front of it."""
        live = self._live(params)
        if self.config.feed == "live":
            return live
        if params.read:
            self._feed(replace(params, read=0))  # the day's first read is captured first
        key = (params.day, params.read)
        replay = self.replays.get(key)
        if replay is None:
            replay = self.replays[key] = ReplayProcess(live, self.workdir, f"replay-day{params.day}-read{params.read}")
            replay.start()
        if (params.records, params.day, params.read) not in self._primed:
            # Priming read (untimed): the replay feed captures the server's bytes for this scenario
            # and day (the server serves that day now: see _live).
            result = self._child("drain", {"mcp_url": replay.url, "style": self.config.style, "records": 0},
                                 env={"BENCH_BEARER_TOKEN": self.token or ""})
            if "error" in result:
                raise RuntimeError(f"priming the replay feed failed: {result['error']}")
            self._primed.add((params.records, params.day, params.read))
        return replay.url

    def _table(self, url: str, role: str) -> str:
        name = f"bench_{role}_{secrets.token_hex(4)}"
        self._tables.append((url, name))
        return name

    def drop_tables(self) -> None:
        import sqlalchemy as sa

        by_url: dict[str, list[str]] = {}
        for url, name in self._tables:
            by_url.setdefault(url, []).append(name)
        for url, names in by_url.items():
            try:
                engine = sa.create_engine(url)
                with engine.begin() as conn:
                    for name in names:  # with the tables a records table has beside it
                        for table in (name, f"{name}_lineage", f"{name}_history", f"{name}_rejects",
                                      f"{name}_policy"):
                            conn.exec_driver_sql(
                                f"DROP TABLE IF EXISTS {engine.dialect.identifier_preparer.quote(table)}")
                engine.dispose()
            except Exception as exc:  # cleanup must not hide the results
                self.notes.append(f"cleanup of {names} on {url.split('@')[-1]} failed: {exc}")
        self._tables.clear()

    def close(self) -> None:
        try:
            self.drop_tables()
        finally:
            for replay in self.replays.values():
                replay.stop()
            if self.server is not None:
                self.server.stop()

    def _child(self, kind: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            return run_child(kind, spec, timeout_s=self.config.timeout_s, env=env)
        except ChildFailed as exc:
            tail = exc.detail.strip().splitlines()[-1:] or [""]
            return {"error": f"{exc} {tail[0][:200]}"}

    # -- measurements --------------------------------------------------------------------------
    def baseline(self, dialect: str, kind: str, records: int) -> Row:
        url = self.config.urls[dialect]
        label = {"raw": RAW_LABELS.get(dialect, "baseline: raw executemany"),
                 "stage-merge": "baseline: COPY to stage + merge, N other rows",
                 "naive": "baseline: naive upsert, 5k chunks"}[kind]
        row = Row("-", label, dialect)
        if (dialect, kind) == ("duckdb", "naive"):
            row.result, row.note = "N/A", NAIVE_DUCKDB
            return row
        table = self._table(url, kind)
        result = self._child("baseline", {"dialect": dialect, "kind": kind, "url": url, "table": table,
                                          "scenario": self.config.params(records).as_dict()})
        return self._fill(row, result, bytes_key="payload_bytes", expect=records)

    def prefill(self, dialect: str, records: int, table: str, audit: str) -> str | None:
        """Our records table, created holding ``records`` OTHER rows (untimed); an error message or None."""
        result = self._child("prefill", {"url": self.config.urls[dialect], "table": table, "audit_table": audit,
                                         "scenario": self.config.params(records).as_dict()})
        return result.get("error")

    def sync(self, dialect: str, records: int, table: str, audit: str, label: str, *, stream: bool = True,
             day: int = 1, read: int = 0, url: str | None = None, pii: bool = False) -> Row:
        """One sync in a child process; ``stream=False``: no opt-in, one application/json answer (read live);
        ``day``: the scenario's day read (2: 1 % of the people gone, 1 % changed); ``read``: 1 for a
        later read of the day (every provenance observed_at moved); ``url``: the destination, if not
        the dialect's; ``pii``: under the personal-data policy (``BENCH_PII_POLICY``, bench/ours.py)."""
        row = Row("-", label, dialect)
        params = replace(self.config.params(records), day=day, read=read)
        feed = self._feed_for(row, params)
        if feed is None:
            return row
        misses = self._replay_misses(day, read)
        spec = {"mcp_url": feed, "url": url or self.config.urls[dialect], "table": table, "audit_table": audit,
                "style": self.config.style, "stream": stream}
        if self.config.profile is not None:
            slug = "".join(c if c.isalnum() else "-" for c in label).strip("-")
            spec["profile"] = str(self.config.profile / f"{slug}-{dialect}-{records}-{secrets.token_hex(2)}")
        env = {"BENCH_BEARER_TOKEN": self.token or ""} | ({"BENCH_PII_POLICY": "1"} if pii else {})
        result = self._child("sync", spec, env=env)
        self._fill(row, result, bytes_key="wire_bytes", expect=final_record_count(params))
        if misses is not None and self._replay_misses(day, read) != misses:
            row.note = (row.note + "; " if row.note else "") + (
                "replay MISS: this timed run included a live read (its request differs from the priming read)")
        return row

    def _feed_for(self, row: Row, params: ScenarioParams) -> str | None:
        """The MCP URL serving ``params`` (replay or live); None, with ``row`` marked ERROR, if it failed."""
        try:
            return self._feed(params)
        except Exception as exc:
            row.result, row.note = "ERROR", f"feed: {exc}"
            return None

    def read_only(self, records: int, *, known: bool = False, hashed: bool = False) -> Row:
        """Our client's streamed read with the records discarded (no database): a sync's floor.

        ``known``: every record's wire hash is given to the read (an unchanged re-run's floor).
        ``hashed``: each record is also checked and canonically hashed (a first sync's floor).
        """
        label = (READ_KNOWN if known else READ_HASHED if hashed else "ceiling: our read, records discarded")
        row = Row("-", label, "-")
        params = self.config.params(records)
        feed = self._feed_for(row, params)
        if feed is None:
            return row
        result = self._child("read", {"mcp_url": feed, "style": self.config.style, "known": known, "hashed": hashed},
                             env={"BENCH_BEARER_TOKEN": self.token or ""})
        self._fill(row, result, bytes_key="wire_bytes", expect=final_record_count(params))
        if known and result.get("known_records") != result.get("records"):
            row.note = (row.note + "; " if row.note else "") + (
                f"only {result.get('known_records')} of {result.get('records')} records came through known")
        return row

    def _replay_misses(self, day: int = 1, read: int = 0) -> int | None:
        replay = self.replays.get((day, read))
        if replay is None or self.config.feed != "replay":
            return None
        try:
            return int(replay.stats()["misses"])
        except Exception:  # a dead replay process shows up as the sync's own error
            return -1

    def drain(self, records: int, *, replay: bool) -> Row:
        row = Row("-", "ceiling: replay feed, drained" if replay else "ceiling: live server, drained", "-")
        params = self.config.params(records)
        try:
            url = self._feed(params) if replay else self._live(params)
        except Exception as exc:
            row.result, row.note = "ERROR", f"feed: {exc}"
            return row
        result = self._child("drain", {"mcp_url": url, "style": self.config.style,
                                       "records": final_record_count(params)},
                             env={"BENCH_BEARER_TOKEN": self.token or ""})
        return self._fill(row, result, bytes_key="wire_bytes")

    def _fill(self, row: Row, result: dict[str, Any], *, bytes_key: str, expect: int | None = None) -> Row:
        row.raw = result
        row.rss_mib = result.get("peak_rss_mib")
        if "unavailable" in result:
            row.result, row.note = "N/A", result["unavailable"]
            return row
        if "error" in result:
            row.result, row.note = "ERROR", result["error"]
            return row
        row.records = result.get("records")
        row.seconds = result.get("seconds")
        row.cpu_seconds = result.get("cpu_seconds")
        _note_cpu_split(row, result)
        row.mbytes = result[bytes_key] / 1e6 if result.get(bytes_key) else None
        loaded = result.get("loaded")
        if expect is not None and row.records != expect:
            row.result, row.note = "ERROR", f"got {row.records} records, expected {expect}"
        elif loaded is not None and loaded != row.records:
            row.result, row.note = "ERROR", f"table holds {loaded} rows after loading {row.records}"
        return row


def _ok(row: Row | None) -> bool:
    return row is not None and row.result not in ("N/A", "ERROR") and row.seconds is not None


def _judge(row: Row, needed: list[Row | None], *, correct: bool, fast: bool, quick: bool) -> None:
    """Set ``row.result``: ERROR/N/A if a needed measurement is missing, FAIL if incorrect, else by speed.

    With ``--quick`` the sizes are too small for timing targets: they show as PASS*/MISS* and only
    correctness can fail the run.
    """
    present = [r for r in needed if r is not None]
    if any(r.result == "ERROR" for r in present):
        row.result = "ERROR"
    elif any(r.result == "N/A" for r in present) or len(present) < len(needed):
        row.result = "N/A"
    elif not correct:
        row.result = "FAIL"
    elif quick:
        row.result = "PASS*" if fast else "MISS*"
    else:
        row.result = "PASS" if fast else "FAIL"


def _median(rows: list[Row]) -> Row:
    """The median of repeated measurements (by time; the lower middle of an even count), its note
    giving the spread; a failed one wins (errors must not hide behind a retry)."""
    failed = [r for r in rows if not _ok(r) or r.result]
    if failed:
        return failed[0]
    ordered = sorted(rows, key=lambda r: r.seconds or float("inf"))
    middle = ordered[(len(ordered) - 1) // 2]
    if len(rows) > 1:
        times = [r.seconds or 0.0 for r in rows]
        _add_note(middle, f"median of {len(rows)} (run order): " + ", ".join(f"{t:.2f}" for t in times)
                  + f" s; spread {min(times):.2f}-{max(times):.2f} s")
        cpus = [r.cpu_seconds for r in rows if r.cpu_seconds is not None]
        if len(cpus) == len(rows):
            middle.cpu_seconds = sorted(cpus)[(len(cpus) - 1) // 2]  # the median CPU, like the time
    return middle


def _note_cpu_split(row: Row, result: dict[str, Any]) -> None:
    """PostgreSQL's CPU, when the sync reported it."""
    if result.get("db_cpu_seconds") is not None:
        _add_note(row, f"postgres cpu {result['db_cpu_seconds']:.2f} s")


def _ratio_range(numerators: list[Row], denominators: list[Row], *, seconds: bool = False) -> str:
    """Per-round ratios (interleaved rounds pair up) of records/s, or of ``seconds``, as
    `` (rounds min-max)``; "" if any is missing."""
    pairs = [(n.seconds, d.seconds) if seconds else (n.rate, d.rate)
             for n, d in zip(numerators, denominators, strict=False) if _ok(n) and _ok(d)]
    if not pairs or len(pairs) != len(numerators) or len(pairs) < 2:
        return ""
    ratios = [a / b for a, b in pairs if a and b]
    return f" (rounds {min(ratios):.2f}-{max(ratios):.2f}x)"


def _add_note(row: Row, note: str) -> None:
    row.note = f"{row.note}; {note}" if row.note else note


def run_p4(config: Config, bench: Bench) -> None:
    line = bench._child("sse-line", {"megabytes": config.sse_mb})
    r = bench._fill(Row("P4", f"SSE parser: {config.sse_mb} MB data line"), line, bytes_key="bytes")
    r.goal = f">={P4_MB_S:.0f} MB/s, intact"
    if _ok(r):
        r.check = f"{r.mb_s:.0f} MB/s, {line['detail']}"
        _judge(r, [r], correct=line["intact"], fast=r.mb_s >= P4_MB_S, quick=config.quick)
    bench.rows.append(r)
    notes = bench._child("sse-notifications", {"count": config.notifications,
                                               "records_per_page": config.notification_records})
    r = bench._fill(Row("P4", f"SSE parser: {config.notifications:,} notifications"), notes, bytes_key="bytes")
    r.goal = "none dropped/reordered"
    if _ok(r):
        r.records = notes["events"]
        r.check = notes["detail"]
        _judge(r, [r], correct=notes["intact"], fast=True, quick=False)
    bench.rows.append(r)


READ_KNOWN = "ceiling: our read, every record known"
READ_HASHED = "ceiling: our read + canonical hash, nothing written"
RAW_LABELS = {"postgres": "baseline: COPY (psycopg)", "duckdb": "baseline: raw NDJSON + read_json"}
NAIVE_DUCKDB = ("not run for DuckDB: it runs each row of an executemany as its own INSERT (~2 ms a row, "
                "~400 s for 200k; bench/README.md 'DuckDB'), so the first sync is judged against raw only")


def run_dialect(config: Config, bench: Bench, dialect: str, ceilings: list[Row], want: set[str]) -> Row | None:
    """Baselines, first sync and re-run on one dialect, in interleaved rounds (each round runs every
    measurement once, so a slow phase of the machine hits all of them); the median of each is kept.
    Returns the first sync row (P2 reuses it)."""
    is_pg = dialect == "postgres"
    url = config.urls[dialect]
    rows = bench.rows
    baselines = "P1" in want or (not is_pg and "P3" in want)
    syncs = bool({"P1", "P3"} & want) or (dialect in P2_DIALECTS and "P2" in want
                                          and config.records_max == config.records)
    into_other = is_pg and "P1" in want
    raws: list[Row] = []
    naives: list[Row] = []
    merges: list[Row] = []
    firsts: list[Row] = []
    seconds: list[Row] = []
    restamps: list[Row] = []
    churns: list[Row] = []
    others: list[Row] = []
    pii_firsts: list[Row] = []
    pii_seconds: list[Row] = []
    # A full read retires what it no longer returns: then the re-run of the next day (1 % changed,
    # 1 % gone) is timed too, on the same table, against the unchanged re-run.
    churn = "P3" in want and os.environ.get("BENCH_SYNC_MODE") == "full" and config.params(config.records).churn
    for _ in range(config.repeat):
        if baselines:
            raws.append(bench.baseline(dialect, "raw", config.records))
            if dialect != "duckdb":
                naives.append(bench.baseline(dialect, "naive", config.records))
            if into_other:
                merges.append(bench.baseline(dialect, "stage-merge", config.records))
        if syncs:  # new tables each round: a first run, then the re-run
            table, audit = bench._table(url, "sync"), bench._table(url, "audit")
            try:
                firsts.append(bench.sync(dialect, config.records, table, audit, "sync: first run (empty table)"))
                if "P3" in want:
                    seconds.append(bench.sync(dialect, config.records, table, audit, "sync: re-run, unchanged data"))
                    restamps.append(bench.sync(dialect, config.records, table, audit,
                                               "sync: re-run, nobody changed, every observed_at moved", read=1))
                    if churn:
                        churns.append(bench.sync(dialect, config.records, table, audit,
                                                 "sync: full re-run, next day: 1% changed + 1% gone", day=2))
            finally:
                bench.drop_tables()
        if syncs and config.pii:  # the same two syncs under the policy, in the same round
            table, audit = bench._table(url, "pii"), bench._table(url, "piiaudit")
            try:
                pii_firsts.append(bench.sync(dialect, config.records, table, audit,
                                             "sync (pii policy): first run (empty table)", pii=True))
                if "P3" in want:
                    pii_seconds.append(bench.sync(dialect, config.records, table, audit,
                                                  "sync (pii policy): re-run, unchanged data", pii=True))
            finally:
                bench.drop_tables()
        if into_other:
            table, audit = bench._table(url, "other"), bench._table(url, "oaudit")
            label = f"sync: first run, table holds {config.records:,} other rows"
            try:
                error = bench.prefill(dialect, config.records, table, audit)
                if error:
                    others.append(Row("-", label, dialect, result="ERROR", note=f"prefill: {error}"))
                else:
                    others.append(bench.sync(dialect, config.records, table, audit, label))
            finally:
                bench.drop_tables()
    raw = _median(raws) if raws else None
    naive = _median(naives) if naives else None
    if baselines and dialect == "duckdb":
        naive = bench.baseline(dialect, "naive", config.records)  # marked N/A, nothing run
    merge = _median(merges) if merges else None
    first = _median(firsts) if firsts else None
    second = _median(seconds) if seconds else None
    restamped = _median(restamps) if restamps else None
    churned = _median(churns) if churns else None
    other = _median(others) if others else None
    pii_first = _median(pii_firsts) if pii_firsts else None
    pii_second = _median(pii_seconds) if pii_seconds else None
    rows += [r for r in (raw, naive, merge) if r is not None]
    if _ok(raw) and _ok(naive):
        naive.vs_copy = naive.rate / raw.rate
    for ceiling in ceilings if is_pg else []:
        if _ok(ceiling) and _ok(raw):  # the most any client can reach from that feed, vs COPY
            ceiling.vs_copy = ceiling.rate / raw.rate
    rows += [r for r in (first, second, restamped, churned, other, pii_first, pii_second) if r is not None]
    _floor_notes(ceilings, raw, first, second, dialect)
    _cpu_floor_note(first, raw, "COPY" if is_pg else "raw")
    inserted_all = False
    if _ok(first):
        inserted = first.raw["counts"].get("inserted")
        inserted_all = inserted == first.records
        if not inserted_all:
            _add_note(first, f"first run into an empty table inserted {inserted}, not {first.records}")
        if _ok(raw):
            first.vs_copy = first.rate / raw.rate
        if _ok(naive):
            first.vs_naive = first.rate / naive.rate
    if first is not None and "P1" in want:
        first.target = "P1"
        if is_pg:
            first.goal = f">={P1_VS_COPY}x COPY, >={P1_VS_NAIVE:.0f}x naive"
            fast = (first.vs_copy or 0) >= P1_VS_COPY and (first.vs_naive or 0) >= P1_VS_NAIVE
        else:
            first.goal = f">={OTHER_VS_RAW}x raw"
            fast = (first.vs_copy or 0) >= OTHER_VS_RAW
        if first.vs_copy is not None and first.vs_naive is not None:
            first.check = f"{first.vs_copy:.2f}x / {first.vs_naive:.2f}x" + _ratio_range(firsts, raws)
        elif first.vs_copy is not None:
            first.check = f"{first.vs_copy:.2f}x raw" + _ratio_range(firsts, raws)
        needed = [first, raw] if dialect == "duckdb" else [first, raw, naive]  # no naive baseline there
        _judge(first, needed, correct=inserted_all, fast=fast, quick=config.quick)
    if other is not None:
        other.target = "P1"
        other.goal = f">={P1_VS_STAGE_MERGE}x stage+merge"
        fast = False
        correct = False
        if _ok(other):
            counts = other.raw["counts"]
            correct = counts.get("inserted") == other.records
            if not correct:
                _add_note(other, f"inserted {counts.get('inserted')}, not {other.records}")
            if _ok(merge):
                other.vs_copy = other.rate / merge.rate
                other.check = f"{other.vs_copy:.2f}x stage+merge" + _ratio_range(others, merges)
                fast = other.vs_copy >= P1_VS_STAGE_MERGE
            if _ok(raw):
                _add_note(other, f"{other.rate / raw.rate:.2f}x the COPY into an empty table")
            _cpu_floor_note(other, merge, "stage+merge")
        _judge(other, [other, merge], correct=correct, fast=fast, quick=config.quick)
    judged = is_pg or dialect == "duckdb"
    if second is not None:
        goal = P3_DUCKDB_SPEEDUP if dialect == "duckdb" else P3_SPEEDUP
        _judge_rerun(config, second, first, firsts, seconds, goal=goal, judged=judged, raw=raw, what="records")
    if restamped is not None:
        _judge_rerun(config, restamped, first, firsts, restamps, goal=P3_RESTAMPED_SPEEDUP, judged=judged,
                     what="re-stamped records")
    if churned is not None:
        _judge_churn(config, churned, restamped, churns, restamps, is_pg=is_pg)
    if pii_first is not None:
        _judge_pii_first(config, pii_first, first, pii_firsts, firsts, raw=raw)
    if pii_second is not None:
        _judge_rerun(config, pii_second, pii_first, pii_firsts, pii_seconds, goal=PII_RERUN_SPEEDUP, judged=judged,
                     raw=raw, what="records")
    return first


def _judge_pii_first(config: Config, pii_first: Row, first: Row | None, pii_firsts: list[Row], firsts: list[Row],
                     *, raw: Row | None) -> None:
    """The first sync under the personal-data policy: every record inserted, at least PII_VS_PLAIN times
    the records/s of the same first sync without a policy (medians of the same rounds)."""
    pii_first.goal = f">={PII_VS_PLAIN}x the first sync without a policy"
    correct = fast = False
    if _ok(pii_first):
        inserted = pii_first.raw["counts"].get("inserted")
        correct = inserted == pii_first.records
        if not correct:
            _add_note(pii_first, f"inserted {inserted}, not {pii_first.records}")
        if _ok(raw):
            pii_first.vs_copy = pii_first.rate / raw.rate
        if _ok(first):
            ratio = pii_first.rate / first.rate
            pii_first.check = f"{ratio:.2f}x without a policy" + _ratio_range(pii_firsts, firsts)
            fast = ratio >= PII_VS_PLAIN
    _judge(pii_first, [pii_first, first], correct=correct, fast=fast, quick=config.quick)


def _judge_rerun(config: Config, rerun: Row, first: Row | None, firsts: list[Row], reruns: list[Row], *,
                 goal: float, judged: bool, what: str, raw: Row | None = None) -> None:
    """A re-run in which nobody changed (byte-identical, or every observed_at moved): at least ``goal``
    times faster than the first run, nothing rewritten, every record a wire-hash claim."""
    rerun.goal = f">={goal:.0f}x faster, 0 rewritten"
    speedup = rewritten = None
    claimed = False
    if _ok(rerun):
        counts = rerun.raw["counts"]
        rewritten = counts.get("inserted", 0) + counts.get("updated", 0)
        known = rerun.raw.get("known_records")
        claimed = known == rerun.records
        _add_note(rerun, f"{known} of {rerun.records} {what} came to the writer as wire-hash claims"
                  + ("" if claimed else " (the re-run did not take the claims path for every record)"))
        if _ok(first):
            speedup = first.seconds / rerun.seconds
        rounds = _ratio_range(firsts, reruns, seconds=True)
        rerun.check = (f"{speedup:.2f}x faster{rounds}, " if speedup else "") + f"{rewritten} rewritten"
        if _ok(raw):
            rerun.vs_copy = rerun.rate / raw.rate
    if judged:
        rerun.target = "P3"
        _judge(rerun, [first, rerun], correct=rewritten == 0 and claimed,
               fast=speedup is not None and speedup >= goal, quick=config.quick)


def _judge_churn(config: Config, churned: Row, second: Row | None, churns: list[Row], seconds: list[Row], *,
                 is_pg: bool) -> None:
    """The next day's full re-run (every observed_at moved): exactly its 1 % updated and its 1 % retired,
    nothing else written, in at most P3_CHURN_RATIO times the re-stamped unchanged re-run."""
    params = config.params(config.records)
    expected = params.churn * params.sources
    churned.goal = f"<={P3_CHURN_RATIO}x the re-stamped re-run, {expected} updated + {expected} retired"
    correct, ratio = False, None
    if _ok(churned):
        counts = churned.raw["counts"]
        got = (counts.get("inserted"), counts.get("updated"), counts.get("retired"), counts.get("superseded"))
        correct = got == (0, expected, expected, 0)
        if not correct:
            _add_note(churned, "inserted, updated, retired, superseded = " + ", ".join(map(str, got)))
        if _ok(second):
            ratio = churned.seconds / second.seconds
            churned.check = f"{ratio:.2f}x the re-stamped re-run{_ratio_range(churns, seconds, seconds=True)}"
    if is_pg:  # the lifecycle's bench row is PostgreSQL's; other dialects report it
        churned.target = "P3"
        _judge(churned, [second, churned], correct=correct, fast=ratio is not None and ratio <= P3_CHURN_RATIO,
               quick=config.quick)


def _floor_notes(ceilings: list[Row], raw: Row | None, first: Row | None, second: Row | None, dialect: str) -> None:
    """What this client's own floors allow, next to the verdicts they bound:
    a first sync is never faster than its read plus the canonical hash of every record, and an
    unchanged re-run never faster than its read with every record known."""
    is_pg = dialect == "postgres"
    by_label = {c.name: c for c in ceilings}
    hashed, known = by_label.get(READ_HASHED), by_label.get(READ_KNOWN)
    if _ok(first) and _ok(hashed) and _ok(raw):
        note = (f"floor: our read + canonical hash alone (nothing written) is {hashed.rate / raw.rate:.2f}x "
                f"{'COPY' if is_pg else 'raw'}")
        if dialect == "sqlite":  # the database runs in this thread: its inserts add to the read, never overlap
            note += (f"; plus SQLite's own inserts (the raw time, same thread): at most "
                     f"{raw.seconds / (hashed.seconds + raw.seconds):.2f}x raw")
        _add_note(first, note)
    if dialect in ("postgres", "duckdb") and _ok(second) and _ok(first) and _ok(known):
        _add_note(second, f"ceiling: this first run / our read with every record known = "
                          f"{first.seconds / known.seconds:.2f}x (the most a re-run can gain on it)")


def _cpu_floor_note(row: Row | None, baseline: Row | None, baseline_name: str) -> None:
    """The least time the CPU a sync spent can take on this machine, however well its steps overlapped:
    its process's CPU (the read, the encoding and, on DuckDB, the engine's own threads) and PostgreSQL's,
    spread over every core; on PostgreSQL never less than the process's CPU, spent by its one thread.
    The feed's CPU is not counted. A goal above the ratio this gives needs less work, not more overlap.
    Not for SQLite: it works in the sync's one thread, so its CPU is its time (see its floor note)."""
    if row is None or baseline is None or baseline.seconds is None or row.db not in ("postgres", "duckdb"):
        return
    if not (_ok(row) and _ok(baseline)):
        return
    process, database = row.raw.get("cpu_seconds"), row.raw.get("db_cpu_seconds")
    if process is None or (row.db == "postgres" and database is None):
        return
    cores = os.cpu_count() or 1
    least = (process + (database or 0.0)) / cores
    if row.db == "postgres":
        least = max(least, process)
    spent = f"process {process:.2f} s" + (f" + postgres {database:.2f} s" if database is not None else "")
    _add_note(row, f"CPU floor: {spent} of CPU take at least {least:.2f} s on {cores} cores: at best "
                   f"{baseline.seconds / least:.2f}x {baseline_name}")


def run_p2(config: Config, bench: Bench, firsts: dict[str, Row | None]) -> None:
    """Peak RSS of the sync at --records-min and --records-max on each of ``P2_DIALECTS`` selected.

    The streamed read (SSE, the extension) on each, by size then dialect (each size primes the
    replay feed once); then, on PostgreSQL, the same read answered as one application/json body
    (no opt-in, as from a server without the extension; the replay feed passes it through to the
    live server, so only its memory is measured: the client's side of it is the same whatever the
    destination). ``firsts``: a dialect's first sync at --records, reused at that size when P2
    writes to the same database. DuckDB runs in the sync's process: its syncs here open the file
    with ``config.duckdb_memory_limit``, as docs/destinations.md advises for a worker.
    """
    dialects = [d for d in config.dialects if d in P2_DIALECTS]
    streamed: dict[str, list[Row]] = {d: [] for d in dialects}
    label = "sync: memory at {:,}"
    for size in (config.records_min, config.records_max):
        for dialect in dialects:
            first = firsts.get(dialect)
            if size == config.records and first is not None and _p2_url(config, dialect) == config.urls[dialect]:
                streamed[dialect].append(first)
                continue
            streamed[dialect].append(_p2_sync(bench, dialect, size, label.format(size), stream=True))
    for dialect in dialects:
        row = _p2_row(config, streamed[dialect], "", dialect)
        if dialect == "duckdb":
            limit = config.duckdb_memory_limit
            _add_note(row, f"DuckDB memory_limit={limit}" if limit else
                      "DuckDB's default memory_limit (80 % of RAM): its cache grows with the table")
        bench.rows.append(row)
    if "postgres" in dialects:
        label = "sync, one JSON body (no extension): memory at {:,}"
        body = [_p2_sync(bench, "postgres", size, label.format(size), stream=False)
                for size in (config.records_min, config.records_max)]
        bench.rows.append(_p2_row(config, body, ", one JSON body", "postgres"))


def _p2_url(config: Config, dialect: str) -> str:
    """The destination P2 writes to: the dialect's, with DuckDB's memory_limit in the URL's query
    (duckdb_engine passes it to the connection's config)."""
    url = config.urls[dialect]
    if dialect != "duckdb" or not config.duckdb_memory_limit:
        return url
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    return parsed.update_query_dict({"memory_limit": config.duckdb_memory_limit}).render_as_string(
        hide_password=False)


def _p2_sync(bench: Bench, dialect: str, size: int, label: str, *, stream: bool) -> Row:
    url = _p2_url(bench.config, dialect)
    table, audit = bench._table(url, "p2"), bench._table(url, "p2audit")
    try:
        row = bench.sync(dialect, size, table, audit, label, stream=stream, url=url)
    finally:
        bench.drop_tables()
    bench.rows.append(row)
    return row


def _p2_row(config: Config, p2: list[Row], what: str, dialect: str) -> Row:
    small, big = p2
    row = Row("P2", f"sync peak RSS at {config.records_max:,} vs {config.records_min:,}{what}", dialect)
    cap = dialect == "postgres"  # the MiB cap is PostgreSQL's target; elsewhere the ratio is judged
    row.goal = f"<={P2_MAX_RATIO}x" + (f" and <={P2_MAX_MIB:.0f} MiB @1M" if cap else "")
    fast = False
    if _ok(small) and _ok(big) and small.rss_mib and big.rss_mib:
        ratio = big.rss_mib / small.rss_mib
        row.rss_mib = big.rss_mib
        row.check = f"{ratio:.2f}x, {big.rss_mib:.0f} MiB"
        fast = ratio <= P2_MAX_RATIO and (big.rss_mib <= P2_MAX_MIB or not cap)
        if config.records_max < P2_FULL_SIZE:
            _add_note(row, f"proxy: measured at {config.records_max:,}; the target is at 1M (--records-max 1000000)")
    _judge(row, [small, big], correct=True, fast=fast, quick=config.quick)
    return row


def run(config: Config, bench: Bench) -> None:
    want = set(config.targets)
    if "P4" in want:
        run_p4(config, bench)
    ceilings: list[Row] = []
    if {"P1", "P3"} & want:
        ceilings.append(bench.drain(config.records, replay=False))
        if config.feed == "replay":
            ceilings.append(bench.drain(config.records, replay=True))
        ceilings.append(_median([bench.read_only(config.records) for _ in range(config.repeat)]))
        ceilings.append(_median([bench.read_only(config.records, known=True) for _ in range(config.repeat)]))
        ceilings.append(_median([bench.read_only(config.records, hashed=True) for _ in range(config.repeat)]))
        bench.rows.extend(ceilings)
    firsts: dict[str, Row | None] = {}
    for dialect in config.dialects:
        if {"P1", "P3"} & want or (dialect in P2_DIALECTS and "P2" in want):
            firsts[dialect] = run_dialect(config, bench, dialect, ceilings, want)
    # P2 last: its other scenario sizes would otherwise re-prime the replay feed in between.
    if "P2" in want and any(d in P2_DIALECTS for d in config.dialects):
        run_p2(config, bench, firsts)


# --- entry point -----------------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="bench/run", description="Benchmark the BOS sync against raw and naive baselines.")
    p.add_argument("--records", type=int, default=None, help="P1/P3 size and SQLite/MySQL size (default 200000)")
    p.add_argument("--records-min", type=int, default=None, help="P2 small size (default 100000)")
    p.add_argument("--records-max", type=int, default=None,
                   help="P2 large size (default 200000 as a proxy; the target is at 1000000)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run well under a minute")
    p.add_argument("--pii", action="store_true",
                   help="each round also runs the first sync and its unchanged re-run under a personal-data "
                        "policy (hash email and phone, drop attributes.employment; key: BENCH_PII_KEY)")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma list of P1,P2,P3,P4")
    p.add_argument("--dialects", default=",".join(DIALECTS), help="comma list of postgres,sqlite,mysql,duckdb")
    p.add_argument("--style", choices=("execute", "direct"), default="execute",
                   help="read people.search via bos_execute (default) or the direct search_people tool")
    p.add_argument("--feed", choices=("replay", "live"), default="replay",
                   help="syncs read from the replay feed (the server's captured bytes at wire speed; default) "
                        "or straight from the live reference server")
    p.add_argument("--sources", type=int, default=4)
    p.add_argument("--shared-people", type=int, default=0, help="people present in every source (merged in the final)")
    p.add_argument("--sse-mb", type=int, default=None, help="P4 data line size in MB (default 100)")
    p.add_argument("--notifications", type=int, default=10_000)
    p.add_argument("--pg-url", default=DEFAULT_URLS["postgres"])
    p.add_argument("--mysql-url", default=DEFAULT_URLS["mysql"])
    p.add_argument("--duckdb-url", default=DEFAULT_URLS["duckdb"],
                   help="duckdb:///PATH (default: a file in the run's temporary directory)")
    p.add_argument("--duckdb-memory-limit", default="256MB",
                   help="DuckDB's memory_limit for the P2 syncs (default 256MB, a worker's setting as "
                        "docs/destinations.md advises; 'none': DuckDB's default, 80%% of RAM)")
    p.add_argument("--profile", type=Path, default=None, help="run sync children under cProfile, write reports here")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON to this file")
    p.add_argument("--timeout", type=float, default=3600.0, help="per-measurement timeout in seconds")
    p.add_argument("--repeat", type=int, default=None,
                   help="run the P1/P3 baselines and syncs this many times, in interleaved rounds, and keep "
                        "each one's median, with the spread (default 3; 1 with --quick): this machine's speed "
                        "drifts by a third between runs")
    a = p.parse_args(argv)

    quick = a.quick
    records = a.records or (5_000 if quick else 200_000)
    targets = [t.strip().upper() for t in a.targets.split(",") if t.strip()]
    dialects = [d.strip().lower() for d in a.dialects.split(",") if d.strip()]
    for t in targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r}; choose from {', '.join(TARGETS)}")
    for d in dialects:
        if d not in DIALECTS:
            p.error(f"unknown dialect {d!r}; choose from {', '.join(DIALECTS)}")
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    cfg = Config(
        records=records,
        records_min=a.records_min or (2_000 if quick else 100_000),
        records_max=a.records_max or (records if quick else max(records, 200_000)),
        dialects=dialects,
        targets=targets,
        style=a.style,
        sources=a.sources,
        shared_people=a.shared_people,
        sse_mb=a.sse_mb or (10 if quick else 100),
        notifications=a.notifications,
        notification_records=1 if quick else 5,
        urls={"postgres": a.pg_url, "mysql": a.mysql_url, "sqlite": "", "duckdb": a.duckdb_url},
        profile=a.profile.resolve() if a.profile else None,
        timeout_s=a.timeout,
        json_out=a.json,
        quick=quick,
        pii=a.pii,
        feed=a.feed,
        repeat=max(1, a.repeat or (1 if quick else 3)),
        duckdb_memory_limit=None if a.duckdb_memory_limit.lower() == "none" else a.duckdb_memory_limit,
    )
    return cfg


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    # Ctrl-C and SIGTERM both end the run through the same cleanup (also when started in the
    # background, where the shell leaves SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="bos-bench-"))
    config.urls["sqlite"] = f"sqlite:///{workdir / 'bench.db'}"
    if not config.urls["duckdb"]:
        config.urls["duckdb"] = f"duckdb:///{workdir / 'bench.duckdb'}"
    bench = Bench(config, workdir)
    started = datetime.now(UTC)
    header = (f"BOS bench {started:%Y-%m-%d %H:%M:%SZ}  commit {_git('rev-parse', '--short', 'HEAD')}"
              f"{' (+uncommitted changes)' if _git('status', '--porcelain') else ''}  "
              f"python {platform.python_version()}  {os.cpu_count()} CPUs  load {os.getloadavg()[0]:.2f}  "
              f"feed={config.feed} style={config.style} sources={config.sources} shared_people={config.shared_people}")
    print(header, flush=True)
    print("running ... (each measurement in its own process; server in another)", flush=True)
    t0 = time.monotonic()
    interrupted = False
    try:
        run(config, bench)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted; cleaning up", file=sys.stderr)
    finally:
        bench.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(bench.rows))
    for r in bench.rows:
        if r.note:
            print(f"  note [{r.target} {r.name} {r.db}]: {r.note}")
    for n in bench.notes:
        print(f"  note: {n}")
    print("  MB/s: wire bytes received (sync, drain), row payload (baselines), stream bytes (SSE). "
          "vs COPY/raw and vs naive: records/s ratios.")
    if config.feed == "replay" and any(r.name.startswith("sync") for r in bench.rows):
        print("  feed=replay: syncs read the reference server's captured response bytes, served at wire speed "
              "(see 'ceiling' rows; --feed live reads the server directly).")
    if any(r.result.endswith("*") for r in bench.rows):
        print("  * --quick: sizes too small for timing targets; shown as PASS*/MISS*, only correctness is enforced.")
    print(f"  elapsed {time.monotonic() - t0:.0f}s")
    if config.json_out:
        config.json_out.write_text(json.dumps({"header": header, "rows": [asdict(r) for r in bench.rows]}, indent=2,
                                       default=str), encoding="utf-8")
    if interrupted:
        return 130
    verdicts = [r.result for r in bench.rows if r.target != "-"]
    if any(v in ("FAIL", "ERROR") for v in verdicts):
        return 1
    if any(v == "N/A" for v in verdicts):
        return 2
    return 0
