"""End to end, HTTP bytes to tables: duplicate ``record_ref``s where a copy arrives as a claim.

docs/warehouse.md: duplicates of one result are resolved "latest observed_at, then last occurrence".
A copy byte-identical to the stored row but for its provenance stamps comes through the scanner
undecoded (a :class:`~airflow_provider_bos.wire.KnownRecord` claim; the wire hash leaves stamps
out), so the stored row's stamps are older than its own. The dedupe must judge it by its own: on
every dialect, through each staging path (PostgreSQL's kept claims, DuckDB's staged file, MariaDB's
and SQLite's rows).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.wire import ReconcileOptions
from tests.fake_bos import CRM, FakeBos, sync_from

DAY1, DAY2, DAY2_LATER = "2026-10-01T12:00:00Z", "2026-10-02T12:00:00Z", "2026-10-02T13:00:00Z"


def person(n: int, *, name: str | None = None, observed_at: str) -> dict[str, Any]:
    return {"record_ref": f"bos:person:{n}", "display_name": name or f"p{n}", "email": None, "phone": None,
            "lifecycle": None, "identity_match": None, "attributes": {"n": n},
            "sources": [{**CRM, "external_id": str(n), "record_type": "person", "observed_at": observed_at,
                         "capabilities": ["read"], "version": None}]}


def sync(writer: WarehouseWriter, records: list[dict[str, Any]]) -> Any:
    return sync_from(FakeBos(records, observed_at=DAY2), writer, reconcile=ReconcileOptions(history=True))


def names(engine: sa.Engine, table: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(f"SELECT record_ref, display_name FROM {table}")).all())


def test_a_copy_arriving_as_a_claim_is_judged_by_its_own_stamps(make_writer: Any, engine: sa.Engine) -> None:
    writer = make_writer()
    sync(writer, [person(n, observed_at=DAY1) for n in range(5)])

    again = sync(writer, [
        # p0: changed, then exactly as stored with the same stamps: the last occurrence wins.
        person(0, name="p0-new", observed_at=DAY2), person(0, observed_at=DAY2),
        # p1: as stored, observed later than the changed copy after it: the latest observation wins.
        person(1, observed_at=DAY2_LATER), person(1, name="p1-new", observed_at=DAY2),
        # p2: as stored, then changed and observed later: the change wins.
        person(2, observed_at=DAY2), person(2, name="p2-new", observed_at=DAY2_LATER),
        person(3, observed_at=DAY2), person(4, observed_at=DAY2),
    ])

    assert again.result.known_records == 5  # the copies as stored came through as claims
    counts = again.counts
    assert (counts.inserted, counts.updated, counts.unchanged, counts.duplicates) == (0, 1, 4, 3)
    assert names(engine, writer.table) == {"bos:person:0": "p0", "bos:person:1": "p1", "bos:person:2": "p2-new",
                                           "bos:person:3": "p3", "bos:person:4": "p4"}


def test_of_two_claims_of_one_stored_row_the_later_observation_is_kept(make_writer: Any, engine: sa.Engine) -> None:
    """Two claims of the same stored row and a changed copy between them in time: the changed copy
    is older than the latest claim, so the stored content stays, whatever order the copies come in."""
    writer = make_writer()
    sync(writer, [person(n, observed_at=DAY1) for n in range(3)])

    again = sync(writer, [
        person(0, observed_at=DAY2_LATER), person(0, name="p0-new", observed_at=DAY2), person(0, observed_at=DAY1),
        person(1, observed_at=DAY2), person(2, observed_at=DAY2),
    ])

    counts = again.counts
    assert (counts.updated, counts.unchanged, counts.duplicates) == (0, 3, 2)
    assert names(engine, writer.table)["bos:person:0"] == "p0"
