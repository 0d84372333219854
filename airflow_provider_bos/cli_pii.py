"""The personal-data commands (see :mod:`.pii`): ``pii-keygen``, ``pii-hash`` and ``pii-apply``.

    airflow-provider-bos pii-keygen
    airflow-provider-bos pii-hash --key-conn-id bos_pii_key --field email alice@example.com
    airflow-provider-bos pii-apply --conn-id warehouse --table bos_people \
        --policy '{"email": "hash", "phone": "hash"}' --key-conn-id bos_pii_key

Reads the key from the Airflow Connection's password (which also consults the secrets backend),
hashes each value as the operator's ``pii_policy`` does for that field, and prints one hash a line,
in the order given, so a person can be looked up (or erased) by their email or phone in a table
that stores only hashes. The key is never printed. A value that normalises to nothing (blank, a phone
number without a digit) is refused: the table stores NULL for it, so no hash would find it.

``pii-keygen`` prints a new random key (48 random bytes, URL-safe base64) for the key Connection's
password, e.g. ``airflow connections add bos_pii_key --conn-type generic --conn-password
"$(airflow-provider-bos pii-keygen)"``.

``pii-apply`` re-applies a stricter policy to a stored table, its history and rejects in one
transaction (:mod:`.warehouse.upkeep.pii_apply`), and prints what it rewrote as JSON; a looser policy or
another key is refused (it needs a full re-read).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from airflow_provider_bos.cli_erase import add_table_arguments
from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["add_pii_apply_parser", "add_pii_hash_parser", "add_pii_keygen_parser"]


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
    hashes = []
    for position, value in enumerate(values, start=1):
        try:
            hashes.append(lookup_hash(key, field, value))
        except BosConfigurationError as exc:  # a blank: nothing printed, the position named (not the value)
            raise BosConfigurationError(f"Value {position} of {len(values)}: {exc}") from None
    for digest in hashes:
        print(digest, file=out)
    out.flush()
    return 0


def _cmd_pii_keygen(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from airflow_provider_bos.pii.keyed_hash import generate_key_text

    print(generate_key_text(), file=out)
    out.flush()
    return 0


def add_pii_keygen_parser(commands: Any) -> None:
    """The ``pii-keygen`` subcommand, on the CLI's subparsers."""
    keygen = commands.add_parser(
        "pii-keygen", help="Print a new random personal-data hash key (for the key Connection's password).",
        description="Print a new random personal-data hash key: 48 random bytes as URL-safe base64. Store it "
                    "as the password of the key Connection, e.g. airflow connections add bos_pii_key "
                    "--conn-type generic --conn-password \"$(airflow-provider-bos pii-keygen)\", and keep it: "
                    "a new key means a full re-read of every table hashed with the old one.",
    )
    keygen.set_defaults(handler=_cmd_pii_keygen)


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


def _policy_argument(text: str) -> dict[str, str]:
    try:
        policy = json.loads(text)
    except ValueError:
        raise BosConfigurationError(
            "--policy must be the policy as a JSON object, e.g. '{\"email\": \"hash\", \"phone\": \"drop\"}'."
        ) from None
    if not isinstance(policy, dict):
        raise BosConfigurationError("--policy must be a JSON object of field to 'keep', 'hash' or 'drop'.")
    return policy


def _cmd_pii_apply(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from airflow_provider_bos.hooks.connections import engine_for_connection
    from airflow_provider_bos.pii import PiiPolicy
    from airflow_provider_bos.pii.airflow_key import key_from_connection
    from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy

    if args.policy_file:
        with open(args.policy_file, encoding="utf-8") as file:
            text = file.read()
    elif args.policy is not None:
        text = args.policy
    else:
        raise BosConfigurationError("Give the stricter policy: --policy JSON or --policy-file FILE.")
    policy = PiiPolicy.parse(_policy_argument(text))  # a wrong policy fails before anything is read
    key = key_from_connection(args.key_conn_id) if policy.needs_key else None
    engine = engine_for_connection(args.conn_id)
    try:
        applied = apply_stricter_policy(engine, table=args.table, schema=args.schema, audit_table=args.audit_table,
                                        policy=policy, key=key, conn_id=args.conn_id)
    finally:
        engine.dispose()
    print(json.dumps(applied.as_dict(), indent=2), file=out)
    return 0


def add_pii_apply_parser(commands: Any) -> None:
    """The ``pii-apply`` subcommand, on the CLI's subparsers."""
    apply = commands.add_parser(
        "pii-apply", help="Re-apply a stricter personal-data policy to a stored table, its history and rejects "
                          "(one transaction, no re-read), then reclaim the freed space.",
    )
    add_table_arguments(apply)
    apply.add_argument("--policy", metavar="JSON",
                       help="The new policy as a JSON object, as the operator's pii_policy (the whole policy, "
                            "not only what changes).")
    apply.add_argument("--policy-file", metavar="FILE", help="Read the policy's JSON from FILE instead.")
    apply.add_argument("--key-conn-id", default="bos_pii_key",
                       help="The Airflow connection whose password holds the hash key (read when the policy "
                            "hashes a field; it must be the key the table's hashes were made with).")
    apply.set_defaults(handler=_cmd_pii_apply)
