"""``on_retire_guard="ask"`` at the warehouse: a guarded retirement held, then approved, rejected or overtaken.

Synthetic records through :class:`WarehouseWriter` on every dialect; the decision through Airflow's
Human-in-the-loop API is in tests/airflow/test_retirement_approval_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.warehouse.tables.companions import PENDING_RETIREMENTS
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.retirements import (
    DECISION_TOOL_NAME,
    apply_held_retirements,
    held_retirements,
    reject_held_retirements,
)
from airflow_provider_bos.wire import ReconcileOptions, check_reconcile
from tests.warehouse.whhelpers import T1, T2, make_record, rows_by_ref, run_info, write

ASK = ReconcileOptions(sync_mode="full", on_retire_guard="ask")
T3 = "2026-10-10T12:00:00Z"


def person(i: int, observed_at: str = T1, source: str = "crm-eu") -> dict[str, Any]:
    record = make_record(i, observed_at)
    record["sources"][0]["source_identity"] = source
    return record


def day1() -> list[dict[str, Any]]:
    """Ten people: 1-6 from crm-eu, 7-10 from hr-main."""
    return [person(i, source="crm-eu" if i <= 6 else "hr-main") for i in range(1, 11)]


def returned(observed_at: str, *numbers: int) -> list[dict[str, Any]]:
    return [person(i, observed_at, "crm-eu" if i <= 6 else "hr-main") for i in numbers]


def current(engine: sa.Engine, table: str) -> set[str]:
    return {ref for ref, row in rows_by_ref(engine, table).items() if row["_bos_deleted_at"] is None}


def refs(*numbers: int) -> set[str]:
    return {make_record(i)["record_ref"] for i in numbers}


def decision_rows(engine: sa.Engine, writer: Any) -> list[dict[str, Any]]:
    reader = AuditReader(engine, table=writer.audit_table)
    t = reader.table
    with engine.connect() as conn:
        ids = conn.execute(sa.select(t.c.run_id).where(t.c.tool_name == DECISION_TOOL_NAME)).scalars().all()
    return [reader.get_run(run_id) for run_id in ids]


def note_of(row: dict[str, Any]) -> str:
    """The audit row's note, wherever this audit table keeps notes."""
    return " ".join(filter(None, (row.get("notes"), row.get("error_message"))))


@pytest.fixture()
def asked(make_writer, engine) -> Iterator[tuple[Any, Any]]:
    """Day 1 (ten people) written; day 2 returns only 1, 2, 7: seven of ten would go (over 0.5), held."""
    writer = make_writer()
    write(writer, day1(), reconcile=ASK)
    holding = run_info()
    counts = write(writer, returned(T2, 1, 2, 7), holding, reconcile=ASK)
    assert (counts.retired, counts.retire_withheld) == (0, 7)
    yield writer, holding
    if engine.dialect.name != "sqlite":
        engine.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PENDING_RETIREMENTS.name(writer.table)}")


def test_a_guarded_retirement_is_held_and_the_run_stays_complete(asked, engine) -> None:
    writer, holding = asked
    assert current(engine, writer.table) == refs(*range(1, 11))  # nothing retired yet
    audit = AuditReader(engine, table=writer.audit_table).get_run(holding.run_id)
    assert (audit["status"], audit["retired"]) == ("complete", 0)
    assert "held for approval" in note_of(audit) and "7 of its scope's 10" in note_of(audit)
    held = held_retirements(engine, table=writer.table, run_id=holding.run_id, sample=3)
    assert held is not None
    assert (held.held, held.scope_rows, held.share) == (7, 10, 0.7)
    assert held.per_source == {"crm-eu": 4, "hr-main": 3}
    assert held.sample_refs == sorted(refs(3, 4, 5))
    assert "example.com" not in repr(held.as_dict()) and "Person" not in repr(held.as_dict())


def test_approval_retires_what_was_held_and_says_so_in_the_audit(asked, engine) -> None:
    writer, holding = asked
    decision = apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table,
                                      run_id=holding.run_id, decided_by="admin")
    assert (decision.outcome, decision.retired, decision.held) == ("applied", 7, 7)
    assert current(engine, writer.table) == refs(1, 2, 7)
    gone = rows_by_ref(engine, writer.table)[make_record(3)["record_ref"]]
    assert gone["_bos_run_id"] == decision.decision_run_id
    [row] = decision_rows(engine, writer)
    assert row["retired"] == 7 and "Approved" in note_of(row) and "'admin'" in note_of(row)
    assert held_retirements(engine, table=writer.table, run_id=holding.run_id) is None
    with pytest.raises(BosConfigurationError, match="No retirements are held"):  # decided once only
        apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table, run_id=holding.run_id)


