"""Erase by what a request names: an email, a phone number, an external id, found in the records table and
its history (hashed with the table's key where its policy hashes the field), on every dialect."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiPolicy
from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.warehouse.run.rejects import MAX_REJECT_BYTES
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from tests.warehouse.pii_helpers import HISTORY, KEY, OTHER_KEY, STRICT, person, write_under
from tests.warehouse.whhelpers import T2, reflect, rows_by_ref

HASHED = PiiPolicy.parse({"email": "hash", "phone": "hash", "sources[].external_id": "hash"})


def history_refs(engine, table: str) -> set[str]:
    t = reflect(engine, companion_table_name(table, "history"))
    with engine.connect() as conn:
        return set(conn.execute(sa.select(t.c.record_ref)).scalars())


def people_with_an_old_email(writer, policy: PiiPolicy | None) -> None:
    """1..4; 2's email changed in the second run (its old one only in history)."""
    plan = policy.plan(KEY) if policy is not None else None
    write_under(writer, plan, [person(i) for i in range(1, 5)], reconcile=HISTORY)
    write_under(writer, plan, [person(1), person(2, observed_at=T2, email="new2@example.com"), person(3), person(4)],
                reconcile=HISTORY)


def erase(engine, writer, **finders):
    return erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=KEY, **finders)


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_erase_by_email_finds_current_and_old_emails(make_writer, engine, policy) -> None:
    writer = make_writer()
    people_with_an_old_email(writer, policy)
    # an old email (only in history), spelled differently from how it was stored
    erased = erase(engine, writer, emails=["  P2@Example.COM "])
    assert erased.found == 1 and erased.records == 1 and erased.history == 2
    assert person(2)["record_ref"] not in rows_by_ref(engine, writer.table)
    assert person(2)["record_ref"] not in history_refs(engine, writer.table)
    erased = erase(engine, writer, emails=["p3@example.com", "nobody@example.com"])
    assert erased.found == 1 and set(rows_by_ref(engine, writer.table)) == {person(1)["record_ref"],
                                                                           person(4)["record_ref"]}
    audit = AuditReader(engine, table=writer.audit_table).get_run(erased.run_id)
    assert "p3@example.com" not in str(audit) and person(3)["record_ref"] not in str(audit)


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_erase_by_phone_compares_normalised_numbers(make_writer, engine, policy) -> None:
    writer = make_writer()
    people_with_an_old_email(writer, policy)
    erased = erase(engine, writer, phones=["+49-30-12341"])  # stored as "+49 30 12341"
    assert erased.found == 1 and person(1)["record_ref"] not in rows_by_ref(engine, writer.table)


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_erase_by_external_id_matches_the_source_identity_or_the_type_asked_for(make_writer, engine, policy) -> None:
    writer = make_writer()
    people_with_an_old_email(writer, policy)
    erased = erase(engine, writer, external_ids=["crm-eu:ext-3", "crm:ext-1", "other:ext-1"],
                   external_ids_of_type=["crm:ext-4"])
    assert erased.found == 2
    assert set(rows_by_ref(engine, writer.table)) == {person(1)["record_ref"], person(2)["record_ref"]}


def test_erase_by_a_dropped_field_is_refused(make_writer, engine) -> None:
    writer = make_writer()
    people_with_an_old_email(writer, PiiPolicy.parse({"email": "drop"}))
    before = rows_by_ref(engine, writer.table)
    with pytest.raises(BosConfigurationError, match="not stored") as raised:
        erase(engine, writer, emails=["p1@example.com"])
    assert "--record-ref" in str(raised.value) and "--external-id" in str(raised.value)
    assert rows_by_ref(engine, writer.table) == before


def test_a_hashed_field_needs_the_key_and_a_bad_external_id_is_refused(make_writer, engine) -> None:
    writer = make_writer()
    people_with_an_old_email(writer, STRICT)
    with pytest.raises(BosConfigurationError, match="key"):
        erase_records(engine, table=writer.table, audit_table=writer.audit_table, emails=["p1@example.com"])
    with pytest.raises(BosConfigurationError, match="SOURCE:ID"):
        erase(engine, writer, external_ids=["no-colon"])
    assert len(rows_by_ref(engine, writer.table)) == 4


def test_a_key_other_than_the_tables_is_refused_not_searched_with(make_writer, engine) -> None:
    """Hashed with another key, the person would not be found: "found 0" would leave them in the table."""
    writer = make_writer()
    people_with_an_old_email(writer, HASHED)
    before = rows_by_ref(engine, writer.table)
    for finders in ({"emails": ["p1@example.com"]}, {"phones": ["+49 30 12341"]}, {"external_ids": ["crm-eu:ext-1"]}):
        with pytest.raises(BosConfigurationError, match="not the one the table's hashes were made with") as raised:
            erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=OTHER_KEY, **finders)
        assert OTHER_KEY.key_id in str(raised.value) and "Give the table's key" in str(raised.value)
    assert rows_by_ref(engine, writer.table) == before
    assert erase(engine, writer, emails=["p1@example.com"]).found == 1  # the table's own key finds them


