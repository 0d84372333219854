"""Our path, end to end: MCP federated read (streamed) -> WarehouseWriter, timed as one sync.

Coded against INTERFACES.md B (``McpSession.federated_read`` -> ``FinalResult``) and D
(``WarehouseWriter.write_run``). If those modules cannot be imported yet, :func:`sync_once`
raises :class:`Unavailable` and the bench prints "not available yet" for the row.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.grant import BearerAuth

__all__ = ["CountingTransport", "Unavailable", "read_once", "sync_once"]

# What a sync reads: the bos_execute-wrapped operation, or the direct tool (same records).
TOOLS = {"execute": "people.search", "direct": "search_people"}


class Unavailable(Exception):
    """The client core or the warehouse room is not importable (yet)."""


class _CountingStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, owner: CountingTransport) -> None:
        self._inner = inner
        self._owner = owner

    def __iter__(self):  # type: ignore[no-untyped-def]
        for chunk in self._inner:
            self._owner.received_bytes += len(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class CountingTransport(httpx.HTTPTransport):
    """Counts response body bytes (the wire MB/s of the sync)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received_bytes = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_CountingStream(response.stream, self), extensions=response.extensions)


@dataclass
class _Core:
    McpSession: Any
    WarehouseWriter: Any
    SyncRunInfo: Any
    hash_arguments: Any


def _load_core() -> _Core:
    try:
        from airflow_provider_bos.mcp import McpSession
        from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter, hash_arguments
    except Exception as exc:  # ImportError, or a half-written module failing at import time
        raise Unavailable(f"not available yet ({type(exc).__name__}: {exc})") from exc
    return _Core(McpSession, WarehouseWriter, SyncRunInfo, hash_arguments)


def _reconcile() -> Any:
    """``BENCH_SYNC_MODE`` (``incremental``/``full``) and ``BENCH_HISTORY=1``: the sync's reconcile options."""
    from airflow_provider_bos.wire import check_reconcile

    return check_reconcile(sync_mode=os.environ.get("BENCH_SYNC_MODE", "incremental"),
                           history=os.environ.get("BENCH_HISTORY") == "1")


#: ``BENCH_PII_POLICY=1``: the sync's personal-data policy (the bench scenario's records have every
#: one of these fields; ``attributes.employment`` is the subtree dropped).
BENCH_PII_POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop"}
# The key when BENCH_PII_KEY is not set: the bench's own tables only, never a real one.
_BENCH_PII_KEY = "WCV9R6_7MBxhA_D-wZRg5-MW3Kc3-r30LR94ZCvv9RYf2V4D"  # a bench-only key: random, as a real key must be


def _pii() -> Any:
    """``BENCH_PII_POLICY=1``: the sync runs under :data:`BENCH_PII_POLICY` (or the rules of
    ``BENCH_PII_RULES``, a JSON object), hashed with the key in ``BENCH_PII_KEY`` (unset: a fixed
    bench-only key; set empty, rules that only drop run without a key, as the operator does when
    the key connection does not exist); otherwise None."""
    if os.environ.get("BENCH_PII_POLICY") != "1":
        return None
    import json

    from airflow_provider_bos.pii import PiiKey, PiiPolicy
    from airflow_provider_bos.pii.stream import PolicyRun

    rules = os.environ.get("BENCH_PII_RULES")
    policy = PiiPolicy.parse(json.loads(rules) if rules else BENCH_PII_POLICY)
    text = os.environ.get("BENCH_PII_KEY", _BENCH_PII_KEY)
    if not text and not policy.needs_key:
        return PolicyRun.of(policy, None)
    return PolicyRun.of(policy, PiiKey.from_text(text or _BENCH_PII_KEY, source="BENCH_PII_KEY"))


