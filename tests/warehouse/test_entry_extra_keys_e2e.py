"""End to end, HTTP bytes to tables: a provenance entry's extra key holding its own ``observed_at``.

The contract lets extra keys come and names no type for them, so an entry may carry an object with an
``observed_at`` of its own. Only the entry's own ``observed_at`` is BOS's stamp, left out of the wire
hash: a change to the nested one is a change of content, which a re-run must decode and write (it was
taken for a re-stamp and the record kept as stored), on every dialect.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter
from tests.fake_bos import CRM, FakeBos, sync_from

DAY1, DAY2, DAY3 = "2026-10-01T12:00:00Z", "2026-10-02T12:00:00Z", "2026-10-03T12:00:00Z"


def person(n: int, *, observed_at: str, meta: Any) -> dict[str, Any]:
    return {"record_ref": f"bos:person:{n}", "display_name": f"p{n}", "email": None, "phone": None,
            "lifecycle": None, "identity_match": None, "attributes": {"n": n},
            "sources": [{**CRM, "external_id": str(n), "record_type": "person", "observed_at": observed_at,
                         "capabilities": ["read"], "version": None, "meta": meta}]}


def sync(writer: WarehouseWriter, records: list[dict[str, Any]], observed_at: str) -> Any:
    return sync_from(FakeBos(records, observed_at=observed_at), writer)


def metas(engine: sa.Engine, table: str) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT record_ref, sources FROM {table}")).all()
    return {ref: (json.loads(s) if isinstance(s, str) else s)[0]["meta"] for ref, s in rows}


def test_a_change_to_an_observed_at_inside_an_entry_is_written(make_writer: Any, engine: sa.Engine) -> None:
    writer = make_writer()
    old, new = "2020-01-01T00:00:00Z", "2021-06-06T06:06:06Z"
    shapes = [{"observed_at": old}, [{"observed_at": old}]]  # an object, an array of one

    def day(observed_at: str, changed: bool) -> list[dict[str, Any]]:
        return [person(0, observed_at=observed_at, meta={"observed_at": new if changed else old}),
                person(1, observed_at=observed_at, meta=[{"observed_at": new if changed else old}]),
                person(2, observed_at=observed_at, meta="unchanged")]

    sync(writer, day(DAY1, changed=False), DAY1)
    assert metas(engine, writer.table) == {"bos:person:0": shapes[0], "bos:person:1": shapes[1],
                                           "bos:person:2": "unchanged"}
    restamped = sync(writer, day(DAY2, changed=False), DAY2)
    assert (restamped.counts.updated, restamped.counts.unchanged) == (0, 3)

    changed = sync(writer, day(DAY3, changed=True), DAY3)
    assert (changed.counts.updated, changed.counts.unchanged) == (2, 1)
    assert metas(engine, writer.table) == {"bos:person:0": {"observed_at": new},
                                           "bos:person:1": [{"observed_at": new}], "bos:person:2": "unchanged"}
