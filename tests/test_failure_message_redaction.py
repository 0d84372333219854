"""Exception text is redacted before it is cut, on every path that stores or shows it.

A registered secret straddling the cut must not leave its prefix behind: the masker (and
:func:`~airflow_provider_bos.redaction.redact`) match whole secrets, so a cut-off prefix would
be stored and shown as it is. Paths: the audit row's ``error_message`` built by
:func:`~airflow_provider_bos.sync.failure_message` (BosError and any other error, each with its
own limit), the failed audit row :func:`~airflow_provider_bos.sync.run_sync` writes, the row as
the audit table stores it, and the sensor's (and notifier's) verdict built from that row.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from airflow_provider_bos.exceptions import BosError, BosTransportError
from airflow_provider_bos.redaction import register_secret
from airflow_provider_bos.sensors.verdict import judge
from airflow_provider_bos.sync import failure_message, run_sync
from airflow_provider_bos.warehouse.run.audit import ERROR_MESSAGE_MAX, truncate_error


def a_secret() -> str:
    value = "tok_" + secrets.token_hex(16)
    register_secret(value)
    return value


def straddling(secret: str, cut: int, prefix: str = "") -> str:
    """Text whose exception message (after ``prefix``, the type name) puts ``secret`` across ``cut``."""
    return "x" * (cut - len(prefix) - len(secret) // 2) + secret + " and more" * 50


def leaked(secret: str, text: str) -> bool:
    """Any 8-character piece of the secret in ``text`` (its prefix, its middle, its end)."""
    return any(secret[i:i + 8] in text for i in range(len(secret) - 7))


@pytest.mark.parametrize(("error", "limit"), [(BosTransportError, 2000), (RuntimeError, 500)])
def test_failure_message_redacts_a_secret_straddling_its_cut(error: type[Exception], limit: int) -> None:
    secret = a_secret()
    message = failure_message(error(straddling(secret, limit)))
    assert not leaked(secret, message), message
    assert message.startswith(f"{error.__name__}: xxx")
    assert len(message) <= len(error.__name__) + 2 + limit + 1  # still bounded (+ the "…" of the cut)


class _Sink:
    """A RecordSink that only records the failed audit row."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def known_wire_hashes(self) -> Any:
        return None

    def require_pii_policy(self, fingerprint: Any) -> None:
        pass

    def write_run(self, run: Any, records: Any, options: Any) -> Any:
        raise AssertionError("the read failed; nothing is written")

    def record_failure(self, run: Any, *, error: str, **_: Any) -> None:
        self.errors.append(error)


class _Run:
    run_id = "r-1"
    context_handle: str | None = None


def test_run_syncs_failed_audit_row_holds_no_piece_of_a_secret_straddling_the_cut() -> None:
    secret = a_secret()

    def read(*_: Any, **__: Any) -> Any:
        raise BosError(straddling(secret, 2000))

    sink = _Sink()
    with pytest.raises(BosError):
        run_sync(read, sink, _Run(), tool_name="t", arguments={})
    [stored] = sink.errors
    assert not leaked(secret, stored), stored


def test_the_audit_tables_error_message_is_redacted_before_its_cut() -> None:
    secret = a_secret()
    stored = truncate_error(straddling(secret, ERROR_MESSAGE_MAX))
    assert stored is not None and not leaked(secret, stored)


def test_the_sensors_and_notifiers_verdict_shows_no_piece_of_a_secret() -> None:
    secret = a_secret()
    row = {"run_id": "r-1", "tool_name": "t", "context_handle": "ctx", "status": "failed",
           "error_message": failure_message(RuntimeError(straddling(secret, 500)))}
    verdict = judge(row)
    assert "failed" in verdict.message and not leaked(secret, verdict.message)
