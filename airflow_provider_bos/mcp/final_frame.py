"""Incremental scanner for the final JSON-RPC frame of a federated read.

The final response holds every record twice: ``content[0].text`` (the JSON of
``structuredContent`` as one JSON string) and ``structuredContent`` itself. A 1M-record result is
over 1 GB in ONE frame, so :class:`FinalFrameScanner` is fed the frame's bytes as they arrive and:

- yields each element of the records array (``structuredContent.result`` for direct tools,
  ``structuredContent.result.result`` for ``bos_execute``) as soon as its bytes are complete,
  decoded with orjson;
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
  delimited exactly instead. So every record's exact bytes are known: their SHA-256, provenance
  stamps blanked, is the record's *wire hash* (:func:`airflow_provider_bos.wire.wire_hash`);
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

The byte-level searches are :mod:`.json_bytes`'s; handing the open response over and pulling
the rest of the frame is :mod:`.final_stream`'s. Why this module is above ~500 lines: the scanner
is one resumable state machine over one buffer and position (the walk, the text skip, the record
cut all move the same ``_pos``); split, each part would reach into the others' state. Its states
(:class:`NodeState` per descended container, :class:`RecordState` for the records array; a
nested value stored sets its container to NEXT, its end sets NEXT again)::

    object   FIRST --"k"--> COLON --:--> VALUE --value--> NEXT --,--> KEY --"k"--> COLON ...
             FIRST, NEXT --}--> closed
    array    FIRST, VALUE --value--> NEXT --,--> VALUE;      FIRST, NEXT --]--> closed
    records  FIRST, VALUE --record--> NEXT --,--> VALUE;     FIRST, NEXT --]--> closed
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from airflow_provider_bos.exceptions import BosResultError
from airflow_provider_bos.mcp.json_bytes import (
    BSLASH,
    COLON,
    COMMA,
    LBRACE,
    LBRACKET,
    NOT_WS,
    QUOTE,
    RBRACE,
    RBRACKET,
    ValueScan,
    decode_excerpt,
    odd_trailing_backslash,
    plain_string_end,
    string_end,
    text_end,
)
from airflow_provider_bos.mcp.jsonrpc import loads
from airflow_provider_bos.wire import (
    KnownRecord,
    KnownWireHashes,
    WireRecord,
    check_record,
    latest_stamp,
)
from airflow_provider_bos.wire import wire_hash as masked_wire_hash

__all__ = ["FinalFrameScanner", "KnownRecord", "WireRecord", "DEFAULT_MAX_VALUE_BYTES", "check_record", "known_record",
           "value_bound"]

DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024


def value_bound(max_event_bytes: int) -> int:
    """The most one captured value or record of a frame may hold under a session's ``max_event_bytes``."""
    return min(max_event_bytes, DEFAULT_MAX_VALUE_BYTES)

_TEXT_EXCERPT = 2048
# With no boundary in sight, wait for this much more of the frame before delimiting the next
# element exactly (the last record is followed by no boundary; usually the frame ends first).
_TAIL_WAIT = 1024 * 1024
# How a KnownRecord's record_ref is read without decoding the record: it must come first.
_REF_PREFIX = b'{"record_ref":"'

# The message's kind, by the first top-level key that tells (see FinalFrameScanner).
_KINDS = {"result": "response", "error": "error", "method": "notification"}
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


# The scanner's states (the diagram: the module docstring), compared by identity via these aliases.
NodeState = Enum("NodeState", "FIRST KEY COLON VALUE NEXT")  # in a descended object or array
RecordState = Enum("RecordState", "FIRST VALUE NEXT")  # in the records array
_FIRST, _KEY, _COLON, _VALUE, _NEXT = NodeState
_R_FIRST, _R_VALUE, _R_NEXT = RecordState


def _malformed(detail: str) -> BosResultError:
    return BosResultError(f"The final response is not valid JSON ({detail}).")


@dataclass(slots=True, eq=False)
class _Node:
    path: tuple[str, ...]
    container: Any
    is_obj: bool
    state: NodeState = _FIRST
    key: str | None = None


