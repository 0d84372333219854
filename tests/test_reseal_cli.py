"""``airflow-provider-bos token-store reseal``: every ``enc:v1:`` row re-sealed to its row in one step.

Until then such rows are refused on read (a table writer without the key could have moved their
ciphertexts into a row of their own, pointed at their own server).
"""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from airflow_provider_bos import cli
from airflow_provider_bos.auth.sealed import LegacyTokenError
from airflow_provider_bos.auth.token_store import SqlTokenStore

SEED = dict(client_id="cid", token_endpoint="https://bos.example/token", resource="https://bos.example/mcp",
            scope="mcp:tools offline_access")


def _v1(cipher: Fernet, token: str) -> str:
    return "enc:v1:" + base64.urlsafe_b64encode(cipher.encrypt(token.encode())).decode()


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(argv, stdout=out, stdin=io.StringIO("")), out.getvalue()


@pytest.fixture()
def cipher(monkeypatch: pytest.MonkeyPatch) -> Fernet:
    fernet = Fernet(Fernet.generate_key())
    monkeypatch.setattr(cli, "airflow_fernet_cipher", lambda: fernet)
    return fernet


def _legacy_store(url: str, cipher: Fernet, rows: dict[str, tuple[str | None, str | None]]) -> SqlTokenStore:
    store = SqlTokenStore(url, cipher=cipher)
    for key, (access, refresh) in rows.items():
        store.seed(key, refresh_token=f"rt-{key}-seed", access_token=f"at-{key}-seed",
                   expires_at=time.time() + 3600, **SEED)
        with store.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {store.table_name} SET access_token = :a, refresh_token = :r WHERE key = :k"),
                         {"a": access, "r": refresh, "k": key})
    return store


def test_reseal_re_seals_every_legacy_row_in_one_step(tmp_path: Path, cipher: Fernet) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    store = _legacy_store(url, cipher, {
        "bos_a": (_v1(cipher, "at-a-0001"), _v1(cipher, "rt-a-0001")),
        "bos_b": (None, _v1(cipher, "rt-b-0001")),
    })
    for key in ("bos_a", "bos_b"):
        with pytest.raises(LegacyTokenError):
            store.load(key)
    code, output = _run(["token-store", "reseal", "--token-store-url", url])
    assert code == 0, output
    assert "re-sealed 'bos_a'" in output and "re-sealed 'bos_b'" in output and "https://bos.example/token" in output
    assert "rt-a-0001" not in output and "at-a-0001" not in output
    assert (store.load("bos_a").access_token, store.load("bos_a").refresh_token) == ("at-a-0001", "rt-a-0001")
    assert store.load("bos_b").refresh_token == "rt-b-0001"
    code, output = _run(["token-store", "reseal", "--token-store-url", url])
    assert code == 0 and "nothing to do" in output
    store.dispose()


def test_reseal_refuses_copies_and_says_which_rows_to_reconnect(tmp_path: Path, cipher: Fernet) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    copied = _v1(cipher, "rt-victim-0001")
    store = _legacy_store(url, cipher, {
        "bos_victim": (None, copied),
        "bos_attacker": (None, copied),
        "bos_fine": (None, _v1(cipher, "rt-fine-0001")),
    })
    code, output = _run(["token-store", "reseal", "--token-store-url", url])
    assert code == 1
    assert "NOT re-sealed 'bos_victim'" in output and "NOT re-sealed 'bos_attacker'" in output
    assert "airflow-provider-bos connect --conn-id bos_victim" in output
    assert "re-sealed 'bos_fine'" in output and store.load("bos_fine").refresh_token == "rt-fine-0001"
    assert store.raw_row("bos_victim")["refresh_token"] == copied  # left as it was: refused on read
    store.dispose()


def test_reseal_needs_the_fernet_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(cli, "airflow_fernet_cipher", lambda: None)
    code, _ = _run(["token-store", "reseal", "--token-store-url", f"sqlite:///{tmp_path / 'tokens.db'}"])
    assert code == 1 and "fernet_key" in capsys.readouterr().err
