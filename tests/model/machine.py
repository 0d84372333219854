"""The stateful test's machinery: days of reads, erasures and pii-apply through the real code, and
after every step each table compared with :class:`~tests.model.model.TablesModel`.

The system under test is the run side as a task runs it: :func:`airflow_provider_bos.sync.run_sync`
with a :class:`~airflow_provider_bos.warehouse.WarehouseWriter` (a new one per run, as each task
makes one), fed by :class:`ScriptedRead`, which hands out the final records as the MCP scanner does
(each record's exact bytes hashed, byte-identical ones as :class:`~airflow_provider_bos.wire.KnownRecord`
claims); under a personal-data policy, :class:`~airflow_provider_bos.pii.stream.PolicyRun` applies it
on the way. Erasure is :func:`~airflow_provider_bos.warehouse.upkeep.erase.erase_records`, the stricter policy
:func:`~airflow_provider_bos.warehouse.upkeep.pii_apply.apply_stricter_policy`.

The model and the table reader (:mod:`.model`, :mod:`.tables`) share no code with any of it.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import sqlalchemy as sa
from hypothesis import assume
from hypothesis import event as hypothesis_event
from hypothesis import note as hypothesis_note
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.mcp.final_frame import known_record
from airflow_provider_bos.models import SourceErrorEntry
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION
from airflow_provider_bos.pii.stream import PolicyRun
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.wire import ReconcileOptions, WireRecord, wire_hash
from tests.model.model import (
    COUNT_NAMES,
    JSON_FIELDS,
    TEXT_FIELDS,
    Key,
    ModelLimit,
    Policy,
    Refused,
    TablesModel,
    canonical,
)
from tests.model.records import (
    SOURCES,
    Day,
    Incremental,
    Join,
    Partial,
    World,
    days,
    populations,
    read_time,
)
from tests.model.tables import Tables, decode, read_tables, same_json, table_names, utc

KEY_TEXT = "vm_VcIjlK7NqBh4ELc_iAvBW4HzxQw11JpPfOQfBd-uaK1hP"  # random, as a key must be
SUT_KEY = PiiKey.from_text(KEY_TEXT, source="the model test")
#: The model's key: the same text, the recipe the package says it hashes with (its version only).
MODEL_KEY = Key(KEY_TEXT, recipe=RECIPE_VERSION)

#: The policy the raw-value check runs with while the rules for lifecycle, identity_match and an
#: entry's unnamed keys do not exist.
BASIC = {"email": "hash", "phone": "hash", "display_name": "hash", "attributes": "hash",
         "sources[].external_id": "hash"}
#: The stricter one: every field hashed (object keys stay), lifecycle, identity_match and entries'
#: extra keys included.
STRICT = {"*": "hash"}
#: What pii-apply moves a table to next (each stricter than the one before).
LADDER: tuple[dict[str, str] | None, ...] = (
    None, {"email": "hash"}, BASIC, {**BASIC, "phone": "drop", "display_name": "drop"})

#: A marker's tag -> the policy field it stands in (tests/model/records.py).
TAG_FIELDS = {"N": "display_name", "E": "email", "P": "phone", "L": "lifecycle", "I": "identity_match",
              "A": "attributes", "X": "sources[].external_id", "S": "sources[].*"}
MARKER = re.compile(r"pii([NEPLIAXS])\d+")


def strict_rules_missing() -> str | None:
    """The policy rule the stricter raw check needs and the policy does not know yet (None: all there)."""
    for rule_name in ("lifecycle", "identity_match", "sources[].*", "*"):
        try:
            PiiPolicy.parse({rule_name: "hash"})
        except BosConfigurationError:
            return rule_name
    return None


# --- where an example writes --------------------------------------------------------------------

class Destination:
    """A fresh records table per example: a database file of its own (SQLite, DuckDB) or a table of a
    unique name (PostgreSQL, MariaDB), dropped after."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url = sa.make_url(url)
        self.directory = directory
        self.count = 0

    @property
    def embedded(self) -> bool:
        return self.url.get_backend_name() in ("sqlite", "duckdb")

    def new(self) -> tuple[sa.Engine, str]:
        self.count += 1
        url = self.url
        if self.embedded:
            suffix = ".duckdb" if url.get_backend_name() == "duckdb" else ".db"
            url = url.set(database=str(self.directory / f"model-{self.count}{suffix}"))
        engine = sa.create_engine(url, pool_size=1, max_overflow=0)
        return engine, f"m_{uuid.uuid4().hex[:10]}"

    def drop(self, engine: sa.Engine, table: str) -> None:
        try:
            if not self.embedded:
                engine.dispose()
                with engine.begin() as conn:
                    for name in table_names(conn, engine.dialect.name, table):
                        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        finally:
            engine.dispose()


