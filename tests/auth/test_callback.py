"""Callback validation (each rule of the example alone) and the loopback listener."""

from __future__ import annotations

import base64
import hashlib
import threading
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from airflow_provider_bos.auth import connect as c
from airflow_provider_bos.auth.callback import RULE_CALLBACK_TIMEOUT, LoopbackCallbackListener
from airflow_provider_bos.auth.connect import prepare_authorization, validate_callback
from airflow_provider_bos.auth.discovery import AuthServerInfo
from airflow_provider_bos.exceptions import BosCallbackError, BosConfigurationError

ISSUER = "https://bos.example"
REDIRECT = "http://127.0.0.1:8765/callback"
INFO = AuthServerInfo(
    resource=f"{ISSUER}/mcp/apps/bos/platform",
    resource_metadata_url=f"{ISSUER}/.well-known/oauth-protected-resource",
    issuer=ISSUER,
    authorization_endpoint=f"{ISSUER}/authorize?stale=1",
    token_endpoint=f"{ISSUER}/token",
    registration_endpoint=f"{ISSUER}/register",
)


@pytest.fixture()
def pending() -> c.PendingAuthorization:
    return prepare_authorization(INFO, client_id="client-1", redirect_uri=REDIRECT)


def _callback(pending: c.PendingAuthorization, base: str = REDIRECT, **overrides) -> str:
    params: list[tuple[str, str]] = [("code", "the-code-123"), ("state", pending.state), ("iss", ISSUER)]
    params = [(k, overrides.get(k, v)) for k, v in params if overrides.get(k, v) is not None]
    return f"{base}?{urlencode(params)}"


def test_authorization_request_has_pkce_s256_state_scope_and_resource(pending) -> None:
    url = urlsplit(pending.authorization_url)
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{ISSUER}/authorize"
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert "stale" not in query  # our parameters replace the endpoint's query, as in the example
    assert query["response_type"] == "code"
    assert query["client_id"] == "client-1" and query["redirect_uri"] == REDIRECT
    assert query["scope"] == "mcp:tools offline_access"
    assert query["resource"] == INFO.resource
    assert query["code_challenge_method"] == "S256"
    assert len(pending.verifier) >= 43
    expected = (
        base64.urlsafe_b64encode(hashlib.sha256(pending.verifier.encode()).digest()).rstrip(b"=").decode()
    )
    assert query["code_challenge"] == expected
    assert query["state"] == pending.state and len(pending.state) >= 43
    assert pending.verifier not in pending.authorization_url


def test_each_authorization_is_fresh() -> None:
    a = prepare_authorization(INFO, client_id="x", redirect_uri=REDIRECT)
    b = prepare_authorization(INFO, client_id="x", redirect_uri=REDIRECT)
    assert a.verifier != b.verifier and a.state != b.state


def test_pending_repr_hides_the_verifier(pending) -> None:
    assert pending.verifier not in repr(pending) and pending.state not in repr(pending)


def test_valid_callback_returns_the_code(pending) -> None:
    assert validate_callback(pending, _callback(pending)) == "the-code-123"
    # The WHATWG origin ignores an explicit default port and letter case.
    https = prepare_authorization(INFO, client_id="x", redirect_uri="https://app.example/cb")
    assert validate_callback(https, _callback(https, base="HTTPS://App.Example:443/cb")) == "the-code-123"


def _rule(pending, url: str) -> str:
    with pytest.raises(BosCallbackError) as caught:
        validate_callback(pending, url)
    assert "the-code-123" not in str(caught.value)
    return caught.value.rule


def test_wrong_origin(pending) -> None:
    assert _rule(pending, _callback(pending, base="http://127.0.0.1:9999/callback")) == c.RULE_CALLBACK_ORIGIN
    assert _rule(pending, _callback(pending, base="http://localhost:8765/callback")) == c.RULE_CALLBACK_ORIGIN
    assert (
        _rule(pending, _callback(pending, base="https://127.0.0.1:8765/callback")) == c.RULE_CALLBACK_ORIGIN
    )


def test_wrong_path(pending) -> None:
    assert _rule(pending, _callback(pending, base="http://127.0.0.1:8765/callback/x")) == c.RULE_CALLBACK_PATH
    assert _rule(pending, _callback(pending, base="http://127.0.0.1:8765/")) == c.RULE_CALLBACK_PATH


def test_not_a_url(pending) -> None:
    assert _rule(pending, "code=abc&state=def") == c.RULE_CALLBACK_INVALID_URL


@pytest.mark.parametrize("name", ["state", "iss", "code"])
def test_missing_parameter(pending, name: str) -> None:
    url = _callback(pending, **{name: None})
    with pytest.raises(BosCallbackError) as caught:
        validate_callback(pending, url)
    assert caught.value.rule == c.RULE_PARAM_MISSING and repr(name) in str(caught.value)


