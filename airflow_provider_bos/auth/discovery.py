"""OAuth discovery for a BOS MCP resource, exactly as the contract's client example does it.

1. POST ``initialize`` (JSON-RPC, protocolVersion 2025-11-25) to the MCP URL without a token: the
   answer must be HTTP 401 with a ``WWW-Authenticate`` challenge carrying ``resource_metadata``.
2. GET that protected-resource metadata (same origin as the MCP URL); its ``resource`` must equal
   the MCP URL.
3. Its first ``authorization_servers`` entry is the issuer: same origin, path ``/``.
4. GET ``<issuer origin>/.well-known/oauth-authorization-server`` (RFC 8414): ``issuer`` must equal
   the issuer's href without the trailing slash; the registration, authorization and token
   endpoints must be on the trusted origin; ``S256`` must be a supported PKCE method.

Every URL must be ``https`` without userinfo or fragment; plain ``http`` is accepted only for
loopback hosts (127.0.0.0/8, ::1, localhost) so a local reference server works. Redirects are never
followed and metadata documents are read with a size bound.

Until discovery has succeeded the endpoint is not a verified BOS resource, and it may be anything a
user typed (the Admin -> BOS page runs discovery from the API server). Its errors therefore never
repeat a response body or a redirect's ``Location``, and a metadata value is repeated only when it
is a URL on the resource's own origin (control characters escaped): a typo is still explained, an
internal service's answer is not relayed.

Each failed check raises :class:`~airflow_provider_bos.exceptions.BosDiscoveryError` whose ``rule``
is one of these module constants (and whose ``url`` is the URL that failed it):

- ``RULE_INVALID_URL`` ("invalid-url"): not an absolute http(s) URL.
- ``RULE_HTTPS_REQUIRED`` ("https-required"): plain http on a non-loopback host.
- ``RULE_USERINFO`` ("userinfo-forbidden"): the URL carries ``user:password@``.
- ``RULE_FRAGMENT`` ("fragment-forbidden"): the URL carries ``#fragment``.
- ``RULE_CHALLENGE_STATUS`` ("challenge-status"): the unauthenticated initialize was not a 401.
- ``RULE_CHALLENGE_HEADER`` ("challenge-resource-metadata"): no ``resource_metadata`` in the challenge.
- ``RULE_METADATA_ORIGIN`` ("untrusted-resource-metadata"): metadata URL on another origin.
- ``RULE_METADATA_HTTP`` ("metadata-http"): a metadata response was non-2xx or not a JSON object.
- ``RULE_RESOURCE_MISMATCH`` ("resource-mismatch"): metadata ``resource`` is not the MCP URL.
- ``RULE_NO_AUTHORIZATION_SERVER`` ("no-authorization-server"): ``authorization_servers`` empty.
- ``RULE_ISSUER_ORIGIN`` ("untrusted-issuer"): the issuer is on another origin.
- ``RULE_ISSUER_PATH`` ("issuer-path"): the issuer's path is not ``/``.
- ``RULE_ISSUER_MISMATCH`` ("issuer-mismatch"): AS metadata ``issuer`` differs from the issuer.
- ``RULE_ENDPOINT_MISSING`` ("endpoint-missing"): authorization or token endpoint absent.
- ``RULE_ENDPOINT_ORIGIN`` ("untrusted-endpoint"): an endpoint is on another origin.
- ``RULE_S256_UNAVAILABLE`` ("s256-unavailable"): ``S256`` not in ``code_challenge_methods_supported``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from airflow_provider_bos.auth.bounded import BodyTooLarge, parse_json, send_bounded
from airflow_provider_bos.auth.challenge import parse_www_authenticate
from airflow_provider_bos.auth.urls import ParsedUrl, parse_url
from airflow_provider_bos.exceptions import BosDiscoveryError, BosTransportError
from airflow_provider_bos.redaction import printable

__all__ = [
    "AuthServerInfo",
    "discover",
    "validate_metadata_url",
    "DISCOVERY_PROTOCOL_VERSION",
    "RULE_INVALID_URL",
    "RULE_HTTPS_REQUIRED",
    "RULE_USERINFO",
    "RULE_FRAGMENT",
    "RULE_CHALLENGE_STATUS",
    "RULE_CHALLENGE_HEADER",
    "RULE_METADATA_ORIGIN",
    "RULE_METADATA_HTTP",
    "RULE_RESOURCE_MISMATCH",
    "RULE_NO_AUTHORIZATION_SERVER",
    "RULE_ISSUER_ORIGIN",
    "RULE_ISSUER_PATH",
    "RULE_ISSUER_MISMATCH",
    "RULE_ENDPOINT_MISSING",
    "RULE_ENDPOINT_ORIGIN",
    "RULE_S256_UNAVAILABLE",
    "ALL_RULES",
]

DISCOVERY_PROTOCOL_VERSION = "2025-11-25"

RULE_INVALID_URL = "invalid-url"
RULE_HTTPS_REQUIRED = "https-required"
RULE_USERINFO = "userinfo-forbidden"
RULE_FRAGMENT = "fragment-forbidden"
RULE_CHALLENGE_STATUS = "challenge-status"
RULE_CHALLENGE_HEADER = "challenge-resource-metadata"
RULE_METADATA_ORIGIN = "untrusted-resource-metadata"
RULE_METADATA_HTTP = "metadata-http"
RULE_RESOURCE_MISMATCH = "resource-mismatch"
RULE_NO_AUTHORIZATION_SERVER = "no-authorization-server"
RULE_ISSUER_ORIGIN = "untrusted-issuer"
RULE_ISSUER_PATH = "issuer-path"
RULE_ISSUER_MISMATCH = "issuer-mismatch"
RULE_ENDPOINT_MISSING = "endpoint-missing"
RULE_ENDPOINT_ORIGIN = "untrusted-endpoint"
RULE_S256_UNAVAILABLE = "s256-unavailable"

ALL_RULES = frozenset(
    value for name, value in dict(globals()).items() if name.startswith("RULE_") and isinstance(value, str)
)

_AS_METADATA_PATH = "/.well-known/oauth-authorization-server"


@dataclass(frozen=True)
class AuthServerInfo:
    """What discovery established about a BOS resource and its authorization server."""

    resource: str
    resource_metadata_url: str
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None
    scopes_supported: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _shown(value: Any) -> str:
    """A server-supplied value as it may appear in an error: control characters escaped, bounded."""
    return printable(value if isinstance(value, str) else repr(value), limit=300)


def validate_metadata_url(value: Any, *, what: str) -> ParsedUrl:
    """The example's ``httpsURL``: https (http only on loopback), no userinfo, no fragment."""
    text = _shown(value)
    try:
        url = parse_url(value)
    except (TypeError, ValueError):
        raise BosDiscoveryError(
            f"{what} is not an absolute http(s) URL.", url=text, rule=RULE_INVALID_URL
        ) from None
    if url.has_userinfo:
        # Never echo the userinfo: it may be a credential.
        raise BosDiscoveryError(
            f"{what} must not carry user:password@ credentials.",
            url=_without_userinfo(url),
            rule=RULE_USERINFO,
        )
    if url.fragment is not None:
        raise BosDiscoveryError(f"{what} must not carry a #fragment.", url=text, rule=RULE_FRAGMENT)
    if url.scheme != "https" and not url.is_loopback:
        raise BosDiscoveryError(
            f"{what} must use https (plain http is accepted only for loopback hosts).",
            url=text,
            rule=RULE_HTTPS_REQUIRED,
        )
    return url


