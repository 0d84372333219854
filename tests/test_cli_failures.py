"""A failing command ends in one line on stderr that says what failed and what to do; the chain of
causes only with ``--debug``. Run as a person runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "airflow-provider-bos")
# Nothing listens on port 1: the connection is refused at once.
UNREACHABLE = "postgresql://bos@127.0.0.1:1/warehouse"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW_CONN_UNREACHABLE_WAREHOUSE": UNREACHABLE}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize("command", [
    ["erase", "--conn-id", "unreachable_warehouse", "--table", "bos_people", "--record-ref", "bos:person:1"],
    ["pii-apply", "--conn-id", "unreachable_warehouse", "--table", "bos_people", "--policy", '{"phone": "drop"}'],
])
def test_an_unreachable_warehouse_is_one_line_saying_what_to_check(command: list[str]) -> None:
    done = _run(*command)

    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith("airflow-provider-bos: error: Could not inspect bos_people: ")
    assert "Connection refused" in line  # what failed, in the driver's words
    assert line.endswith("The database could not be reached: check that it is running and reachable from this "
                         "machine, and the connection's host, port, database and credentials.")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_debug_prints_the_chain_above_the_same_last_line() -> None:
    quiet = _run("erase", "--conn-id", "unreachable_warehouse", "--table", "bos_people", "--record-ref", "x")
    debug = _run("--debug", "erase", "--conn-id", "unreachable_warehouse", "--table", "bos_people",
                 "--record-ref", "x")

    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "psycopg.OperationalError" in debug.stderr  # the driver's error, where it was raised
    assert debug.stderr.strip().splitlines()[-1] == quiet.stderr.strip()
