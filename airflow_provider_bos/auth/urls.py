"""URL rules shared by discovery and the callback checks.

The contract's client example uses the WHATWG ``URL`` object: ``origin``, ``pathname`` and ``href``
are normalised (lower-case scheme and host, default port dropped, empty path becomes ``/``). These
helpers reproduce exactly that much of it on top of :func:`urllib.parse.urlsplit`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.redaction import printable

__all__ = ["ParsedUrl", "parse_url", "is_loopback_host", "credential_url_problem", "require_credential_url"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (plain http is allowed only for these).

    Names under ``.localhost`` are not: RFC 6761 asks resolvers to map them to loopback, but many
    do not (they go to DNS like any name), so plain http to one could leave the machine.
    """
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def credential_url_problem(url: str) -> str | None:
    """Why ``url`` may not carry a credential (token, API key, refresh token), or None when it may:
    https anywhere, plain http only to a loopback address or ``localhost``."""
    try:
        parsed = parse_url(url)
    except ValueError:
        return "it is not an absolute http(s) URL"
    if parsed.scheme != "https" and not parsed.is_loopback:
        return "it is plain http to a host that is not loopback"
    return None


def require_credential_url(url: str, what: str) -> None:
    """Raise :class:`BosConfigurationError` when ``url`` may not carry ``what`` (see
    :func:`credential_url_problem`); the message names the URL, never the credential."""
    problem = credential_url_problem(url)
    if problem is not None:
        shown = printable(url, limit=200)
        raise BosConfigurationError(
            f"Refusing to send {what} to {shown}: {problem}. Credentials go only over https (plain http "
            "only to 127.0.0.1, ::1 or localhost); use the server's https URL."
        )


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """A URL split the way the WHATWG URL object presents it."""

    raw: str
    scheme: str  # lower-case, without ":"
    host: str  # lower-case; IPv6 without brackets
    port: int | None  # None when it is the scheme's default
    path: str  # "/" when empty
    query: str
    fragment: str | None  # None when there is no "#"
    has_userinfo: bool

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    @property
    def href(self) -> str:
        """Normalised URL without userinfo (userinfo URLs are rejected before this matters)."""
        query = f"?{self.query}" if self.query else ""
        fragment = f"#{self.fragment}" if self.fragment is not None else ""
        return f"{self.origin}{self.path}{query}{fragment}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def parse_url(value: str) -> ParsedUrl:
    """Parse an absolute http(s) URL; ``ValueError`` when it is not one."""
    if not isinstance(value, str) or not value or any(ch.isspace() or not ch.isprintable() for ch in value):
        # urlsplit silently drops tabs and newlines; a URL with any whitespace or control character
        # is refused instead (and can never reach a message or log line).
        raise ValueError("not an absolute URL")
    parts: SplitResult = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError("not an absolute http(s) URL")
    port = parts.port  # raises ValueError for a bad port
    if port == _DEFAULT_PORTS[scheme]:
        port = None
    return ParsedUrl(
        raw=value,
        scheme=scheme,
        host=parts.hostname.lower(),
        port=port,
        path=parts.path or "/",
        query=parts.query,
        fragment=parts.fragment if "#" in value else None,
        has_userinfo="@" in parts.netloc,
    )
