"""``airflow-provider-bos pii-apply``: a stricter policy re-applied to a stored table, from the command line."""

from __future__ import annotations

import io
import json

import pytest
import sqlalchemy as sa

from airflow_provider_bos.cli import main
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from tests.test_erase_cli import connection_json_for_url
from tests.warehouse.pii_helpers import KEY, KEY_TEXT, STRICT, every_text, person, raw_values, write_under

POLICY = json.dumps(STRICT.as_dict())


@pytest.fixture()
def table(warehouse_url: str, unique_table: str, monkeypatch: pytest.MonkeyPatch):
    engine = sa.create_engine(warehouse_url)
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    write_under(writer, None, [person(1), person(2)])
    engine.dispose()
    monkeypatch.setenv("AIRFLOW_CONN_BOS_APPLY_WAREHOUSE", connection_json_for_url(warehouse_url))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY_TEXT}))
    yield engine, writer
    with engine.begin() as conn:
        kinds = ("history", "lineage", "sources", "rejects", "policy")
        for name in (unique_table, f"{unique_table}_runs", *(companion_table_name(unique_table, s) for s in kinds)):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def _args(writer: WarehouseWriter, policy: str) -> list[str]:
    return ["pii-apply", "--conn-id", "bos_apply_warehouse", "--table", writer.table, "--audit-table",
            writer.audit_table, "--policy", policy, "--key-conn-id", "bos_pii_key"]


def test_pii_apply_rewrites_the_table_and_prints_the_counts(table) -> None:
    engine, writer = table
    out = io.StringIO()
    assert main(_args(writer, POLICY), stdout=out) == 0
    result = json.loads(out.getvalue())
    assert result["records"] == 2 and result["fingerprint"] == STRICT.fingerprint(KEY).text
    text = every_text(engine, writer.table)
    assert not any(v in text for v in raw_values([person(1), person(2)], "email", "phone", "display_name"))
    assert KEY_TEXT not in out.getvalue()


def test_pii_apply_refuses_a_looser_policy_and_a_bad_one(table, capsys) -> None:
    _, writer = table
    assert main(_args(writer, POLICY), stdout=io.StringIO()) == 0
    assert main(_args(writer, json.dumps({"email": "hash"})), stdout=io.StringIO()) == 1
    assert "full re-read" in capsys.readouterr().err
    assert main(_args(writer, '{"emial": "hash"}'), stdout=io.StringIO()) == 1
    assert "Did you mean 'email'" in capsys.readouterr().err
    assert main(_args(writer, "not json"), stdout=io.StringIO()) == 1
    assert "JSON" in capsys.readouterr().err
