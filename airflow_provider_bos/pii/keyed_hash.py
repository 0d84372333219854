"""Keyed, stable hashes of personal data: the key, the normalisation per field, the recipe.

The recipe (version 2; docs/personal-data.md shows it in Python and SQL) is, for a non-null value
``v`` of field ``f``::

    lowercase hex of HMAC-SHA-256(key, b"bos-pii/2" 0x00 domain(f) 0x00 type(v) 0x00 bytes(f, v))

* ``key``: the UTF-8 bytes of the key text (edge whitespace removed);
* ``domain(f)``: the field, UTF-8: ``display_name``, ``email``, ``phone``, ``lifecycle``,
  ``identity_match``, ``sources[].external_id``, ``sources[].*`` (one domain for everything under
  them), and for an attribute **its full path**: ``attributes.contacts.phone`` for the ``phone`` of
  each object of the ``contacts`` list, whichever rule hashed it (``attributes.*`` or
  ``attributes.contacts``). A key holding ``\\``, ``.`` or NUL is written ``\\\\``, ``\\.``,
  ``\\0`` in the path, so two paths never share a domain, nor can a domain hold the 0x00 after it;
* ``type(v)``: the JSON type, ``string``, ``number`` or ``boolean``, so the number 4711 and the text
  ``"4711"`` hash apart;
* ``bytes(f, v)``: for a number or boolean its JSON text as Python's ``json.dumps`` writes it
  (``42``, ``1.5``, ``true``), a number spelt by value (``1e+16`` as ``10000000000000000``, ``-0.0``
  as ``0.0``: :mod:`airflow_provider_bos.json_numbers`, as every engine hands it back); for a string the UTF-8 bytes of:

  - ``email``: Unicode NFC, edge whitespace removed, case-folded (``str.casefold``);
  - ``phone``: Unicode NFKC, edge whitespace removed, then each decimal digit of any script (Arabic-
    Indic, Persian, Devanagari, full-width, ...: ``str.isdecimal``) as its ASCII digit 0-9 and every
    other character removed, except a ``+`` that comes first;
  - ``sources[].external_id``: the id exactly as sent (no trimming, no normalisation: two distinct
    ids never hash alike);
  - any other field (``display_name``, ``lifecycle``, ``identity_match``, ``sources[].*``,
    attributes): Unicode NFC, edge whitespace removed.

A string that normalises to nothing (blank, or a phone number without a digit) is **not hashed**: it
is stored as ``null``, like ``null`` itself (a blank is no value, so it neither counts as one nor
joins people). An external id is never blank in this sense: it is hashed as it is.

Hashes join within a field (across runs, tables and DAGs under one key) and never across fields:
a value someone can set in one field (their own profile's attributes) is no oracle for another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import unicodedata
from collections.abc import Callable
from typing import Any, NoReturn

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.json_numbers import by_value
from airflow_provider_bos.pii.fields import EXTERNAL_ID, FieldName, parse_field
from airflow_provider_bos.redaction import register_secret

__all__ = [
    "MIN_KEY_BITS",
    "MIN_KEY_BYTES",
    "RECIPE_VERSION",
    "PiiKey",
    "TreeHasher",
    "estimated_key_bits",
    "field_domain",
    "generate_key_text",
    "hash_value",
    "hasher_for",
    "lookup_hash",
    "normalise",
]

# Part of every fingerprint: a change to the normalisation or the hash recipe must change it, so a
# table written under an older recipe is never extended with hashes that would not join.
RECIPE_VERSION = 2
_RECIPE_LABEL = b"bos-pii/2"

# SHA-256's security level: with a short or human-chosen key, anyone holding hashes of values they
# know (or the key id of a fingerprint) could guess the key offline, and then hash anyone.
MIN_KEY_BYTES = 32
#: What :func:`estimated_key_bits` must give a key (a conservative estimate of the guesses it takes).
MIN_KEY_BITS = 128

# Names the key id's HMAC input: the id is a PRF output under the key, so it reveals nothing of it.
_KEY_ID_LABEL = b"bos-pii-key-id"
# Names the HMAC input that derives the wire hashes' BLAKE2b key from the key (a key of its own for
# another MAC, and one that fits BLAKE2b's 64-byte limit whatever the key's length).
_WIRE_KEY_LABEL = b"bos-pii-wire-hash"
_SHA256_BLOCK = 64
_NOT_DIGIT_BYTES = bytes(c for c in range(128) if not 0x30 <= c <= 0x39)
_HOW_TO_MAKE = ("Make one with `airflow-provider-bos pii-keygen` (or "
                "`python -c 'import secrets; print(secrets.token_urlsafe(48))'`).")


class PiiKey:
    """The HMAC key of a policy's hashes. Its text is never shown: not in repr, str, nor pickled.

    ``key_id`` is a short public identifier (HMAC of a fixed label under the key) that tells two
    keys apart without revealing either; fingerprints and messages use it. A short or guessable key
    is refused (:func:`estimated_key_bits`): the key id would confirm a guess of it offline.
    """

    __slots__ = ("_inner", "_outer", "_secret", "_wire", "key_id", "source")

    def __init__(self, secret: bytes, *, source: str) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise BosConfigurationError(
                f"The personal-data hash key from {source} is {len(secret)} bytes; at least "
                f"{MIN_KEY_BYTES} are needed. {_HOW_TO_MAKE}"
            )
        try:
            text = secret.decode("utf-8")
        except UnicodeDecodeError:  # random bytes: one character each
            text = secret.decode("latin-1")
        bits = estimated_key_bits(text)
        if bits < MIN_KEY_BITS:
            raise BosConfigurationError(
                f"The personal-data hash key from {source} is guessable: it is made of words, names, dates, "
                f"repeats or sequences a guesser tries first (a conservative estimate puts it at about "
                f"{bits:.0f} bits; at least {MIN_KEY_BITS} are needed). Anyone holding a table's hashes or "
                f"its key id could confirm a guess offline and then hash anyone. {_HOW_TO_MAKE}"
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
        """Lowercase hex HMAC-SHA-256 of ``message`` under this key (no domain: the recipe's hashes
        are made by :func:`hasher_for`; this is the wire hashes' earlier form, :mod:`.stream`)."""
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


# --- the normalisation ----------------------------------------------------------------------------

def _text(value: str) -> str:
    return unicodedata.normalize("NFC", value).strip()


def _email(value: str) -> str:
    return _text(value).casefold()


def _phone(value: str) -> str:
    value = unicodedata.normalize("NFKC", value).strip()
    digits = "".join(str(unicodedata.decimal(c)) for c in value if c.isdecimal())
    if not digits:
        return ""
    return "+" + digits if value.startswith("+") else digits


def _exact(value: str) -> str:
    return value


_STRING_NORMALISERS = {"email": _email, "phone": _phone, EXTERNAL_ID: _exact}

# The same normalisations straight to the UTF-8 bytes that are hashed (the write path's form; None:
# nothing to hash), each with a fast path for ASCII text, which NFC and NFKC leave as it is and whose
# casefold is lower().


def _text_utf8(value: str) -> bytes | None:
    data = value.strip().encode("ascii") if value.isascii() else _text(value).encode("utf-8")
    return data or None


def _email_utf8(value: str) -> bytes | None:
    data = value.strip().lower().encode("ascii") if value.isascii() else _email(value).encode("utf-8")
    return data or None


def _phone_utf8(value: str) -> bytes | None:
    if value.isascii():
        value = value.strip()  # str's whitespace, as the rule says (bytes.strip knows less of it)
        digits = value.encode("ascii").translate(None, _NOT_DIGIT_BYTES)
        if not digits:
            return None
        return b"+" + digits if value.startswith("+") else digits
    return _phone(value).encode("ascii") or None


def _exact_utf8(value: str) -> bytes:
    return value.encode("utf-8")


_UTF8_NORMALISERS: dict[str, Callable[[str], bytes | None]] = {
    "email": _email_utf8, "phone": _phone_utf8, EXTERNAL_ID: _exact_utf8}


def normalise(field: str, value: str | int | float | bool) -> str:
    """The text that is hashed for ``value`` of ``field`` (see the module docstring); ``""`` when it
    normalises to nothing, which is stored as ``null``, never hashed (an external id excepted: it is
    hashed exactly, the empty id too). A number or boolean: its JSON text (its hash also names its type)."""
    if isinstance(value, str):
        return _STRING_NORMALISERS.get(field, _text)(value)
    if isinstance(value, bool | int | float):
        return json.dumps(by_value(value) if type(value) is float else value)
    raise _not_hashable(field, value)


def _not_hashable(field: str, value: Any) -> BosConfigurationError:
    return BosConfigurationError(
        f"A {type(value).__name__} in {field} cannot be hashed: only strings, numbers and booleans "
        "are (objects and lists are hashed leaf by leaf)."
    )


# --- the domain: which field a hash belongs to ------------------------------------------------------

def _path_key(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("\0", "\\0")


def _attribute_domain(path: tuple[str, ...]) -> str:
    return ".".join(("attributes", *map(_path_key, path)))


def field_domain(field: str | FieldName) -> str:
    """The domain of a policy field's hashes (the recipe's ``domain(f)``): its canonical name, for an
    attribute its full path (keys holding ``\\``, ``.`` or NUL escaped).

    :raises BosConfigurationError: ``field`` is not a policy field.
    """
    name = field if isinstance(field, FieldName) else parse_field(field)
    return _attribute_domain(name.attribute_path) if name.is_attribute else name.canonical


def _utf8_normaliser(field: FieldName) -> Callable[[str], bytes | None]:
    return _UTF8_NORMALISERS.get(field.canonical, _text_utf8)


def _make_hasher(key: PiiKey, domain: str, to_utf8: Callable[[str], bytes | None]) -> Callable[[Any], str | None]:
    """The hash of one domain's values: ``b"bos-pii/2\\0<domain>\\0"`` is in the inner SHA-256 state
    once (with ``string\\0`` for strings), so a value costs two state copies, as a plain HMAC would."""
    prefix = b"\0".join((_RECIPE_LABEL, domain.encode("utf-8", "surrogatepass"), b""))
    strings = key._inner.copy()
    strings.update(prefix + b"string\0")
    inner_copy, outer_copy, typed_copy = strings.copy, key._outer.copy, key._inner.copy

    def other(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):  # a str subclass
            return hash_one(str(value))
        if isinstance(value, bool):
            json_type, data = b"boolean", b"true" if value else b"false"
        elif isinstance(value, int | float):
            json_type, data = b"number", json.dumps(by_value(value) if type(value) is float else value).encode("ascii")
        else:
            raise _not_hashable(domain, value)
        inner = typed_copy()
        inner.update(prefix + json_type + b"\0" + data)
        outer = outer_copy()
        outer.update(inner.digest())
        return outer.hexdigest()

    def hash_one(value: Any) -> str | None:
        if type(value) is str:  # the usual case, inlined: one call less per value
            data = to_utf8(value)
            if data is None:
                return None
            inner = inner_copy()
            inner.update(data)
            outer = outer_copy()
            outer.update(inner.digest())
            return outer.hexdigest()
        return other(value)

    return hash_one


def hasher_for(key: PiiKey, field: str) -> Callable[[Any], str | None]:
    """``hash_value(key, field, ...)`` as one callable, its domain and normaliser made once (the write
    path's per-value cost is mostly calls).

    :raises BosConfigurationError: ``field`` is not a policy field.
    """
    name = parse_field(field)
    return _make_hasher(key, field_domain(name), _utf8_normaliser(name))


def hash_value(key: PiiKey, field: str, value: Any) -> str | None:
    """The keyed hash of one value of policy field ``field`` (lowercase hex, 64 characters); ``None``
    for ``None`` and for a value that normalises to nothing (stored as ``null``).

    :raises BosConfigurationError: ``field`` is not a policy field, or ``value`` is an object or list.
    """
    if value is None:
        return None
    return hasher_for(key, field)(value)


def lookup_hash(key: PiiKey, field: str, raw_value: str) -> str:
    """The hash a table stores for ``raw_value`` of ``field``: look a person up, or erase them, by it.

    ``field`` is a policy field (``email``, ``phone``, ``display_name``, ``sources[].external_id``,
    ``attributes.<path>``, ...): it decides the normalisation and the hash's domain.

    :raises BosConfigurationError: ``field`` is not a policy field, or ``raw_value`` normalises to
        nothing (blank, a phone number without a digit): such values are stored as ``null``, so no
        hash would find them.
    """
    digest = hash_value(key, field, raw_value)
    if digest is None:
        raise BosConfigurationError(
            f"A {field} value given to look up is blank (or, for a phone number, holds no digit): such "
            "values are stored as NULL, never hashed, so its hash matches nothing."
        )
    return digest


_MISSING: Any = object()


class TreeHasher:
    """Hashes the values of a JSON tree of one field: every string, number and boolean under it.

    For ``lifecycle``, ``identity_match`` and ``sources[].*`` one domain covers the whole tree; for an
    attributes path each object key below it makes the domain one step longer (:meth:`child`), so a
    value hashes by its full path whichever rule hashed it. Strings repeat across records
    (departments, titles): each domain remembers a bounded number of their hashes.
    """

    __slots__ = ("_cache", "_children", "_hash_one", "_key", "_path")

    _KEPT = 4096  # hashes remembered per domain (emptied when full)
    _CHILDREN_KEPT = 1024  # domains remembered below one (an object keyed by data makes many)

    def __init__(self, key: PiiKey, field: str, *, _path: tuple[str, ...] | None = None) -> None:
        domain = field
        if _path is None:
            name = parse_field(field)
            domain = name.canonical
            if name.is_attribute:
                _path = name.attribute_path
        self._key = key
        self._path = _path  # None: one domain for the whole tree
        if _path is not None:
            domain = _attribute_domain(_path)
        self._hash_one = _make_hasher(key, domain, _text_utf8)
        self._cache: dict[Any, str | None] = {}
        self._children: dict[str, TreeHasher] = {}

    def child(self, key: str) -> TreeHasher:
        """The hasher of the values under object key ``key`` of this one's."""
        if self._path is None:
            return self
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= self._CHILDREN_KEPT:
                self._children.clear()
            found = self._children[key] = TreeHasher(self._key, "", _path=(*self._path, key))
        return found

    def __call__(self, value: Any) -> str | None:
        """The hash of a string, number or boolean (``None`` stays ``None``, a blank string becomes it)."""
        kind = type(value)
        if kind is str:
            known: Any = value
        elif kind is int or kind is float or kind is bool:
            known = (kind, value)  # by its type too: 1, 1.0 and True are equal keys of a dict
        else:
            return self._hash_one(value)  # None, or what cannot be hashed (the error says so)
        cache = self._cache
        digest = cache.get(known, _MISSING)
        if digest is _MISSING:
            if len(cache) >= self._KEPT:
                cache.clear()
            digest = cache[known] = self._hash_one(value)
        return digest  # type: ignore[no-any-return]


# --- the key's strength -----------------------------------------------------------------------------

def generate_key_text() -> str:
    """A new random key: 48 random bytes as URL-safe base64 (64 characters, 384 bits)."""
    import secrets

    while True:
        text = secrets.token_urlsafe(48)
        if estimated_key_bits(text) >= MIN_KEY_BITS:  # always, in practice
            return text


# What a guesser tries first, beside the patterns below: common password and key words, the words
# a key of this package would be made of, and the keyboard's rows. Matched case-insensitively, also
# reversed and in l33t spelling; each costs log2 of the list's length (about 8 bits), as if ranked.
_WORD_LIST = """
password passwd passphrase pass secret secrets key keys token private public hash hmac salt pepper pii
personal data bos airflow provider warehouse people person identity federated sync hr hris crm idp
prod production staging stage dev development test testing demo example sample default defaults
changeme admin administrator root user username login welcome letmein master main backup primary
secondary live env environment local cloud internal external company corp acme inc ltd gmbh org
aws azure gcp google snowflake postgres postgresql mysql mariadb sqlite duckdb database db new old
my our your the and for with this that very super long strong random string text value values
secure security safe hello world iloveyou monkey dragon football baseball soccer sunshine princess
shadow trustno superman batman starwars whatever freedom qwerty qwertz azerty qwertyuiop asdfghjkl
zxcvbnm asdf zxcv asdfgh zxcvbn qazwsx qwer qwert abc abcd abcdef one two three four five six seven
eight nine ten zero first second third january february march april may june july august september
october november december jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday
thursday friday saturday sunday spring summer autumn fall winter red green blue black white yellow
orange purple silver gold correct horse battery staple apple banana cherry berlin london paris
newyork munich hamburg vienna zurich europe europa germany usa uk eu emea apac amer north south east
west central region team group department finance sales marketing engineering research ops devops
platform service services system systems server client api app application web site portal online
access auth oauth jwt cert certificate vault config configuration settings setting version release
copy final temp tmp draft keyfile signing encryption encrypt decrypt cipher crypto
"""
_WORDS = frozenset(_WORD_LIST.split())
_WORD_BITS = math.log2(len(_WORDS))
_MAX_WORD = max(map(len, _WORDS))
_LEET = str.maketrans("4@310$57!|+", "aaeiosstilt")
# A run of letters shaped like a word (lower case, Capitalised or UPPER, 3-12 letters of any alphabet
# with case, between non-letters or after a case change): a word of some dictionary, of at most
# about 2^17 words.
_WORD_SHAPE_BITS = 17.0
_ANALYSED = 256  # characters of a key looked at (a longer key's rest adds nothing to the estimate)


def _char_bits(c: str) -> float:
    if "0" <= c <= "9":
        return math.log2(10)
    if "a" <= c <= "z" or "A" <= c <= "Z":
        return math.log2(26)
    if c.isascii():
        return math.log2(33)  # punctuation, space, control
    return 5.0 if c.isalpha() else 7.0  # a letter of another alphabet; anything else


def _case_bits(word: str) -> float:
    uppers = sum(c.isupper() for c in word)
    if uppers == 0:
        return 0.0
    if uppers == len(word) or (uppers == 1 and word[0].isupper()):
        return 1.0
    return math.log2(math.comb(len(word), uppers)) + 1


def _word_shaped_runs(text: str) -> dict[int, int]:
    """``{start: end}`` of each word-shaped run of letters of ``text`` (see ``_WORD_SHAPE_BITS``)."""
    runs: dict[int, int] = {}
    i, n = 0, len(text)
    while i < n:
        if not text[i].isalpha():
            i += 1
            continue
        j = i + 1
        while j < n and text[j].isalpha() and not (text[j].isupper() and text[j - 1].islower()):
            j += 1
        word = text[i:j]
        if 3 <= len(word) <= 12 and (word.islower() or word.isupper() or (word[0].isupper() and word[1:].islower())):
            runs[i] = j
        i = j
    return runs


def _sequence_end(text: str, i: int) -> int:
    """Where a sequence starting at ``i`` ends (``abc``, ``9876``, ``aceg``: one class, one step of 1 or
    2); ``i`` if there is none of 3 characters or more."""
    if i + 2 >= len(text):
        return i
    step = ord(text[i + 1]) - ord(text[i])
    if step not in (-2, -1, 1, 2):
        return i
    j = i + 1
    while j < len(text) and ord(text[j]) - ord(text[j - 1]) == step and _same_class(text[i], text[j]):
        j += 1
    return j if j - i >= 3 else i


def _same_class(a: str, b: str) -> bool:
    return (a.isdigit() and b.isdigit()) or (a.islower() and b.islower()) or (a.isupper() and b.isupper())


def estimated_key_bits(text: str) -> float:
    """A conservative estimate of the guesses ``text`` takes, in bits (zxcvbn's idea, simplified): the
    cheapest way to spell it from characters of its class (a digit 3.3 bits, a letter 4.7, other ASCII
    5, a punctuation character seen before 1), repeats (``aaaa``, ``abab``), sequences (``abcd``,
    ``9876``), years (1900-2099), words of a list of common ones (also reversed or in l33t), and any
    word-shaped run of letters, which costs at most what a word of a large dictionary costs.
    """
    text = text[:_ANALYSED]
    n = len(text)
    seen: set[str] = set()
    char_bits = []
    for c in text:
        punctuation = c.isascii() and not c.isalnum()
        char_bits.append(1.0 if punctuation and c in seen else _char_bits(c))
        seen.add(c)
    word_shaped = _word_shaped_runs(text)
    best = [0.0] + [math.inf] * n
    for i in range(n):
        here = best[i]
        if here == math.inf:
            continue

        def offer(end: int, bits: float, here: float = here) -> None:
            if here + bits < best[end]:
                best[end] = here + bits

        offer(i + 1, char_bits[i])
        # a repeated character, or a repeated block
        for size in range(1, (n - i) // 2 + 1):
            block = text[i:i + size]
            count = 1
            while text.startswith(block, i + count * size):
                count += 1
            if count >= (3 if size == 1 else 2):
                block_bits = char_bits[i] if size == 1 else estimated_key_bits(block)
                for times in range(2, count + 1):
                    offer(i + times * size, block_bits + math.log2(times))
        end = _sequence_end(text, i)
        if end > i:
            step = ord(text[i + 1]) - ord(text[i])
            for stop in range(i + 3, end + 1):
                offer(stop, _char_bits(text[i]) + math.log2(stop - i) + (step < 0) + (abs(step) == 2))
        if text[i:i + 4].isdigit() and len(text[i:i + 4]) == 4 and 1900 <= int(text[i:i + 4]) <= 2099:
            offer(i + 4, math.log2(200))
        if i in word_shaped:
            end = word_shaped[i]
            offer(end, min(sum(char_bits[i:end]), _WORD_SHAPE_BITS) + _case_bits(text[i:end]))
        for end in range(i + 3, min(n, i + _MAX_WORD) + 1):
            word = text[i:end]
            lower = word.lower()
            if lower in _WORDS:
                offer(end, _WORD_BITS + _case_bits(word))
            elif lower[::-1] in _WORDS:
                offer(end, _WORD_BITS + _case_bits(word) + 1)
            else:
                plain = lower.translate(_LEET)
                if plain != lower and plain in _WORDS:
                    offer(end, _WORD_BITS + _case_bits(word) + sum(a != b for a, b in zip(lower, plain, strict=True)))
    return best[n]
