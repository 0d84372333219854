"""``airflow-provider-bos erase``: a person's rows out of the table, history and lineage, on every dialect."""

from __future__ import annotations

import io
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from airflow_provider_bos.cli import main
from airflow_provider_bos.warehouse import AuditReader, WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.test_reconcile import day1, day2
from tests.warehouse.whhelpers import make_record, rows_by_ref, write


def connection_json_for_url(url: str) -> str:
    """The warehouse as an Airflow connection in its JSON form (an AIRFLOW_CONN_* variable)."""
    u = make_url(url)
    if u.get_backend_name() in ("sqlite", "duckdb"):
        return json.dumps({"conn_type": u.get_backend_name(), "host": u.database})
    return json.dumps({"conn_type": "postgres" if u.get_backend_name() == "postgresql" else "mysql", "host": u.host,
                       "port": u.port, "login": u.username, "password": u.password or "", "schema": u.database})


@pytest.fixture()
def synced(warehouse_url: str, unique_table: str, monkeypatch: pytest.MonkeyPatch):
    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    options = ReconcileOptions(sync_mode="full", history=True)
    write(writer, day1(), reconcile=options)
    write(writer, day2(), reconcile=options)
    engine.dispose()  # as in the CLI's own process: a DuckDB file is rewritten only when nothing else holds it
    monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(warehouse_url))
    yield engine, writer
    with engine.begin() as conn:
        for name in (unique_table, f"{unique_table}_runs", *(companion_table_name(unique_table, s)
                                                                for s in ("history", "lineage", "sources", "rejects"))):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def test_erase_deletes_the_refs_everywhere_in_one_transaction(synced) -> None:
    engine, writer = synced
    gone, merged = make_record(1)["record_ref"], "m:1-2"
    out = io.StringIO()
    code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--record-ref", gone, "--record-ref", merged], stdout=out)
    assert code == 0
    counts = json.loads(out.getvalue())
    # 2 was merged into m:1-2 as well: the same person's earlier record goes with it.
    assert (counts["merged"], counts["records"], counts["history"], counts["lineage"], counts["rejects"]) == (
        1, 3, 3, 2, 0)
    assert {gone, merged, make_record(2)["record_ref"]}.isdisjoint(rows_by_ref(engine, writer.table))
    audit = AuditReader(engine, table=writer.audit_table).get_run(counts["run_id"])
    assert audit["status"] == "complete" and audit["conn_id"] == "bos_erase_warehouse"
    assert gone not in json.dumps(audit, default=str) and merged not in json.dumps(audit, default=str)


def test_erase_without_a_ref_exits_1_and_deletes_nothing(synced, capsys) -> None:
    engine, writer = synced
    before = rows_by_ref(engine, writer.table)
    code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table], stdout=io.StringIO())
    assert code == 1 and "at least one record_ref" in capsys.readouterr().err
    assert rows_by_ref(engine, writer.table) == before


def test_erase_reclaims_the_deleted_rows_space_and_says_how(synced) -> None:
    engine, writer = synced
    out = io.StringIO()
    assert main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--record-ref", make_record(3)["record_ref"]], stdout=out) == 0
    reclaimed = json.loads(out.getvalue())["reclaimed"]
    expected = {"sqlite": "VACUUM", "duckdb": "COPY FROM DATABASE", "postgresql": f"VACUUM {writer.table}",
                "mysql": f"OPTIMIZE TABLE {writer.table}"}[engine.dialect.name]
    assert expected in reclaimed


def test_a_duckdb_file_held_elsewhere_in_the_process_is_erased_and_the_rewrite_refused(duckdb_url, unique_table,
                                                                                        monkeypatch, capsys) -> None:
    """The rewrite would leave another connection writing to the replaced file: the erasure commits, the
    command exits 1 saying the space was not reclaimed and how to finish."""
    engine = sa.create_engine(duckdb_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    write(writer, [make_record(1), make_record(2)])
    monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(duckdb_url))
    with engine.connect():  # another connection of this process holds the file
        code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", unique_table, "--audit-table",
                     f"{unique_table}_runs", "--record-ref", make_record(1)["record_ref"]], stdout=io.StringIO())
        err = capsys.readouterr().err
        assert code == 1 and "erasure is committed" in err and "other connection(s) of this process" in err
        assert list(rows_by_ref(engine, unique_table)) == [make_record(2)["record_ref"]]
    engine.dispose()


