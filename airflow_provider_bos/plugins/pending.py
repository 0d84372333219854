"""Pending web sign-ins: the private half of an authorization request, kept server-side until its callback.

One row per started Connect, keyed by ``sha256(state)`` (the state itself travels in URLs and is not
stored). A row is taken exactly once (deleted in the same transaction that reads it) and is refused
after ``ttl_s``; expired rows are purged whenever a new one is written. The PKCE verifier is
encrypted with the same :class:`~airflow_provider_bos.auth.token_store.Cipher` as the token store
when one is configured. Any SQLAlchemy engine works; the API server uses Airflow's metadata
database, so every api-server worker and replica sees the same rows.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from airflow_provider_bos.auth.connect import PendingAuthorization
from airflow_provider_bos.auth.token_store import Cipher
from airflow_provider_bos.exceptions import BosCallbackError, BosTokenStoreError, excerpt
from airflow_provider_bos.redaction import register_secret

__all__ = [
    "DEFAULT_PENDING_TTL_S",
    "RULE_OTHER_USER",
    "RULE_PENDING_EXPIRED",
    "RULE_PENDING_UNKNOWN",
    "ConnectTarget",
    "PendingConnect",
    "PendingConnectStore",
]

DEFAULT_PENDING_TTL_S = 600.0
PENDING_TABLE = "bos_ui_pending_connect"
RULE_PENDING_UNKNOWN = "pending-unknown"
RULE_PENDING_EXPIRED = "pending-expired"
RULE_OTHER_USER = "callback-other-user"
_ENC_PREFIX = "enc:v1:"
_RAW_PREFIX = "raw:"


@dataclass(frozen=True)
class ConnectTarget:
    """The Connection a sign-in is for, and where its grant is stored."""

    conn_id: str
    resource_url: str
    token_store_conn_id: str | None = None
    token_store_url: str | None = None


@dataclass(frozen=True)
class PendingConnect:
    """A taken pending row: who started it, for which Connection, and the authorization request."""

    target: ConnectTarget
    user_id: str
    authorization: PendingAuthorization


def _state_key(state: str) -> str:
    return hashlib.sha256(state.encode("utf-8")).hexdigest()


class PendingConnectStore:
    """Pending sign-ins in the table ``bos_ui_pending_connect`` of ``engine``."""

    def __init__(self, engine: Engine, *, cipher: Cipher | None = None, ttl_s: float = DEFAULT_PENDING_TTL_S):
        self._engine = engine
        self._cipher = cipher
        self.ttl_s = float(ttl_s)
        self._table = sa.Table(
            PENDING_TABLE,
            sa.MetaData(),
            sa.Column("state_key", sa.String(64), primary_key=True),
            sa.Column("conn_id", sa.String(250), nullable=False),
            sa.Column("user_id", sa.String(250), nullable=False),
            sa.Column("resource_url", sa.Text, nullable=False),
            sa.Column("token_store_conn_id", sa.String(250), nullable=True),
            sa.Column("token_store_url", sa.Text, nullable=True),
            sa.Column("client_id", sa.String(255), nullable=False),
            sa.Column("redirect_uri", sa.Text, nullable=False),
            sa.Column("issuer", sa.Text, nullable=False),
            sa.Column("resource", sa.Text, nullable=True),
            sa.Column("scope", sa.Text, nullable=False),
            sa.Column("verifier", sa.Text, nullable=False),
            sa.Column("created_at", sa.Double, nullable=False),
        )
        self._ready = False

    def _ensure_table(self) -> None:
        if not self._ready:
            try:
                self._table.create(self._engine, checkfirst=True)
            except sa.exc.SQLAlchemyError:
                # Another worker created it between the check and the CREATE.
                if not sa.inspect(self._engine).has_table(PENDING_TABLE):
                    raise
            self._ready = True

    def _encode(self, verifier: str) -> str:
        if self._cipher is None:
            return _RAW_PREFIX + verifier
        return _ENC_PREFIX + base64.urlsafe_b64encode(self._cipher.encrypt(verifier.encode())).decode("ascii")

    def _decode(self, stored: str) -> str:
        if stored.startswith(_RAW_PREFIX):
            return stored[len(_RAW_PREFIX) :]
        if stored.startswith(_ENC_PREFIX) and self._cipher is not None:
            try:
                return self._cipher.decrypt(base64.urlsafe_b64decode(stored[len(_ENC_PREFIX) :])).decode()
            except Exception:  # noqa: BLE001, S110 - InvalidToken and friends: refused below
                pass
        raise BosCallbackError(
            "this sign-in was started with a different Fernet key; start Connect again.",
            rule=RULE_PENDING_UNKNOWN,
        )

    def put(self, authorization: PendingAuthorization, target: ConnectTarget, *, user_id: str) -> None:
        """Keep ``authorization`` until its callback; purge the expired rows of earlier sign-ins."""
        now = time.time()
        try:
            self._ensure_table()
            with self._engine.begin() as conn:
                conn.execute(sa.delete(self._table).where(self._table.c.created_at < now - self.ttl_s))
                conn.execute(
                    sa.insert(self._table).values(
                        state_key=_state_key(authorization.state),
                        conn_id=target.conn_id,
                        user_id=user_id,
                        resource_url=target.resource_url,
                        token_store_conn_id=target.token_store_conn_id,
                        token_store_url=target.token_store_url,
                        client_id=authorization.client_id,
                        redirect_uri=authorization.redirect_uri,
                        issuer=authorization.issuer,
                        resource=authorization.resource,
                        scope=authorization.scope,
                        verifier=self._encode(authorization.verifier),
                        created_at=authorization.created_at,
                    )
                )
        except sa.exc.SQLAlchemyError as exc:
            raise BosTokenStoreError(
                f"Could not keep the pending sign-in ({type(exc).__name__}: "
                f"{excerpt(str(getattr(exc, 'orig', exc)).splitlines()[0], 160)})."
            ) from None

    def take(self, state: str, *, user_id: str) -> PendingConnect:
        """Remove and return ``user_id``'s pending sign-in for ``state``; it can be taken only once.

        Another user's callback with the same state is refused without removing the row: holding
        the state is not enough to cancel somebody else's sign-in.
        """
        self._ensure_table()
        key = _state_key(state)
        unknown = BosCallbackError(
            "no pending sign-in matches this callback (it was already used, or never started here); "
            "start Connect again.",
            rule=RULE_PENDING_UNKNOWN,
        )
        with self._engine.begin() as conn:
            row = conn.execute(sa.select(self._table).where(self._table.c.state_key == key)).first()
            if row is None:
                raise unknown
            if row._mapping["user_id"] != user_id:
                raise BosCallbackError(
                    "this sign-in was started by another Airflow user; start Connect yourself.",
                    rule=RULE_OTHER_USER,
                )
            taken = conn.execute(
                sa.delete(self._table).where(
                    self._table.c.state_key == key, self._table.c.user_id == user_id
                )
            ).rowcount
        if taken != 1:
            raise unknown
        m = row._mapping
        if m["created_at"] < time.time() - self.ttl_s:
            raise BosCallbackError(
                f"the sign-in took longer than {self.ttl_s / 60:g} minutes and expired; start Connect again.",
                rule=RULE_PENDING_EXPIRED,
            )
        verifier = self._decode(m["verifier"])
        register_secret(verifier)
        authorization = PendingAuthorization(
            client_id=m["client_id"],
            redirect_uri=m["redirect_uri"],
            verifier=verifier,
            state=state,
            issuer=m["issuer"],
            resource=m["resource"],
            authorization_url="",  # already shown; not needed to finish
            scope=m["scope"],
            created_at=float(m["created_at"]),
        )
        target = ConnectTarget(
            conn_id=m["conn_id"],
            resource_url=m["resource_url"],
            token_store_conn_id=m["token_store_conn_id"],
            token_store_url=m["token_store_url"],
        )
        return PendingConnect(target=target, user_id=m["user_id"], authorization=authorization)
