"""Erasure on Snowflake (fakesnow): the rows and the audit text go; Time Travel is what it cannot purge."""

from __future__ import annotations

from typing import Any

import pytest
import test_erase_exact_ids as exact_ids
import test_erase_successors as successors
from fakesnow_support import fakesnow_server, sf_writer, snowflake_url  # noqa: F401 - fixtures
from test_erasure_residue import (
    test_a_failed_sources_words_stored_before_are_reduced_to_the_contracts_fields as reduced_to_the_contracts_fields,
)
from whhelpers import make_record, run_info, write

from airflow_provider_bos.warehouse import AuditReader, WarehouseWriter
from airflow_provider_bos.warehouse.upkeep.erase import erase_records

pytestmark = pytest.mark.snowflake

REF = "bos:person:erase-me-0042"




def test_erasure_scrubs_the_audit_and_says_time_travel_keeps_the_rows(sf_writer: WarehouseWriter) -> None:  # noqa: F811
    engine = sf_writer.engine
    write(sf_writer, [make_record(1), make_record(REF)])
    failed = run_info()
    sf_writer.record_failure(failed, error=f"BosWarehouseError: Record {REF!r}: 'sources' must be a list.")
    erased = erase_records(engine, table=sf_writer.table, audit_table=sf_writer.audit_table, record_refs=[REF])
    assert (erased.records, erased.audit_messages) == (1, 1)
    assert erased.reclaimed.startswith("nothing")
    message = AuditReader(engine, table=sf_writer.audit_table).get_run(failed.run_id)["error_message"]
    assert REF not in message and "[erased record_ref]" in message


def test_a_failed_sources_words_stored_before_are_reduced_on_snowflake_too(sf_writer: WarehouseWriter) -> None:  # noqa: F811
    reduced_to_the_contracts_fields(sf_writer, sf_writer.engine)


# The suites of test_erase_successors.py and test_erase_exact_ids.py, on Snowflake: the lineage followed
# forward, and ids compared exactly (a hashed one through FLATTEN of the stored sources).
def _cases() -> list[Any]:
    cases = []
    for module in (successors, exact_ids):
        for name in sorted(n for n in dir(module) if n.startswith("test_")):
            suite = getattr(module, name)
            marks = [m for m in getattr(suite, "pytestmark", []) if m.name == "parametrize"]
            argument, values = marks[0].args[:2] if marks else (None, [None])
            for value in values:
                arguments = {argument: value} if argument else {}
                label = f"{name}[{'hashed' if value is not None else 'kept'}]" if argument else name
                cases.append(pytest.param(suite, arguments, id=label))
    return cases


@pytest.mark.parametrize(("suite", "arguments"), _cases())
def test_erasure_suites_on_snowflake(sf_writer: WarehouseWriter, suite: Any,  # noqa: F811
                                     arguments: dict[str, Any]) -> None:
    suite(sf_writer, sf_writer.engine, **arguments)
