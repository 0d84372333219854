"""The companion registry: every table beside the records table says what erasure and pii-apply do to
it, and erasure and pii-apply do it, found by iterating the registry (a new companion is covered by
these tests without a line changed here)."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey
from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS, Companion, PolicyRewrite
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import T2, make_record, write

# The fields of a record that hold a person's values (what a policy names).
CONTENT = {"display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources", "record"}
KEY = PiiKey(b"q8Xz3LmN0pVr7TtY2kWe5HsJ9bCd4FgA", source="test")


def test_a_companion_cannot_be_declared_without_saying_what_erasure_and_pii_apply_do() -> None:
    required = {f.name for f in dataclasses.fields(Companion) if f.default is dataclasses.MISSING}
    assert {"erased_by", "pii_apply", "reclaimed", "created", "written", "define"} <= required


@pytest.mark.parametrize("companion", COMPANIONS, ids=lambda c: c.suffix)
def test_each_companion_declares_erasure_and_pii_apply_its_table_bears_out(companion: Companion) -> None:
    """Erased by columns its table has; a table erasure leaves alone holds no ref; a table pii-apply
    leaves alone holds no value a policy names, and one whose rows it rewrites has their key."""
    columns = set(companion.table("bos_records", "sqlite", None).c.keys())
    assert set(companion.erased_by) <= columns
    if not companion.holds_people:
        assert not columns & {"record_ref", "successor_ref"}
    if companion.pii_apply is PolicyRewrite.NO_VALUES:
        assert not columns & CONTENT
    if companion.pii_apply is PolicyRewrite.ROWS:
        assert companion.row_key and set(companion.row_key) <= columns
    if columns & CONTENT:
        assert companion.pii_apply is not PolicyRewrite.NO_VALUES


def _every_companion_filled(make_writer, engine: sa.Engine) -> tuple[object, str]:
    """A table whose every companion holds rows of person 1 (merged into m:1 on day 2)."""
    writer = make_writer()
    options = {"reconcile": ReconcileOptions(sync_mode="full", history=True, max_retire_fraction=None),
               "attribute_columns": check_attribute_columns({"dept": "attributes.dept"}),
               "invalid_records": "quarantine"}
    person = make_record(1, email="ada@example.org")
    write(writer, [person, make_record(2), {**make_record(3), "display_name": {"not": "text"}}], **options)
    merged = make_record("m:1", T2, email="ada.new@example.org")
    write(writer, [merged, make_record(2, T2)], **options)
    return writer, person["record_ref"]


def test_erasure_leaves_nothing_of_the_person_in_any_companion_that_holds_people(make_writer, engine) -> None:
    writer, ref = _every_companion_filled(make_writer, engine)
    quarantined = make_record(3)["record_ref"]
    erased_refs = {ref, "m:1", quarantined}
    engine.dispose()
    erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=sorted(erased_refs))
    with engine.connect() as conn:
        for companion in COMPANIONS:
            name = companion.name(writer.table)
            if not sa.inspect(conn).has_table(name):
                continue
            for column in companion.erased_by:
                left = {v for (v,) in conn.exec_driver_sql(f"SELECT {column} FROM {name}")} & erased_refs
                assert not left, f"{name}.{column} still holds {left}"


def test_pii_apply_leaves_no_raw_email_in_any_companion(make_writer, engine) -> None:
    writer, _ = _every_companion_filled(make_writer, engine)
    engine.dispose()
    apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table, policy={"email": "hash"},
                          key=KEY)
    with engine.connect() as conn:
        for companion in (None, *COMPANIONS):
            name = writer.table if companion is None else companion.name(writer.table)
            if not sa.inspect(conn).has_table(name):
                continue
            text = repr(conn.exec_driver_sql(f"SELECT * FROM {name}").all())
            assert "example.org" not in text, name


def test_a_new_companion_a_run_asks_for_is_made_without_a_line_of_the_writer(make_writer, engine,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A companion declared in the registry, made by runs with history=True, is made by such a run: the
    writer asks every companion whether the run's options want it (its ``created``)."""
    from airflow_provider_bos.warehouse import writer as writer_module
    from airflow_provider_bos.warehouse.tables.companions import HISTORY, Created

    extra = dataclasses.replace(HISTORY, suffix="audit_trail", kind="audit trail table", created=Created.HISTORY)
    monkeypatch.setattr(writer_module, "COMPANIONS", (*COMPANIONS, extra))
    writer = make_writer()
    write(writer, [make_record(1)])
    assert not sa.inspect(engine).has_table(extra.name(writer.table))  # a run without history asks for none
    write(writer, [make_record(2)], reconcile=ReconcileOptions(history=True))
    assert sa.inspect(engine).has_table(extra.name(writer.table))
