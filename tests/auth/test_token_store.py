"""The SQL token store on SQLite, PostgreSQL and MariaDB: seeding, locked updates, encryption, files."""

from __future__ import annotations

import os
import stat
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from airflow_provider_bos.auth.token_store import (
    SqlTokenStore,
    StoredGrant,
    default_token_store_url,
    refresh_token_fingerprint,
)
from airflow_provider_bos.exceptions import BosConfigurationError, BosTokenStoreError

SEED = dict(
    client_id="cid",
    token_endpoint="https://bos.example/token",
    resource="https://bos.example/mcp",
    scope="mcp:tools offline_access",
)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture()
def make_store(store_url: str):
    table = f"grants_{uuid.uuid4().hex[:10]}"
    stores: list[SqlTokenStore] = []

    def make(**kwargs) -> SqlTokenStore:
        store = SqlTokenStore(store_url, table=table, **kwargs)
        stores.append(store)
        return store

    yield make
    if stores:
        with stores[0].engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
    for store in stores:
        store.dispose()


def _seed(store: SqlTokenStore, refresh: str = "rt-seed-0001", **kwargs) -> StoredGrant:
    return store.seed("bos_default", refresh_token=refresh, **SEED, **kwargs)


def test_seed_creates_generation_one_and_load_reads_it(make_store) -> None:
    store = make_store()
    assert store.load("bos_default") is None
    seeded = _seed(store, access_token="at-0001", expires_at=1_900_000_000.5)
    loaded = store.load("bos_default")
    assert loaded is not None and loaded.generation == seeded.generation == 1
    assert (loaded.refresh_token, loaded.access_token, loaded.expires_at) == (
        "rt-seed-0001",
        "at-0001",
        1_900_000_000.5,
    )
    assert loaded.seed_fingerprint == refresh_token_fingerprint("rt-seed-0001")
    assert (loaded.client_id, loaded.resource, loaded.scope) == ("cid", SEED["resource"], SEED["scope"])


def test_reseeding_with_the_same_token_keeps_the_rotated_row(make_store) -> None:
    store = make_store()
    _seed(store)
    store.refresh_locked(
        "bos_default", lambda g: replace(g, refresh_token="rt-rotated", generation=g.generation + 1)
    )
    again = _seed(store)  # a worker starting up with the Connection's (old) seed token
    assert again.refresh_token == "rt-rotated" and again.generation == 2


def test_a_new_seed_replaces_the_row_and_moves_the_generation(make_store) -> None:
    store = make_store()
    _seed(store)
    store.refresh_locked(
        "bos_default", lambda g: replace(g, refresh_token="rt-rotated", generation=g.generation + 1)
    )
    reconnected = _seed(store, refresh="rt-reconnected")
    assert reconnected.refresh_token == "rt-reconnected" and reconnected.generation == 3
    forced = _seed(store, refresh="rt-reconnected", force=True)
    assert forced.generation == 4


def test_refresh_locked_persists_or_leaves_alone(make_store) -> None:
    store = make_store()
    seeded = _seed(store)
    assert store.refresh_locked("bos_default", lambda g: None) == seeded
    updated = store.refresh_locked("bos_default", lambda g: replace(g, access_token="at-2", generation=2))
    assert store.load("bos_default") == updated


def test_an_exception_in_the_update_rolls_back(make_store) -> None:
    store = make_store()
    seeded = _seed(store)

    def boom(grant: StoredGrant) -> StoredGrant:
        raise RuntimeError("refresh call failed")

    with pytest.raises(RuntimeError):
        store.refresh_locked("bos_default", boom)
    assert store.load("bos_default") == seeded


def test_the_update_sees_none_for_a_missing_row(make_store) -> None:
    store = make_store()
    seen: list[object] = []
    store.refresh_locked("absent", seen.append)
    assert seen == [None] and store.load("absent") is None


def test_a_second_locker_waits_for_the_first(make_store) -> None:
    """While one worker holds the lock, another cannot enter (it times out here, clearly)."""
    holder = make_store()
    _seed(holder)
    contender = make_store(busy_timeout_s=0.2, lock_timeout_s=0.2)
    inside, release = threading.Event(), threading.Event()

    def hold(grant: StoredGrant) -> None:
        inside.set()
        release.wait(30)

    thread = threading.Thread(target=holder.refresh_locked, args=("bos_default", hold))
    thread.start()
    try:
        assert inside.wait(30)
        entered: list[StoredGrant] = []
        with pytest.raises(BosTokenStoreError) as caught:
            contender.refresh_locked("bos_default", entered.append)
        assert entered == []
        assert "rt-seed" not in str(caught.value)
    finally:
        release.set()
        thread.join(30)
    contender.refresh_locked("bos_default", entered.append)
    assert entered and entered[0].generation == 1


