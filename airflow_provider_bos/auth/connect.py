"""The user-operated first sign-in: registration, PKCE authorization request, callback, code exchange.

Follows the contract's client example (``prepareConnect`` / ``completeConnect``), as an MCP-aware
client: the discovered ``resource`` is sent explicitly in the authorization and token requests.

Callback validation (:func:`validate_callback`) raises
:class:`~airflow_provider_bos.exceptions.BosCallbackError` whose ``rule`` is one of:

- ``RULE_CALLBACK_INVALID_URL`` ("callback-invalid-url"): not an absolute http(s) URL.
- ``RULE_CALLBACK_ORIGIN`` ("callback-origin-mismatch"): not the registered redirect's origin.
- ``RULE_CALLBACK_PATH`` ("callback-path-mismatch"): not the registered redirect's path.
- ``RULE_AUTHORIZATION_ERROR`` ("authorization-error"): the server redirected with ``error=``.
- ``RULE_PARAM_MISSING`` ("callback-param-missing"): no ``state``, ``iss`` or ``code``.
- ``RULE_PARAM_DUPLICATE`` ("callback-param-duplicate"): ``state``, ``iss`` or ``code`` repeated.
- ``RULE_STATE_MISMATCH`` ("state-mismatch"): ``state`` is not the one we sent.
- ``RULE_ISSUER_MISMATCH`` ("callback-issuer-mismatch"): ``iss`` is not the discovered issuer.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from airflow_provider_bos.auth.bounded import BodyTooLarge, parse_json, send_bounded
from airflow_provider_bos.auth.callback import LoopbackCallbackListener
from airflow_provider_bos.auth.discovery import AuthServerInfo, discover
from airflow_provider_bos.auth.grants import DEFAULT_SCOPES, TokenSet, request_token
from airflow_provider_bos.auth.pkce import new_verifier, random_value, s256_challenge
from airflow_provider_bos.auth.urls import parse_url
from airflow_provider_bos.exceptions import BosAuthError, BosCallbackError, BosConfigurationError, excerpt
from airflow_provider_bos.redaction import register_secret

__all__ = [
    "PendingAuthorization",
    "ConnectOutcome",
    "register_client",
    "prepare_authorization",
    "validate_callback",
    "exchange_code",
    "run_connect_flow",
    "CLIENT_NAME",
    "RULE_CALLBACK_INVALID_URL",
    "RULE_CALLBACK_ORIGIN",
    "RULE_CALLBACK_PATH",
    "RULE_AUTHORIZATION_ERROR",
    "RULE_PARAM_MISSING",
    "RULE_PARAM_DUPLICATE",
    "RULE_STATE_MISMATCH",
    "RULE_ISSUER_MISMATCH",
]

CLIENT_NAME = "airflow-provider-bos"

RULE_CALLBACK_INVALID_URL = "callback-invalid-url"
RULE_CALLBACK_ORIGIN = "callback-origin-mismatch"
RULE_CALLBACK_PATH = "callback-path-mismatch"
RULE_AUTHORIZATION_ERROR = "authorization-error"
RULE_PARAM_MISSING = "callback-param-missing"
RULE_PARAM_DUPLICATE = "callback-param-duplicate"
RULE_STATE_MISMATCH = "state-mismatch"
RULE_ISSUER_MISMATCH = "callback-issuer-mismatch"


@dataclass(frozen=True)
class PendingAuthorization:
    """The private half of an authorization request. The repr hides the verifier and state."""

    client_id: str
    redirect_uri: str
    verifier: str = field(repr=False)
    state: str = field(repr=False)
    issuer: str
    resource: str | None
    authorization_url: str = field(repr=False)
    scope: str = DEFAULT_SCOPES
    created_at: float = field(default_factory=time.time)


def _oauth_error_detail(body: bytes) -> str:
    try:
        payload = parse_json(body)
    except ValueError:
        return f"body: {excerpt(body, 120)!r}"
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        description = payload.get("error_description")
        suffix = f" ({excerpt(description, 160)})" if isinstance(description, str) and description else ""
        return f"{excerpt(payload['error'], 60)}{suffix}"
    return "no OAuth error code"


def register_client(
    info: AuthServerInfo, redirect_uri: str, *, http_client: httpx.Client, client_name: str = CLIENT_NAME
) -> str:
    """Dynamic client registration (RFC 7591) of a public client for exactly ``redirect_uri``."""
    if not info.registration_endpoint:
        raise BosConfigurationError(
            f"The authorization server {info.issuer} offers no dynamic client registration; "
            "register a client with it and pass --client-id."
        )
    body = {
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
    }
    try:
        response, answer = send_bounded(
            http_client, "POST", info.registration_endpoint, json=body, headers={"Accept": "application/json"}
        )
    except httpx.HTTPError as exc:
        raise BosAuthError(
            f"Client registration at {info.registration_endpoint} failed: {type(exc).__name__}"
        ) from None
    except BodyTooLarge as exc:
        raise BosAuthError(
            f"Client registration at {info.registration_endpoint} answered with more than {exc.limit} bytes."
        ) from None
    if not 200 <= response.status_code < 300:
        raise BosAuthError(
            f"Client registration at {info.registration_endpoint} was refused: HTTP {response.status_code}, "
            f"{_oauth_error_detail(answer)}."
        )
    try:
        payload = parse_json(answer)
    except ValueError:
        payload = None
    client_id = payload.get("client_id") if isinstance(payload, dict) else None
    if not isinstance(client_id, str) or not client_id or not client_id.isprintable() or len(client_id) > 255:
        raise BosAuthError(f"Client registration at {info.registration_endpoint} returned no client_id.")
    return client_id


def prepare_authorization(
    info: AuthServerInfo,
    *,
    client_id: str,
    redirect_uri: str,
    scopes: tuple[str, ...] | list[str] | str = ("mcp:tools", "offline_access"),
    resource: str | None = None,
) -> PendingAuthorization:
    """Mint verifier and state and build the authorization URL (PKCE S256, resource sent)."""
    scope = scopes if isinstance(scopes, str) else " ".join(scopes)
    verifier = new_verifier()
    state = random_value()
    register_secret(verifier)
    # state is a CSRF nonce that travels in the (printed) authorization URL by design: not a secret.
    resource = resource or info.resource
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": scope,
        "state": state,
        "code_challenge": s256_challenge(verifier),
        "code_challenge_method": "S256",
    }
    if resource:
        params["resource"] = resource
    parts = urlsplit(info.authorization_endpoint)
    # Like the example's ``url.search = ...``: our parameters replace any query (and no fragment).
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(params), ""))
    return PendingAuthorization(
        client_id=client_id,
        redirect_uri=redirect_uri,
        verifier=verifier,
        state=state,
        issuer=info.issuer,
        resource=resource,
        authorization_url=url,
        scope=scope,
    )


def validate_callback(pending: PendingAuthorization, callback_url: str) -> str:
    """Check the callback exactly like the example's ``completeConnect``; return the code."""
    callback_url = callback_url.strip()
    try:
        callback = parse_url(callback_url)
        target = parse_url(pending.redirect_uri)
    except (TypeError, ValueError):
        raise BosCallbackError(
            "the callback is not an absolute http(s) URL.", rule=RULE_CALLBACK_INVALID_URL
        ) from None
    if callback.origin != target.origin:
        raise BosCallbackError(
            f"the callback went to {callback.origin}, not the registered redirect's origin {target.origin}.",
            rule=RULE_CALLBACK_ORIGIN,
        )
    if callback.path != target.path:
        raise BosCallbackError(
            f"the callback path {callback.path!r} is not the registered redirect's path {target.path!r}.",
            rule=RULE_CALLBACK_PATH,
        )
    params = parse_qsl(callback.query, keep_blank_values=True)
    values: dict[str, list[str]] = {}
    for name, value in params:
        values.setdefault(name, []).append(value)
    if "error" in values:
        error = excerpt(values["error"][0], 60)
        description = values.get("error_description", [""])[0]
        detail = f" ({excerpt(description, 160)})" if description else ""
        raise BosCallbackError(
            f"the authorization server returned error {error!r}{detail}; nothing was granted. "
            "Run connect again (and check the requested scopes and resource).",
            rule=RULE_AUTHORIZATION_ERROR,
        )
    for name in ("state", "iss", "code"):
        count = len(values.get(name, []))
        if count == 0:
            raise BosCallbackError(f"the callback has no {name!r} parameter.", rule=RULE_PARAM_MISSING)
        if count > 1:
            raise BosCallbackError(
                f"the callback has {count} {name!r} parameters.", rule=RULE_PARAM_DUPLICATE
            )
    if not hmac.compare_digest(values["state"][0].encode(), pending.state.encode()):
        raise BosCallbackError(
            "the callback state is not the one this sign-in sent (a stale or forged callback).",
            rule=RULE_STATE_MISMATCH,
        )
    if values["iss"][0] != pending.issuer:
        raise BosCallbackError(
            f"the callback issuer {excerpt(values['iss'][0], 120)!r} is not {pending.issuer!r}.",
            rule=RULE_ISSUER_MISMATCH,
        )
    code = values["code"][0]
    register_secret(code)
    return code


