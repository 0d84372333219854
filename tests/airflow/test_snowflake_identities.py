"""Identities over time end to end on Snowflake: the suites every database runs (imported), their
destination a Connection of type ``snowflake`` on the fakesnow server, through SnowflakeHook.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))
import test_identities_over_time as days_suite
import test_provenance_e2e as provenance_suite
from snowflake_destination import *  # noqa: F403 - the fixtures that make Snowflake the destination
from test_analyst_queries_e2e import *  # noqa: F403 - docs/analytics.md's queries, on this destination too
from test_identities_over_time import *  # noqa: F403 - the shared suite runs again on this destination
from test_provenance_e2e import *  # noqa: F403 - the shared suite runs again on this destination

pytestmark = [pytest.mark.airflow, pytest.mark.snowflake]


@pytest.fixture(autouse=True)
def _fakesnow_readings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The suites' readers of stored rows, as fakesnow answers them (see below)."""
    monkeypatch.setattr(days_suite, "rows", _rows)
    for name in ("entries_of_the_records", "provenance_rows"):
        read = getattr(provenance_suite, name)
        monkeypatch.setattr(provenance_suite, name, lambda env, read=read: _unnumbered(read(env)))
    yield  # noqa: PT022 - monkeypatch undoes both at teardown


def _rows(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # fakesnow sends a NULL TIMESTAMP_TZ to the client as 1970-01-01: NULL-ness is read in SQL.
    with env["engine"].connect() as conn:
        result = conn.execute(sa.text(
            f"SELECT record_ref, _bos_deleted_at IS NULL AS is_current, _bos_superseded_by FROM {env['table']}"
        )).mappings()
        return {r["record_ref"]: {"record_ref": r["record_ref"], "_bos_superseded_by": r["_bos_superseded_by"],
                                  "_bos_deleted_at": None if r["is_current"] else "retired"} for r in result}


def _unnumbered(entries: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """The entries without their ``entry_index``, once each record's indexes are checked to be 0..n-1.

    fakesnow emulates FLATTEN's INDEX with ``row_number() OVER ()``, which numbers a record's
    elements in no set order (Snowflake's INDEX is the element's place): on fakesnow the places are
    checked as a set, the entries themselves exactly.
    """
    places: dict[str, list[int]] = {}
    for entry in entries:
        places.setdefault(entry[0], []).append(entry[1])
    assert all(sorted(p) == list(range(len(p))) for p in places.values())
    return {(entry[0], *entry[2:]) for entry in entries}
