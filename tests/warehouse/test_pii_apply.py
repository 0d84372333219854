"""Re-applying a stricter policy to a table, its history and rejects in one transaction, no re-read; a
looser one is refused; the next sync under the new policy rewrites nothing (every dialect)."""

from __future__ import annotations

import orjson
import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiPolicy, PiiPolicyMismatch, lookup_hash
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.wire import WireRecord, wire_hash
from tests.pii.conftest import reference_wire_hash
from tests.warehouse.pii_helpers import (
    HISTORY,
    KEY,
    KEY_TEXT,
    OTHER_KEY,
    STRICT,
    every_text,
    person,
    raw_values,
    write_under,
)
from tests.warehouse.test_pii_policy import stored_policy
from tests.warehouse.whhelpers import T2, reflect, rows_by_ref

EMAIL_ONLY = PiiPolicy.parse({"email": "hash"})
ALL_FIELDS = ("email", "phone", "display_name", "external_id", "home")


def day1() -> list[dict]:
    return [person(i) for i in range(1, 6)]


def day2() -> list[dict]:
    return [person(1), person(2, observed_at=T2, email="changed2@example.com"), *(person(i) for i in range(3, 6))]


def wire_records(records: list[dict]) -> list[WireRecord]:
    """As the scanner sends them: decoded from their bytes, each with its (raw) wire hash."""
    out = []
    for record in records:
        element = orjson.dumps(record)
        wire = WireRecord(orjson.loads(element))
        wire.wire_hash = wire_hash(element)
        out.append(wire)
    return out


def apply(engine, writer, policy: PiiPolicy, key=KEY):
    return apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table, policy=policy, key=key)


def test_a_table_written_without_a_policy_keeps_no_raw_value_after_it(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, None, wire_records(day1()), reconcile=HISTORY)
    write_under(writer, None, [*day2(), person(9, phone=12345)], reconcile=HISTORY, invalid_records="quarantine")
    tables = (writer.table, companion_table_name(writer.table, "history"), rejects_table_name(writer.table))
    raw = raw_values([*day1(), *day2(), person(9)], *ALL_FIELDS)
    assert any(value in every_text(engine, writer.table) for value in raw)
    raw_wire = {ref: row["_bos_wire_hash"] for ref, row in rows_by_ref(engine, writer.table).items()}

    applied = apply(engine, writer, STRICT)

    assert (applied.records, applied.history, applied.rejects) == (5, 6, 1)
    for table in tables:
        text = every_text(engine, table)
        for value in raw:
            assert value not in text, (table, value)
    rows = rows_by_ref(engine, writer.table)
    ref1 = person(1)["record_ref"]
    assert rows[ref1]["email"] == lookup_hash(KEY, "email", "p1@example.com") and rows[ref1]["display_name"] is None
    # keyed, as a policy run keys it
    assert rows[ref1]["_bos_wire_hash"] == reference_wire_hash(KEY_TEXT, raw_wire[ref1])
    assert stored_policy(engine, writer.table)[0][0] == STRICT.fingerprint(KEY).text

    # The next sync under the policy is accepted and rewrites nothing.
    writer.require_pii_policy(STRICT.fingerprint(KEY))
    counts = write_under(writer, STRICT.plan(KEY), day2(), reconcile=HISTORY)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 5)


def test_a_row_the_policy_does_not_change_still_gets_its_wire_hash_keyed(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, None, wire_records([person(7, email=None), person(8)]))
    raw_wire = {ref: row["_bos_wire_hash"] for ref, row in rows_by_ref(engine, writer.table).items()}
    before = rows_by_ref(engine, writer.table)
    applied = apply(engine, writer, EMAIL_ONLY)
    assert (applied.records, applied.wire_hashes) == (1, 2)
    rows = rows_by_ref(engine, writer.table)
    ref7, ref8 = person(7)["record_ref"], person(8)["record_ref"]
    assert {name: rows[ref7][name] for name in ("email", "_bos_record_hash", "attributes", "sources")} == {
        name: before[ref7][name] for name in ("email", "_bos_record_hash", "attributes", "sources")}
    assert rows[ref7]["_bos_wire_hash"] == reference_wire_hash(KEY_TEXT, raw_wire[ref7])
    assert rows[ref8]["_bos_wire_hash"] == reference_wire_hash(KEY_TEXT, raw_wire[ref8])
    assert rows[ref8]["email"] == lookup_hash(KEY, "email", "p8@example.com")


