"""Helpers of the sync-health tests: DAG files synced into Airflow's metadata DB, runs put on their day."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import audit_table, dialect_for


def move_run(engine: sa.Engine, audit: str, run_id: str, finished: datetime, took: timedelta) -> None:
    """Put a run on its day: its ``started_at`` and ``finished_at`` (the writer stamps the time it ran)."""
    t = audit_table(sa.MetaData(), dialect_for(engine).name, audit)

    def bound(moment: datetime) -> datetime:
        return moment.replace(tzinfo=None) if engine.dialect.name == "mysql" else moment

    with engine.begin() as conn:
        conn.execute(t.update().where(t.c.run_id == run_id).values(started_at=bound(finished - took),
                                                                   finished_at=bound(finished)))


def audit_rows(engine: sa.Engine, audit: str) -> list[dict[str, Any]]:
    t = audit_table(sa.MetaData(), dialect_for(engine).name, audit)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.finished_at))]


def sync_dag_file(dags_folder: Path, name: str, source: str) -> Path:
    """Write a DAG file into the session's dags folder and store its DAGs (serialized) as the DAG
    processor would; ``dag.test()`` elsewhere re-syncs the whole folder, so the file parses on its own."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    from tests.airflow_names import bundle_dag_bag, sync_bag_to_db

    path = dags_folder / name
    path.write_text(source)
    DagBundlesManager().sync_bundles_to_db()
    bag = bundle_dag_bag(path, dags_folder, "dags-folder")
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    return path


def conn_json(sqlite_file: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(sqlite_file)})


def values_in(text: str, values: list[str]) -> list[str]:
    """The ``values`` found in ``text`` (and in its HTML-escaped and JSON-escaped forms)."""
    import html

    found = []
    for value in values:
        forms = {value, html.escape(value), json.dumps(value)[1:-1]}
        if any(form and form in text for form in forms):
            found.append(value)
    return found


EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
