"""URL rules shared by discovery and the callback checks.

The contract's client example uses the WHATWG ``URL`` object: ``origin``, ``pathname`` and ``href``
are normalised (lower-case scheme and host, default port dropped, empty path becomes ``/``). These
helpers reproduce exactly that much of it on top of :func:`urllib.parse.urlsplit`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

__all__ = ["ParsedUrl", "parse_url", "is_loopback_host"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (plain http is allowed only for these)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
