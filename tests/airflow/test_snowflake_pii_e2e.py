"""Personal data end to end on Snowflake: the suite of test_personal_data_e2e.py, its destination a
Connection of type ``snowflake`` on the fakesnow server, through SnowflakeHook.

Every test of the suite runs here. Snowflake's documented deviations leave none out: it has no
writers' lock, and no test of the suite relies on one (``pii-apply`` and the runs here never
overlap, as docs/personal-data.md asks on Snowflake); the suite's DuckDB staged-file observer sees
nothing here, because Snowflake stages no files. Its staging is statement text instead: the
connector inlines the bound values into multi-row ``INSERT``s, which stay in the account's query
history. So these tests also search every statement and parameter sent to Snowflake: a run under
the policy, ``pii-apply`` and an erasure by a hashed field send no raw value of a hashed or dropped
field, and never the key.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))
import test_personal_data_e2e as suite
from snowflake_destination import *  # noqa: F403 - the fixtures that make Snowflake the destination
from test_personal_data_e2e import pii  # noqa: F401 - the fixture

from airflow_provider_bos.pii import hash_value
from airflow_provider_bos.testing.federation import expected_final

pytestmark = [pytest.mark.airflow, pytest.mark.snowflake]


def _texts(value: Any) -> Iterator[str]:
    """Every scalar of a statement's parameters, as text (the values the connector inlines)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    elif value is not None:
        yield str(value)


@pytest.fixture()
def sent() -> Iterator[list[str]]:
    """The text and parameters of every statement any Snowflake engine sends while the test runs
    (the task builds its engine through SnowflakeHook, the CLI its own, all in this process)."""
    seen: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if conn.engine.dialect.name == "snowflake":
            seen.append("\n".join([statement, *_texts(parameters)]))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", before)


@pytest.fixture()
def commands(sent: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], list[str]]]:
    """Each ``airflow-provider-bos`` command the suite runs, with the statements it sent."""
    ran: list[tuple[tuple[str, ...], list[str]]] = []
    command = suite.command

    def observed(env: dict[str, Any], *args: str) -> Any:
        start = len(sent)
        try:
            return command(env, *args)
        finally:
            ran.append((args, sent[start:]))

    monkeypatch.setattr(suite, "command", observed)
    return ran


def _staging(sent: list[str]) -> list[str]:
    """The statements that staged the run's records (``INSERT``s into its temporary staging table)."""
    return [s for s in sent if s.lstrip().upper().startswith("INSERT INTO BOS_STAGE_")]


def _named(args: tuple[str, ...]) -> set[str]:
    """The raw values an ``erase`` command names (an external id without its ``SOURCE:``)."""
    values = set()
    for option, value in itertools.pairwise(args):
        if option in ("--email", "--phone"):
            values.add(value)
        elif option == "--external-id":
            values.add(value.split(":", 1)[1])
    return values


def test_nothing_raw_of_a_hashed_or_dropped_field_is_stored_staged_handed_logged_or_returned(
        pii, run_dag, caplog, capsys, sent) -> None:  # noqa: F811
    suite.test_nothing_raw_of_a_hashed_or_dropped_field_is_stored_staged_handed_logged_or_returned(
        pii, run_dag, caplog, capsys)
    people = [r.record for r in expected_final(suite.SCENARIO, 1).records]
    staged = _staging(sent)
    # The statements carry the records as stored: a kept name and a hashed email are in them...
    person = next(p for p in people if p["email"] and p["display_name"])
    assert suite.leaks(staged, {person["display_name"], hash_value(pii["key"], "email", person["email"])})
    # ... and no raw value of a hashed or dropped field, nor the key, went to Snowflake.
    assert not suite.leaks(sent, suite.raw_values(people))
    assert not suite.leaks(sent, {suite.KEY_TEXT})


@pytest.mark.parametrize("action", ["hash", "drop"])
def test_a_display_name_and_an_attribute_path_are_hashed_or_dropped_like_any_field(
        pii, run_dag, caplog, capsys, sent, action) -> None:  # noqa: F811
    suite.test_a_display_name_and_an_attribute_path_are_hashed_or_dropped_like_any_field(
        pii, run_dag, caplog, capsys, action)
    people = [r.record for r in expected_final(suite.SCENARIO, 1).records]
    assert _staging(sent)
    assert not suite.leaks(sent, {p["display_name"] for p in people if p["display_name"]})


