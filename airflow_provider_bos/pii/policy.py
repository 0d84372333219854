"""The personal-data policy: per field, ``keep`` (the default), ``hash`` or ``drop``.

Parsed from the operator's mapping, e.g.::

    {"email": "hash", "phone": "hash", "attributes.employment.*": "drop",
     "attributes.employment.department": "keep", "sources[].external_id": "hash"}

Field names: :mod:`.fields`. Rules may nest, and **the most specific rule wins**: above,
everything under ``attributes.employment`` is dropped except ``department``. Nesting is allowed
because it is how an allow-list is written (``attributes.*: hash`` with a few ``keep`` exceptions
hashes every attribute a source adds later, instead of storing it in clear until someone notices);
with "most specific wins" every value still has exactly one action, so there is nothing to
contradict. Naming one path twice (``attributes.a`` and ``attributes.a.*``) is an error.

``"*"`` gives its action to every field no rule names (:data:`~.fields.ROOT_FIELDS`: the text and
JSON fields, ``attributes``, ``sources[].external_id`` and ``sources[].*``), so a policy can be
written as an allow-list that covers whatever a record carries, e.g. ``{"*": "drop",
"sources[].external_id": "hash", "attributes.department": "keep"}``. It is spelt out into those
fields' own rules: a policy with ``*`` is the same policy as the one naming each field.

``sources[].external_id`` may be kept or hashed, not dropped: the writer follows identities over
time (merges, splits, retiring) by each provenance entry's (source_type, source_identity,
external_id); a hashed id keeps that working, a dropped one would make every entry of a source the
same identity.

The canonical form (:attr:`PiiPolicy.rules`) leaves out rules that change nothing (``keep`` where
nothing above hashes or drops, a rule repeating the action above it), so policies that store the
same thing have the same fingerprint.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii.fields import EVERY_FIELD, EXTERNAL_ID, ROOT_FIELDS, FieldName, parse_field
from airflow_provider_bos.pii.fingerprint import PolicyFingerprint
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION, PiiKey
from airflow_provider_bos.pii.plan import PiiPlan

__all__ = ["PiiAction", "PiiPolicy"]


class PiiAction(enum.StrEnum):
    KEEP = "keep"
    HASH = "hash"
    DROP = "drop"


_ACTIONS = ", ".join(repr(a.value) for a in PiiAction)


def _action(field: str, value: Any) -> PiiAction:
    try:
        return PiiAction(value)
    except ValueError:
        raise BosConfigurationError(
            f"Personal-data policy field {field!r}: action {value!r} is not one of {_ACTIONS}."
        ) from None


def _inherited(field: FieldName, explicit: Mapping[FieldName, PiiAction]) -> PiiAction:
    """The action the nearest named ancestor of an attributes path gives it (``keep`` if none)."""
    path = field.attribute_path
    for depth in range(len(path) - 1, -1, -1):
        ancestor = parse_field(".".join(("attributes", *path[:depth])))
        if ancestor in explicit:
            return explicit[ancestor]
    return PiiAction.KEEP


def _spelt_out(mapping: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``mapping`` with its ``*`` rule given to each root field no rule names (problems appended)."""
    every = mapping.pop(EVERY_FIELD)
    try:
        action = _action(EVERY_FIELD, every)
    except BosConfigurationError as exc:
        problems.append(str(exc))
        return mapping
    named = set()
    for name in mapping:
        with contextlib.suppress(BosConfigurationError):  # reported with the other rules
            named.add(parse_field(name).canonical)
    unnamed = [field for field in ROOT_FIELDS if field not in named]
    if action is PiiAction.DROP and EXTERNAL_ID in unnamed:
        problems.append(f"Personal-data policy field {EVERY_FIELD!r}: 'drop' would drop {EXTERNAL_ID}, which can "
                        f"be kept or hashed, not dropped (identities are followed across runs by it); name "
                        f"{EXTERNAL_ID!r} with 'hash' (or 'keep') beside it.")
        unnamed.remove(EXTERNAL_ID)
    return {**mapping, **dict.fromkeys(unnamed, action.value)}


@dataclass(frozen=True)
class PiiPolicy:
    """A validated personal-data policy in canonical form: ``(field, action)`` pairs, sorted.

    Build it with :meth:`parse`; :meth:`plan` binds it to a key for applying it to records.
    """

    rules: tuple[tuple[str, PiiAction], ...] = ()

    @classmethod
    def parse(cls, mapping: Mapping[str, str] | PiiPolicy | None) -> PiiPolicy:
        """The policy of the operator's ``pii_policy`` mapping (``None``: keep everything).

        :raises BosConfigurationError: naming every field and action that is wrong, and why.
        """
        if isinstance(mapping, PiiPolicy):
            return mapping
        if mapping is None:
            return cls()
        if not isinstance(mapping, Mapping):
            raise BosConfigurationError(
                f"pii_policy must be a mapping of field to 'keep', 'hash' or 'drop', not a {type(mapping).__name__}."
            )
        problems: list[str] = []
        explicit: dict[FieldName, PiiAction] = {}
        spelled: dict[FieldName, str] = {}
        rules = dict(mapping)
        if EVERY_FIELD in rules:
            rules = _spelt_out(rules, problems)
        for name, value in rules.items():
            try:
                field, action = parse_field(name), _action(name, value)
            except BosConfigurationError as exc:
                problems.append(str(exc))
                continue
            if field in explicit:
                problems.append(f"Personal-data policy fields {spelled[field]!r} and {name!r} name the same "
                                "path; keep one of them.")
                continue
            if field.canonical == EXTERNAL_ID and action is PiiAction.DROP:
                problems.append(f"Personal-data policy field {EXTERNAL_ID!r}: it can be kept or hashed, not "
                                "dropped (identities are followed across runs by it); use 'hash'.")
                continue
            explicit[field], spelled[field] = action, name
        if problems:
            raise BosConfigurationError(
                "The personal-data policy (pii_policy) is invalid:\n  " + "\n  ".join(problems)
            )
        effective = (
            (field.canonical, action)
            for field, action in explicit.items()
            if action is not (_inherited(field, explicit) if field.is_attribute else PiiAction.KEEP)
        )
        return cls(tuple(sorted(effective)))

    @property
    def is_empty(self) -> bool:
        """True when the policy keeps every field (applying it changes nothing)."""
        return not self.rules

    @property
    def needs_key(self) -> bool:
        """True when some field is hashed, so a key must be configured."""
        return any(action is PiiAction.HASH for _, action in self.rules)

    def as_dict(self) -> dict[str, str]:
        return {field: action.value for field, action in self.rules}

    def fingerprint(self, key: PiiKey | None) -> PolicyFingerprint:
        """What the table remembers: this canonical policy, the recipe version and the key's id."""
        return PolicyFingerprint(recipe=RECIPE_VERSION, rules=self.as_dict(),
                                 key_id=self._checked_key(key).key_id if self.needs_key else None)

    def plan(self, key: PiiKey | None) -> PiiPlan:
        """The policy compiled for applying to records with ``key`` (``None`` when nothing is hashed)."""
        return PiiPlan(self.as_dict(), self._checked_key(key) if self.needs_key else None,
                       self.fingerprint(key))

    def _checked_key(self, key: PiiKey | None) -> PiiKey:
        if key is None:
            hashed = ", ".join(field for field, action in self.rules if action is PiiAction.HASH)
            raise BosConfigurationError(
                f"The personal-data policy hashes {hashed}, which needs a key: name the Airflow "
                "Connection whose password holds it (never put the key in the DAG file)."
            )
        return key