# --- what leaves the code besides the tables: logs and staged files ---------------------------------

@dataclass
class Observed:
    """Log lines and staged files seen while the steps ran (the test's fixtures fill it)."""

    logs: Callable[[], list[str]] = list
    staged: list[str] = field(default_factory=list)
    stage_base: Path | None = None


# --- the read ----------------------------------------------------------------------------------------

class ScriptedRead:
    """A streamed final result as the MCP scanner hands it out: each record's exact bytes hashed (its
    wire hash), a record whose hash the writer already stores as a :class:`KnownRecord` claim."""

    def __init__(self, pieces: list[bytes], *, completeness: str, source_errors: list[dict[str, Any]],
                 observed_at: str) -> None:
        self._pieces = pieces
        self.known: Any = None
        self.known_records = 0
        self.completeness = completeness
        self.is_error = completeness != "complete"
        self.metadata = SimpleNamespace(observed_at=observed_at)
        self.context = None
        self.warnings: list[str] = []
        self.contradictions: list[str] = []
        self.source_errors = [SourceErrorEntry.model_validate(e) for e in source_errors]
        self.result_count = len(pieces)
        self.observations = SimpleNamespace(provisional_records=0, pages=0, stream_resumptions=0, summary=list)

    def __call__(self, tool_name: str, arguments: dict[str, Any], **_: Any) -> ScriptedRead:
        return self

    def use_known_wire_hashes(self, known: Any) -> bool:
        self.known = known
        return True

    @property
    def complete(self) -> bool:
        return self.completeness == "complete"

    @property
    def records(self) -> Iterator[Any]:
        for piece in self._pieces:
            raw = wire_hash(piece)
            handle = self.known.match(raw) if self.known is not None and len(self.known) else None
            claim = known_record(piece, raw, self.known, handle) if handle is not None else None
            if claim is not None:  # the claim the scanner hands out (with the piece's own stamp)
                self.known_records += 1
                yield claim
                continue
            record = WireRecord(json.loads(piece))
            record.wire_hash = raw
            yield record

    def close(self) -> None:
        pass

    def __enter__(self) -> ScriptedRead:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def note(text: str) -> None:
    """A line of the failing example's report (nothing when a step runs outside Hypothesis)."""
    try:
        hypothesis_note(text)
    except InvalidArgument:
        pass


def event(text: str) -> None:
    """A statistic of the run (``--hypothesis-show-statistics``; nothing outside Hypothesis)."""
    try:
        hypothesis_event(text)
    except InvalidArgument:
        pass