def exchange_code(
    info: AuthServerInfo, pending: PendingAuthorization, code: str, *, http_client: httpx.Client
) -> TokenSet:
    """Redeem the code at once with the verifier and the exact registered redirect."""
    register_secret(code)
    form = {
        "grant_type": "authorization_code",
        "client_id": pending.client_id,
        "redirect_uri": pending.redirect_uri,
        "code": code,
        "code_verifier": pending.verifier,
    }
    if pending.resource:
        form["resource"] = pending.resource
    return request_token(http_client, info.token_endpoint, form, default_scope=pending.scope)


@dataclass(frozen=True)
class ConnectOutcome:
    """What a finished sign-in produced (tokens hidden in reprs)."""

    info: AuthServerInfo
    client_id: str
    redirect_uri: str
    tokens: TokenSet
    registered: bool  # True when this flow registered the client


def _check_paste_redirect(redirect_uri: str) -> None:
    """Paste mode sends the code through a page the user's browser reaches: https only (a loopback
    redirect is the listener's job, which needs no paste)."""
    try:
        target = parse_url(redirect_uri)
    except ValueError:
        target = None
    if target is None or target.scheme != "https" or target.has_userinfo or target.fragment is not None:
        raise BosConfigurationError(
            f"--redirect-uri must be an https URL the browser can reach (no user:password@, no #fragment): "
            f"{excerpt(redirect_uri, 200)}"
        )


