"""Examples the stateful model test found, each as explicit records and steps.

Each test replays a failing example through the same machine (:mod:`tests.model.machine`): the same
run side, writer and model, every table compared with the model after each step. A test of a writer
defect still open says so where it stands (a strict ``xfail``, or the failure it expects), so it fails
the moment the defect is fixed and the mark must go.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.model.machine import BASIC, LADDER, SUT_KEY, Destination, Observed, TablesMachine, machine_for
from tests.model.records import MISSING, Change, Content, Day, EntrySpec, Join, Leave

PLAIN = Content(display_name=None, email=None, phone=None, lifecycle=None, identity_match=None, attributes={})


def person(external_id: str, **content: object) -> Join:
    """Someone with one entry in crm-eu, ``external_id``, and ``content`` (the rest null)."""
    return Join(content=Content(**{**PLAIN.__dict__, **content}), entries=(EntrySpec(0, external_id),))


@pytest.fixture()
def machine(warehouse_url: str, tmp_path: Path, observed: Observed) -> Iterator[TablesMachine]:
    """A machine on ``warehouse_url`` with no personal-data policy, torn down after."""
    state = machine_for(Destination(warehouse_url, tmp_path), start_policy=None, ladder=LADDER, observed=observed)()
    try:
        yield state
    finally:
        state.teardown()


# --- a JSON string where lifecycle and identity_match are stored ----------------------------------------

def test_lifecycle_and_identity_match_change_json_type_from_a_string(machine: TablesMachine) -> None:
    """The contract names no type for ``lifecycle`` and ``identity_match``: any JSON value may come. A
    stored JSON string (``"active"``) is read back as that string on the next run (PostgreSQL, MariaDB
    and DuckDB once failed it with a JSONDecodeError), then changes to an object, a number, null, and
    is re-read unchanged; pii-apply reads every stored row back too."""
    machine.first_day(people=(person("piiX1", lifecycle="active", identity_match="piiI1 high"),),
                      fraction=0.5, deletions="soft")
    machine.tables_are_the_model()
    machine.full_day(Day())  # re-stamped, unchanged: the stored string is compared, not rewritten
    machine.tables_are_the_model()
    for lifecycle, identity_match in (({"state": "active"}, 7), (None, "null"), ("", [["piiI2"]]), ("", [["piiI2"]])):
        machine.full_day(Day(events=(Change(0, "lifecycle", lifecycle), Change(0, "identity_match", identity_match))))
        machine.tables_are_the_model()
    machine.pii_apply()
    machine.tables_are_the_model()


# --- writer: history under hard deletions ---------------------------------------------------------------

def test_a_hard_deleted_leaver_has_its_history_version_closed(machine: TablesMachine) -> None:
    """docs/sync-modes.md, History: "a retire or supersede closes it". With ``deletions="hard"`` the
    retired row is deleted, and its open version must still be closed (else the history says the
    person is current for ever: the "table as it was" query keeps them)."""
    machine.first_day(people=(person("piiX1"), person("piiX2")), fraction=None, deletions="hard")
    machine.tables_are_the_model()
    machine.full_day(Day(events=(Leave(0),)))
    machine.tables_are_the_model()  # history[bos:person:1][0]: open, the model says closed


# --- writer: duplicate refs when the later copy arrives byte-identical to the stored row ------------------

def test_the_last_of_two_copies_wins_when_it_is_the_stored_one(machine: TablesMachine) -> None:
    """docs/warehouse.md: duplicate ``record_ref``s of one result are resolved "latest observed_at, then
    last occurrence". Day 2 sends the person changed (email ``""``) and then, with the same stamps,
    exactly as stored on day 1: the later copy wins, so the row is unchanged. The later copy arrives
    byte-identical to the stored row but for its stamps (a claim, not decoded): the dedupe must judge
    it by its own stamps, not the stored row's older ones."""
    machine.first_day(people=(person("piiX1", email=MISSING),), fraction=0.5, deletions="soft")
    machine.tables_are_the_model()
    machine.full_day(Day(events=(Change(0, "email", ""),), duplicate=Change(0, "email", MISSING)))
    machine.tables_are_the_model()