def test_hashed_values_are_found_in_sql_without_reading_every_row(make_writer, engine, monkeypatch) -> None:
    """Under a policy that hashes what a request names, the stored form is known: the refs are found by
    equality in the database (old values in history too), and no row is read into the process."""
    from airflow_provider_bos.warehouse.upkeep import erase_finders

    writer = make_writer()
    people_with_an_old_email(writer, HASHED)

    def no_scan(*args, **kwargs):
        raise AssertionError("every row was read to find hashed values")

    monkeypatch.setattr(erase_finders, "rows_in_batches", no_scan)
    erased = erase(engine, writer, emails=["  P2@Example.COM "], phones=["+49-30-12341"],
                   external_ids=["crm-eu:ext-3", "other:ext-1"], external_ids_of_type=["crm:ext-4"])
    assert erased.found == 4 and erased.history == 2 + 1 + 1 + 1
    assert rows_by_ref(engine, writer.table) == {}


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_a_phone_number_without_a_digit_is_refused_not_matched_to_every_empty_phone(make_writer, engine,
                                                                                    policy) -> None:
    """Its normal form is empty, as is that of every stored phone without a digit ("n/a", "-")."""
    writer = make_writer()
    plan = policy.plan(KEY) if policy is not None else None
    write_under(writer, plan, [person(1, phone="n/a"), person(2, phone="-"), person(3)])
    with pytest.raises(BosConfigurationError, match="must hold a digit"):
        erase(engine, writer, phones=["unknown"])
    assert len(rows_by_ref(engine, writer.table)) == 3


def test_a_request_finds_the_records_only_ever_quarantined(make_writer, engine) -> None:
    """Without a policy a quarantined record is kept whole in ``<table>_rejects``: a person BOS only ever
    sent in a shape the table refused is found there by their email, phone or external id, the ref
    erased everywhere, and no quarantined copy of them is left (one cut at the size limit included)."""
    writer = make_writer()
    cut = person(8, display_name={"first": "Eight"})
    cut["sources"][0]["zz_notes"] = "n" * MAX_REJECT_BYTES  # the last key of the last field: cut within it
    nameless = {**person(6), "record_ref": None}  # no ref to erase it by: deleted by its run and bytes
    write_under(writer, None, [person(1), person(2), person(7, display_name={"first": "Seven"}),
                               person(9, display_name={"first": "Nine"}), cut, nameless],
                invalid_records="quarantine")
    rejects = reflect(engine, rejects_table_name(writer.table))

    def quarantined() -> list[str | None]:
        with engine.connect() as conn:
            return sorted(conn.execute(sa.select(rejects.c.record_ref)).scalars(), key=str)

    assert quarantined() == sorted([None, *(person(i)["record_ref"] for i in (7, 8, 9))], key=str)
    erased = erase(engine, writer, emails=["p6@example.com"])
    assert (erased.found, erased.rejects) == (1, 1)
    erased = erase(engine, writer, emails=["P9@Example.com"])
    assert (erased.found, erased.rejects, erased.records) == (1, 1, 0)
    erased = erase(engine, writer, external_ids=["crm-eu:ext-7"], phones=["+49 30 12348"])
    assert (erased.found, erased.rejects) == (2, 2)
    assert quarantined() == [] and set(rows_by_ref(engine, writer.table)) == {person(1)["record_ref"],
                                                                               person(2)["record_ref"]}


def test_a_quarantined_record_is_matched_by_its_own_fields_whatever_its_shape(make_writer, engine) -> None:
    """Only a quarantined record's own top-level email and phone and its own provenance entries name it:
    not a colleague's email or an id nested in its attributes, nor a source and an id of two different
    entries. A cut inside ``attributes`` (which come first) leaves it to be erased by ref; a record of
    a shape no table stores (``sources`` a text, a source named by a list) is passed over, not fatal."""
    writer = make_writer()
    nested = person(3, display_name={"first": "Three"}, attributes={
        "manager": {"email": "boss@example.com"},
        "contacts": [{"source_type": "hr", "external_id": "hr-9"}]})
    nested["sources"] = [{**nested["sources"][0], "source_identity": "crm-eu", "external_id": "ext-3"},
                         {**nested["sources"][0], "source_identity": "hr-de", "source_type": "hr",
                          "external_id": "hr-3"}]
    cut_early = person(4, display_name={"first": "Four"}, attributes={"notes": "n" * (MAX_REJECT_BYTES + 10)})
    odd = [person(5, sources="crm"), person(6, sources=[{"source_identity": ["crm-eu"], "external_id": "ext-6"}])]
    write_under(writer, None, [person(1), nested, cut_early, *odd], invalid_records="quarantine")
    rejects = reflect(engine, rejects_table_name(writer.table))

    def quarantined() -> set[str]:
        with engine.connect() as conn:
            return set(conn.execute(sa.select(rejects.c.record_ref)).scalars())

    assert quarantined() == {person(i)["record_ref"] for i in (3, 4, 5, 6)}
    # Not its own: a colleague's email, an id nested in attributes, a source and an id of two entries.
    missed = erase(engine, writer, emails=["boss@example.com"], external_ids=["hr:hr-9", "crm-eu:hr-3"])
    assert (missed.found, missed.rejects) == (0, 0)
    # Past the cut inside attributes: nothing left to find it by but its ref.
    assert erase(engine, writer, emails=["p4@example.com"]).found == 0
    assert erase_records(engine, table=writer.table, audit_table=writer.audit_table,
                         record_refs=[person(4)["record_ref"]]).rejects == 1
    # Its own second entry; and the odd shapes are compared where they can be, never fatal.
    erased = erase(engine, writer, external_ids=["hr-de:hr-3", "crm-eu:ext-6"], emails=["P5@example.com"])
    assert (erased.found, erased.rejects) == (2, 2)
    assert quarantined() == {person(6)["record_ref"]}
