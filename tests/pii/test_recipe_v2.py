"""Hash recipe 2: what the security review found in recipe 1, one test per finding (each failed on recipe 1).

* 3: a hash of one field never equals a hash of the same text in another field or attribute path, so
  a value anyone can set (their own ``skills``) is no oracle for another field's hashes;
* 2: ``sources[].external_id`` is hashed exactly (no trimming, no Unicode normalisation), and a number
  or boolean apart from the same text;
* 8: a value that normalises to nothing (a blank email, a phone without a digit) is stored as NULL,
  never as one hash shared by everyone without a value; phone digits of every script are digits;
* 7: a guessable key is refused, and ``pii-keygen`` makes one that is not;
* 6: a key in an Airflow Variable must have a name Airflow masks;
* and a table written under recipe 1 is refused, with the way forward (a full re-read).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import secrets
from typing import Any

import pytest

from airflow_provider_bos.cli import main
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import (
    PiiKey,
    PiiPolicy,
    PiiPolicyMismatch,
    PolicyFingerprint,
    hash_value,
    lookup_hash,
)
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION, hasher_for
from tests.pii.conftest import KEY_TEXT


def reference(key_text: str, domain: str, json_type: str, text: str) -> str:
    """docs/personal-data.md's recipe 2, written independently of the package."""
    message = b"\0".join((b"bos-pii/2", domain.encode(), json_type.encode(), text.encode()))
    return hmac.new(key_text.encode(), message, hashlib.sha256).hexdigest()


def colleague(phone: str, skills: list[str]) -> dict[str, Any]:
    return {"record_ref": f"bos:person:{phone}", "display_name": None, "email": None, "phone": phone,
            "lifecycle": None, "identity_match": None, "sources": [],
            "attributes": {"skills": skills, "contacts": {"phone": phone}}}


# --- 3: one field's hashes are no oracle for another's ---------------------------------------------

def test_a_profile_attribute_is_no_oracle_for_a_colleagues_phone(key: PiiKey) -> None:
    """The review's attack: an insider lists candidate phone numbers as their own skills; one sync stores
    their hashes; on recipe 1 the colleague's hashed phone was among them, recovered without the key."""
    candidates = [f"+49 30 {n:06d}" for n in range(123400, 123500)]
    plan = PiiPolicy.parse({"phone": "hash", "attributes.*": "hash"}).plan(key)
    insider = plan.apply(colleague("+49 30 999999", skills=candidates))
    victim = plan.apply(colleague("+49 30 123456", skills=["python"]))
    oracle = set(insider["attributes"]["skills"])
    assert victim["phone"] not in oracle
    assert victim["attributes"]["contacts"]["phone"] not in oracle  # another attribute path: no oracle either
    assert victim["attributes"]["contacts"]["phone"] != victim["phone"]


@pytest.mark.parametrize("other", ["display_name", "sources[].external_id", "lifecycle", "identity_match",
                                   "sources[].*", "attributes", "attributes.phone", "attributes.contacts.phone"])
def test_the_same_text_never_hashes_alike_in_two_fields(key: PiiKey, other: str) -> None:
    assert hash_value(key, "phone", "+4930123456") != hash_value(key, other, "+4930123456")
    assert hash_value(key, "email", "a@x.org") != hash_value(key, other, "a@x.org")


def test_two_attribute_paths_never_share_hashes(key: PiiKey) -> None:
    paths = ["attributes", "attributes.skills", "attributes.a", "attributes.a.b", "attributes.b", "attributes.a.b.c"]
    assert len({hash_value(key, path, "Research") for path in paths}) == len(paths)


def test_within_one_field_hashes_still_join_across_plans_and_lookups(key: PiiKey) -> None:
    record = colleague("+49 30 123456", skills=["python"])
    stored = PiiPolicy.parse({"attributes.contacts": "hash"}).plan(key).apply(record)
    again = PiiPolicy.parse({"attributes.*": "hash"}).plan(key).apply(record)  # another rule, same path
    assert stored["attributes"]["contacts"] == again["attributes"]["contacts"] == {
        "phone": lookup_hash(key, "attributes.contacts.phone", "+49 30 123456")}


def test_the_recipe_names_the_field_and_the_json_type(key: PiiKey) -> None:
    assert hash_value(key, "email", " A@X.org ") == reference(KEY_TEXT, "email", "string", "a@x.org")
    assert hash_value(key, "attributes.contacts.phone", "+49 30") == reference(
        KEY_TEXT, "attributes.contacts.phone", "string", "+49 30")
    assert hash_value(key, "attributes.level", 3) == reference(KEY_TEXT, "attributes.level", "number", "3")
    assert hash_value(key, "lifecycle", True) == reference(KEY_TEXT, "lifecycle", "boolean", "true")


# --- 2: provenance ids are hashed exactly ------------------------------------------------------------

