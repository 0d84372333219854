"""Who we are to BOS: OAuth discovery, the connect flow, rotating grants and the token store.

Nothing in this package imports Airflow; the Airflow adapters pass in what they read from
Connections (refresh token, client id, token store engine, Fernet cipher).
"""

from __future__ import annotations

from airflow_provider_bos.auth.callback import LoopbackCallbackListener
from airflow_provider_bos.auth.connect import (
    ConnectOutcome,
    PendingAuthorization,
    exchange_code,
    prepare_authorization,
    register_client,
    run_connect_flow,
    validate_callback,
)
from airflow_provider_bos.auth.discovery import AuthServerInfo, discover
from airflow_provider_bos.auth.grants import (
    DEFAULT_SCOPES,
    ApiKeyAuth,
    BosTokenEndpointError,
    OAuthGrantAuth,
    TokenSet,
    request_token,
)
from airflow_provider_bos.auth.token_store import (
    Cipher,
    SqlTokenStore,
    StoredGrant,
    default_token_store_url,
    refresh_token_fingerprint,
)

__all__ = [
    "ApiKeyAuth",
    "AuthServerInfo",
    "BosTokenEndpointError",
    "Cipher",
    "ConnectOutcome",
    "DEFAULT_SCOPES",
    "LoopbackCallbackListener",
    "OAuthGrantAuth",
    "PendingAuthorization",
    "SqlTokenStore",
    "StoredGrant",
    "TokenSet",
    "default_token_store_url",
    "discover",
    "exchange_code",
    "prepare_authorization",
    "refresh_token_fingerprint",
    "register_client",
    "request_token",
    "run_connect_flow",
    "validate_callback",
]
