"""The one place BOS errors are defined.

Every error the provider raises on purpose is a :class:`BosError`. Messages say what failed and
what the user should do, and never carry a secret (tokens, keys, codes, verifiers): callers pass
URLs, statuses, rule names and short excerpts only, and :func:`excerpt` trims bodies.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_bos.redaction import longest_secret, printable, redacted_prefix

__all__ = [
    "BosError",
    "BosConfigurationError",
    "BosDiscoveryError",
    "BosAuthError",
    "BosCallbackError",
    "BosReconnectRequired",
    "BosTokenBindingError",
    "BosTokenStoreError",
    "BosHttpError",
    "BosRetryableHttpError",
    "BosTransportError",
    "BosProtocolError",
    "BosSseError",
    "BosEventTooLarge",
    "BosAnswerTooLarge",
    "BosStreamValidationError",
    "BosJsonRpcError",
    "BosSessionExpired",
    "BosResultError",
    "BosIncompleteStreamError",
    "BosDeadlineExceeded",
    "BosReadCancelled",
    "BosFinalFrameRestarted",
    "BosStreamIdleTimeout",
    "BosUnsupportedServerRequestError",
    "BosWarehouseError",
    "BosIdentifierError",
    "BosPartialReadError",
    "excerpt",
    "one_line",
]


# How much of a body is looked at for an excerpt: far more than is shown, so a secret that straddles
# the shown length is still whole when it is redacted.
_EXCERPT_SCAN_BYTES = 65536


def excerpt(body: bytes | str, limit: int = 200) -> str:
    """A short printable excerpt of a response body for error messages (never the whole body).

    Registered secrets are redacted before the cut and control characters are escaped.
    """
    if isinstance(body, bytes):
        # Enough bytes for the character window plus a secret across its end (UTF-8: <= 4 bytes a char).
        body = body[: 4 * (_EXCERPT_SCAN_BYTES + longest_secret())].decode("utf-8", errors="replace")
    # Redacted before whitespace is collapsed: a secret across the window's end is redacted whole.
    body = redacted_prefix(body, _EXCERPT_SCAN_BYTES)
    return printable(" ".join(body.split()), limit=limit)


class BosError(Exception):
    """Base class of every error raised by airflow-provider-bos."""


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line, as a log's or a command's last line shows it: what failed and
    what to do (a message listing several problems on lines of their own keeps them, space-joined)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class BosConfigurationError(BosError):
    """The connection or operator is configured wrongly (missing field, bad value)."""


# --- auth -------------------------------------------------------------------------------------


class BosDiscoveryError(BosError):
    """OAuth discovery failed one of the contract's checks.

    ``rule`` names the check (e.g. ``"https-required"``, ``"issuer-mismatch"``) so callers and tests
    can tell the failures apart; ``url`` is the URL that failed it.
    """

    def __init__(self, message: str, *, url: str | None = None, rule: str) -> None:
        self.url = url
        self.rule = rule
        where = f" ({url})" if url else ""
        super().__init__(f"OAuth discovery failed [{rule}]{where}: {message}")


class BosAuthError(BosError):
    """Authentication with BOS failed."""


class BosCallbackError(BosAuthError):
    """The OAuth callback URL failed validation; ``rule`` names the check."""

    def __init__(self, message: str, *, rule: str) -> None:
        self.rule = rule
        super().__init__(f"OAuth callback rejected [{rule}]: {message}")


class BosReconnectRequired(BosAuthError):
    """The grant is revoked, expired or rejected: a person must sign in again."""

    def __init__(self, message: str, *, conn_id: str | None = None) -> None:
        self.conn_id = conn_id
        command = f"airflow-provider-bos connect --conn-id {conn_id or '<conn_id>'}"
        super().__init__(f"{message} Reconnect with: {command}")


class BosTokenStoreError(BosAuthError):
    """The token store could not be read or written."""


class BosTokenBindingError(BosReconnectRequired, BosTokenStoreError):
    """A token store row holds a token sealed for another row or target (the table was copied into
    or altered): the token is not used, and a reconnect writes the row anew."""


# --- transport / HTTP -------------------------------------------------------------------------


class BosTransportError(BosError):
    """The HTTP connection failed (connect error, reset, timeout) before a response was complete."""


class BosHttpError(BosError):
    """BOS answered with an unexpected HTTP status or content type."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        content_type: str | None = None,
        body_excerpt: str | None = None,
        url: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.content_type = content_type
        self.body_excerpt = body_excerpt
        self.url = url
        parts = [message]
        if status_code is not None:
            parts.append(f"HTTP {status_code}")
        if content_type:
            parts.append(f"content-type {content_type}")
        if url:
            parts.append(f"url {url}")
        if body_excerpt:
            parts.append(f"body: {body_excerpt!r}")
        super().__init__("; ".join(parts))