def test_a_stricter_policy_leaves_what_is_hashed_already(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, EMAIL_ONLY.plan(KEY), day1(), reconcile=HISTORY)
    before = rows_by_ref(engine, writer.table)
    applied = apply(engine, writer, STRICT)
    assert applied.records == 5
    after = rows_by_ref(engine, writer.table)
    assert all(after[ref]["email"] == before[ref]["email"] for ref in before)  # not hashed twice
    assert all(row["_bos_wire_hash"] is None for row in after.values())
    counts = write_under(writer, STRICT.plan(KEY), day1(), reconcile=HISTORY)
    assert (counts.updated, counts.unchanged) == (0, 5)


@pytest.mark.parametrize(("looser", "key"), [
    (PiiPolicy.parse({"email": "hash"}), KEY),  # phone hash -> keep, display_name drop -> keep, ...
    (PiiPolicy.parse({"email": "hash", "phone": "hash", "display_name": "hash", "attributes.private": "drop",
                      "sources[].external_id": "hash"}), KEY),  # display_name drop -> hash
    (STRICT, OTHER_KEY),  # another key
])
def test_a_looser_policy_or_another_key_is_refused(make_writer, engine, looser, key) -> None:
    writer = make_writer()
    write_under(writer, STRICT.plan(KEY), day1(), reconcile=HISTORY)
    before = rows_by_ref(engine, writer.table)
    with pytest.raises(PiiPolicyMismatch, match="full re-read"):
        apply(engine, writer, looser, key)
    assert rows_by_ref(engine, writer.table) == before
    assert stored_policy(engine, writer.table)[0][0] == STRICT.fingerprint(KEY).text


def test_the_same_policy_changes_nothing(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, STRICT.plan(KEY), day1())
    applied = apply(engine, writer, STRICT)
    assert (applied.records, applied.history, applied.rejects) == (0, 0, 0)


def test_the_audit_row_names_the_command_and_no_value(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, None, day1())
    audit = reflect(engine, writer.audit_table)
    with engine.connect() as conn:
        runs_before = conn.execute(sa.select(sa.func.count()).select_from(audit)).scalar_one()
    applied = apply(engine, writer, STRICT)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(audit).where(audit.c.run_id == applied.run_id)).mappings().all()
        runs_after = conn.execute(sa.select(sa.func.count()).select_from(audit)).scalar_one()
    assert runs_after == runs_before + 1
    [row] = rows
    assert row["tool_name"] == "airflow-provider-bos pii-apply" and "p1@example.com" not in str(dict(row))


def test_a_failure_midway_leaves_every_table_as_it_was(make_writer, engine, monkeypatch) -> None:
    """One transaction: the records, their history, provenance entries and rejects are rewritten before the
    policy is stored; a database failure at that last step leaves all of them, and the audit, untouched."""
    import airflow_provider_bos.warehouse.upkeep.pii_apply as pii_apply
    from airflow_provider_bos.exceptions import BosWarehouseError

    writer = make_writer()
    write_under(writer, None, wire_records(day1()), reconcile=HISTORY)
    write_under(writer, None, [*day2(), person(9, phone=12345)], reconcile=HISTORY, invalid_records="quarantine")
    writer.ensure_policy_table()
    tables = (writer.table, *(companion_table_name(writer.table, kind) for kind in ("history", "sources")),
              rejects_table_name(writer.table), companion_table_name(writer.table, "policy"), writer.audit_table)

    def every_row() -> dict[str, list[str]]:
        reflected = [reflect(engine, name) for name in tables]
        with engine.connect() as conn:
            return {t.name: sorted(repr(tuple(row)) for row in conn.execute(sa.select(t))) for t in reflected}

    before = every_row()
    assert all(before[name] for name in tables[:4])  # each holds rows the policy would rewrite

    def lost_connection(*args, **kwargs):
        raise sa.exc.OperationalError("INSERT INTO ...", {}, Exception("server closed the connection"))

    monkeypatch.setattr(pii_apply, "store_policy", lost_connection)
    with pytest.raises(BosWarehouseError, match="rolled back"):
        apply(engine, writer, STRICT)
    assert every_row() == before

    monkeypatch.undo()
    assert apply(engine, writer, STRICT).records == 5  # and it applies once the database answers


