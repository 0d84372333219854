"""Shared test setup: an isolated AIRFLOW_HOME, database URLs, the reference-server plugin, the tiers.

PostgreSQL and MariaDB tests run for real under ``CI=true`` and fail there if the server is
unreachable; elsewhere they skip with the reason. SQLite and DuckDB (embedded) need nothing.

Tiers (docs/development.md, "Test tiers"): the fast tier (the default) deselects every test marked
``full``; ``--tier=all`` or ``BOS_TEST_TIER=all`` (``bash .ci/test --all``, what ``.ci/run`` runs)
runs them too. :func:`pytest_collection_modifyitems` marks ``full`` what the markers already say is
heavy: ``deployment``, ``slow`` (the browser test among them), and on a warehouse other than SQLite a
real Airflow run (``airflow``) or a test repeating one behaviour many times (``repeats``); the
example-based tests of tests/warehouse prove each dialect's SQL in the fast tier.

Under pytest-xdist every worker is its own process: its own AIRFLOW_HOME (and so its own Airflow
metadata database, migrated once per worker by ``airflow_db``) and dags folder.
"""

from __future__ import annotations

import functools
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
# One home per process: an xdist worker (PYTEST_XDIST_WORKER, set before conftest loads) gets its own,
# a sub-folder of BOS_TEST_AIRFLOW_HOME when that is set.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_OWN_AIRFLOW_HOME = not os.environ.get("BOS_TEST_AIRFLOW_HOME")
if _OWN_AIRFLOW_HOME:
    _AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix=f"bos-airflow-home-{_XDIST_WORKER}{'-' if _XDIST_WORKER else ''}"))
else:
    _AIRFLOW_HOME = Path(os.environ["BOS_TEST_AIRFLOW_HOME"]) / _XDIST_WORKER
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
# dag.test() needs its DAG file inside the dags folder: the example DAGs and the test DAGs are
# copied into one folder of this session's AIRFLOW_HOME.
_DAGS_FOLDER = _AIRFLOW_HOME / "dags"
_DAGS_FOLDER.mkdir(parents=True, exist_ok=True)
for _dag_file in [*(REPO_ROOT / "dags").glob("*.py"), *(REPO_ROOT / "tests" / "airflow" / "dags").glob("*.py")]:
    shutil.copy(_dag_file, _DAGS_FOLDER / _dag_file.name)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_DAGS_FOLDER)

# Defaults for what the caller did not set. An xdist worker inherits the environment of the pytest
# process that started it, defaults included: it replaces those (its metadata database is its own),
# never what the caller set. BOS_TEST_DEFAULTED_ENV lists them for the workers.
_DEFAULTED = set(filter(None, os.environ.get("BOS_TEST_DEFAULTED_ENV", "").split(",")))


def _default_env(name: str, value: str) -> None:
    if name in _DEFAULTED or name not in os.environ:
        os.environ[name] = value
        _DEFAULTED.add(name)


