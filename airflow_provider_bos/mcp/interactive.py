"""What a server may ask that this unattended client cannot answer, turned into a typed error at once.

A server can need a person or a model in the loop: in the 2025-11-25 era it sends a request of
its own on the response stream (``elicitation/create``, ``sampling/createMessage``,
``roots/list``, ...) and waits for the answer; in the 2026-07-28 era it ends the call with
``resultType: "input_required"`` and its questions under ``inputRequests``. A federated read
runs in an Airflow task with nobody to ask, and the server would wait until the read's deadline,
so both fail at once with :class:`BosUnsupportedServerRequestError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_bos.exceptions import BosUnsupportedServerRequestError, excerpt

__all__ = ["ANSWERED_WITHOUT_A_REPLY", "server_request_error", "input_required_error"]

#: Server requests that need no answer from us to go on: a ``ping`` only checks the line is alive
#: (the open stream shows it is), and a server does not hold a result back for it.
ANSWERED_WITHOUT_A_REPLY = frozenset({"ping"})

_WHY = ("this client runs unattended and cannot answer interactive requests (elicitation, sampling, "
        "roots, further input); there is no result. Call a tool that needs no user input, or ask the "
        "BOS operator why this read asks for it.")


def server_request_error(method: str) -> BosUnsupportedServerRequestError:
    """The server sent a request ``method`` on the response stream of one of ours."""
    return BosUnsupportedServerRequestError(
        f"BOS sent the request {excerpt(method, 80)!r} on the response stream and waits for an answer: {_WHY}",
        request=method,
    )


def input_required_error(result: Mapping[str, Any], during: str) -> BosUnsupportedServerRequestError:
    """The server answered ``during`` with ``resultType: "input_required"``: name what it asks."""
    requests = result.get("inputRequests")
    asked: list[str] = []
    if isinstance(requests, Mapping):
        for name, request in list(requests.items())[:5]:
            method = request.get("method") if isinstance(request, Mapping) else None
            asked.append(f"{name} ({method})" if isinstance(method, str) else str(name))
    what = f" ({excerpt(', '.join(asked), 160)})" if asked else ""
    return BosUnsupportedServerRequestError(
        f"BOS answered {during} with resultType 'input_required': it asks for input{what}; {_WHY}",
        request="input_required",
    )
