"""The values of a whole-contract record (``Scenario.record_values == "whole_contract"``).

The contract names no type for ``lifecycle`` and ``identity_match``, so any JSON value may come, and
extra keys may come: these tables and functions make every kind appear, deterministically from a
person's hashes (:mod:`.federation` builds the records).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_bos.testing.days import mix

__all__ = ["JSON_KINDS", "LIFECYCLE_NUMBERS", "MATCH_METHODS", "MATCH_NUMBERS", "WHOLE_KEY", "WHOLE_NAMES",
           "json_of_kind", "provenance_extras", "whole_attributes"]

# The contract names no type for lifecycle and identity_match, so any JSON value may come; these
# tables make every kind appear. A change moves both to the next kind in JSON_KINDS (a person
# changed on days 2, 3 and 4 may go string -> object -> null), and nothing else moves a kind.

WHOLE_KEY = 0xC0FFEE_0DD_B17E5
JSON_KINDS = ("string", "object", "null", "number", "array", "boolean")
# (display, ascii slug for the email, None: the usual one); picked by the name's id, so a merged
# pair shares it.
WHOLE_NAMES: tuple[tuple[str, str | None], ...] = (
    ("", None),  # empty: not null, and not a name either
    ("\u200fمحمد العلي", "mohammed.alali"),  # a right-to-left mark, then Arabic
    ("\u200fנועה כהן\u200f", "noa.cohen"),  # Hebrew between right-to-left marks  # noqa: RUF001
    ("Sam \u200fبن علي", "sam.benali"),  # both directions
    ("🦊", "fox"),
    ("Ana 👩🏽‍💻 Silva", "ana.silva"),  # a skin tone in a zero-width-joiner sequence
)
LIFECYCLE_NUMBERS: tuple[int | float, ...] = (0, 3, 0.75, -2.5, 1e-7, 1 << 65)
MATCH_NUMBERS: tuple[int | float, ...] = (1, 0.97, 0.5, -0.25)
MATCH_METHODS = ("email", "phone", "manual", "employee id")
BIG_INTS = (1 << 70, -(1 << 70), 1 << 64, -(1 << 64) - 1, 10**30 + 7, -(10**40))
TINY_FLOATS = (5e-324, 1e-320, 2.2250738585072014e-308, 4.9e-300)  # subnormals, the smallest normal
NEGATIVE_FLOATS = (-1.5e-300, -0.25, -5e-324, -1.7976931348623157e308)
ODD_KEYS = ("cost centre", "Straße", "部署", "emoji 🎉", " padded key ", "نوع")
DEEP = 12  # containers nested in attributes["deep"]


def json_of_kind(kind: str, h: int, numbers: tuple[int | float, ...], words: tuple[str, ...],
                  obj: dict[str, Any]) -> Any:
    """A JSON value of ``kind`` (one of :data:`JSON_KINDS`), varied by the bits of ``h``."""
    if kind == "string":
        return words[h % len(words)]
    if kind == "object":
        return obj
    if kind == "number":
        return numbers[h % len(numbers)]
    if kind == "array":
        return ([], [words[h % len(words)]], [words[(h >> 2) % len(words)], obj], [[], {}])[(h >> 4) & 3]
    if kind == "boolean":
        return bool(h & 1)
    return None


def nested(depth: int, leaf: Any) -> Any:
    """``depth`` containers, objects and lists by turns, around ``leaf``."""
    value = leaf
    for level in range(depth, 0, -1):
        value = {f"level {level}": value} if level % 2 else [value]
    return value


def whole_attributes(hc: int, attributes: dict[str, Any], titles: tuple[str, ...]) -> dict[str, Any]:
    """``attributes`` plus values a narrow reader trips over (each optional key with odds 1/2 or better)."""
    if not attributes:  # an empty attributes object stays one
        return attributes
    g = mix(hc ^ WHOLE_KEY)
    extra: dict[str, Any] = {
        "": ("an empty key", 0, None, {"": []})[g & 3],
        "big numbers": {"beyond 64 bits": BIG_INTS[(g >> 2) % len(BIG_INTS)], "negative": -(1 << 64) - (g >> 48)},
        "floats": {"tiny": TINY_FLOATS[(g >> 5) & 3], "negative": NEGATIVE_FLOATS[(g >> 7) & 3]},
    }
    if g & (1 << 9):
        extra[ODD_KEYS[(g >> 10) % len(ODD_KEYS)]] = ODD_KEYS[(g >> 13) % len(ODD_KEYS)]
    if g & (1 << 16):
        extra["deep"] = nested(DEEP, (g >> 17) & 0xFF)
    if g & (3 << 25):
        extra["empty object"], extra["empty list"] = {}, []
    if g & (1 << 27):
        extra["history"] = [{"title": titles[(g >> (28 + 3 * n)) & 7], "years": n + 1, "note": None}
                            for n in range(1 + ((g >> 40) & 1))]
    return {**attributes, **extra}


def provenance_extras(source_type: str, source_identity: str, external_id: str) -> dict[str, Any]:
    """Keys a provenance entry carries beyond the contract's seven (extra keys may come)."""
    return {"label": f"{source_identity} · {external_id}",
            "link": {"href": f"https://{source_type}.example/people/{external_id}", "rel": "self",
                     "meta": {"fields": ["display_name", "email"], "paged": {}}}}
