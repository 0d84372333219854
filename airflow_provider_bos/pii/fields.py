"""The fields a personal-data policy can name, and how their names are written.

* ``display_name``, ``email``, ``phone``: the record's top-level text fields (table columns);
* ``lifecycle``, ``identity_match``: the record's top-level JSON fields (any JSON value: the
  contract gives them no type), whatever they hold;
* ``sources[].external_id``: the ``external_id`` of every provenance entry;
* ``sources[].*``: every key of a provenance entry beyond the contract's seven (``source_type``,
  ``source_identity``, ``external_id``, ``record_type``, ``observed_at``, ``capabilities``,
  ``version``), whatever it holds;
* ``attributes.<dotted.path>``: the value at that path of ``attributes``, whatever it is (a scalar,
  or an object or list with everything under it). A trailing ``.*`` says the same thing and may be
  written for readability: ``attributes.employment`` and ``attributes.employment.*`` are one field;
  ``attributes`` and ``attributes.*`` name all attributes. Lists on the way are looked through:
  ``attributes.contacts.email`` is the ``email`` of every object in the ``contacts`` list.

``*`` (:data:`EVERY_FIELD`) is not a field: it gives its action to every field above that no rule
names (the allow-list form, :meth:`~.policy.PiiPolicy.parse`).

``record_ref`` (the table's key), the provider's ``_bos_*`` columns and the provenance entry's named
fields other than ``external_id`` (which say which source, not who) are never changed by a policy,
so naming them is an error, as is anything else unknown.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = [
    "ATTRIBUTES",
    "ENTRY_EXTRAS",
    "ENTRY_FIELDS",
    "EVERY_FIELD",
    "EXTERNAL_ID",
    "JSON_FIELDS",
    "ROOT_FIELDS",
    "TOP_LEVEL_FIELDS",
    "FieldName",
    "parse_field",
]

TOP_LEVEL_FIELDS = ("display_name", "email", "phone")
JSON_FIELDS = ("lifecycle", "identity_match")
EXTERNAL_ID = "sources[].external_id"
ENTRY_EXTRAS = "sources[].*"
#: The keys of a provenance entry the contract names (:data:`ENTRY_EXTRAS` is every other key).
ENTRY_FIELDS = frozenset(
    ("source_type", "source_identity", "external_id", "record_type", "observed_at", "capabilities", "version"))
ATTRIBUTES = "attributes"
#: Every field a policy can name, at its root: what ``*`` covers.
ROOT_FIELDS = (*TOP_LEVEL_FIELDS, *JSON_FIELDS, ATTRIBUTES, EXTERNAL_ID, ENTRY_EXTRAS)
EVERY_FIELD = "*"
_SUBTREE = ".*"
_EXAMPLES = (*TOP_LEVEL_FIELDS, *JSON_FIELDS, EXTERNAL_ID, ENTRY_EXTRAS, "attributes.<path>", "attributes.<path>.*",
             EVERY_FIELD)


@dataclass(frozen=True, order=True)
class FieldName:
    """A valid policy field in its one canonical spelling (``attributes`` paths without ``.*``)."""

    canonical: str
    # For attributes: the path's keys under ``attributes`` (empty: all attributes).
    attribute_path: tuple[str, ...] = ()

    @property
    def is_attribute(self) -> bool:
        return self.canonical == ATTRIBUTES or self.canonical.startswith(ATTRIBUTES + ".")


def _fail(name: str, why: str) -> BosConfigurationError:
    return BosConfigurationError(f"Personal-data policy field {name!r}: {why}")


def _unknown(name: str) -> BosConfigurationError:
    close = difflib.get_close_matches(name, [*TOP_LEVEL_FIELDS, *JSON_FIELDS, EXTERNAL_ID, ENTRY_EXTRAS], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return _fail(name, f"not a field a policy can name.{hint} Valid fields: {', '.join(_EXAMPLES)}.")


def parse_field(name: str) -> FieldName:
    """The canonical :class:`FieldName` of ``name``, or a :class:`BosConfigurationError` that says why not."""
    if not isinstance(name, str):
        raise BosConfigurationError(f"Personal-data policy field {name!r}: field names are strings.")
    if name in TOP_LEVEL_FIELDS or name in JSON_FIELDS or name in (EXTERNAL_ID, ENTRY_EXTRAS):
        return FieldName(name)
    if name == "record_ref":
        raise _fail(name, "record_ref is the table's key and is never changed by a policy.")
    if name.startswith("_bos"):
        raise _fail(name, "the _bos_* columns are the provider's own and are never changed by a policy.")
    if name.startswith("sources"):
        raise _fail(name, f"of the provenance fields the contract names only {EXTERNAL_ID} can be hashed; the "
                          "others (source_type, source_identity, observed_at, ...) are never changed. "
                          f"{ENTRY_EXTRAS} names every other key an entry carries.")
    if name != ATTRIBUTES and not name.startswith(ATTRIBUTES + "."):
        raise _unknown(name)
    body = name.removeprefix(ATTRIBUTES).removesuffix(_SUBTREE).removeprefix(".")
    keys = tuple(body.split(".")) if body else ()
    for key in keys:
        if not key:
            raise _fail(name, "an attribute path has an empty key (two dots, or a dot at an end).")
        if "*" in key:
            raise _fail(name, "a '*' may only end a path ('attributes.a.*', the whole subtree at a); "
                              "there are no wildcards inside one.")
        if key.endswith("[]"):
            raise _fail(name, "lists are looked through: write the path without '[]' "
                              f"({ATTRIBUTES}.{'.'.join(k.removesuffix('[]') for k in keys)}).")
    canonical = ".".join((ATTRIBUTES, *keys))
    return FieldName(canonical, keys)
