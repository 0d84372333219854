"""How a read is addressed: the one ``via`` check and the one context rule (hook and session share them)."""

from __future__ import annotations

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.mcp.reads import check_via, resolve_context_handle
from airflow_provider_bos.models import BosContext


def contexts(*specs: tuple[str, bool]) -> list[BosContext]:
    return [BosContext(context_handle=handle, is_default=default) for handle, default in specs]


def never() -> list[BosContext]:
    raise AssertionError("the contexts were listed although a handle was given")


@pytest.mark.parametrize("via", ["auto", "direct", "execute"])
def test_the_three_vias_pass(via: str) -> None:
    assert check_via(via) == via


@pytest.mark.parametrize("via", ["Direct", "", "bos_execute", "exec"])
def test_any_other_via_is_a_configuration_error_naming_the_choices(via: str) -> None:
    with pytest.raises(BosConfigurationError, match="via must be 'auto', 'direct' or 'execute'"):
        check_via(via)


def test_a_given_handle_wins_in_order_without_listing_contexts() -> None:
    assert resolve_context_handle("explicit", "configured", contexts=never) == "explicit"
    assert resolve_context_handle(None, "configured", contexts=never) == "configured"
    assert resolve_context_handle("", "configured", contexts=never) == "configured"


def test_without_a_handle_the_context_bos_marks_default_is_chosen() -> None:
    listed = contexts(("a", False), ("b", True), ("c", False))
    assert resolve_context_handle(None, None, contexts=lambda: listed) == "b"


def test_a_single_authorized_context_is_chosen_even_unmarked() -> None:
    assert resolve_context_handle(None, contexts=lambda: contexts(("only", False))) == "only"


@pytest.mark.parametrize("listed", [[], [("a", False), ("b", False)]])
def test_no_default_among_several_is_a_configuration_error(listed: list[tuple[str, bool]]) -> None:
    with pytest.raises(BosConfigurationError, match=f"none of {len(listed)} authorized contexts"):
        resolve_context_handle(None, None, contexts=lambda: contexts(*listed))
