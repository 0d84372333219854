"""What a table remembers of the policy it was written with, and how a run is checked against it.

The fingerprint is readable text, not a digest, so a mismatch can name what differs::

    {"key_id":"3f2a9c1d0b7e6a45","recipe":1,"rules":{"attributes.employment":"drop","email":"hash"}}

``rules`` is the canonical policy (:class:`~.policy.PiiPolicy`), ``recipe`` the version of the
normalisation and hash recipe, ``key_id`` the key's public id (``null`` when nothing is hashed). It
holds nothing secret: the key id is an HMAC under the key, which reveals nothing about it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["PiiPolicyMismatch", "PolicyFingerprint"]


class PiiPolicyMismatch(BosConfigurationError):
    """The run's personal-data policy or key differs from the one the table was written with."""

    def __init__(self, table: str, differences: list[str], *, way_forward: str | None = None) -> None:
        self.table = table
        self.differences = differences
        way_forward = way_forward or (
            "Run with the policy and key the table was written with, or write this policy into a new "
            "table (a policy or key change changes what is stored for every record, so the table "
            "cannot be continued with it)."
        )
        super().__init__(
            f"Table {table} was written with another personal-data policy or key: "
            + "; ".join(differences)
            + f". Nothing was read. {way_forward}"
        )


def _describe(action: str | None) -> str:
    return {"hash": "hashes it", "drop": "drops it"}.get(action or "", "keeps it")


@dataclass(frozen=True)
class PolicyFingerprint:
    recipe: int
    rules: Mapping[str, str] = field(default_factory=dict)
    key_id: str | None = None

    @property
    def text(self) -> str:
        """The stable text to store (sorted keys, no spaces): equal policies give equal text."""
        document = {"key_id": self.key_id, "recipe": self.recipe, "rules": dict(sorted(self.rules.items()))}
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> PolicyFingerprint:
        """The fingerprint a table stored (its :attr:`text`)."""
        unreadable = BosConfigurationError(
            "The personal-data policy fingerprint stored with the table is not readable (was it "
            "edited?); restore it, or write into a new table."
        )
        try:
            document: Any = json.loads(text)
            recipe, rules, key_id = document["recipe"], document["rules"], document["key_id"]
        except (ValueError, TypeError, KeyError):
            raise unreadable from None
        valid = (type(recipe) is int and isinstance(rules, dict) and (key_id is None or isinstance(key_id, str))
                 and all(isinstance(k, str) and isinstance(v, str) for k, v in rules.items()))
        if not valid:
            raise unreadable
        return cls(recipe=recipe, rules=rules, key_id=key_id)

    def differences(self, stored: PolicyFingerprint | None) -> list[str]:
        """What differs between the table's fingerprint (``stored``; ``None``: written with no policy)
        and this run's, one phrase each (empty when they match)."""
        stored = stored or PolicyFingerprint(recipe=self.recipe)
        found: list[str] = []
        for name in sorted(set(stored.rules) | set(self.rules)):
            was, now = stored.rules.get(name), self.rules.get(name)
            if was != now:
                found.append(f"for {name} the table {_describe(was)}, this run {_describe(now)}")
        if stored.recipe != self.recipe:
            found.append(f"the table's hashes follow recipe version {stored.recipe}, this run's version {self.recipe}")
        if stored.key_id and self.key_id and stored.key_id != self.key_id:
            found.append(f"the key differs (the table's key id {stored.key_id}, this run's {self.key_id})")
        return found

    def require_same(self, stored_text: str | None, *, table: str) -> None:
        """Raise :class:`PiiPolicyMismatch` unless the table's stored fingerprint is this one.

        ``stored_text`` ``None`` means the table was written before it had a policy: a match only for
        a policy that keeps everything.
        """
        stored = PolicyFingerprint.parse(stored_text) if stored_text is not None else None
        differences = self.differences(stored)
        if differences:
            raise PiiPolicyMismatch(table, differences)
