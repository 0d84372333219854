"""The fast path for source-result pages (``mcp/page_records.py``) behaves exactly like the general one.

A ``notifications/bos/source_result`` page is either decoded by :func:`decode_source_result` (msgspec:
records shape-checked and counted, built only when ``progress.notification`` is read) or, when that
declines, by ``orjson`` with the tracker checking every record. Users must not be able to tell which
path a page took: same acceptance, same rule on rejection, same statistics, same records. Covered: the
equivalence (Hypothesis), what the fast path declines, that ``ProgressLogger`` never decodes records,
a real streamed read against the reference server, and edge inputs (numbers past 64 bits or float
range, deep nesting, invalid UTF-8) where msgspec and orjson differ, including the one documented
difference (a number out of float range inside a provisional record).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import BosError, BosProtocolError
from airflow_provider_bos.mcp import McpSession, RetryPolicy, SourceProgress
from airflow_provider_bos.mcp import event_stream as event_stream_module
from airflow_provider_bos.mcp.event_stream import ResponseEvents
from airflow_provider_bos.mcp.page_records import PageRecords, decode_source_result
from airflow_provider_bos.mcp.source_results import SourceResultsTracker
from airflow_provider_bos.models import SOURCE_ERROR_CODES, SOURCE_RESULT_METHOD
from airflow_provider_bos.operators.progress import ProgressLogger
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

PROFILE = settings(settings.get_profile(os.environ.get("BOS_HYPOTHESIS_PROFILE", "bos-ci")))
RID = "search-1"
CRM = {"source_type": "crm", "source_identity": "crm-eu"}
HR = {"source_type": "hr", "source_identity": "hr-main"}
CONTEXT = {"context_handle": "ctx-1", "organization_name": "Örg 東京", "application_name": None,
           "installation_name": "main", "role_label": "reader", "is_default": True}

# The contract's own examples (/work/shared/spec/source-results-v1.txt §3 and §5), verbatim.
SPEC_PAGE = (
    '{"jsonrpc":"2.0","method":"notifications/bos/source_result","params":{"requestId":"search-1","sequence":1,'
    '"pageIndex":1,"source":{"source_type":"example","source_identity":"demo-source"},"records":[{"record_ref":'
    '"bos:person:demo-1","display_name":"Example Person","email":null,"phone":null,"lifecycle":null,"sources":'
    '[{"source_type":"example","source_identity":"demo-source","external_id":"demo-1","record_type":"person",'
    '"observed_at":"2026-10-08T12:00:00Z","capabilities":["read"],"version":null}],"identity_match":null,'
    '"attributes":{}}],"status":"page","context":{"context_handle":"DISCOVERED_CONTEXT_HANDLE",'
    '"organization_name":"Example Organization","application_name":"Example Application","installation_name":'
    '"Example Installation","role_label":"Example Role","is_default":true}}}'
)
SPEC_COMPLETE = (
    '{"jsonrpc":"2.0","method":"notifications/bos/source_result","params":{"requestId":"search-1","sequence":2,'
    '"pageIndex":1,"source":{"source_type":"example","source_identity":"demo-source"},"records":[],'
    '"status":"complete","context":{"context_handle":"DISCOVERED_CONTEXT_HANDLE","organization_name":'
    '"Example Organization","application_name":"Example Application","installation_name":"Example Installation",'
    '"role_label":"Example Role","is_default":true}}}'
)
SPEC_ERROR = (
    '{"jsonrpc":"2.0","method":"notifications/bos/source_result","params":{"requestId":"search-1","sequence":3,'
    '"pageIndex":0,"source":{"source_type":"example","source_identity":"other-demo-source"},"records":[],'
    '"status":"error","error":{"code":"source_timeout"},"context":{"context_handle":"DISCOVERED_CONTEXT_HANDLE",'
    '"organization_name":"Example Organization","application_name":"Example Application","installation_name":'
    '"Example Installation","role_label":"Example Role","is_default":true}}}'
)


# --- helpers ---------------------------------------------------------------------------------------------


def record(ref: str, source: dict[str, str] = CRM) -> dict[str, Any]:
    return {"record_ref": ref, "display_name": "Zoë Ångström", "email": None, "phone": None, "lifecycle": None,
            "identity_match": None, "attributes": {"nested": {"a": [1, "x"]}},
            "sources": [{**source, "external_id": ref, "record_type": "person",
                         "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"], "version": None}]}


def params_of(seq: int, page: int, status: str = "page", *, source: dict[str, str] = CRM,
              records: list[Any] | None = None, error: str | None = None) -> dict[str, Any]:
    params = {"requestId": RID, "sequence": seq, "pageIndex": page, "source": source,
              "records": records if records is not None else [], "status": status}
    if error is not None:
        params["error"] = {"code": error}
    return params


def message(params: Any, **envelope: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": SOURCE_RESULT_METHOD, **envelope, "params": params},
                      ensure_ascii=False)


Outcome = tuple[Any, ...]


def observe(params: Any) -> tuple[Outcome, SourceProgress | None]:
    """Feed one notification to a fresh tracker; what a user can see of the result."""
    tracker = SourceResultsTracker(RID)
    try:
        progress = tracker.observe(params)
    except BosError as exc:
        return ("rejected", type(exc).__name__, getattr(exc, "rule", None)), None
    sources = {key: stats.as_dict() for key, stats in tracker.sources.items()}
    return ("accepted", sources, tracker.provisional_records, tracker.pages, tracker.notifications,
            tracker.last_sequence, progress.sequence, progress.page_records, progress.stats), progress


def general_path(data: str | bytes) -> tuple[Outcome, SourceProgress | None]:
    """How the session decoded every notification before the fast path existed."""
    try:
        params = orjson.loads(data)["params"]
    except orjson.JSONDecodeError:
        return ("invalid JSON",), None
    return observe(params)


def fast_path(data: str | bytes) -> tuple[Outcome, SourceProgress | None, bool]:
    """How the session decodes a notification now: the fast path, or the general one if it declines."""
    params = decode_source_result(data, SOURCE_RESULT_METHOD)
    if params is None:
        return (*general_path(data), False)
    return (*observe(params), True)


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, log_record: logging.LogRecord) -> None:
        self.lines.append((log_record.levelname, log_record.getMessage()))


def collecting_logger(name: str) -> tuple[logging.Logger, LogLines]:
    log = logging.getLogger(name)
    handler = LogLines()
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    return log, handler


# --- generated pages: well-formed or broken as the tracker's record rules catch ------------------------------

texts = st.text(max_size=10)  # any Unicode but surrogates: non-ASCII, quotes, backslashes, control characters
# 64-bit integers only: beyond them orjson and msgspec decode differently (see the edge inputs at the end).
ints = st.integers(-(2**63), 2**63 - 1)
numbers = ints | st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(st.none() | st.booleans() | numbers | texts,
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                      max_leaves=8)
not_objects = st.none() | st.booleans() | numbers | texts | st.lists(values, max_size=2)
unknown_fields = st.dictionaries(texts.map(lambda name: "x-" + name), values, max_size=2)


@st.composite
def arranged(draw: st.DrawFn, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` plus unknown fields, its keys in any order."""
    obj = {**obj, **draw(unknown_fields)}
    return {key: obj[key] for key in draw(st.permutations(list(obj)))}