def test_a_source_errors_own_words_are_not_stored_logged_or_returned(
        pii, run_dag, caplog, capsys) -> None:  # noqa: F811
    suite.test_a_source_errors_own_words_are_not_stored_logged_or_returned(pii, run_dag, caplog, capsys)


def test_every_test_of_the_suite_runs_here() -> None:
    assert {name for name in dir(suite) if name.startswith("test_")} <= set(globals())


def test_change_detection_sees_what_is_stored(pii, run_dag) -> None:  # noqa: F811
    suite.test_change_detection_sees_what_is_stored(pii, run_dag)


@pytest.mark.parametrize("other", [
    {"BOS_TEST_PII_KEY_CONN": "bos_pii_key_other"},
    {"BOS_TEST_PII_POLICY": json.dumps({**suite.POLICY, "display_name": "hash"})},
    {"BOS_TEST_PII_POLICY": "null"},
], ids=["another-key", "another-policy", "no-policy"])
def test_a_run_under_another_key_or_policy_fails_before_its_read(
        pii, run_dag, other: dict[str, str]) -> None:  # noqa: F811
    suite.test_a_run_under_another_key_or_policy_fails_before_its_read(pii, run_dag, other)


def test_quarantined_records_are_stored_under_the_policy_too(pii, run_dag, caplog, capsys, sent) -> None:  # noqa: F811
    suite.test_quarantined_records_are_stored_under_the_policy_too(pii, run_dag, caplog, capsys)
    raw = suite.raw_values(r.record for r in expected_final(suite.unstorable_scenario(pii), 1).records)
    assert _staging(sent)
    assert not suite.leaks(sent, raw)


def test_erase_by_the_raw_email_phone_and_external_id_a_request_names(pii, run_dag, commands) -> None:  # noqa: F811
    """The suite's test; and as the table hashes each field named, only their hashes reach Snowflake."""
    suite.test_erase_by_the_raw_email_phone_and_external_id_a_request_names(pii, run_dag)
    erasures = [(args, statements) for args, statements in commands if args[0] == "erase"]
    assert len(erasures) == 2
    for args, statements in erasures:
        email = args[args.index("--email") + 1]
        assert suite.leaks(statements, {hash_value(pii["key"], "email", email)}), "the lookup by its hash was seen"
        assert not suite.leaks(statements, _named(args))
        assert not suite.leaks(statements, {suite.KEY_TEXT})


def test_records_quarantined_without_a_policy_are_erased_by_value_and_keep_a_policy_out(
        pii, run_dag) -> None:  # noqa: F811
    suite.test_records_quarantined_without_a_policy_are_erased_by_value_and_keep_a_policy_out(pii, run_dag)


def test_pii_apply_brings_a_table_synced_without_a_policy_under_it(pii, run_dag, commands) -> None:  # noqa: F811
    """The suite's test; and ``pii-apply`` sends Snowflake the new values, never the raw ones it replaces."""
    suite.test_pii_apply_brings_a_table_synced_without_a_policy_under_it(pii, run_dag)
    [(args, statements)] = commands
    assert args[0] == "pii-apply"
    people = [r.record for r in expected_final(suite.SCENARIO, 1).records]
    person = next(p for p in people if p["email"])
    updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE")]
    assert suite.leaks(updates, {hash_value(pii["key"], "email", person["email"])}), "the rewrite was seen"
    assert not suite.leaks(statements, suite.raw_values(people))
    assert not suite.leaks(statements, {suite.KEY_TEXT})


def test_a_policy_that_only_drops_skips_unchanged_records_when_a_key_is_configured(
        pii, run_dag, monkeypatch) -> None:  # noqa: F811
    suite.test_a_policy_that_only_drops_skips_unchanged_records_when_a_key_is_configured(pii, run_dag, monkeypatch)