_default_env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
_default_env("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
_default_env("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}")
_default_env("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
os.environ["BOS_TEST_DEFAULTED_ENV"] = ",".join(sorted(_DEFAULTED))

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


@pytest.fixture()
def stage_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory of this test's processes (TMPDIR), where staging lives by default: its
    own, so files other test workers stage meanwhile are not seen."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.delenv("BOS_STAGE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


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
    _one_in_process_execution_api()
    return _DAGS_FOLDER


def _one_in_process_execution_api() -> None:
    """One in-process execution API per process for ``dag.test()``, as Airflow 3.3 has it.

    Airflow 3.1's and 3.2's ``dag.test()`` build a new one for every task (its versioned schemas:
    about 1.8 s a task here) and leave each one's event-loop thread running; 3.3 keeps one
    (``functools.lru_cache`` on ``supervisor.in_process_api_server``). The tests do as 3.3 does on
    every release, so an end-to-end test takes on 3.1 about what it takes on 3.3.
    """
    from airflow.sdk.execution_time import supervisor

    if not hasattr(supervisor.in_process_api_server, "cache_info"):
        supervisor.in_process_api_server = functools.lru_cache(maxsize=1)(supervisor.in_process_api_server)


# --- test tiers ----------------------------------------------------------------------------------

FAST_TIER, ALL_TIERS = "fast", "all"
# Markers that put a test in the full tier by themselves (pyproject.toml describes each).
_FULL_TIER_MARKERS = ("full", "deployment", "slow")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("bos").addoption(
        "--tier", choices=(FAST_TIER, ALL_TIERS), default=None,
        help="fast: deselect the tests marked `full` (the default, or BOS_TEST_TIER); all: every tier "
             "(bash .ci/test --all, .ci/run)")


def _tier(config: pytest.Config) -> str:
    tier = config.getoption("--tier") or os.environ.get("BOS_TEST_TIER", "").strip().lower() or FAST_TIER
    if tier not in (FAST_TIER, ALL_TIERS):
        raise pytest.UsageError(f"BOS_TEST_TIER={tier!r}: use {FAST_TIER!r} or {ALL_TIERS!r}")
    return tier


def _in_full_tier(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) for name in _FULL_TIER_MARKERS):
        return True
    callspec = getattr(item, "callspec", None)
    dialect = callspec.params.get("warehouse_url") if callspec is not None else None
    if dialect in (None, "sqlite"):
        return False
    # On PostgreSQL, MariaDB or DuckDB: a real dag.test() (`airflow`: each end-to-end file keeps such
    # smokes for the Airflow side of a dialect: its connection type, the hook's engine), or a test that
    # repeats one behaviour many times (`repeats`: generated examples, race rounds). The dialect SQL
    # itself is proven once per dialect in the fast tier by the example-based tests in tests/warehouse.
    return any(item.get_closest_marker(name) for name in ("airflow", "repeats"))


def _repeats_a_snowflake_run(item: pytest.Item) -> bool:
    """A suite imported into a Snowflake module runs on fakesnow whatever its ``warehouse_url``
    parameter (the module's fixture ignores it): one run, the first dialect's id, is enough."""
    callspec = getattr(item, "callspec", None)
    dialect = callspec.params.get("warehouse_url") if callspec is not None else None
    return item.get_closest_marker("snowflake") is not None and dialect in ("postgres", "mysql", "duckdb")


@pytest.hookimpl(tryfirst=True)  # before `-m` filters, so `-m full` and `-m "not full"` see the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    repeats = [item for item in items if _repeats_a_snowflake_run(item)]
    if repeats:
        config.hook.pytest_deselected(items=repeats)
        items[:] = [item for item in items if not _repeats_a_snowflake_run(item)]
    full = [item for item in items if _in_full_tier(item)]
    for item in full:
        if item.get_closest_marker("full") is None:
            item.add_marker(pytest.mark.full)
    if _tier(config) == FAST_TIER:
        if full:
            chosen = set(map(id, full))
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if id(item) not in chosen]
        return
    # Every tier, on xdist workers with --dist loadfile (.ci/test): the files of the longest tests go
    # first, so one worker is not left alone with the deployment test at the end.
    def weight(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("deployment") else 1 if item.get_closest_marker("slow") else 2

    first_of_file: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        first_of_file[path] = min(first_of_file.get(path, 2), weight(item))
    order = {path: index for index, path in enumerate(first_of_file)}
    items.sort(key=lambda item: (first_of_file[item.nodeid.split("::", 1)[0]], order[item.nodeid.split("::", 1)[0]]))


def pytest_report_header(config: pytest.Config) -> str:
    if _tier(config) == FAST_TIER:
        return "tier: fast (tests marked `full` are deselected; `bash .ci/test --all` runs every tier)"
    return "tier: all"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_AIRFLOW_HOME:
        shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)
