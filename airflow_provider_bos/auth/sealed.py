"""Token columns sealed to their row: authenticated encryption of the token AND where it belongs.

A token store row holds two secrets (access and refresh token) beside plaintext columns that say
where they may go (``client_id``, ``resource``, ``token_endpoint``) and whose they are (``key``,
the Connection id). Encrypting each token alone would let anyone who can write the table move a
ciphertext into another row, one whose plaintext columns point at their own host; the token would
then decrypt there and be sent to it. So a sealed value is the cipher (Fernet: AES-CBC + HMAC)
over a JSON payload that carries the token together with its :class:`RowBinding` and column name,
and every read checks that payload against the row it was read from: a sealed token decrypts only
in the row, column and target it was written for.

Formats: ``enc:v2:<base64 ciphertext of the payload>`` (written by this module);
``enc:v1:<base64 ciphertext of the bare token>`` is the earlier unbound format. A v1 value says
nothing about the row it belongs to, so a table writer could move it into a row of their own:
:func:`unseal` refuses it (:class:`LegacyTokenError`), and only the admin command ``airflow-provider-bos
token-store reseal`` reads it (:func:`unseal_legacy`), to re-seal every such row in one step.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from airflow_provider_bos.exceptions import BosTokenBindingError, BosTokenStoreError

__all__ = [
    "LEGACY_PREFIX", "RESEAL_COMMAND", "SEALED_PREFIX", "Cipher", "LegacyTokenError", "RowBinding", "seal", "unseal",
    "unseal_legacy",
]

SEALED_PREFIX = "enc:v2:"
LEGACY_PREFIX = "enc:v1:"
_VERSION = 2
#: The admin command that re-seals every ``enc:v1:`` row of a store (see :mod:`airflow_provider_bos.cli`).
RESEAL_COMMAND = "airflow-provider-bos token-store reseal"


class LegacyTokenError(BosTokenStoreError):
    """A column holds a token of the earlier unbound format (``enc:v1:``), which is no longer read."""


@runtime_checkable
class Cipher(Protocol):
    """Symmetric authenticated encryption; ``cryptography.fernet.Fernet`` (and Airflow's) satisfies it."""

    def encrypt(self, data: bytes) -> bytes: ...

    def decrypt(self, token: bytes) -> bytes: ...


@dataclass(frozen=True)
class RowBinding:
    """What a sealed token is bound to: its row's key and the target its columns name."""

    key: str
    client_id: str
    resource: str
    token_endpoint: str

    def differences(self, other: RowBinding) -> list[str]:
        """The names of the fields in which ``other`` differs (never their values)."""
        names = ("key", "client_id", "resource", "token_endpoint")
        return [name for name in names if getattr(self, name) != getattr(other, name)]


def seal(cipher: Cipher, binding: RowBinding, column: str, token: str) -> str:
    """``token`` encrypted together with ``binding`` and ``column``: the stored column value."""
    payload = {
        "v": _VERSION,
        "key": binding.key,
        "client_id": binding.client_id,
        "resource": binding.resource,
        "token_endpoint": binding.token_endpoint,
        "column": column,
        "token": token,
    }
    plaintext = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return SEALED_PREFIX + base64.urlsafe_b64encode(cipher.encrypt(plaintext)).decode("ascii")


def legacy_refusal(key: str, column: str) -> LegacyTokenError:
    return LegacyTokenError(
        f"The token store row {key!r} ({column}) holds a token of the earlier unbound format (enc:v1), "
        "which is no longer read: such a token is bound to no row, so whoever can write the table could "
        f"have moved it there. An admin re-seals every such row once with `{RESEAL_COMMAND}` (with the "
        "store's --token-store-url or --token-store-conn-id, and Airflow's [core] fernet_key); "
        "reconnecting the Connection replaces the row too."
    )


def unseal(cipher: Cipher, stored: str, binding: RowBinding, column: str) -> str:
    """The token in ``stored`` when it was sealed for exactly ``binding`` and ``column``.

    Raises :class:`BosTokenBindingError` when it was sealed for another row, column or target (a
    value copied or altered in the table), :class:`LegacyTokenError` for the earlier unbound format,
    :class:`BosTokenStoreError` when it cannot be decrypted.
    """
    if stored.startswith(LEGACY_PREFIX):
        raise legacy_refusal(binding.key, column)
    if not stored.startswith(SEALED_PREFIX):
        raise BosTokenStoreError(f"The token store row {binding.key!r} ({column}) has an unknown format.")
    payload = _payload(_decrypt(cipher, stored[len(SEALED_PREFIX):], binding.key, column), binding.key, column)
    sealed_for = RowBinding(
        key=payload["key"], client_id=payload["client_id"], resource=payload["resource"],
        token_endpoint=payload["token_endpoint"],
    )
    differs = binding.differences(sealed_for)
    if payload["column"] != column:
        differs.append("column")
    if differs:
        raise BosTokenBindingError(
            f"The token store row {binding.key!r} ({column}) holds a token sealed for another row or target "
            f"(its {', '.join(differs)} {'differs' if len(differs) == 1 else 'differ'}): "
            "the table was copied into or altered, and the token is "
            "neither used nor sent anywhere.",
            conn_id=binding.key,
        )
    return str(payload["token"])


def unseal_legacy(cipher: Cipher, stored: str, key: str, column: str) -> str:
    """The bare token of an ``enc:v1:`` value: for the reseal command only, which binds it to its row."""
    if not stored.startswith(LEGACY_PREFIX):
        raise BosTokenStoreError(f"The token store row {key!r} ({column}) is not of the earlier format.")
    return _decrypt(cipher, stored[len(LEGACY_PREFIX):], key, column)


def _decrypt(cipher: Cipher, text: str, key: str, column: str) -> str:
    try:
        return cipher.decrypt(base64.urlsafe_b64decode(text)).decode("utf-8")
    except Exception:  # noqa: BLE001 - InvalidToken, binascii.Error, UnicodeDecodeError
        raise BosTokenStoreError(
            f"The token store row {key!r} ({column}) cannot be decrypted with the configured key; "
            "use the key it was written with, or reconnect."
        ) from None


def _payload(text: str, key: str, column: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    fields = ("key", "client_id", "resource", "token_endpoint", "column", "token")
    if not (isinstance(payload, dict) and payload.get("v") == _VERSION
            and all(isinstance(payload.get(name), str) for name in fields)):
        raise BosTokenStoreError(f"The token store row {key!r} ({column}) holds a sealed value of an unknown shape.")
    return payload
