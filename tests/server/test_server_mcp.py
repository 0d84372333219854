"""MCP side of the reference server: both protocol eras, negotiation, and the contract's JSON shapes.

Plain httpx over loopback. The tiny SSE parser below is the test's own (the production parser
lives in airflow_provider_bos.mcp and is tested there).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections import defaultdict
from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from airflow_provider_bos.testing.federation import unstamped
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

P2025, P2026 = "2025-11-25", "2026-07-28"
EXT = "bos/source-results/v1"
ACCEPT_BOTH = "application/json, text/event-stream"
CLIENT_INFO = {"name": "server-tests", "version": "1"}
FED_RECORD_KEYS = {"record_ref", "display_name", "email", "phone", "lifecycle", "sources", "identity_match",
                   "attributes"}
PROVENANCE_KEYS = {"source_type", "source_identity", "external_id", "record_type", "observed_at", "capabilities",
                   "version"}
CONTEXT_KEYS = {"context_handle", "organization_name", "application_name", "installation_name", "role_label",
                "is_default"}
METADATA_KEYS = {"retrieval_mode", "cache_baseline_applied", "source_delta_applied", "completeness",
                 "result_count", "observed_at", "provenance"}


# -- a tiny WHATWG-style SSE parser (test-local) ------------------------------------------------------

def parse_sse(raw: bytes) -> tuple[list[dict], list[str]]:
    """(events, comments) of a complete stream; an unterminated last event is discarded.

    Each event: ``event``, ``data``, ``id`` (the last event id in effect) and ``retry`` (its own
    ``retry`` field, or None).
    """
    text = raw.decode("utf-8")
    text = text.removeprefix("\ufeff")
    lines = re.split(r"\r\n|\r|\n", text)[:-1]
    events: list[dict] = []
    comments: list[str] = []
    data: list[str] = []
    event_type = ""
    last_id: str | None = None
    retry: int | None = None
    for line in lines:
        if line == "":
            if data:
                events.append({"event": event_type or "message", "data": "\n".join(data), "id": last_id,
                               "retry": retry})
            data, event_type, retry = [], "", None
            continue
        if line.startswith(":"):
            comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id":
            last_id = value
        elif name == "retry":
            retry = int(value)
    return events, comments


# -- a minimal client ---------------------------------------------------------------------------------

class Client:
    """Just enough MCP client for the tests: either era, bearer auth, raw responses."""

    def __init__(self, server, token: str, era: str = P2025) -> None:
        self.server = server
        self.http = httpx.Client(timeout=20, headers={"Authorization": f"Bearer {token}"})
        self.era = era
        self.session_id: str | None = None
        self._ids = 0
        if era == P2025:
            result = self.rpc("initialize", {"protocolVersion": P2025, "capabilities": {}, "clientInfo": CLIENT_INFO})
            self.session_id = result.headers["mcp-session-id"]
            self.capabilities = result.json()["result"]["capabilities"]
            note = self.http.post(server.mcp_url, headers=self.headers("notifications/initialized"),
                                  json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert note.status_code == 202

    def close(self) -> None:
        self.http.close()

    def headers(self, method: str, name: str | None = None, accept: str = ACCEPT_BOTH) -> dict[str, str]:
        headers = {"Accept": accept, "Content-Type": "application/json"}
        if self.era == P2026:
            headers |= {"MCP-Protocol-Version": P2026, "Mcp-Method": method}
            if name is not None:
                headers["Mcp-Name"] = name
        elif self.session_id is not None:
            headers |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": P2025}
        return headers

    def body(self, method: str, params: dict | None = None, *, opt_in: object = None) -> dict:
        self._ids += 1
        params = dict(params or {})
        meta: dict = {}
        if self.era == P2026:
            meta = {"io.modelcontextprotocol/protocolVersion": P2026, "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
                    "io.modelcontextprotocol/clientCapabilities": {}}
        if opt_in is not None:
            meta.setdefault("io.modelcontextprotocol/clientCapabilities", {})["experimental"] = {EXT: opt_in}
        if meta:
            params["_meta"] = meta
        return {"jsonrpc": "2.0", "id": f"req-{self._ids}", "method": method, "params": params}

    def rpc(self, method: str, params: dict | None = None, *, name: str | None = None,
            accept: str = ACCEPT_BOTH, opt_in: object = None, extra_headers: dict | None = None) -> httpx.Response:
        return self.http.post(self.server.mcp_url,
                              headers={**self.headers(method, name, accept), **(extra_headers or {})},
                              json=self.body(method, params, opt_in=opt_in))

    def call(self, tool: str, arguments: dict, **kw) -> httpx.Response:
        return self.rpc("tools/call", {"name": tool, "arguments": arguments}, name=tool, **kw)

    def execute(self, arguments: dict | None = None, **kw) -> httpx.Response:
        handle = self.default_handle()
        return self.call("bos_execute", {"context_handle": handle, "tool_name": "people.search",
                                         "arguments": arguments or {}}, **kw)

    def default_handle(self) -> str:
        contexts = self.call("bos_get_context", {}).json()["result"]["structuredContent"]["contexts"]
        return next(c["context_handle"] for c in contexts if c["is_default"])


def stream_events(response: httpx.Response) -> tuple[list[dict], list[dict]]:
    """(notifications, finals) of an SSE response body (priming events, with empty data, skipped)."""
    events, _ = parse_sse(response.content)
    messages = [json.loads(e["data"]) for e in events if e["data"]]
    assert all(e["event"] == "message" for e in events)
    return [m for m in messages if "method" in m], [m for m in messages if "method" not in m]


@pytest.fixture()
def client_factory(bos_server):
    made: list[Client] = []

    def make(server=None, era: str = P2025, token: str | None = None) -> Client:
        server = server or bos_server
        client = Client(server, token or server.mint_grant()["access_token"], era)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def server_with(factory, name: str = "complete", **faults):
    scenario = load_scenario(name)
    scenario.faults = FaultSpec(**faults)
    return factory(scenario=scenario)


# -- 2025-11-25 era ----------------------------------------------------------------------------------

def test_initialize_advertises_the_extension_and_issues_a_session(bos_server, client_factory):
    client = client_factory()
    capability = client.capabilities["experimental"][EXT]
    assert capability == {"pageSize": 100, "maxConcurrentSources": 8,
                          "contractUri": bos_server.base_url + "/docs/source-results-v1"}
    assert client.session_id
    assert bos_server.counters.initializes == 1


def test_tools_list_is_paginated(client_factory):
    client = client_factory()
    names, cursor, pages = [], None, 0
    while True:
        response = client.rpc("tools/list", {"cursor": cursor} if cursor else {}).json()["result"]
        names += [tool["name"] for tool in response["tools"]]
        pages += 1
        cursor = response.get("nextCursor")
        if not cursor:
            break
    assert pages > 1
    assert names == ["bos_get_context", "bos_list_context_tools", "bos_execute", "search_people"]


def test_session_rules(bos_server, client_factory):
    client = client_factory()
    missing = client.http.post(bos_server.mcp_url, headers={"Accept": ACCEPT_BOTH},
                               json=client.body("tools/list"))
    assert missing.status_code == 400
    unknown = client.rpc("tools/list", extra_headers={"Mcp-Session-Id": "no-such-session"})
    assert unknown.status_code == 404
    deleted = client.http.delete(bos_server.mcp_url, headers=client.headers("tools/list"))
    assert deleted.status_code == 200
    assert bos_server.counters.sessions_deleted == 1
    assert client.rpc("tools/list").status_code == 404
    assert client.call("search_people", {}, opt_in={}).status_code == 404


def test_federated_call_checks_the_session_too(bos_server, client_factory):
    client = client_factory()
    assert client.call("search_people", {}, extra_headers={"Mcp-Session-Id": "nope"}).status_code == 404
    other = client_factory(token=bos_server.create_api_key())  # another principal must not use this session
    stolen = other.call("search_people", {}, extra_headers={"Mcp-Session-Id": client.session_id})
    assert stolen.status_code == 404


def test_unsupported_protocol_version_header_is_rejected(client_factory):
    client = client_factory()
    response = client.rpc("tools/list", extra_headers={"MCP-Protocol-Version": "1999-01-01"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] in (-32020, -32022, -32602)


def test_context_catalog_resource_and_describe(client_factory):
    client = client_factory()
    result = client.call("bos_get_context", {}).json()["result"]
    contexts = result["structuredContent"]["contexts"]
    assert result["structuredContent"]["contract_version"] == "bos-identity-mcp/v2"
    assert all(set(c) == CONTEXT_KEYS for c in contexts) and sum(c["is_default"] for c in contexts) == 1
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    handle = contexts[0]["context_handle"]
    catalog = client.call("bos_list_context_tools", {"context_handle": handle}).json()["result"]["structuredContent"]
    operations = {op["name"]: op for op in catalog["operations"]}
    assert operations["people.search"]["federated"] is True and "input_schema" in operations["people.search"]
    assert "service.describe" in operations
    uri = catalog["resources"][0]["uri"]
    assert uri == f"bos://contexts/{handle}/schema/person"
    contents = client.rpc("resources/read", {"uri": uri}, name=uri).json()["result"]["contents"]
    assert json.loads(contents[0]["text"])["title"] == "FederatedRecord"
    describe = client.call("bos_execute", {"context_handle": handle, "tool_name": "service.describe",
                                           "arguments": {}}).json()["result"]
    assert describe["structuredContent"]["context"]["context_handle"] == handle
    assert describe["_meta"]["bos/context"]["context_handle"] == handle
    bad = client.call("bos_execute", {"context_handle": "ctx_nope", "tool_name": "people.search", "arguments": {}})
    assert bad.json()["error"]["code"] == -32602


# -- negotiation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("era", [P2025, P2026])
def test_boolean_opt_in_or_missing_accept_gets_json(bos_server, client_factory, era):
    client = client_factory(era=era)
    boolean = client.execute(opt_in=True)
    assert boolean.headers["content-type"].startswith("application/json")
    no_sse = client.execute(opt_in={}, accept="application/json")
    assert no_sse.headers["content-type"].startswith("application/json")
    absent = client.execute()
    assert absent.headers["content-type"].startswith("application/json")
    for response in (boolean, no_sse, absent):
        result = response.json()["result"]
        assert result["structuredContent"]["result"]["metadata"]["completeness"] == "complete"
    assert bos_server.counters.streamed_calls == 0


@pytest.mark.parametrize("era", [P2025, P2026])
def test_object_opt_in_with_accept_streams(bos_server, client_factory, era):
    client = client_factory(era=era)
    response = client.execute(opt_in={})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    _, comments = parse_sse(response.content)
    assert comments[0] == EXT
    notifications, finals = stream_events(response)
    assert notifications and len(finals) == 1
    assert bos_server.counters.streamed_calls == 1 and bos_server.counters.completed_streams == 1


# -- stateless 2026-07-28 era -----------------------------------------------------------------------

def test_discover_advertises_the_extension(bos_server, client_factory):
    client = client_factory(era=P2026)
    result = client.rpc("server/discover").json()["result"]
    assert P2026 in result["supportedVersions"]
    assert result["capabilities"]["experimental"][EXT]["pageSize"] == 100
    assert bos_server.counters.discover_calls == 1


@pytest.mark.parametrize("tool", ["bos_get_context", "search_people"])  # SDK path and streaming path
def test_stateless_header_checks(client_factory, tool):
    client = client_factory(era=P2026)
    arguments: dict = {}
    no_method = client.http.post(client.server.mcp_url,
                                 json=client.body("tools/call", {"name": tool, "arguments": arguments}),
                                 headers={"Accept": ACCEPT_BOTH, "MCP-Protocol-Version": P2026, "Mcp-Name": tool})
    assert no_method.status_code == 400 and no_method.json()["error"]["code"] == -32020
    wrong_name = client.call(tool, arguments, extra_headers={"Mcp-Name": "other_tool"})
    assert wrong_name.status_code == 400 and wrong_name.json()["error"]["code"] == -32020
    encoded = "=?base64?" + base64.b64encode(tool.encode()).decode() + "?="
    assert client.call(tool, arguments, extra_headers={"Mcp-Name": encoded}).status_code == 200
    body = client.body("tools/call", {"name": tool, "arguments": arguments})
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    mismatch = client.http.post(client.server.mcp_url, json=body, headers=client.headers("tools/call", tool))
    assert mismatch.status_code == 400 and mismatch.json()["error"]["code"] == -32020
    unsupported = client.http.post(client.server.mcp_url, json=body, headers={
        **client.headers("tools/call", tool), "MCP-Protocol-Version": "2099-01-01"})
    assert unsupported.status_code == 400 and unsupported.json()["error"]["code"] == -32022
    del body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
    no_meta = client.http.post(client.server.mcp_url, json=body, headers=client.headers("tools/call", tool))
    assert no_meta.status_code == 400 and no_meta.json()["error"]["code"] == -32602


def test_stateless_results_say_complete(client_factory):
    client = client_factory(era=P2026)
    assert client.call("bos_get_context", {}).json()["result"]["resultType"] == "complete"
    assert client.execute().json()["result"]["resultType"] == "complete"
    _, finals = stream_events(client.execute(opt_in={}))
    assert finals[0]["result"]["resultType"] == "complete"


# -- the contract's JSON examples, in shape ---------------------------------------------------------

def _check_record(record: dict) -> None:
    assert set(record) >= FED_RECORD_KEYS
    assert record["sources"] and all(set(p) >= PROVENANCE_KEYS for p in record["sources"])
    assert isinstance(record["attributes"], dict)


def test_stream_shapes_match_the_contract_examples(bos_server_factory, client_factory):
    server = bos_server_factory(scenario="partial")
    client = client_factory(server)
    response = client.execute(opt_in={})
    notifications, finals = stream_events(response)
    request_id = f"req-{client._ids}"
    sequences = [n["params"]["sequence"] for n in notifications]
    assert sequences == list(range(1, len(notifications) + 1))
    per_source: dict = defaultdict(list)
    for note in notifications:
        assert note["jsonrpc"] == "2.0" and note["method"] == "notifications/bos/source_result" and "id" not in note
        params = note["params"]
        assert set(params) >= {"requestId", "sequence", "pageIndex", "source", "records", "status", "context"}
        assert params["requestId"] == request_id
        assert set(params["source"]) == {"source_type", "source_identity"}
        assert set(params["context"]) == CONTEXT_KEYS
        per_source[(params["source"]["source_type"], params["source"]["source_identity"])].append(params)
        if params["status"] == "page":
            assert 1 <= len(params["records"]) <= 100
            for record in params["records"]:
                _check_record(record)
        elif params["status"] == "error":
            assert params["records"] == [] and set(params["error"]) == {"code"}
        else:
            assert params["status"] == "complete"
    for events in per_source.values():
        pages = [e for e in events if e["status"] == "page"]
        assert [p["pageIndex"] for p in pages] == list(range(1, len(pages) + 1))
        assert events[-1]["status"] in ("complete", "error") and len(events) == len(pages) + 1
    empty = per_source[("directory", "ldap")]
    assert empty == [dict(empty[0], status="complete", pageIndex=0, records=[])]
    assert per_source[("billing", "billing-main")][-1]["pageIndex"] == 0

    (final,) = finals
    assert final["id"] == request_id and "method" not in final and "error" not in final
    result = final["result"]
    assert set(result) == {"content", "structuredContent", "isError", "_meta"}
    assert result["content"][0]["type"] == "text"
    structured = result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == structured
    assert set(structured) == {"contract_version", "context", "result"}
    assert structured["contract_version"] == "bos-identity-mcp/v2"
    assert result["_meta"]["bos/context"] == structured["context"]
    assert set(structured["result"]) == {"result", "metadata"}
    metadata = structured["result"]["metadata"]
    assert set(metadata) >= METADATA_KEYS
    assert metadata["completeness"] == "partial" and result["isError"] is True
    assert metadata["result_count"] == len(structured["result"]["result"])
    assert all(set(p) >= {"source_type", "source_identity", "observed_at"} for p in metadata["provenance"])
    errors = {(e["source"]["source_identity"], e["error"]["code"]) for e in metadata["source_errors"]}
    assert errors == {("crm-us", "source_timeout"), ("billing-main", "rate_limited")}
    for record in structured["result"]["result"]:
        _check_record(record)


def test_direct_tool_final_and_complete_metadata(client_factory):
    client = client_factory()
    _notifications, finals = stream_events(client.call("search_people", {}, opt_in={}))
    result = finals[0]["result"]
    structured = result["structuredContent"]
    assert set(structured) == {"result", "metadata"}
    assert structured["metadata"]["completeness"] == "complete" and result["isError"] is False
    assert "source_errors" not in structured["metadata"] or structured["metadata"]["source_errors"] == []
    assert structured["metadata"]["result_count"] == len(structured["result"])
    assert json.loads(result["content"][0]["text"]) == structured


def test_all_errors_is_partial_with_zero_records(bos_server_factory, client_factory):
    client = client_factory(bos_server_factory(scenario="all_errors"))
    notifications, finals = stream_events(client.execute(opt_in={}))
    assert {n["params"]["status"] for n in notifications} == {"error"}
    metadata = finals[0]["result"]["structuredContent"]["result"]["metadata"]
    assert metadata["completeness"] == "partial" and finals[0]["result"]["isError"] is True
    assert len(metadata["source_errors"]) == 5
    assert finals[0]["result"]["structuredContent"]["result"]["result"] == []


def test_json_and_stream_finals_agree(bos_server_factory, client_factory):
    # Two servers: each one's first read of the day (a second read of one server re-stamps).
    plain = client_factory(bos_server_factory()).execute().json()
    _, finals = stream_events(client_factory(bos_server_factory()).execute(opt_in={}))
    plain["id"] = finals[0]["id"]
    assert plain == finals[0]


def test_each_read_of_a_day_is_observed_anew(client_factory):
    client = client_factory()
    first, second = (client.execute().json()["result"]["structuredContent"]["result"] for _ in range(2))
    assert [unstamped(r) for r in first["result"]] == [unstamped(r) for r in second["result"]]
    observed = [datetime.fromisoformat(r["metadata"]["observed_at"]) for r in (first, second)]
    assert observed[1] - observed[0] == timedelta(minutes=1)
    # Every provenance entry carries its read's stamp (a source's observation, just before the read).
    for read, at in zip((first, second), observed, strict=True):
        stamps = {datetime.fromisoformat(e["observed_at"]) for r in read["result"] for e in r["sources"]}
        assert stamps and all(at - timedelta(minutes=2) < s <= at for s in stamps)


# -- the whole journey with plain httpx: OAuth, refresh, streamed bos_execute -------------------------

def _oauth_connect(http: httpx.Client, mcp_url: str) -> tuple[dict, dict]:
    challenge = http.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    metadata_url = re.search(r'resource_metadata="([^"]+)"', challenge.headers["www-authenticate"]).group(1)
    resource = http.get(metadata_url).json()
    assert resource["resource"] == mcp_url
    as_meta = http.get(resource["authorization_servers"][0] + "/.well-known/oauth-authorization-server").json()
    redirect = "http://127.0.0.1:8976/callback"
    client_id = http.post(as_meta["registration_endpoint"], json={
        "client_name": "journey", "redirect_uris": [redirect], "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"]}).json()["client_id"]
    verifier = secrets.token_urlsafe(48)
    challenge_value = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    state = secrets.token_urlsafe(16)
    location = http.get(as_meta["authorization_endpoint"] + "?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect, "scope": "mcp:tools offline_access",
        "state": state, "code_challenge": challenge_value, "code_challenge_method": "S256", "resource": mcp_url,
    })).headers["location"]
    callback = parse_qs(urlsplit(location).query)
    assert callback["state"] == [state] and callback["iss"] == [as_meta["issuer"]]
    tokens = http.post(as_meta["token_endpoint"], data={
        "grant_type": "authorization_code", "client_id": client_id, "redirect_uri": redirect,
        "code": callback["code"][0], "code_verifier": verifier, "resource": mcp_url}).json()
    refreshed = http.post(as_meta["token_endpoint"], data={
        "grant_type": "refresh_token", "client_id": client_id, "refresh_token": tokens["refresh_token"],
        "resource": mcp_url}).json()
    assert refreshed["refresh_token"] != tokens["refresh_token"]
    return refreshed, as_meta


@pytest.mark.parametrize(("era", "wire"), [(P2025, False), (P2026, False), (P2025, True), (P2026, True)])
def test_full_journey(bos_server_factory, era, wire):
    scenario = load_scenario("identity_merge")
    scenario.faults = FaultSpec(wire_mode=wire)
    server = bos_server_factory(scenario=scenario)
    with httpx.Client(timeout=20) as http:
        tokens, _ = _oauth_connect(http, server.mcp_url)
    client = Client(server, tokens["access_token"], era)
    try:
        response = client.execute(opt_in={})
    finally:
        client.close()
    notifications, finals = stream_events(response)
    assert notifications and len(finals) == 1
    final_records = finals[0]["result"]["structuredContent"]["result"]["result"]
    provisional_refs = {r["record_ref"] for n in notifications for r in n["params"]["records"]}
    assert provisional_refs.isdisjoint({r["record_ref"] for r in final_records})
    assert any(len(r["sources"]) == 2 for r in final_records)  # merged across both sources
    assert server.counters.refreshes == 1 and server.counters.completed_streams == 1
