"""Parsing the operator's ``pii_policy``: what is accepted, in what canonical form, and what is refused (and why)."""

from __future__ import annotations

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiAction, PiiPolicy


def test_a_valid_policy_is_kept_in_one_sorted_canonical_form() -> None:
    policy = PiiPolicy.parse({
        "phone": "hash", "email": "hash", "display_name": "drop", "sources[].external_id": "hash",
        "attributes.employment.cost_center": "hash", "attributes.home.*": "drop",
    })
    assert policy.as_dict() == {
        "attributes.employment.cost_center": "hash", "attributes.home": "drop", "display_name": "drop",
        "email": "hash", "phone": "hash", "sources[].external_id": "hash",
    }
    assert [field for field, _ in policy.rules] == sorted(field for field, _ in policy.rules)
    assert policy.needs_key and not policy.is_empty


@pytest.mark.parametrize("whole", ["attributes", "attributes.*"])
def test_attributes_and_attributes_star_both_name_every_attribute(whole: str) -> None:
    assert PiiPolicy.parse({whole: "drop"}).as_dict() == {"attributes": "drop"}


def test_a_path_with_or_without_star_is_the_same_subtree() -> None:
    assert PiiPolicy.parse({"attributes.a.b": "hash"}) == PiiPolicy.parse({"attributes.a.b.*": "hash"})


@pytest.mark.parametrize("mapping", [None, {}, {"email": "keep", "attributes.a": "keep"}])
def test_keep_everything_is_the_empty_policy_and_needs_no_key(mapping) -> None:
    policy = PiiPolicy.parse(mapping)
    assert policy.is_empty and not policy.needs_key and policy == PiiPolicy()


def test_drop_alone_needs_no_key() -> None:
    assert not PiiPolicy.parse({"email": "drop"}).needs_key


def test_rules_that_change_nothing_are_left_out_so_equal_policies_are_equal() -> None:
    verbose = PiiPolicy.parse({"attributes.*": "hash", "attributes.a": "hash", "attributes.b": "keep",
                               "attributes.b.c": "keep", "email": "keep"})
    assert verbose.as_dict() == {"attributes": "hash", "attributes.b": "keep"}


def test_nested_rules_are_accepted_most_specific_wins() -> None:
    policy = PiiPolicy.parse({"attributes.employment": "drop", "attributes.employment.department": "keep",
                              "attributes.employment.manager.name": "hash"})
    assert dict(policy.rules) == {
        "attributes.employment": PiiAction.DROP, "attributes.employment.department": PiiAction.KEEP,
        "attributes.employment.manager.name": PiiAction.HASH,
    }


def test_a_parsed_policy_parses_to_itself() -> None:
    policy = PiiPolicy.parse({"email": "hash"})
    assert PiiPolicy.parse(policy) is policy


@pytest.mark.parametrize(
    ("mapping", "says"),
    [
        ({"record_ref": "hash"}, "record_ref is the table's key"),
        ({"_bos_observed_at": "drop"}, "_bos_* columns are the provider's own"),
        ({"sources[].observed_at": "drop"}, "only sources[].external_id"),
        ({"sources[].external_id": "drop"}, "kept or hashed, not dropped"),
        ({"emial": "hash"}, "Did you mean 'email'?"),
        ({"lifecycle.state": "drop"}, "not a field a policy can name"),
        ({"*": "drop"}, "name 'sources[].external_id' with 'hash' (or 'keep') beside it"),
        ({"*": "scramble"}, "action 'scramble' is not one of"),
        ({"email": "Hash"}, "action 'Hash' is not one of 'keep', 'hash', 'drop'"),
        ({"email": "encrypt"}, "action 'encrypt' is not one of"),
        ({"email": None}, "action None is not one of"),
        ({"attributes.a": "hash", "attributes.a.*": "drop"}, "'attributes.a' and 'attributes.a.*' name the same path"),
        ({"attributes.a..b": "hash"}, "empty key"),
        ({"attributes.a.": "hash"}, "empty key"),
        ({"attributes.*.email": "hash"}, "no wildcards inside"),
        ({"attributes.contacts[].email": "hash"}, "write the path without '[]' (attributes.contacts.email)"),
    ],
)
def test_invalid_policies_fail_with_a_message_naming_the_field_and_the_fix(mapping, says: str) -> None:
    with pytest.raises(BosConfigurationError, match="pii_policy") as caught:
        PiiPolicy.parse(mapping)
    assert says in str(caught.value)
    assert repr(next(iter(mapping))) in str(caught.value)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(BosConfigurationError) as caught:
        PiiPolicy.parse({"record_ref": "hash", "email": "scramble", "phone": "hash"})
    message = str(caught.value)
    assert "'record_ref'" in message and "'scramble'" in message and "'phone'" not in message


def test_a_policy_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(BosConfigurationError, match="must be a mapping"):
        PiiPolicy.parse(["email"])  # type: ignore[arg-type]


def test_hashing_without_a_key_says_which_fields_need_one() -> None:
    policy = PiiPolicy.parse({"email": "hash", "phone": "hash", "display_name": "drop"})
    with pytest.raises(BosConfigurationError, match="hashes email, phone, which needs a key"):
        policy.plan(None)
    with pytest.raises(BosConfigurationError, match="needs a key"):
        policy.fingerprint(None)


def test_every_field_a_record_carries_can_be_named() -> None:
    """lifecycle, identity_match (any JSON value) and a provenance entry's keys beyond the contract's
    seven are fields of their own: each can be hashed or dropped."""
    policy = PiiPolicy.parse({"lifecycle": "hash", "identity_match": "drop", "sources[].*": "hash"})
    assert policy.as_dict() == {"identity_match": "drop", "lifecycle": "hash", "sources[].*": "hash"}


@pytest.mark.parametrize("every", ["hash", "drop"])
def test_star_gives_its_action_to_every_field_no_rule_names(every: str) -> None:
    """``*`` is the allow-list form: spelt out, it is the policy naming each field, exceptions kept."""
    mapping = {"*": every, "attributes.department": "keep", "sources[].external_id": "hash"}
    spelt_out = {"display_name": every, "email": every, "phone": every, "lifecycle": every,
                 "identity_match": every, "attributes": every, "sources[].*": every,
                 "attributes.department": "keep", "sources[].external_id": "hash"}
    assert PiiPolicy.parse(mapping) == PiiPolicy.parse(spelt_out)
    assert PiiPolicy.parse(mapping).as_dict()["sources[].*"] == every


def test_star_with_keep_changes_nothing_a_rule_does_not() -> None:
    assert PiiPolicy.parse({"*": "keep", "email": "hash"}) == PiiPolicy.parse({"email": "hash"})
