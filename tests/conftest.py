"""Shared test setup: an isolated AIRFLOW_HOME, database URLs, and the reference-server plugin.

PostgreSQL and MariaDB tests run for real under ``CI=true`` and fail there if the server is
unreachable; elsewhere they skip with the reason. SQLite and DuckDB (embedded) need nothing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Airflow reads its configuration at import time: isolate it before anything imports airflow.
_AIRFLOW_HOME = Path(os.environ.get("BOS_TEST_AIRFLOW_HOME") or tempfile.mkdtemp(prefix="bos-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# dag.test() needs its DAG file inside the dags folder: the example DAGs and the test DAGs are
# copied into one folder of this session's AIRFLOW_HOME.
_DAGS_FOLDER = _AIRFLOW_HOME / "dags"
_DAGS_FOLDER.mkdir(parents=True, exist_ok=True)
for _dag_file in [*(REPO_ROOT / "dags").glob("*.py"), *(REPO_ROOT / "tests" / "airflow" / "dags").glob("*.py")]:
    shutil.copy(_dag_file, _DAGS_FOLDER / _dag_file.name)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_DAGS_FOLDER)
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}")
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")

pytest_plugins = ["airflow_provider_bos.testing.pytest_plugin"]

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

POSTGRES_HOST, POSTGRES_PORT = "127.0.0.1", 5432
MYSQL_HOST, MYSQL_PORT = "127.0.0.1", 3306


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _require_server(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message}; under CI=true the {name} tests must run, not skip.")
    pytest.skip(f"{message} (start it to run these tests; CI runs them).")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of the local PostgreSQL test database (psycopg 3)."""
    _require_server("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)
    user = os.environ.get("BOS_TEST_PG_USER", "postgres")
    return f"postgresql+psycopg://{user}@{POSTGRES_HOST}:{POSTGRES_PORT}/test"


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """SQLAlchemy URL of the local MariaDB/MySQL test database (PyMySQL)."""
    _require_server("MariaDB", MYSQL_HOST, MYSQL_PORT)
    return f"mysql+pymysql://root:@{MYSQL_HOST}:{MYSQL_PORT}/test?charset=utf8mb4"


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'warehouse.db'}"


@pytest.fixture()
def duckdb_url(tmp_path: Path) -> str:
    """A DuckDB database file of this test (duckdb-engine)."""
    return f"duckdb:///{tmp_path / 'warehouse.duckdb'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql), "duckdb"])
def warehouse_url(request: pytest.FixtureRequest) -> str:
    """Each supported destination dialect in turn."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture()
def unique_table() -> str:
    """A table name no other test uses, so tests on the shared servers cannot collide."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """An initialised Airflow metadata database (SQLite) for dag.test() runs; returns the dags folder."""
    airflow = str(Path(sys.executable).parent / "airflow")
    proc = subprocess.run([airflow, "db", "migrate"], capture_output=True, text=True, env=os.environ, check=False)
    if proc.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return _DAGS_FOLDER
