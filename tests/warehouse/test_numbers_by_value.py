"""A number is hashed as every engine hands it back: what PostgreSQL's jsonb returns for a float hashes
as the float itself (airflow_provider_bos.json_numbers), and the writer's fast paths never miss one."""

from __future__ import annotations

import json

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.json_numbers import may_be_respelt
from airflow_provider_bos.warehouse.tables.records import canonical_json

FLOATS = st.floats(allow_nan=False, allow_infinity=False)
EDGES = [1e16, -1e16, 1.5e300, 1.7976931348623157e308, 5e-324, -0.0, 0.0, 1e-7, 123456789012345678.0, 1e15, 2.5]


@given(FLOATS)
def test_the_fast_paths_notice_every_number_spelt_by_value(number: float) -> None:
    respelt = canonical_json([number]) != json.dumps([number], separators=(",", ":"))
    if respelt:
        assert may_be_respelt(orjson.dumps([number])) and may_be_respelt(json.dumps([number]))


@pytest.fixture(scope="module")
def pg_engine(postgres_url: str) -> sa.Engine:
    return sa.create_engine(postgres_url)


@pytest.mark.postgres
@settings(max_examples=300, deadline=None)
@given(number=st.one_of(FLOATS, st.sampled_from(EDGES)))
def test_what_jsonb_hands_back_is_spelt_as_the_number_was(pg_engine: sa.Engine, number: float) -> None:
    with pg_engine.connect() as conn:
        document = json.dumps({"n": number})
        back = conn.execute(sa.text("SELECT CAST(:doc AS jsonb)::text"), {"doc": document}).scalar_one()
    decoded = json.loads(back)["n"]
    assert float(decoded) == number  # the same number: 1e16 comes back as the int 10000000000000000
    assert canonical_json({"n": decoded}) == canonical_json({"n": number})
