"""Where the page's requests may go (real servers on loopback ports) and how long they may take."""

from __future__ import annotations

import httpx
import pytest
from localhttp import answer, drip, drip_headers, local_server

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.plugins.outbound import (
    Deadline,
    DeadlineExceeded,
    OutboundPolicy,
    is_public_address,
    page_client,
)

pytestmark = pytest.mark.timeout(60)


def test_loopback_is_refused_unless_allow_listed_and_nothing_reaches_it() -> None:
    with local_server(answer(200, b"internal")) as server:
        with page_client(OutboundPolicy(), Deadline()) as client, pytest.raises(BosConfigurationError) as refused:
            client.get(server.base_url + "/")
        assert "allowed_hosts" in str(refused.value) and server.requests == []

        with page_client(OutboundPolicy.from_setting("127.0.0.1"), Deadline()) as client:
            assert client.get(server.base_url + "/").text == "internal"
        assert len(server.requests) == 1


def test_a_set_allow_list_is_the_only_place_the_page_may_go() -> None:
    policy = OutboundPolicy.from_setting("bos.example, LOCALHOST")
    with local_server(answer(200)) as server, page_client(policy, Deadline()) as client:
        with pytest.raises(BosConfigurationError, match="not in \\[bos\\] allowed_hosts"):
            client.get(server.base_url + "/")  # 127.0.0.1 is not listed, localhost is
        assert client.get(server.base_url.replace("127.0.0.1", "localhost") + "/").status_code == 200
        with pytest.raises(BosConfigurationError):
            client.get("https://public.example/mcp")
    assert policy.allowed_hosts == {"bos.example", "localhost"}


def test_every_resolved_address_must_be_public() -> None:
    mixed = OutboundPolicy(resolve=lambda host, port: ["93.184.216.34", "10.1.2.3"])
    with pytest.raises(BosConfigurationError, match="public addresses only"):
        mixed.addresses_for("bos.example", 443)
    public = OutboundPolicy(resolve=lambda host, port: ["93.184.216.34", "2606:2800:220:1::1"])
    assert public.addresses_for("bos.example", 443) == ["93.184.216.34", "2606:2800:220:1::1"]
    unresolvable = OutboundPolicy(resolve=lambda host, port: (_ for _ in ()).throw(OSError("no such name")))
    with pytest.raises(BosConfigurationError, match="public addresses only"):
        unresolvable.addresses_for("intranet.example", 443)


@pytest.mark.parametrize(
    "address",
    ["10.0.0.1", "172.16.5.4", "192.168.1.1", "127.0.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
     "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1", "240.0.0.1"],
)
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(address)
    with pytest.raises(BosConfigurationError):
        OutboundPolicy().addresses_for(address, 443)


def test_a_dripping_endpoint_cannot_hold_the_page_past_its_deadline() -> None:
    with local_server(drip(0.2)) as server:
        deadline = Deadline(1.5)
        with page_client(OutboundPolicy.from_setting("127.0.0.1"), deadline, timeout=30) as client:
            with pytest.raises(DeadlineExceeded), client.stream("GET", server.base_url + "/") as response:
                for _ in response.iter_bytes():
                    pass  # each byte arrives well within the 30 s read timeout
            with pytest.raises(DeadlineExceeded):
                client.get(server.base_url + "/")  # past the deadline nothing starts
        assert len(server.requests) == 1


def test_a_silent_endpoint_is_cut_off_at_the_deadline_not_the_read_timeout() -> None:
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        policy = OutboundPolicy.from_setting("127.0.0.1")
        with page_client(policy, Deadline(1.0), timeout=300) as client, pytest.raises(httpx.TimeoutException):
            client.get(url)


def test_dripping_headers_are_cut_off_at_the_deadline_too() -> None:
    with local_server(drip_headers(0.2)) as server:
        policy = OutboundPolicy.from_setting("127.0.0.1")
        with page_client(policy, Deadline(1.5), timeout=30) as client, pytest.raises(DeadlineExceeded):
            client.post(server.base_url + "/mcp", json={})
