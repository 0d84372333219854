"""The page's live probe and its Check: a task's own hook, confined to the page's outbound rules.

Both first run discovery against the Connection's resource URL through the guarded client: until
it succeeds the endpoint is not a verified BOS resource, and what the page shows about it is only
discovery's own error (which never repeats a body or a redirect target). Only then does the hook
open a session, so an API key is sent only to an endpoint that passed discovery, and errors of a
verified BOS resource are shown as they are. The hook's token store is opened as the page opens
stores (:mod:`.stores`: only an allowed one, its database dialled under the page's host policy and
deadline), to write: a probe may refresh the grant.
"""

from __future__ import annotations

from typing import Any

import httpx

from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.exceptions import BosTransportError
from airflow_provider_bos.hooks.bos import BosHook
from airflow_provider_bos.mcp.exchange import DEFAULT_MAX_ANSWER_BYTES
from airflow_provider_bos.models import BosContext
from airflow_provider_bos.plugins.outbound import Deadline, OutboundPolicy, page_client
from airflow_provider_bos.plugins.pending import ConnectTarget
from airflow_provider_bos.plugins.stores import open_page_store

__all__ = ["PageHook", "check_contexts", "probe"]


class PageHook(BosHook):
    """:class:`BosHook` whose HTTP client follows the page's outbound policy and deadline."""

    def __init__(self, bos_conn_id: str, *, policy: OutboundPolicy, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(bos_conn_id, **kwargs)
        self._policy = policy
        self._deadline = deadline

    def _new_http_client(self, timeout: float) -> httpx.Client:
        return page_client(self._policy, self._deadline, timeout=timeout)

    def _max_event_bytes(self) -> int:
        # The API server reads only small answers (handshake, contexts): the Connection's 'Largest
        # event' is for a task's read result and must not raise what the page holds and decodes.
        return DEFAULT_MAX_ANSWER_BYTES

    def _token_store(self) -> Any:
        cfg = self.config
        target = ConnectTarget(cfg.conn_id, cfg.resource_url, cfg.token_store_conn_id, cfg.token_store_url)
        store = open_page_store(target, read_only=False, policy=self._policy, deadline=self._deadline)
        self._resources.append(store.dispose)
        return store


def _verify_resource(resource_url: str, policy: OutboundPolicy, deadline: Deadline) -> None:
    with page_client(policy, deadline) as client:
        try:
            discover(resource_url, http_client=client)
        except httpx.HTTPError as exc:  # the deadline, or a transport failure discovery did not wrap
            raise BosTransportError(
                f"Could not verify {resource_url} as a BOS resource: {type(exc).__name__}"
            ) from None


def probe(conn_id: str, resource_url: str, *, policy: OutboundPolicy, deadline: Deadline) -> BaseException | None:
    """Open an MCP session the way a task does (refreshing under the store lock if needed)."""
    try:
        _verify_resource(resource_url, policy, deadline)
        with PageHook(conn_id, policy=policy, deadline=deadline) as hook:
            hook.get_conn()
    except Exception as exc:  # noqa: BLE001 - reported on the page, not raised
        return exc
    return None


def check_contexts(
    conn_id: str, resource_url: str, *, policy: OutboundPolicy, deadline: Deadline
) -> list[BosContext]:
    """Discovery, then ``bos_get_context`` with the Connection's credential."""
    _verify_resource(resource_url, policy, deadline)
    with PageHook(conn_id, policy=policy, deadline=deadline) as hook:
        try:
            return hook.list_contexts()
        except httpx.HTTPError as exc:
            raise BosTransportError(f"BOS did not answer the check: {type(exc).__name__}") from None
