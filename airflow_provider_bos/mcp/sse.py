"""Incremental ``text/event-stream`` parser (WHATWG HTML "server-sent events" §9.2.6).

Bytes in, events out: feed network chunks of any size and get back the events they complete.

Rules implemented, in the standard's words where it matters:

- The stream is UTF-8. One leading BOM is stripped (even when split across chunks). Invalid
  UTF-8 is decoded with U+FFFD replacement characters, as the standard says, by default; pass
  ``invalid_utf8="error"`` to get a :class:`~airflow_provider_bos.exceptions.BosSseError` instead.
  Either way the parser never raises anything but a ``BosError``. Lines are decoded one at a time:
  CR and LF never occur inside a multi-byte UTF-8 sequence, so this equals decoding the stream.
- Lines end with CRLF, LF or CR. A CR that ends one chunk followed by an LF that starts the next
  is ONE line break.
- A blank line dispatches the event — only if at least one ``data`` field was seen; otherwise it
  just resets the data and event-name buffers. An incomplete event at EOF is discarded.
- ``:comment`` lines dispatch nothing; :attr:`SseParser.comments` counts them, so a caller can
  see a ``: keepalive`` as activity. A line without a colon is a field name with an empty value.
  One space after the colon is removed. ``data`` values are joined with ``"\\n"``.
- ``event`` sets the event name (default ``"message"``). ``id`` sets the last event ID *buffer*
  unless its value contains U+0000; every blank line (with or without data) copies the buffer to
  :attr:`SseParser.last_event_id`, the "last event ID string" a reconnect sends as
  ``Last-Event-ID``. So the id of an event cut off before its blank line is never taken: a
  resumed stream re-sends that event. The id persists across events, as in the standard
  (``SseEvent.id`` is the last event id at dispatch). ``retry`` is honoured only when all ASCII
  digits, at once; ``SseEvent.retry`` / :attr:`SseParser.retry` is the reconnection time in
  milliseconds (``None`` if never set). Unknown fields are ignored.
- An event whose data is empty (``data:`` with no value, e.g. an MCP priming event that only
  carries an ``id`` and ``retry``) is dispatched with ``data == ""`` (``b""``): see
  :attr:`SseEvent.empty`.
- ``max_event_bytes`` bounds memory: it counts the bytes of one event's retained lines (its
  ``data``/``event``/``id`` lines, field names included, line breaks excluded) plus any not yet
  terminated line, so even a single endless line without a newline is cut off with
  :class:`~airflow_provider_bos.exceptions.BosEventTooLarge`. After an error the parser is
  unusable.

Streaming the data of one large event (``stream_threshold`` + ``open_stream``): notifications
are small, the final response of a big read is not. Events are buffered as above until the bytes
held for one event exceed ``stream_threshold``; the parser then calls ``open_stream()`` and, if it
returns a sink (an object with ``write(bytes)`` and ``end()``), hands it the event's data so far
and every later data byte as it arrives (raw UTF-8 bytes, data lines joined with ``b"\n"``)
instead of keeping them (never before the event has a data byte, so an empty event is never
streamed). At the blank line it calls ``sink.end()`` and dispatches an
:class:`SseEvent` with ``streamed=True`` and empty ``data``. Only ``message`` events are streamed
(an ``event:`` line with another name seen before the switch keeps the event buffered); streamed
data does not count towards ``max_event_bytes`` (the sink bounds what it keeps), the event's
other lines still do.

Performance: chunks are scanned with ``bytes`` ``in`` / ``split`` (C speed); an unterminated
line is kept as a list of chunks and joined once when its line break arrives, so a 100 MB
``data:`` line costs one join and one decode, not a quadratic re-scan.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from airflow_provider_bos.exceptions import BosEventTooLarge, BosSseError

__all__ = ["SseEvent", "SseDataSink", "SseParser", "iter_sse", "DEFAULT_MAX_EVENT_BYTES"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_EVENT_BYTES = 512 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched server-sent event."""

    event: str
    #: The joined data lines: ``str``, or the undecoded UTF-8 ``bytes`` from a parser made with
    #: ``raw_data=True`` (decode them with :meth:`SseParser.text`).
    data: str | bytes
    id: str | None = None
    retry: int | None = None
    #: True if the data went to a sink (see ``SseParser(open_stream=...)``); ``data`` is then "".
    streamed: bool = False

    @property
    def empty(self) -> bool:
        """The event carried no data (an MCP priming event, say): it holds no message."""
        return not self.streamed and not self.data


