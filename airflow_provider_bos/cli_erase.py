"""``airflow-provider-bos erase``: delete a person's rows on request (see :mod:`.warehouse.upkeep.erase`).

    airflow-provider-bos erase --conn-id warehouse --table bos_people --record-ref bos:person:42
    airflow-provider-bos erase --conn-id warehouse --table bos_people --email alice@example.org \
        --phone "+49 30 123456" --external-id crm-eu:4711

``--email``, ``--phone``, ``--external-id SOURCE:ID`` (the source_identity SOURCE) and
``--external-id-of-type TYPE:ID`` (any source of the source_type TYPE) find every record_ref whose
current row or any history version holds that value (an email or phone normalised as the
personal-data hash recipe normalises it, an external id exactly as given; hashed with the table's key,
from ``--key-conn-id``, where the table's policy hashes the field).

Deletes the rows of each ``--record-ref``, of the earlier records merged into it and of the records it
was merged into (the same person's, followed through the lineage both ways), from the table, its
history, lineage and rejects tables in one transaction that also replaces the refs in the audit
table's messages, writes an audit row that names no ref, then reclaims the space the deleted rows held
(so the database files keep no copy), and prints the counts, the refs taken as successors and the
records left (with why) as JSON. A record split into several is not followed: when none of them is
erased the command erases nothing and exits 1 naming them; name the person's with ``--record-ref`` and
the others with ``--keep-successor``. Exits 1 if the reclaim failed after the deletion committed (the
message names what to run; running the erasure again reclaims again).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from airflow_provider_bos.pii import PiiKey

__all__ = ["add_erase_parser"]


def _cmd_erase(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from airflow_provider_bos.hooks.connections import engine_for_connection
    from airflow_provider_bos.warehouse.upkeep.erase import erase_records

    refs = list(args.record_ref or [])
    if args.record_refs_from == "-":
        refs += _refs_of(stdin)
    elif args.record_refs_from:
        with open(args.record_refs_from, encoding="utf-8", newline="") as lines:
            refs += _refs_of(lines)
    engine = engine_for_connection(args.conn_id)

    def key() -> PiiKey:  # read only if the table's policy hashes a field a finder names
        from airflow_provider_bos.pii.airflow_key import key_from_connection

        return key_from_connection(args.key_conn_id)

    try:
        erased = erase_records(engine, table=args.table, schema=args.schema, audit_table=args.audit_table,
                               record_refs=refs, emails=args.email or (), phones=args.phone or (),
                               external_ids=args.external_id or (), external_ids_of_type=args.external_id_of_type or (),
                               keep_successors=args.keep_successor or (), key=key, conn_id=args.conn_id)
    finally:
        engine.dispose()
    print(json.dumps(erased.as_dict(), indent=2), file=out)
    return 0


def _refs_of(lines: Iterable[str]) -> list[str]:
    """The refs of a refs file: each line as it is but for its line ending (a ref is any string, and
    ``"r:7 "`` is not ``"r:7"``); blank lines are skipped."""
    refs = (line.rstrip("\r\n") for line in lines)
    return [ref for ref in refs if ref.strip()]


def add_table_arguments(parser: Any) -> None:
    """The arguments naming a records table: its warehouse connection, name, schema and audit table."""
    parser.add_argument("--conn-id", required=True, help="The Airflow SQL connection of the warehouse.")
    parser.add_argument("--table", required=True, help="The records table (as the operator's destination_table).")
    parser.add_argument("--schema", default=None, help="Its schema / database (as destination_schema).")
    parser.add_argument("--audit-table", default="bos_sync_runs", help="The audit table (default bos_sync_runs).")


def add_erase_parser(commands: Any) -> None:
    """The ``erase`` subcommand, on the CLI's subparsers."""
    erase = commands.add_parser(
        "erase", help="Delete the rows of record_refs (given, or found by email, phone or external id), and of "
                 "the same people's records merged into them or that they were merged into, from a table, its "
                 "history, lineage and rejects, scrub them from the audit messages and reclaim the freed space "
                 "(on request).",
    )
    add_table_arguments(erase)
    erase.add_argument("--record-ref", action="append", metavar="REF", help="A record_ref to erase (repeatable).")
    erase.add_argument("--record-refs-from", metavar="FILE",
                       help="Also erase the record_refs in FILE, one a line, exactly as the line holds it but for "
                            "its line ending; blank lines are skipped ('-': standard input).")
    erase.add_argument("--email", action="append", metavar="EMAIL",
                       help="Also erase every record whose email is (or was, in history) EMAIL, compared "
                            "case-folded and trimmed (repeatable).")
    erase.add_argument("--phone", action="append", metavar="PHONE",
                       help="Also erase every record whose phone is (or was) PHONE, compared as digits and a "
                            "leading + (repeatable).")
    erase.add_argument("--external-id", action="append", metavar="SOURCE:ID",
                       help="Also erase every record with a provenance entry whose source_identity is SOURCE and "
                            "whose external_id is ID, both exactly as given (repeatable). SOURCE ends at the first "
                            "colon; one holding a colon is written as a JSON string: '\"crm:eu\":4711'. A number "
                            "stored as the id is not the text: erase such a record by --record-ref.")
    erase.add_argument("--external-id-of-type", action="append", metavar="TYPE:ID",
                       help="Also erase every record with a provenance entry of any source whose source_type is "
                            "TYPE and whose external_id is ID, both exactly as given (repeatable).")
    erase.add_argument("--keep-successor", action="append", metavar="REF",
                       help="A record an erased one was merged or split into that is NOT the person's: leave it "
                            "(the output names it). Needed to decide a split (repeatable).")
    erase.add_argument("--key-conn-id", default="bos_pii_key",
                       help="The Airflow connection whose password holds the personal-data hash key; read only "
                            "when the table's policy hashes a field named above (default bos_pii_key).")
    erase.set_defaults(handler=_cmd_erase)