@pytest.mark.parametrize(("one", "other"), [("4711", "4711 "), ("4711", " 4711"), ("E-1", "E-1\n"),
                                         ("Zoe\u0301", "Zo\u00e9"), ("\uff14\uff17", "47")])
def test_distinct_external_ids_never_hash_alike(key: PiiKey, one: str, other: str) -> None:
    assert hash_value(key, "sources[].external_id", one) != hash_value(key, "sources[].external_id", other)
    assert hasher_for(key, "sources[].external_id")(other) == hash_value(key, "sources[].external_id", other)


@pytest.mark.parametrize(("value", "text"), [(4711, "4711"), (True, "true"), (1.5, "1.5")])
def test_a_number_or_boolean_id_hashes_apart_from_the_same_text(key: PiiKey, value: Any, text: str) -> None:
    assert hash_value(key, "sources[].external_id", value) != hash_value(key, "sources[].external_id", text)


def test_a_leaver_and_a_newcomer_whose_ids_differ_by_a_space_stay_apart(key: PiiKey) -> None:
    plan = PiiPolicy.parse({"sources[].external_id": "hash"}).plan(key)
    entry = {"source_type": "crm", "source_identity": "crm-eu", "record_type": "person",
             "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"], "version": None}
    leaver = plan.apply({**colleague("1", []), "sources": [{**entry, "external_id": "4711"}]})
    newcomer = plan.apply({**colleague("2", []), "sources": [{**entry, "external_id": "4711 "}]})
    assert leaver["sources"][0]["external_id"] != newcomer["sources"][0]["external_id"]


# --- 8: nothing normalises to one shared constant ----------------------------------------------------

@pytest.mark.parametrize(("field", "blank"), [("email", ""), ("email", "   "), ("email", "\u3000\t"),
                                              ("display_name", " \n"), ("phone", "n/a"), ("phone", "+"),
                                              ("phone", " - "), ("attributes.note", "  ")])
def test_a_value_that_normalises_to_nothing_is_stored_as_null(key: PiiKey, field: str, blank: str) -> None:
    assert hash_value(key, field, blank) is None
    assert hasher_for(key, field)(blank) is None


def test_blank_emails_are_null_so_they_neither_count_as_covered_nor_join(key: PiiKey) -> None:
    plan = PiiPolicy.parse({"email": "hash", "display_name": "hash"}).plan(key)
    stored = [plan.apply({**colleague(str(i), []), "email": blank, "display_name": blank})
              for i, blank in enumerate(["", " ", "\t\n"])]
    assert [(s["email"], s["display_name"]) for s in stored] == [(None, None)] * 3


DIGITS = {"ascii": "0123456789", "arabic-indic": "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",
          "persian": "\u06f0\u06f1\u06f2\u06f3\u06f4\u06f5\u06f6\u06f7\u06f8\u06f9",
          "devanagari": "\u0966\u0967\u0968\u0969\u096a\u096b\u096c\u096d\u096e\u096f",
          "full-width": "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19"}


def in_script(number: str, script: str) -> str:
    return number.translate(str.maketrans("0123456789", DIGITS[script]))


@pytest.mark.parametrize("script", sorted(DIGITS))
def test_phone_digits_of_every_script_are_the_digits(key: PiiKey, script: str) -> None:
    assert hash_value(key, "phone", in_script("+49 30 123456", script)) == hash_value(key, "phone", "+4930123456")
    assert hasher_for(key, "phone")(in_script("030 / 98 76", script)) == hash_value(key, "phone", "0309876")


def test_three_people_with_numbers_in_three_scripts_keep_three_hashes(key: PiiKey) -> None:
    numbers = [in_script("+20 2 1111", "arabic-indic"), in_script("+98 21 2222", "persian"),
               in_script("+91 11 3333", "devanagari")]
    hashes = {hash_value(key, "phone", n) for n in numbers}
    assert len(hashes) == 3 and None not in hashes


@pytest.mark.parametrize(("field", "blank"), [("email", "  "), ("phone", "n/a"), ("display_name", "")])
def test_a_lookup_of_a_blank_value_is_refused(key: PiiKey, field: str, blank: str) -> None:
    with pytest.raises(BosConfigurationError, match="matches nothing"):
        lookup_hash(key, field, blank)


# --- 7: guessable keys ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "a" * 32, "acme-bos-pii-key-production-2026", "Acme-Bos-Pii-Key-Production-2026!", "0123456789" * 4,
    "abcdefghijklmnopqrstuvwxyzabcdefghij", "password" * 5, "qwertyuiopasdfghjklzxcvbnm1234567890",
    "test-pii-key-0123456789-abcdefghijklmnop", "correct-horse-battery-staple-2026-prod",
    "ab" * 24, "Secret123" * 5, "k" * 8 + "0123456789abcdefghijklmnopqrstuv",
])
def test_a_guessable_key_is_refused_without_showing_it(text: str) -> None:
    with pytest.raises(BosConfigurationError, match="guess") as caught:
        PiiKey.from_text(text, source="the password of Airflow connection 'pii'")
    message = str(caught.value)
    assert text not in message and "'pii'" in message and "airflow-provider-bos pii-keygen" in message