def test_tokens_never_appear_in_reprs(make_store) -> None:
    store = make_store()
    grant = _seed(store, access_token="at-visible-if-leaked")
    assert "rt-seed-0001" not in repr(grant) and "at-visible-if-leaked" not in repr(grant)
    assert "rt-seed-0001" not in str(store)


def test_fernet_encrypts_the_token_columns(make_store) -> None:
    key = Fernet.generate_key()
    store = make_store(cipher=Fernet(key))
    _seed(store, access_token="at-plain-text-token")
    raw = store.raw_row("bos_default")
    assert raw is not None
    assert "rt-seed-0001" not in raw["refresh_token"] and "at-plain-text-token" not in raw["access_token"]
    assert raw["refresh_token"].startswith("enc:v2:")
    loaded = make_store(cipher=Fernet(key)).load("bos_default")
    assert loaded is not None and (loaded.refresh_token, loaded.access_token) == (
        "rt-seed-0001",
        "at-plain-text-token",
    )


def test_encrypted_rows_need_the_right_key(make_store) -> None:
    _seed(make_store(cipher=Fernet(Fernet.generate_key())))
    with pytest.raises(BosTokenStoreError, match="encrypted"):
        make_store().load("bos_default")
    with pytest.raises(BosTokenStoreError, match="cannot be decrypted"):
        make_store(cipher=Fernet(Fernet.generate_key())).load("bos_default")


def test_a_plaintext_row_is_refused_once_a_key_is_configured(make_store) -> None:
    """Whoever can write the table but lacks the key must not be able to plant tokens."""
    _seed(make_store())
    keyed = make_store(cipher=Fernet(Fernet.generate_key()))
    with pytest.raises(BosTokenStoreError, match="not encrypted") as caught:
        keyed.load("bos_default")
    assert "rt-seed-0001" not in str(caught.value)
    with pytest.raises(BosTokenStoreError, match="not encrypted"):
        keyed.refresh_locked("bos_default", lambda g: replace(g, generation=2))
    # Reconnecting (a new seed) replaces the untrusted row, encrypted.
    reconnected = keyed.seed("bos_default", refresh_token="rt-reconnected", force=True, **SEED)
    assert reconnected.refresh_token == "rt-reconnected"
    assert keyed.raw_row("bos_default")["refresh_token"].startswith("enc:v2:")


def test_table_names_are_identifiers(tmp_path: Path) -> None:
    with pytest.raises(BosConfigurationError):
        SqlTokenStore(f"sqlite:///{tmp_path / 'x.db'}", table="grants; DROP TABLE x")


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(BosConfigurationError, match="durable"):
        SqlTokenStore("sqlite://")


def test_default_store_is_an_owner_only_file_under_airflow_home(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home" / "airflow"
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    url = default_token_store_url()
    path = home / "bos_token_store.db"
    assert url == f"sqlite:///{path}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store = SqlTokenStore(url)
    try:
        _seed(store)
        assert store.load("bos_default").generation == 1
    finally:
        store.dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_loose_store_file_is_tightened(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    path = tmp_path / "bos_token_store.db"
    path.touch()
    os.chmod(path, 0o644)
    default_token_store_url()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_new_sqlite_store_file_is_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = SqlTokenStore(f"sqlite:///{tmp_path / 'sub' / 'tokens.db'}")
        _seed(store)
        store.dispose()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sub" / "tokens.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "sub").stat().st_mode) == 0o700


def test_expiry_helpers() -> None:
    now = time.time()
    grant = StoredGrant(
        key="k",
        client_id="c",
        token_endpoint="t",
        resource="r",
        scope="s",
        access_token="a",
        refresh_token="r",
        expires_at=now + 30,
        generation=1,
        seed_fingerprint=None,
        updated_at=now,
    )
    assert grant.access_token_valid(now=now) and not grant.access_token_valid(margin_s=60, now=now)
    assert replace(grant, expires_at=None).access_token_valid(margin_s=1e9)
    assert not replace(grant, access_token=None).access_token_valid()


