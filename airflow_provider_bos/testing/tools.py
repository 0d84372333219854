"""The reference server's tool catalog and its non-streaming tool results (bos-identity-mcp/v2).

Pure data: no I/O. :mod:`airflow_provider_bos.testing.mcp_app` serves these through the MCP SDK
(catalog, context discovery, ``service.describe``, resources) or through its streaming path
(the federated reads ``people.search`` via ``bos_execute`` and the direct ``search_people``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "CONTRACT_VERSION",
    "TOOLS",
    "FEDERATED_OPERATIONS",
    "DIRECT_READ_TOOLS",
    "ToolCallError",
    "person_schema",
    "find_context",
    "default_context",
    "get_context_result",
    "list_context_tools_result",
    "service_describe_result",
    "schema_uri",
    "federated_target",
]

CONTRACT_VERSION = "bos-identity-mcp/v2"

_SEARCH_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "Free-text match on name or email."},
        "updated_since": {"type": "string", "format": "date-time",
                          "description": "Only people observed at or after this instant."},
        "limit": {"type": "integer", "minimum": 1, "description": "Maximum records to return."},
    },
    "additionalProperties": False,
}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "bos_get_context",
        "description": "List the BOS contexts (organization / application installation / role) you may use.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    {
        "name": "bos_list_context_tools",
        "description": "List the operations and readable resources of one BOS context.",
        "inputSchema": {
            "type": "object",
            "properties": {"context_handle": {"type": "string"}},
            "required": ["context_handle"],
            "additionalProperties": False,
        },
    },
    {
        "name": "bos_execute",
        "description": "Execute an operation of a BOS context (see bos_list_context_tools).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "context_handle": {"type": "string"},
                "tool_name": {"type": "string"},
                "arguments": {"type": "object"},
            },
            "required": ["context_handle", "tool_name"],
            "additionalProperties": False,
        },
    },
    {
        "name": "search_people",
        "description": "Federated people search across the default context's sources (direct read tool).",
        "inputSchema": _SEARCH_INPUT,
    },
]

FEDERATED_OPERATIONS = {"people.search"}  # bos_execute operations that are federated reads
DIRECT_READ_TOOLS = {"search_people"}


class ToolCallError(Exception):
    """Invalid tool arguments: answered as JSON-RPC -32602 (invalid params)."""


def _contexts(contexts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(c) for c in contexts]


def default_context(contexts: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(next((c for c in contexts if c.get("is_default")), contexts[0]))


def find_context(contexts: list[dict[str, Any]], handle: object) -> dict[str, Any]:
    if not isinstance(handle, str):
        raise ToolCallError("context_handle must be a string returned by bos_get_context")
    for ctx in contexts:
        if ctx["context_handle"] == handle:
            return dict(ctx)
    raise ToolCallError("Unknown or unauthorized context_handle; call bos_get_context for the current handles")


def schema_uri(handle: str) -> str:
    return f"bos://contexts/{handle}/schema/person"


def get_context_result(contexts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"contract_version": CONTRACT_VERSION, "contexts": _contexts(contexts)}


def _operations() -> list[dict[str, Any]]:
    return [
        {
            "name": "people.search",
            "description": "Federated people search across this context's sources.",
            "input_schema": _SEARCH_INPUT,
            "federated": True,
        },
        {
            "name": "service.describe",
            "description": "Describe this BOS service and context.",
            "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
            "federated": False,
        },
    ]


def list_context_tools_result(contexts: list[dict[str, Any]], arguments: dict[str, Any]) -> dict[str, Any]:
    ctx = find_context(contexts, arguments.get("context_handle"))
    return {
        "contract_version": CONTRACT_VERSION,
        "context": ctx,
        "operations": _operations(),
        "resources": [{
            "uri": schema_uri(ctx["context_handle"]),
            "name": "person schema",
            "description": "JSON Schema of a FederatedRecord returned by people.search.",
            "mimeType": "application/schema+json",
        }],
    }


def service_describe_result(ctx: dict[str, Any]) -> dict[str, Any]:
    return {
        "contract_version": CONTRACT_VERSION,
        "context": ctx,
        "result": {
            "service": "BOS reference server",
            "extensions": ["bos/source-results/v1"],
            "operations": [op["name"] for op in _operations()],
        },
    }


def federated_target(contexts: list[dict[str, Any]], name: str,
                     arguments: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """``(style, context, business_arguments)`` when the call is a federated read, else None.

    Raises :class:`ToolCallError` for a federated call with invalid arguments.
    """
    if name in DIRECT_READ_TOOLS:
        _check_search_arguments(arguments)
        return "direct", default_context(contexts), dict(arguments)
    if name == "bos_execute" and arguments.get("tool_name") in FEDERATED_OPERATIONS:
        ctx = find_context(contexts, arguments.get("context_handle"))
        business = arguments.get("arguments", {})
        if not isinstance(business, dict):
            raise ToolCallError("arguments must be an object")
        _check_search_arguments(business)
        return "execute", ctx, dict(business)
    return None


def _check_search_arguments(arguments: dict[str, Any]) -> None:
    unknown = set(arguments) - set(_SEARCH_INPUT["properties"])
    if unknown:
        raise ToolCallError(f"Unknown argument(s) for people.search: {', '.join(sorted(unknown))}")
    if "query" in arguments and not isinstance(arguments["query"], str):
        raise ToolCallError("query must be a string")
    if "updated_since" in arguments and not isinstance(arguments["updated_since"], str):
        raise ToolCallError("updated_since must be an ISO 8601 string")
    limit = arguments.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ToolCallError("limit must be a positive integer")


def person_schema() -> str:
    """The JSON Schema text served at ``bos://contexts/<handle>/schema/person``."""
    nullable = {"type": ["string", "null"]}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "FederatedRecord",
        "type": "object",
        "required": ["record_ref", "sources"],
        "properties": {
            "record_ref": {"type": "string", "minLength": 1},
            "display_name": nullable,
            "email": nullable,
            "phone": nullable,
            "lifecycle": {},
            "identity_match": {},
            "attributes": {"type": "object"},
            "sources": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["source_type", "source_identity", "external_id", "record_type", "observed_at",
                                 "capabilities"],
                    "properties": {
                        "source_type": {"type": "string"},
                        "source_identity": {"type": "string"},
                        "external_id": {"type": "string"},
                        "record_type": {"type": "string"},
                        "observed_at": {"type": "string"},
                        "capabilities": {"type": "array", "items": {"type": "string"}},
                        "version": {"type": ["string", "integer", "null"]},
                    },
                },
            },
        },
    }
    return json.dumps(schema, indent=2)