def test_generated_keys_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_bos import redaction

    # 900 keys: each is registered as a secret, and Airflow's masker (installed by earlier tests on the
    # same worker) recompiles its pattern for every new value: minutes, and not what this test checks.
    monkeypatch.setattr(redaction, "_sinks", [])
    for _ in range(300):
        PiiKey.from_text(secrets.token_urlsafe(48), source="generated")
        PiiKey.from_text(secrets.token_hex(32), source="generated")  # openssl rand -hex 32
        # openssl rand -base64 32
        PiiKey.from_text(base64.b64encode(secrets.token_bytes(32)).decode(), source="generated")


def test_pii_keygen_prints_a_fresh_key_that_passes() -> None:
    first, second = io.StringIO(), io.StringIO()
    assert main(["pii-keygen"], stdout=first) == 0 and main(["pii-keygen"], stdout=second) == 0
    [text] = first.getvalue().splitlines()
    assert text != second.getvalue().strip() and len(text) >= 64
    assert PiiKey.from_text(text, source="pii-keygen").key_id


# --- 6: a Variable holding the key must have a name Airflow masks -------------------------------------

def test_a_variable_airflow_does_not_mask_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_bos.pii.airflow_key import key_from_variable

    monkeypatch.setenv("AIRFLOW_VAR_BOS_PII_KEY", KEY_TEXT)
    with pytest.raises(BosConfigurationError, match="bos_pii_secret_key") as caught:
        key_from_variable("bos_pii_key")
    assert KEY_TEXT not in str(caught.value) and "clear" in str(caught.value)


@pytest.mark.parametrize("name", ["bos_pii_secret_key", "bos_pii_key_password", "BOS-PII-SECRET"])
def test_a_variable_airflow_masks_is_read(monkeypatch: pytest.MonkeyPatch, key: PiiKey, name: str) -> None:
    from airflow.api_fastapi.core_api.datamodels.variables import VariableResponse

    from airflow_provider_bos.pii.airflow_key import key_from_variable

    monkeypatch.setenv(f"AIRFLOW_VAR_{name.upper()}", KEY_TEXT)
    assert key_from_variable(name) == key
    # What the REST API (GET /api/v2/variables) returns for it: masked.
    shown = VariableResponse(key=name, value=KEY_TEXT, description=None, is_encrypted=True, team_name=None)
    assert shown.val == "***"


# --- a table written under recipe 1 --------------------------------------------------------------------

def test_a_table_written_under_recipe_1_is_refused_with_a_full_re_read(key: PiiKey) -> None:
    from airflow_provider_bos.warehouse.tables.policy_store import loosening, refuse_unless_same

    run = PiiPolicy.parse({"email": "hash"}).fingerprint(key)
    assert RECIPE_VERSION == 2 and run.recipe == 2
    stored = PolicyFingerprint(recipe=1, rules=run.rules, key_id=run.key_id)
    assert loosening(stored, run) == ["the hash recipe would go from version 1 to 2"]
    with pytest.raises(PiiPolicyMismatch) as caught:
        refuse_unless_same(stored.text, run, table="bos_people")
    message = str(caught.value)
    assert "recipe version 1, this run's version 2" in message
    assert "full re-read" in message and "new table" in message and "pii-apply --conn-id" not in message
    assert json.loads(stored.text)["recipe"] == 1


def test_the_write_paths_bounded_caches_never_change_a_hash(key: PiiKey, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_bos.pii.keyed_hash import TreeHasher

    monkeypatch.setattr(TreeHasher, "_KEPT", 2)
    monkeypatch.setattr(TreeHasher, "_CHILDREN_KEPT", 2)
    plan = PiiPolicy.parse({"attributes.*": "hash", "lifecycle": "hash"}).plan(key)
    values: list[Any] = ["x", "y", "x", 1, 1.0, True, "1", " x "]
    record = {"record_ref": "r", "lifecycle": {"a": values, "b": {"c": values}},
              "attributes": {f"k{i}": {"v": values} for i in range(5)}}
    for _ in range(2):  # the second time from the caches (what is left of them)
        stored = plan.apply(record)
        assert stored["lifecycle"]["b"]["c"] == [hash_value(key, "lifecycle", v) for v in values]
        for i in range(5):
            assert stored["attributes"][f"k{i}"]["v"] == [hash_value(key, f"attributes.k{i}.v", v) for v in values]
    assert len(set(stored["attributes"]["k0"]["v"])) == 6  # x, y, 1, 1.0, true and "1" apart; " x " is x
