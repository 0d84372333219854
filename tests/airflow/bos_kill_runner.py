"""Run one DAG with dag.test() in this process (a child of a test that may SIGKILL it).

Usage: python bos_kill_runner.py <dags folder> <file name> <dag id>

Everything else (AIRFLOW_HOME, the metadata database, connections as AIRFLOW_CONN_* variables,
BOS_TEST_* settings) comes from the environment the test passes down.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    dags_folder, filename, dag_id = argv
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(dags_folder) / filename))
    if bag.import_errors:
        print(f"import errors: {bag.import_errors}", file=sys.stderr)
        return 2
    dag_run = bag.get_dag(dag_id).test()
    print(f"dag run finished: {getattr(dag_run.state, 'value', dag_run.state)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
