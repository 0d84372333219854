"""WWW-Authenticate parsing: the discovery step depends on reading resource_metadata correctly."""

from __future__ import annotations

from airflow_provider_bos.auth.challenge import parse_www_authenticate


def test_bearer_with_quoted_params_and_commas_inside_quotes() -> None:
    [challenge] = parse_www_authenticate(
        'Bearer error="invalid_token", error_description="expired, renew it", '
        'resource_metadata="https://h/.well-known/oauth-protected-resource/mcp"'
    )
    assert challenge.scheme == "bearer"
    assert challenge.params == {
        "error": "invalid_token",
        "error_description": "expired, renew it",
        "resource_metadata": "https://h/.well-known/oauth-protected-resource/mcp",
    }


def test_several_challenges_in_one_header_and_token_values() -> None:
    challenges = parse_www_authenticate(
        'Basic realm="x", Bearer realm=bos, Resource_Metadata = "https://h/m", Negotiate abc123=='
    )
    assert [c.scheme for c in challenges] == ["basic", "bearer", "negotiate"]
    assert challenges[0].params == {"realm": "x"}
    assert challenges[1].params == {"realm": "bos", "resource_metadata": "https://h/m"}
    assert challenges[2].token68 == "abc123==" and challenges[2].params == {}


def test_escapes_in_quoted_strings_and_several_headers() -> None:
    challenges = parse_www_authenticate(['Basic realm="a\\"b"', 'Bearer resource_metadata="https://h/\\m"'])
    assert challenges[0].params["realm"] == 'a"b'
    assert challenges[1].params["resource_metadata"] == "https://h/m"


def test_regex_lookalike_is_not_a_parameter() -> None:
    # A naive regex would find resource_metadata inside another parameter's quoted value.
    [challenge] = parse_www_authenticate(
        'Bearer error_description="see resource_metadata=\\"https://evil/\\""'
    )
    assert "resource_metadata" not in challenge.params


def test_garbage_does_not_raise() -> None:
    for header in ["", ",,,", '"', "Bearer =", 'Bearer a="unterminated', "=x, Bearer resource_metadata=u"]:
        parse_www_authenticate(header)
    assert parse_www_authenticate("=x, Bearer resource_metadata=u")[-1].params == {"resource_metadata": "u"}
