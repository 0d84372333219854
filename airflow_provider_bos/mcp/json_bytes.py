"""Byte-level JSON delimiting for :mod:`.final_frame`: where a string or a value ends, in C calls.

No state of the scanner lives here: each function takes a buffer and a position, so one can be
read (and timed) alone. ``text_end`` and ``plain_string_end`` are the text-skip tricks (the
``content[*].text`` copy of the records, ~170 MB at 200k records); ``ValueScan`` is the exact,
resumable delimiter used for small values and for the odd record the boundary cut misses.
"""

from __future__ import annotations

import re

from airflow_provider_bos.mcp.jsonrpc import loads

__all__ = [
    "NOT_WS",
    "QUOTE",
    "BSLASH",
    "LBRACE",
    "RBRACE",
    "LBRACKET",
    "RBRACKET",
    "COMMA",
    "COLON",
    "ValueScan",
    "decode_excerpt",
    "odd_trailing_backslash",
    "plain_string_end",
    "string_end",
    "text_end",
]

STRUCT = re.compile(rb'["{}\[\]]')
SCALAR_END = re.compile(rb"[\s,}\]]")
NOT_WS = re.compile(rb"[^ \t\r\n]")

QUOTE, BSLASH = 0x22, 0x5C
LBRACE, RBRACE, LBRACKET, RBRACKET = 0x7B, 0x7D, 0x5B, 0x5D
COMMA, COLON = 0x2C, 0x3A


def string_end(buf: bytes | bytearray, start: int) -> int:
    """Index of the closing ``"`` of a string whose body starts at ``start`` (not inside an escape), or -1.

    For ordinary strings: ``find`` plus a look at the backslashes before each candidate.
    """
    i = buf.find(b'"', start)
    while i >= 0:
        j = i
        while j > start and buf[j - 1] == BSLASH:
            j -= 1
        if (i - j) % 2 == 0:
            return i
        i = buf.find(b'"', i + 1)
    return -1


def text_end(buf: bytes | bytearray, start: int) -> int:
    """Like :func:`string_end`, for strings full of escaped quotes (JSON inside a JSON string).

    Escaped backslashes, then escaped quotes, are overwritten with same-length filler, so the
    first remaining ``"`` is the closing one: two ``replace`` and one ``find``, all in C.
    (Counting quotes against escaped quotes instead measured no faster: such texts hold an
    escaped backslash before a quote every few kilobytes.)
    """
    i = buf.find(b'"', start)
    if i < 0:
        return -1
    if buf[i - 1] != BSLASH or i == start:
        return i  # the first quote is unescaped (also skips the copies below for short tails)
    block = buf[start:] if start else buf
    if b"\\\\" in block:  # an escaped backslash: neutralise it first
        block = block.replace(b"\\\\", b"..")
    block = block.replace(b'\\"', b"..")
    i = block.find(b'"')
    return i + start if i >= 0 else -1


def plain_string_end(buf: bytes | bytearray, start: int) -> int:
    """An end ``e`` such that ``buf[start:e]`` is a complete JSON string body (so no closing quote), or ``start``.

    orjson validates the piece as ``"`` + piece + ``"`` in one C call (about 4x faster than the
    filler approach of :func:`text_end` on such texts); that parse succeeding is the proof, so
    where the piece is cut only decides how often it succeeds: before a trailing escape or
    UTF-8 sequence, which the next bytes complete.
    """
    end = len(buf)
    j = buf.rfind(b"\\", max(start, end - 6), end)  # a "\\uXXXX" escape may be incomplete
    if j >= 0:
        while j > start and buf[j - 1] == BSLASH:
            j -= 1
        end = j
    k = end
    while k > start and buf[k - 1] & 0xC0 == 0x80:  # UTF-8 continuation bytes
        k -= 1
    if k > start and buf[k - 1] >= 0xC0:
        end = k - 1
    if end - start < 4096:  # not worth a try (the string's end is near, or the buffer is small)
        return start
    piece = bytearray(b'"')
    piece += buf[start:end]
    piece += b'"'
    try:
        loads(piece)
    except ValueError:
        return start
    return end


def odd_trailing_backslash(buf: bytes | bytearray, start: int) -> bool:
    """True if ``buf[start:]`` (scanned from an escape boundary) ends inside an escape sequence."""
    n = len(buf)
    run = 0
    while n - run - 1 >= start and buf[n - run - 1] == BSLASH:
        run += 1
    return run % 2 == 1


class ValueScan:
    """Exact, resumable delimiting of one JSON value starting at ``start`` in the buffer."""

    __slots__ = ("start", "pos", "depth", "in_string", "escaped", "scalar")

    def __init__(self, start: int, first: int) -> None:
        self.start = start
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.scalar = first not in (LBRACE, LBRACKET, QUOTE)

    def shift(self, n: int) -> None:
        self.start -= n
        self.pos -= n

    def run(self, buf: bytearray, eof: bool) -> int:
        """The end (exclusive) of the value, or -1 if it needs more bytes."""
        if self.scalar:
            m = SCALAR_END.search(buf, self.pos)
            if m is not None:
                return m.start()
            self.pos = len(buf)
            return len(buf) if eof else -1
        pos = self.pos
        n = len(buf)
        while True:
            if self.in_string:
                if self.escaped:
                    if pos >= n:
                        self.pos = pos
                        return -1
                    pos += 1
                    self.escaped = False
                q = string_end(buf, pos)
                if q < 0:
                    self.escaped = odd_trailing_backslash(buf, pos)
                    self.pos = n
                    return -1
                pos = q + 1
                self.in_string = False
                if self.depth == 0:  # a string value
                    return pos
                continue
            m = STRUCT.search(buf, pos)
            if m is None:
                self.pos = n
                return -1
            pos = m.end()
            c = buf[pos - 1]
            if c == QUOTE:
                self.in_string = True
            elif c in (LBRACE, LBRACKET):
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    return pos


def decode_excerpt(raw: bytes) -> str:
    """The start of a skipped text as a string (best effort; used only in error messages).

    The cut may split an escape: back off up to 12 bytes (a surrogate pair, ``\\uXXXX\\uXXXX``).
    """
    for cut in range(len(raw), max(len(raw) - 13, -1), -1):
        try:
            value = loads(b'"' + raw[:cut] + b'"')
            return value if isinstance(value, str) else ""
        except ValueError:
            continue
    return raw.decode("utf-8", "replace")