def wire_bytes(record: dict[str, Any]) -> bytes:
    """A record as BOS sends it: compact JSON, UTF-8."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


# --- the machine -----------------------------------------------------------------------------------

class TablesMachine(RuleBasedStateMachine):
    """Days of reads, erasures and pii-apply; every table compared with the model after each step.

    Configured by :func:`machine_for` (the destination, the policy the table starts with, whether
    pii-apply steps run, where logs and staged files are observed).
    """

    destination: ClassVar[Destination]
    start_policy: ClassVar[dict[str, str] | None] = None
    ladder: ClassVar[tuple[dict[str, str] | None, ...]] = LADDER
    observed: ClassVar[Observed] = Observed()

    def __init__(self) -> None:
        super().__init__()
        self.engine, self.table = self.destination.new()
        self.audit_table = f"{self.table}_runs"
        self.world = World()
        self.day = 0
        self.rules: dict[str, str] | None = copy.deepcopy(self.start_policy)
        self.model = TablesModel(key=MODEL_KEY, policy=Policy(self.rules))
        self.before: Tables | None = None
        self.sent: list[dict[str, Any]] = []  # every record sent, raw (what requests name)
        self.logs_seen = 0
        self.staged_seen = 0
        self.pending: list[str] = []  # what a step let out that it should not have, for the invariant

    def teardown(self) -> None:
        self.destination.drop(self.engine, self.table)

    # --- the steps --------------------------------------------------------------------------------

    @initialize(people=st.deferred(populations), fraction=st.sampled_from([0.5, None]),
                deletions=st.sampled_from(["soft", "soft", "hard"]))
    def first_day(self, people: tuple[Join, ...], fraction: float | None, deletions: str) -> None:
        self.model.max_retire_fraction = fraction
        self.model.deletions = deletions
        for join in people:
            self.world.apply(join)
        self.sync(Day())

    @rule(day=st.deferred(lambda: days("full")))
    def full_day(self, day: Day) -> None:
        self.sync(day)

    @rule(day=st.deferred(lambda: days("merge")))
    def merge_day(self, day: Day) -> None:
        self.sync(day)

    @rule(day=st.deferred(lambda: days("partial")))
    def partial_day(self, day: Day) -> None:
        self.sync(day)

    @rule(day=st.deferred(lambda: days("incremental")))
    def incremental_day(self, day: Day) -> None:
        self.sync(day)

    @rule(how=st.sampled_from(["ref", "merged ref", "merged ref", "email", "phone", "external id (source)",
                               "external id (type)"]),
          pick=st.integers(0, 99), spelling=st.sampled_from(["as sent", "upper", "spaced"]))
    def erase(self, how: str, pick: int, spelling: str) -> None:
        """An erasure request naming a person by ref (or the ref others were merged into), by an email or
        phone they were sent with (spelled as sent, upper case or padded), or by an external id."""
        if how in ("ref", "merged ref"):
            refs = sorted(self.model.rows)
            if how == "merged ref":  # the ref others were merged into, where there is one
                refs = sorted({s for _, s, _ in self.model.lineage if s in self.model.rows}) or refs
            self.erase_named(refs=[refs[pick % len(refs)] if refs else "bos:person:nobody"])
        elif how in ("email", "phone"):
            values = [r[how] for r in self.sent if isinstance(r.get(how), str) and "pii" in r[how]]
            value = values[pick % len(values)] if values else "nobody@example.org" if how == "email" else "+1 555 0100"
            if spelling == "upper" and how == "email":
                value = value.upper()
            elif spelling == "spaced":
                value = f"  {value} "
            self.erase_named(**{f"{how}s": [value]})
        else:
            entries = [e for r in self.sent for e in r["sources"]]
            if not entries:
                self.erase_named(external_ids=["crm-eu:nobody"])
                return
            entry = entries[pick % len(entries)]
            if how.endswith("(type)"):
                self.erase_named(external_ids_of_type=[f"{entry['source_type']}:{entry['external_id']}"])
            else:
                self.erase_named(external_ids=[f"{entry['source_identity']}:{entry['external_id']}"])

    def stricter(self) -> dict[str, str] | None:
        rungs = list(self.ladder)
        if self.rules not in rungs:
            return None
        at = rungs.index(self.rules)
        return rungs[at + 1] if at + 1 < len(rungs) else None

    @precondition(lambda self: self.stricter() is not None)
    @rule()
    def pii_apply(self) -> None:
        rules = self.stricter()
        assert rules is not None
        expected = self.model.pii_apply(rules, run_id="pending")
        applied = apply_stricter_policy(self.engine, table=self.table, audit_table=self.audit_table, policy=rules,
                                        key=SUT_KEY)
        if "pending" in self.model.runs:
            self.model.runs[applied.run_id] = self.model.runs.pop("pending")
            self.model.runs[applied.run_id].run_id = applied.run_id
        self.rules = rules
        self.observe_step()
        # The stored wire hashes themselves are compared by the invariant; the count of them is left to
        # test_model_regressions.py (it counts rows whose content changed even when they had none).
        got = (applied.records, applied.history, applied.rejects)
        assert got == (expected.records, expected.history, 0), (
            f"pii-apply to {rules}: (records, history, rejects) {got}, the model says "
            f"{(expected.records, expected.history, 0)}")

    # --- running a step ---------------------------------------------------------------------------

    def policy_run(self) -> PolicyRun | None:
        return PolicyRun.of(PiiPolicy.parse(self.rules), SUT_KEY) if self.rules else None

    def sync(self, day: Day) -> None:
        self.day += 1
        for happening in day.events:
            self.world.apply(happening)
        records = self.world.read(day, self.day)
        read = day.read
        mode = read.mode if isinstance(read, Partial) else "incremental" if isinstance(read, Incremental) else "full"
        complete = not isinstance(read, Partial)
        errors = []
        if isinstance(read, Partial):
            source_type, source_identity = SOURCES[read.failing]
            errors = [{"source": {"source_type": source_type, "source_identity": source_identity},
                       "error": {"code": read.code}}]
        read_at = read_time(self.day)
        pieces = [wire_bytes(r) for r in records]
        run = SyncRunInfo(dag_id="model", task_id="people", airflow_run_id=f"day-{self.day}", conn_id="bos_default",
                          context_handle="ctx-model", tool_name="people.search", arguments_hash="0" * 64)
        note(f"day {self.day}: {mode} {'complete' if complete else 'partial'} read of "
             f"{[r['record_ref'] for r in records]} (run {run.run_id})")
        try:
            expected = self.model.sync(records, [wire_hash(p) for p in pieces], run_id=run.run_id, mode=mode,
                                       complete=complete, read_at=read_at, source_errors=errors)
        except ModelLimit as exc:
            note(f"not a valid example: {exc}")
            assume(False)
        self.sent.extend(records)
        writer = WarehouseWriter(self.engine, table=self.table, audit_table=self.audit_table)
        scripted = ScriptedRead(pieces, completeness="complete" if complete else "partial", source_errors=errors,
                                observed_at=read_at.isoformat())
        options = ReconcileOptions(sync_mode=mode, history=True, deletions=self.model.deletions,
                                   max_retire_fraction=self.model.max_retire_fraction)
        outcome = run_sync(scripted, writer, run, tool_name="people.search", arguments={}, reconcile=options,
                           pii=self.policy_run())
        self.observe_step()
        for name in ("updated", "superseded", "retired", "retire_withheld", "withheld", "duplicates"):
            if expected[name]:
                event(f"a {mode} {'complete' if complete else 'partial'} read with {name}")
        if scripted.known_records:
            event("records skipped undecoded (claims)")
        got = {name: getattr(outcome.counts, name) for name in COUNT_NAMES}
        assert got == expected, (f"day {self.day} ({mode}, {'complete' if complete else 'partial'}): counts "
                                 f"{_diff(got, expected)}")
        assert outcome.status == self.model.runs[run.run_id].status, (
            f"day {self.day}: status {outcome.status!r}, the model says {self.model.runs[run.run_id].status!r}")

    def erase_named(self, **finders: list[str]) -> None:
        """One erasure request; where the model says it must be refused (a split to decide, a dropped
        field), it must be refused with nothing changed; a split is then decided by keeping the others."""
        note(f"erase {finders}")
        try:
            expected = self.model.erase(**finders, run_id="pending")
        except Refused as refused:
            note(f"the model refuses: {refused}")
            event("an erasure refused")
            self.erase_refused(finders)
            keep = getattr(refused, "keep", None)
            if keep is None:
                return
            finders = {**finders, "keep_successors": keep}
            note(f"erase {finders}")
            try:
                expected = self.model.erase(**finders, run_id="pending")
            except Refused as again:
                note(f"the model refuses: {again}")
                self.erase_refused(finders)
                return
        erased = erase_records(self.engine, table=self.table, audit_table=self.audit_table, key=SUT_KEY,
                               **self.erase_arguments(finders))
        self.observe_step()
        self.model.runs[erased.run_id] = self.model.runs.pop("pending")
        self.model.runs[erased.run_id].run_id = erased.run_id
        got = {name: getattr(erased, name) for name in ("found", "merged", "successors", "records", "history",
                                                         "lineage", "sources", "rejects")}
        want = {name: getattr(expected, name) for name in got}
        for name in ("found", "merged", "successors"):
            if want[name]:
                event(f"an erasure with {name}")
        assert got == want, f"erase {finders}: {_diff(got, want)}"

    @staticmethod
    def erase_arguments(finders: dict[str, list[str]]) -> dict[str, list[str]]:
        return {{"refs": "record_refs"}.get(k, k): v for k, v in finders.items()}

    def erase_refused(self, finders: dict[str, list[str]]) -> None:
        try:
            erase_records(self.engine, table=self.table, audit_table=self.audit_table, key=SUT_KEY,
                          **self.erase_arguments(finders))
        except BosConfigurationError:
            self.model.touched, self.model.wire_only = set(), set()
            self.observe_step()
            return
        raise AssertionError(f"erase {finders} was not refused (the model refuses it)")

    # --- the invariants -------------------------------------------------------------------------

    @invariant()
    def tables_are_the_model(self) -> None:
        if self.day == 0:
            return
        tables = read_tables(self.engine, self.table)
        problems = compare(self.model, tables, self.before)
        problems += self.raw_values(tables)
        confirmed = WarehouseWriter(self.engine, table=self.table, audit_table=self.audit_table).last_confirmed()
        if {ref: utc(at) for ref, at in confirmed.items()} != self.model.last_confirmed():
            problems.append(f"last_confirmed(): {confirmed}, the model says {self.model.last_confirmed()}")
        self.before = tables
        assert not problems, "the tables differ from the model:\n  " + "\n  ".join(problems[:25])

    def observe_step(self) -> None:
        """After a step: its log lines and staged files, held to the policy the step ran under (kept for
        the invariant to report)."""
        covered = {tag for tag, name in TAG_FIELDS.items() if self.model.policy.action(name) != "keep"}
        logs = self.observed.logs()
        new_logs, self.logs_seen = logs[self.logs_seen:], len(logs)
        new_staged, self.staged_seen = self.observed.staged[self.staged_seen:], len(self.observed.staged)
        for where, text in [*(("a log line", t) for t in new_logs), *(("a staged file", t) for t in new_staged)]:
            self.pending += leaks(text, where, covered, self.model.policy)

    def raw_values(self, tables: Tables) -> list[str]:
        """With a personal-data policy: no raw value of a field it hashes or drops anywhere (every
        column of every table, every staged file, every log line). And no erased ref anywhere."""
        problems, self.pending = self.pending, []
        covered = {tag for tag, name in TAG_FIELDS.items() if self.model.policy.action(name) != "keep"}
        problems += leaks(tables.text, "the tables", covered, self.model.policy)
        base = self.observed.stage_base
        if base is not None and (base / "bos-stage").exists():
            left = [p for p in (base / "bos-stage").rglob("*") if p.is_file()]
            if left:
                problems.append(f"staged files left after the step: {left[:3]}")
        for ref in sorted(self.model.erased):
            pattern = re.compile(re.escape(ref) + r"(?![0-9A-Za-z])")
            if pattern.search(tables.text):
                where = [line.split(":", 1)[0] for line in tables.text.splitlines() if pattern.search(line)]
                problems.append(f"erased ref {ref!r} still in {sorted(set(where))}")
        return problems


def leaks(text: str, where: str, covered: set[str], policy: Policy) -> list[str]:
    """The raw values (markers) of the fields ``covered`` in ``text``, as a problem line."""
    leaked = sorted({m.group(0) for m in MARKER.finditer(text) if m.group(1) in covered})
    if not leaked:
        return []
    fields = sorted({TAG_FIELDS[m[3]] for m in leaked})
    return [f"raw values of {fields} ({leaked[:5]}) in {where} under {policy}"]


def _diff(got: dict[str, Any], want: dict[str, Any]) -> str:
    return ", ".join(f"{k}={got.get(k)!r} (model: {want.get(k)!r})" for k in sorted(set(got) | set(want))
                     if got.get(k) != want.get(k)) or "equal"


# --- the comparison ----------------------------------------------------------------------------------

def _content_problems(what: str, expected: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    problems = []
    for name in TEXT_FIELDS:
        if stored.get(name) != expected[name]:
            problems.append(f"{what}.{name}: stored {stored.get(name)!r}, the model says {expected[name]!r}")
    for name in (*JSON_FIELDS, "sources"):
        if not same_json(expected[name], stored.get(name)):
            problems.append(f"{what}.{name}: stored {stored.get(name)!r}, the model says {expected[name]!r}")
    return problems


def compare(model: TablesModel, tables: Tables, before: Tables | None) -> list[str]:
    """Every difference between the stored tables and the model, as readable lines."""
    problems: list[str] = []
    # The records table.
    stored_refs, model_refs = set(tables.records), set(model.rows)
    if stored_refs != model_refs:
        problems.append(f"records: refs missing {sorted(model_refs - stored_refs)}, "
                        f"unexpected {sorted(stored_refs - model_refs)}")
    hashes: dict[tuple[str, str], set[str]] = {}  # (ref, content) -> stored content hashes
    for ref in sorted(stored_refs & model_refs):
        row, got = model.rows[ref], tables.records[ref]
        problems += _content_problems(f"records[{ref}]", row.stored, got)
        for column, want in (("_bos_observed_at", row.observed_at), ("_bos_deleted_at", row.deleted_at)):
            if utc(got[column]) != want:
                problems.append(f"records[{ref}].{column}: stored {utc(got[column])}, the model says {want}")
        for column, want in (("_bos_superseded_by", row.superseded_by), ("_bos_run_id", row.run_id),
                             ("_bos_wire_hash", row.wire_hash)):
            if got[column] != want:
                problems.append(f"records[{ref}].{column}: stored {got[column]!r}, the model says {want!r}")
        hashes.setdefault((ref, row.key), set()).add(got["_bos_record_hash"])
    # A row the step did not write or retire is not rewritten: every column as it was.
    if before is not None and model.touched is not None:
        for ref in sorted((stored_refs & set(before.records_text)) - model.touched):
            now, then = tables.records_text[ref], before.records_text[ref]
            if ref in model.wire_only:
                wire = list(tables.records[ref]).index("_bos_wire_hash")
                now, then = now[:wire] + now[wire + 1:], then[:wire] + then[wire + 1:]
            if now != then:
                columns = list(tables.records[ref])
                changed = [columns[i] for i, (a, b) in enumerate(zip(now, then, strict=True)) if a != b]
                problems.append(f"records[{ref}]: not written by the step, yet {changed} changed")
    # History.
    by_ref: dict[str, list[dict[str, Any]]] = {}
    for version in tables.history:
        by_ref.setdefault(version["record_ref"], []).append(version)
    for ref in sorted(set(by_ref) | set(model.history)):
        stored = sorted(by_ref.get(ref, []), key=lambda v: utc(v["_bos_valid_from"]))
        expected = model.history.get(ref, [])
        if len(stored) != len(expected):
            problems.append(f"history[{ref}]: {len(stored)} versions, the model says {len(expected)}")
            continue
        for i, (want, got) in enumerate(zip(expected, stored, strict=True)):
            problems += _content_problems(f"history[{ref}][{i}]", want.stored, got)
            if utc(got["_bos_observed_at"]) != want.observed_at:
                problems.append(f"history[{ref}][{i}]._bos_observed_at: stored {utc(got['_bos_observed_at'])}, "
                                f"the model says {want.observed_at}")
            if got["_bos_run_id"] != want.run_id:
                problems.append(f"history[{ref}][{i}]._bos_run_id: stored {got['_bos_run_id']!r}, "
                                f"the model says {want.run_id!r}")
            if (got["_bos_valid_to"] is None) != want.open:
                problems.append(f"history[{ref}][{i}]: {'open' if got['_bos_valid_to'] is None else 'closed'}, "
                                f"the model says {'open' if want.open else 'closed'}")
            elif got["_bos_valid_to"] is not None:
                start, end = utc(got["_bos_valid_from"]), utc(got["_bos_valid_to"])
                assert start is not None and end is not None
                if end < start:
                    problems.append(f"history[{ref}][{i}]: valid_to {end} before valid_from {start}")
                if want.replaced and i + 1 < len(stored) and utc(stored[i + 1]["_bos_valid_from"]) != end:
                    problems.append(f"history[{ref}][{i}]: closed at {end}, the next version opens at "
                                    f"{utc(stored[i + 1]['_bos_valid_from'])}")
            hashes.setdefault((ref, want.key), set()).add(got["_bos_record_hash"])
    # The content hash, per ref (what the change test compares): one per content, another for
    # different content.
    owners: dict[tuple[str, str], list[str]] = {}
    for (ref, content), found in hashes.items():
        if len(found) != 1:
            problems.append(f"{ref}: one content stored under {len(found)} content hashes: {content[:300]}")
        for digest in found:
            if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                problems.append(f"{ref}: _bos_record_hash {digest!r} is not 64 hex characters")
            owners.setdefault((ref, digest), []).append(content)
    for (ref, digest), contents in owners.items():
        if len(contents) > 1:
            problems.append(f"{ref}: content hash {digest} stands for {len(contents)} different contents: "
                            f"{[c[:200] for c in contents]}")
    # Lineage.
    lineage = Counter((r["record_ref"], r["successor_ref"], r["run_id"]) for r in tables.lineage)
    if lineage != Counter(model.lineage):
        problems.append(f"lineage: stored {sorted(lineage.elements())}, the model says {sorted(model.lineage)}")
    # Provenance.
    entries = []
    for e in tables.sources:
        capabilities = e["capabilities"]
        entries.append((e["record_ref"], int(e["entry_index"]), e["source_type"], e["source_identity"],
                        e["external_id"], e["record_type"], e["version"],
                        canonical(capabilities) if isinstance(capabilities, list) else repr(capabilities),
                        bool(e["is_current"])))
    if Counter(entries) != Counter(model.provenance()):
        stored_set, model_set = set(entries), model.provenance()
        problems.append(f"sources: stored but not in the model {sorted(stored_set - model_set, key=repr)[:4]}; "
                        f"in the model, not stored {sorted(model_set - stored_set, key=repr)[:4]}")
    # The audit rows.
    problems += _run_problems(model, tables)
    # The policy row.
    if model.policy.empty:
        if tables.policy:
            problems.append(f"a policy row without a policy: {tables.policy}")
    else:
        fingerprints = [decode(r["fingerprint"]) for r in tables.policy]
        want = model.policy.fingerprint(MODEL_KEY)
        if len(fingerprints) != 1 or not same_json(want, fingerprints[0]):
            problems.append(f"policy: stored {fingerprints}, the model says {want}")
    if tables.rejects:
        problems.append(f"rejects: {len(tables.rejects)} rows, the model says none")
    return problems


def _run_problems(model: TablesModel, tables: Tables) -> list[str]:
    problems = []
    if set(tables.runs) != set(model.runs):
        problems.append(f"audit rows: {len(tables.runs)} stored, the model says {len(model.runs)} "
                        f"(missing {sorted(set(model.runs) - set(tables.runs))}, "
                        f"unexpected {sorted(set(tables.runs) - set(model.runs))})")
    scopes = set()
    for run_id, want in model.runs.items():
        got = tables.runs.get(run_id)
        if got is None:
            continue
        what = f"audit[{want.kind} {run_id[:8]}]"
        if want.kind == "erase":
            if got["tool_name"] != "airflow-provider-bos erase" or got["scope"] is not None:
                problems.append(f"{what}: tool {got['tool_name']!r}, scope {got['scope']!r}")
            continue
        if want.kind == "pii-apply":
            if got["tool_name"] != "airflow-provider-bos pii-apply" or got["result_count"] != want.result_count:
                problems.append(f"{what}: tool {got['tool_name']!r}, result_count {got['result_count']!r} "
                                f"(the model says {want.result_count})")
            continue
        scopes.add(got["scope"])
        for column in ("status", "completeness", "result_count"):
            if got[column] != getattr(want, column):
                problems.append(f"{what}.{column}: stored {got[column]!r}, the model says {getattr(want, column)!r}")
        for column, value in want.counts.items():
            if column != "retire_withheld" and got[column] != value:
                problems.append(f"{what}.{column}: stored {got[column]!r}, the model says {value!r}")
        if utc(got["confirmed_at"]) != want.confirmed_at:
            problems.append(f"{what}.confirmed_at: stored {got['confirmed_at']!r}, the model says {want.confirmed_at}")
        if not same_json(want.coverage, got["coverage"]):
            problems.append(f"{what}.coverage: stored {got['coverage']!r}, the model says {want.coverage!r}")
        stored_errors = got["source_errors"]
        if not (same_json(want.source_errors, stored_errors) or (not want.source_errors and stored_errors is None)):
            problems.append(f"{what}.source_errors: stored {stored_errors!r}, the model says {want.source_errors!r}")
        said = f"{got['error_message'] or ''} {got.get('notes') or ''}"  # a partial run's cause, or a note
        for text in want.notes:
            if text not in said:
                problems.append(f"{what}.error_message/notes {said!r} do not say {text!r}")
    if None in scopes or len(scopes) > 1:
        problems.append(f"the sync runs' scopes: {scopes} (one read, one scope)")
    return problems


def machine_for(destination: Destination, *, start_policy: dict[str, str] | None = None,
                ladder: tuple[dict[str, str] | None, ...] = LADDER, observed: Observed | None = None,
                ) -> type[TablesMachine]:
    """The machine of one test: its destination, starting policy, pii-apply ladder and observers."""
    return type("Machine", (TablesMachine,), {
        "destination": destination, "start_policy": start_policy, "ladder": ladder,
        "observed": observed or Observed()})