@st.composite
def good_records(draw: st.DrawFn) -> dict[str, Any]:
    provenance = st.builds(
        lambda external_id, observed_at, version: {**CRM, "external_id": external_id, "record_type": "person",
                                                   "observed_at": observed_at, "capabilities": ["read"],
                                                   "version": version},
        texts, texts, st.none() | texts,
    ).flatmap(arranged)
    return draw(arranged({
        "record_ref": draw(st.text(min_size=1, max_size=12)), "display_name": draw(st.none() | texts),
        "email": None, "phone": None, "lifecycle": None, "identity_match": None,
        "attributes": draw(st.dictionaries(texts, values, max_size=3)),
        "sources": draw(st.lists(provenance, min_size=1, max_size=3)),
    }))


BREAKS = ["record not an object", "record_ref missing", "record_ref null", "record_ref empty", "record_ref number",
          "sources missing", "sources not a list", "sources empty", "provenance not an object",
          "observed_at missing", "observed_at null", "observed_at number"]


@st.composite
def broken(draw: st.DrawFn, rec: dict[str, Any]) -> Any:
    """``rec`` broken in one of the ways the tracker's page-record rules catch."""
    how = draw(st.sampled_from(BREAKS))
    rec = dict(rec)
    if how == "record not an object":
        return draw(not_objects)
    if how.startswith(("record_ref", "sources")):
        field, what = how.split(" ", 1)
        if what == "missing":
            del rec[field]
        elif what == "null":
            rec[field] = None
        elif what == "empty":
            rec[field] = "" if field == "record_ref" else []
        elif what == "number":
            rec[field] = draw(numbers)
        else:  # sources not a list
            rec[field] = draw(st.none() | texts | numbers | st.dictionaries(texts, values, max_size=2))
        return rec
    sources = list(rec["sources"])
    at = draw(st.integers(0, len(sources) - 1))
    if how == "provenance not an object":
        sources[at] = draw(not_objects)
    else:
        entry = dict(sources[at])
        if how == "observed_at missing":
            del entry["observed_at"]
        else:
            entry["observed_at"] = None if how == "observed_at null" else draw(numbers)
        sources[at] = entry
    rec["sources"] = sources
    return rec


