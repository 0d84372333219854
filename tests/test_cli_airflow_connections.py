"""The CLI finds Airflow's connections wherever Airflow keeps them: a connection made with
``airflow connections add`` lives in the metadata database, which the SDK does not read outside a task.
Tested against a real Airflow home (the session's, migrated once)."""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa

from airflow_provider_bos.cli import main
from airflow_provider_bos.pii import PiiKey, lookup_hash
from airflow_provider_bos.warehouse import WarehouseWriter
from tests.warehouse.whhelpers import make_record, write


def run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``program`` of this venv run as a person runs it: in a shell of this Airflow home."""
    return subprocess.run([str(Path(sys.executable).parent / program), *args], capture_output=True, text=True,
                          env=os.environ, check=False)


def airflow_connections_add(conn_id: str, *args: str) -> None:
    done = run("airflow", "connections", "add", conn_id, *args)
    assert done.returncode == 0, done.stderr[-2000:]


def test_erase_and_pii_hash_find_connections_in_the_metadata_database(airflow_db, tmp_path) -> None:
    warehouse, key_conn = f"wh_{uuid.uuid4().hex[:8]}", f"key_{uuid.uuid4().hex[:8]}"
    database = tmp_path / "warehouse.db"
    engine = sa.create_engine(f"sqlite:///{database}")
    write(WarehouseWriter(engine, table="people"), [make_record(1), make_record(2)])
    engine.dispose()
    key = secrets.token_urlsafe(48)
    airflow_connections_add(warehouse, "--conn-uri", f"sqlite:///{database}")
    airflow_connections_add(key_conn, "--conn-type", "generic", f"--conn-password={key}")  # a key may start with -
    assert f"AIRFLOW_CONN_{warehouse.upper()}" not in os.environ  # only the metadata database has them

    erased = run("airflow-provider-bos", "erase", "--conn-id", warehouse, "--table", "people",
                 "--record-ref", "bos:person:000001")
    assert erased.returncode == 0, erased.stderr[-2000:]
    printed = erased.stdout  # Airflow's own start-up lines may come first: the counts are the JSON object
    assert json.loads(printed[printed.index("{"):printed.rindex("}") + 1])["records"] == 1

    hashed = run("airflow-provider-bos", "pii-hash", "--key-conn-id", key_conn, "--field", "email", "p2@example.com")
    assert hashed.returncode == 0, hashed.stderr[-2000:]
    assert lookup_hash(PiiKey.from_text(key, source="test"), "email", "p2@example.com") in hashed.stdout


def test_a_connection_airflow_does_not_have_says_where_it_looked(airflow_db, capsys) -> None:
    status = main(["erase", "--conn-id", "no_such_conn_here", "--table", "people", "--record-ref", "x"],
                  stdout=io.StringIO())
    said = capsys.readouterr().err
    assert status == 1
    assert "'no_such_conn_here'" in said and "AIRFLOW_CONN_NO_SUCH_CONN_HERE" in said and "metadata database" in said
