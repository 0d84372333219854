"""Where the BOS page's own HTTP requests may go, and for how long.

The page runs inside the API server, and a user who may edit Connections chooses the URL it talks
to: without limits, Connect, the live probe and Check would let that user make the API server send
requests into its own network. Every request the page makes goes through :func:`page_client`:

- **Addresses.** A host named in ``[bos] allowed_hosts`` may be used whatever it resolves to; when
  that list is set, no other host may be used at all. Otherwise every address the name resolves to
  must be public (not private, loopback, link-local, shared, reserved or multicast). The check is
  made when the socket is opened, on the very addresses it connects to, so a name cannot resolve
  to a public address for the check and to a private one for the connection.
- **Deadline.** One :class:`Deadline` (:data:`PAGE_DEADLINE_S`, 15 s) bounds every request of one
  page action (all the probes of one page view share one): each socket read and write waits at
  most what is left of it, and once it has passed no request starts. A hostile endpoint that
  drips bytes, in its headers or its body, cannot hold an API-server thread.

Environment proxies are not used by these clients (the check would otherwise apply to the proxy).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = [
    "PAGE_DEADLINE_S",
    "Deadline",
    "DeadlineExceeded",
    "OutboundPolicy",
    "is_public_address",
    "page_client",
]

PAGE_DEADLINE_S = 15.0
Resolver = Callable[[str, int], list[str]]


class DeadlineExceeded(httpx.TimeoutException):
    """The page action's overall deadline passed (a timeout, so callers treat it like one)."""


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_public_address(text: str) -> bool:
    """True for a globally routable unicast address (an IPv4-mapped IPv6 address counts as its IPv4)."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class OutboundPolicy:
    """``allowed_hosts``: host names or IP literals the page may use even when they are not public;
    when not empty, the only hosts it may use."""

    allowed_hosts: frozenset[str] = frozenset()
    resolve: Resolver = field(default=_resolve, repr=False, compare=False)

    @classmethod
    def from_setting(cls, value: str | None) -> OutboundPolicy:
        hosts = {_normal_host(item) for item in (value or "").replace(",", " ").split()}
        return cls(frozenset(host for host in hosts if host))

    def addresses_for(self, host: str, port: int) -> list[str]:
        """Where a connection to ``host`` may go; :class:`BosConfigurationError` when nowhere."""
        name = _normal_host(host)
        if name in self.allowed_hosts:
            return [host]
        if self.allowed_hosts:
            raise BosConfigurationError(
                f"The BOS page may not connect to {name!r}: it is not in [bos] allowed_hosts. An "
                "operator can add it there."
            )
        try:
            addresses = self.resolve(name, port)
        except OSError:
            addresses = []
        if not addresses or not all(is_public_address(a) for a in addresses):
            # One message for both: which internal names exist is not the page user's business.
            raise BosConfigurationError(
                f"The BOS page may not connect to {name!r}: it does not resolve to public addresses "
                "only (private, loopback and link-local networks are refused). An operator can allow "
                "the host with [bos] allowed_hosts."
            )
        return addresses


class Deadline:
    """A point in time every request of one page action must finish by."""

    def __init__(self, seconds: float | None = None, *, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(PAGE_DEADLINE_S if seconds is None else seconds)
        self._clock = clock
        self._ends = clock() + self.seconds

    def remaining(self) -> float:
        left = self._ends - self._clock()
        if left <= 0:
            raise DeadlineExceeded(
                f"The BOS page gives every action {self.seconds:g} s in all; BOS did not answer in time."
            )
        return left


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write waits at most what is left of the deadline: a server that
    drips bytes (headers or body) is cut off when it passes, not after one read timeout per byte."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def _bounded(self, timeout: float | None) -> float:
        left = self._deadline.remaining()
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._inner.read(max_bytes, self._bounded(timeout))
        except httpcore.TimeoutException:
            self._deadline.remaining()  # say it was the deadline, when it was
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            self._inner.write(buffer, self._bounded(timeout))
        except httpcore.TimeoutException:
            self._deadline.remaining()
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        tls = self._inner.start_tls(ssl_context, server_hostname, self._bounded(timeout))
        return _DeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.NetworkBackend):
    """Opens sockets only to addresses the policy allows (checked on the addresses used)."""

    def __init__(self, policy: OutboundPolicy, deadline: Deadline) -> None:
        self._policy = policy
        self._deadline = deadline
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: httpcore.ConnectError | None = None
        for address in self._policy.addresses_for(host, port):
            left = self._deadline.remaining()
            try:
                # TLS still verifies (and sends SNI for) the host name, not this address.
                stream = self._inner.connect_tcp(
                    address, port, left if timeout is None else min(timeout, left), local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        assert failure is not None
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise BosConfigurationError("The BOS page does not connect to Unix sockets.")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.BaseTransport):
    """No request starts once the deadline has passed."""

    def __init__(self, inner: httpx.BaseTransport, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._deadline.remaining()
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def guarded_transport(policy: OutboundPolicy, deadline: Deadline) -> httpx.BaseTransport:
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        # httpx/httpcore changed inside: refuse to run unguarded rather than connect anywhere.
        raise BosConfigurationError("This httpx version cannot be guarded; the BOS page makes no request.")
    pool._network_backend = _GuardedBackend(policy, deadline)
    return _DeadlineTransport(transport, deadline)


def page_client(policy: OutboundPolicy, deadline: Deadline, *, timeout: float = PAGE_DEADLINE_S) -> httpx.Client:
    """An httpx client for one page action: guarded addresses, the action's deadline, no redirects."""
    return httpx.Client(
        transport=guarded_transport(policy, deadline), timeout=timeout, follow_redirects=False, trust_env=False
    )