ENVELOPE_FAULTS: dict[str, Any] = {
    "requestId": st.sampled_from(["search-2", 1, None, True]),
    "sequence": st.sampled_from(["1", 1.0, None, True]),
    "pageIndex": st.sampled_from([7, -1, "1"]),
    "status": st.sampled_from(["done", None, 1]),
    "source": st.sampled_from([{"source_type": 1, "source_identity": "x"}, ["crm"], None]),
}


@st.composite
def notifications(draw: st.DrawFn) -> tuple[str | bytes, bool]:
    """A source-result notification as the wire carries it, and whether a record in it is broken."""
    records, any_broken = [], False
    for _ in range(draw(st.integers(0, 4))):
        rec = draw(good_records())
        if draw(st.integers(0, 4)) == 0:
            rec, any_broken = draw(broken(rec)), True
        records.append(rec)
    status = draw(st.sampled_from(["page", "page", "complete", "error"]))
    params = params_of(draw(st.integers(1, 2**31)), 1 if status == "page" else 0, status,
                       source=draw(arranged(dict(CRM))), records=records,
                       error=draw(st.sampled_from(sorted(SOURCE_ERROR_CODES))) if status == "error" else None)
    if draw(st.booleans()):
        params["context"] = draw(arranged(CONTEXT))
    if draw(st.integers(0, 5)) == 0:  # sometimes the envelope breaks a rule of its own
        field = draw(st.sampled_from(sorted(ENVELOPE_FAULTS)))
        params[field] = draw(ENVELOPE_FAULTS[field])
    envelope = draw(arranged({"jsonrpc": "2.0", "method": SOURCE_RESULT_METHOD, "params": draw(arranged(params))}))
    text = json.dumps(envelope, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    return (text.encode() if draw(st.booleans()) else text), any_broken


# --- 1. equivalence ----------------------------------------------------------------------------------------


@PROFILE
@given(notifications())
def test_fast_and_general_paths_end_identically(case: tuple[str | bytes, bool]) -> None:
    """Whichever path a page takes, the user sees the same acceptance or rule, stats and records."""
    data, has_broken_record = case
    expected, general = general_path(data)
    got, fast, took_fast_path = fast_path(data)
    assert took_fast_path is not has_broken_record  # takes every well-formed page, never a broken one
    assert got == expected
    if general is not None:
        assert fast is not None
        wire = orjson.loads(data)["params"]
        assert fast.notification.records == wire["records"]
        dumped = fast.notification.model_dump()
        assert dumped == general.notification.model_dump()
        assert {k: dumped[k] for k in wire if k.startswith("x-")} == {k: v for k, v in wire.items()
                                                                     if k.startswith("x-")}


# --- 2. what the fast path takes and what it leaves to the general path ---------------------------------------

GOOD = params_of(1, 1, records=[record("bos:person:1"), record("bos:person:2")])


@pytest.mark.parametrize("data", [
    pytest.param(message(GOOD, id=7), id="server-to-client request"),
    pytest.param(message(GOOD, id=None), id="request with a null id"),
    pytest.param(message(GOOD).replace(SOURCE_RESULT_METHOD, "notifications/progress"), id="another method"),
    pytest.param(message([GOOD]), id="params an array"),
    pytest.param(message("page"), id="params a string"),
    pytest.param(message(None), id="params null"),
    pytest.param(message(GOOD)[:-1], id="truncated JSON"),
    pytest.param(message(GOOD).replace('"status":', '"status"', 1), id="invalid JSON"),
    pytest.param("[" + message(GOOD) + "]", id="a batch"),
    pytest.param(message({**GOOD, "records": [record("a"), {**record("b"), "record_ref": ""}]}), id="bad record"),
    pytest.param(message({**GOOD, "records": [{**record("a"), "sources": [{"observed_at": 1}]}]}),
                 id="bad provenance"),
    pytest.param(message({k: v for k, v in GOOD.items() if k != "records"}), id="no records"),
    pytest.param(message({**GOOD, "records": {"0": record("a")}}), id="records an object"),
])
def test_the_fast_path_declines_what_it_does_not_take(data: str) -> None:
    """Anything but a well-formed page goes to the general path, which names the violation."""
    assert decode_source_result(data, SOURCE_RESULT_METHOD) is None
    assert decode_source_result(data.encode(), SOURCE_RESULT_METHOD) is None


@pytest.mark.parametrize("data", [SPEC_PAGE, SPEC_COMPLETE, SPEC_ERROR, message(GOOD)],
                         ids=["spec page", "spec complete", "spec error", "two records"])
@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_the_fast_path_takes_a_page_as_str_or_bytes(data: str, as_bytes: bool) -> None:
    """A contract page is counted without being built; its other fields are the decoded JSON."""
    params = decode_source_result(data.encode() if as_bytes else data, SOURCE_RESULT_METHOD)
    wire = orjson.loads(data)["params"]
    assert params is not None and type(params["records"]) is PageRecords
    assert params["records"].count == len(params["records"]) == len(wire["records"])
    assert {k: v for k, v in params.items() if k != "records"} == {k: v for k, v in wire.items() if k != "records"}
    assert params["records"].decode() == wire["records"]


# --- 3. laziness: progress logging never decodes records ----------------------------------------------------


def _must_not_decode(self: PageRecords) -> Any:
    raise AssertionError("the page's records were decoded")


def test_progress_logger_logs_fast_path_pages_without_decoding_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress lines count pages and records from the counts alone: no record is built to log a line."""
    wire = [
        message(params_of(1, 1, records=[record("a"), record("b")])),
        message(params_of(2, 0, "error", source=HR, error="source_timeout")),
        message(params_of(3, 2, records=[record("c"), record("d"), record("e")])),
        message(params_of(4, 2, "complete")),
    ]
    monkeypatch.setattr(PageRecords, "decode", _must_not_decode)
    log, handler = collecting_logger("tests.bos.page_records.progress")
    tracker, on_progress = SourceResultsTracker(RID), ProgressLogger(log)
    for data in wire:
        params = decode_source_result(data, SOURCE_RESULT_METHOD)
        assert params is not None and type(params["records"]) is PageRecords
        progress = tracker.observe(params)
        on_progress(progress)
    assert handler.lines == [
        ("INFO", "BOS progress: crm/crm-eu page 1 (+2 provisional records, 2 so far)"),
        ("WARNING", "BOS progress: hr/hr-main ERROR source_timeout after 0 page(s), 0 provisional records"),
        ("INFO", "BOS progress: crm/crm-eu page 2 (+3 provisional records, 5 so far)"),
        ("INFO", "BOS progress: crm/crm-eu complete after 2 page(s), 5 provisional records"),
    ]
    assert on_progress.notifications == 4
    with pytest.raises(AssertionError, match="decoded"):  # the trap is live: reading the page would decode
        progress.notification  # noqa: B018


def test_a_fast_path_page_is_decoded_once_on_first_access(monkeypatch: pytest.MonkeyPatch) -> None:
    """``progress.notification`` builds the records on demand, once, equal to the wire records."""
    calls: list[int] = []
    decode = PageRecords.decode

    def counting(self: PageRecords) -> list[dict[str, Any]]:
        calls.append(self.count)
        return decode(self)

    monkeypatch.setattr(PageRecords, "decode", counting)
    params = decode_source_result(SPEC_PAGE, SOURCE_RESULT_METHOD)
    assert params is not None
    progress = SourceResultsTracker(RID).observe(params)
    assert calls == [] and progress.page_records == 1
    first = progress.notification
    assert progress.notification is first and calls == [1]
    assert first.records == orjson.loads(SPEC_PAGE)["params"]["records"]
    assert first.context is not None and first.context.context_handle == "DISCOVERED_CONTEXT_HANDLE"


# --- 4. end to end: a streamed read against the reference server ---------------------------------------------

FAST = RetryPolicy(attempts=3, max_total_s=20, backoff_base_s=0.05, backoff_max_s=0.2)


@pytest.mark.parametrize(("scenario", "era", "wire_mode"), [
    ("complete", "2026-07-28", False),
    ("complete", "2025-11-25", True),
    ("partial", "2026-07-28", False),
])
def test_a_streamed_read_takes_the_fast_path_for_every_page(
    bos_server_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, scenario: str, era: str,
    wire_mode: bool,
) -> None:
    """Every page of a real stream is decoded fast, and users still see exactly the server's records."""
    fast_calls: list[tuple[str, bool]] = []
    general_notifications: list[Any] = []

    def counting_decode(data: str | bytes, method: str) -> dict[str, Any] | None:
        params = decode_source_result(data, method)
        fast_calls.append((data if isinstance(data, str) else data.decode(), params is not None))
        return params

    dispatch = ResponseEvents.dispatch_message

    def recording_dispatch(self: ResponseEvents, msg: Any) -> Any:
        if isinstance(msg, dict) and msg.get("method") == SOURCE_RESULT_METHOD:
            general_notifications.append(msg)
        return dispatch(self, msg)

    monkeypatch.setattr(event_stream_module, "decode_source_result", counting_decode)
    monkeypatch.setattr(ResponseEvents, "dispatch_message", recording_dispatch)
    plan = load_scenario(scenario)
    plan.faults = FaultSpec(wire_mode=wire_mode)
    server = bos_server_factory(scenario=plan)
    progress: list[SourceProgress] = []
    client = httpx.Client(headers={"Authorization": f"Bearer {server.mint_grant()['access_token']}"}, timeout=20.0)
    with client, McpSession(server.mcp_url, http_client=client, era=era, retry=FAST, timeout=20.0) as session:
        result = session.federated_read("search_people", {}, via="direct", on_progress=progress.append)
    list(result.records)

    assert general_notifications == []
    assert fast_calls and all(took for _, took in fast_calls)
    wire = [orjson.loads(data)["params"] for data, _ in fast_calls]
    assert len(wire) == len(progress) == result.observations.notifications
    assert [p.sequence for p in progress] == [w["sequence"] for w in wire]
    assert [p.sequence for p in progress] == sorted({p.sequence for p in progress})
    provisional = [r["record_ref"] for p in progress for r in p.notification.records]
    assert provisional == [r["record_ref"] for w in wire for r in w["records"]] and provisional
    assert [p.page_records for p in progress] == [len(w["records"]) for w in wire]
    assert sum(p.page_records for p in progress) == result.observations.provisional_records == len(provisional)
    if scenario == "partial":
        assert result.observations.errored_sources and any(p.stats.status == "error" for p in progress)


# --- edge inputs: numbers, nesting and bytes where msgspec and orjson differ ------------------------------------

URL = "https://bos.example/mcp/apps/bos/platform"
CAPS = {"tools": {}, "experimental": {"bos/source-results/v1": {"pageSize": 100, "maxConcurrentSources": 8,
                                                                "contractUri": "x"}}}


def _session_streaming(events: list[str | bytes]) -> McpSession:
    """A 2025-era session whose tools/call answers with these SSE ``data`` payloads (RID: the real id)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        if body.get("method") == "initialize":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS, "serverInfo": {"name": "f", "version": "1"}}},
                headers={"mcp-session-id": "s"})
        if "id" not in body:
            return httpx.Response(202)
        rid = body["id"].encode()
        stream = b"".join(b"event: message\ndata: " + (e if isinstance(e, bytes) else e.encode()).replace(
            RID.encode(), rid) + b"\n\n" for e in events)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    return McpSession(URL, http_client=httpx.Client(transport=httpx.MockTransport(handler)), era="2025-11-25",
                      retry=RetryPolicy(attempts=1, max_total_s=5, backoff_base_s=0, backoff_max_s=0))


def _final(*refs: str) -> str:
    metadata = {"retrieval_mode": "live_provider", "cache_baseline_applied": False, "source_delta_applied": False,
                "completeness": "complete", "result_count": len(refs), "observed_at": "2026-10-08T12:00:00+00:00",
                "provenance": [], "source_errors": []}
    return json.dumps({"jsonrpc": "2.0", "id": RID, "result": {"content": [], "isError": False, "structuredContent": {
        "result": [record(ref) for ref in refs], "metadata": metadata}}})


def _read(page: str | bytes, *, read_records: bool = False) -> tuple[Any, list[SourceProgress]]:
    """A read whose stream is ``page``, a completion and a final result; its result and progress.

    ``read_records``: the callback reads each page's records (as a user's ``on_progress`` may).
    """
    seen: list[SourceProgress] = []

    def on_progress(progress: SourceProgress) -> None:
        if read_records:
            progress.notification.records  # noqa: B018 - reading them is the point
        seen.append(progress)

    with _session_streaming([page, message(params_of(2, 1, "complete")), _final("a")]) as session:
        result = session.federated_read("search_people", {}, via="direct", on_progress=on_progress, deadline_s=30)
    return result, seen


def _deep(depth: int) -> str:
    return message(params_of(1, 1, records=[record("a")])).replace(
        '"nested": {"a": [1, "x"]}', '"nested": ' + "[" * depth + "]" * depth)


def test_a_sequence_beyond_64_bits_is_refused_by_both_paths() -> None:
    """The page's own fields decode as the general path decodes them: 2**64 is not an integer sequence."""
    data = message(params_of(2**64, 1, records=[record("a")]))
    assert general_path(data)[0] == ("rejected", "BosStreamValidationError", "sequence")
    assert fast_path(data)[0] == general_path(data)[0]


