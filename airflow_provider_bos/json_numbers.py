"""JSON numbers spelt by value, the one way every warehouse engine hands them back.

A JSON number has one value and many spellings. SQLite, MariaDB, DuckDB and Snowflake keep the JSON
text they were given; PostgreSQL's ``jsonb`` keeps the value (a ``numeric``) and writes it back its
own way: ``1e+16`` comes back as ``10000000000000000`` (a Python ``int`` once decoded) and ``-0.0``
as ``0.0``. What we hash (a record's content hash, a keyed hash of a number) must not depend on which
of the two a value went through, or a stored row read back and hashed again (pii-apply, the
content-hash upgrade) would look changed when nothing changed.

So a float is spelt as ``jsonb`` spells it back: one whose shortest form has a positive exponent
(every float of magnitude 1e16 or more: all of them integral) as the integer its decimal form names,
``-0.0`` as ``0.0``. Every other number keeps Python's spelling, which ``jsonb`` reads back to the
same float (``1e-07`` is written ``0.0000001`` and decodes to ``1e-07`` again).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

__all__ = ["NumberBeyondDouble", "by_value", "may_be_respelt", "numbers_by_value"]

_DIGITS = frozenset(b"0123456789")


class NumberBeyondDouble:
    """A JSON number beyond a 64-bit float's range (``1e400``), kept as the text BOS wrote.

    It is JSON, and no type the contract names rules it out, but no destination here stores it
    exactly: as a double it is an infinity (not JSON), and rounding it would store another value. So
    the writer refuses a record holding one like any record the table cannot store (its encoders do
    not know this type); the rejects table keeps the text (:meth:`__repr__`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def by_value(number: float) -> float | int:
    """``number`` as ``jsonb`` hands it back, decoded: see the module docstring."""
    if number == 0.0:
        return 0.0  # -0.0 too: numeric has no negative zero
    text = repr(number)
    return int(Decimal(text)) if "e+" in text else number


def numbers_by_value(value: Any) -> Any:
    """``value`` (decoded JSON) with every float :func:`by_value`; the containers are copies."""
    if type(value) is float:
        return by_value(value)
    if isinstance(value, dict):
        return {key: numbers_by_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [numbers_by_value(item) for item in value]
    return value


def may_be_respelt(text: bytes | str) -> bool:
    """True if JSON ``text`` may hold a float :func:`by_value` spells otherwise (``1e+16``, ``-0.0``).

    A cheap scan that may say yes for a string that only looks like one (the caller then takes the
    exact path); it never says no for such a number."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    i = data.find(b"e+")
    while i > 0:
        if data[i - 1] in _DIGITS:
            return True
        i = data.find(b"e+", i + 2)
    i = data.find(b"-0.0")
    while i >= 0:
        after = data[i + 4:i + 5]
        if not after or after not in b"0123456789eE":
            return True
        i = data.find(b"-0.0", i + 4)
    return False