class SseDataSink(Protocol):
    """Receives the data of one streamed event."""

    def write(self, data: bytes) -> None: ...

    def end(self) -> None: ...


class SseParser:
    """Incremental WHATWG event-stream parser: :meth:`feed` chunks, then :meth:`close` at EOF."""

    def __init__(
        self,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        invalid_utf8: Literal["replace", "error"] = "replace",
        stream_threshold: int | None = None,
        open_stream: Callable[[], SseDataSink | None] | None = None,
        raw_data: bool = False,
        last_event_id: str | None = None,
        retry: int | None = None,
    ) -> None:
        """``raw_data``: events carry their data as undecoded UTF-8 bytes (:meth:`text` decodes
        them with this parser's ``invalid_utf8`` policy), for consumers that parse JSON from bytes
        and would otherwise pay for a decode and a re-encode.

        ``last_event_id`` and ``retry``: carried over from the parser of the connection this one
        resumes (the standard keeps both across reconnections)."""
        if (stream_threshold is None) != (open_stream is None):
            raise ValueError("stream_threshold and open_stream go together")
        if stream_threshold is not None and stream_threshold < 0:
            raise ValueError("stream_threshold must not be negative")
        if max_event_bytes <= 0:
            raise ValueError("max_event_bytes must be positive")
        if invalid_utf8 not in ("replace", "error"):
            raise ValueError("invalid_utf8 must be 'replace' or 'error'")
        self.max_event_bytes = max_event_bytes
        self._strict_utf8 = invalid_utf8 == "error"
        self._raw_data = raw_data
        # Stream state.
        self._started = False  # the leading-BOM decision has been made
        self._head = b""  # first bytes held back while they could still be a split BOM
        self._skip_lf = False  # last chunk ended in CR: an LF starting the next one is the same break
        self._pending: list[bytes] = []  # pieces of the line not yet terminated
        self._pending_len = 0
        self._failed: BosSseError | None = None
        self._closed = False
        # Event state.
        self._data: list[Any] = []  # str, or bytes with raw_data
        self._event_name = ""
        self._event_bytes = 0
        # Streaming of one large event's data (see the module docstring).
        self._stream_threshold = stream_threshold
        self._open_stream = open_stream
        self._sink: SseDataSink | None = None
        self._sink_line = False  # the current unterminated line is a data line going to the sink
        self._sink_lines = 0  # data lines given to the sink (a b"\n" goes between two)
        self._stream_declined = False  # open_stream() said no for the current event
        # Persistent state (survives dispatch), per the standard.
        self._id_buffer: str | None = last_event_id  # the "last event ID buffer": set by id lines
        #: The "last event ID string": the id in effect at the last blank line (see the module doc).
        self.last_event_id: str | None = last_event_id
        #: The reconnection time in milliseconds from the last valid ``retry`` field (None: never set).
        self.retry: int | None = retry
        #: Comment lines seen (``: keepalive`` and the like): activity that dispatches no event.
        self.comments = 0
        #: Lines whose bytes were not valid UTF-8 and were decoded with replacement characters.
        self.invalid_utf8_lines = 0

    # -- public API -------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk``; return the events it completes (possibly none), in stream order."""
        if self._failed is not None:
            raise BosSseError(f"The event stream parser already failed: {self._failed}")
        if self._closed:
            raise BosSseError("The event stream parser is closed; no more data can be fed.")
        try:
            data = bytes(chunk)
            threshold = self._stream_threshold
            if threshold is None or self._sink is not None or len(data) <= self.max_event_bytes - threshold:
                return self._feed(data)
            # A decompressed chunk can be far larger than what arrived. Fed in slices that fit between
            # the stream threshold and max_event_bytes, a large event switches to streaming before
            # its buffered bytes can pass the bound; once it streams, the rest goes in at once.
            step = max(1, self.max_event_bytes - threshold)
            events: list[SseEvent] = []
            for start in range(0, len(data), step):
                if self._sink is not None:
                    events += self._feed(data[start:])
                    break
                events += self._feed(data[start : start + step])
            return events
        except BosSseError as exc:
            self._failed = exc
            raise

    def close(self) -> list[SseEvent]:
        """Signal EOF. An incomplete event (no terminating blank line) is discarded per the standard."""
        if self._failed is not None or self._closed:
            return []
        self._closed = True
        if self._sink is not None:
            logger.debug("Event stream ended inside a streamed event; discarding it.")
            self._sink = None
        if self._pending or self._data:
            logger.debug("Event stream ended inside an event; discarding the incomplete event.")
        self._pending.clear()
        self._pending_len = 0
        self._data.clear()
        self._event_name = ""
        self._event_bytes = 0
        return []

    @property
    def buffered_bytes(self) -> int:
        """Bytes currently held for an incomplete event (bounded by ``max_event_bytes``)."""
        return self._event_bytes + self._pending_len

    # -- internals --------------------------------------------------------------------------

    def _feed(self, chunk: bytes) -> list[SseEvent]:
        if not self._started:
            chunk = self._head + chunk
            if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
                self._head = chunk  # could still become a BOM: wait for more bytes
                return []
            self._head = b""
            self._started = True
            chunk = chunk.removeprefix(_BOM)
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._sink is not None:
            return self._feed_streaming(chunk)
        events = self._feed_lines(chunk)
        if (
            self._sink is None
            and self._stream_threshold is not None
            and not self._stream_declined
            and self._event_bytes + self._pending_len > self._stream_threshold
        ):
            self._start_stream()
        return events

    def _feed_lines(self, chunk: bytes) -> list[SseEvent]:
        if b"\r" in chunk:
            lines = _LINE_BREAK.split(chunk)
            # A trailing CR is a complete line break, but its LF may arrive in the next chunk.
            self._skip_lf = chunk[-1] == 0x0D
        elif b"\n" in chunk:
            lines = chunk.split(b"\n")
        else:
            # Hot path for huge lines: no line break, just keep the piece.
            self._append_pending(chunk)
            return []

        rest = lines.pop()  # after the last line break: the start of an unterminated line
        if self._pending:
            self._check_size(len(lines[0]))
            self._pending.append(lines[0])
            lines[0] = b"".join(self._pending)
            self._pending = []
            self._pending_len = 0
        events: list[SseEvent] = []
        for index, line in enumerate(lines):
            event = self._process_line(line)
            if event is not None:
                events.append(event)
            if (
                self._stream_threshold is not None
                and self._sink is None
                and not self._stream_declined
                and self._event_bytes > self._stream_threshold
                and self._start_stream()
            ):
                # The rest of this chunk belongs to (or follows) the streamed event. Any line break
                # is a line break, so the complete lines are re-joined with LF; a CR that ended the
                # chunk keeps its _skip_lf.
                later = lines[index + 1 :]
                tail = b"\n".join(later) + b"\n" + rest if later else rest
                if tail:
                    events.extend(self._feed_streaming(tail))
                # The re-joined tail ends in LF where the chunk may have ended in CR: whatever the
                # nested parsing set, an LF opening the next chunk completes THIS chunk's CR.
                self._skip_lf = chunk[-1] == 0x0D
                return events
        if rest:
            self._append_pending(rest)
        return events

    # -- streaming one event's data ---------------------------------------------------------------

    def _start_stream(self) -> bool:
        """Switch the current event to streaming; False if it cannot or the caller declined."""
        if self._event_name not in ("", "message"):
            return False
        pending = b"".join(self._pending)
        if pending and not _is_data_line(pending):
            if not (len(pending) < 6 and b"data: ".startswith(pending)):
                return False  # a huge non-data line: keep buffering under max_event_bytes
            if not self._data:
                return False  # cannot tell yet
        pending_value = b""
        if pending and _is_data_line(pending):
            pending_value = pending[6:] if pending[5:6] == b" " else pending[5:]
        if not any(self._data) and not pending_value:
            return False  # no data byte yet: an empty event (an MCP priming event) is never streamed
        assert self._open_stream is not None
        sink = self._open_stream()
        if sink is None:
            self._stream_declined = True
            return False
        self._sink = sink
        head = b"\n".join(self._data) if self._raw_data else "\n".join(self._data).encode("utf-8")
        self._sink_lines = len(self._data)
        self._data = []
        self._event_bytes = 0
        self._pending = []
        self._pending_len = 0
        self._sink_line = False
        if head:
            sink.write(head)
        if pending:
            # Undecided short heads ("dat") are re-examined by the streaming line reader.
            self._feed_streaming_line_start(pending, complete=False)
        return True

    def _feed_streaming(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk`` while an event streams; data goes to the sink, other lines as usual."""
        events: list[SseEvent] = []
        n = len(chunk)
        i = 0
        # The next CR and LF at or after i (-1: none left): memchr-speed finds, each redone only
        # once i has passed it, so a chunk is scanned about once however many lines it holds.
        cr = chunk.find(b"\r")
        lf = chunk.find(b"\n")
        while i < n:
            if self._sink is None:  # the streamed event was dispatched: back to normal parsing
                events.extend(self._feed(chunk[i:]))
                return events
            if 0 <= cr < i:
                cr = chunk.find(b"\r", i)
            if 0 <= lf < i:
                lf = chunk.find(b"\n", i)
            if cr < 0 and lf < 0:
                piece, nxt = chunk[i:], n
                complete = False
            else:
                brk = lf if cr < 0 or (0 <= lf < cr) else cr
                piece = chunk[i:brk]
                if brk == cr and cr + 1 < n and chunk[cr + 1] == 0x0A:
                    nxt = cr + 2  # CRLF
                else:
                    nxt = brk + 1
                    if brk == cr and nxt == n:
                        self._skip_lf = True  # its LF may start the next chunk
                complete = True
            if self._sink_line:
                if piece:
                    self._sink.write(piece)
                if complete:
                    self._sink_line = False
            else:
                event = self._feed_streaming_line_start(piece, complete=complete)
                if event is not None:
                    events.append(event)
            i = nxt
        return events

    def _feed_streaming_line_start(self, piece: bytes, *, complete: bool) -> SseEvent | None:
        """A piece of a line whose field was not decided yet, while streaming."""
        if self._pending:
            self._check_size(len(piece))
            self._pending.append(piece)
            piece = b"".join(self._pending)
            self._pending = []
            self._pending_len = 0
        assert self._sink is not None
        if piece.startswith(b"data:") and (len(piece) > 5 or complete):
            value = piece[6:] if piece[5:6] == b" " else piece[5:]
            if self._sink_lines:
                self._sink.write(b"\n")
            self._sink_lines += 1
            if value:
                self._sink.write(value)
            self._sink_line = not complete
            return None
        if piece == b"data" and complete:
            if self._sink_lines:
                self._sink.write(b"\n")
            self._sink_lines += 1
            return None
        if not complete:
            self._append_pending(piece)
            return None
        if piece:
            self._process_line(piece)  # comment, event, id, retry, unknown field
            return None
        # Blank line: dispatch the streamed event.
        self.last_event_id = self._id_buffer
        sink = self._sink
        self._sink = None
        self._sink_lines = 0
        self._stream_declined = False
        name = self._event_name
        self._event_name = ""
        self._event_bytes = 0
        self._data = []
        sink.end()
        return SseEvent(event=name or "message", data="", id=self.last_event_id, retry=self.retry,
                        streamed=True)

    def _append_pending(self, piece: bytes) -> None:
        self._check_size(len(piece))
        self._pending.append(piece)
        self._pending_len += len(piece)

    def _check_size(self, extra: int) -> None:
        if self._event_bytes + self._pending_len + extra > self.max_event_bytes:
            # Drop what we hold: the point of the limit is bounded memory.
            self._pending = []
            self._pending_len = 0
            self._data = []
            raise BosEventTooLarge(self.max_event_bytes)

    def text(self, data: str | bytes) -> str:
        """An event's data as text (``raw_data`` events carry bytes), under the ``invalid_utf8`` policy."""
        return data if isinstance(data, str) else self._decode(data)

    def _decode(self, raw: bytes | memoryview) -> str:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            if self._strict_utf8:
                raise BosSseError(
                    f"The event stream is not valid UTF-8 ({exc.reason} at byte {exc.start} of a line)."
                ) from None
            self.invalid_utf8_lines += 1
            if self.invalid_utf8_lines == 1:
                logger.warning("The event stream contains invalid UTF-8; replaced with U+FFFD.")
            return str(raw, "utf-8", "replace")

    def _process_line(self, line: bytes) -> SseEvent | None:
        if not line:
            return self._dispatch()
        first = line[0]
        if first == 0x3A:  # ":" comment
            self.comments += 1
            return None
        colon = line.find(b":")
        if colon < 0:
            name, value_start = line, len(line)
        else:
            name = line[:colon]
            value_start = colon + 1
            if value_start < len(line) and line[value_start] == 0x20:
                value_start += 1
        if name == b"data":
            self._event_bytes += len(line)
            self._check_size(0)
            if self._raw_data:
                self._data.append(bytes(line[value_start:]))
            elif value_start >= len(line):
                self._data.append("")
            else:
                self._data.append(self._decode(memoryview(line)[value_start:]))
        elif name == b"event":
            self._event_bytes += len(line)
            self._check_size(0)
            self._event_name = self._decode(line[value_start:])
        elif name == b"id":
            value = self._decode(line[value_start:])
            if "\x00" not in value:
                self._id_buffer = value
        elif name == b"retry":
            value_bytes = line[value_start:]
            if value_bytes and value_bytes.isdigit():  # bytes.isdigit() is ASCII-only
                self.retry = int(value_bytes)
        # Any other field name is ignored, as the standard says.
        return None

    def _dispatch(self) -> SseEvent | None:
        self.last_event_id = self._id_buffer
        data = self._data
        name = self._event_name
        self._stream_declined = False
        self._data = []
        self._event_name = ""
        self._event_bytes = 0
        if not data:
            return None
        return SseEvent(
            event=name or "message",
            data=data[0] if len(data) == 1 else (b"\n" if self._raw_data else "\n").join(data),
            id=self.last_event_id,
            retry=self.retry,
        )


def _is_data_line(line: bytes) -> bool:
    return line.startswith(b"data:") or line == b"data"


def iter_sse(
    byte_chunks: Iterable[bytes],
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    invalid_utf8: Literal["replace", "error"] = "replace",
) -> Iterator[SseEvent]:
    """Parse an iterable of byte chunks into events, lazily; EOF discards an incomplete event."""
    parser = SseParser(max_event_bytes=max_event_bytes, invalid_utf8=invalid_utf8)
    for chunk in byte_chunks:
        yield from parser.feed(chunk)
    yield from parser.close()
