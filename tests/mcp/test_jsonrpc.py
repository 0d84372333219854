"""Ids, error mapping and the routing-header codec (checked against the official SDK's codec)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import BosJsonRpcError, BosProtocolError
from airflow_provider_bos.mcp.jsonrpc import IdGenerator, decode_header_value, encode_header_value, rpc_error

PROFILE = settings(settings.get_profile(os.environ.get("BOS_HYPOTHESIS_PROFILE", "bos-ci")))
sdk_inbound = pytest.importorskip("mcp.shared.inbound")  # the server extra; only the test reads it


@PROFILE
@given(st.text(max_size=40))
def test_header_codec_matches_the_sdk_and_round_trips(value: str) -> None:
    encoded = encode_header_value(value)
    assert encoded == sdk_inbound.encode_header_value(value)
    assert decode_header_value(encoded) == value
    assert encoded.isascii() and "\r" not in encoded and "\n" not in encoded


@pytest.mark.parametrize("value", ["search_people", "bos_execute", "bos://contexts/c1/schema/person"])
def test_plain_names_pass_verbatim(value: str) -> None:
    assert encode_header_value(value) == value


def test_ids_are_unique_strings_across_generators() -> None:
    first, second = IdGenerator(), IdGenerator()
    ids = [first.next() for _ in range(100)] + [second.next() for _ in range(100)]
    assert len(set(ids)) == 200 and all(i.startswith("bos-") for i in ids)


def test_rpc_error_hint_for_unsupported_version_lists_supported_versions() -> None:
    err = rpc_error({"code": -32022, "message": "Unsupported protocol version",
                     "data": {"supported": ["2026-07-28"], "requested": "x"}}, "tools/call")
    assert isinstance(err, BosJsonRpcError) and err.code == -32022 and err.method == "tools/call"
    assert "supported: 2026-07-28" in str(err)


def test_malformed_error_object_is_a_protocol_error() -> None:
    with pytest.raises(BosProtocolError):
        rpc_error({"code": "x"}, None)
    with pytest.raises(BosProtocolError):
        rpc_error({"code": True, "message": "m"}, None)


@given(st.integers() | st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_decode_exactly_at_any_size(number: int | float) -> None:
    """A record may hold any JSON number: an integer beyond 64 bits stays that integer."""
    from airflow_provider_bos.mcp.jsonrpc import loads

    decoded = loads(b'{"n": %s}' % repr(number).encode())
    assert decoded == {"n": number} and type(decoded["n"]) is type(number)


def test_a_number_beyond_a_double_decodes_as_such_and_nothing_else_gets_through_beside_it() -> None:
    """``1e400`` is JSON: it decodes to a NumberBeyondDouble (its text), every other number as before.
    Beside it, what the decoder refuses elsewhere is still refused (a lone surrogate, bytes that are not
    UTF-8, NaN), and nesting too deep is a ``ValueError``, never a RecursionError."""
    from airflow_provider_bos.json_numbers import NumberBeyondDouble
    from airflow_provider_bos.mcp.jsonrpc import loads

    decoded = loads(b'{"a": [1e400, -1E+400, 1.5, 2, 1e-400, 18446744073709551617]}')["a"]
    assert [type(v) for v in decoded] == [NumberBeyondDouble, NumberBeyondDouble, float, int, float, int]
    assert [repr(v) for v in decoded[:2]] == ["1e400", "-1E+400"] and decoded[2:] == [1.5, 2, 0.0, 2**64 + 1]
    for bad in (b'[1e400, "\\ud800"]', b'[1e400, "\xed\xa0\x80"]', b'[1e400, NaN]', b'[1e400, 1',
                b"[" * 5000 + b"1e400" + b"]" * 5000):
        with pytest.raises(ValueError):
            loads(bad)
