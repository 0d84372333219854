"""``airflow-provider-bos pii-hash``: the hash a table stores for a value (see :mod:`.pii`).

    airflow-provider-bos pii-hash --key-conn-id bos_pii_key --field email alice@example.com

Reads the key from the Airflow Connection's password (which also consults the secrets backend),
hashes each value as the operator's ``pii_policy`` does for that field, and prints one hash a line,
in the order given, so a person can be looked up (or erased) by their email or phone in a table
that stores only hashes. The key is never printed.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["add_pii_hash_parser"]


def _cmd_pii_hash(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from airflow_provider_bos.pii import lookup_hash, parse_field
    from airflow_provider_bos.pii.airflow_key import key_from_connection

    field = parse_field(args.field).canonical  # a wrong field fails before the key is read
    values = list(args.values)
    if args.values_from == "-":
        values += [line.rstrip("\r\n") for line in stdin if line.strip()]
    elif args.values_from:
        with open(args.values_from, encoding="utf-8") as lines:
            values += [line.rstrip("\r\n") for line in lines if line.strip()]
    if not values:
        raise BosConfigurationError("Name at least one value to hash (arguments, or --values-from FILE).")
    key = key_from_connection(args.key_conn_id)
    for value in values:
        print(lookup_hash(key, field, value), file=out)
    out.flush()
    return 0


def add_pii_hash_parser(commands: Any) -> None:
    """The ``pii-hash`` subcommand, on the CLI's subparsers."""
    pii_hash = commands.add_parser(
        "pii-hash", help="Print the keyed hash a personal-data policy stores for each value (for look-ups).",
    )
    pii_hash.add_argument("--key-conn-id", required=True,
                          help="The Airflow connection whose password holds the hash key.")
    pii_hash.add_argument("--field", required=True,
                          help="The policy field the values belong to: email, phone, display_name, "
                               "sources[].external_id or attributes.<path> (it decides the normalisation).")
    pii_hash.add_argument("--values-from", metavar="FILE",
                          help="Also hash the values in FILE, one a line ('-': standard input).")
    pii_hash.add_argument("values", nargs="*", metavar="VALUE", help="A raw value to hash.")
    pii_hash.set_defaults(handler=_cmd_pii_hash)