# --- writer: pii-apply hashes a number as a run does, however the engine spells it back --------------------

@pytest.mark.parametrize("number", [1e16, -0.0], ids=["1e16", "minus-zero"])
def test_pii_apply_hashes_a_number_as_a_run_under_the_policy_does(machine: TablesMachine, number: float) -> None:
    """docs/personal-data.md: pii-apply "rewrites the records table [...] as a run under the new policy
    would have written them [...] so the next sync under the new policy [...] rewrites no unchanged
    person". PostgreSQL's jsonb hands ``1e16`` back as ``10000000000000000`` and ``-0.0`` as ``0.0``
    (SQLite, MariaDB and DuckDB keep the text): pii-apply hashes what it reads back, a run what it was
    sent, and the two must agree, or the next run sees a change that is none (``updated``, a new history
    version)."""
    machine.first_day(people=(person("piiX1", attributes={"n": number}),), fraction=0.5, deletions="soft")
    machine.pii_apply()  # email hashed
    machine.pii_apply()  # email, phone, display_name, attributes, external ids hashed
    machine.tables_are_the_model()
    machine.full_day(Day())  # the same person, re-stamped: unchanged


@pytest.mark.parametrize("content", [{"identity_match": {"sources": [1, 1e16]}}, {"lifecycle": {"sources": [-0.0]}},
                                     {"attributes": {"sources": [1e16]}}],
                         ids=["identity_match", "lifecycle", "attributes"])
def test_a_row_pii_apply_rewrites_keeps_the_content_hash_a_run_gives_it(machine: TablesMachine,
                                                                        content: dict[str, object]) -> None:
    """The same promise, for a number pii-apply does not hash: the first stricter policy hashes only the
    email, so the row is rewritten and gets its content hash again, from the JSON fields as the engine
    hands them back. That hash must be the one a run computes for the same record, however jsonb
    spells ``1e16`` or ``-0.0``: else the next run counts the unchanged person ``updated``."""
    machine.first_day(people=(person("piiX1", email="piiE1@example.org", **content),), fraction=0.5,
                      deletions="soft")
    machine.pii_apply()  # email hashed: the row is rewritten
    machine.tables_are_the_model()
    machine.full_day(Day())  # the same person, re-stamped: unchanged
    machine.tables_are_the_model()


# --- writer: pii-apply's count of wire hashes -------------------------------------------------------------

def test_pii_apply_counts_only_the_wire_hashes_it_changed(warehouse_url: str, tmp_path: Path,
                                                         observed: Observed) -> None:
    """``PolicyApplied.wire_hashes`` is "rows whose wire hash was keyed (or cleared)". A table under a
    policy has its wire hashes cleared by the first stricter policy; the next one finds none to clear,
    yet counts every row whose content it rewrote."""
    from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy

    state = machine_for(Destination(warehouse_url, tmp_path), start_policy=BASIC, ladder=LADDER[2:],
                        observed=observed)()
    try:
        state.first_day(people=(person("piiX1", display_name="piiN1", attributes={"k": "piiA1"}),), fraction=0.5,
                        deletions="soft")
        applied = apply_stricter_policy(state.engine, table=state.table, audit_table=state.audit_table,
                                        policy=LADDER[3], key=SUT_KEY)
        assert applied.records == 1  # display_name hash -> drop
        assert applied.wire_hashes == 1  # the run under BASIC stored a keyed wire hash: cleared
        stricter = {**LADDER[3], "attributes": "drop"}
        applied = apply_stricter_policy(state.engine, table=state.table, audit_table=state.audit_table,
                                        policy=stricter, key=SUT_KEY)
        assert applied.records == 1  # attributes hash -> drop
        assert applied.wire_hashes == 0, (
            f"{applied.wire_hashes} wire hash(es) counted as cleared; every one was cleared already")
    finally:
        state.teardown()

