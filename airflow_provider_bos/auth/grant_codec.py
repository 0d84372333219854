"""A grant as a token store row and back: the token columns sealed to their row, or raw.

With a :class:`~.sealed.Cipher` each token column holds the token sealed to its row (:mod:`.sealed`);
without one it holds ``raw:<token>``. A codec with a key refuses ``raw:`` columns (whoever wrote them
did not hold the key) and a codec without one refuses sealed columns rather than mis-reading them.
Every token read is registered with :mod:`airflow_provider_bos.redaction`, so no log shows it.
"""

from __future__ import annotations

import math
from typing import Any

from airflow_provider_bos.auth.sealed import LEGACY_PREFIX, SEALED_PREFIX, Cipher, RowBinding, seal, unseal
from airflow_provider_bos.auth.stored_grant import StoredGrant
from airflow_provider_bos.exceptions import BosTokenBindingError, BosTokenStoreError
from airflow_provider_bos.redaction import register_secret

__all__ = ["RAW_PREFIX", "TOKEN_COLUMNS", "GrantCodec"]

RAW_PREFIX = "raw:"
TOKEN_COLUMNS = ("access_token", "refresh_token")


class GrantCodec:
    """Converts between :class:`StoredGrant` and the column values of its row; ``cipher`` seals the
    tokens (``None``: stored raw)."""

    def __init__(self, cipher: Cipher | None) -> None:
        self.cipher = cipher

    def encode(self, value: str | None, binding: RowBinding, column: str) -> str | None:
        """The stored form of the token ``value`` in ``column`` of the row ``binding`` names."""
        if value is None:
            return None
        if self.cipher is None:
            return RAW_PREFIX + value
        return seal(self.cipher, binding, column, value)

    def decode(self, binding: RowBinding, column: str, stored: str | None) -> str | None:
        """The token in a column (refused unless it was written for this row, column and target)."""
        key = binding.key
        if stored is None:
            return None
        if stored.startswith(RAW_PREFIX):
            if self.cipher is not None:
                raise BosTokenStoreError(
                    f"The token store row {key!r} ({column}) is not encrypted, but the store is opened with "
                    "a Fernet key: a row written without the key is not trusted. Reconnect to replace it."
                )
            value = stored[len(RAW_PREFIX) :]
        elif stored.startswith((SEALED_PREFIX, LEGACY_PREFIX)):
            if self.cipher is None:
                raise BosTokenStoreError(
                    f"The token store row {key!r} is encrypted ({column}); open the store with the same "
                    "Fernet key (Airflow's [core] fernet_key) to read it."
                )
            value = unseal(self.cipher, stored, binding, column)
        else:
            raise BosTokenStoreError(f"The token store row {key!r} ({column}) has an unknown format.")
        register_secret(value)
        return value

    def grant(self, row: Any, *, tolerant: bool = False) -> StoredGrant:
        """The row as a grant; ``tolerant`` leaves tokens that cannot be read as None (for a
        re-seed, which replaces them anyway)."""
        m = row._mapping
        binding = RowBinding(m["key"], m["client_id"], m["resource"], m["token_endpoint"])
        tokens: dict[str, str | None] = {}
        try:
            for column in TOKEN_COLUMNS:
                try:
                    tokens[column] = self.decode(binding, column, m[column])
                except BosTokenStoreError:
                    if not tolerant:
                        raise
                    tokens[column] = None
        except BosTokenBindingError:
            if not tolerant:
                raise
            tokens = {"access_token": None, "refresh_token": None}
        consumed = set((m.get("consumed_seeds") or "").split())
        if m["seed_fingerprint"]:
            consumed.add(m["seed_fingerprint"])  # rows from before consumed_seeds existed
        return StoredGrant(
            key=m["key"],
            client_id=m["client_id"],
            token_endpoint=m["token_endpoint"],
            resource=m["resource"],
            scope=m["scope"],
            access_token=tokens["access_token"],
            refresh_token=tokens["refresh_token"],
            expires_at=None if m["expires_at"] is None else float(m["expires_at"]),
            generation=int(m["generation"]),
            seed_fingerprint=m["seed_fingerprint"],
            updated_at=float(m["updated_at"]),
            consumed_seeds=frozenset(consumed),
        )

    def values(self, grant: StoredGrant) -> dict[str, Any]:
        """The grant's row as column values, every column but the key."""
        return {
            "client_id": grant.client_id,
            "token_endpoint": grant.token_endpoint,
            "resource": grant.resource,
            "scope": grant.scope,
            "access_token": self.encode(grant.access_token, grant.binding, "access_token"),
            "refresh_token": self.encode(grant.refresh_token, grant.binding, "refresh_token"),
            # Never NaN/Infinity (SQLite stores NaN as NULL = "never expires", MySQL refuses it):
            # a lifetime that cannot be stored counts as expired.
            "expires_at": (
                grant.expires_at if grant.expires_at is None or math.isfinite(grant.expires_at) else 0.0
            ),
            "generation": grant.generation,
            "seed_fingerprint": grant.seed_fingerprint,
            "updated_at": grant.updated_at,
            "consumed_seeds": " ".join(sorted(grant.consumed_seeds)) or None,
        }
