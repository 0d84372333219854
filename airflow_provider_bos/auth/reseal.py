"""The one-step re-seal of rows still in the earlier unbound format (``enc:v1:``).

Such a ciphertext names no row, so a table writer could move it into a row of their own; reads
refuse it (:class:`~.sealed.LegacyTokenError`). :func:`reseal_legacy` (the admin command
``airflow-provider-bos token-store reseal``, through :meth:`.SqlTokenStore.reseal_legacy`) seals every
such token to the row it is in now, in one transaction holding every such row's lock, and refuses a
ciphertext found in more than one place (a copy: neither row can say which is its own).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.auth.grant_codec import TOKEN_COLUMNS
from airflow_provider_bos.auth.grant_table import GrantTable
from airflow_provider_bos.auth.sealed import LEGACY_PREFIX, Cipher, RowBinding, seal, unseal_legacy
from airflow_provider_bos.exceptions import BosConfigurationError, BosTokenStoreError

logger = logging.getLogger(__name__)

__all__ = ["ResealReport", "reseal_legacy"]


@dataclass(frozen=True)
class ResealReport:
    """What :meth:`.SqlTokenStore.reseal_legacy` did: the rows re-sealed (key, resource, token endpoint)
    and the rows it refused, with why (a reconnect replaces them)."""

    resealed: tuple[tuple[str, str, str], ...]
    refused: tuple[tuple[str, str], ...]


def reseal_legacy(grants: GrantTable, cipher: Cipher | None) -> ResealReport:
    """Re-seal every row of ``grants`` that still holds tokens of the earlier unbound format, with
    ``cipher`` (the key they were encrypted with); rows that cannot be re-sealed are reported."""
    if cipher is None:
        raise BosConfigurationError(
            "Re-sealing needs the Fernet key the tokens were encrypted with (Airflow's [core] fernet_key)."
        )
    grants.ensure()
    table = grants.table
    legacy = sa.or_(*(table.c[column].like(f"{LEGACY_PREFIX}%") for column in TOKEN_COLUMNS))
    resealed: list[tuple[str, str, str]] = []
    refused: list[tuple[str, str]] = []
    try:
        with grants.writing() as conn:
            query = sa.select(table).where(legacy).order_by(table.c.key)
            if grants.dialect_name != "sqlite":
                query = query.with_for_update()
            rows = [row._mapping for row in conn.execute(query)]
            places = Counter(
                m[column]
                for m in rows
                for column in TOKEN_COLUMNS
                if str(m[column] or "").startswith(LEGACY_PREFIX)
            )
            for m in rows:
                values = _resealed_values(cipher, m, places, refused)
                if values is None:
                    continue
                conn.execute(
                    sa.update(table)
                    .where(table.c.key == m["key"], table.c.generation == m["generation"])
                    .values(**values)
                )
                resealed.append((m["key"], m["resource"], m["token_endpoint"]))
    except sa.exc.SQLAlchemyError as exc:
        raise grants.fail("re-seal", exc) from None
    for key, resource, _endpoint in resealed:
        logger.info("Token store row %r (%s): re-sealed to its row.", key, resource)
    return ResealReport(tuple(resealed), tuple(refused))


def _resealed_values(
    cipher: Cipher, m: Any, places: Counter[str], refused: list[tuple[str, str]]
) -> dict[str, str] | None:
    """The row's legacy token columns sealed to it, or None (and why, in ``refused``) when it cannot be."""
    binding = RowBinding(m["key"], m["client_id"], m["resource"], m["token_endpoint"])
    values: dict[str, str] = {}
    for column in TOKEN_COLUMNS:
        stored = m[column]
        if not str(stored or "").startswith(LEGACY_PREFIX):
            continue
        if places[stored] > 1:
            refused.append((m["key"], "its token is also in another row or column (a copy); reconnect it"))
            return None
        try:
            token = unseal_legacy(cipher, stored, m["key"], column)
        except BosTokenStoreError:
            refused.append((m["key"], "the configured Fernet key cannot decrypt it; reconnect it"))
            return None
        values[column] = seal(cipher, binding, column, token)
    return values
