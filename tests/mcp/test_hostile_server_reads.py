"""What a hostile or broken server can do to a read through its notifications and final result.

- Source identities are the server's: the tracker keeps a bounded number of them (memory, the
  audit row's ``source_summary``), and a read past the bound cannot pass as complete.
- Server text never reaches a log line or an error message raw: no forged lines, no terminal escapes.
- A final result whose ``result_count`` disagrees with its records, or that arrives before a
  source's terminal status, contradicts itself: the run is ``partial``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from test_source_results import CRM, HR, RID, direct_result, frame, metadata, note, record

from airflow_provider_bos.exceptions import BosStreamValidationError
from airflow_provider_bos.mcp.final_result import FinalResultParser
from airflow_provider_bos.mcp.source_results import (
    MAX_TRACKED_SOURCE_CHARS,
    MAX_TRACKED_SOURCES,
    SourceResultsTracker,
)
from airflow_provider_bos.operators.progress import ProgressLogger
from airflow_provider_bos.sync import run_status

FORGED = "crm-eu\nERROR BOS: the grant expired; reconnect at https://evil.example/connect\x1b[2J\u202e"


def source(n: int, identity: str | None = None) -> dict[str, str]:
    return {"source_type": "crm", "source_identity": identity if identity is not None else f"crm-{n}"}


def finish(tracker: SourceResultsTracker, final: dict, *, streamed: bool = True) -> Any:
    return FinalResultParser(RID, tool_style="direct", observations=tracker, streamed=streamed).parse_data(
        frame(final))


# --- the tracked sources are bounded -------------------------------------------------------------------

def test_the_tracker_keeps_at_most_the_documented_number_of_sources() -> None:
    tracker = SourceResultsTracker(RID)
    extra = 2_000
    for n in range(MAX_TRACKED_SOURCES + extra):
        tracker.observe(note(n + 1, 0, "complete", source=source(n)))
    assert len(tracker.sources) == MAX_TRACKED_SOURCES
    assert tracker.notifications == MAX_TRACKED_SOURCES + extra  # still counted
    assert tracker.untracked_notifications == extra
    summary = tracker.summary()
    assert len(summary) == MAX_TRACKED_SOURCES + 1
    assert summary[-1]["status"] == "untracked"
    assert summary[-1].keys() == summary[0].keys()  # same shape: SQL over the JSON keeps working
    assert summary[-1]["pages"] == 0 and summary[-1]["records"] == 0
    assert str(MAX_TRACKED_SOURCES) in summary[-1]["source_identity"]


def test_long_source_names_count_against_a_character_budget() -> None:
    tracker = SourceResultsTracker(RID)
    long_name = "x" * 20_000
    n = 0
    while not tracker.untracked_notifications:
        n += 1
        tracker.observe(note(n, 1, source=source(n, f"{n}-{long_name}"), records=[record(f"r{n}")]))
    tracked_chars = sum(len(t) + len(i) for t, i in tracker.sources)
    assert tracked_chars <= MAX_TRACKED_SOURCE_CHARS
    assert len(json.dumps(tracker.summary())) < MAX_TRACKED_SOURCE_CHARS + 200 * (len(tracker.sources) + 1)
    assert tracker.summary()[-1] == {**tracker.summary()[-1], "status": "untracked", "pages": 1, "records": 1}


def test_untracked_sources_still_follow_the_per_notification_rules() -> None:
    tracker = SourceResultsTracker(RID)
    for n in range(MAX_TRACKED_SOURCES):
        tracker.observe(note(n + 1, 0, "complete", source=source(n)))
    seq = MAX_TRACKED_SOURCES + 1
    tracker.observe(note(seq, 1, source=source(-1)))
    bad = [note(seq, 1, source=source(-2)),  # sequence does not increase
           {**note(seq + 1, 1, source=source(-3)), "status": "done"},
           note(seq + 1, 0, "error", source=source(-4), error="exploded"),
           {**note(seq + 1, 1, source=source(-5)), "requestId": "other"}]
    rules = []
    for params in bad:
        with pytest.raises(BosStreamValidationError) as caught:
            tracker.observe(params)
        rules.append(caught.value.rule)  # type: ignore[attr-defined]
    assert rules == ["sequence", "status", "error-code", "request-id"]
    # sources already tracked keep their per-source rules
    with pytest.raises(BosStreamValidationError, match="after its terminal"):
        tracker.observe(note(seq + 1, 1, source=source(0)))


def test_a_read_past_the_bound_is_partial_and_says_why() -> None:
    tracker = SourceResultsTracker(RID)
    for n in range(MAX_TRACKED_SOURCES + 1):
        tracker.observe(note(n + 1, 0, "complete", source=source(n)))
    final = finish(tracker, direct_result([record("a")], metadata("complete", 1)))
    assert final.completeness == "complete"  # what the server claims...
    assert run_status(final) == "partial"  # ...cannot be checked, so it is not trusted
    [reason] = final.contradictions
    assert f"more than {MAX_TRACKED_SOURCES} sources" in reason


# --- server text is escaped in logs and messages ---------------------------------------------------------

def test_the_progress_log_escapes_server_supplied_source_names(caplog: pytest.LogCaptureFixture) -> None:
    tracker = SourceResultsTracker(RID)
    evil = {"source_type": "crm\r\nWARNING x", "source_identity": FORGED}
    log = logging.getLogger("bos-test-progress")
    progress = ProgressLogger(log)
    with caplog.at_level(logging.INFO, logger="bos-test-progress"):
        progress(tracker.observe(note(1, 1, source=evil)))
        progress(tracker.observe(note(2, 1, "complete", source=evil)))
        progress(tracker.observe(note(3, 0, "error", source={**evil, "source_identity": FORGED + "2"},
                                      error="source_timeout")))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u202e" not in line
        assert "\\n" in line and "\\x1b" in line and "\\u202e" in line
        assert line.startswith("BOS progress: crm\\r\\nWARNING x/crm-eu\\nERROR BOS")


def test_contract_violations_escape_the_source_name() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1, source=source(0, FORGED)))
    with pytest.raises(BosStreamValidationError) as caught:
        tracker.observe(note(2, 5, source=source(0, FORGED)))
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message and "crm-eu\\nERROR" in message


def test_cross_check_warnings_escape_server_text(caplog: pytest.LogCaptureFixture) -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 0, "error", source=source(0, FORGED), error="source_timeout"))
    tracker.observe(note(2, 1, source=source(1, FORGED + "-running")))
    tracker.observe(note(3, 0, "complete", source=source(2, FORGED + "-reported")))
    errors = [{"source": source(2, FORGED + "-reported"), "error": {"code": "source_timeout"}}]
    with caplog.at_level(logging.WARNING):
        final = finish(tracker, direct_result([record("a")], metadata("partial", 1, errors), is_error=True))
    assert len(final.warnings) >= 3
    for text in [*final.warnings, *(r.getMessage() for r in caplog.records)]:
        assert "\n" not in text and "\x1b" not in text and "\u202e" not in text


# --- contradictions ----------------------------------------------------------------------------------------

def test_a_result_count_that_disagrees_with_the_records_is_a_contradiction() -> None:
    for claimed in (0, 2, 5):
        final = finish(SourceResultsTracker(RID), direct_result([record("a")], metadata("complete", claimed)),
                       streamed=False)
        [reason] = final.contradictions
        assert f"result_count is {claimed} but the result holds 1 records" in reason
        assert run_status(final) == "partial"


def test_a_source_that_never_finished_is_a_contradiction() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1, records=[record("a")]))
    tracker.observe(note(2, 1, source=HR, records=[record("b", HR)]))
    tracker.observe(note(3, 1, "complete", source=HR))  # crm never sends its terminal status
    final = finish(tracker, direct_result([record("a"), record("b", HR)], metadata("complete", 2)))
    [reason] = final.contradictions
    assert "before these sources finished: crm/crm-eu" in reason
    assert run_status(final) == "partial"


def test_a_consistent_result_is_no_contradiction() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1, records=[record("a")]))
    tracker.observe(note(2, 1, "complete"))
    final = finish(tracker, direct_result([record("a")], metadata("complete", 1)))
    assert final.warnings == [] and final.contradictions == [] and run_status(final) == "complete"
    assert source(0, "crm-eu") == CRM


def test_the_progress_log_says_once_that_sources_went_untracked(caplog: pytest.LogCaptureFixture) -> None:
    tracker = SourceResultsTracker(RID)
    log = logging.getLogger("bos-test-progress-bound")
    progress = ProgressLogger(log)
    with caplog.at_level(logging.INFO, logger="bos-test-progress-bound"):
        for n in range(MAX_TRACKED_SOURCES + 500):
            progress(tracker.observe(note(n + 1, 0, "complete", source=source(n))))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == MAX_TRACKED_SOURCES + 1
    assert f"more sources than the {MAX_TRACKED_SOURCES} this task tracks" in lines[-1]
    assert progress.notifications == MAX_TRACKED_SOURCES + 500
