"""The CLI's connect flow, driven by two web requests instead of one terminal session.

:func:`begin_web_connect` is the first half of ``run_connect_flow`` (discovery with all its checks,
dynamic registration for the API server's own callback, PKCE S256 + state + resource), ending with
the pending sign-in kept server-side. :func:`finish_web_connect` is the second half: the pending
row of the signed-in user is taken (single use, expiring) before anything else, the callback is validated against it
(target, state, ``iss``), discovery runs again and must name the same issuer, the code is exchanged
with the verifier, and the grant is seeded into the token store exactly as ``connect`` does. No
Airflow import here: the adapters pass the stores in.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

import httpx

from airflow_provider_bos.auth.connect import (
    CLIENT_NAME,
    RULE_PARAM_DUPLICATE,
    RULE_PARAM_MISSING,
    ConnectOutcome,
    exchange_code,
    prepare_authorization,
    register_client,
    validate_callback,
)
from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.auth.grants import DEFAULT_SCOPES
from airflow_provider_bos.auth.token_store import SqlTokenStore, StoredGrant
from airflow_provider_bos.auth.urls import parse_url
from airflow_provider_bos.exceptions import BosAuthError, BosCallbackError, BosConfigurationError
from airflow_provider_bos.plugins.pending import RULE_OTHER_USER, ConnectTarget, PendingConnectStore

__all__ = ["RULE_OTHER_USER", "begin_web_connect", "check_redirect_uri", "finish_web_connect"]



def check_redirect_uri(redirect_uri: str) -> None:
    """The API server's callback must be https, or http on a loopback host (oauth-client rules)."""
    try:
        target = parse_url(redirect_uri)
    except ValueError:
        raise BosConfigurationError(
            f"The callback URL {redirect_uri!r} is not an absolute http(s) URL."
        ) from None
    if target.scheme != "https" and not target.is_loopback:
        raise BosConfigurationError(
            f"The API server's callback {redirect_uri} is plain http on a non-loopback host; BOS only "
            "redirects to https (or to http on loopback). Serve the API server over https and set "
            "[api] base_url to the https URL your browser uses."
        )


def begin_web_connect(
    target: ConnectTarget,
    *,
    redirect_uri: str,
    user_id: str,
    pending: PendingConnectStore,
    http_client: httpx.Client,
) -> str:
    """Discover, register a public client for ``redirect_uri``, keep the pending sign-in; the sign-in URL."""
    check_redirect_uri(redirect_uri)
    info = discover(target.resource_url, http_client=http_client)
    client_id = register_client(info, redirect_uri, http_client=http_client, client_name=CLIENT_NAME)
    authorization = prepare_authorization(info, client_id=client_id, redirect_uri=redirect_uri)
    pending.put(authorization, target, user_id=user_id)
    return authorization.authorization_url


def _single_state(callback_url: str) -> str:
    states = [v for k, v in parse_qsl(urlsplit(callback_url).query, keep_blank_values=True) if k == "state"]
    if not states:
        raise BosCallbackError("the callback has no 'state' parameter.", rule=RULE_PARAM_MISSING)
    if len(states) > 1:
        raise BosCallbackError(
            f"the callback has {len(states)} 'state' parameters.", rule=RULE_PARAM_DUPLICATE
        )
    return states[0]


def finish_web_connect(
    callback_url: str,
    *,
    user_id: str,
    pending: PendingConnectStore,
    open_token_store: Callable[[ConnectTarget], SqlTokenStore],
    http_client: httpx.Client,
    authorize: Callable[[ConnectTarget], None] = lambda _target: None,
) -> tuple[ConnectTarget, ConnectOutcome, StoredGrant]:
    """Validate the callback against its pending sign-in, exchange the code, seed the token store.

    ``authorize`` may refuse the pending sign-in's Connection (by raising) before any code is spent.
    """
    # The user is checked before the row is consumed; once taken it is spent even if what follows fails.
    started = pending.take(_single_state(callback_url), user_id=user_id)
    authorize(started.target)
    code = validate_callback(started.authorization, callback_url)
    info = discover(started.target.resource_url, http_client=http_client)
    if info.issuer != started.authorization.issuer:
        raise BosAuthError(
            f"Discovery now names the issuer {info.issuer!r}, not {started.authorization.issuer!r} that "
            "this sign-in started with; nothing was stored. Start Connect again."
        )
    store = open_token_store(started.target)
    try:
        store.ensure_table()  # a broken store is found before the code is spent
        tokens = exchange_code(info, started.authorization, code, http_client=http_client)
        if not tokens.refresh_token:
            raise BosAuthError(
                "BOS issued no refresh token (the offline_access scope was not granted); a scheduled "
                "connection needs one. Connect again and approve offline access."
            )
        # The same call as `airflow-provider-bos connect`: one row per Connection, force-replaced.
        grant = store.seed(
            started.target.conn_id,
            client_id=started.authorization.client_id,
            token_endpoint=info.token_endpoint,
            resource=info.resource,
            scope=tokens.scope or DEFAULT_SCOPES,
            refresh_token=tokens.refresh_token,
            access_token=tokens.access_token,
            expires_at=tokens.expires_at,
            force=True,
        )
    finally:
        store.dispose()
    outcome = ConnectOutcome(
        info=info,
        client_id=started.authorization.client_id,
        redirect_uri=started.authorization.redirect_uri,
        tokens=tokens,
        registered=True,
    )
    return started.target, outcome, grant
