"""Personal data on Snowflake (fakesnow): the stored policy, a refused policy, erasure by a hashed email,
and a stricter policy re-applied."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, sf_writer, snowflake_url  # noqa: F401 - fixtures

from airflow_provider_bos.pii import PiiPolicy, PiiPolicyMismatch, lookup_hash
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from tests.warehouse.pii_helpers import KEY, STRICT, person, write_under
from tests.warehouse.whhelpers import statements

pytestmark = pytest.mark.snowflake

EMAIL_ONLY = PiiPolicy.parse({"email": "hash"})




def emails(writer: WarehouseWriter) -> dict[str, str | None]:
    with writer.engine.connect() as conn:
        return dict(conn.exec_driver_sql(f"SELECT record_ref, email FROM {writer.table}").all())


def test_policy_erase_and_pii_apply_on_snowflake(sf_writer: WarehouseWriter) -> None:  # noqa: F811
    engine = sf_writer.engine
    write_under(sf_writer, EMAIL_ONLY.plan(KEY), [person(1), person(2), person(3)])
    assert emails(sf_writer)[person(1)["record_ref"]] == lookup_hash(KEY, "email", "p1@example.com")
    sf_writer.require_pii_policy(EMAIL_ONLY.fingerprint(KEY))
    with pytest.raises(PiiPolicyMismatch, match="pii-apply"):
        sf_writer.require_pii_policy(STRICT.fingerprint(KEY))

    erased = erase_records(engine, table=sf_writer.table, audit_table=sf_writer.audit_table,
                           emails=["P2@example.com"], key=KEY)
    assert erased.found == 1 and person(2)["record_ref"] not in emails(sf_writer)

    with statements(engine) as seen:
        applied = apply_stricter_policy(engine, table=sf_writer.table, audit_table=sf_writer.audit_table,
                                        policy=STRICT, key=KEY)
    # A JSON text bound to a VARIANT is stored as a string on Snowflake (fakesnow parses it anyway):
    # the rewritten attributes and sources are parsed.
    updates = [s for s in seen if s.lstrip().upper().startswith("UPDATE") and "attributes=" in s.replace(" ", "")]
    assert updates and all("parse_json(" in s.lower().replace(" ", "") for s in updates)
    assert applied.records == 2 and applied.reclaimed.startswith("nothing")
    sf_writer.require_pii_policy(STRICT.fingerprint(KEY))
    counts = write_under(sf_writer, STRICT.plan(KEY), [person(1), person(3)])
    assert (counts.updated, counts.unchanged) == (0, 2)
    # A hashed external id is found in SQL, through FLATTEN of the stored sources.
    erased = erase_records(engine, table=sf_writer.table, audit_table=sf_writer.audit_table,
                           external_ids=["crm-eu:ext-3"], key=KEY)
    assert erased.found == 1 and set(emails(sf_writer)) == {person(1)["record_ref"]}


def test_quarantined_records_are_erased_by_value_and_keep_a_policy_out_on_snowflake(
        sf_writer: WarehouseWriter) -> None:  # noqa: F811
    """Records quarantined whole (no policy) are found by their email, the ref-less one deleted by its bytes;
    while one is left, an emptied table does not adopt a policy."""
    engine = sf_writer.engine
    nameless = {**person(6), "record_ref": None}
    write_under(sf_writer, None, [person(1), person(7, display_name={"first": "Seven"}), nameless,
                                  person(8, display_name={"first": "Eight"})], invalid_records="quarantine")
    sent: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        sent.append(f"{statement} {parameters!r}")  # the connector inlines the parameters into the text

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        erased = erase_records(engine, table=sf_writer.table, audit_table=sf_writer.audit_table,
                               emails=["P7@example.com", "p6@example.com"])
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert (erased.found, erased.rejects) == (2, 2)
    # The ref-less one is deleted by what Snowflake computes from it: its bytes are not sent back.
    deletes = [s for s in sent if s.upper().startswith("DELETE") and "SHA2(" in s.upper()]
    assert deletes and not [s for s in sent if "Alice Example 6" in s or "p6@example" in s]
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {sf_writer.table}")
    with pytest.raises(PiiPolicyMismatch, match="pii-apply"):
        sf_writer.require_pii_policy(STRICT.fingerprint(KEY))
    erase_records(engine, table=sf_writer.table, audit_table=sf_writer.audit_table, emails=["p8@example.com"])
    sf_writer.require_pii_policy(STRICT.fingerprint(KEY))