# --- erase by what a request names ------------------------------------------------------------------


def _drop_tables(engine: sa.Engine, table: str) -> None:
    with engine.begin() as conn:
        for name in (table, f"{table}_runs", companion_table_name(table, "policy"),
                     companion_table_name(table, "lineage"), companion_table_name(table, "sources")):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def _key_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.warehouse.pii_helpers import KEY_TEXT

    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY_TEXT}))


def test_erase_by_email_phone_and_external_id(synced, monkeypatch) -> None:
    engine, writer = synced
    _key_connection(monkeypatch)
    out = io.StringIO()
    code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--email", " P3@example.com", "--external-id", "crm-eu:4"], stdout=out)
    assert code == 0
    counts = json.loads(out.getvalue())
    assert counts["found"] == 2 and counts["records"] == 2
    assert {make_record(3)["record_ref"], make_record(4)["record_ref"]}.isdisjoint(rows_by_ref(engine, writer.table))


def test_erase_by_a_hashed_email_reads_the_key(warehouse_url, unique_table, monkeypatch) -> None:
    from tests.warehouse.pii_helpers import KEY, STRICT, person, write_under

    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    try:
        write_under(writer, STRICT.plan(KEY), [person(1), person(2)])
        engine.dispose()
        monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(warehouse_url))
        _key_connection(monkeypatch)
        out = io.StringIO()
        assert main(["erase", "--conn-id", "bos_erase_warehouse", "--table", unique_table, "--audit-table",
                     f"{unique_table}_runs", "--phone", "+49 30 12342", "--key-conn-id", "bos_pii_key"],
                    stdout=out) == 0
        assert json.loads(out.getvalue())["found"] == 1
        assert list(rows_by_ref(engine, unique_table)) == [person(1)["record_ref"]]
    finally:
        _drop_tables(engine, unique_table)


def test_erase_by_a_dropped_field_exits_1(warehouse_url, unique_table, monkeypatch, capsys) -> None:
    from airflow_provider_bos.pii import PiiPolicy
    from tests.warehouse.pii_helpers import person, write_under

    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    try:
        write_under(writer, PiiPolicy.parse({"email": "drop"}).plan(None), [person(1)])
        engine.dispose()
        monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(warehouse_url))
        code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", unique_table, "--audit-table",
                     f"{unique_table}_runs", "--email", "p1@example.com"], stdout=io.StringIO())
        assert code == 1 and "not stored" in capsys.readouterr().err
        assert list(rows_by_ref(engine, unique_table)) == [person(1)["record_ref"]]
    finally:
        _drop_tables(engine, unique_table)


def test_a_refs_file_names_each_ref_exactly_as_its_line_holds_it(warehouse_url, unique_table, monkeypatch) -> None:
    """Only the line ending is taken off a line of ``--record-refs-from``: a ref is any string, so
    ``" r:7"`` and ``"r:7"`` are two people and erasing the one must keep the other."""
    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    write(writer, [make_record("r:7"), make_record(" r:7"), make_record(" r:8")])
    engine.dispose()
    monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(warehouse_url))
    try:
        out = io.StringIO()
        code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", unique_table, "--audit-table",
                     writer.audit_table, "--record-refs-from", "-"], stdout=out, stdin=io.StringIO(" r:7\r\n\n r:8\n"))
        assert code == 0 and json.loads(out.getvalue())["records"] == 2
        assert set(rows_by_ref(engine, unique_table)) == {"r:7"}
    finally:
        _drop_tables(engine, unique_table)


# --- the same person's later records; external ids exactly -----------------------------------------