def _without_userinfo(url: ParsedUrl) -> str:
    return url.href


def _initialize_body() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": DISCOVERY_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "airflow-provider-bos", "version": _version()},
        },
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("airflow-provider-bos")
    except Exception:  # noqa: BLE001 - metadata is cosmetic here
        return "0"


def _get_json(client: httpx.Client, url: str, *, what: str) -> dict[str, Any]:
    try:
        response, body = send_bounded(client, "GET", url, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise BosTransportError(f"Could not fetch {what} from {_shown(url)}: {type(exc).__name__}") from exc
    except BodyTooLarge as exc:
        raise BosDiscoveryError(
            f"{what} is larger than {exc.limit} bytes.", url=_shown(url), rule=RULE_METADATA_HTTP
        ) from None
    if not 200 <= response.status_code < 300:
        redirect = " (a redirect; redirects are not followed)" if response.is_redirect else ""
        raise BosDiscoveryError(
            f"{what} answered HTTP {response.status_code}{redirect}.",
            url=_shown(url),
            rule=RULE_METADATA_HTTP,
        )
    try:
        payload = parse_json(body)
    except ValueError:
        content_type = response.headers.get("content-type", "")
        raise BosDiscoveryError(
            f"{what} is not JSON (HTTP {response.status_code}, content-type {_shown(content_type)}).",
            url=url,
            rule=RULE_METADATA_HTTP,
        ) from None
    if not isinstance(payload, dict):
        raise BosDiscoveryError(f"{what} is not a JSON object.", url=url, rule=RULE_METADATA_HTTP)
    return payload


def _resource_metadata_url(client: httpx.Client, resource_url: str) -> str:
    request = client.build_request(
        "POST",
        resource_url,
        json=_initialize_body(),
        headers={"Accept": "application/json, text/event-stream"},
    )
    try:
        # Only the status and headers matter: the body is never read.
        response = client.send(request, stream=True, auth=None, follow_redirects=False)
        response.close()
    except httpx.HTTPError as exc:
        raise BosTransportError(
            f"Could not reach the MCP resource {resource_url}: {type(exc).__name__}"
        ) from exc
    if response.status_code != 401:
        hint = _redirect_hint(resource_url, response) if response.is_redirect else ""
        raise BosDiscoveryError(
            f"an unauthenticated initialize must be answered with HTTP 401, got {response.status_code}{hint}.",
            url=resource_url,
            rule=RULE_CHALLENGE_STATUS,
        )
    challenges = parse_www_authenticate(response.headers.get_list("www-authenticate"))
    # Prefer the Bearer challenge; accept resource_metadata on any challenge.
    challenges.sort(key=lambda c: c.scheme != "bearer")
    for challenge in challenges:
        value = challenge.params.get("resource_metadata")
        if value:
            return value
    raise BosDiscoveryError(
        "the 401 has no WWW-Authenticate challenge with resource_metadata.",
        url=resource_url,
        rule=RULE_CHALLENGE_HEADER,
    )


def _redirect_hint(resource_url: str, response: httpx.Response) -> str:
    """What to do about a redirect, without saying where it points (unless that is only the URL the
    user typed with or without its trailing slash)."""
    advice = "use the MCP resource URL exactly as BOS publishes it; redirects are not followed"
    try:
        moved = parse_url(str(httpx.URL(resource_url).join(response.headers.get("location", ""))))
        typed = parse_url(resource_url)
    except ValueError:
        return f" (a redirect: {advice})"
    if moved.origin == typed.origin and moved.path.rstrip("/") == typed.path.rstrip("/") != "":
        slash = "without" if typed.path.endswith("/") else "with"
        return f" (a redirect to the same URL {slash} a trailing slash: {advice})"
    return f" (a redirect: {advice})"


def _same_origin_value(value: Any, origin: str) -> str:
    """A metadata value as an error may show it: only a URL on the resource's origin is repeated."""
    try:
        if parse_url(value).origin == origin:
            return _shown(value)
    except (TypeError, ValueError):
        pass
    return "(a value not on this origin, not shown)"


def _string_list(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def discover(resource_url: str, *, http_client: httpx.Client | None = None) -> AuthServerInfo:
    """Discover and validate the authorization server of the BOS MCP resource ``resource_url``."""
    resource = validate_metadata_url(resource_url, what="The MCP resource URL")
    trusted_origin = resource.origin
    owns_client = http_client is None
    client = http_client or httpx.Client(timeout=30.0)
    try:
        metadata_url_text = _resource_metadata_url(client, resource_url)
        metadata_url = validate_metadata_url(metadata_url_text, what="resource_metadata")
        if metadata_url.origin != trusted_origin:
            raise BosDiscoveryError(
                f"resource metadata is not on the MCP resource's origin {trusted_origin}.",
                url=_shown(metadata_url_text),
                rule=RULE_METADATA_ORIGIN,
            )
        protected = _get_json(client, metadata_url_text, what="Protected-resource metadata")
        if protected.get("resource") != resource_url:
            raise BosDiscoveryError(
                f"metadata resource {_same_origin_value(protected.get('resource'), trusted_origin)} is not "
                f"the MCP URL {resource_url!r}.",
                url=_shown(metadata_url_text),
                rule=RULE_RESOURCE_MISMATCH,
            )
        servers = protected.get("authorization_servers")
        if not isinstance(servers, list) or not servers:
            raise BosDiscoveryError(
                "protected-resource metadata lists no authorization_servers.",
                url=_shown(metadata_url_text),
                rule=RULE_NO_AUTHORIZATION_SERVER,
            )
        issuer = validate_metadata_url(servers[0], what="The authorization server issuer")
        if issuer.origin != trusted_origin:
            raise BosDiscoveryError(
                f"the issuer is not on the MCP resource's origin {trusted_origin}.",
                url=_shown(issuer.raw),
                rule=RULE_ISSUER_ORIGIN,
            )
        if issuer.path != "/":
            raise BosDiscoveryError(
                "the issuer's path must be '/'.", url=_shown(issuer.raw), rule=RULE_ISSUER_PATH
            )

        as_url = issuer.origin + _AS_METADATA_PATH
        metadata = _get_json(client, as_url, what="Authorization-server metadata")
        expected_issuer = issuer.href.removesuffix("/")
        if metadata.get("issuer") != expected_issuer:
            raise BosDiscoveryError(
                f"metadata issuer {_same_origin_value(metadata.get('issuer'), trusted_origin)} is not "
                f"{expected_issuer!r}.",
                url=as_url,
                rule=RULE_ISSUER_MISMATCH,
            )
        endpoints: dict[str, str | None] = {}
        for key in ("registration_endpoint", "authorization_endpoint", "token_endpoint"):
            value = metadata.get(key)
            if value is None and key == "registration_endpoint":
                endpoints[key] = None  # only needed for dynamic registration; connect checks it then
                continue
            if value is None:
                raise BosDiscoveryError(f"metadata has no {key}.", url=as_url, rule=RULE_ENDPOINT_MISSING)
            endpoint = validate_metadata_url(value, what=key)
            if endpoint.origin != trusted_origin:
                raise BosDiscoveryError(
                    f"{key} is not on the trusted origin {trusted_origin}.",
                    url=_shown(value),
                    rule=RULE_ENDPOINT_ORIGIN,
                )
            endpoints[key] = value
        if "S256" not in _string_list(metadata.get("code_challenge_methods_supported")):
            raise BosDiscoveryError(
                "the authorization server does not support PKCE S256 (code_challenge_methods_supported).",
                url=as_url,
                rule=RULE_S256_UNAVAILABLE,
            )
        return AuthServerInfo(
            resource=resource_url,
            resource_metadata_url=metadata_url_text,
            issuer=metadata["issuer"],
            authorization_endpoint=endpoints["authorization_endpoint"] or "",
            token_endpoint=endpoints["token_endpoint"] or "",
            registration_endpoint=endpoints["registration_endpoint"],
            scopes_supported=_string_list(metadata.get("scopes_supported")),
            raw=metadata,
        )
    finally:
        if owns_client:
            client.close()
