"""Every SQL and Python example of docs/analytics.md and docs/personal-data.md, run on the demo's tables.

The demo (``bash .ci/demo``, airflow_provider_bos/demo.py) runs the ``bos_sync_people_daily`` DAG on
day 1 and day 2 of the reference server's ``people_over_time`` scenario into SQLite; the ``demo``
fixture does the same with dag.test() (with a fixed personal-data key where the demo makes a random
one). Each fenced ``sql`` and ``python`` block of the pages runs here, unless an HTML comment right
before it says why not (``<!-- not run: the reason -->``).

A SQL block runs on the demo's SQLite tables and must return a row. After it, the page may show its
answer: ``<!-- result -->`` and a table (every row, ``NULL`` for a null), or ``<!-- result: N rows -->``
and, if any, a table of the first rows. A block that needs more (bind parameters, PostgreSQL, names
to run in, a DAG around it) has a runner in ``RUNNERS``, found by a snippet of its text; a Python
block without one fails the test.
"""

from __future__ import annotations

import copy
import json
import re
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import task_states

from airflow_provider_bos.pii import PiiKey, PiiPolicy, lookup_hash
from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("analytics.md", "personal-data.md")
SCENARIO, DAYS = "people_over_time", (1, 2)
KEY_TEXT = "7BPEKwBLkpihUNv2EkZuPmIKg2RLc6khJSFsNKB1w5Y"


# --- the pages' blocks ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Shown:
    """The answer a page shows after a block: its row count and (the first of) its rows."""

    total: int | None  # None: the table is every row
    rows: list[tuple[str, ...]]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str
    not_run: str | None  # the reason, when the page marks the block as not run
    shown: Shown | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language})"


_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:(.*?)-->$")
_RESULT = re.compile(r"^<!--\s*result(?::\s*(\d+) rows?)?\s*-->$")


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip().strip("`") for cell in line.strip().strip("|").split("|"))


def _shown(lines: list[str], start: int) -> Shown | None:
    """The ``<!-- result -->`` after the block ending before ``start``, up to the next block or heading."""
    for i in range(start, len(lines)):
        if lines[i].startswith(("```", "#")):
            return None
        marker = _RESULT.match(lines[i].strip())
        if marker is None:
            continue
        table = []
        for line in lines[i + 1:]:
            if not line.strip() and not table:
                continue
            if not line.startswith("|"):
                break
            table.append(line)
        rows = [_cells(line) for line in table[2:]]  # past the header and its separator
        return Shown(total=int(marker.group(1)) if marker.group(1) else None, rows=rows)
    return None


def page_blocks(page: str) -> list[Block]:
    """Each fenced ``sql`` and ``python`` block of a page of docs/."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) in ("sql", "python"):
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            not_run = _NOT_RUN.match(before)
            blocks.append(Block(page, i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n",
                                not_run.group(1).strip() if not_run else None, _shown(lines, end + 1)))
        i = end + 1
    return blocks


def every_block() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


# --- the demo's tables ---------------------------------------------------------------------------

@pytest.fixture()
def demo(bos_airflow: dict[str, Any], run_dag: Callable[..., Any], airflow_db: Path,
         monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The demo's tables: ``bos_sync_people_daily`` run on each day of ``people_over_time`` into SQLite."""
    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY_TEXT}))
    server = bos_airflow["server"]
    server.set_scenario(load_scenario(SCENARIO))
    for day in DAYS:
        server.set_day(day)
        dag_run = run_dag("bos_sync_people_daily", filename="bos_sync_people_daily.py")
        assert task_states(dag_run) == {"sync_people": "success", "check_completeness": "success",
                                        "count_people": "success"}, f"day {day}"
    return {**bos_airflow, "key": PiiKey.from_text(KEY_TEXT, source="the test"), "run_dag": run_dag,
            "dags": airflow_db}


