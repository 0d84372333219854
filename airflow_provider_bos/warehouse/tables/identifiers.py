"""Validation of the table and schema names the warehouse puts into SQL text.

Names are validated against a deliberately small alphabet and then quoted by the database's own
identifier preparer, so a name can never carry SQL (``x; DROP TABLE y``, quotes, dots, comments).
"""

from __future__ import annotations

import re

from airflow_provider_bos.exceptions import BosConfigurationError, BosIdentifierError

__all__ = ["IDENTIFIER_PATTERN", "validate_identifier", "validate_schema"]

IDENTIFIER_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def validate_identifier(name: object, *, kind: str = "table", what: str | None = None) -> str:
    """Return ``name`` if it is a safe identifier (``^[A-Za-z_][A-Za-z0-9_]{0,62}$``), else raise.

    ``kind`` (or its alias ``what``) names the identifier in the message, e.g. ``"destination_table"``.

    :raises BosIdentifierError: naming the kind of identifier and the rule it broke.
    """
    kind = what or kind
    # fullmatch, not match + "$": "$" would accept a trailing newline.
    if not isinstance(name, str) or IDENTIFIER_PATTERN.fullmatch(name) is None:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise BosIdentifierError(
            f"Invalid {kind} name {shown}: it must start with a letter or underscore, contain only "
            "ASCII letters, digits and underscores, and be at most 63 characters long."
        )
    return name


def validate_schema(schema: object, dialect_name: str) -> str | None:
    """Validate an optional schema (PostgreSQL schema / MySQL database) for ``dialect_name``.

    SQLite has no schemas we write to: only ``None`` or ``"main"`` are accepted (both mean the main
    database file); ``"main"`` is normalised to ``None``.
    """
    if schema is None or schema == "":
        return None
    name = validate_identifier(schema, kind="schema")
    if dialect_name == "sqlite":
        if name.lower() != "main":
            raise BosConfigurationError(
                f"SQLite destinations have no schema {name!r}: leave the destination schema empty "
                "(or 'main'); point the connection at another database file instead."
            )
        return None
    return name