def test_rejection_retires_nothing_and_leaves_a_note(asked, engine) -> None:
    writer, holding = asked
    decision = reject_held_retirements(engine, table=writer.table, audit_table=writer.audit_table,
                                       run_id=holding.run_id, decided_by="admin")
    assert (decision.outcome, decision.retired) == ("rejected", 0)
    assert current(engine, writer.table) == refs(*range(1, 11))
    [row] = decision_rows(engine, writer)
    assert row["retired"] == 0 and "Rejected" in note_of(row)
    assert held_retirements(engine, table=writer.table, run_id=holding.run_id) is None


def test_a_newer_read_overtakes_the_held_decision(asked, engine) -> None:
    writer, holding = asked
    # The next night everyone is back: a complete read that retires nobody.
    write(writer, returned(T3, *range(1, 11)), reconcile=ASK)
    decision = apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table,
                                      run_id=holding.run_id)
    assert (decision.outcome, decision.retired) == ("overtaken", 0)
    assert decision.newer_run_id is not None and decision.newer_run_id in decision.note
    assert current(engine, writer.table) == refs(*range(1, 11))
    [row] = decision_rows(engine, writer)
    assert "Not applied" in note_of(row)
    assert held_retirements(engine, table=writer.table, run_id=holding.run_id) is None  # forgotten


def test_a_newer_hold_replaces_the_older_one(asked, engine) -> None:
    writer, holding = asked
    newer = run_info()
    write(writer, returned(T3, 1, 2, 3), newer, reconcile=ASK)
    assert held_retirements(engine, table=writer.table, run_id=holding.run_id) is None
    assert held_retirements(engine, table=writer.table, run_id=newer.run_id).held == 7
    late = apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table, run_id=holding.run_id)
    assert (late.outcome, late.retired, late.newer_run_id) == ("overtaken", 0, newer.run_id)
    assert current(engine, writer.table) == refs(*range(1, 11))
    assert held_retirements(engine, table=writer.table, run_id=newer.run_id).held == 7  # the newer hold stays


def test_an_erased_person_leaves_the_held_decision_too(asked, engine) -> None:
    writer, holding = asked
    engine.dispose()
    erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=sorted(refs(3)))
    assert held_retirements(engine, table=writer.table, run_id=holding.run_id).held == 6
    decision = apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table,
                                      run_id=holding.run_id)
    assert (decision.outcome, decision.retired) == ("applied", 6)  # the erasure is no newer read


def test_the_default_still_fails_the_guard(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=ReconcileOptions(sync_mode="full"))
    run = run_info()
    write(writer, returned(T2, 1), run, reconcile=ReconcileOptions(sync_mode="full"))
    assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["status"] == "partial"
    assert not sa.inspect(engine).has_table(companion_table_name(writer.table, "pending_retirements"))


def test_an_unknown_guard_action_is_refused() -> None:
    with pytest.raises(BosConfigurationError, match="on_retire_guard must be one of"):
        check_reconcile(sync_mode="full", on_retire_guard="approve")


@pytest.mark.parametrize("deletions", ["soft", "hard"])
def test_approval_retires_as_the_read_would_have_with_history(make_writer, engine, deletions) -> None:
    options = ReconcileOptions(sync_mode="full", on_retire_guard="ask", deletions=deletions, history=True)
    writer = make_writer()
    write(writer, day1(), reconcile=options)
    holding = run_info()
    write(writer, returned(T2, 1, 2, 7), holding, reconcile=options)
    try:
        decision = apply_held_retirements(engine, table=writer.table, audit_table=writer.audit_table,
                                          run_id=holding.run_id, deletions=deletions, history=True)
        assert decision.retired == 7
        rows = rows_by_ref(engine, writer.table)
        if deletions == "hard":
            assert set(rows) == refs(1, 2, 7)
        else:
            assert current(engine, writer.table) == refs(1, 2, 7) and len(rows) == 10
        history = companion_table_name(writer.table, "history")
        with engine.connect() as conn:
            open_refs = set(conn.exec_driver_sql(
                f"SELECT record_ref FROM {history} WHERE _bos_valid_to IS NULL").scalars())
        assert open_refs == refs(1, 2, 7)  # the retired rows' versions closed
    finally:
        if engine.dialect.name != "sqlite":
            engine.dispose()
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PENDING_RETIREMENTS.name(writer.table)}")