def run_connect_flow(
    resource_url: str,
    *,
    present: Callable[[str], str | None],
    client_id: str | None = None,
    redirect_uri: str | None = None,
    read_pasted_callback: Callable[[], str] | None = None,
    port: int = 0,
    callback_path: str = "/callback",
    timeout_s: float = 300.0,
    http_client: httpx.Client | None = None,
    client_name: str = CLIENT_NAME,
) -> ConnectOutcome:
    """Discovery, registration, authorization, callback, validation and exchange, in order.

    With ``redirect_uri`` (paste mode, an https URL) the callback URL comes from
    ``read_pasted_callback``; otherwise a :class:`LoopbackCallbackListener` on 127.0.0.1 receives it
    and accepts only the request carrying this sign-in's ``state``. ``present`` shows the
    authorization URL to the user (prints it, opens a browser); if it returns a URL, that is taken
    as the callback (the auto-follow test mode uses this in paste mode).
    """
    if redirect_uri is not None:
        _check_paste_redirect(redirect_uri)
        if read_pasted_callback is None:
            raise BosConfigurationError("Paste mode needs a way to read the callback URL.")
    owns_client = http_client is None
    client = http_client or httpx.Client(timeout=30.0)
    listener: LoopbackCallbackListener | None = None
    try:
        info = discover(resource_url, http_client=client)
        if redirect_uri is None:
            listener = LoopbackCallbackListener(port=port, path=callback_path)
            redirect = listener.redirect_uri
        else:
            redirect = redirect_uri
        registered = client_id is None
        the_client_id = client_id or register_client(
            info, redirect, http_client=client, client_name=client_name
        )
        pending = prepare_authorization(info, client_id=the_client_id, redirect_uri=redirect)
        if listener is not None:
            listener.expect_state(pending.state)
        shown = present(pending.authorization_url)
        if shown:
            callback_url = shown
        elif listener is not None:
            callback_url = listener.wait(timeout_s)
        else:
            assert read_pasted_callback is not None
            callback_url = read_pasted_callback()
        code = validate_callback(pending, callback_url)
        tokens = exchange_code(info, pending, code, http_client=client)
        return ConnectOutcome(
            info=info, client_id=the_client_id, redirect_uri=redirect, tokens=tokens, registered=registered
        )
    finally:
        if listener is not None:
            listener.close()
        if owns_client:
            client.close()
