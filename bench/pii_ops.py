"""Personal-data operations on a stored table, timed: ``pii-apply`` and one erasure on request.

    python -m bench.pii_ops [--records 200000] [--rounds 3] [--dialects postgres,duckdb] [--pg-url URL]

No HTTP: the bench scenario's final records are built once, in memory, each as the read hands it to
the writer (a ``WireRecord`` carrying its raw wire hash). Each round, on new tables, one dialect
after the other (interleaved, so a slow phase of the machine hits every dialect alike):

- fill, untimed: ``WarehouseWriter.write_run`` of every record WITHOUT a policy, history on, so the
  records table and ``<table>_history`` each hold one row per record (pii-apply rewrites both);
- ``pii-apply floor``: what pii-apply cannot do without: every row of the records table and the
  versions of its history that pii-apply reads (those unlike their row: here none, each ref having
  one version, its row's), read as it reads them (a round at a time, JSON as text) and given their new
  values by its own per-row work (decode, the plan with its keyed hashes, the writer's texts and
  content hash), nothing written back. The rest of pii-apply's time is the write-back and the reclaim;
- ``pii-apply``: :func:`~airflow_provider_bos.warehouse.upkeep.pii_apply.apply_stricter_policy` (what
  ``airflow-provider-bos pii-apply`` calls) from no policy to the bench's policy and key
  (``bench.ours.BENCH_PII_POLICY``: email and phone hashed, ``attributes.employment`` dropped),
  the reclaim after its commit included. Checked: every row and version rewritten, and no raw
  email of a sample of records left in the records table or its history;
- ``pii-apply's statements``: of that time, what the statements on its transaction's connection took,
  one after another (on PostgreSQL the updates, the ``TRUNCATE`` of the staged rows and
  the VACUUM after the commit; neither ``COPY``, which the driver runs, nor the reads of the second
  connection beside them): a transaction's statements run in sequence, so pii-apply takes no less;
- ``erase --email``: :func:`~airflow_provider_bos.warehouse.upkeep.erase.erase_records` of one person
  named by their raw email (found under the table's policy: hashed with the key), as
  ``airflow-provider-bos erase`` runs it, finder and reclaim included;
- ``erase --external-id``: the same for another person named ``SOURCE:ID`` (kept by the policy);
- ``erase --external-id, hashed``: once a second ``pii-apply`` (untimed) has hashed the provenance
  ids too (:data:`HASHED_IDS`), a third person by their ``SOURCE:ID``;
- ``erase 1,000 people``: :data:`MANY` other people named by their raw emails in one request (the
  per-person cost beside the one-person erasure's says whether it stays linear).
  Each erasure must find and delete exactly the refs whose record holds that value;
- ``reclaim alone``: the reclaim every erasure ends with, run once more with nothing left to
  delete: the floor under each erasure's time (on DuckDB the rewrite of the whole file).

The reclaim is what each database offers after a commit: PostgreSQL VACUUM of the tables touched,
DuckDB a rewrite of its whole file (each round's DuckDB file holds that round's tables only).
Each line is the median of the rounds, every round's seconds in brackets; a last line gives how far
pii-apply raised the process's peak RSS above what it held before (the kernel's peak reset first:
the records built for the fill stay out of it; DuckDB's buffer pool, in this process, counts), to
compare between sizes (``--records``) for "memory flat".
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey, PiiPolicy, lookup_hash
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, records_table
from airflow_provider_bos.warehouse.upkeep.erase import ErasedRows, erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import PolicyApplied, apply_stricter_policy, delta_policy
from airflow_provider_bos.warehouse.upkeep.policy_rewrite import _Target, rewrite_targets
from airflow_provider_bos.warehouse.upkeep.reclaim import reclaim_space
from airflow_provider_bos.wire import ReconcileOptions, WireRecord, WriteOptions, wire_hash
from bench.data import ScenarioParams, iter_final_records
from bench.ours import _BENCH_PII_KEY, BENCH_PII_POLICY
from bench.rss import peak_rss_mib, reset_peak_rss, rss_mib

DIALECTS = ("postgres", "duckdb")
NAMES = {"postgres": "PostgreSQL", "duckdb": "DuckDB"}
STEPS = ("pii-apply floor", "pii-apply", "pii-apply's statements", "erase --email", "erase --external-id",
         "erase --external-id, hashed", "erase 1,000 people", "reclaim alone")
#: How many people the one request of ``erase 1,000 people`` names.
MANY = 1_000
#: The second policy (untimed): the first's rules and the provenance ids hashed.
HASHED_IDS = {**BENCH_PII_POLICY, "sources[].external_id": "hash"}
#: Records whose raw email must be gone after pii-apply.
SAMPLE = 200
_AUDIT = {"status": "complete", "completeness": "complete", "source_errors": [], "source_summary": []}
_COMPANIONS = ("history", "lineage", "sources", "rejects", "policy", "columns", "runs")


def wire_records(count: int) -> list[WireRecord]:
    """The scenario's final records as the read decodes them: each with its raw wire hash."""
    out = []
    for record in iter_final_records(ScenarioParams(records=count)):
        piece = orjson.dumps(record)
        decoded = WireRecord(orjson.loads(piece))
        decoded.wire_hash = wire_hash(piece)
        out.append(decoded)
    return out


