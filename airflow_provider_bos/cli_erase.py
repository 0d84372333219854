"""``airflow-provider-bos erase``: delete a person's rows on request (see :mod:`.warehouse.erase`).

    airflow-provider-bos erase --conn-id warehouse --table bos_people --record-ref bos:person:42

Deletes the rows of each ``--record-ref`` from the table, its history, lineage and rejects tables
in one transaction that also replaces the refs in the audit table's messages, writes an audit row
that names no ref, then reclaims the space the deleted rows held (so the database files keep no
copy), and prints the counts and what it ran as JSON. Exits 1 if the reclaim failed after the
deletion committed (the message names what to run; running the erasure again reclaims again).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

__all__ = ["add_erase_parser"]


def _cmd_erase(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from airflow_provider_bos.hooks.connections import engine_for_connection
    from airflow_provider_bos.warehouse.erase import erase_records

    refs = list(args.record_ref or [])
    if args.record_refs_from == "-":
        refs += [line.strip() for line in stdin if line.strip()]
    elif args.record_refs_from:
        with open(args.record_refs_from, encoding="utf-8") as lines:
            refs += [line.strip() for line in lines if line.strip()]
    engine = engine_for_connection(args.conn_id)
    try:
        erased = erase_records(engine, table=args.table, schema=args.schema, audit_table=args.audit_table,
                               record_refs=refs, conn_id=args.conn_id)
    finally:
        engine.dispose()
    print(json.dumps(erased.as_dict(), indent=2), file=out)
    return 0


def add_erase_parser(commands: Any) -> None:
    """The ``erase`` subcommand, on the CLI's subparsers."""
    erase = commands.add_parser(
        "erase", help="Delete the rows of record_refs from a table, its history, lineage and rejects, scrub them "
                 "from the audit messages and reclaim the freed space (on request).",
    )
    erase.add_argument("--conn-id", required=True, help="The Airflow SQL connection of the warehouse.")
    erase.add_argument("--table", required=True, help="The records table (as the operator's destination_table).")
    erase.add_argument("--schema", default=None, help="Its schema / database (as destination_schema).")
    erase.add_argument("--audit-table", default="bos_sync_runs", help="The audit table (default bos_sync_runs).")
    erase.add_argument("--record-ref", action="append", metavar="REF", help="A record_ref to erase (repeatable).")
    erase.add_argument("--record-refs-from", metavar="FILE",
                       help="Also erase the record_refs in FILE, one a line ('-': standard input).")
    erase.set_defaults(handler=_cmd_erase)