def test_workers_seeding_at_once_create_one_row(make_store) -> None:
    """Several workers start together on a new store with the same Connection: one row, no errors."""
    stores = [make_store() for _ in range(4)]  # the table does not exist yet either
    barrier = threading.Barrier(len(stores))
    results: list[StoredGrant] = []
    errors: list[BaseException] = []

    def seed(store: SqlTokenStore) -> None:
        barrier.wait(30)
        try:
            results.append(_seed(store))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=seed, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert {grant.generation for grant in results} == {1}
    assert stores[0].load("bos_default").generation == 1


def test_a_consumed_seed_never_replaces_the_live_grant(make_store) -> None:
    """A worker still holding an older Connection (stale secrets cache) after a reconnect."""
    store = make_store()
    _seed(store, refresh="rt-first-connect")
    store.refresh_locked("bos_default", lambda g: replace(g, refresh_token="rt-rotated-1", generation=2))
    _seed(store, refresh="rt-second-connect")  # the reconnect
    live = store.refresh_locked(
        "bos_default", lambda g: replace(g, refresh_token="rt-rotated-2", generation=g.generation + 1)
    )
    for stale in ("rt-first-connect", "rt-second-connect"):
        assert _seed(store, refresh=stale) == live
    assert store.load("bos_default").refresh_token == "rt-rotated-2"
    assert _seed(store, refresh="rt-third-connect").generation == live.generation + 1


@pytest.mark.parametrize("placeholder", ["***", "", "   ", "********", "rt with space"])
def test_a_value_that_cannot_be_a_token_never_seeds(make_store, placeholder: str) -> None:
    store = make_store()
    live = _seed(store)
    with pytest.raises(BosTokenStoreError, match="Refusing to seed"):
        store.seed("bos_default", refresh_token=placeholder, force=True, **SEED)
    assert store.load("bos_default") == live


def test_a_table_from_an_older_release_gets_the_new_column(store_url: str, make_store) -> None:
    """Rows written before consumed_seeds existed keep working and remember their seed."""
    store = make_store()
    table = store.table_name
    engine = sa.create_engine(store_url)
    try:
        legacy = sa.Table(
            table, sa.MetaData(), *[c._copy() for c in store._table.columns if c.name != "consumed_seeds"]
        )
        legacy.create(engine)
        with engine.begin() as conn:
            conn.execute(sa.insert(legacy).values(
                key="bos_default", client_id="cid", token_endpoint=SEED["token_endpoint"],
                resource=SEED["resource"], scope=SEED["scope"], access_token=None,
                refresh_token="raw:rt-rotated-legacy", expires_at=None, generation=3,
                seed_fingerprint=refresh_token_fingerprint("rt-legacy-seed"), updated_at=time.time(),
            ))
    finally:
        engine.dispose()
    upgraded = make_store()
    assert _seed(upgraded, refresh="rt-legacy-seed").refresh_token == "rt-rotated-legacy"  # not replaced
    assert "consumed_seeds" in {c["name"] for c in sa.inspect(upgraded.engine).get_columns(table)}
    assert _seed(upgraded, refresh="rt-new-seed").generation == 4


def test_a_failed_commit_after_rotation_is_retried(make_store, monkeypatch) -> None:
    """The server already rotated: giving up on the first commit error would lose the grant."""
    store = make_store()
    _seed(store)
    real_write = store._write
    failures = [sa.exc.OperationalError("UPDATE", {}, Exception("server closed the connection"))]

    def flaky_write(conn, current, new):
        if failures:
            raise failures.pop()
        real_write(conn, current, new)

    monkeypatch.setattr(store, "_write", flaky_write)
    calls: list[int] = []

    def rotate(grant: StoredGrant) -> StoredGrant:
        calls.append(grant.generation)  # stands for the token endpoint call: must happen once
        return replace(grant, refresh_token="rt-rotated", generation=grant.generation + 1)

    saved = store.refresh_locked("bos_default", rotate, spends_grant=True)
    assert calls == [1]
    assert saved.generation == 2 and store.load("bos_default").refresh_token == "rt-rotated"