@dataclass(frozen=True)
class Targets:
    """Who each erasure names, and the refs it must delete (worked out from the records themselves)."""

    email: str
    email_refs: frozenset[str]
    external_id: str
    external_refs: frozenset[str]
    #: Another person's SOURCE:ID, erased once the ids are hashed.
    hashed_id: str
    hashed_refs: frozenset[str]
    #: :data:`MANY` other people's raw emails, erased in one request, and the refs holding them.
    many_emails: tuple[str, ...]
    many_refs: frozenset[str]
    #: Raw emails of records spread over the table, none of which may survive pii-apply.
    sample_emails: tuple[str, ...]
    #: Records holding something the policy hashes or drops (the rest keep their content).
    personal: int


def _holding(records: list[WireRecord], test: Callable[[WireRecord], bool]) -> frozenset[str]:
    return frozenset(r["record_ref"] for r in records if test(r))


def _by_external_id(records: list[WireRecord], record: WireRecord) -> tuple[str, frozenset[str]]:
    """``SOURCE:ID`` of ``record``'s first entry, and the refs of every record holding that entry."""
    source = record["sources"][0]
    ident, name = source["external_id"], source["source_identity"]
    return f"{name}:{ident}", _holding(records, lambda r: any(
        name in (s.get("source_identity"), s.get("source_type")) and s.get("external_id") == ident
        for s in r["sources"]))


