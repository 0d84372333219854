"""An external id names one person: an erasure by ``SOURCE:ID`` compares the id exactly as given (no
trimming, no Unicode normalisation, a number stored is not the text) and SOURCE as one source_identity;
every source of a type only when asked for (``external_ids_of_type``, ``--external-id-of-type``).

Kept ids are compared in Python (the records, their history, the quarantined records); hashed ones in
SQL, where MySQL/MariaDB compare text under a collation that ignores case and trailing spaces (the
expanded ``sources`` of JSON_TABLE). Every dialect; the same tests run on Snowflake from
test_snowflake_erase.py. That '4711' and '4711 ' (or the number 4711) hash alike is the hash
recipe's to tell apart: the hashed cases here use ids that differ in more than that.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import rejects_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import T2, make_record, run_info, write

HASHED = PiiPolicy.parse({"sources[].external_id": "hash"})
KEY = PiiKey.from_text("Xq4vT9mLw2ZbR7kP0sNc8YdJ3hGf6UaE1tWoQ5iKzB-Vn_r", source="a test")
HISTORY = ReconcileOptions(history=True)


def write_under(writer: WarehouseWriter, policy: PiiPolicy | None, records: list[dict], **kwargs: Any) -> None:
    """Write ``records`` as the run side does under ``policy``: each through its plan, its fingerprint kept."""
    plan = policy.plan(KEY) if policy is not None else None
    stored = [plan.apply(r) for r in records] if plan is not None else records
    write(writer, stored, run_info(), pii=plan.fingerprint if plan is not None else None, **kwargs)


def holder(n: int, source_identity: str, external_id: Any, *, source_type: str = "crm", **fields: Any) -> dict:
    """Person ``n`` with one provenance entry ``source_identity``/``source_type``: ``external_id``."""
    made = make_record(n, **fields)
    made["sources"][0].update(source_identity=source_identity, source_type=source_type, external_id=external_id)
    return made


def ref(n: int) -> str:
    return make_record(n)["record_ref"]


def erase(engine: sa.Engine, writer: WarehouseWriter, **finders: Any):
    return erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=KEY, **finders)


def refs(engine: sa.Engine, writer: WarehouseWriter) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT record_ref FROM {writer.table}").scalars())


def quarantined(engine: sa.Engine, writer: WarehouseWriter) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT record_ref FROM {rejects_table_name(writer.table)}").scalars())


def several_sources_of_one_type(writer: WarehouseWriter, policy: PiiPolicy | None) -> None:
    """The id 4711 at two sources of type crm, and at sources whose names differ from crm-eu only in
    case or a trailing space (other sources, as far as anyone can tell)."""
    write_under(writer, policy,
                [holder(1, "crm-eu", "4711"), holder(2, "crm-us", "4711"), holder(3, "CRM-EU", "4711"),
                 holder(4, "crm-eu ", "4711"), holder(5, "hr-de", "4711", source_type="hr")])


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_source_names_one_source_identity_exactly(writer, engine, policy) -> None:
    several_sources_of_one_type(writer, policy)

    erased = erase(engine, writer, external_ids=["crm-eu:4711"])
    assert refs(engine, writer) == {ref(2), ref(3), ref(4), ref(5)} and erased.found == 1

    # "crm" is the type of crm-eu and crm-us, not a source_identity: it names nobody.
    assert erase(engine, writer, external_ids=["crm:4711"]).found == 0
    assert refs(engine, writer) == {ref(2), ref(3), ref(4), ref(5)}


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_every_source_of_a_type_is_matched_only_when_asked_for(writer, engine, policy) -> None:
    several_sources_of_one_type(writer, policy)

    erased = erase(engine, writer, external_ids_of_type=["crm:4711"])

    assert erased.found == 4 and refs(engine, writer) == {ref(5)}
    # The type is compared exactly too.
    assert erase(engine, writer, external_ids_of_type=["HR:4711", "hr :4711"]).found == 0


def test_a_kept_id_is_compared_exactly_as_given(writer, engine) -> None:
    """'4711 ' is not '4711', nor the number 4711; a composed é is not a decomposed one. In the records
    and in their history (2's id changed on day 2: its old one is only there)."""
    composed, decomposed = "k\u00e9-7", "ke\u0301-7"
    people = [holder(1, "crm-eu", "4711"), holder(2, "crm-eu", "4711 "), holder(3, "crm-eu", 4711),
              holder(4, "crm-eu", " 4711"), holder(5, "crm-eu", composed), holder(6, "crm-eu", decomposed)]
    write_under(writer, None, people, reconcile=HISTORY)
    write_under(writer, None, [*people[:1], holder(2, "crm-eu", "4711 -new", observed_at=T2), *people[2:]],
                reconcile=HISTORY)

    erased = erase(engine, writer, external_ids=["crm-eu:4711"])
    assert refs(engine, writer) == {ref(n) for n in (2, 3, 4, 5, 6)} and erased.found == 1

    assert erase(engine, writer, external_ids=["crm-eu:4711 "]).found == 1  # 2's old id, in history only
    assert erase(engine, writer, external_ids=[f"crm-eu:{composed}"]).found == 1
    assert refs(engine, writer) == {ref(3), ref(4), ref(6)}
    # A number stored is not found by its digits: such a person is erased by ref.
    assert erase(engine, writer, external_ids=["crm-eu:4711", "crm-eu: 4711 "]).found == 0
    assert erase(engine, writer, record_refs=[ref(3)]).records == 1
    assert refs(engine, writer) == {ref(4), ref(6)}


def test_a_quarantined_records_id_is_compared_exactly_as_given(writer, engine) -> None:
    """Kept whole in the rejects table (a run without a policy), a record is matched by its own entries'
    ids exactly, and by one source_identity unless a type is asked for."""
    bad = {"display_name": {"first": "Refused"}}  # a shape the table refuses: quarantined whole
    write_under(writer, None, [holder(1, "crm-eu", "4711", **bad), holder(2, "crm-eu", "4711 ", **bad),
                               holder(3, "crm-eu", 4711, **bad), holder(4, "crm-us", "4711", **bad),
                               holder(5, "crm-eu", "ok-5")], invalid_records="quarantine")
    assert quarantined(engine, writer) == {ref(n) for n in (1, 2, 3, 4)}

    erased = erase(engine, writer, external_ids=["crm-eu:4711", "crm:4711"])
    assert quarantined(engine, writer) == {ref(2), ref(3), ref(4)} and (erased.found, erased.rejects) == (1, 1)

    erased = erase(engine, writer, external_ids_of_type=["crm:4711"])
    assert quarantined(engine, writer) == {ref(2), ref(3)} and erased.found == 1
    assert refs(engine, writer) == {ref(5)}


def test_an_external_id_of_type_must_be_written_type_colon_id(writer, engine) -> None:
    write_under(writer, None, [holder(1, "crm-eu", "4711")])
    for given in ("no-colon", ":4711", "crm:"):
        with pytest.raises(BosConfigurationError, match="TYPE:ID"):
            erase(engine, writer, external_ids_of_type=[given])
    assert refs(engine, writer) == {ref(1)}


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_a_source_holding_a_colon_is_named_as_a_json_string(writer, engine, policy) -> None:
    """Any text may be a source_identity, a colon too: ``SOURCE:ID`` splits at the first colon, so
    ``crm:eu:ab-1`` names the id ``eu:ab-1`` of ``crm``; the id ``ab-1`` of ``crm:eu`` is named with
    the source as a JSON string, ``"crm:eu":ab-1`` (as is any source beginning with a quote)."""
    write_under(writer, policy, [holder(1, "crm:eu", "ab-1"), holder(2, "crm", "eu:ab-1"),
                                 holder(3, '"q', "7"), holder(4, "crm:eu", "ab-2")])

    assert erase(engine, writer, external_ids=['"crm:eu":ab-1']).found == 1
    assert refs(engine, writer) == {ref(2), ref(3), ref(4)}
    assert erase(engine, writer, external_ids=["crm:eu:ab-1"]).found == 1  # the id eu:ab-1 of crm
    assert erase(engine, writer, external_ids=['"\\"q":7']).found == 1
    assert refs(engine, writer) == {ref(4)}
    for bad in ('"crm:eu"ab-2', '"crm:eu:ab-2', '"crm:eu":', '"":ab-2', '"q:7'):
        with pytest.raises(BosConfigurationError, match="SOURCE:ID"):
            erase(engine, writer, external_ids=[bad])
    assert refs(engine, writer) == {ref(4)}