def known_record(
    piece: bytes | bytearray, wire_hash: str, known: KnownWireHashes, handle: object,
    stamps: list[bytes | bytearray] | None = None,
) -> KnownRecord | None:
    """A KnownRecord for a record's exact bytes if its record_ref (the first key) and its stamps are
    readable undecoded (a stamp that is no timestamp: the record is decoded, and refused as such).
    ``stamps``: those :func:`~airflow_provider_bos.wire.wire_hash` gave along with ``wire_hash``."""
    if not piece.startswith(_REF_PREFIX):
        return None
    start = len(_REF_PREFIX)
    end = piece.find(b'"', start)
    if end <= start:
        return None
    raw_ref = piece[start:end]
    if BSLASH in raw_ref:  # an escape: decode it properly
        end = string_end(piece, start)
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
    try:
        if stamps is None:
            stamps = []
            masked_wire_hash(piece, stamps)
        observed = latest_stamp(stamps)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return KnownRecord(ref, wire_hash, known, handle, observed)


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
        self._buf = bytearray()
        self._pos = 0
        self._stack: list[_Node] = []
        self._started = False
        self._done = False
        # The value being captured, the text being skipped, or the records array being read.
        self._scan: ValueScan | None = None
        self._text: dict[str, Any] | None = None
        self._records: _Node | None = None
        self._record_state = _R_FIRST
        self._record_scan: ValueScan | None = None
        self._sep: bytes | None = None  # learned: "}" + separator + first key of the 2nd record
        self._gap = 0  # bytes between a record's "}" and the next one's "{"
        self._unparsed_at = -1  # buffer position of a cut piece that did not parse
        self._tail_wait = min(_TAIL_WAIT, max_value_bytes)
        self._first_key: bytes | None = None
        self._last_end: int | None = None  # end of the last exactly delimited record (while _sep is None)
        self._out: list[Any] = []
        self._scan_node: _Node | None = None

    # -- public API -------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Consume bytes of the frame; return the records they complete (decoded, in order)."""
        if not data:
            return []
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
        if NOT_WS.search(self._buf, self._pos) is not None:
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
        m = NOT_WS.search(buf, pos)
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
                if self._buf[self._pos] != LBRACE:
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
            if state is _FIRST or state is _KEY:
                if c == RBRACE and state is _FIRST:
                    return self._close()
                if c != QUOTE:
                    raise _malformed(f"expected a key, found {chr(c)!r}")
                end = string_end(buf, self._pos + 1)
                if end < 0:
                    if len(buf) - self._pos > self.max_value_bytes:
                        raise BosResultError("A key of the final response is too long.")
                    return False
                try:
                    node.key = loads(bytes(buf[self._pos : end + 1]))
                except ValueError:
                    raise _malformed("bad key") from None
                self._pos = end + 1
                node.state = _COLON
                return True
            if state is _COLON:
                if c != COLON:
                    raise _malformed(f"expected ':', found {chr(c)!r}")
                self._pos += 1
                node.state = _VALUE
                return True
            if state is _VALUE:
                assert node.key is not None
                if not node.path:  # a top-level key: the first that tells decides the kind
                    self.kind = self.kind or _KINDS.get(node.key)
                return self._value(node, (*node.path, node.key), c)
            # NEXT
            if c == COMMA:
                self._pos += 1
                node.state = _KEY
                return True
            if c == RBRACE:
                return self._close()
            raise _malformed(f"expected ',' or '}}', found {chr(c)!r}")
        # array
        if state is _FIRST or state is _VALUE:
            if c == RBRACKET and state is _FIRST:
                return self._close()
            return self._value(node, (*node.path, "*"), c)
        if c == COMMA:
            self._pos += 1
            node.state = _VALUE
            return True
        if c == RBRACKET:
            return self._close()
        raise _malformed(f"expected ',' or ']', found {chr(c)!r}")

    def _close(self) -> bool:
        self._pos += 1
        self._stack.pop()
        if self._stack:
            self._stack[-1].state = _NEXT
        else:
            self._done = True
        return True

    def _store(self, node: _Node, value: Any) -> None:
        if node.is_obj:
            node.container[node.key] = value
        else:
            node.container.append(value)
        node.state = _NEXT

    def _value(self, node: _Node, path: tuple[str, ...], c: int) -> bool:
        action = self._plan.get(path, _CAPTURE)
        if self.kind == "notification":
            action = _CAPTURE
        if action == _DESCEND and c in (LBRACE, LBRACKET):
            is_obj = c == LBRACE
            container: Any = {} if is_obj else []
            self._store(node, container)
            self._pos += 1
            self._stack.append(_Node(path, container, is_obj))
            return True
        if action == _RECORDS and c == LBRACKET:
            self.records_arrays += 1
            if self.records_arrays > 1:
                raise BosResultError(f"The final response holds more than one record array at {self.records_where}.")
            self._store(node, [])
            self._pos += 1
            self._records = node
            self._record_state = _R_FIRST
            return True
        if action == _TEXT and c == QUOTE:
            self._text = {"node": node, "excerpt": bytearray(), "escaped": False}
            self._pos += 1
            return True
        self._scan = ValueScan(self._pos, c)
        self._scan_node = node
        return self._finish_capture(False)

    def _finish_capture(self, eof: bool) -> bool:
        scan, node = self._scan, self._scan_node
        assert scan is not None and node is not None
        end = scan.run(self._buf, eof)
        if end < 0:
            if len(self._buf) - scan.start > self.max_value_bytes:
                raise BosResultError(
                    f"A value of a streamed {self.kind or 'message'} exceeds {self.max_value_bytes} bytes: the "
                    "bound is max_event_bytes (a bos Connection's 'Largest event (MiB)', max_event_mib), "
                    f"never over {DEFAULT_MAX_VALUE_BYTES} bytes."
                )
            return False
        raw = bytes(self._buf[scan.start : end])
        try:
            value = loads(raw)
        except ValueError:
            raise _malformed(f"a value does not parse: {raw[:60]!r}") from None
        self._pos = end
        self._scan = None
        self._store(node, value)
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
        plain = plain_string_end(buf, pos)
        if plain > pos:  # no closing quote up to there, and it ends between escapes
            if len(excerpt) < _TEXT_EXCERPT:
                excerpt += buf[self._pos : min(plain, self._pos + _TEXT_EXCERPT - len(excerpt))]
            self._pos = plain
            return False
        q = text_end(buf, pos)
        end = q if q >= 0 else len(buf)
        if len(excerpt) < _TEXT_EXCERPT:
            excerpt += buf[self._pos : min(end, self._pos + _TEXT_EXCERPT - len(excerpt))]
        if q < 0:
            text["escaped"] = odd_trailing_backslash(buf, pos)
            self._pos = len(buf)
            return False
        self._pos = q + 1
        self._text = None
        self._store(text["node"], decode_excerpt(bytes(excerpt)))
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
                self._record_state = _R_NEXT
                if self._sep is None:
                    # The boundary is learnt from the gap between two ADJACENT elements: the end
                    # of the one just delimited (a stale end would put whole records into it).
                    self._last_end = end
                continue
            if not self._skip_ws():
                return False
            c = buf[self._pos]
            state = self._record_state
            if state is _R_NEXT and c == COMMA:
                self._pos += 1
                self._record_state = _R_VALUE
                continue
            if c == RBRACKET and state is not _R_VALUE:  # the array ends (FIRST: an empty one)
                self._pos += 1
                node = self._records
                assert node is not None
                self._records = None
                node.state = _NEXT
                return True
            if state is _R_NEXT:
                raise _malformed(f"expected ',' or ']' in the record array, found {chr(c)!r}")
            if c == RBRACKET:
                raise _malformed("a trailing comma in the record array")
            if self._first_key is None and c == LBRACE:
                # Remember how the first record starts ("{" and its first key), to spot boundaries.
                m = NOT_WS.search(buf, self._pos + 1)
                if m is not None and buf[m.start()] == QUOTE:
                    key_end = string_end(buf, m.start() + 1)
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
            self._record_scan = ValueScan(self._pos, c)

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
        # An empty set (a first sync) is not asked: 200k lookups that cannot hit cost ~0.3 s.
        match = known.match if known else None
        stamps: list[bytes | bytearray] = []  # the stamps of the piece just hashed (a claim's observation time)
        pos = start = self._pos
        cut = 0
        while True:
            j = find(sep, pos)
            if j < 0:
                break
            piece = buf[pos : j + 1]
            if match is None:
                wire_hash = masked_wire_hash(piece)
            else:
                stamps.clear()
                wire_hash = masked_wire_hash(piece, stamps)
                handle = match(wire_hash)
                if handle is not None and known is not None:
                    claim = known_record(piece, wire_hash, known, handle, stamps)
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
            self._record_state = _R_VALUE
        return pos != start

    def _emit_one(self, raw: bytes) -> None:
        """One exactly delimited element (the first, the last, any the cuts missed)."""
        stamps: list[bytes | bytearray] = []
        wire_hash = masked_wire_hash(raw, stamps)
        known = self.known
        handle = known.match(wire_hash) if known else None
        claim = known_record(raw, wire_hash, known, handle, stamps) if known and handle is not None else None
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