@pytest.mark.mysql
def test_mysql_lock_wait_timeout_is_restored_before_the_connection_is_pooled(mysql_url: str) -> None:
    engine = sa.create_engine(mysql_url, pool_size=1, max_overflow=0)
    table = f"grants_{uuid.uuid4().hex[:10]}"
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 17")
        store = SqlTokenStore(engine, table=table, lock_timeout_s=3)
        _seed(store)
        store.refresh_locked("bos_default", lambda g: replace(g, generation=2))
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar_one() == 17
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def test_a_commit_that_failed_only_on_the_way_back_is_not_written_twice(make_store, monkeypatch) -> None:
    """The database committed but the client saw an error (connection lost after COMMIT)."""
    store = make_store()
    _seed(store)
    real_write = store._write
    lost_reply = [True]

    def write_then_lose_the_reply(conn, current, new):
        real_write(conn, current, new)
        if lost_reply:
            lost_reply.pop()
            conn.commit()  # reached the database ...
            raise sa.exc.OperationalError("COMMIT", {}, Exception("lost connection"))  # ... reply lost

    monkeypatch.setattr(store, "_write", write_then_lose_the_reply)
    saved = store.refresh_locked(
        "bos_default", lambda g: replace(g, refresh_token="rt-rotated", generation=2), spends_grant=True
    )
    assert saved.refresh_token == "rt-rotated" and store.load("bos_default").generation == 2


def _tokens_of(store: SqlTokenStore, key: str) -> tuple[str, str]:
    row = store.raw_row(key)
    assert row is not None
    return row["access_token"], row["refresh_token"]


def _set_tokens(store: SqlTokenStore, key: str, access: str, refresh: str) -> None:
    grants = sa.table(store.table_name, sa.column("key"), sa.column("access_token"), sa.column("refresh_token"))
    with store.engine.begin() as conn:
        conn.execute(sa.update(grants).where(grants.c.key == key).values(access_token=access, refresh_token=refresh))


def test_sealed_tokens_copied_into_another_row_are_refused_on_every_database(make_store) -> None:
    from airflow_provider_bos.exceptions import BosTokenBindingError

    store = make_store(cipher=Fernet(Fernet.generate_key()))
    _seed(store, access_token="at-victim-0001")
    store.seed("bos_other", refresh_token="rt-other-0001", **SEED)
    _set_tokens(store, "bos_other", *_tokens_of(store, "bos_default"))
    with pytest.raises(BosTokenBindingError, match="its key differs"):
        store.load("bos_other")
    assert store.load("bos_default").refresh_token == "rt-seed-0001"


def test_a_legacy_ciphertext_is_refused_on_read_and_resealed_by_the_admin_command(make_store) -> None:
    import base64

    from airflow_provider_bos.auth.sealed import LegacyTokenError

    cipher = Fernet(Fernet.generate_key())
    store = make_store(cipher=cipher)
    _seed(store, access_token="at-legacy-0001")
    store.seed("bos_copied", refresh_token="rt-other-0001", **SEED)
    store.seed("bos_other_key", refresh_token="rt-other-0002", **SEED)
    legacy = ["enc:v1:" + base64.urlsafe_b64encode(cipher.encrypt(t.encode())).decode()
              for t in ("at-legacy-0001", "rt-seed-0001")]
    _set_tokens(store, "bos_default", *legacy)
    with pytest.raises(LegacyTokenError, match="token-store reseal"):
        store.load("bos_default")
    copied = ["enc:v1:" + base64.urlsafe_b64encode(cipher.encrypt(b"rt-copied-0001")).decode()] * 2
    _set_tokens(store, "bos_copied", *copied)  # one ciphertext in both columns: a copy
    foreign = Fernet(Fernet.generate_key())
    _set_tokens(store, "bos_other_key", "enc:v1:" + base64.urlsafe_b64encode(foreign.encrypt(b"at-x-0001")).decode(),
                None)  # written with another key
    report = store.reseal_legacy()
    assert [key for key, *_ in report.resealed] == ["bos_default"]
    assert dict(report.refused).keys() == {"bos_copied", "bos_other_key"}
    loaded = store.load("bos_default")
    assert (loaded.access_token, loaded.refresh_token, loaded.generation) == ("at-legacy-0001", "rt-seed-0001", 1)
    assert all(value.startswith("enc:v2:") for value in _tokens_of(store, "bos_default"))
    for key in ("bos_copied", "bos_other_key"):
        with pytest.raises(LegacyTokenError):
            store.load(key)