class BosRetryableHttpError(BosHttpError):
    """429 / 502 / 503 / 504: worth retrying; ``retry_after`` is seconds when the server said so."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        self.retry_after = retry_after
        super().__init__(message, **kwargs)


# --- protocol ---------------------------------------------------------------------------------


class BosProtocolError(BosError):
    """BOS sent something the MCP / JSON-RPC / source-results contract does not allow."""


class BosSseError(BosProtocolError):
    """The event stream could not be parsed."""


class BosEventTooLarge(BosSseError):
    """One SSE event exceeded the configured maximum size."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"An SSE event exceeded the maximum event size of {limit} bytes; "
            "raise max_event_bytes (a bos Connection's 'Largest event (MiB)' field, max_event_mib) if "
            "results this large are expected."
        )


class BosAnswerTooLarge(BosProtocolError):
    """An answer held whole (the handshake, tools/list, contexts, a plain call) exceeded its small bound."""

    def __init__(self, method: str, limit: int) -> None:
        self.method = method
        self.limit = limit
        size = f"{limit // 1048576} MiB" if limit % 1048576 == 0 else f"{limit} bytes"
        super().__init__(
            f"BOS answered {method} with more than {size}; an answer other than a "
            "federated read's result is held and decoded whole, so it is refused above this bound (a broken "
            "or hostile server). Large data comes through a federated read, whose result is streamed."
        )


class BosStreamValidationError(BosProtocolError):
    """A bos/source-results/v1 notification broke the contract; ``rule`` names the broken rule."""

    def __init__(self, message: str, *, rule: str | None = None) -> None:
        self.rule = rule
        super().__init__(message)


class BosJsonRpcError(BosProtocolError):
    """The server answered a JSON-RPC request with an error object."""

    http_status: int | None = None

    def __init__(self, code: int, message: str, data: Any = None, *, method: str | None = None) -> None:
        self.code = code
        self.rpc_message = message
        self.data = data
        self.method = method
        where = f" to {method}" if method else ""
        super().__init__(f"JSON-RPC error {code}{where}: {excerpt(message)}")


class BosSessionExpired(BosProtocolError):
    """The server no longer knows our Mcp-Session-Id (HTTP 404); re-initialise."""


class BosResultError(BosProtocolError):
    """The final tool result is malformed or does not match the request."""


class BosDeadlineExceeded(BosError):
    """The operation deadline passed before the final response arrived; the call was cancelled."""

    def __init__(self, message: str, *, observations: Any = None) -> None:
        self.observations = observations
        super().__init__(message)


class BosIncompleteStreamError(BosError):
    """The stream ended (EOF or connection failure) before the matching final response.

    There is no confirmed terminal result. ``observations`` keeps the per-source progress seen so far.
    """

    def __init__(self, message: str, *, observations: Any = None) -> None:
        self.observations = observations
        super().__init__(message)


class BosFinalFrameRestarted(BosIncompleteStreamError):
    """The final frame was cut midway and the resumed stream sends it again from its start.

    Raised by a streamed read's records iterator (stream resumption, MCP 2025-11-25): every record
    that iterator handed out so far is void. ``records`` iterates the frame again from its first
    record; a consumer that cannot discard what it took (or does not know this signal) sees an
    incomplete stream, which is what it was.
    """

    def __init__(self, records: Any, *, observations: Any = None) -> None:
        self.records = records
        super().__init__(
            "The connection dropped inside the final response and the resumed stream sends it again "
            "from its start: discard the records taken so far and iterate `records` again.",
            observations=observations,
        )


class BosReadCancelled(BosIncompleteStreamError):
    """The read was cancelled on our side (``McpSession.cancel``, e.g. ``on_kill``); there is no result."""


class BosStreamIdleTimeout(BosIncompleteStreamError):
    """An open response stream sent no bytes for the stream idle timeout; there is no result."""


class BosUnsupportedServerRequestError(BosProtocolError):
    """The server asked the client something interactive (elicitation, sampling, roots, more input).

    This client runs unattended and cannot answer; ``request`` names what the server asked.
    """

    def __init__(self, message: str, *, request: str) -> None:
        self.request = request
        super().__init__(message)


# --- warehouse / Airflow ------------------------------------------------------------------------


class BosWarehouseError(BosError):
    """Writing to the destination database failed; the transaction was rolled back."""


class BosIdentifierError(BosWarehouseError, ValueError):
    """A table or schema name is not a safe SQL identifier."""


class BosPartialReadError(BosError):
    """A read came back partial (or failed) and the caller asked for that to fail."""
