"""Failures read in one line where people look: a sync task's log ends its own lines with one ERROR
line saying what failed and what to do (the chain of causes at debug level, not in the traceback),
and a DAG with a bad personal-data policy names the policy's error in ``airflow dags test`` and in
the import errors (``airflow dags list-import-errors``, the UI's banner).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from afhelpers import task_states

from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow

AIRFLOW = str(Path(sys.executable).parent / "airflow")
HINT = "The database could not be reached: check that it is running and reachable from this machine"
POLICY_ERROR = "Personal-data policy field 'emial': not a field a policy can name. Did you mean 'email'?"


def test_an_unreachable_warehouse_ends_the_task_log_in_one_clear_line(bos_airflow, run_dag, monkeypatch,
                                                                       capsys) -> None:
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": 1, "login": "bos", "schema": "warehouse"}))

    dag_run = run_dag("bos_test_sync")

    assert task_states(dag_run)["sync"] == "failed"
    log = "".join(capsys.readouterr())  # the task log (structlog writes it to stdout under dag.test)
    lines = log.splitlines()
    failed = [i for i, line in enumerate(lines) if "BOS task failed: " in line]
    assert failed, log[-3000:]
    line = lines[failed[-1]]
    assert "error" in line.lower() and "Connection refused" in line and HINT in line
    # The traceback Airflow prints below it is the error's own: the driver's chain is left out.
    after = "\n".join(lines[failed[-1]:])
    assert "psycopg" not in after and "sqlalchemy" not in after.lower(), after[-3000:]
    assert "The above exception was the direct cause" not in after


def test_the_chain_of_causes_stays_at_debug_level() -> None:
    import logging

    import sqlalchemy as sa

    from airflow_provider_bos.exceptions import BosWarehouseError
    from airflow_provider_bos.operators.failures import reported
    from airflow_provider_bos.warehouse.run.db_calls import db_detail

    engine = sa.create_engine("postgresql+psycopg://bos@127.0.0.1:1/warehouse")
    try:
        try:
            with engine.connect():
                pass
        except sa.exc.OperationalError as cause:
            try:
                raise BosWarehouseError(f"Could not inspect people: {db_detail(cause)}") from cause
            except BosWarehouseError as exc:
                error = exc
    finally:
        engine.dispose()

    records: list[logging.LogRecord] = []
    log = logging.getLogger("test.failures")
    log.setLevel(logging.DEBUG)
    log.addHandler(type("Keep", (logging.Handler,), {"emit": lambda self, record: records.append(record)})())

    raised = reported(error, log)

    assert raised is error and raised.__cause__ is None and raised.__suppress_context__
    debug, last = records[0], records[-1]
    assert debug.levelno == logging.DEBUG and "psycopg.OperationalError: connection failed" in debug.getMessage()
    assert "The above exception was the direct cause" in debug.getMessage()
    assert last.levelno == logging.ERROR and last.getMessage() == f"BOS task failed: {error}"


@pytest.fixture(scope="module")
def bad_policy_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An Airflow home of its own, migrated, whose DAGs folder holds one DAG with a misspelt policy field."""
    home = tmp_path_factory.mktemp("bad-policy-airflow-home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "bad_policy.py").write_text(textwrap.dedent("""
        from datetime import UTC, datetime

        from airflow.sdk import DAG

        from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

        with DAG(dag_id="bad_policy", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
            BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="wh",
                                     destination_table="people", pii_policy={"emial": "hash"})
    """), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}")
    migrated = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, env=env, check=False)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    return env


def _airflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIRFLOW, *args], capture_output=True, text=True, env=env, timeout=300, check=False)


def test_dags_test_names_the_policy_error(bad_policy_home) -> None:
    done = _airflow(bad_policy_home, "dags", "test", "bad_policy")

    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "The personal-data policy (pii_policy) is invalid" in output and POLICY_ERROR in output


def test_the_import_errors_name_the_policy_error(bad_policy_home) -> None:
    """What the UI's banner and ``airflow dags list-import-errors`` show, once the DAG was parsed."""
    assert _airflow(bad_policy_home, "dags", "reserialize").returncode == 0

    listed = _airflow(bad_policy_home, "dags", "list-import-errors", "--output", "json")

    assert listed.returncode == 1, listed.stderr[-2000:]  # the command's way of saying there are errors
    (error,) = json.loads(next(line for line in listed.stdout.splitlines() if line.startswith("[{")))
    assert error["filepath"].endswith("bad_policy.py")
    assert " ".join(POLICY_ERROR.split()) in " ".join(error["error"].split())