def test_a_row_stored_before_entries_were_bounded_is_rewritten_not_refused(make_writer, engine) -> None:
    """A source id over the provenance table's 512 characters is refused from a read; a row an earlier
    release stored with one is the table's already: pii-apply rewrites it like any other (a policy
    that leaves the sources as they are leaves the provenance table as it is too, on every database)."""
    writer = make_writer()
    write_under(writer, None, day1())
    ref = person(1)["record_ref"]
    long_id = "x" * 600
    records = reflect(engine, writer.table)
    with engine.begin() as conn:
        stored = conn.execute(sa.select(records.c.sources).where(records.c.record_ref == ref)).scalar_one()
        entries = orjson.loads(stored) if isinstance(stored, str | bytes) else stored
        entries[0]["external_id"] = long_id
        # A JSON column's type encodes the list itself; a text column (SQLite) takes the JSON text.
        value = entries if isinstance(records.c.sources.type, sa.JSON) else orjson.dumps(entries).decode()
        conn.execute(records.update().where(records.c.record_ref == ref).values(sources=value))

    assert apply(engine, writer, EMAIL_ONLY).records == 5
    row = rows_by_ref(engine, writer.table)[ref]
    sources = orjson.loads(row["sources"]) if isinstance(row["sources"], str | bytes) else row["sources"]
    assert sources[0]["external_id"] == long_id
    assert row["email"] == lookup_hash(KEY, "email", person(1)["email"])


def test_a_promoted_column_no_longer_configured_holds_no_value_the_new_policy_drops(make_writer, engine) -> None:
    """A DAG promoted ``attributes.private.home``, a later version stopped promoting it (the column
    stays, with its values), then pii-apply drops that path: the column, in the records table and
    its history, holds none of the raw values after it, and the result says which column it cleared."""
    from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns

    writer = make_writer()
    promoted = check_attribute_columns({"home": "attributes.private.home"})
    write_under(writer, None, day1(), reconcile=HISTORY, attribute_columns=promoted)
    write_under(writer, None, day2(), reconcile=HISTORY)  # no longer promoted: the column stays
    homes = raw_values(day1(), "home")
    history = companion_table_name(writer.table, "history")
    with engine.connect() as conn:
        assert set(conn.execute(sa.text(f"SELECT home FROM {writer.table}")).scalars()) == homes

    applied = apply(engine, writer, PiiPolicy.parse({"attributes.private": "drop"}))
    for table in (writer.table, history):
        with engine.connect() as conn:
            assert not set(conn.execute(sa.text(f"SELECT home FROM {table}")).scalars()) & homes, table
    assert applied.cleared_columns == ["home"]


def test_a_policy_that_leaves_attributes_alone_leaves_an_unconfigured_column_alone(make_writer, engine) -> None:
    from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns

    writer = make_writer()
    write_under(writer, None, day1(), attribute_columns=check_attribute_columns({"home": "attributes.private.home"}))
    write_under(writer, None, day2())
    applied = apply(engine, writer, EMAIL_ONLY)
    with engine.connect() as conn:
        assert set(conn.execute(sa.text(f"SELECT home FROM {writer.table}")).scalars()) == raw_values(day1(), "home")
    assert applied.cleared_columns == []
