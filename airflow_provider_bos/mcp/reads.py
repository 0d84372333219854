"""How a federated read is addressed: ``via`` (direct tool or ``bos_execute``) and the context.

The one rule for each, used by :class:`~airflow_provider_bos.mcp.McpSession`, the hook and the
operator: :func:`check_via` (the only ``via`` validation) and :func:`resolve_context_handle`
(the only choice of a context).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.models import BosContext

__all__ = ["VIAS", "check_via", "resolve_context_handle"]

#: ``auto``: direct when the tool is listed, else through ``bos_execute``.
VIAS = ("auto", "direct", "execute")


def check_via(via: str) -> str:
    """``via`` itself if it is one of :data:`VIAS`; else a :class:`BosConfigurationError`."""
    if via not in VIAS:
        raise BosConfigurationError(f"via must be 'auto', 'direct' or 'execute', not {via!r}.")
    return via


def resolve_context_handle(*given: str | None, contexts: Callable[[], Sequence[BosContext]]) -> str:
    """The first handle ``given`` (an explicit one, then a configured default), else the context
    BOS marks default, else the only authorized context. ``contexts`` is called only if needed.
    """
    for handle in given:
        if handle:
            return handle
    authorized = contexts()
    for context in authorized:
        if context.is_default:
            return context.context_handle
    if len(authorized) == 1:
        return authorized[0].context_handle
    raise BosConfigurationError(
        f"No context_handle given and BOS marks none of {len(authorized)} authorized contexts as default; "
        "set context_handle on the operator, the connection or the call."
    )
