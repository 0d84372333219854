"""The authoritative outcome of a federated read: :class:`FinalResult` and how it is parsed.

:class:`FinalResultParser` turns the final JSON-RPC response of a federated read (direct tool or
``bos_execute`` envelope) into a :class:`FinalResult`: the authoritative records plus metadata,
cross-checked against what the stream showed. Mismatches are warnings, not failures: the final
result is authoritative (contract §5). Mismatches that would let a result pass as complete when
it is not are also its ``contradictions``: ``isError`` on a ``complete`` result, a source that
ended in error in the stream but is missing from ``source_errors``, a ``result_count`` that
disagrees with the records, a final that arrived before a source's terminal status, and a stream
that named more sources than the tracker keeps (so the others cannot be checked). A sync lands
such a run as ``partial``, never ``complete`` (fail closed). Server text in warnings is escaped.
It works on decoded JSON; the bytes of a streamed final frame are
:class:`~.final_frame.FinalFrameScanner`'s, which leaves the parser a skeleton.

:class:`StreamingFinalResult` is the constant-memory form (``McpSession.federated_read(...,
stream_records=True)``): its records are pulled from the still-open response as they arrive (see
:mod:`.final_stream`), and what depends on the end of the frame is available once they are consumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from airflow_provider_bos.exceptions import (
    BosFinalFrameRestarted,
    BosJsonRpcError,
    BosProtocolError,
    BosResultError,
    excerpt,
)
from airflow_provider_bos.mcp.interactive import input_required_error
from airflow_provider_bos.mcp.jsonrpc import loads, rpc_error, same_id
from airflow_provider_bos.mcp.source_results import (
    SourceResultsTracker,
    ToolStyle,
    describe_validation_error,
    source_label,
)
from airflow_provider_bos.models import BosContext, FederatedRecord, ReadMetadata, SourceErrorEntry
from airflow_provider_bos.redaction import printable
from airflow_provider_bos.wire import KnownWireHashes

if TYPE_CHECKING:
    from airflow_provider_bos.mcp.final_frame import FinalFrameScanner

__all__ = ["FinalResult", "StreamingFinalResult", "FinalResultParser", "parse_final_response"]

logger = logging.getLogger(__name__)

_NAMED_SOURCES = 10  # a warning lists this many unfinished sources, then counts the rest


def _quoted(value: object) -> str:
    """A server-supplied value for a warning: its repr, escaped and cut."""
    return printable(repr(value), limit=80)


@dataclass
class FinalResult:
    """The authoritative outcome of a federated read (the final JSON-RPC response)."""

    request_id: str | int
    is_error: bool
    completeness: str  # "complete" | "partial"; anything else: callers fail closed
    metadata: ReadMetadata
    records: Iterable[FederatedRecord]  # authoritative; consume once (a later version streams it)
    context: BosContext | None
    result_type: str | None  # stateless era: "complete"
    tool_style: str  # "execute" | "direct"
    streamed: bool  # the server answered with the negotiated event stream
    observations: SourceResultsTracker  # provisional per-source stats (empty if not streamed)
    warnings: list[str] = field(default_factory=list)  # cross-check mismatches (logged, not failures)
    # The warnings that forbid trusting the result as complete (a sync lands it as partial).
    contradictions: list[str] = field(default_factory=list)

    @property
    def source_errors(self) -> list[SourceErrorEntry]:
        return list(self.metadata.source_errors)

    @property
    def result_count(self) -> int | None:
        return self.metadata.result_count

    def __repr__(self) -> str:
        return (
            f"FinalResult(request_id={self.request_id!r}, tool_style={self.tool_style!r}, "
            f"completeness={self.completeness!r}, is_error={self.is_error}, "
            f"result_count={self.result_count}, streamed={self.streamed}, warnings={len(self.warnings)})"
        )

    def close(self) -> None:
        """Release the response behind the records (a no-op for a materialised result)."""

    def __enter__(self) -> FinalResult:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_DEFERRED = ("is_error", "completeness", "metadata", "context", "result_type", "warnings", "contradictions")


class StreamedFrame(Protocol):
    """The final frame still arriving: its current scanner (a new one if the frame restarts)."""

    scanner: FinalFrameScanner


class StreamingFinalResult(FinalResult):
    """A :class:`FinalResult` whose records stream from the still-open response.

    ``records`` is a ONE-SHOT iterator of plain dicts (the wire records, lightly checked: a
    non-empty ``record_ref``, non-empty ``sources`` with ``observed_at``). ``request_id``,
    ``tool_style``, ``streamed`` and ``observations`` are available at once; ``is_error``,
    ``completeness``, ``metadata``, ``context``, ``result_type``, ``warnings``, ``contradictions``,
    ``source_errors``
    and ``result_count`` raise :class:`BosResultError` until the iterator is exhausted and the
    frame validated. An EOF or connection failure mid-frame raises
    :class:`~airflow_provider_bos.exceptions.BosIncompleteStreamError` from the iterator, so a
    consumer's transaction rolls back. Use as a context manager (or call :meth:`close`) to release
    the response if the records are not consumed to the end.
    """

    def __init__(
        self,
        *,
        request_id: str | int,
        tool_style: str,
        streamed: bool,
        observations: SourceResultsTracker,
        records: Iterable[Any],
        finish: Callable[[int], FinalResult],
        on_close: Callable[[], None] | None = None,
        frame: StreamedFrame | None = None,
    ) -> None:
        self.request_id = request_id
        self._frame = frame  # the frame still arriving (its scanner changes if the frame restarts)
        self.tool_style = tool_style
        self.streamed = streamed
        self.observations = observations
        self._source = records
        self._finish = finish
        self._on_close = on_close
        self._final: FinalResult | None = None
        self._iterated = False
        self._failure: BaseException | None = None
        #: Records handed out so far.
        self.records_consumed = 0

    def use_known_wire_hashes(self, known: KnownWireHashes) -> bool:
        """Let records whose wire hash is in ``known`` through undecoded, as ``KnownRecord`` claims.

        ``known``: the warehouse's stored wire hashes (:class:`~airflow_provider_bos.wire.KnownWireHashes`),
        which will verify the claims. Applies to the bytes still to arrive; returns False (and does
        nothing) when the frame is not streaming. Call before consuming :attr:`records`.
        """
        if self._frame is None or self._iterated:
            return False
        self._frame.scanner.known = known
        return True

    @property
    def known_records(self) -> int:
        """How many records came through as ``KnownRecord`` claims (not decoded)."""
        return self._frame.scanner.known_records if self._frame is not None else 0

    @property
    def records(self) -> Iterator[Any]:  # type: ignore[override]  # read-only here: consumed once, from the stream
        if self._iterated:
            raise BosResultError("The records of a streamed result can be consumed only once.")
        self._iterated = True
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        n = 0
        self.records_consumed = 0
        restarted = False
        try:
            for record in self._source:
                n += 1
                self.records_consumed = n
                yield record
            self._final = self._finish(self.records_consumed)
        except BosFinalFrameRestarted as restart:
            # The frame is being received again: counting starts over, and so does the consumer.
            restarted = True
            self._source = restart.records
            raise BosFinalFrameRestarted(self._iterate(), observations=restart.observations) from None
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            if not restarted:
                self.close()

    def __getattribute__(self, name: str) -> Any:
        if name in _DEFERRED:
            final = object.__getattribute__(self, "_final")
            if final is None:
                failure = object.__getattribute__(self, "_failure")
                why = (
                    f"; the record stream failed ({type(failure).__name__})"
                    if failure is not None and not isinstance(failure, GeneratorExit)
                    else ""
                )
                raise BosResultError(
                    f"FinalResult.{name} is available once records are consumed (stream_records=True){why}."
                )
            return getattr(final, name)
        return object.__getattribute__(self, name)

    def materialised(self) -> FinalResult:
        """Consume the records into validated :class:`FederatedRecord` objects: the whole result.

        What ``federated_read(stream_records=False)`` returns. The records come from the scanner one
        at a time, so a hostile frame of tiny objects fails at its first bad record instead of being
        decoded whole first. A frame that restarts (a resumed stream) is taken again from its start.
        """
        where = "structuredContent.result" if self.tool_style == "execute" else "structuredContent"
        source: Iterable[Any] | None = self.records
        records: list[FederatedRecord] = []
        with self:
            while source is not None:
                try:
                    records = list(_validate_records(source, where))
                    source = None
                except BosFinalFrameRestarted as restart:
                    source = restart.records
        final = self._final
        assert final is not None  # the records were consumed to the end
        return replace(final, records=records)

    @property
    def complete(self) -> bool:
        """True once every record was consumed and the frame validated."""
        return self._final is not None

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if self._final is None:
            return (
                f"StreamingFinalResult(request_id={self.request_id!r}, tool_style={self.tool_style!r}, "
                f"streamed={self.streamed}, records_consumed={self.records_consumed}, pending)"
            )
        return "Streaming" + repr(self._final)


def _loads(data: str | bytes) -> Any:
    try:
        return loads(data)
    except ValueError as exc:
        raise BosResultError(f"The final response is not valid JSON ({exc}).") from None


class FinalResultParser:
    """Parses a federated read's final JSON-RPC response into a :class:`FinalResult`.

    ``tool_style`` says where the records are: ``"direct"`` (``structuredContent.result`` /
    ``.metadata``) or ``"execute"`` (``structuredContent.result.result`` / ``.result.metadata``,
    context in ``structuredContent.context`` and ``_meta["bos/context"]``).

    ``requested_context``: the handle a ``bos_execute`` read asked for. A result stating another
    context contradicts the request (a server relabelling the run): the result is kept, its
    contradiction makes the run partial, and the read stays labelled with the requested handle.
    """

    def __init__(
        self,
        request_id: str | int,
        *,
        tool_style: ToolStyle,
        observations: SourceResultsTracker | None = None,
        streamed: bool = False,
        requested_context: str | None = None,
    ) -> None:
        if tool_style not in ("execute", "direct"):
            raise ValueError("tool_style must be 'execute' or 'direct'")
        self.request_id = request_id
        self.tool_style: ToolStyle = tool_style
        self.observations = observations if observations is not None else SourceResultsTracker(request_id)
        self.streamed = streamed
        self.requested_context = requested_context

    def parse_data(self, data: str | bytes) -> FinalResult:
        """Parse the final frame from its JSON text (an SSE ``data`` payload or a JSON body)."""
        return self.parse_message(_loads(data))

    def parse_message(self, message: Any, *, record_count: int | None = None) -> FinalResult:
        """Parse an already-decoded JSON-RPC response object.

        With ``record_count`` the message is a skeleton whose record array was streamed elsewhere
        (:class:`~.final_frame.FinalFrameScanner`): records are not validated here, the
        cross-checks use ``record_count``, and the result's ``records`` is empty.
        """
        if not isinstance(message, Mapping):
            raise BosResultError("The final response is not a JSON object.")
        if "id" not in message or not same_id(message.get("id"), self.request_id):
            raise BosResultError(
                f"The final response id {message.get('id')!r} does not match the request id "
                f"{self.request_id!r}; the server answered some other request."
            )
        if "error" in message:
            raise _rpc_error(message["error"], "tools/call")  # a federated read is a tools/call
        if "result" not in message:
            raise BosResultError("The final response has neither 'result' nor 'error'.")
        return self.parse_result(message["result"], record_count=record_count)

    def parse_result(self, result: Any, *, record_count: int | None = None) -> FinalResult:
        """Parse a ``CallToolResult`` object (the JSON-RPC ``result``)."""
        if not isinstance(result, Mapping):
            raise BosResultError("The final result is not an object.")
        result_type = result.get("resultType")
        if result_type == "input_required":
            raise input_required_error(result, "tools/call")
        if result_type is not None and result_type != "complete":
            raise BosResultError(
                f"The server returned resultType {result_type!r}; this client only handles complete results."
            )
        is_error = result.get("isError", False)
        if not isinstance(is_error, bool):
            raise BosResultError(f"isError {is_error!r} is not a boolean.")
        structured = result.get("structuredContent")
        if not isinstance(structured, Mapping):
            text = _first_text(result)
            if is_error:
                raise BosResultError(
                    "The tool call failed before producing a result"
                    + (f": {excerpt(text)}" if text else " (no details given).")
                )
            raise BosResultError("The final result has no structuredContent object.")

        context: BosContext | None = None
        warnings: list[str] = []
        if self.tool_style == "execute":
            operation = structured.get("result")
            if not isinstance(operation, Mapping):
                raise BosResultError(
                    "The bos_execute result has no structuredContent.result object "
                    "(expected the operation result with 'result' and 'metadata')."
                )
            raw_records, raw_metadata = operation.get("result"), operation.get("metadata")
            where = "structuredContent.result"
            context = _context(structured.get("context"), "structuredContent.context")
            meta = result.get("_meta")
            meta_context = meta.get("bos/context") if isinstance(meta, Mapping) else None
            if meta_context is None:
                warnings.append('The bos_execute result has no _meta["bos/context"].')
            elif context is not None and meta_context != structured.get("context"):
                warnings.append('_meta["bos/context"] differs from structuredContent.context.')
            if context is None and meta_context is not None:
                context = _context(meta_context, '_meta["bos/context"]')
        else:
            raw_records, raw_metadata = structured.get("result"), structured.get("metadata")
            where = "structuredContent"
        if not isinstance(raw_records, list):
            raise BosResultError(f"The final result has no record array at {where}.result.")
        if not isinstance(raw_metadata, Mapping):
            raise BosResultError(f"The final result has no metadata object at {where}.metadata.")
        try:
            metadata = ReadMetadata.model_validate(raw_metadata)
        except ValidationError as exc:
            raise BosResultError(f"The final metadata is malformed: {describe_validation_error(exc)}") from None
        if record_count is None:
            records = list(_validate_records(raw_records, where))
            record_count = len(records)
        else:
            records = []
        mismatches, contradictions = self._cross_check(metadata, is_error, record_count)
        relabelled = self._context_mismatch(context)
        if relabelled is not None:
            mismatches.append(relabelled)
            contradictions.append(relabelled)
        warnings.extend(mismatches)
        for warning in warnings:
            logger.warning("BOS read %s: %s", self.request_id, warning)
        return FinalResult(
            request_id=self.request_id,
            is_error=is_error,
            completeness=metadata.completeness,
            metadata=metadata,
            records=records,
            context=context,
            result_type=result_type,
            tool_style=self.tool_style,
            streamed=self.streamed,
            observations=self.observations,
            warnings=warnings,
            contradictions=contradictions,
        )

    def _context_mismatch(self, context: BosContext | None) -> str | None:
        """The contradiction of a result stating another context than the one requested, or None."""
        requested = self.requested_context
        if context is None or requested is None or context.context_handle == requested:
            return None
        return (f"The result states context {_handle(context.context_handle)} but the read asked for "
                f"{_handle(requested)}; the run keeps the requested context and retires nothing.")

    def _cross_check(
        self, metadata: ReadMetadata, is_error: bool, record_count: int
    ) -> tuple[list[str], list[str]]:
        """``(warnings, contradictions)``; every contradiction is also a warning."""
        warnings: list[str] = []
        contradictions: list[str] = []
        completeness = _quoted(metadata.completeness)
        if metadata.completeness not in ("complete", "partial"):
            warnings.append(f"Unknown completeness {completeness}.")
        elif is_error != (metadata.completeness == "partial"):
            warnings.append(f"isError={is_error} is inconsistent with completeness {completeness}.")
            if is_error:  # the server flags an error yet calls the result complete
                contradictions.append(warnings[-1])
        if metadata.completeness == "partial" and not metadata.source_errors:
            warnings.append("The result is partial but metadata.source_errors is empty.")
        if metadata.result_count is not None and metadata.result_count != record_count:
            # Records lost or invented on the way: the count the server vouches for is not what came.
            warnings.append(
                f"metadata.result_count is {metadata.result_count} but the result holds {record_count} records."
            )
            contradictions.append(warnings[-1])
        reported = {e.source.key: e.error.code for e in metadata.source_errors}
        observations = self.observations
        for key, code in observations.errored_sources.items():
            if key not in reported:
                warnings.append(
                    f"Source {source_label(*key)} ended in error {_quoted(code)} in the stream "
                    "but is missing from metadata.source_errors."
                )
                contradictions.append(warnings[-1])
            elif reported[key] != code:
                warnings.append(
                    f"Source {source_label(*key)} ended in error {_quoted(code)} in the stream "
                    f"but metadata.source_errors says {_quoted(reported[key])}."
                )
        if self.streamed:
            for key in reported:
                stats = observations.sources.get(key)
                if stats is not None and stats.status != "error":
                    warnings.append(
                        f"metadata.source_errors names {source_label(*key)}, which the stream reported "
                        f"{stats.status!r}."
                    )
            running = observations.running_sources
            if running:
                names = ", ".join(source_label(s.source_type, s.source_identity) for s in running[:_NAMED_SOURCES])
                more = f" and {len(running) - _NAMED_SOURCES} more" if len(running) > _NAMED_SOURCES else ""
                # Whatever such a source still had is missing from a result that may call itself complete.
                warnings.append(f"The final response arrived before these sources finished: {names}{more}.")
                contradictions.append(warnings[-1])
        if observations.untracked_notifications:
            warnings.append(
                f"The stream named {observations.untracked_reason}, more than this client tracks: "
                f"{observations.untracked_notifications} notification(s) of the sources beyond were only "
                "counted, so whether each of them finished, or failed, cannot be checked."
            )
            contradictions.append(warnings[-1])
        return warnings, contradictions


def _validate_records(raw_records: Iterable[Any], where: str) -> Iterator[FederatedRecord]:
    for index, raw in enumerate(raw_records):
        if not isinstance(raw, Mapping):
            raise BosResultError(f"Record {index} at {where}.result is not an object.")
        if not isinstance(raw.get("record_ref"), str) or not raw.get("record_ref"):
            raise BosResultError(f"Record {index} at {where}.result has no record_ref.")
        try:
            yield FederatedRecord.model_validate(raw)
        except ValidationError as exc:
            raise BosResultError(
                f"Record {index} at {where}.result is malformed: {describe_validation_error(exc)}"
            ) from None


def _handle(handle: str) -> str:
    """A server-supplied context handle as a message may show it: printable and cut."""
    return printable(repr(handle), limit=120)


def _context(raw: Any, where: str) -> BosContext | None:
    if raw is None:
        return None
    try:
        return BosContext.model_validate(raw)
    except ValidationError as exc:
        raise BosResultError(f"The context at {where} is malformed: {describe_validation_error(exc)}") from None


def _first_text(result: Mapping[str, Any]) -> str | None:
    content = result.get("content")
    if isinstance(content, list):
        for item in content:
            if isinstance(item, Mapping) and item.get("type") == "text" and isinstance(text := item.get("text"), str):
                return text
    return None


def _rpc_error(error: Any, method: str | None) -> BosJsonRpcError:
    try:
        return rpc_error(error, method)
    except BosProtocolError:
        raise BosResultError(f"The final response carries a malformed error object: {excerpt(str(error))}") from None


def parse_final_response(
    message: Any,
    *,
    request_id: str | int,
    tool_style: ToolStyle,
    observations: SourceResultsTracker | None = None,
    streamed: bool = False,
) -> FinalResult:
    """Convenience: parse a decoded final JSON-RPC response (see :class:`FinalResultParser`)."""
    parser = FinalResultParser(request_id, tool_style=tool_style, observations=observations, streamed=streamed)
    return parser.parse_message(message)
