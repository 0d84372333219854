"""A policy compiled for one key, applied to records on the write path (200k records a sync).

Compiled once into what each record needs: the top-level fields to hash or drop, whether provenance
ids are hashed, and a small trie of attribute paths; a field the policy keeps costs nothing, and a
policy that keeps everything returns each record as it is.

What :meth:`PiiPlan.apply` stores:

* a dropped ``display_name``/``email``/``phone`` is ``null`` (its column is NULL); a hashed one is
  its hash; ``null`` stays ``null``, and so does a hashed value that normalises to nothing (a blank,
  a phone number without a digit: see :mod:`.keyed_hash`);
* a dropped ``lifecycle``/``identity_match`` is ``null``; a hashed one is its value hashed as a
  hashed attribute path is (below);
* ``sources[].external_id`` hashed in every provenance entry; ``sources[].*``: every other key of an
  entry beyond the contract's seven removed (drop), or its value hashed as a hashed attribute path is;
* a dropped attribute path loses its key (dropping all attributes leaves ``{}``); a hashed path
  keeps its structure with every string, number and boolean under it replaced by its hash
  (object keys, ``null``, empty objects and lists stay as they are: a policy hashes values, so an
  object keyed by personal data must be dropped, not hashed), each value in the domain of its full
  path (:class:`~.keyed_hash.TreeHasher`);
* lists are looked through: a rule below a list applies to every element of it.

The input record is never changed: what differs is copied, what does not is shared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_provider_bos.pii.fields import (
    ENTRY_EXTRAS,
    ENTRY_FIELDS,
    EXTERNAL_ID,
    JSON_FIELDS,
    TOP_LEVEL_FIELDS,
    parse_field,
)
from airflow_provider_bos.pii.keyed_hash import PiiKey, TreeHasher, hasher_for

if TYPE_CHECKING:
    from airflow_provider_bos.pii.fingerprint import PolicyFingerprint

__all__ = ["PiiPlan"]

_KEEP, _HASH, _DROP = "keep", "hash", "drop"
_DROPPED: Final = object()  # the result of dropping a value: its key (or list element) goes


class _PathNode:
    """One attributes path: the action for its value, and the paths below it that say otherwise."""

    __slots__ = ("action", "children", "dropped_leaves", "hasher", "other_children", "rule")

    def __init__(self, action: str) -> None:
        self.action = action
        #: The policy rule naming this path (None: a path on the way to one, taking its parent's action).
        self.rule: str | None = None
        self.children: dict[str, _PathNode] = {}
        #: The hasher of this path's values (:meth:`attach`; None: the plan has no key).
        self.hasher: TreeHasher | None = None
        #: ``children`` split once the trie is built (:meth:`split`): the keys whose whole value goes
        #: (with their rule), and the rest; a kept object then drops its keys without a call each.
        self.dropped_leaves: tuple[tuple[str, str | None], ...] = ()
        self.other_children: tuple[tuple[str, _PathNode], ...] = ()

    def split(self) -> None:
        """Fill in ``dropped_leaves`` and ``other_children`` here and below."""
        self.dropped_leaves = tuple((k, c.rule) for k, c in self.children.items()
                                    if c.action == _DROP and not c.children)
        dropped = {k for k, _ in self.dropped_leaves}
        self.other_children = tuple((k, c) for k, c in self.children.items() if k not in dropped)
        for child in self.children.values():
            child.split()

    def attach(self, hasher: TreeHasher) -> None:
        """Give this node ``hasher`` (its path's) and each node below its own."""
        self.hasher = hasher
        for key, child in self.children.items():
            child.attach(hasher.child(key))


def _attribute_trie(rules: Mapping[str, str]) -> _PathNode | None:
    """The trie of the attributes rules (``None`` when there are none); shallow rules go first so each
    node made on the way to a deeper rule takes its parent's action."""
    paths = sorted(
        ((parse_field(name).attribute_path, action, parse_field(name).canonical) for name, action in rules.items()
         if parse_field(name).is_attribute),
        key=lambda item: len(item[0]),
    )
    if not paths:
        return None
    root = _PathNode(_KEEP)
    for path, action, rule in paths:
        node = root
        for key in path:
            node = node.children.setdefault(key, _PathNode(node.action))
        node.action, node.rule = action, rule
    root.split()
    return root


def _dropped(value: Any) -> None:
    """A dropped top-level field's stored value: its column is NULL."""
    return None


class PiiPlan:
    """Applies a policy to records (:meth:`apply`). Built by :meth:`PiiPolicy.plan`."""

    def __init__(self, rules: Mapping[str, str], key: PiiKey | None, fingerprint: PolicyFingerprint) -> None:
        self.fingerprint = fingerprint
        self._key = key
        # Per top-level field, what its stored value is made with (its hasher, or _dropped); None: kept.
        self._display_name, self._email, self._phone = (self._top_rule(rules, name) for name in TOP_LEVEL_FIELDS)
        self._lifecycle, self._identity_match = (self._json_rule(rules, name) for name in JSON_FIELDS)
        self._hash_external_id = self._hasher(EXTERNAL_ID) if rules.get(EXTERNAL_ID) == _HASH else None
        # What an entry's keys beyond the contract's seven become: hashed, dropped, or (None) kept.
        self._entry_extras = rules.get(ENTRY_EXTRAS) if rules.get(ENTRY_EXTRAS) in (_HASH, _DROP) else None
        self._extras_hasher = (TreeHasher(key, ENTRY_EXTRAS) if self._entry_extras == _HASH and key is not None
                               else None)
        self._attributes = _attribute_trie(rules)
        if self._attributes is not None and key is not None:
            self._attributes.attach(TreeHasher(key, "attributes"))  # each path its own domain
        # The usual attributes rules (paths below a kept root): only the named children can change.
        self._kept_attributes = self._attributes if self._attributes and self._attributes.action == _KEEP else None
        #: Per rule of the policy, how many values it met in the records applied so far (its hashes,
        #: its drops, or for a ``keep`` exception the values it kept): a rule that meets none in a
        #: run's records names a path they do not have (a typo, ``attributes.salery``).
        self.matched: dict[str, int] = dict.fromkeys(rules, 0)
        #: The policy's rules (field -> action), for saying what each one did.
        self.policy_rules: dict[str, str] = dict(rules)
        #: Records the plan was applied to (known records skip it: they are stored already).
        self.records = 0
        self.is_empty = not (self._display_name or self._email or self._phone or self._lifecycle
                             or self._identity_match or self._hash_external_id or self._entry_extras
                             or self._attributes)

    def __repr__(self) -> str:
        return f"PiiPlan({self.fingerprint.text})"

    def apply(
        self, record: dict[str, Any], *, into: Callable[[dict[str, Any]], dict[str, Any]] = dict,
    ) -> dict[str, Any]:
        """``record`` as the policy stores it (``record`` itself when the policy keeps everything).

        ``into`` makes the stored record's copy (e.g. a ``dict`` subclass the writer knows), so it
        is copied once, not twice.
        """
        if self.is_empty:
            return record
        out = into(record)
        matched = self.matched
        self.records += 1
        # The fields one after the other, not in a loop: this runs for every record.
        if self._display_name is not None and (value := out.get("display_name")) is not None:
            out["display_name"] = self._display_name(value)
            matched["display_name"] += 1
        if self._email is not None and (value := out.get("email")) is not None:
            out["email"] = self._email(value)
            matched["email"] += 1
        if self._phone is not None and (value := out.get("phone")) is not None:
            out["phone"] = self._phone(value)
            matched["phone"] += 1
        if self._lifecycle is not None and (value := out.get("lifecycle")) is not None:
            out["lifecycle"] = self._lifecycle(value)
            matched["lifecycle"] += 1
        if self._identity_match is not None and (value := out.get("identity_match")) is not None:
            out["identity_match"] = self._identity_match(value)
            matched["identity_match"] += 1
        if self._hash_external_id is not None or self._entry_extras is not None:
            sources = out.get("sources")
            if isinstance(sources, list):
                out["sources"] = [self._stored_entry(entry) for entry in sources]
        if self._attributes is not None:
            attributes = out.get("attributes")
            kept = self._kept_attributes
            if kept is not None and type(attributes) is dict:
                applied = attributes
                for key, rule in kept.dropped_leaves:  # as _apply_children does, without its call
                    if key in applied:
                        if applied is attributes:
                            applied = dict(attributes)
                        del applied[key]
                        matched[rule] += 1  # type: ignore[index]  # a dropped leaf is a rule's
                if kept.other_children:
                    applied = self._apply_children(kept, applied)
                if applied is not attributes:
                    out["attributes"] = applied
            elif attributes is not None:
                applied = self._apply_node(self._attributes, attributes)
                out["attributes"] = {} if applied is _DROPPED else applied
        return out

    # --- the parts ---------------------------------------------------------------------------------

    def _top_rule(self, rules: Mapping[str, str], field: str) -> Callable[[Any], str | None] | None:
        action = rules.get(field)
        return self._hasher(field) if action == _HASH else _dropped if action == _DROP else None

    def _json_rule(self, rules: Mapping[str, str], field: str) -> Callable[[Any], Any] | None:
        action = rules.get(field)
        if action == _HASH:
            assert self._key is not None  # PiiPolicy.plan gives a key whenever a rule hashes
            hasher = TreeHasher(self._key, field)
            return lambda value: self._hash_tree(value, hasher)
        return _dropped if action == _DROP else None

    def _hasher(self, field: str) -> Callable[[Any], str | None]:
        assert self._key is not None  # PiiPolicy.plan gives a key whenever a rule hashes
        return hasher_for(self._key, field)

    def _stored_entry(self, entry: Any) -> Any:
        """A provenance entry as stored: its external_id hashed, its other keys hashed or dropped."""
        if not isinstance(entry, dict):
            return entry
        out = entry
        if self._hash_external_id is not None and entry.get("external_id") is not None:
            out = {**entry, "external_id": self._hash_external_id(entry["external_id"])}
            self.matched[EXTERNAL_ID] += 1
        if self._entry_extras is not None:
            extras = [key for key in entry if key not in ENTRY_FIELDS]
            if extras:
                self.matched[ENTRY_EXTRAS] += len(extras)
                out = dict(out) if out is entry else out
                for key in extras:
                    if self._entry_extras == _DROP:
                        del out[key]
                    else:
                        out[key] = self._hash_tree(entry[key], self._extras_hasher)
        return out

    def _apply_action(self, action: str, value: Any, hasher: TreeHasher | None) -> Any:
        if action == _KEEP:
            return value
        if action == _DROP:
            return _DROPPED
        return self._hash_tree(value, hasher)

    def _hash_tree(self, value: Any, hasher: TreeHasher | None) -> Any:
        """``value`` with every string, number and boolean under it hashed by ``hasher`` (the tree's
        field; an object's values by its child hasher, :class:`~.keyed_hash.TreeHasher`)."""
        assert hasher is not None  # PiiPolicy.plan gives a key whenever a rule hashes
        if isinstance(value, dict):
            return {k: self._hash_tree(v, hasher.child(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self._hash_tree(v, hasher) for v in value]
        if value is None:
            return None
        return hasher(value)  # remembers the hashes of values that repeat (departments, titles)

    def _apply_node(self, node: _PathNode, value: Any) -> Any:
        if node.rule is not None and value is not None and not isinstance(value, list):
            self.matched[node.rule] += 1
        if not node.children:
            return self._apply_action(node.action, value, node.hasher)
        if isinstance(value, list):
            applied = (self._apply_node(node, element) for element in value)
            return [element for element in applied if element is not _DROPPED]
        if not isinstance(value, dict):
            return self._apply_action(node.action, value, node.hasher)
        if node.action == _KEEP:
            return self._apply_children(node, value)
        out = {}
        for key, child_value in value.items():
            child = node.children.get(key)
            applied = (self._apply_node(child, child_value) if child is not None
                       else self._apply_action(node.action, child_value,
                                               node.hasher.child(key) if node.action == _HASH and node.hasher
                                               else None))
            if applied is not _DROPPED:
                out[key] = applied
        return out

    def _apply_children(self, node: _PathNode, value: dict[str, Any]) -> dict[str, Any]:
        """A kept object: only its named children can change; it is copied only if one does."""
        out: dict[str, Any] | None = None
        for key, rule in node.dropped_leaves:  # the common rule (a subtree dropped), with no call per key
            if key in value:
                if out is None:
                    out = dict(value)
                del out[key]
                self.matched[rule] += 1  # type: ignore[index]  # a dropped leaf is a rule's
        for key, child in node.other_children:
            if key not in value:
                continue
            current = value[key]
            if child.children:
                applied = self._apply_node(child, current)
            else:
                if child.rule is not None and current is not None:
                    self.matched[child.rule] += 1
                applied = self._apply_action(child.action, current, child.hasher)
            if applied is current:
                continue
            if out is None:
                out = dict(value)
            if applied is _DROPPED:
                del out[key]
            else:
                out[key] = applied
        return value if out is None else out
