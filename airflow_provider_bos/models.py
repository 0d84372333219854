"""Pydantic models of the BOS wire contract (``shared/spec/source-results-v1.txt``).

Field names are the contract's, down to case (``requestId``, ``pageIndex``). Models accept extra
fields (``extra="allow"``) so a newer server's additions are preserved, not dropped; the fields we
rely on are typed and validated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SOURCE_RESULTS_EXTENSION",
    "SOURCE_RESULT_METHOD",
    "SOURCE_ERROR_CODES",
    "PROTOCOL_2025",
    "PROTOCOL_2026",
    "SourceErrorCode",
    "stored_source_error",
    "SourceStatus",
    "Provenance",
    "FederatedRecord",
    "SourceRef",
    "SourceErrorInfo",
    "SourceErrorEntry",
    "BosContext",
    "SourceResultParams",
    "MetadataProvenance",
    "ReadMetadata",
]

SOURCE_RESULTS_EXTENSION = "bos/source-results/v1"
SOURCE_RESULT_METHOD = "notifications/bos/source_result"
PROTOCOL_2025 = "2025-11-25"
PROTOCOL_2026 = "2026-07-28"

SourceErrorCode = Literal[
    "source_timeout",
    "source_identity_mismatch",
    "provider_authorization_required",
    "rate_limited",
    "source_unavailable",
]
SOURCE_ERROR_CODES: frozenset[str] = frozenset(SourceErrorCode.__args__)  # type: ignore[attr-defined]

SourceStatus = Literal["page", "complete", "error"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False, populate_by_name=True)


class Provenance(_Wire):
    """One provenance entry of a record: where it was observed."""

    source_type: str
    source_identity: str
    external_id: str
    record_type: str
    observed_at: str
    capabilities: list[str]
    version: str | int | None = None


class FederatedRecord(_Wire):
    """A federated identity record. ``record_ref`` is the warehouse key."""

    record_ref: str = Field(min_length=1)
    display_name: str | None = None
    email: str | None = None
    phone: str | None = None
    lifecycle: Any = None
    identity_match: Any = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    sources: list[Provenance] = Field(min_length=1)


class SourceRef(BaseModel):
    """The complete source pair that identifies one source of a federated read."""

    model_config = ConfigDict(extra="allow", frozen=True)

    source_type: str
    source_identity: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.source_type, self.source_identity)

    def __str__(self) -> str:
        return f"{self.source_type}/{self.source_identity}"


class SourceErrorInfo(_Wire):
    # One of the contract's five, in a page and in the final alike: any other text would be stored.
    code: SourceErrorCode


class SourceErrorEntry(_Wire):
    """One entry of ``metadata.source_errors``."""

    source: SourceRef
    error: SourceErrorInfo

    def as_stored(self) -> dict[str, Any]:
        """The entry as an audit row keeps it: the contract's fields only. A server's own words beside
        the code may quote a person, and no personal-data policy or erasure reaches into them."""
        return stored_source_error(self.source, self.error.code)


def stored_source_error(source: SourceRef, code: str) -> dict[str, Any]:
    """A source error as an audit row's ``source_errors`` holds it (:meth:`SourceErrorEntry.as_stored`)."""
    return {"source": {"source_type": source.source_type, "source_identity": source.source_identity},
            "error": {"code": code}}


class BosContext(_Wire):
    """A public BOS context (an authorized organization / application / installation / role)."""

    context_handle: str
    organization_name: str | None = None
    application_name: str | None = None
    installation_name: str | None = None
    role_label: str | None = None
    is_default: bool = False


class SourceResultParams(_Wire):
    """``params`` of a ``notifications/bos/source_result`` notification."""

    requestId: str | int
    sequence: int
    pageIndex: int
    source: SourceRef
    records: list[FederatedRecord]
    status: str  # validated against SourceStatus by the stream tracker, which names the error
    error: SourceErrorInfo | None = None
    context: BosContext | None = None


class MetadataProvenance(_Wire):
    source_type: str
    source_identity: str
    observed_at: str | None = None


class ReadMetadata(_Wire):
    """``metadata`` of a federated read's final result."""

    completeness: str
    result_count: int | None = None
    observed_at: str | None = None
    retrieval_mode: str | None = None
    provenance: list[MetadataProvenance] = Field(default_factory=list)
    source_errors: list[SourceErrorEntry] = Field(default_factory=list)
