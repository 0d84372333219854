"""Helpers of the warehouse's personal-data tests: a key, a policy, records written as the run side writes them."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey, PiiPlan, PiiPolicy
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import make_record, reflect, run_info, write

KEY_TEXT = "hXykzjEJYhCg3QAzpRADw8VT5x1QDV910H0PuOkWKDY"
KEY = PiiKey.from_text(KEY_TEXT, source="a test")
OTHER_KEY = PiiKey.from_text("HplAsOR8p5Nemp32xLXGXqqobmJfjVJ65INv-PYYFZg", source="a test")
HISTORY = ReconcileOptions(history=True)

#: email and phone hashed, display_name and one attributes subtree dropped, provenance ids hashed.
STRICT = PiiPolicy.parse({"email": "hash", "phone": "hash", "display_name": "drop",
                          "attributes.private": "drop", "sources[].external_id": "hash"})


def person(i: int | str, **fields: Any) -> dict[str, Any]:
    """A record with personal data in every field a policy can name."""
    fields.setdefault("phone", f"+49 30 1234{i}")
    fields.setdefault("attributes", {"dept": "eng", "private": {"home": f"Street {i}"}})
    fields.setdefault("name", f"Alice Example {i}")
    record = make_record(i, **fields)
    if "sources" not in fields:
        record["sources"][0]["external_id"] = f"ext-{i}"
    return record


def write_under(writer: WarehouseWriter, plan: PiiPlan | None, records: list[dict[str, Any]], **kwargs: Any):
    """Write ``records`` as the run side does: each through ``plan`` first, the fingerprint in the options."""
    stored = [plan.apply(r) for r in records] if plan is not None else records
    return write(writer, stored, run_info(), pii=plan.fingerprint if plan is not None else None, **kwargs)


def raw_values(records: list[dict[str, Any]], *fields: str) -> set[str]:
    """The raw texts of ``fields`` (top-level names, ``external_id``, ``home``) in ``records``."""
    found: set[str] = set()
    for record in records:
        for name in fields:
            if name == "external_id":
                found |= {s["external_id"] for s in record["sources"]}
            elif name == "home":
                found.add(record["attributes"]["private"]["home"])
            elif record.get(name):
                found.add(record[name])
    return found


def every_text(engine: sa.Engine, table: str) -> str:
    """Every value of every row of ``table`` as one text (to search raw values in)."""
    t = reflect(engine, table)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t)).all()
    return "\n".join(repr(v) if not isinstance(v, bytes) else v.decode("utf-8", "replace") for row in rows for v in row)