@pytest.mark.parametrize("depth", [100, 1100], ids=["nested", "beyond orjson's depth limit"])
def test_a_deeply_nested_page_is_declined_or_taken_never_raised(depth: int) -> None:
    """The fast path returns params or ``None`` for any JSON nesting, never a RecursionError."""
    data = _deep(depth)
    assert fast_path(data)[0] == general_path(data)[0]


@pytest.mark.parametrize("depth", [1000, 1100], ids=["valid JSON (orjson reads it)", "beyond orjson's limit"])
def test_a_deeply_nested_page_ends_the_read_as_the_general_path_would(depth: int) -> None:
    """Valid JSON is read; JSON too deep for orjson ends the read with a ``BosError``, not a RecursionError."""
    page = _deep(depth)
    try:
        result, _ = _read(page)
    except BosError:
        assert general_path(page)[0] == ("invalid JSON",)
        return
    assert general_path(page)[0][0] == "accepted" and result.observations.provisional_records == 1


# Where msgspec and orjson differ. The fast path declines bytes that are not UTF-8 and reads records
# with orjson, so those agree; the one deliberate difference (page_records.py's docstring) is a
# number out of float range deep inside a provisional record: syntax-checked only, so the read goes
# on, and reading those records raises a BosProtocolError (never msgspec's or orjson's own error).