def targets(records: list[WireRecord]) -> Targets:
    """One person a third of the way in (by email), another two thirds in (by external id), a third
    half-way (by external id, once hashed)."""
    with_email = [r for r in records if r.get("email")]
    person = with_email[len(with_email) // 3]
    email = person["email"]
    external_id, external_refs = _by_external_id(records, records[2 * len(records) // 3])
    hashed_id, hashed_refs = _by_external_id(records, records[len(records) // 2])
    step = max(len(with_email) // SAMPLE, 1)
    erased_by_id = external_refs | hashed_refs
    taken = {email.strip().lower()} | {
        (r.get("email") or "").strip().lower() for r in records if r["record_ref"] in erased_by_id}
    others = [r["email"] for r in with_email[1::2] if r["email"].strip().lower() not in taken]
    many = tuple(dict.fromkeys(others[:: max(len(others) // MANY, 1)]))[:MANY]
    folded = {e.strip().lower() for e in many}
    return Targets(
        email=email,
        email_refs=_holding(records, lambda r: (r.get("email") or "").strip().lower() == email.strip().lower()),
        external_id=external_id,
        external_refs=external_refs,
        hashed_id=hashed_id,
        hashed_refs=hashed_refs,
        many_emails=many,
        many_refs=_holding(records, lambda r: (r.get("email") or "").strip().lower() in folded),
        sample_emails=tuple(r["email"] for r in with_email[::step]),
        personal=sum(1 for r in records
                     if r.get("email") or r.get("phone") or "employment" in (r.get("attributes") or {})),
    )


@dataclass
class Database:
    """One dialect's database for one round: its engine, and the tables made on it."""

    dialect: str
    engine: sa.Engine
    tables: list[str] = field(default_factory=list)

    def new_table(self) -> str:
        name = f"bench_piiops_{uuid.uuid4().hex[:10]}"
        self.tables.append(name)
        return name

    def drop(self) -> None:
        with self.engine.begin() as conn:
            for name in self.tables:
                for table in (*(companion_table_name(name, kind) for kind in _COMPANIONS), name):
                    conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}"')
        self.engine.dispose()


@contextmanager
def database(dialect: str, pg_url: str, workdir: Path, duckdb_memory_limit: str | None = None) -> Iterator[Database]:
    """A database for one round's tables; DuckDB a new file (its reclaim rewrites the whole file),
    opened with ``duckdb_memory_limit`` if given (duckdb_engine passes the URL's query to its config)."""
    url = pg_url if dialect == "postgres" else f"duckdb:///{workdir / f'piiops-{uuid.uuid4().hex[:10]}.duckdb'}"
    if dialect == "duckdb" and duckdb_memory_limit:
        url += f"?memory_limit={duckdb_memory_limit}"
    db = Database(dialect, sa.create_engine(url))
    try:
        yield db
    finally:
        db.drop()


def fill(engine: sa.Engine, table: str, records: list[WireRecord]) -> None:
    """Every record into a new table and its history, without a policy (untimed)."""
    writer = WarehouseWriter(engine, table=table, audit_table=companion_table_name(table, "runs"))
    writer.ensure_tables()
    writer.ensure_history_table()
    writer.write_run(SyncRunInfo(conn_id="bench", tool_name="people.search", arguments_hash="0" * 64),
                     iter(records), WriteOptions(audit=_AUDIT, reconcile=ReconcileOptions(sync_mode="full",
                                                                                          history=True)))


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(sa.table(table))).scalar_one())


def _refs_left(engine: sa.Engine, table: str, refs: frozenset[str]) -> int:
    where = sa.text("record_ref IN :refs").bindparams(sa.bindparam("refs", expanding=True))
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(sa.table(table)).where(where)
        return int(conn.execute(query, {"refs": sorted(refs)}).scalar_one())


def check_applied(engine: sa.Engine, table: str, applied: PolicyApplied, rows: int, who: Targets,
                  key: PiiKey) -> list[str]:
    """What is wrong after pii-apply: rows not rewritten, a raw email left, an email not hashed."""
    problems = []
    if (applied.records, applied.history, applied.wire_hashes) != (who.personal, who.personal, rows):
        problems.append(f"pii-apply rewrote {applied.records} rows and {applied.history} versions and keyed "
                        f"{applied.wire_hashes} wire hashes, expected {who.personal}, {who.personal} and {rows}")
    sample = who.sample_emails
    where = sa.text("email IN :emails").bindparams(sa.bindparam("emails", expanding=True))
    with engine.connect() as conn:
        for name in (table, companion_table_name(table, "history")):
            query = sa.select(sa.func.count()).select_from(sa.table(name)).where(where)
            raw = int(conn.execute(query, {"emails": list(sample)}).scalar_one())
            if raw:
                problems.append(f"{raw} raw email(s) of the {len(sample)} sampled left in {name}")
        hashed = [lookup_hash(key, "email", email) for email in sample]
        query = sa.select(sa.func.count()).select_from(sa.table(table)).where(where)
        found = int(conn.execute(query, {"emails": hashed}).scalar_one())
    if found != len(sample):
        problems.append(f"{found} of the {len(sample)} sampled emails stored as their keyed hash")
    return problems


def check_erased(engine: sa.Engine, table: str, label: str, erased: ErasedRows, refs: frozenset[str],
                 rows_before: int) -> list[str]:
    """What is wrong after an erasure: another number of refs found, a ref left, other rows gone."""
    problems = []
    if (erased.found, erased.records, erased.history) != (len(refs), len(refs), len(refs)):
        problems.append(f"{label} found {erased.found}, deleted {erased.records} rows and {erased.history} "
                        f"versions, expected {len(refs)} each")
    for name in (table, companion_table_name(table, "history")):
        if _refs_left(engine, name, refs):
            problems.append(f"{label} left a ref it had to erase in {name}")
    if _count(engine, table) != rows_before - len(refs):
        problems.append(f"{label} left {_count(engine, table)} rows, expected {rows_before - len(refs)}")
    return problems


class _Discarded:
    """Where the floor's new values go: nowhere. Like pii-apply's staged updates on PostgreSQL and
    DuckDB, it leaves the versions alike their row unread (the database updates those)."""

    runs_statements = False
    current_versions: tuple[_Target, ...] = ()

    def add(self, contents: list[tuple[object, ...]], wires: list[tuple[object, ...]]) -> None:
        return None

    def apply_staged(self, fields: frozenset[str], within: tuple[object, object]) -> None:
        return None


def pii_apply_floor(engine: sa.Engine, table: str, key: PiiKey) -> tuple[int, int]:
    """pii-apply's reads and per-row work on ``table`` and its history, nothing written: the rows and
    the versions read that it changed."""
    writer = WarehouseWriter(engine, table=table, audit_table=companion_table_name(table, "runs"))
    metadata, dialect = sa.MetaData(), writer.dialect.name
    (history,) = [c for c in COMPANIONS if c.suffix == "history"]
    plan = delta_policy(None, PiiPolicy.parse(BENCH_PII_POLICY).fingerprint(key)).plan(key)
    main = _Target(records_table(metadata, dialect, table), ("record_ref",), _Discarded(), (key,))  # type: ignore[arg-type]
    versions = _Target(history.table(table, dialect, None, metadata), history.row_key, _Discarded(),  # type: ignore[arg-type]
                       None)
    main.written.current_versions = (versions,)
    with engine.connect() as conn:  # read ahead on a thread where pii-apply reads beside its writes
        reader = conn if writer.dialect.capabilities.reads_beside_writes else None
        rewrite_targets(conn, main, [versions], plan, writer.dialect, reader=reader)
    return main.done.rows, versions.done.rows


@contextmanager
def statement_seconds(engine: sa.Engine) -> Iterator[list[float]]:
    """The seconds ``engine``'s connections spent in statements (from the driver's execute to its
    return, on any thread) while open; the first item of what it yields."""
    spent, lock, started = [0.0], threading.Lock(), threading.local()

    def before(*_: object) -> None:
        started.at = time.perf_counter()

    def after(*_: object) -> None:
        with lock:
            spent[0] += time.perf_counter() - started.at

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        yield spent
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)


@contextmanager
def peak_rss_growth() -> Iterator[list[float | None]]:
    """How far the process's peak RSS rose above its RSS at the start (MiB; None off Linux), the
    kernel's peak reset first; the first item of what it yields."""
    growth: list[float | None] = [None]
    before = rss_mib() if reset_peak_rss() else None
    yield growth
    if before is not None:
        growth[0] = peak_rss_mib() - before


def one_round(db: Database, records: list[WireRecord], who: Targets,
              key: PiiKey) -> tuple[list[float], float | None, list[str]]:
    """Fill a new table, then time pii-apply and the erasures on it: (seconds per step, pii-apply's
    peak RSS growth in MiB, problems)."""
    table = db.new_table()
    audit = companion_table_name(table, "runs")
    fill(db.engine, table, records)
    rows = _count(db.engine, table)
    started = time.perf_counter()
    changed = pii_apply_floor(db.engine, table, key)
    seconds = [time.perf_counter() - started]
    started = time.perf_counter()
    with peak_rss_growth() as growth, statement_seconds(db.engine) as in_statements:
        applied = apply_stricter_policy(db.engine, table=table, audit_table=audit,
                                        policy=PiiPolicy.parse(BENCH_PII_POLICY), key=key)
    seconds.extend((time.perf_counter() - started, in_statements[0]))
    problems = check_applied(db.engine, table, applied, rows, who, key)
    if changed[0] != applied.records or changed[1] > applied.history:
        problems.append(f"the floor changed {changed} rows and versions read, pii-apply "
                        f"{(applied.records, applied.history)}")

    def erase(label: str, refs: frozenset[str], *, emails: tuple[str, ...] = (),
              external_ids: tuple[str, ...] = ()) -> None:
        before = _count(db.engine, table)
        started = time.perf_counter()
        erased = erase_records(db.engine, table=table, audit_table=audit, key=key, emails=emails,
                               external_ids=external_ids)
        seconds.append(time.perf_counter() - started)
        problems.extend(check_erased(db.engine, table, label, erased, refs, before))

    erase("erase --email", who.email_refs, emails=(who.email,))
    erase("erase --external-id", who.external_refs, external_ids=(who.external_id,))
    # Untimed: the ids hashed too, then one more person erased by theirs.
    apply_stricter_policy(db.engine, table=table, audit_table=audit, policy=PiiPolicy.parse(HASHED_IDS), key=key)
    erase("erase --external-id, hashed", who.hashed_refs, external_ids=(who.hashed_id,))
    erase("erase 1,000 people", who.many_refs, emails=who.many_emails)
    # The floor under every erasure: the reclaim alone, with nothing left to delete (on DuckDB the
    # rewrite of the whole file).
    writer = WarehouseWriter(db.engine, table=table, audit_table=audit)
    touched = [table, *(companion_table_name(table, kind) for kind in ("history", "sources", "lineage")), audit]
    present = [name for name in touched if sa.inspect(db.engine).has_table(name)]
    started = time.perf_counter()
    reclaim_space(db.engine, writer.dialect, present, None)
    seconds.append(time.perf_counter() - started)
    return seconds, growth[0], [f"{NAMES[db.dialect]}: {p}" for p in problems]


def report(times: dict[str, list[list[float]]], growths: dict[str, list[float | None]], records: int,
           rounds: int) -> None:
    print(f"\nbench.pii_ops  {records:,} records (history on: as many versions), medians of {rounds} "
          f"interleaved rounds (seconds, every round in brackets)")
    for dialect, per_round in times.items():
        print(NAMES[dialect])
        for i, step in enumerate(STEPS):
            values = [r[i] for r in per_round]
            median = statistics.median(values)
            rate = f"{records / median:9,.0f} records/s" if step in ("pii-apply floor", "pii-apply") else ""
            print(f"  {step:<28} {median:8.2f} s  {rate:<18} [{', '.join(f'{v:.2f}' for v in values)}]")
        grown = [g for g in growths[dialect] if g is not None]
        if grown:
            print(f"  {'pii-apply, peak RSS growth':<28} {statistics.median(grown):8.1f} MiB{'':<19} "
                  f"[{', '.join(f'{g:.1f}' for g in grown)}]")


def run(pg_url: str, records: int, rounds: int, dialects: list[str], duckdb_memory_limit: str | None = None) -> int:
    print(f"building {records} records ...", flush=True)
    base = wire_records(records)
    who = targets(base)
    key = PiiKey.from_text(_BENCH_PII_KEY, source="bench")
    times: dict[str, list[list[float]]] = {d: [] for d in dialects}
    growths: dict[str, list[float | None]] = {d: [] for d in dialects}
    problems: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench_piiops_"))
    try:
        for round_no in range(1, rounds + 1):
            print(f"round {round_no}/{rounds}", flush=True)
            for dialect in dialects:
                with database(dialect, pg_url, workdir, duckdb_memory_limit) as db:
                    seconds, growth, found = one_round(db, base, who, key)
                times[dialect].append(seconds)
                growths[dialect].append(growth)
                problems += found
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(times, growths, len(base), rounds)
    for problem in problems:
        print("  PROBLEM:", problem)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pii_ops", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dialects", default=",".join(DIALECTS), help="comma list of postgres,duckdb")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--duckdb-memory-limit", default=None,
                        help="DuckDB's memory_limit, e.g. 256MB (a worker's); default: DuckDB's own, 80%% of RAM")
    args = parser.parse_args(argv)
    dialects = [d.strip() for d in args.dialects.split(",") if d.strip()]
    unknown = sorted(set(dialects) - set(DIALECTS))
    if unknown or not dialects:
        parser.error(f"--dialects: {', '.join(unknown) or 'none given'}; choose from {', '.join(DIALECTS)}")
    return run(args.pg_url, args.records, args.rounds, dialects, args.duckdb_memory_limit)


if __name__ == "__main__":
    sys.exit(main())
