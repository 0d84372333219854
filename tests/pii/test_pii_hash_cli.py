"""``airflow-provider-bos pii-hash``: a person's hashes for look-ups, with the key from a real Airflow Connection."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_bos.cli import main
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.pii.airflow_key import key_from_connection, key_from_variable
from tests.pii.conftest import KEY_TEXT


def expected(normalised: str, field: str = "email") -> str:
    """docs/personal-data.md's recipe 2: HMAC-SHA-256 of "bos-pii/2", the field, the JSON type and the text."""
    message = b"\0".join((b"bos-pii/2", field.encode(), b"string", normalised.encode()))
    return hmac.new(KEY_TEXT.encode(), message, hashlib.sha256).hexdigest()


@pytest.fixture()
def key_connection(monkeypatch: pytest.MonkeyPatch) -> str:
    # Any connection type: only the password is read (a pasted line break is not part of the key).
    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY_TEXT + "\n"}))
    return "bos_pii_key"


def test_prints_one_hash_per_value_in_order(key_connection: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    code = main(["pii-hash", "--key-conn-id", key_connection, "--field", "email", " Alice@Example.org",
                 "bob@example.org"], stdout=out)
    assert code == 0
    assert out.getvalue().splitlines() == [expected("alice@example.org"), expected("bob@example.org")]
    assert KEY_TEXT not in out.getvalue() + "".join(capsys.readouterr())


def test_prints_what_the_policy_stores(key_connection: str) -> None:
    record = {"record_ref": "r", "phone": "+49 (30) 1234-56", "sources": [], "attributes": {}}
    stored = PiiPolicy.parse({"phone": "hash"}).plan(key_from_connection(key_connection)).apply(record)
    out = io.StringIO()
    assert main(["pii-hash", "--key-conn-id", key_connection, "--field", "phone", "+49 30 123456"], stdout=out) == 0
    assert out.getvalue().strip() == stored["phone"]


def test_reads_values_from_standard_input(key_connection: str) -> None:
    out = io.StringIO()
    code = main(["pii-hash", "--key-conn-id", key_connection, "--field", "sources[].external_id",
                 "--values-from", "-"], stdout=out, stdin=io.StringIO("WD-1\n\nWD-2\n"))
    assert code == 0 and out.getvalue().splitlines() == [expected("WD-1", "sources[].external_id"),
                                                         expected("WD-2", "sources[].external_id")]


def test_a_missing_connection_says_how_to_create_it(monkeypatch, capsys) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BOS_NO_SUCH_KEY", raising=False)
    code = main(["pii-hash", "--key-conn-id", "bos_no_such_key", "--field", "email", "a@x.org"], stdout=io.StringIO())
    err = capsys.readouterr().err
    assert code == 1 and "'bos_no_such_key'" in err and "AIRFLOW_CONN_BOS_NO_SUCH_KEY" in err


def test_a_connection_without_password_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BOS_EMPTY_KEY", json.dumps({"conn_type": "generic"}))
    code = main(["pii-hash", "--key-conn-id", "bos_empty_key", "--field", "email", "a@x.org"], stdout=io.StringIO())
    assert code == 1 and "has no password" in capsys.readouterr().err


def test_a_field_a_policy_cannot_name_is_refused(key_connection: str, capsys) -> None:
    code = main(["pii-hash", "--key-conn-id", key_connection, "--field", "record_ref", "x"], stdout=io.StringIO())
    assert code == 1 and "record_ref is the table's key" in capsys.readouterr().err


def test_no_value_is_an_error(key_connection: str, capsys) -> None:
    code = main(["pii-hash", "--key-conn-id", key_connection, "--field", "email"], stdout=io.StringIO())
    assert code == 1 and "at least one value" in capsys.readouterr().err


def test_the_key_is_known_to_airflows_secrets_masker(key_connection: str) -> None:
    from airflow.sdk.log import redact

    key_from_connection(key_connection)
    assert redact(f"<{KEY_TEXT}>") == "<***>"


def test_the_key_can_come_from_a_variable_airflow_masks(monkeypatch: pytest.MonkeyPatch, key: PiiKey) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_BOS_PII_SECRET_KEY", KEY_TEXT)
    assert key_from_variable("bos_pii_secret_key") == key


def test_a_missing_variable_says_how_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_VAR_BOS_NO_SUCH_SECRET", raising=False)
    with pytest.raises(BosConfigurationError, match="AIRFLOW_VAR_BOS_NO_SUCH_SECRET"):
        key_from_variable("bos_no_such_secret")


def test_a_variable_is_refused_where_airflow_masks_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__HIDE_SENSITIVE_VAR_CONN_FIELDS", "False")
    monkeypatch.setenv("AIRFLOW_VAR_BOS_PII_SECRET_KEY", KEY_TEXT)
    with pytest.raises(BosConfigurationError, match="hide_sensitive_var_conn_fields"):
        key_from_variable("bos_pii_secret_key")


def test_a_blank_value_is_refused_and_nothing_printed(key_connection: str, capsys) -> None:
    out = io.StringIO()
    code = main(["pii-hash", "--key-conn-id", key_connection, "--field", "phone", "+49 30 1", "n/a"], stdout=out)
    err = capsys.readouterr().err
    assert code == 1 and out.getvalue() == ""
    assert "Value 2 of 2" in err and "matches nothing" in err and "n/a" not in err


def test_the_console_script_end_to_end() -> None:
    env = {**os.environ, "AIRFLOW_CONN_BOS_PII_KEY": json.dumps({"conn_type": "generic", "password": KEY_TEXT})}
    script = Path(sys.executable).with_name("airflow-provider-bos")
    proc = subprocess.run([str(script), "pii-hash", "--key-conn-id", "bos_pii_key", "--field", "email",
                           "Alice@Example.org"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [expected("alice@example.org")]
    assert KEY_TEXT not in proc.stdout + proc.stderr