_OUT_OF_RANGE = message(params_of(1, 1, records=[record("a")])).replace(
    '"attributes": {', '"attributes": {"x": 1e400, ')


def test_an_out_of_range_number_in_a_provisional_record_does_not_end_the_read() -> None:
    """The documented difference: the general path refuses the message, the fast path counts the page."""
    assert general_path(_OUT_OF_RANGE)[0] == ("invalid JSON",)
    outcome, progress, took_fast_path = fast_path(_OUT_OF_RANGE)
    assert took_fast_path and outcome[0] == "accepted" and progress is not None and progress.page_records == 1


def test_reading_records_with_an_out_of_range_number_raises_a_bos_error() -> None:
    """A callback that reads such a page gets a typed BosProtocolError, which ends the read as any BosError."""
    with pytest.raises(BosProtocolError, match="provisional records do not decode"):
        _read(_OUT_OF_RANGE, read_records=True)


def test_an_integer_beyond_64_bits_in_a_record_reads_as_the_general_path_reads_it() -> None:
    """A page's records read the same whichever path decoded the page."""
    data = message(params_of(1, 1, records=[{**record("a"), "attributes": {"n": 2**64 + 1}}]))
    (_, general), (_, fast, took_fast_path) = general_path(data), fast_path(data)
    assert took_fast_path and fast is not None and general is not None
    assert fast.notification.records == general.notification.records


def test_invalid_utf8_in_a_record_reads_as_the_general_path_reads_it() -> None:
    """The general path decodes invalid UTF-8 with U+FFFD (the SSE rule); a fast-path page reads the same."""
    page = message(params_of(1, 1, records=[{**record("a"), "display_name": "Zoë ZZ"}])).encode().replace(
        b"ZZ", b"\xff")
    assert decode_source_result(page, SOURCE_RESULT_METHOD) is not None  # msgspec skipped the field
    _, seen = _read(page)
    assert seen[0].page_records == 1
    assert seen[0].notification.records[0]["display_name"] == "Zoë \ufffd"