def _postgres_cpu_s() -> float | None:
    """CPU seconds of every ``postgres`` process on this machine (the bench's database is local).

    Read around a sync, the difference is PostgreSQL's share (other users' queries included: noise).
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1: stat.rindex(")")]
            if name.startswith("postgres"):
                fields = stat[stat.rindex(")") + 2:].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
    except OSError:
        return None
    return total / tick


def _sync(core: _Core, session: Any, writer: Any, run: Any, *, tool: str, via: str,
          arguments: dict[str, Any], marks: dict[str, float], stream: bool = True) -> tuple[Any, Any]:
    """The sync itself: the operator core's steps, minus Airflow.

    The same ``run_sync`` the operator runs (the rest of this module is plumbing: auth, byte
    counting, timing).
    """
    from airflow_provider_bos.sync import run_sync

    outcome = run_sync(session.federated_read, writer, run, tool_name=tool, arguments=arguments,
                       via=via, stream=stream, reconcile=_reconcile(), pii=_pii())
    marks["final_result"] = time.perf_counter()
    return outcome.result, outcome.counts


#: The counts that add up to the records the writer received (not the rows a full read retired).
_RECEIVED = ("inserted", "updated", "unchanged", "skipped_stale", "duplicates", "rejected")


def sync_once(mcp_url: str, token: str, db_url: str, *, table: str, audit_table: str,
              style: str = "execute", arguments: dict[str, Any] | None = None, stream: bool = True) -> dict[str, Any]:
    """One end-to-end sync; returns timings, wire bytes and the upsert counts.

    ``stream=False``: the read does not opt in to the extension, so the server answers one
    application/json body (as a server without the extension does).

    Timed: session open + handshake, the streamed read, the warehouse transaction, session close.
    Not timed: imports and engine creation.
    """
    import sqlalchemy as sa

    core = _load_core()
    tool = TOOLS[style]
    arguments = dict(arguments or {})
    engine = sa.create_engine(db_url)
    transport = CountingTransport()
    client = httpx.Client(transport=transport, timeout=httpx.Timeout(120.0), follow_redirects=False)
    try:
        writer = core.WarehouseWriter(engine, table=table, audit_table=audit_table)
        run = core.SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="bench", tool_name=tool,
                               arguments_hash=core.hash_arguments(arguments))
        marks: dict[str, float] = {}
        db_cpu_start = _postgres_cpu_s() if engine.dialect.name == "postgresql" else None
        start, cpu_start = time.perf_counter(), time.process_time()
        with core.McpSession(mcp_url, auth=BearerAuth(token), http_client=client, timeout=120.0) as session:
            result, counts = _sync(core, session, writer, run, tool=tool, via=style, arguments=arguments, marks=marks,
                                   stream=stream)
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu_start
        db_cpu_end = _postgres_cpu_s() if db_cpu_start is not None else None
    finally:
        client.close()
        engine.dispose()
    counts_dict = counts.as_dict() if hasattr(counts, "as_dict") else dict(vars(counts))
    return {
        # What reached the warehouse (every record the writer received), checked against the scenario.
        "records": sum(int(counts_dict.get(k, 0)) for k in _RECEIVED),
        "result_count": result.result_count,
        "seconds": seconds,
        # This process's CPU time in the timed part (the client's share; the database and the feed
        # run in other processes): steadier than wall time on a shared 2-core machine.
        "cpu_seconds": cpu_seconds,
        # PostgreSQL's CPU in the timed part (all local postgres processes).
        "db_cpu_seconds": (db_cpu_end - db_cpu_start) if db_cpu_start is not None and db_cpu_end is not None else None,
        # Until the final frame is streamed into the warehouse, the FinalResult arrives only after
        # the whole frame is parsed, so this splits read from write; afterwards it is ~ first byte.
        "to_final_result_s": marks.get("final_result", start) - start,
        "wire_bytes": transport.received_bytes,
        "counts": counts_dict,
        "completeness": result.completeness,
        "streamed": bool(result.streamed),
        # Final records handed to the writer as KnownRecord claims (byte-identical to a stored row's
        # wire hash, not decoded): every record of an unchanged re-run, none of a first sync.
        "known_records": result.known_records,
        "notifications": getattr(result.observations, "notifications", None),
        "warnings": len(result.warnings),
        "run_id": run.run_id,
    }


def _read(core: _Core, mcp_url: str, token: str, style: str, known: Any = None,
          collect: bool = False, hashed: bool = False) -> dict[str, Any]:
    from airflow_provider_bos.sync import cyclic_gc_paused
    from airflow_provider_bos.warehouse.tables.records import json_document_values

    transport = CountingTransport()
    client = httpx.Client(transport=transport, timeout=httpx.Timeout(120.0), follow_redirects=False)
    hashes: list[str] = []
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        with core.McpSession(mcp_url, auth=BearerAuth(token), http_client=client, timeout=120.0) as session:
            with cyclic_gc_paused():
                result = session.federated_read(TOOLS[style], {}, via=style, stream=True, stream_records=True)
                with result:
                    if known is not None:
                        result.use_known_wire_hashes(known)
                    records = 0
                    for record in result.records:
                        records += 1
                        if collect:  # the priming read of known=True only (it holds them all)
                            hashes.append(record.wire_hash)
                        elif hashed:  # what any write must compute: the check, the canonical document, its hash
                            json_document_values(record, None)
                    completeness = result.completeness  # validates the completed frame
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu_start
    finally:
        client.close()
    return {"records": records, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "wire_bytes": transport.received_bytes, "completeness": completeness,
            "known_records": result.known_records, "hashes": hashes}


def read_once(mcp_url: str, token: str, *, style: str = "execute", known: bool = False,
              hashed: bool = False) -> dict[str, Any]:
    """Our client's read alone: the streamed read of ``sync_once`` with every record discarded.

    Everything a sync does before the warehouse (HTTP, SSE, page notifications, the final frame's
    scan, record checks, the final validation), nothing after it: the least any first sync from
    this feed can cost with this client. ``known=True``: an untimed read first collects every
    record's wire hash, then the timed read is given them all, as an unchanged re-run is (no
    record decoded): the least such a re-run can cost. ``hashed=True``: each record is also checked
    and given its canonical document and record hash (``json_document_values``, the cheapest
    encoder we have: one serialisation), then dropped: the least a first sync can cost before it
    writes anything.
    """
    from airflow_provider_bos.warehouse.run.claims import WireHashSet

    core = _load_core()
    hashes = None
    if known:
        hashes = WireHashSet(_read(core, mcp_url, token, style, collect=True)["hashes"])
    result = _read(core, mcp_url, token, style, hashes, hashed=hashed)
    del result["hashes"]
    return result


def prefill_other(db_url: str, *, table: str, audit_table: str, scenario: dict[str, Any]) -> dict[str, Any]:
    """Create our records table and fill it with the scenario's rows under OTHER record_refs (no wire
    hashes), untimed: the table a first sync of the scenario then lands in holds as many other rows."""
    import psycopg
    import sqlalchemy as sa

    from bench.baselines import copy_rows, other_rows, vacuum
    from bench.data import COLUMNS, ScenarioParams, build_rows

    core = _load_core()
    engine = sa.create_engine(db_url)
    try:
        writer = core.WarehouseWriter(engine, table=table, audit_table=audit_table)
        writer.ensure_tables()
        rows = build_rows(ScenarioParams(**scenario)).tuples
        dsn = sa.make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn) as conn:
            copy_rows(conn, table, COLUMNS, other_rows(rows))
            conn.commit()
        # The provenance table of a table our runs wrote holds these rows' entries too (a code
        # without that table has nothing to fill).
        sources = getattr(writer, "sources_destination", None)
        if sources is not None:
            with engine.begin() as conn:
                statement = writer.dialect.write_provenance(sources, table, None, run_id=None)
                conn.exec_driver_sql(statement.sql, statement.params)
            vacuum(dsn, sources)
    finally:
        engine.dispose()
    vacuum(dsn, table)
    return {"records": len(rows), "seconds": 0.0}