def test_erase_by_a_merged_persons_old_value_erases_the_record_they_were_merged_into(synced) -> None:
    """1 and 2 were merged into m:1-2 on day 2: 1's email finds 1 only, and m:1-2, the person's current
    record, goes with it (and 2, merged into it too); the output names m:1-2 as a successor taken."""
    engine, writer = synced
    out = io.StringIO()
    code = main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--email", "p1@example.com"], stdout=out)
    assert code == 0
    assert {make_record(1)["record_ref"], make_record(2)["record_ref"], "m:1-2"}.isdisjoint(
        rows_by_ref(engine, writer.table))
    counts = json.loads(out.getvalue())
    assert (counts["found"], counts["successors"], counts["merged"], counts["records"], counts["lineage"]) == (
        1, 1, 1, 3, 2)
    assert (counts["successor_refs"], counts["left"]) == (["m:1-2"], [])
    audit = AuditReader(engine, table=writer.audit_table).get_run(counts["run_id"])
    assert "m:1-2" not in json.dumps(audit, default=str)


def test_an_external_id_names_one_source_identity_and_a_type_is_asked_for_apart(synced) -> None:
    """crm is the source_type of crm-eu, not a source: --external-id crm:4 names nobody;
    --external-id-of-type crm:4 is the request for every crm source's 4."""
    engine, writer = synced
    four = make_record(4)["record_ref"]
    out = io.StringIO()
    assert main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--external-id", "crm:4"], stdout=out) == 0
    assert json.loads(out.getvalue())["found"] == 0 and four in rows_by_ref(engine, writer.table)
    engine.dispose()  # a DuckDB file is rewritten only when nothing else of the process holds it
    out = io.StringIO()
    assert main(["erase", "--conn-id", "bos_erase_warehouse", "--table", writer.table, "--audit-table",
                 writer.audit_table, "--external-id-of-type", "crm:4"], stdout=out) == 0
    assert json.loads(out.getvalue())["found"] == 1 and four not in rows_by_ref(engine, writer.table)


def test_a_split_is_refused_naming_its_records_until_the_request_decides_it(warehouse_url, unique_table,
                                                                             monkeypatch, capsys) -> None:
    """m:1-2 was split into s:a and s:b: erasing it names both and erases nothing (exit 1); naming the
    person's one and keeping the other erases the two and says what was left."""
    from tests.warehouse.test_reconcile import FULL
    from tests.warehouse.test_reconcile import person as provenance_person
    from tests.warehouse.whhelpers import T2

    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    try:
        write(writer, [provenance_person(0, keys=[1, 2], ref="m:1-2"), provenance_person(3)], reconcile=FULL)
        write(writer, [provenance_person(1, T2, ref="s:b"), provenance_person(2, T2, ref="s:a"),
                       provenance_person(3, T2)], reconcile=FULL)
        engine.dispose()
        monkeypatch.setenv("AIRFLOW_CONN_BOS_ERASE_WAREHOUSE", connection_json_for_url(warehouse_url))
        before = rows_by_ref(engine, unique_table)
        erase = ["erase", "--conn-id", "bos_erase_warehouse", "--table", unique_table, "--audit-table",
                 f"{unique_table}_runs", "--record-ref", "m:1-2"]
        assert main(erase, stdout=io.StringIO()) == 1
        err = capsys.readouterr().err
        assert "Nothing was erased" in err and "s:a, s:b" in err and "--keep-successor" in err
        assert rows_by_ref(engine, unique_table) == before
        engine.dispose()  # a DuckDB file is rewritten only when nothing else of the process holds it

        out = io.StringIO()
        assert main([*erase, "--record-ref", "s:a", "--keep-successor", "s:b"], stdout=out) == 0
        counts = json.loads(out.getvalue())
        assert counts["records"] == 2 and [left["record_ref"] for left in counts["left"]] == ["s:b"]
        assert "kept" in counts["left"][0]["reason"]
        assert {"m:1-2", "s:a"}.isdisjoint(rows_by_ref(engine, unique_table)) and "s:b" in rows_by_ref(
            engine, unique_table)
    finally:
        _drop_tables(engine, unique_table)
