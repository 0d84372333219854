"""Keyed, stable hashes of personal data: the key, the normalisation per field, the recipe.

The recipe (docs/personal-data.md shows it in Python and SQL) is, for a non-null value::

    lowercase hex of HMAC-SHA-256(key, UTF-8 bytes of normalise(field, value))

where ``key`` is the UTF-8 bytes of the key text (edge whitespace removed) and ``normalise`` is:

* ``email``: Unicode NFC, edge whitespace removed, case-folded (``str.casefold``);
* ``phone``: Unicode NFKC (full-width digits become 0-9), then every character removed except the
  digits 0-9 and a ``+`` that is the first character after the edge whitespace;
* any other field (``display_name``, ``sources[].external_id``, attribute values): Unicode NFC,
  edge whitespace removed;
* a number or boolean (in any field): its JSON text (``true``, ``42``, ``1.5``), as Python's
  ``json.dumps`` writes it. ``null`` is never hashed: it stays ``null``.

The field's name is not part of the hashed text, so an email hashes alike in the ``email`` column
and in an attribute that holds an email only if both normalise to the same text: one key, one
recipe, joinable across runs, tables and DAGs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any, NoReturn

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii.fields import parse_field
from airflow_provider_bos.redaction import register_secret

__all__ = [
    "MIN_KEY_BYTES",
    "RECIPE_VERSION",
    "PiiKey",
    "hash_value",
    "hasher_for",
    "lookup_hash",
    "normalise",
]

# Part of every fingerprint: a change to the normalisation or the hash recipe must change it, so a
# table written under an older recipe is never extended with hashes that would not join.
RECIPE_VERSION = 1

# SHA-256's security level: with a short or human-chosen key, anyone holding hashes of values they
# know could guess the key offline, and then hash anyone.
MIN_KEY_BYTES = 32

# Names the key id's HMAC input: the id is a PRF output under the key, so it reveals nothing of it.
_KEY_ID_LABEL = b"bos-pii-key-id"
# Names the HMAC input that derives the wire hashes' BLAKE2b key from the key (a key of its own for
# another MAC, and one that fits BLAKE2b's 64-byte limit whatever the key's length).
_WIRE_KEY_LABEL = b"bos-pii-wire-hash"
_SHA256_BLOCK = 64
_NOT_PHONE_CHARS = re.compile(r"[^0-9]")
_NOT_DIGIT_BYTES = bytes(c for c in range(128) if not 0x30 <= c <= 0x39)


class PiiKey:
    """The HMAC key of a policy's hashes. Its text is never shown: not in repr, str, nor pickled.

    ``key_id`` is a short public identifier (HMAC of a fixed label under the key) that tells two
    keys apart without revealing either; fingerprints and messages use it.
    """

    __slots__ = ("_inner", "_outer", "_secret", "_wire", "key_id", "source")

    def __init__(self, secret: bytes, *, source: str) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise BosConfigurationError(
                f"The personal-data hash key from {source} is {len(secret)} bytes; at least "
                f"{MIN_KEY_BYTES} are needed. Set a long random key, e.g. the output of "
                "`python -c 'import secrets; print(secrets.token_urlsafe(48))'`."
            )
        self._secret = secret
        self.source = source
        self.key_id = hmac.digest(secret, _KEY_ID_LABEL, "sha256").hex()[:16]
        # HMAC (RFC 2104) with its two keyed SHA-256 states made once: a hash then costs two state
        # copies instead of a keyed set-up per value (a third of the time, on 200k records a sync).
        short = hashlib.sha256(secret).digest() if len(secret) > _SHA256_BLOCK else secret
        block = short.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        self._wire = hashlib.blake2b(key=hmac.digest(secret, _WIRE_KEY_LABEL, "sha256"), digest_size=32)

    @classmethod
    def from_text(cls, text: str, *, source: str) -> PiiKey:
        """The key from its text (a Connection's password, a Variable): UTF-8, edge whitespace removed
        (a pasted key's line break is not part of it). ``source`` names where it came from, for messages."""
        register_secret(text)  # Airflow's masker hides it from every log line from now on
        stripped = text.strip()
        register_secret(stripped)
        return cls(stripped.encode("utf-8"), source=source)

    def digest_hex(self, message: bytes) -> str:
        """Lowercase hex HMAC-SHA-256 of ``message`` under this key."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()

    def wire_hash_hex(self, raw_wire_hash: str) -> str:
        """The keyed form of a raw wire hash (hex) that a table under a policy stores: lowercase hex
        BLAKE2b-256 keyed with a key derived from this one (``HMAC-SHA-256(key, "bos-pii-wire-hash")``).

        Only this package compares wire hashes, so they need not follow the analysts' recipe: keyed
        BLAKE2b is a MAC in one pass and one state copy, 0.2 us a record less than HMAC-SHA-256.
        """
        state = self._wire.copy()
        state.update(raw_wire_hash.encode("ascii"))
        return state.hexdigest()

    def __repr__(self) -> str:
        return f"PiiKey(key_id={self.key_id!r}, source={self.source!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PiiKey):
            return NotImplemented
        return hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self.key_id)

    def __reduce__(self) -> NoReturn:
        # Pickle, copy and XCom serialisation all go through here: a key never leaves the process.
        raise TypeError("A PiiKey is not serialised (pickle, copy, XCom); pass its connection id instead.")


def _text(value: str) -> str:
    return unicodedata.normalize("NFC", value).strip()


def _email(value: str) -> str:
    return _text(value).casefold()


def _phone(value: str) -> str:
    value = unicodedata.normalize("NFKC", value).strip()
    digits = _NOT_PHONE_CHARS.sub("", value)
    return "+" + digits if value.startswith("+") else digits


_STRING_NORMALISERS = {"email": _email, "phone": _phone}

# The same normalisations straight to the UTF-8 bytes that are hashed (the write path's form), each
# with a fast path for ASCII text, which NFC and NFKC leave as it is and whose casefold is lower().


def _text_utf8(value: str) -> bytes:
    if value.isascii():
        return value.strip().encode("ascii")
    return _text(value).encode("utf-8")


def _email_utf8(value: str) -> bytes:
    if value.isascii():
        return value.strip().lower().encode("ascii")
    return _email(value).encode("utf-8")


def _phone_utf8(value: str) -> bytes:
    if value.isascii():
        value = value.strip()  # str's whitespace, as the rule says (bytes.strip knows less of it)
        digits = value.encode("ascii").translate(None, _NOT_DIGIT_BYTES)
        return b"+" + digits if value.startswith("+") else digits
    return _phone(value).encode("utf-8")


_UTF8_NORMALISERS = {"email": _email_utf8, "phone": _phone_utf8}


def normalise(field: str, value: str | int | float | bool) -> str:
    """The text that is hashed for ``value`` of ``field`` (see the module docstring)."""
    if isinstance(value, str):
        return _STRING_NORMALISERS.get(field, _text)(value)
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    raise BosConfigurationError(
        f"A {type(value).__name__} in {field} cannot be hashed: only strings, numbers and booleans "
        "are (objects and lists are hashed leaf by leaf)."
    )


def hash_value(key: PiiKey, field: str, value: Any) -> str | None:
    """The keyed hash of one value of ``field`` (lowercase hex, 64 characters); ``None`` stays ``None``."""
    if value is None:
        return None
    return key.digest_hex(normalise(field, value).encode("utf-8"))


def hasher_for(key: PiiKey, field: str) -> Callable[[Any], str | None]:
    """``hash_value(key, field, ...)`` as one callable, its normaliser chosen once and the HMAC
    inlined (the write path's per-value cost is mostly calls)."""
    to_utf8 = _UTF8_NORMALISERS.get(field, _text_utf8)
    inner_copy, outer_copy = key._inner.copy, key._outer.copy

    def hash_one(value: Any) -> str | None:
        if type(value) is str:  # PiiKey.digest_hex, inlined: one call less per value
            inner = inner_copy()
            inner.update(to_utf8(value))
            outer = outer_copy()
            outer.update(inner.digest())
            return outer.hexdigest()
        return hash_value(key, field, value)

    return hash_one


def lookup_hash(key: PiiKey, field: str, raw_value: str) -> str:
    """The hash a table stores for ``raw_value`` of ``field``: look a person up, or erase them, by it.

    ``field`` is a policy field (``email``, ``phone``, ``display_name``, ``sources[].external_id``,
    ``attributes.<path>``); only ``email`` and ``phone`` normalise differently from the rest.

    :raises BosConfigurationError: ``field`` is not a policy field.
    """
    digest = hash_value(key, parse_field(field).canonical, raw_value)
    assert digest is not None  # a str is never None
    return digest