@pytest.mark.parametrize("name", ["state", "iss", "code"])
def test_duplicate_parameter(pending, name: str) -> None:
    url = _callback(pending) + "&" + urlencode({name: "again"})
    with pytest.raises(BosCallbackError) as caught:
        validate_callback(pending, url)
    assert caught.value.rule == c.RULE_PARAM_DUPLICATE and repr(name) in str(caught.value)


def test_empty_duplicate_counts(pending) -> None:
    assert _rule(pending, _callback(pending) + "&code=") == c.RULE_PARAM_DUPLICATE


def test_state_mismatch(pending) -> None:
    assert _rule(pending, _callback(pending, state="forged-state")) == c.RULE_STATE_MISMATCH


def test_issuer_mismatch(pending) -> None:
    assert _rule(pending, _callback(pending, iss="https://evil.example")) == c.RULE_ISSUER_MISMATCH
    assert _rule(pending, _callback(pending, iss=ISSUER + "/")) == c.RULE_ISSUER_MISMATCH


def test_error_callback_reports_the_oauth_error(pending) -> None:
    url = f"{REDIRECT}?" + urlencode(
        {"error": "access_denied", "error_description": "User said no", "state": pending.state, "iss": ISSUER}
    )
    with pytest.raises(BosCallbackError) as caught:
        validate_callback(pending, url)
    assert caught.value.rule == c.RULE_AUTHORIZATION_ERROR
    assert "access_denied" in str(caught.value) and "User said no" in str(caught.value)


def test_every_callback_rule_is_distinct() -> None:
    names = [value for name, value in vars(c).items() if name.startswith("RULE_")]
    assert len(names) == len(set(names)) == 8


# --- listener ----------------------------------------------------------------------------------


def test_listener_receives_one_callback_and_answers_html() -> None:
    with LoopbackCallbackListener() as listener:
        listener.expect_state("s")
        assert listener.redirect_uri.startswith("http://127.0.0.1:") and listener.port > 0
        with httpx.Client() as browser:
            assert browser.get(listener.base_url + "/favicon.ico").status_code == 404
            first = browser.get(listener.redirect_uri, params={"code": "c1", "state": "s", "iss": "i"})
            again = browser.get(listener.redirect_uri, params={"code": "c2", "state": "s"})
        assert first.status_code == 200 and "text/html" in first.headers["content-type"]
        assert "c1" not in first.text  # nothing from the query is echoed
        assert again.status_code == 409
        assert listener.wait(1) == f"{listener.redirect_uri}?code=c1&state=s&iss=i"


def test_listener_wait_is_woken_by_the_callback() -> None:
    with LoopbackCallbackListener(path="cb") as listener:
        listener.expect_state("s")
        assert listener.redirect_uri.endswith("/cb")
        threading.Thread(
            target=lambda: httpx.get(listener.redirect_uri + "?code=x&state=s"), daemon=True
        ).start()
        assert listener.wait(30).endswith("/cb?code=x&state=s")


def test_listener_times_out_with_a_callback_error() -> None:
    with LoopbackCallbackListener() as listener, pytest.raises(BosCallbackError) as caught:
        listener.wait(0.05)
    assert caught.value.rule == RULE_CALLBACK_TIMEOUT


def test_listener_error_page(pending) -> None:
    with LoopbackCallbackListener() as listener:
        listener.expect_state("s")
        response = httpx.get(listener.redirect_uri, params={"error": "access_denied", "state": "s"})
        assert response.status_code == 200 and "not completed" in response.text


def test_listener_takes_only_the_request_with_this_sign_ins_state() -> None:
    """Another local process (or a web page) racing the browser cannot spoil or hijack the sign-in."""
    with LoopbackCallbackListener() as listener, httpx.Client() as other:
        early = other.get(listener.redirect_uri, params={"code": "forged", "state": "any"})
        listener.expect_state("the-real-state")
        forged = [
            other.get(listener.redirect_uri, params=params)
            for params in (
                {"code": "forged"},
                {"code": "forged", "state": "guess"},
                {"error": "access_denied", "state": "guess"},
                [("code", "forged"), ("state", "the-real-state"), ("state", "x")],
            )
        ]
        real = other.get(listener.redirect_uri, params={"code": "real", "state": "the-real-state"})
        assert [r.status_code for r in (early, *forged)] == [400] * 5 and real.status_code == 200
        assert "forged" not in early.text
        assert listener.wait(1) == f"{listener.redirect_uri}?code=real&state=the-real-state"


def test_a_port_can_be_used_again_right_after_a_sign_in_but_never_twice_at_once() -> None:
    """``connect --port N`` run again within a minute of a sign-in: the last connection's TIME_WAIT
    does not hold the port. A port another listener holds is still refused."""
    with LoopbackCallbackListener() as first:
        port = first.port
        first.expect_state("s")
        with httpx.Client() as browser:
            assert browser.get(first.redirect_uri, params={"code": "c", "state": "s"}).status_code == 200
        first.wait(1)
        with pytest.raises(BosConfigurationError, match="Cannot listen for the OAuth callback"):
            LoopbackCallbackListener(port=port)
    with LoopbackCallbackListener(port=port) as again:
        assert again.port == port
