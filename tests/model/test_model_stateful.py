"""The writer held to a model of its tables, step after step (docs/development.md, "The model of the tables").

A Hypothesis ``RuleBasedStateMachine`` (:mod:`tests.model.machine`) drives days of full, partial and
incremental reads (people join, change, leave, come back, merge and split; every entry re-stamped
each day), erasures by ref, email, phone and external id, and pii-apply of a stricter policy, through
the real run side and writer; after every step every table is compared with
:class:`~tests.model.model.TablesModel`, which shares no code with the writer.

Tiers: the fast tier runs SQLite (``bos-model`` profile: 15 examples of up to 8 steps); the full tier
runs SQLite, PostgreSQL, MariaDB and DuckDB with ``bos-model-full`` (8 examples of up to 8 steps).
Examples are derandomized: every run draws the same ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import (
    BASIC,
    LADDER,
    STRICT,
    Destination,
    Observed,
    machine_for,
    strict_rules_missing,
)

#: The personal-data policy a table starts with, and what pii-apply moves it to (``None``: no policy;
#: pii-apply then walks it up to hashing email, phone, display_name, attributes and external ids, and
#: dropping display_name and phone).
POLICIES = {"no-policy": (None, LADDER), "hashed": (BASIC, LADDER[2:])}


@pytest.mark.timeout(900)  # a failure is shrunk before it is reported: minutes
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_tables_follow_the_model(sqlite_url: str, tmp_path: Path, observed: Observed, policy: str) -> None:
    """Fast tier: SQLite. With a policy (from the start, or from the first pii-apply) no raw value of
    a field it hashes or drops is in any table, staged file or log line."""
    start, ladder = POLICIES[policy]
    machine = machine_for(Destination(sqlite_url, tmp_path), start_policy=start, ladder=ladder, observed=observed)
    run_state_machine_as_test(machine, settings=settings.get_profile("bos-model"))


@pytest.mark.full
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_tables_follow_the_model_at_length(warehouse_url: str, tmp_path: Path, observed: Observed,
                                               policy: str) -> None:
    """Full tier: every dialect, more and longer examples."""
    start, ladder = POLICIES[policy]
    machine = machine_for(Destination(warehouse_url, tmp_path), start_policy=start, ladder=ladder, observed=observed)
    run_state_machine_as_test(machine, settings=settings.get_profile("bos-model-full"))


#: ``{"*": "hash"}`` from the first run, and reached by pii-apply (through the policy above).
STRICT_POLICIES = {"strict": (STRICT, (STRICT,)), "strict-by-pii-apply": (None, (None, BASIC, STRICT))}


def _strict_machine(url: str, tmp_path: Path, observed: Observed, policy: str) -> type:
    missing = strict_rules_missing()
    if missing is not None:
        pytest.skip(f"the personal-data policy has no {missing!r} rule yet (PiiPolicy.parse refuses it): the "
                    f"check of lifecycle, identity_match and the entries' extra keys waits for it")
    start, ladder = STRICT_POLICIES[policy]
    return machine_for(Destination(url, tmp_path), start_policy=start, ladder=ladder, observed=observed)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", sorted(STRICT_POLICIES))
def test_nothing_raw_under_a_policy_that_hashes_every_field(sqlite_url: str, tmp_path: Path, observed: Observed,
                                                            policy: str) -> None:
    """``{"*": "hash"}``: every field hashed, lifecycle, identity_match and the entries' extra keys
    included (object keys stay, values only): no raw value anywhere. Fast tier: SQLite."""
    machine = _strict_machine(sqlite_url, tmp_path, observed, policy)
    run_state_machine_as_test(machine, settings=settings.get_profile("bos-model"))


@pytest.mark.full
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("policy", sorted(STRICT_POLICIES))
def test_nothing_raw_under_a_policy_that_hashes_every_field_at_length(warehouse_url: str, tmp_path: Path,
                                                                      observed: Observed, policy: str) -> None:
    """Full tier: every dialect (DuckDB's staged files among what is searched), more and longer examples."""
    machine = _strict_machine(warehouse_url, tmp_path, observed, policy)
    run_state_machine_as_test(machine, settings=settings.get_profile("bos-model-full"))