def ask(demo: dict[str, Any], sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (the driver's own text: no SQLAlchemy bind syntax) on the demo's SQLite tables."""
    with demo["engine"].connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(sql, params)]


def demo_person() -> dict[str, Any]:
    """A current person of the demo's data as BOS returns it (raw): the first, by ref, whom HR knows."""
    records = sorted((r.record for r in expected_final(SCENARIO, DAYS[-1]).records), key=lambda r: r["record_ref"])
    return copy.deepcopy(next(r for r in records if r["email"] and r["phone"]
                              and any(e["source_type"] == "hr" for e in r["sources"])))


def current_ref_with_email(demo: dict[str, Any], stored_email: str) -> list[tuple[Any, ...]]:
    return ask(demo, "SELECT record_ref FROM bos_people_daily WHERE email = ? AND _bos_deleted_at IS NULL",
               (stored_email,))


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)


def check_shown(block: Block, rows: list[tuple[Any, ...]]) -> None:
    assert rows, f"{block} returns no row on the demo's tables"
    if block.shown is None:
        return
    got = [tuple(_text(v) for v in row) for row in rows]
    if block.shown.total is None:
        assert got == block.shown.rows, f"{block}: the page shows another answer than the demo's tables give"
        return
    assert len(got) == block.shown.total, f"{block}: the page says {block.shown.total} rows, the query gives {len(got)}"
    assert got[:len(block.shown.rows)] == block.shown.rows, f"{block}: the first rows the page shows differ"


# --- how each block runs -------------------------------------------------------------------------

def run_sql(block: Block, demo: dict[str, Any]) -> None:
    """A SQL block as it is: on the demo's SQLite tables, compared with the answer the page shows."""
    rows = ask(demo, block.text)
    check_shown(block, rows)
    if "s.external_id = '" in block.text and "AND s.is_current" in block.text:
        # The page says why the look-up asks for current entries: the entry of a record merged into
        # the person stays, not current; without the condition the query returns that record too.
        [(ref, _name)] = rows
        others = [row[0] for row in ask(demo, block.text.replace("AND s.is_current", "")) if row[0] != ref]
        merged_into_it = ask(demo, "SELECT record_ref FROM bos_people_daily WHERE _bos_superseded_by = ?", (ref,))
        assert len(others) == 1 and (others[0],) in merged_into_it, f"{block}: not the merge the page describes"


def run_policy(block: Block, demo: dict[str, Any]) -> None:
    """The policy mapping: valid, and applied to a demo person it stores what the page says."""
    names: dict[str, Any] = {}
    exec(block.text, names)  # noqa: S102 - the page's own example
    policy = PiiPolicy.parse(names["pii_policy"])
    key, raw = demo["key"], demo_person()
    stored = policy.plan(key).apply(copy.deepcopy(raw))
    assert stored["display_name"] is None
    assert stored["email"] == lookup_hash(key, "email", raw["email"])
    assert stored["phone"] == lookup_hash(key, "phone", raw["phone"])
    assert [e["external_id"] for e in stored["sources"]] == [
        lookup_hash(key, "sources[].external_id", e["external_id"]) for e in raw["sources"]]
    # "drops everything under employment but type"
    assert stored["attributes"]["employment"] == {"type": raw["attributes"]["employment"]["type"]}
    assert {k: v for k, v in stored["attributes"].items() if k != "employment"} == {
        k: v for k, v in raw["attributes"].items() if k != "employment"}


def run_star_policy(block: Block, demo: dict[str, Any]) -> None:
    """The allow-list form: every field hashed but the two the page keeps, which are stored as sent."""
    names: dict[str, Any] = {}
    exec(block.text, names)  # noqa: S102 - the page's own example
    key, raw = demo["key"], demo_person()
    stored = PiiPolicy.parse(names["pii_policy"]).plan(key).apply(copy.deepcopy(raw))
    assert stored["lifecycle"] == raw["lifecycle"]
    assert stored["email"] == lookup_hash(key, "email", raw["email"])
    assert stored["display_name"] == lookup_hash(key, "display_name", raw["display_name"])
    assert [e["external_id"] for e in stored["sources"]] == [
        lookup_hash(key, "sources[].external_id", e["external_id"]) for e in raw["sources"]]
    employment = stored["attributes"]["employment"]
    assert employment["type"] == raw["attributes"]["employment"]["type"]
    assert all(v != raw["attributes"]["employment"][k] for k, v in employment.items() if k != "type")


def run_email_hash(block: Block, demo: dict[str, Any]) -> None:
    """The Python recipe: the hash of a demo person's email finds them in the demo's table."""
    names: dict[str, Any] = {}
    exec(block.text, names)  # noqa: S102 - the page's own example
    person = demo_person()
    stored = names["email_hash"](KEY_TEXT, person["email"])
    assert current_ref_with_email(demo, stored) == [(person["record_ref"],)]


def run_operator(block: Block, demo: dict[str, Any]) -> None:
    """The operator call, in a DAG of its own, run with dag.test() against the demo's server."""
    dag_id = f"bos_docs_example_{uuid.uuid4().hex[:8]}"
    dag_file = demo["dags"] / f"{dag_id}.py"
    dag_file.write_text(
        "from datetime import UTC, datetime\n\n"
        "from airflow.sdk import DAG\n\n"
        "from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator\n\n"
        f"with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):\n"
        + textwrap.indent(block.text, "    "), encoding="utf-8")
    try:
        dag_run = demo["run_dag"](dag_id, filename=dag_file.name)
    finally:
        dag_file.unlink()
    assert task_states(dag_run) == {"sync_people": "success"}
    person = demo_person()
    rows = ask(demo, "SELECT email, attributes FROM bos_people WHERE record_ref = ?", (person["record_ref"],))
    assert rows, "the operator example stored no row for a person of the demo"
    [(email, attributes)] = rows
    assert email == lookup_hash(demo["key"], "email", person["email"])
    assert "employment" not in json.loads(attributes)
    assert ask(demo, "SELECT COUNT(*) FROM bos_people") == [(len(expected_final(SCENARIO, DAYS[-1]).refs),)]


def run_postgresql_recipe(block: Block, demo: dict[str, Any], postgres_url: str) -> None:
    """The PostgreSQL recipe (pgcrypto): the hash it gives a demo person's email finds them."""
    engine = sa.create_engine(postgres_url)
    person = demo_person()
    try:
        with engine.connect() as conn:
            if conn.exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'pgcrypto'").first() is None:
                pytest.skip("pgcrypto is not available on this PostgreSQL server")
            # Created inside the transaction that is rolled back: the test database is left as it was.
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pgcrypto")
            rows = conn.execute(sa.text(block.text), {"email": person["email"], "key_text": KEY_TEXT}).all()
            conn.rollback()
    finally:
        engine.dispose()
    assert len(rows) == 1
    assert current_ref_with_email(demo, rows[0][0]) == [(person["record_ref"],)]


@dataclass(frozen=True)
class Runner:
    snippet: str  # the block whose text holds it
    run: Callable[..., None]
    database: str = "sqlite"  # "postgres": run by the PostgreSQL test


RUNNERS = (
    Runner('"display_name": "drop",', run_policy),
    Runner('"*": "hash",', run_star_policy),
    Runner("def email_hash(", run_email_hash),
    Runner("BosFederatedReadOperator(", run_operator),
    Runner("hmac(convert_to(", run_postgresql_recipe, database="postgres"),
)


def runner_of(block: Block) -> Runner:
    matches = [r for r in RUNNERS if r.snippet in block.text]
    assert len(matches) <= 1, f"{block}: more than one runner matches it"
    if matches:
        return matches[0]
    assert block.language == "sql", (
        f"{block} is not run: give it a runner in {Path(__file__).name} or mark it "
        "<!-- not run: the reason --> right before it")
    assert ":" not in re.sub(r"'[^']*'", "", block.text), f"{block} has bind parameters: give it a runner"
    return Runner("", run_sql)


def blocks_run_on(database: str) -> list[Block]:
    return [b for b in every_block() if b.not_run is None and runner_of(b).database == database]


# --- the tests -----------------------------------------------------------------------------------

def test_every_sql_and_python_block_of_the_pages_is_run_or_says_why_not() -> None:
    blocks = every_block()
    assert {b.page for b in blocks} == set(PAGES)
    for block in blocks:
        if block.not_run is not None:
            assert len(block.not_run.split()) >= 3, f"{block}: <!-- not run: ... --> must say why"
            continue
        runner_of(block)
        if block.shown is not None:
            assert block.language == "sql", f"{block}: only a SQL block's answer is compared"
            assert block.shown.total is not None or block.shown.rows, f"{block}: <!-- result --> without a table"
    for runner in RUNNERS:  # none left over from an example that is gone
        assert sum(runner.snippet in b.text for b in blocks if b.not_run is None) == 1, runner.snippet


def run_all(blocks: list[Block], *args: Any) -> None:
    """Run each block; fail naming every block that failed, not only the first."""
    assert blocks
    failures = []
    for block in blocks:
        try:
            runner_of(block).run(block, *args)
        except AssertionError as error:
            message = str(error)
            failures.append(message if message.startswith(str(block)) else f"{block}: {message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_answer_on_the_demos_tables(page: str, demo: dict[str, Any]) -> None:
    run_all([b for b in blocks_run_on("sqlite") if b.page == page], demo)


@pytest.mark.postgres
def test_the_postgresql_examples_answer_on_the_demos_tables(demo: dict[str, Any], postgres_url: str) -> None:
    run_all(blocks_run_on("postgres"), demo, postgres_url)
