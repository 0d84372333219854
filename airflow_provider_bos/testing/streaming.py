"""Bytes of a federated read: the incremental final frame and the SSE framing (plain and "wire").

The final JSON-RPC response can be very large (the "large" scenario), so it is never built as
one string: :func:`final_frame_pieces` yields it piece by piece, walking the federation's final
records twice (once for ``content[0].text``, the JSON of ``structuredContent`` encoded as a JSON
string, once for ``structuredContent`` itself). The output equals what ``json.dumps`` would
produce for the whole frame.

:class:`SseEmitter` writes events to an ASGI ``send``. In wire mode it exercises every framing
SSE allows: a BOM, CRLF / LF / lone CR line endings varying per event, JSON split over several
``data:`` lines at insignificant-whitespace positions, ``data:`` with and without the space,
comments, ``retry:``/unknown fields, omitted ``event:`` lines, and tiny chunks. Event ids are
never invented for variety: an event carries an ``id:`` line exactly when the caller gives it
one (resumable streams: every event; see :mod:`.mcp_app`), so ``Last-Event-ID`` stays exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
from starlette.types import Send

__all__ = ["MID_FINAL", "StreamAborted", "StreamClosed", "final_frame_pieces", "SseEmitter", "BodyWriter"]

MID_FINAL = object()
"""Marker yielded between ``content`` and ``structuredContent``: where ``drop_mid_final`` cuts."""

_SEND_BUFFER = 64 * 1024
_TINY_BYTES = 8 * 1024  # wire mode writes the first bytes of a stream a few at a time
_TINY_SIZES = (1, 3, 2, 7, 5, 1, 4, 6)
_EOLS = ("\r\n", "\n", "\r")


class StreamAborted(Exception):
    """Raised to abort an HTTP response mid-body (fault injection); the server closes the socket."""


class StreamClosed(Exception):
    """Raised after the server ended a response early on purpose, cleanly (the client sees EOF).

    Like the MCP SDK's ``close_sse_stream``: the request goes on, and a client resumes the
    response with GET + ``Last-Event-ID``.
    """


def _dumps_compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _structured_pieces(read: Any, *, style: str, context: dict[str, Any], compact: bool, newlines: bool,
                       malformed: bool) -> Iterator[str]:
    """``structuredContent`` as JSON text pieces (``compact`` or ``json.dumps`` default spacing)."""
    dumps = _dumps_compact if compact else json.dumps
    colon, comma = (":", ",") if compact else (": ", ", ")
    nl = "\n" if newlines else ""

    def records() -> Iterator[str]:
        yield "[" + nl
        first = True
        for record in read.iter_final_records():
            yield ("" if first else comma + nl) + dumps(record)
            first = False
        yield nl + "]"

    metadata = dumps(read.final_metadata)
    if style == "direct":
        if malformed:
            yield "{" + nl + '"metadata"' + colon + metadata + "}"
            return
        yield "{" + nl + '"result"' + colon
        yield from records()
        yield comma + nl + '"metadata"' + colon + metadata + nl + "}"
        return
    head = "{" + nl + '"contract_version"' + colon + dumps("bos-identity-mcp/v2") + comma + nl
    head += '"context"' + colon + dumps(context)
    if malformed:
        yield head + "}"
        return
    yield head + comma + nl + '"result"' + colon + "{" + nl + '"result"' + colon
    yield from records()
    yield comma + nl + '"metadata"' + colon + metadata + nl + "}" + nl + "}"


def final_frame_pieces(read: Any, *, request_id: Any, style: str, context: dict[str, Any], stateless: bool,
                       server_info: dict[str, Any] | None, faults: Any, newlines: bool = False) -> Iterator[Any]:
    """The final JSON-RPC response as text pieces (and one :data:`MID_FINAL` marker).

    ``newlines`` puts line breaks where JSON allows whitespace (never inside a string), so wire
    mode can split the frame over several ``data:`` lines.
    """
    nl = "\n" if newlines else ""
    frame_id = faults.final_id_override if faults.final_id_override is not None else request_id
    if faults.final_context_handle is not None:  # a server relabelling the read's context
        context = {**context, "context_handle": faults.final_context_handle}
    head = '{"jsonrpc":"2.0",' + nl + '"id":' + _dumps_compact(frame_id) + "," + nl
    if faults.final_error is not None:
        yield head + '"error":' + _dumps_compact(faults.final_error) + "}"
        return
    malformed = bool(faults.malformed_final)
    yield head + '"result":{' + nl + '"content":[{"type":"text",' + nl + '"text":"'
    for piece in _structured_pieces(read, style=style, context=context, compact=False, newlines=False,
                                    malformed=malformed):
        yield json.dumps(piece)[1:-1]  # the piece as JSON string content (escaped, no quotes)
    yield '"}],' + nl
    yield MID_FINAL
    yield '"structuredContent":'
    yield from _structured_pieces(read, style=style, context=context, compact=True, newlines=newlines,
                                  malformed=malformed)
    tail = "," + nl + '"isError":' + ("true" if read.is_error else "false")
    meta: dict[str, Any] = {}
    if style == "execute":
        meta["bos/context"] = context
    if stateless and server_info is not None:
        meta["io.modelcontextprotocol/serverInfo"] = server_info
    if meta:
        tail += "," + nl + '"_meta":' + _dumps_compact(meta)
    if stateless:
        tail += "," + nl + '"resultType":"complete"'
    yield tail + "}}"


class _Writer:
    """Buffered ASGI body writer; in tiny mode the first bytes go out a few at a time."""

    def __init__(self, send: Send, *, tiny: bool) -> None:
        self._send = send
        self._buf = bytearray()
        self._tiny_left = _TINY_BYTES if tiny else 0
        self._tiny_i = 0
        self.bytes_sent = 0
        self.last_write = anyio.current_time()  # when bytes last went out (keepalives are due after idle)
        self._close_in: int | None = None  # bytes still to write before an early clean close

    async def write(self, data: bytes, *, flush: bool = False) -> None:
        if self._close_in is not None and len(data) > self._close_in:
            self._buf += data[: self._close_in]
            await self.close_early()
        if self._close_in is not None:
            self._close_in -= len(data)
        self._buf += data
        if flush or len(self._buf) >= _SEND_BUFFER:
            await self.flush()

    async def flush(self) -> None:
        while self._buf and self._tiny_left > 0:
            size = min(_TINY_SIZES[self._tiny_i % len(_TINY_SIZES)], len(self._buf))
            self._tiny_i += 1
            chunk = bytes(self._buf[:size])
            del self._buf[:size]
            self._tiny_left -= size
            await self._raw(chunk)
        if self._buf:
            chunk = bytes(self._buf)
            self._buf.clear()
            await self._raw(chunk)

    async def _raw(self, chunk: bytes) -> None:
        self.bytes_sent += len(chunk)
        self.last_write = anyio.current_time()
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def finish(self) -> None:
        await self.flush()
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def abort(self) -> None:
        await self.flush()
        raise StreamAborted("response aborted on purpose (fault injection)")

    async def close_early(self) -> None:
        """End the response cleanly now and raise :class:`StreamClosed`."""
        self._close_in = None
        await self.finish()
        raise StreamClosed("response closed early on purpose (resumable)")


class BodyWriter(_Writer):
    """A plain (application/json) body written from frame pieces."""

    async def pieces(self, pieces: Iterator[Any], *, drop_mid: bool) -> None:
        for piece in pieces:
            if piece is MID_FINAL:
                if drop_mid:
                    await self.abort()
                continue
            await self.write(piece.encode())


class SseEmitter(_Writer):
    """Writes ``text/event-stream`` events, plainly or with every framing SSE allows (wire mode)."""

    def __init__(self, send: Send, *, wire: bool, retry_ms: int = 1000) -> None:
        super().__init__(send, tiny=wire)
        self.wire = wire
        self.retry_ms = retry_ms
        self._events = 0
        if wire:
            self._buf += b"\xef\xbb\xbf"  # one leading BOM: parsers strip it

    def _eol(self) -> str:
        return _EOLS[self._events % 3] if self.wire else "\n"

    async def comment(self, text: str) -> None:
        eol = self._eol()
        self._events += 1
        await self.write(f": {text}{eol}{eol}".encode(), flush=True)

    async def priming(self, event_id: str) -> None:
        """An MCP priming event (2025-11-25, SEP-1699): an id, empty data and the retry delay."""
        eol = self._eol()
        self._events += 1
        event = f"id: {event_id}{eol}data: {eol}retry: {self.retry_ms}{eol}{eol}"
        await self.write(event.encode(), flush=True)

    def _header_lines(self, eol: str, event_id: str | None) -> str:
        k = self._events
        lines = []
        if not self.wire:
            return ("" if event_id is None else f"id: {event_id}{eol}") + "event: message" + eol
        if k % 4 == 1:
            lines.append(": interleaved comment")
        if event_id is not None:
            lines.append(f"id:{event_id}" if k % 2 else f"id: {event_id}")
        if k % 4 == 2:
            lines.append(f"retry: {self.retry_ms}")
        if k % 5 == 3:
            lines.append("x-bos-unknown-field: ignored")
        if k % 6 == 4:
            lines.append("ignoredfieldwithoutcolon")
        if k % 7 != 5:  # sometimes rely on the default event type ("message")
            lines.append("event:message" if k % 2 else "event: message")
        return "".join(line + eol for line in lines)

    def _data_prefix(self, line: str, index: int) -> str:
        # "data:" without the space only when the value does not start with a space (one space is stripped)
        if not self.wire or line.startswith(" ") or (self._events + index) % 2 == 0:
            return "data: "
        return "data:"

    async def message(self, obj: dict[str, Any], *, event_id: str | None = None) -> None:
        """One ``event: message`` whose data is the JSON of ``obj``."""
        eol = self._eol()
        text = self._header_lines(eol, event_id)
        if self.wire:
            lines = json.dumps(obj, indent=1, ensure_ascii=self._events % 2 == 0).split("\n")
            if self._events % 5 == 2 and len(lines) > 1:
                lines.insert(1, "")  # an empty data line adds a newline between JSON tokens
            body = "".join(self._data_prefix(line, i) + line + eol for i, line in enumerate(lines))
        else:
            body = "data: " + _dumps_compact(obj) + eol
        self._events += 1
        await self.write((text + body + eol).encode(), flush=True)

    async def final(self, pieces: Iterator[Any], *, drop_mid: bool, event_id: str | None = None,
                    close_after_bytes: int | None = None, close_after_records_bytes: int | None = None,
                    on_complete: Callable[[], None] | None = None) -> None:
        """The final event, written incrementally from :func:`final_frame_pieces`.

        ``on_complete``: called once every byte but the event's last line end is written, before
        that last write: a client holding the complete event can never look before it ran.

        ``close_after_bytes``: end the response cleanly once that many bytes of this event (its
        field lines included) are out, raising :class:`StreamClosed`; ``close_after_records_bytes``:
        the same, counted from :data:`MID_FINAL` (the start of ``structuredContent``).
        """
        eol = self._eol()
        if close_after_bytes is not None:
            await self.flush()
            self._close_in = close_after_bytes
        await self.write(self._header_lines(eol, event_id).encode())
        at_line_start = True
        line_index = 0
        for piece in pieces:
            if piece is MID_FINAL:
                if drop_mid:
                    await self.abort()
                if close_after_records_bytes is not None:
                    await self.flush()
                    self._close_in = close_after_records_bytes
                continue
            segments = piece.split("\n") if self.wire else [piece]
            out: list[str] = []
            for i, segment in enumerate(segments):
                if i > 0:  # a newline in the frame: end this data line
                    if at_line_start:
                        out.append("data:")
                    out.append(eol)
                    at_line_start = True
                    line_index += 1
                if segment:
                    if at_line_start:
                        out.append(self._data_prefix(segment, line_index))
                        at_line_start = False
                    out.append(segment)
            await self.write("".join(out).encode())
        if not at_line_start:
            await self.write(eol.encode())
        self._events += 1
        last = eol.encode()
        if on_complete is not None and (self._close_in is None or self._close_in >= len(last)):
            on_complete()  # unless a planned early close cuts this last write (see write())
        await self.write(last, flush=True)
