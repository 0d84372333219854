"""Incremental scanner for the final JSON-RPC frame of a federated read.

The final response holds every record twice: ``content[0].text`` (the JSON of
``structuredContent`` as one JSON string) and ``structuredContent`` itself. A 1M-record result is
over 1 GB in ONE frame, so :class:`FinalFrameScanner` is fed the frame's bytes as they arrive and:

- yields each element of the records array (``structuredContent.result`` for direct tools,
  ``structuredContent.result.result`` for ``bos_execute``) as soon as its bytes are complete,
  decoded with orjson (stdlib json without it);
- skips every ``content[*].text`` string without materialising it (only a short excerpt is kept,
  for the error message of a failed call);
- captures everything else (``id``, ``isError``, ``resultType``, ``_meta``, ``context``,
  ``metadata``...) as a small *skeleton* of the message, whose records array is left empty, for
  validation once the frame is complete (:meth:`FinalFrameScanner.finish`).

Any key order works. Memory is bounded by the largest single record or captured value
(``max_value_bytes``) plus one network chunk.

Speed, without a per-byte Python loop:

- records: each element is cut at the next likely boundary (``}`` + the separator + the first
  key, learned between the first two records) and parsed alone with orjson. Each cut starts at a
  real element start, so a piece that parses IS the whole element: a boundary guessed inside a
  string or a nested value leaves the piece unbalanced and the parse fails; the element is then
  delimited exactly instead. So every record's exact bytes are known: their SHA-256 is the
  record's *wire hash* (:mod:`airflow_provider_bos.wire`);
- known records: given the warehouse's stored wire hashes (:attr:`FinalFrameScanner.known`), a
  piece whose hash is among them is not decoded at all: only its leading ``record_ref`` is read
  and a :class:`~airflow_provider_bos.wire.KnownRecord` claim is handed out (the warehouse
  verifies it in SQL);
- the skipped text: each chunk of it is proven quote-free by orjson parsing ``"`` + chunk +
  ``"`` in one call; where that fails (the chunk holding the end), escaped backslashes and
  escaped quotes are overwritten by same-length filler (``bytes.replace``), after which the first
  ``"`` is the closing quote (``bytes.find``);
- exact delimiting (small values, the odd record): a compiled regex finds structural
  characters, strings are skipped with the same closing-quote search.
"""

from __future__ import annotations

import re
from hashlib import sha256
from typing import Any, Literal

from airflow_provider_bos.exceptions import BosResultError
from airflow_provider_bos.mcp.jsonrpc import loads
from airflow_provider_bos.wire import KnownRecord, KnownWireHashes, WireRecord, check_record

__all__ = ["FinalFrameScanner", "KnownRecord", "WireRecord", "DEFAULT_MAX_VALUE_BYTES", "check_record"]

DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
_TEXT_EXCERPT = 2048
# With no boundary in sight, wait for this much more of the frame before delimiting the next
# element exactly (the last record is followed by no boundary; usually the frame ends first).
_TAIL_WAIT = 1024 * 1024
# How a KnownRecord's record_ref is read without decoding the record: it must come first.
_REF_PREFIX = b'{"record_ref":"'

_STRUCT = re.compile(rb'["{}\[\]]')
_SCALAR_END = re.compile(rb"[\s,}\]]")
_NOT_WS = re.compile(rb"[^ \t\r\n]")

_QUOTE, _BSLASH = 0x22, 0x5C
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 0x7B, 0x7D, 0x5B, 0x5D
_COMMA, _COLON = 0x2C, 0x3A

# What to do with a value, by its path (tuples of keys; "*" is any array element).
_DESCEND, _CAPTURE, _TEXT, _RECORDS = "descend", "capture", "text", "records"


def _plan(tool_style: str) -> dict[tuple[str, ...], str]:
    plan = {
        ("result",): _DESCEND,
        ("result", "content"): _DESCEND,
        ("result", "content", "*"): _DESCEND,
        ("result", "content", "*", "text"): _TEXT,
        ("result", "structuredContent"): _DESCEND,
    }
    if tool_style == "execute":
        plan[("result", "structuredContent", "result")] = _DESCEND
        plan[("result", "structuredContent", "result", "result")] = _RECORDS
    else:
        plan[("result", "structuredContent", "result")] = _RECORDS
    return plan


