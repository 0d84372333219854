"""The personal-data policy a table was written with: ``<table>_policy``, one row, and the check of a run
against it (see docs/personal-data.md).

The row holds the policy's fingerprint (:class:`~airflow_provider_bos.pii.PolicyFingerprint`: the
canonical rules, the hash recipe's version, the key's public id; never the key), when it was set and
by which run. The table is made by the first run with a policy; a table without it was written with
none, unless it holds no row at all (a new or emptied table adopts the run's policy).

A run whose policy differs is refused before it reads, with what differs and the way forward: a
stricter policy can be applied to the stored rows (``airflow-provider-bos pii-apply``); a looser one,
another key or recipe needs the raw values again, so a full re-read into a new (or emptied) table.
"""

from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa

from airflow_provider_bos.pii import PiiPolicyMismatch, PolicyFingerprint
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION

__all__ = [
    "action_changes",
    "effective_action",
    "loosening",
    "read_stored_policy",
    "refuse_unless_same",
    "store_policy",
    "way_forward",
]

_ORDER = {"keep": 0, "hash": 1, "drop": 2}


def read_stored_policy(conn: sa.Connection, policy: sa.Table) -> str | None:
    """The stored fingerprint text (``None``: no row)."""
    return conn.execute(sa.select(policy.c.fingerprint).limit(1)).scalar()


def store_policy(conn: sa.Connection, policy: sa.Table, fingerprint: PolicyFingerprint, *, run_id: str,
                 at: datetime) -> None:
    """Make ``fingerprint`` the table's one row (the caller's transaction)."""
    conn.execute(policy.delete())
    conn.execute(policy.insert().values(fingerprint=fingerprint.text, set_at=at, run_id=run_id))


def effective_action(rules: dict[str, str], field: str) -> str:
    """The action ``rules`` give ``field``: its own rule, else (an attributes path) its nearest named
    ancestor's, else keep."""
    if field in rules:
        return rules[field]
    if field.startswith("attributes."):
        parts = field.split(".")
        for depth in range(len(parts) - 1, 0, -1):
            ancestor = ".".join(parts[:depth])
            if ancestor in rules:
                return rules[ancestor]
    return "keep"


def action_changes(stored: PolicyFingerprint | None, new: PolicyFingerprint) -> dict[str, tuple[str, str]]:
    """``{field: (stored action, new action)}`` at every field either policy names (and ``attributes``):
    every value of a record falls under exactly one of them with no rule in between, so comparing
    there compares every value."""
    was = dict(stored.rules) if stored is not None else {}
    now = dict(new.rules)
    fields = sorted(set(was) | set(now) | {"attributes"})
    return {f: (effective_action(was, f), effective_action(now, f)) for f in fields
            if effective_action(was, f) != effective_action(now, f)}


def loosening(stored: PolicyFingerprint | None, new: PolicyFingerprint) -> list[str]:
    """Why ``new`` cannot be applied to rows stored under ``stored`` (empty: it is as strict or
    stricter, same key and recipe): what it would restore, another key, another recipe."""
    reasons = [f"{field} would go from {a} to {b}"
               for field, (a, b) in action_changes(stored, new).items() if _ORDER[b] < _ORDER[a]]
    recipe = stored.recipe if stored is not None else new.recipe
    if recipe != new.recipe:
        reasons.append(f"the hash recipe would go from version {recipe} to {new.recipe}")
    if stored is not None and stored.key_id and new.key_id and stored.key_id != new.key_id:
        reasons.append("the key differs")
    return reasons


def refuse_unless_same(stored_text: str | None, run: PolicyFingerprint | None, *, table: str) -> None:
    """Raise :class:`PiiPolicyMismatch` unless the run's policy (``None``: none) is the stored one
    (``None``: the table was written without a policy); the message says the way forward."""
    stored = PolicyFingerprint.parse(stored_text) if stored_text is not None else None
    baseline = PolicyFingerprint(recipe=stored.recipe if stored is not None else RECIPE_VERSION)
    current = run or baseline
    differences = current.differences(stored)
    if not differences:
        return
    raise PiiPolicyMismatch(table, differences, way_forward=way_forward(stored, current, table=table))


def way_forward(stored: PolicyFingerprint | None, run: PolicyFingerprint, *, table: str) -> str:
    """What to do about a run whose policy differs from the table's."""
    same = "Run with the policy and key the table was written with"
    if not loosening(stored, run):
        policy = json.dumps(dict(sorted(run.rules.items())))
        return (f"{same}, or apply this stricter policy to the stored rows first, in one transaction "
                f"without a re-read: airflow-provider-bos pii-apply --conn-id <warehouse connection> "
                f"--table {table} --policy '{policy}' --key-conn-id <key connection>; then run again.")
    return (f"{same}. This policy keeps more than the table holds, or hashes with another key or recipe: "
            "hashed and dropped values cannot be restored, so it needs a full re-read: write it into a new "
            f"table (a new destination table, with a full read), or empty {table} and its _history table "
            "(TRUNCATE, or DELETE FROM) and run a full read into it.")
