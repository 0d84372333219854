"""The policy is part of the table: ``<table>_policy`` remembers the fingerprint a table was written with,
a run with another one fails before reading, rejects keep only their ref and reason, and change
detection sees what is stored (records through a plan, as the run side sends them), on every dialect."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiPolicy, PiiPolicyMismatch
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from tests.warehouse.pii_helpers import (
    HISTORY,
    KEY,
    OTHER_KEY,
    STRICT,
    every_text,
    person,
    raw_values,
    write_under,
)
from tests.warehouse.test_content_changes import history_count
from tests.warehouse.whhelpers import reflect, rows_by_ref

TIMEOUT_S = 60.0  # bound on every wait of the concurrent pii-apply (never a sleep standing in for sync)


def stored_policy(engine: sa.Engine, table: str) -> list[tuple[str, str]]:
    t = reflect(engine, companion_table_name(table, "policy"))
    with engine.connect() as conn:
        return [(row.fingerprint, row.run_id) for row in conn.execute(sa.select(t))]


def has_table(engine: sa.Engine, name: str) -> bool:
    return sa.inspect(engine).has_table(name)


# --- the stored policy -----------------------------------------------------------------------------


def test_a_run_under_a_policy_stores_its_fingerprint_once(writer, engine) -> None:
    plan = STRICT.plan(KEY)
    writer.require_pii_policy(plan.fingerprint)  # a new table adopts any policy
    counts = write_under(writer, plan, [person(1), person(2)])
    assert counts.inserted == 2
    [(fingerprint, run_id)] = stored_policy(engine, writer.table)
    assert fingerprint == plan.fingerprint.text and run_id
    write_under(writer, plan, [person(1), person(3)])
    assert stored_policy(engine, writer.table) == [(fingerprint, run_id)]  # unchanged: the same policy
    writer.require_pii_policy(plan.fingerprint)


def test_a_run_without_a_policy_creates_no_policy_table(writer, engine) -> None:
    writer.require_pii_policy(None)
    write_under(writer, None, [person(1)])
    writer.require_pii_policy(None)
    assert not has_table(engine, companion_table_name(writer.table, "policy"))


@pytest.mark.parametrize(("other", "says"), [
    (PiiPolicy.parse({"email": "hash"}), "for phone the table hashes it, this run keeps it"),
    (PiiPolicy.parse({"email": "drop", "phone": "hash", "display_name": "drop", "attributes.private": "drop",
                      "sources[].external_id": "hash"}), "for email the table hashes it, this run drops it"),
    (None, "for email the table hashes it, this run keeps it"),
])
def test_another_policy_is_refused_before_anything_is_written(writer, engine, other, says) -> None:
    plan = STRICT.plan(KEY)
    write_under(writer, plan, [person(1)])
    before = rows_by_ref(engine, writer.table)
    fingerprint = other.fingerprint(KEY) if other is not None else None
    with pytest.raises(PiiPolicyMismatch) as raised:
        writer.require_pii_policy(fingerprint)
    message = str(raised.value)
    assert says in message and writer.table in message
    with pytest.raises(PiiPolicyMismatch):  # the writer refuses it too, inside the run's transaction
        write_under(writer, other.plan(KEY) if other is not None else None, [person(1, email="new@example.com")])
    assert rows_by_ref(engine, writer.table) == before
    assert stored_policy(engine, writer.table)[0][0] == plan.fingerprint.text


def test_the_way_forward_depends_on_the_direction(writer) -> None:
    write_under(writer, PiiPolicy.parse({"email": "hash", "phone": "hash"}).plan(KEY), [person(1)])
    with pytest.raises(PiiPolicyMismatch) as stricter:
        writer.require_pii_policy(STRICT.fingerprint(KEY))
    assert "airflow-provider-bos pii-apply" in str(stricter.value)
    with pytest.raises(PiiPolicyMismatch) as looser:
        writer.require_pii_policy(PiiPolicy.parse({"email": "hash"}).fingerprint(KEY))
    assert "full re-read" in str(looser.value) and "pii-apply" not in str(looser.value)
    with pytest.raises(PiiPolicyMismatch) as new_key:
        writer.require_pii_policy(PiiPolicy.parse({"email": "hash", "phone": "hash"}).fingerprint(OTHER_KEY))
    assert "key differs" in str(new_key.value) and "full re-read" in str(new_key.value)


def test_a_table_written_without_a_policy_refuses_one(writer, engine) -> None:
    write_under(writer, None, [person(1)])
    with pytest.raises(PiiPolicyMismatch) as raised:
        writer.require_pii_policy(STRICT.fingerprint(KEY))
    assert "for email the table keeps it, this run hashes it" in str(raised.value)
    assert "pii-apply" in str(raised.value)
    # A policy that keeps everything is no policy.
    writer.require_pii_policy(PiiPolicy.parse({}).fingerprint(None))


def test_an_emptied_table_adopts_a_new_policy(writer, engine) -> None:
    write_under(writer, STRICT.plan(KEY), [person(1)])
    records = reflect(engine, writer.table)
    with engine.begin() as conn:
        conn.execute(records.delete())
    new = PiiPolicy.parse({"email": "hash"}).plan(OTHER_KEY)
    writer.require_pii_policy(new.fingerprint)
    write_under(writer, new, [person(1)])
    assert stored_policy(engine, writer.table)[0][0] == new.fingerprint.text


def test_an_emptied_table_with_raw_rejects_does_not_adopt_a_policy(writer, engine) -> None:
    """Records quarantined without a policy are kept whole: a table whose records are gone but whose
    rejects still hold them is not empty of personal data, and a policy run is refused until
    ``pii-apply`` has emptied them."""
    write_under(writer, None, [person(1), person(2, display_name={"first": "Two"})], invalid_records="quarantine")
    records = reflect(engine, writer.table)
    with engine.begin() as conn:
        conn.execute(records.delete())
    with pytest.raises(PiiPolicyMismatch, match="pii-apply"):
        writer.require_pii_policy(STRICT.fingerprint(KEY))
    apply_stricter_policy(engine, table=writer.table, policy=STRICT, key=KEY, audit_table=writer.audit_table)
    assert person(2)["email"] not in every_text(engine, rejects_table_name(writer.table))
    writer.require_pii_policy(STRICT.fingerprint(KEY))


# --- rejects under a policy ------------------------------------------------------------------------


def test_rejects_under_a_policy_keep_only_the_ref_and_a_reason_without_values(writer, engine) -> None:
    plan = STRICT.plan(KEY)
    bad = [person("x" * 600), person(2, sources="not a list"), person(3, attributes={"x": float("nan")}),
           person(4, sources=[{"external_id": "ext-4", "observed_at": "secret-time"}])]
    good = person(5)
    counts = write_under(writer, plan, [*bad, good], invalid_records="quarantine")
    assert counts.rejected == 4 and counts.inserted == 1
    t = reflect(engine, rejects_table_name(writer.table))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.record_ref, t.c.reason, t.c.record)).all()
    assert sorted(r.record_ref for r in rows) == sorted(b["record_ref"] for b in bad)
    assert all(bytes(r.record) == b"" for r in rows)
    text = every_text(engine, rejects_table_name(writer.table)) + every_text(engine, writer.audit_table)
    stored = [plan.apply(b) for b in bad if isinstance(b["sources"], list)]
    for value in (*raw_values(bad[:1], "email", "display_name", "phone"), "ext-4", "secret-time", "nan",
                  *(s["email"] for s in stored)):
        assert value not in text, value


@pytest.mark.parametrize("bad", [
    person(4, sources=[{"external_id": "ext-4", "observed_at": "secret-time"}]),
    person(5, attributes={"x": float("nan")}),
])
def test_a_run_failing_on_a_record_under_a_policy_says_why_without_its_values(writer, engine, bad) -> None:
    """``invalid_records="fail"``: the error (the task log's, and the failed audit row's message)
    names the record and what is wrong with it, never a value of it."""
    from airflow_provider_bos.exceptions import BosWarehouseError

    with pytest.raises(BosWarehouseError, match=bad["record_ref"]) as caught:
        write_under(writer, STRICT.plan(KEY), [person(1), bad], invalid_records="fail")
    assert "secret-time" not in str(caught.value) and "nan" not in str(caught.value).lower()
    assert rows_by_ref(engine, writer.table) == {}


@pytest.mark.parametrize("mode", ["quarantine", "fail"])
def test_a_record_the_policy_cannot_hash_is_refused_as_invalid_records_says(writer, engine, mode) -> None:
    """An object where a hashed value goes: the run's transform hands the writer a refused record
    (its ref and the field, no value), quarantined or failing the run like any record it cannot store."""
    from airflow_provider_bos.exceptions import BosWarehouseError
    from airflow_provider_bos.pii.stream import PolicyRun
    from tests.warehouse.whhelpers import run_info, write

    policy_run = PolicyRun.of(STRICT, KEY)
    assert policy_run is not None
    bad = person(1, email={"work": "secret-work@example.com"})
    records = list(policy_run.stored_records(iter([bad, person(2)]), None))
    if mode == "fail":
        with pytest.raises(BosWarehouseError, match="cannot be stored under the personal-data policy") as caught:
            write(writer, records, run_info(), pii=policy_run.fingerprint, invalid_records="fail")
        assert "secret-work" not in str(caught.value)
        assert rows_by_ref(engine, writer.table) == {}
        return
    counts = write(writer, records, run_info(), pii=policy_run.fingerprint, invalid_records="quarantine")
    assert (counts.rejected, counts.inserted) == (1, 1)
    t = reflect(engine, rejects_table_name(writer.table))
    with engine.connect() as conn:
        [row] = conn.execute(sa.select(t.c.record_ref, t.c.reason, t.c.record)).all()
    assert row.record_ref == bad["record_ref"] and bytes(row.record) == b"" and "email" in row.reason
    for table in (writer.table, writer.audit_table, rejects_table_name(writer.table)):
        assert "secret-work" not in every_text(engine, table)


def test_rejects_without_a_policy_keep_the_record_as_before(writer, engine) -> None:
    write_under(writer, None, [person(1, phone=12345), person(2)], invalid_records="quarantine")
    t = reflect(engine, rejects_table_name(writer.table))
    with engine.connect() as conn:
        [record] = conn.execute(sa.select(t.c.record)).scalars().all()
    assert b"p1@example.com" in bytes(record)


# --- change detection sees what is stored ----------------------------------------------------------


def test_a_change_of_a_dropped_field_rewrites_nothing_and_a_hashed_one_does(writer, engine) -> None:
    plan = STRICT.plan(KEY)
    write_under(writer, plan, [person(1), person(2)], reconcile=HISTORY)
    before = rows_by_ref(engine, writer.table)
    versions = history_count(engine, writer.table)

    dropped_changed = [person(1, name="Renamed", attributes={"dept": "eng", "private": {"home": "Elsewhere"}}),
                       person(2)]
    counts = write_under(writer, plan, dropped_changed, reconcile=HISTORY)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 2)
    assert history_count(engine, writer.table) == versions
    after = rows_by_ref(engine, writer.table)
    assert after[person(1)["record_ref"]]["_bos_synced_at"] == before[person(1)["record_ref"]]["_bos_synced_at"]

    hashed_changed = [person(1, email="moved@example.com"), person(2)]
    counts = write_under(writer, plan, hashed_changed, reconcile=HISTORY)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 1, 1)
    assert history_count(engine, writer.table) == versions + 1
    for table in (writer.table, companion_table_name(writer.table, "history")):
        text = every_text(engine, table)
        for value in raw_values([person(1), person(2), *dropped_changed, *hashed_changed],
                                "email", "phone", "display_name", "external_id", "home"):
            assert value not in text, (table, value)


def test_a_run_without_a_policy_refuses_a_table_put_under_one_during_its_read(make_writer, engine, monkeypatch) -> None:
    """pii-apply may bring a table under a policy while a run without one is reading (an old DAG version
    still scheduled): that run looked before its read and found no policy, so it must look again under
    the writers' lock before it writes, and refuse, or it would store raw values in a hashed table."""
    writer = make_writer()
    if engine.dialect.name == "sqlite" or writer.dialect.capabilities.lock_before_staging:
        pytest.skip("the run holds the writers' lock (SQLite: the database's) from its start: pii-apply waits for it")
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_bos.warehouse.upkeep import pii_apply

    write_under(writer, None, [person(1), person(2)])
    writer.require_pii_policy(None)  # the run's look before its read: no policy yet

    # pii-apply as another process runs it: its own connection, on a thread. The read goes on once it
    # has committed; its reclaim (VACUUM, OPTIMIZE, a checkpoint) may wait for the run to end.
    admin = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)
    committed = threading.Event()
    reclaim = pii_apply.reclaim_space

    def reclaim_after_commit(*args, **kwargs):
        committed.set()
        return reclaim(*args, **kwargs)

    monkeypatch.setattr(pii_apply, "reclaim_space", reclaim_after_commit)
    with ThreadPoolExecutor(max_workers=1) as pool:
        applying = []

        def read_during_which_pii_apply_commits():
            yield person(1, email="new1@example.com")
            applying.append(pool.submit(pii_apply.apply_stricter_policy, admin, table=writer.table,
                                        audit_table=writer.audit_table, policy=STRICT, key=KEY))
            if not committed.wait(TIMEOUT_S):
                applying[0].result(timeout=0)  # pii-apply's own error, if it failed
                raise AssertionError("pii-apply did not commit")
            yield person(2, email="new2@example.com")

        with pytest.raises(PiiPolicyMismatch, match="for email the table hashes it, this run keeps it"):
            write_under(writer, None, read_during_which_pii_apply_commits())
        assert applying[0].result(timeout=TIMEOUT_S).records == 2
    text = every_text(engine, writer.table)
    raw = raw_values([person(1), person(2), person(1, email="new1@example.com")], "email", "phone")
    assert raw and not any(value in text for value in raw)
    assert stored_policy(engine, writer.table)[0][0] == STRICT.fingerprint(KEY).text