def _malformed(detail: str) -> BosResultError:
    return BosResultError(f"The final response is not valid JSON ({detail}).")


def _string_end(buf: bytes | bytearray, start: int) -> int:
    """Index of the closing ``"`` of a string whose body starts at ``start`` (not inside an escape), or -1.

    For ordinary strings: ``find`` plus a look at the backslashes before each candidate.
    """
    i = buf.find(b'"', start)
    while i >= 0:
        j = i
        while j > start and buf[j - 1] == _BSLASH:
            j -= 1
        if (i - j) % 2 == 0:
            return i
        i = buf.find(b'"', i + 1)
    return -1


def _text_end(buf: bytes | bytearray, start: int) -> int:
    """Like :func:`_string_end`, for strings full of escaped quotes (JSON inside a JSON string).

    Escaped backslashes, then escaped quotes, are overwritten with same-length filler, so the
    first remaining ``"`` is the closing one: two ``replace`` and one ``find``, all in C.
    (Counting quotes against escaped quotes instead measured no faster: such texts hold an
    escaped backslash before a quote every few kilobytes.)
    """
    i = buf.find(b'"', start)
    if i < 0:
        return -1
    if buf[i - 1] != _BSLASH or i == start:
        return i  # the first quote is unescaped (also skips the copies below for short tails)
    block = buf[start:] if start else buf
    if b"\\\\" in block:  # an escaped backslash: neutralise it first
        block = block.replace(b"\\\\", b"..")
    block = block.replace(b'\\"', b"..")
    i = block.find(b'"')
    return i + start if i >= 0 else -1


def _plain_string_end(buf: bytes | bytearray, start: int) -> int:
    """An end ``e`` such that ``buf[start:e]`` is a complete JSON string body (so no closing quote), or ``start``.

    orjson validates the piece as ``"`` + piece + ``"`` in one C call (about 4x faster than the
    filler approach of :func:`_text_end` on such texts); that parse succeeding is the proof, so
    where the piece is cut only decides how often it succeeds: before a trailing escape or
    UTF-8 sequence, which the next bytes complete.
    """
    end = len(buf)
    j = buf.rfind(b"\\", max(start, end - 6), end)  # a "\\uXXXX" escape may be incomplete
    if j >= 0:
        while j > start and buf[j - 1] == _BSLASH:
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


def _odd_trailing_backslash(buf: bytes | bytearray, start: int) -> bool:
    """True if ``buf[start:]`` (scanned from an escape boundary) ends inside an escape sequence."""
    n = len(buf)
    run = 0
    while n - run - 1 >= start and buf[n - run - 1] == _BSLASH:
        run += 1
    return run % 2 == 1


class _Node:
    __slots__ = ("path", "container", "is_obj", "state", "key")

    def __init__(self, path: tuple[str, ...], container: Any, is_obj: bool) -> None:
        self.path = path
        self.container = container
        self.is_obj = is_obj
        # obj: "first" (after "{"), "key" (after ","), "colon", "value", "next" (after a value)
        # arr: "first" (after "["), "value" (after ","), "next"
        self.state = "first"
        self.key: str | None = None


class _ValueScan:
    """Exact, resumable delimiting of one JSON value starting at ``start`` in the buffer."""

    __slots__ = ("start", "pos", "depth", "in_string", "escaped", "scalar")

    def __init__(self, start: int, first: int) -> None:
        self.start = start
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.scalar = first not in (_LBRACE, _LBRACKET, _QUOTE)

    def shift(self, n: int) -> None:
        self.start -= n
        self.pos -= n

    def run(self, buf: bytearray, eof: bool) -> int:
        """The end (exclusive) of the value, or -1 if it needs more bytes."""
        if self.scalar:
            m = _SCALAR_END.search(buf, self.pos)
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
                q = _string_end(buf, pos)
                if q < 0:
                    self.escaped = _odd_trailing_backslash(buf, pos)
                    self.pos = n
                    return -1
                pos = q + 1
                self.in_string = False
                if self.depth == 0:  # a string value
                    return pos
                continue
            m = _STRUCT.search(buf, pos)
            if m is None:
                self.pos = n
                return -1
            pos = m.end()
            c = buf[pos - 1]
            if c == _QUOTE:
                self.in_string = True
            elif c == _LBRACE or c == _LBRACKET:
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    return pos


