"""The venvs of the older supported Airflows (3.1, 3.2) differ from the project venv only in Airflow and
what Airflow pins, and the writer's tests reach none of it.

CI runs the fast tier on Airflow 3.1 too (.ci/run), but for ``tests/warehouse`` and ``tests/model``
(the writer and the model of its tables), which need never run there: nothing they import, directly or
through the package, imports Airflow or its web stack, and every library they use is pinned to the
same version in both files, so on 3.1 they would run the same code on the same libraries again.
One exception, said here: some of them read from the reference server (``airflow_provider_bos.testing``,
on Starlette, whose version differs) as their BOS; on 3.1 the end-to-end tests CI runs there read
from that server too. Imports are read from the source with ``ast`` (inside functions too).
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

from tests.repo.source_imports import imports

ROOT = Path(__file__).resolve().parents[2]
#: What Airflow 3.1 needs at other versions than .ci/constraints.txt pins (the header of
#: .ci/constraints-airflow-3.1.txt says why each).
AIRFLOW_STACK = frozenset({
    "apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk", "aiosqlite", "alembic", "cadwyn",
    "fastapi", "sse-starlette", "starlette", "universal-pathlib",
})
#: What Airflow 3.2 needs at other versions than .ci/constraints.txt pins (the header of
#: .ci/constraints-airflow-3.2.txt says why each).
AIRFLOW_32_STACK = frozenset({"apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk", "aiosqlite", "svcs"})
#: What only Airflow 3.1 itself requires.
ONLY_AIRFLOW_31 = frozenset({"sqlalchemy-jsonfield", "sqlalchemy-utils"})
#: The directories that need not run again on Airflow 3.1.
NOT_RUN_AGAIN = ("tests/warehouse", "tests/model")
#: The reference server, whose Starlette those tests may reach (see above).
REFERENCE_SERVER = ROOT / "airflow_provider_bos" / "testing"


def _pins(name: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for text in (ROOT / ".ci" / name).read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if line:
            package, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", package).lower()] = version
    return pins


def _differing(newest: dict[str, str], other: dict[str, str]) -> set[str]:
    """The distributions both pin sets name at different versions."""
    return {name for name in set(newest) & set(other) if newest[name] != other[name]}


def test_the_oldest_airflows_pins_differ_only_in_airflows_stack() -> None:
    newest, oldest = _pins("constraints.txt"), _pins("constraints-airflow-3.1.txt")
    assert oldest["apache-airflow"].startswith("3.1.")
    differing = _differing(newest, oldest)
    assert differing <= AIRFLOW_STACK, sorted(differing - AIRFLOW_STACK)
    assert set(oldest) - set(newest) <= ONLY_AIRFLOW_31, sorted(set(oldest) - set(newest) - ONLY_AIRFLOW_31)


def test_airflow_32s_pins_differ_only_in_airflow_and_keep_an_svcs_its_dag_test_runs_with() -> None:
    newest, pins = _pins("constraints.txt"), _pins("constraints-airflow-3.2.txt")
    assert pins["apache-airflow"].startswith("3.2.")
    differing = _differing(newest, pins)
    assert differing <= AIRFLOW_32_STACK, sorted(differing - AIRFLOW_32_STACK)
    assert set(pins) <= set(newest), sorted(set(pins) - set(newest))
    # svcs 26.2 closes Airflow 3.2's in-process Execution API at once: every task of a dag.test() fails.
    assert Version(pins["svcs"]) < Version("26.2")


#: The top-level modules of what differs between the two pin sets.
STACK_MODULES = frozenset({"airflow", "fastapi", "starlette", "sse_starlette", "cadwyn", "alembic", "aiosqlite",
                           "upath"})
#: Our own modules, read as source: the package and the tests' helpers.
OURS = ("airflow_provider_bos", "tests", "bench")


def _source(module: str) -> Path | None:
    """The file of one of our modules (None: a third-party module, or a name inside a module)."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_the_tests_not_run_again_on_the_oldest_airflow_reach_none_of_its_stack() -> None:
    start = [path for folder in NOT_RUN_AGAIN for path in (ROOT / folder).rglob("*.py")]
    seen: dict[Path, Path | None] = dict.fromkeys(start)  # each file: the file that imported it
    queue = list(start)
    reaching: list[str] = []
    while queue:
        path = queue.pop()
        for module in sorted(imports(path)):
            if module.split(".")[0] == "starlette" and path.is_relative_to(REFERENCE_SERVER):
                continue
            if module.split(".")[0] in STACK_MODULES:
                chain, at = [], path
                while at is not None:
                    chain.append(str(at.relative_to(ROOT)))
                    at = seen[at]
                reaching.append(f"{module} from {' <- '.join(chain)}")
                continue
            if module.split(".")[0] not in OURS:
                continue
            # Each package on the way is imported too (its __init__).
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                source = _source(".".join(parts[:depth]))
                if source is not None and source not in seen:
                    seen[source] = path
                    queue.append(source)
    assert reaching == []
    # Nor do they take the fixtures that set up Airflow.
    assert [str(p.relative_to(ROOT)) for p in start if re.search(r"\b(airflow_db|run_dag)\b", p.read_text())] == []


def test_ci_leaves_out_on_the_oldest_airflow_exactly_the_tests_not_run_again() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    (listed,) = re.findall(r"^OLDEST_AIRFLOW_NOT_RUN_AGAIN=\((.*)\)$", run, flags=re.MULTILINE)
    assert sorted(listed.split()) == sorted(f"--ignore={folder}" for folder in NOT_RUN_AGAIN)
    ran = r'^(BOS_TEST_WORKERS=\d+ )?oldest_airflow_env run_tests "\$\{OLDEST_AIRFLOW_NOT_RUN_AGAIN\[@\]\}"$'
    assert re.search(ran, run, flags=re.MULTILINE)
