"""A parser for ``WWW-Authenticate`` challenges (RFC 9110 §11.6.1).

``challenge = auth-scheme [ 1*SP ( token68 / #auth-param ) ]`` and
``auth-param = token BWS "=" BWS ( token / quoted-string )``; several challenges may share one
header, separated by commas, and a response may carry several headers. Parameter names are
case-insensitive; quoted strings unescape ``\\x`` to ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Challenge", "parse_www_authenticate"]

_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TOKEN68 = frozenset("-._~+/0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_WS = " \t"


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str  # lower-case
    params: dict[str, str] = field(default_factory=dict)  # names lower-case; first occurrence wins
    token68: str | None = None


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip(self, chars: str) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1

    def token(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _TCHAR:
            self.pos += 1
        return self.text[start : self.pos]

    def quoted(self) -> str:
        # Caller checked the opening quote. An unterminated string takes the rest of the header.
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            self.pos += 1
            if char == "\\" and self.pos < len(self.text):
                out.append(self.text[self.pos])
                self.pos += 1
            elif char == '"':
                break
            else:
                out.append(char)
        return "".join(out)

    def at_param(self) -> bool:
        """Whether an ``auth-param`` (``token BWS "="``, not a token68 padding) starts here."""
        saved = self.pos
        try:
            if not self.token():
                return False
            self.skip(_WS)
            if self.peek() != "=":
                return False
            # "abc==" or "abc=" followed by end/comma is token68 padding, not a parameter.
            self.pos += 1
            self.skip(_WS)
            return self.peek() not in ("", ",", "=")
        finally:
            self.pos = saved


def _parse_header(text: str, into: list[Challenge]) -> None:
    scanner = _Scanner(text)
    while True:
        scanner.skip(_WS + ",")
        if not scanner.peek():
            return
        scheme = scanner.token()
        if not scheme:
            # Garbage: skip to the next comma and try again.
            while scanner.peek() not in ("", ","):
                scanner.pos += 1
            continue
        scanner.skip(_WS)
        params: dict[str, str] = {}
        token68: str | None = None
        if scanner.peek() and scanner.peek() != "," and not scanner.at_param():
            start = scanner.pos
            while scanner.peek() and scanner.peek() in _TOKEN68:
                scanner.pos += 1
            scanner.skip("=")
            token68 = scanner.text[start : scanner.pos] or None
        else:
            while scanner.at_param():
                name = scanner.token().lower()
                scanner.skip(_WS)
                scanner.pos += 1  # "="
                scanner.skip(_WS)
                value = scanner.quoted() if scanner.peek() == '"' else scanner.token()
                params.setdefault(name, value)
                scanner.skip(_WS)
                if scanner.peek() != ",":
                    break
                # After a comma: another parameter of this challenge, or the next challenge.
                after_comma = scanner.pos
                scanner.pos += 1
                scanner.skip(_WS + ",")
                if not scanner.at_param():
                    scanner.pos = after_comma
                    break
        into.append(Challenge(scheme=scheme.lower(), params=params, token68=token68))
        # Skip anything unparseable up to the next comma (robustness, not leniency on values).
        while scanner.peek() not in ("", ","):
            scanner.pos += 1


def parse_www_authenticate(headers: list[str] | str) -> list[Challenge]:
    """All challenges in one or more ``WWW-Authenticate`` header values, in order."""
    values = [headers] if isinstance(headers, str) else headers
    challenges: list[Challenge] = []
    for value in values:
        _parse_header(value, challenges)
    return challenges