def _known_record(piece: bytes | bytearray, wire_hash: str, known: KnownWireHashes, handle: object) -> KnownRecord | None:
    """A KnownRecord for a record's exact bytes if its record_ref (the first key) is readable undecoded."""
    if not piece.startswith(_REF_PREFIX):
        return None
    start = len(_REF_PREFIX)
    end = piece.find(b'"', start)
    if end <= start:
        return None
    raw_ref = piece[start:end]
    if _BSLASH in raw_ref:  # an escape: decode it properly
        end = _string_end(piece, start)
        try:
            ref = loads(piece[start - 1 : end + 1]) if end > start else None
        except ValueError:
            return None
        if type(ref) is not str or not ref:
            return None
    else:
        try:
            ref = raw_ref.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return KnownRecord(ref, wire_hash, known, handle)


class FinalFrameScanner:
    """Push bytes of one JSON-RPC message in with :meth:`feed`; take records from its return value.

    ``kind`` is decided by the first top-level key that tells: ``"response"`` (``result``),
    ``"error"`` (``error``) or ``"notification"`` (``method``; also server-to-client requests).
    A notification or error is simply captured whole (bounded by ``max_value_bytes`` per value).
    """

    def __init__(
        self,
        *,
        tool_style: Literal["execute", "direct"],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        known: KnownWireHashes | None = None,
    ) -> None:
        if tool_style not in ("execute", "direct"):
            raise ValueError("tool_style must be 'execute' or 'direct'")
        self.tool_style = tool_style
        self.max_value_bytes = max_value_bytes
        self.records_where = (
            "structuredContent.result.result" if tool_style == "execute" else "structuredContent.result"
        )
        self._plan = _plan(tool_style)
        self.kind: str | None = None
        self.message: dict[str, Any] = {}
        self.records_seen = 0
        # Wire hashes the warehouse already stores (set before the records arrive; may be None).
        self.known = known
        self.known_records = 0  # how many records were handed out as KnownRecord claims
        self.records_arrays = 0
        self.bytes_fed = 0
        self._buf = bytearray()
        self._pos = 0
        self._stack: list[_Node] = []
        self._started = False
        self._done = False
        # The value being captured, the text being skipped, or the records array being read.
        self._scan: _ValueScan | None = None
        self._text: dict[str, Any] | None = None
        self._records: _Node | None = None
        self._record_state = "first"  # "first" (after "["), "value" (after ","), "next"
        self._record_scan: _ValueScan | None = None
        self._sep: bytes | None = None  # learned: "}" + separator + first key of the 2nd record
        self._gap = 0  # bytes between a record's "}" and the next one's "{"
        self._unparsed_at = -1  # buffer position of a cut piece that did not parse
        self._tail_wait = min(_TAIL_WAIT, max_value_bytes)
        self._first_key: bytes | None = None
        self._last_end: int | None = None  # end of the last exactly delimited record (while _sep is None)
        self._out: list[Any] = []
        self._scan_node: _Node | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The top-level JSON value is complete."""
        return self._done

    @property
    def captured_id(self) -> Any:
        return self.message.get("id")

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Consume bytes of the frame; return the records they complete (decoded, in order)."""
        if not data:
            return []
        self.bytes_fed += len(data)
        self._buf += data
        self._run(eof=False)
        self._trim()
        out, self._out = self._out, []
        return out

    def flush(self) -> list[Any]:
        """All of the frame has been fed: return the records only its end completes (the last ones).

        Call it once after the last :meth:`feed` and before :meth:`finish` (the last record has
        no boundary after it, so it is delimited only now).
        """
        if not self._done:
            self._run(eof=True)
        out, self._out = self._out, []
        return out

    def finish(self) -> dict[str, Any]:
        """End of the frame: return the skeleton message (records array empty) or raise if incomplete.

        Records still held (:meth:`flush` not called) are an error: they would be lost.
        """
        self._run(eof=True)
        if not self._done:
            if not self._started:
                raise _malformed("the frame is empty")
            raise BosResultError("The final response ended before its JSON was complete.")
        if _NOT_WS.search(self._buf, self._pos) is not None:
            raise _malformed("data after the top-level value")
        if self._out:  # pragma: no cover - records are always handed out by feed()
            raise BosResultError("Internal error: records were left in the scanner.")
        return self.message

    # -- the walk ---------------------------------------------------------------------------

    def _trim(self) -> None:
        keep = self._pos
        for scan in (self._scan, self._record_scan):
            if scan is not None:
                keep = min(keep, scan.start)
        if self._sep is None and self._last_end is not None:
            keep = min(keep, self._last_end)
        if keep > 65536 or (keep and keep == len(self._buf)):
            del self._buf[:keep]
            self._pos -= keep
            for scan in (self._scan, self._record_scan):
                if scan is not None:
                    scan.shift(keep)
            if self._last_end is not None:
                self._last_end -= keep

    def _skip_ws(self) -> bool:
        """Move to the next non-whitespace byte; False if the buffer ran out."""
        buf, pos = self._buf, self._pos
        if pos < len(buf) and buf[pos] not in b" \t\r\n":
            return True
        m = _NOT_WS.search(buf, pos)
        if m is None:
            self._pos = len(buf)
            return False
        self._pos = m.start()
        return True

    def _run(self, *, eof: bool) -> None:
        while not self._done:
            if self._text is not None:
                if not self._skip_text():
                    return
                continue
            if self._scan is not None:
                if not self._finish_capture(eof):
                    return
                continue
            if self._records is not None:
                if not self._read_records(eof):
                    return
                continue
            if not self._skip_ws():
                return
            if not self._started:
                if self._buf[self._pos] != _LBRACE:
                    raise BosResultError("The final response is not a JSON object.")
                self._pos += 1
                self._started = True
                self._stack.append(_Node((), self.message, True))
                continue
            if not self._step(eof):
                return

    def _step(self, eof: bool) -> bool:
        """One structural token in a descended container; False if more bytes are needed."""
        node = self._stack[-1]
        buf = self._buf
        c = buf[self._pos]
        state = node.state
        if node.is_obj:
            if state in ("first", "key"):
                if c == _RBRACE and state == "first":
                    return self._close()
                if c != _QUOTE:
                    raise _malformed(f"expected a key, found {chr(c)!r}")
                end = _string_end(buf, self._pos + 1)
                if end < 0:
                    if len(buf) - self._pos > self.max_value_bytes:
                        raise BosResultError("A key of the final response is too long.")
                    return False
                try:
                    node.key = loads(bytes(buf[self._pos : end + 1]))
                except ValueError:
                    raise _malformed("bad key") from None
                self._pos = end + 1
                node.state = "colon"
                return True
            if state == "colon":
                if c != _COLON:
                    raise _malformed(f"expected ':', found {chr(c)!r}")
                self._pos += 1
                node.state = "value"
                return True
            if state == "value":
                assert node.key is not None
                if not node.path:
                    self._decide_kind(node.key)
                return self._value(node, node.path + (node.key,), c)
            # "next"
            if c == _COMMA:
                self._pos += 1
                node.state = "key"
                return True
            if c == _RBRACE:
                return self._close()
            raise _malformed(f"expected ',' or '}}', found {chr(c)!r}")
        # array
        if state in ("first", "value"):
            if c == _RBRACKET and state == "first":
                return self._close()
            return self._value(node, node.path + ("*",), c)
        if c == _COMMA:
            self._pos += 1
            node.state = "value"
            return True
        if c == _RBRACKET:
            return self._close()
        raise _malformed(f"expected ',' or ']', found {chr(c)!r}")

    def _decide_kind(self, key: str) -> None:
        if self.kind is None:
            if key == "result":
                self.kind = "response"
            elif key == "error":
                self.kind = "error"
            elif key == "method":
                self.kind = "notification"

    def _close(self) -> bool:
        self._pos += 1
        self._stack.pop()
        if self._stack:
            self._stack[-1].state = "next"
        else:
            self._done = True
        return True

    def _store(self, node: _Node, value: Any) -> None:
        if node.is_obj:
            node.container[node.key] = value
        else:
            node.container.append(value)
        node.state = "next"

    def _value(self, node: _Node, path: tuple[str, ...], c: int) -> bool:
        action = self._plan.get(path, _CAPTURE)
        if self.kind == "notification":
            action = _CAPTURE
        if action == _DESCEND and c in (_LBRACE, _LBRACKET):
            is_obj = c == _LBRACE
            container: Any = {} if is_obj else []
            self._store(node, container)
            self._pos += 1
            self._stack.append(_Node(path, container, is_obj))
            return True
        if action == _RECORDS and c == _LBRACKET:
            self.records_arrays += 1
            if self.records_arrays > 1:
                raise BosResultError(f"The final response holds more than one record array at {self.records_where}.")
            self._store(node, [])
            self._pos += 1
            self._records = node
            self._record_state = "first"
            return True
        if action == _TEXT and c == _QUOTE:
            self._text = {"node": node, "excerpt": bytearray(), "escaped": False}
            self._pos += 1
            return True
        self._scan = _ValueScan(self._pos, c)
        self._scan_node = node
        return self._finish_capture(False)

    def _finish_capture(self, eof: bool) -> bool:
        scan = self._scan
        assert scan is not None
        end = scan.run(self._buf, eof)
        if end < 0:
            if len(self._buf) - scan.start > self.max_value_bytes:
                raise BosResultError(
                    f"A value of the final response exceeds {self.max_value_bytes} bytes; "
                    "raise max_event_bytes if such values are expected."
                )
            return False
        raw = bytes(self._buf[scan.start : end])
        try:
            value = loads(raw)
        except ValueError:
            raise _malformed(f"a value does not parse: {raw[:60]!r}") from None
        self._pos = end
        self._scan = None
        self._store(self._scan_node, value)
        return True

    def _skip_text(self) -> bool:
        """Skip a content text string (keeping only an excerpt); False if more bytes are needed."""
        text = self._text
        assert text is not None
        buf = self._buf
        pos = self._pos
        if text["escaped"]:
            if pos >= len(buf):
                return False
            pos += 1
            text["escaped"] = False
        excerpt: bytearray = text["excerpt"]
        plain = _plain_string_end(buf, pos)
        if plain > pos:  # no closing quote up to there, and it ends between escapes
            if len(excerpt) < _TEXT_EXCERPT:
                excerpt += buf[self._pos : min(plain, self._pos + _TEXT_EXCERPT - len(excerpt))]
            self._pos = plain
            return False
        q = _text_end(buf, pos)
        end = q if q >= 0 else len(buf)
        if len(excerpt) < _TEXT_EXCERPT:
            excerpt += buf[self._pos : min(end, self._pos + _TEXT_EXCERPT - len(excerpt))]
        if q < 0:
            text["escaped"] = _odd_trailing_backslash(buf, pos)
            self._pos = len(buf)
            return False
        self._pos = q + 1
        self._text = None
        self._store(text["node"], _decode_excerpt(bytes(excerpt)))
        return True

    # -- records ----------------------------------------------------------------------------

    def _read_records(self, eof: bool) -> bool:
        """Cut complete elements of the records array; False if more bytes are needed."""
        buf = self._buf
        while True:
            if self._record_scan is not None:
                scan = self._record_scan
                end = scan.run(buf, eof)
                if end < 0:
                    if len(buf) - scan.start > self.max_value_bytes:
                        raise BosResultError(
                            f"A record of the final response exceeds {self.max_value_bytes} bytes."
                        )
                    return False
                self._emit_one(bytes(buf[scan.start : end]))
                self._record_scan = None
                self._pos = end
                self._record_state = "next"
                if self._sep is None:
                    # The boundary is learnt from the gap between two ADJACENT elements: the end
                    # of the one just delimited (a stale end would put whole records into it).
                    self._last_end = end
                continue
            if not self._skip_ws():
                return False
            c = buf[self._pos]
            state = self._record_state
            if state == "next":
                if c == _COMMA:
                    self._pos += 1
                    self._record_state = "value"
                    continue
                if c == _RBRACKET:
                    self._pos += 1
                    node = self._records
                    assert node is not None
                    self._records = None
                    node.state = "next"
                    return True
                raise _malformed(f"expected ',' or ']' in the record array, found {chr(c)!r}")
            if c == _RBRACKET and state == "first":
                self._pos += 1
                node = self._records
                assert node is not None
                self._records = None
                node.state = "next"
                return True
            if c == _RBRACKET:
                raise _malformed("a trailing comma in the record array")
            if self._first_key is None and c == _LBRACE:
                # Remember how the first record starts ("{" and its first key), to spot boundaries.
                m = _NOT_WS.search(buf, self._pos + 1)
                if m is not None and buf[m.start()] == _QUOTE:
                    key_end = _string_end(buf, m.start() + 1)
                    if key_end > 0:
                        self._first_key = bytes(buf[self._pos : key_end + 1])
            elif self._sep is None and self._last_end is not None and self._first_key is not None:
                sep = bytes(buf[self._last_end : self._pos])
                if buf.startswith(self._first_key, self._pos):
                    self._sep = b"}" + sep + self._first_key
                    self._gap = len(sep)
            if self._sep is not None:
                if self._cut():
                    continue
                if self._unparsed_at != self._pos and not eof and len(buf) - self._pos < self._tail_wait:
                    return False  # no boundary in the buffer yet: the next bytes will likely bring one
            self._record_scan = _ValueScan(self._pos, c)

    def _cut(self) -> bool:
        """Cut, hash and decode the records up to the last boundary in the buffer; False if none was cut.

        Stops at a piece that does not parse (a boundary guessed inside a string or a nested
        value; ``_unparsed_at`` marks where): that element is delimited exactly by the caller.
        The per-record loop of the whole read: kept flat, with locals, on purpose.
        """
        buf, sep, gap = self._buf, self._sep, self._gap
        assert sep is not None
        find, parse, out, wire_record = buf.find, loads, self._out, WireRecord
        known = self.known
        match = known.match if known is not None else None
        pos = start = self._pos
        cut = 0
        while True:
            j = find(sep, pos)
            if j < 0:
                break
            piece = buf[pos : j + 1]
            wire_hash = sha256(piece).hexdigest()
            if match is not None:
                handle = match(wire_hash)
                if handle is not None:
                    claim = _known_record(piece, wire_hash, known, handle)
                    if claim is not None:
                        out.append(claim)
                        self.known_records += 1
                        pos = j + 1 + gap
                        cut += 1
                        continue
            try:
                value = parse(piece)
            except ValueError:
                self._unparsed_at = pos
                break  # not a whole element: delimit it exactly
            if type(value) is dict:
                value = wire_record(value)
                value.wire_hash = wire_hash
            out.append(value)  # anything else: check_record says what is wrong with it
            pos = j + 1 + gap
            cut += 1
        if cut:
            self.records_seen += cut
            self._pos = pos
            self._record_state = "value"
        return pos != start

    def _emit_one(self, raw: bytes) -> None:
        """One exactly delimited element (the first, the last, any the cuts missed)."""
        wire_hash = sha256(raw).hexdigest()
        known = self.known
        handle = known.match(wire_hash) if known is not None else None
        claim = _known_record(raw, wire_hash, known, handle) if handle is not None else None
        if claim is not None:
            self.known_records += 1
            self._out.append(claim)
            self.records_seen += 1
            return
        try:
            value = loads(raw)
        except ValueError:
            raise _malformed(f"record {self.records_seen} does not parse") from None
        if type(value) is dict:
            value = WireRecord(value)
            value.wire_hash = wire_hash
        self._out.append(value)
        self.records_seen += 1


def _decode_excerpt(raw: bytes) -> str:
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
