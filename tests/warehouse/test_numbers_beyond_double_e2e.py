"""End to end, HTTP bytes to tables: a JSON number beyond a 64-bit float's range (``1e400``).

The contract names no type for an attribute's value, and ``1e400`` is JSON. No destination here
stores it exactly (it is no double, and rounding it to infinity or null would store another value),
so the record is refused like any record the table cannot store: quarantined with the others landed,
or the run failing with the reason; it failed the whole read as "not valid JSON", quarantine or not.
Both ways a final frame is read: decoded whole (a small event) and scanned record by record.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.pii.stream import PolicyRun
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import rejects_table_name
from tests.fake_bos import CRM, FakeBos, sync_from

DAY1 = "2026-10-01T12:00:00Z"
BIG = "__a number beyond a double__"
KEY_TEXT = "_PlMrMQzbNMmDslAZ9_9RVz7fk3APlm_CqzhGYaltnY"


def person(n: int, **attributes: Any) -> dict[str, Any]:
    return {"record_ref": f"bos:person:{n}", "display_name": f"p{n}", "email": None, "phone": None,
            "lifecycle": None, "identity_match": None, "attributes": {"n": n, **attributes},
            "sources": [{**CRM, "external_id": str(n), "record_type": "person", "observed_at": DAY1,
                         "capabilities": ["read"], "version": None}]}


def sync(writer: WarehouseWriter, records: list[dict[str, Any]], number: str, threshold: int, **options: Any) -> Any:
    return sync_from(FakeBos(records, observed_at=DAY1, raw={BIG: number}), writer,
                     stream_threshold_bytes=threshold, **options)


def refs(engine: sa.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(f"SELECT record_ref FROM {table}")).scalars())


@pytest.mark.parametrize("threshold", [256, 1 << 20], ids=["scanned", "whole"])
@pytest.mark.parametrize("number", ["1e400", "-1E+400", "123456789.5e999"])
def test_a_number_beyond_a_double_is_refused_as_unstorable_and_the_rest_lands(
        make_writer: Any, engine: sa.Engine, threshold: int, number: str) -> None:
    writer = make_writer()
    records = [person(0, big=BIG), person(1, nested=[{"x": BIG}]), person(2, small=1e-300)]

    with pytest.raises(BosWarehouseError, match="beyond a 64-bit float") as failed:
        sync(writer, records, number, threshold)
    assert "bos:person:0" in str(failed.value)
    assert not sa.inspect(engine).has_table(writer.table) or not refs(engine, writer.table)

    outcome = sync(writer, records, number, threshold, invalid_records="quarantine")
    assert (outcome.counts.inserted, outcome.counts.rejected) == (1, 2)
    assert refs(engine, writer.table) == {"bos:person:2"}
    with engine.connect() as conn:
        rejects = conn.execute(sa.text(f"SELECT record_ref, reason, record FROM {rejects_table_name(writer.table)}"))
        by_ref = {ref: (reason, bytes(record)) for ref, reason, record in rejects}
    assert set(by_ref) == {"bos:person:0", "bos:person:1"}
    for reason, record in by_ref.values():
        assert "beyond a 64-bit float" in reason, reason
        assert number.encode() in record  # the number is kept as BOS wrote it
        json.loads(record)


@pytest.mark.parametrize("policy", [{"email": "hash"}, {"attributes": "hash"}, {"attributes.big": "drop"}],
                         ids=["other-field", "hashed", "dropped"])
def test_under_a_personal_data_policy_the_number_is_refused_or_dropped_never_stored_rounded(
        make_writer: Any, engine: sa.Engine, policy: dict[str, str]) -> None:
    """A policy that keeps the number refuses its record as above; one that hashes it refuses it too
    (a hash of another value would be a lie), one that drops it stores the rest of the record."""
    writer = make_writer()
    pii = PolicyRun.of(PiiPolicy.parse(policy), PiiKey.from_text(KEY_TEXT, source="the test"))
    records = [person(0, big=BIG), person(2)]

    outcome = sync(writer, records, "1e400", 256, invalid_records="quarantine", pii=pii)

    dropped = policy == {"attributes.big": "drop"}
    assert (outcome.counts.inserted, outcome.counts.rejected) == ((2, 0) if dropped else (1, 1))
    assert refs(engine, writer.table) == ({"bos:person:0", "bos:person:2"} if dropped else {"bos:person:2"})
