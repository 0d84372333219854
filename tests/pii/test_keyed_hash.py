"""The hash recipe analysts reproduce: normalisation and domain per field, HMAC-SHA-256 under the key, and the
key's secrecy."""

from __future__ import annotations

import copy
import hashlib
import hmac
import pickle

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PiiPolicy, hash_value, lookup_hash, normalise
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION, field_domain, hasher_for
from airflow_provider_bos.redaction import redact
from tests.pii.conftest import KEY_TEXT


def reference_hash(key_text: str, normalised: str, domain: str = "email", json_type: str = "string") -> str:
    """docs/personal-data.md's recipe (version 2), written independently of the package."""
    message = b"bos-pii/2\0" + domain.encode() + b"\0" + json_type.encode() + b"\0" + normalised.encode("utf-8")
    return hmac.new(key_text.encode("utf-8"), message, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(
    ("field", "raw", "normalised"),
    [
        ("email", "  Alice.Smith@Example.ORG \n", "alice.smith@example.org"),
        ("email", "STRASSE@example.de", "strasse@example.de"),
        ("email", "Straße@example.de", "strasse@example.de"),  # case-folded, not just lower-cased
        ("phone", "+49 (30) 1234-56", "+4930123456"),
        ("phone", " +1-555-0100 ext. 7", "+155501007"),
        ("phone", "0049 30 123456", "004930123456"),  # no country code is guessed
        ("phone", "030 / 1234+56", "030123456"),  # only a leading + is kept
        ("phone", "\uff0b\uff14\uff19 \uff13\uff10 \uff11\uff12", "+493012"),  # full-width + and digits (NFKC)
        ("phone", "+\u0664\u0669 \u0663\u0660", "+4930"),  # Arabic-Indic digits: digits of any script
        ("phone", "\u096f\u0967 \u06f1\u06f2", "9112"),  # Devanagari, Persian
        ("phone", "n/a", ""),  # nothing: stored as null
        ("phone", "+", ""),
        ("email", " \t ", ""),
        ("display_name", "  Zoe\u0301 Martin ", "Zo\u00e9 Martin"),  # NFC: e + combining accent is é
        ("display_name", "Émile", "Émile"),  # case is kept outside email
        ("sources[].external_id", " E-00042 ", " E-00042 "),  # exactly as sent
        ("sources[].external_id", "Zoe\u0301", "Zoe\u0301"),
        ("attributes.employment.cost_center", 4711, "4711"),
        ("attributes.flags.active", True, "true"),
        ("attributes.score", 1.5, "1.5"),
    ],
)
def test_normalisation_examples(field: str, raw, normalised: str) -> None:
    assert normalise(field, raw) == normalised


@pytest.mark.parametrize(
    ("field", "raw", "normalised", "json_type"),
    [
        ("email", " Alice.Smith@Example.ORG ", "alice.smith@example.org", "string"),
        ("phone", "+49 (30) 1234-56", "+4930123456", "string"),
        ("display_name", "Zoe\u0301", "Zo\u00e9", "string"),
        ("sources[].external_id", "E-00042", "E-00042", "string"),
        ("sources[].external_id", 4711, "4711", "number"),
        ("attributes.level", 3, "3", "number"),
        ("attributes.flags.active", False, "false", "boolean"),
        ("lifecycle", " onboarding ", "onboarding", "string"),
        ("sources[].*", "Zoë at Workday", "Zoë at Workday", "string"),
    ],
)
def test_known_answers_follow_the_documented_recipe(key: PiiKey, field: str, raw, normalised: str,
                                                    json_type: str) -> None:
    expected = reference_hash(KEY_TEXT, normalised, field, json_type)
    assert hash_value(key, field, raw) == expected
    assert len(expected) == 64 and expected == expected.lower()


def test_a_fixed_vector_pins_the_recipe() -> None:
    # Written down once: a change here changes every stored hash (bump RECIPE_VERSION with it).
    key = PiiKey.from_text("aV0j2bD7UDOGebyPnIFNr8hHARRcOkJrnrK8bzP_bAM", source="a test")
    assert lookup_hash(key, "email", " Alice@Example.org") == (
        "407bea97d2fb9c10aa20101c9974e1fe3de38226d1e44413ae5bd8831eff4f99")
    assert RECIPE_VERSION == 2


def test_same_value_same_key_same_hash_other_key_other_hash(key: PiiKey, other_key: PiiKey) -> None:
    assert hash_value(key, "email", "a@x.org") == hash_value(key, "email", " A@X.ORG ")
    assert hash_value(key, "email", "a@x.org") != hash_value(other_key, "email", "a@x.org")


def test_the_field_is_hashed_so_equal_texts_never_join_across_fields(key: PiiKey) -> None:
    assert hash_value(key, "attributes.private_email", "a@x.org") != hash_value(key, "email", "a@x.org")
    assert hash_value(key, "attributes.private_email", "a@x.org") == reference_hash(
        KEY_TEXT, "a@x.org", "attributes.private_email")


def test_an_attribute_key_that_could_spell_another_path_is_escaped(key: PiiKey) -> None:
    # {"a.b": v} and {"a": {"b": v}} are two paths: their domains differ (a "." in a key is written "\.").
    plan = PiiPolicy.parse({"attributes": "hash"}).plan(key)
    dotted = plan.apply({"record_ref": "r", "attributes": {"a.b": "v", "c\\": {"d": "v"}}})["attributes"]
    nested = plan.apply({"record_ref": "r", "attributes": {"a": {"b": "v"}}})["attributes"]
    assert dotted["a.b"] != nested["a"]["b"] == lookup_hash(key, "attributes.a.b", "v")
    assert dotted["a.b"] == reference_hash(KEY_TEXT, "v", "attributes.a\\.b")
    assert dotted["c\\"]["d"] == reference_hash(KEY_TEXT, "v", "attributes.c\\\\.d")


def test_field_domain_is_the_canonical_field_or_the_full_attribute_path() -> None:
    assert [field_domain(f) for f in ("email", "sources[].*", "attributes.*", "attributes.a.b.*")] == [
        "email", "sources[].*", "attributes", "attributes.a.b"]


def test_a_field_a_policy_cannot_name_has_no_hash(key: PiiKey) -> None:
    with pytest.raises(BosConfigurationError, match="not a field a policy can name"):
        hash_value(key, "emial", "a@x.org")


def test_null_is_never_hashed(key: PiiKey) -> None:
    assert hash_value(key, "email", None) is None


def test_an_object_is_not_a_hashable_value(key: PiiKey) -> None:
    with pytest.raises(BosConfigurationError, match="leaf by leaf"):
        hash_value(key, "attributes.a", {"b": 1})


def test_lookup_hash_refuses_a_field_a_policy_cannot_name(key: PiiKey) -> None:
    with pytest.raises(BosConfigurationError, match="record_ref is the table's key"):
        lookup_hash(key, "record_ref", "bos:person:1")


def test_lookup_hash_takes_either_spelling_of_an_attribute_path(key: PiiKey) -> None:
    assert lookup_hash(key, "attributes.a.*", "x") == lookup_hash(key, "attributes.a", "x")


def test_the_key_text_is_never_in_repr_str_or_errors(key: PiiKey) -> None:
    assert KEY_TEXT not in repr(key) and KEY_TEXT not in str(key) and KEY_TEXT not in f"{key}"
    assert key.key_id in repr(key)
    for attempt in (lambda: pickle.dumps(key), lambda: copy.deepcopy(key), lambda: copy.copy(key)):
        with pytest.raises(TypeError) as caught:
            attempt()
        assert KEY_TEXT not in str(caught.value)


def test_a_short_key_is_refused_without_showing_it() -> None:
    with pytest.raises(BosConfigurationError, match="at least 32 are needed") as caught:
        PiiKey.from_text("short-secret-key", source="the password of Airflow connection 'pii'")
    assert "short-secret-key" not in str(caught.value) and "'pii'" in str(caught.value)


def test_the_key_is_registered_with_the_secrets_masker(key: PiiKey) -> None:
    assert KEY_TEXT not in redact(f"connecting with {KEY_TEXT}")


def test_the_key_id_is_stable_distinct_and_not_the_key(key: PiiKey, other_key: PiiKey) -> None:
    again = PiiKey.from_text(f"  {KEY_TEXT}\n", source="pasted")  # a pasted line break is not part of it
    assert again.key_id == key.key_id and again == key
    assert other_key.key_id != key.key_id and other_key != key
    assert key.key_id not in KEY_TEXT and len(key.key_id) == 16
    assert key.key_id == hmac.new(KEY_TEXT.encode(), b"bos-pii-key-id", "sha256").hexdigest()[:16]


# Random (each prefix below passes the key check).
LONG_KEY = ("cHRqbm9JAwhNDWjQfdhV3_Vt4X6VsSCCZCFNuta3gVPMZxAMaJKrbCeeRvqh_WAHJuhjLDLjuOJ89mSLxfFaKz3Gt_oHxUOuGatH4Xkf"
            "9viREQwi1KDzbnaJ6HQCMFP2YQzNRRpl4f6uLAxkJ0bivEC6OMDGeS1x1F6VDzdvM_lwxayS0kwETAQunHpDZwlI2Ai_ytLc")


@pytest.mark.parametrize("length", [32, 63, 64, 65, 200])
def test_keys_of_any_length_follow_hmac(length: int) -> None:
    # The keyed states are built once (RFC 2104); a key longer than SHA-256's block is hashed first.
    text = LONG_KEY[:length]
    key = PiiKey.from_text(text, source="a test")
    assert hash_value(key, "email", "a@x.org") == reference_hash(text, "a@x.org")


@pytest.mark.parametrize(("field", "value"), [("email", " A@X.org"), ("phone", "+1 555"), ("phone", 4930123),
                                              ("display_name", "Zoe\u0301"), ("attributes.a", False),
                                              ("email", None),
                                              # ASCII takes a fast path: str's whitespace, case, a late +
                                              ("email", "\x1c\tBob@X.ORG \x1f"), ("phone", "\x1d +49 (30) 12+3"),
                                              ("phone", " (030) 123 "), ("phone", "+"), ("phone", ""),
                                              ("display_name", "\x1e Zoe \x0b"), ("sources[].external_id", "E-1"),
                                              ("email", "Straße@X.de"), ("phone", "\uff0b49 30"),
                                              ("phone", "+\u0664\u0669 30"), ("email", " \u3000"),
                                              ("sources[].external_id", " E-1 "), ("sources[].external_id", 4711),
                                              ("lifecycle", "active"), ("attributes.a.b", 2.5)])
def test_the_write_paths_hasher_is_hash_value(key: PiiKey, field: str, value) -> None:
    assert hasher_for(key, field)(value) == hash_value(key, field, value)


def test_the_keyed_wire_hash_is_blake2b_under_a_key_derived_from_the_key(key: PiiKey) -> None:
    # Internal (only this package compares wire hashes), but stored: a change here makes every stored
    # wire hash unmatched (pii.stream.KeyedWireHashes matches the current form and HMAC-SHA-256's).
    raw = hashlib.sha256(b'{"record_ref":"bos:person:1"}').hexdigest()
    wire_key = hmac.new(KEY_TEXT.encode(), b"bos-pii-wire-hash", hashlib.sha256).digest()
    expected = hashlib.blake2b(raw.encode(), key=wire_key, digest_size=32).hexdigest()
    assert key.wire_hash_hex(raw) == expected and len(expected) == 64
    assert expected != key.digest_hex(raw.encode())
