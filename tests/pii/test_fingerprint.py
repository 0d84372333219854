"""What a table remembers of its policy, and the message a run with another policy or key gets."""

from __future__ import annotations

import json

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PiiPolicy, PiiPolicyMismatch, PolicyFingerprint
from tests.pii.conftest import KEY_TEXT, OTHER_KEY_TEXT

POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop"}


def test_the_fingerprint_is_stable_readable_text(key: PiiKey) -> None:
    first = PiiPolicy.parse(POLICY).fingerprint(key).text
    again = PiiPolicy.parse(dict(reversed(POLICY.items()))).fingerprint(PiiKey.from_text(KEY_TEXT, source="x")).text
    assert first == again
    assert json.loads(first) == {"key_id": key.key_id, "recipe": 2, "rules": {
        "attributes.employment": "drop", "email": "hash", "phone": "hash"}}


def test_a_policy_change_or_a_key_change_changes_it(key: PiiKey, other_key: PiiKey) -> None:
    base = PiiPolicy.parse(POLICY).fingerprint(key).text
    assert PiiPolicy.parse({**POLICY, "display_name": "drop"}).fingerprint(key).text != base
    assert PiiPolicy.parse(POLICY).fingerprint(other_key).text != base


def test_it_never_holds_the_key(key: PiiKey, other_key: PiiKey) -> None:
    for k, text in ((key, KEY_TEXT), (other_key, OTHER_KEY_TEXT)):
        fingerprint = PiiPolicy.parse(POLICY).fingerprint(k)
        assert text not in fingerprint.text and text not in repr(fingerprint)


def test_a_policy_that_hashes_nothing_names_no_key(key: PiiKey) -> None:
    assert PiiPolicy.parse({"email": "drop"}).fingerprint(key) == PiiPolicy.parse({"email": "drop"}).fingerprint(None)


def test_it_parses_back_from_its_text(key: PiiKey) -> None:
    fingerprint = PiiPolicy.parse(POLICY).fingerprint(key)
    assert PolicyFingerprint.parse(fingerprint.text) == fingerprint


@pytest.mark.parametrize("text", ["", "{}", "not json", '{"recipe":"1","rules":{},"key_id":null}', "[1]"])
def test_an_unreadable_stored_fingerprint_is_an_error_that_says_so(text: str) -> None:
    with pytest.raises(BosConfigurationError, match="not readable"):
        PolicyFingerprint.parse(text)


def test_the_same_policy_and_key_pass(key: PiiKey) -> None:
    stored = PiiPolicy.parse(POLICY).fingerprint(key).text
    PiiPolicy.parse(POLICY).plan(key).fingerprint.require_same(stored, table="bos_people")


def test_a_table_without_a_policy_matches_only_keep_everything(key: PiiKey) -> None:
    PiiPolicy.parse(None).fingerprint(None).require_same(None, table="bos_people")
    with pytest.raises(PiiPolicyMismatch, match="for email the table keeps it, this run hashes it"):
        PiiPolicy.parse({"email": "hash"}).fingerprint(key).require_same(None, table="bos_people")


def test_a_mismatch_names_each_difference_and_the_way_forward(key: PiiKey) -> None:
    stored = PiiPolicy.parse(POLICY).fingerprint(key).text
    run = PiiPolicy.parse({"email": "hash", "phone": "drop", "display_name": "drop"}).fingerprint(key)
    with pytest.raises(PiiPolicyMismatch) as caught:
        run.require_same(stored, table="bos_people")
    assert caught.value.differences == [
        "for attributes.employment the table drops it, this run keeps it",
        "for display_name the table keeps it, this run drops it",
        "for phone the table hashes it, this run drops it",
    ]
    message = str(caught.value)
    assert message.startswith("Table bos_people was written with another personal-data policy or key")
    assert "Nothing was read" in message and "write this policy into a new table" in message
    assert isinstance(caught.value, BosConfigurationError)


def test_a_key_change_is_named_by_key_ids_only(key: PiiKey, other_key: PiiKey) -> None:
    stored = PiiPolicy.parse(POLICY).fingerprint(key).text
    with pytest.raises(PiiPolicyMismatch) as caught:
        PiiPolicy.parse(POLICY).fingerprint(other_key).require_same(stored, table="bos_people")
    assert caught.value.differences == [
        f"the key differs (the table's key id {key.key_id}, this run's {other_key.key_id})"]
    assert KEY_TEXT not in str(caught.value) and OTHER_KEY_TEXT not in str(caught.value)


def test_a_recipe_change_is_named(key: PiiKey) -> None:
    current = PiiPolicy.parse(POLICY).fingerprint(key)
    older = json.loads(current.text) | {"recipe": 1}
    with pytest.raises(PiiPolicyMismatch, match="recipe version 1, this run's version 2"):
        current.require_same(json.dumps(older), table="t")
