"""PostgreSQL document staging: one canonical document per record, columns derived in SQL.

The document path (COPY) must land exactly what the column path (executemany) lands, and its
fast orjson mapping must agree byte for byte with the general mapping, or re-runs would rewrite
unchanged rows.
"""

from __future__ import annotations

import gc

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from whhelpers import T0, T1, T2, dump, make_record, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.mcp.final_frame import WireRecord
from airflow_provider_bos.sync import cyclic_gc_paused
from airflow_provider_bos.warehouse import UpsertCounts, WarehouseWriter
from airflow_provider_bos.warehouse.tables.records import json_document_values, parse_timestamp, record_to_row

STAMPS = [T0, T1, T2, "2026-10-08T14:00:00+02:00", "2026-10-08T12:00:00.123456Z", "2026-10-08T12:00:00"]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-7, 2.5e-5, 0.00001, 1e21, -0.0, 123456789.125])
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
sources = st.lists(
    st.fixed_dictionaries(
        {"source_type": st.just("crm"), "external_id": st.text(max_size=5)},
        optional={"observed_at": st.sampled_from(STAMPS), "version": json_values},
    ),
    min_size=1,
    max_size=3,
)
records = st.fixed_dictionaries(
    {"record_ref": st.text(min_size=1, max_size=20), "sources": sources},
    optional={
        "display_name": st.none() | st.text(max_size=10),
        "email": st.none() | st.text(max_size=10),
        "phone": st.none() | st.text(max_size=10),
        "lifecycle": json_values,
        "identity_match": json_values,
        "attributes": st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=4),
        "extra_field_not_stored": json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_the_document_fast_path_agrees_with_the_general_mapping(record):
    fallback = parse_timestamp(T0)
    try:
        row = record_to_row(record, default_observed_at=fallback)
    except BosWarehouseError as refused:
        # Never a row for a record the general path refuses: the same check refuses it, or the
        # fast path declines (a value only the general encoder can judge).
        try:
            fast = json_document_values(WireRecord(record), fallback)
        except BosWarehouseError as also_refused:
            assert str(also_refused) == str(refused)
        else:
            assert fast is None
        return
    fast = json_document_values(WireRecord(record), fallback)
    # The content hash leaves the provenance stamps out (and their entries' order).
    sources = record.get("sources")
    if isinstance(sources, list):
        unstamped = [{k: v for k, v in e.items() if k != "observed_at"} if isinstance(e, dict) else e
                     for e in reversed(sources)]
        assert record_to_row({**record, "sources": unstamped}, default_observed_at=fallback).record_hash \
            == row.record_hash
    if fast is not None:  # None: e.g. a tiny float, which the general path serialises
        assert fast == (row.record_ref, row.document.encode(), row.observed_at, row.record_hash)


def test_the_fast_path_hashes_what_the_general_path_hashes_for_a_typical_record():
    record = make_record(7, attributes={"b": [1, 2.5, {"z": None, "a": "ü"}], "a": True})
    fast = json_document_values(WireRecord(record), None)
    assert fast is not None
    row = record_to_row(record)
    assert fast == (row.record_ref, row.document.encode(), row.observed_at, row.record_hash)
    # the document is the canonical JSON of exactly the stored fields, sorted keys
    assert row.document.startswith('{"attributes":{"a":true,"b":[1,2.5,{"a":"ü","z":null}]},"display_name":')


def test_cyclic_gc_is_paused_inside_and_restored_after_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with cyclic_gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()  # a host that had it off keeps it off
    finally:
        gc.enable()


def _awkward_records(name_suffix: str = "") -> list[dict]:
    out = [make_record(i, name=f"Ñame {i}{name_suffix}") for i in range(300)]
    out += [
        make_record("bos:tab\there", name="tab" + name_suffix),
        make_record("bos:newline\nand\rcr", name="nl" + name_suffix),
        make_record("bos:back\\slash \\N \\.", name="bs\\" + name_suffix),
        make_record('bos:"quoted" ü € 😀', attributes={"path": "C:\\temp\\x", "q": 'say "hi"\t\n'}),
        make_record("bos:nulls", display_name=None, lifecycle=None, identity_match=None, attributes=None),
        make_record("bos:tiny", attributes={"tiny": 1e-7, "big": 1e21, "neg0": -0.0}),
        make_record("bos:late", T2, identity_match={"merged_from": ["a", "b"], "score": 0.97}),
    ]
    sparse = make_record("bos:sparse")
    for key in ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes"):
        del sparse[key]
    out.append(sparse)
    out.append(make_record(3, T2, name="duplicate, later wins"))
    return out


@pytest.mark.postgres
def test_copy_documents_and_executemany_columns_land_identical_rows(postgres_url, unique_table):
    engine = sa.create_engine(postgres_url)
    tables = [f"{unique_table}_d", f"{unique_table}_c"]
    try:
        doc_writer = WarehouseWriter(engine, table=tables[0], audit_table=f"{unique_table}_runs")
        col_writer = WarehouseWriter(engine, table=tables[1], audit_table=f"{unique_table}_runs", use_copy=False)
        assert doc_writer.dialect.capabilities.document_staging
        assert not col_writer.dialect.capabilities.document_staging

        def content(table):  # everything but the per-run metadata (synced_at, run_id)
            return [row[:9] + row[11:] for row in dump(engine, table)]

        first = _awkward_records()
        for writer in (doc_writer, col_writer):
            # wire records (orjson fast path) on the document side, plain dicts on the other
            batch = [WireRecord(r) for r in first] if writer is doc_writer else first
            assert write(writer, batch) == UpsertCounts(inserted=len(first) - 1, duplicates=1)
        assert content(tables[0]) == content(tables[1])

        # unchanged: the hashes computed by both paths match what is stored -> nothing rewritten
        for writer in (doc_writer, col_writer):
            again = [WireRecord(r) for r in first] if writer is col_writer else first
            assert write(writer, again) == UpsertCounts(unchanged=len(first) - 1, duplicates=1)

        changed = _awkward_records(" v2")
        for writer in (doc_writer, col_writer):
            # renamed: 299 people (3's winner is its unrenamed duplicate) + tab, newline, backslash
            assert write(writer, [WireRecord(r) for r in changed]) == UpsertCounts(
                updated=302, unchanged=len(changed) - 1 - 302, duplicates=1
            )
        assert content(tables[0]) == content(tables[1])
        with engine.connect() as conn:
            stored = conn.exec_driver_sql(
                f"SELECT record_ref, display_name, lifecycle, identity_match, attributes FROM {tables[0]} "
                "WHERE record_ref IN ('bos:nulls', 'bos:sparse', 'bos:tab\there')"
            ).all()
        by_ref = {r[0]: r[1:] for r in stored}
        assert by_ref["bos:nulls"] == (None, None, None, {})  # JSON null -> NULL; attributes default {}
        assert by_ref["bos:sparse"] == (None, None, None, {})
        assert by_ref["bos:tab\there"][0] == "tab v2"
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {tables[0]}, {tables[1]}, {unique_table}_runs")
        engine.dispose()
