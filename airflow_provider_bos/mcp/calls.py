"""What one JSON-RPC call carries through the session: its deadline, its options, its failures.

A :class:`Deadline` replaces the ``deadline`` (monotonic instant) and ``deadline_s`` (the seconds,
for the message) pair; :class:`CallOptions` is the per-call options object of
``McpSession._call``; :class:`StreamedCall` is a call whose answer is read as it arrives (an event
stream, or a large JSON body scanned as it comes), and says
how it ends when it is cancelled, overruns its deadline or loses its connection (the same errors
before and inside the final frame).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_bos.exceptions import (
    BosDeadlineExceeded,
    BosError,
    BosReadCancelled,
    BosResultError,
    BosStreamIdleTimeout,
)
from airflow_provider_bos.mcp.jsonrpc import same_id

if TYPE_CHECKING:
    from airflow_provider_bos.mcp.source_results import SourceResultsTracker, ToolStyle

__all__ = ["CallOptions", "Consumer", "Deadline", "StreamedCall"]

# A read timeout sized to the deadline may wake a hair early: allow for timer slack.
_TIMER_SLACK_S = 0.05


class Consumer(Protocol):
    """Takes the ``params`` of each source-result notification of one call (same thread, wire order)."""

    def __call__(self, params: Any) -> None: ...


@dataclass(frozen=True)
class Deadline:
    """When an operation must be over: a :func:`time.monotonic` instant and the seconds it was given."""

    at: float
    seconds: float
    #: The setting that gave it, named in the error (raise it if the operation legitimately takes longer).
    setting: str = "read_deadline"

    @classmethod
    def after(cls, seconds: float | None, setting: str = "read_deadline") -> Deadline | None:
        return cls(time.monotonic() + seconds, seconds, setting) if seconds is not None else None

    def reached(self) -> bool:
        return time.monotonic() >= self.at

    def passed(self) -> bool:
        """Reached, allowing for timer slack (after a timeout sized to the deadline fired)."""
        return time.monotonic() >= self.at - _TIMER_SLACK_S

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def error(self, method: str, observations: Any = None) -> BosDeadlineExceeded:
        return BosDeadlineExceeded(
            f"{method} did not finish within its {self.seconds}s deadline ({self.setting}); the call was "
            f"cancelled. Raise {self.setting} if the operation legitimately takes longer.",
            observations=observations,
        )


@dataclass(frozen=True)
class CallOptions:
    """How ``McpSession._call`` runs one request (the defaults: a plain request)."""

    deadline: Deadline | None = None
    #: Builds the consumer of the call's source-result notifications, given the request id.
    make_consumer: Callable[[str], Consumer] | None = None
    #: Set: the final frame's records are streamed (``federated_read(stream_records=True)``).
    final_style: ToolStyle | None = None
    #: The answer is a federated read's result: bounded by ``max_event_bytes``, not the small
    #: ``max_answer_bytes`` of every other answer (which is held and decoded whole).
    read_result: bool = False


@dataclass(frozen=True)
class StreamedCall:
    """A call whose answer is read as it arrives: what its checks and failure messages need."""

    method: str
    request_id: str
    deadline: Deadline | None
    observations: SourceResultsTracker | None
    cancel: threading.Event
    #: The session's stream idle timeout: the longest silence allowed between bytes of the stream.
    idle_timeout: float | None = None

    def wrong_id(self, found: Any) -> BosResultError:
        """The error of a response that carries another request's id."""
        return BosResultError(f"The response id {found!r} does not match the request id {self.request_id!r}; "
                              "the server answered some other request.")

    def check_id(self, message: Mapping[str, Any]) -> None:
        """Raise :meth:`wrong_id` if ``message`` (a response, or the start of one) names another request."""
        if "id" in message and not same_id(message["id"], self.request_id):
            raise self.wrong_id(message["id"])

    def check(self) -> None:
        """Raise if the call was cancelled or its deadline reached (checked per network chunk)."""
        if self.cancel.is_set():
            raise self.cancelled()
        if self.deadline is not None and self.deadline.reached():
            raise self.deadline.error(self.method, self.observations)

    def cancelled(self) -> BosReadCancelled:
        return BosReadCancelled(
            f"{self.method} was cancelled; there is no result.", observations=self.observations
        )

    def idle_timed_out(self, where: str) -> BosStreamIdleTimeout:
        """After a read timeout on the open stream that was not the deadline's."""
        return BosStreamIdleTimeout(
            f"BOS sent nothing for {self.idle_timeout}s on the open event stream {where} {self.method} "
            "(the stream idle timeout fired); there is no confirmed result. If the server legitimately "
            "stays silent that long, raise the connection's 'Stream idle timeout', then re-run the read.",
            observations=self.observations,
        )

    def interrupted(self) -> BosError | None:
        """After a transport error: the cancel or deadline that caused it, else None."""
        if self.cancel.is_set():
            return self.cancelled()
        if self.deadline is not None and self.deadline.passed():
            return self.deadline.error(self.method, self.observations)
        return None
