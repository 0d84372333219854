"""What the OpenLineage schema facet says of the columns a personal-data policy changes.

A consumer of lineage (a catalog, a data-protection review) sees, per column of the records table,
whether what it holds is hashed or dropped, without reading the DAG: a hashed column is
``hashed (HMAC-SHA-256, personal-data policy)``; a dropped one is kept in the facet (the column
exists, always NULL) and described as dropped; ``attributes`` and ``sources`` name the paths the
policy hashes or drops inside them; a promoted attribute column names its path, and says hashed when
the policy hashes that path. The descriptions name fields and actions only, never a value or the key.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_bos.pii import PiiPolicy
from airflow_provider_bos.pii.fields import ENTRY_EXTRAS, EXTERNAL_ID, JSON_FIELDS, TOP_LEVEL_FIELDS
from airflow_provider_bos.warehouse.tables.policy_store import effective_action

__all__ = ["HASHED", "policy_column_descriptions"]

HASHED = "hashed (HMAC-SHA-256, personal-data policy)"
DROPPED = "dropped (personal-data policy): always NULL"


def policy_column_descriptions(policy: PiiPolicy, promoted: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """``column -> description`` for the records table's columns that ``policy`` changes, and for its
    promoted attribute columns (``promoted``: ``(column, attributes path)`` each)."""
    rules = policy.as_dict()
    described: dict[str, str] = {}
    for column, path in promoted:
        hashed = effective_action(rules, path) == "hash"
        described[column] = f"promoted from {path}" + (f": {HASHED}" if hashed else "")
    for column in (*TOP_LEVEL_FIELDS, *JSON_FIELDS):
        action = rules.get(column)
        if action is not None:
            described[column] = HASHED if action == "hash" else DROPPED
    entries = [f"{EXTERNAL_ID} {HASHED}"] if rules.get(EXTERNAL_ID) == "hash" else []
    if rules.get(ENTRY_EXTRAS) in ("hash", "drop"):
        entries.append(f"{ENTRY_EXTRAS} " + (HASHED if rules[ENTRY_EXTRAS] == "hash" else "dropped"))
    if entries:
        described["sources"] = "; ".join(entries)
    paths = [(name, action) for name, action in rules.items() if name == "attributes" or name.startswith("attributes.")]
    if paths:
        said = {"hash": "hashed (HMAC-SHA-256)", "drop": "dropped", "keep": "kept"}
        described["attributes"] = "personal-data policy: " + "; ".join(
            f"{name} {said[action]}" for name, action in paths)
    return described
