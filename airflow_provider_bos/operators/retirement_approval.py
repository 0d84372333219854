"""A person approves or rejects the retirements a full read held (``on_retire_guard="ask"``).

Built on Airflow's Human-in-the-loop operators (Airflow 3.1+): :class:`BosRetirementApprovalOperator`
is an ``ApprovalOperator`` whose subject and body say what the read held (how many rows, which
share of the scope, per source, a sample of refs: never a person's values), and
:class:`BosRetirementDecisionOperator` then applies the answer: Approve retires the held rows unless
a newer read wrote the table since (it then retires nothing and says which run decided instead);
Reject retires nothing; both leave an audit row. :func:`retirement_approval` wires the two after
the read, in a task group. When the read held nothing, both are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

# The skip exception moved between Airflow 3 releases; the compat layer the HITL operators use finds it.
from airflow.providers.common.compat.sdk import AirflowSkipException
from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk import BaseOperator, TaskGroup

from airflow_provider_bos.exceptions import BosConfigurationError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

__all__ = ["BosRetirementApprovalOperator", "BosRetirementDecisionOperator", "held_body", "retirement_approval"]

# What a ref or a source name may show in the body as it is: anything else is replaced, so a value
# from BOS cannot write Markdown (links, images) into the page a person decides on.
_UNSAFE = re.compile(r"[^A-Za-z0-9:._@/+=-]")
_SHOWN = 80


def _shown(text: Any) -> str:
    value = _UNSAFE.sub("?", str(text))
    return value if len(value) <= _SHOWN else value[: _SHOWN - 1] + "…"


def held_body(held: Mapping[str, Any]) -> str:
    """The Markdown a person decides on: what the read held, per source, a sample of refs, what each answer does."""
    where = f"{held['schema']}.{held['table']}" if held.get("schema") else str(held["table"])
    deletion = "deleted" if held.get("deletions") == "hard" else "marked retired (`_bos_deleted_at` set)"
    share = f"{held['share']:.0%}"
    summary = (f"A complete full read of **{_shown(where)}** (BOS run `{_shown(held['run_id'])}`, read at "
               f"{_shown(held['read_at'])}) did not return **{held['held']}** of its scope's "
               f"**{held['scope_rows']}** current rows (**{share}**, more than max_retire_fraction="
               f"{held.get('max_retire_fraction')}). They are held, still current.")
    answers = (f"**Approve**: the held rows are {deletion}, unless a newer read wrote the table since (then "
               "nothing is retired and the decision task says which run decided instead). **Reject**: nothing "
               "is retired; the next complete full read decides again. Either way the audit table records the "
               "decision.")
    sample = ", ".join(f"`{_shown(ref)}`" for ref in held["sample_refs"])
    lines = [
        summary,
        "",
        "| source | rows held |",
        "|---|---|",
        *(f"| {_shown(source)} | {count} |" for source, count in held["per_source"].items()),
        "",
        f"Sample of the refs held ({len(held['sample_refs'])} of {held['held']}): {sample}",
        "",
        answers,
    ]
    return "\n".join(lines)


def _held_of(context: Context, sync_task_id: str) -> dict[str, Any] | None:
    summary = context["ti"].xcom_pull(task_ids=sync_task_id)
    if not isinstance(summary, Mapping):
        raise BosConfigurationError(f"Task {sync_task_id!r} returned no BOS sync summary; point sync_task_id at "
                                    "the BosFederatedReadOperator whose retirements are to be decided.")
    held = summary.get("pending_retirements")
    return dict(held) if isinstance(held, Mapping) else None


class BosRetirementApprovalOperator(ApprovalOperator):
    """Ask a person whether to retire what ``sync_task_id`` held (Approve / Reject).

    Skipped when the read held nothing. Unlike a plain ``ApprovalOperator``, Reject does not skip
    the task after it: the decision task records the rejection in the audit table.
    """

    def __init__(self, *, sync_task_id: str, subject: str = "Retire the rows a BOS full read did not return?",
                 **kwargs: Any) -> None:
        super().__init__(subject=subject, **kwargs)
        self.sync_task_id = sync_task_id

    def execute(self, context: Context) -> Any:
        held = _held_of(context, self.sync_task_id)
        if held is None:
            raise AirflowSkipException(f"{self.sync_task_id} held no retirements: nothing to decide.")
        self.subject = f"Retire {held['held']} of {held['scope_rows']} rows of {_shown(held['table'])}?"
        self.body = held_body(held)
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        # The answer only (validated, recorded): both answers go on to the decision task.
        return HITLOperator.execute_complete(self, context, event)


class BosRetirementDecisionOperator(BaseOperator):
    """Apply the answer of ``approval_task_id`` to what ``sync_task_id`` held; the decision in XCom.

    :param destination_conn_id: the read's warehouse connection.
    :param lock_timeout: how long to wait for a running sync of the table (the writers' lock).
    """

    ui_color = "#fdf3e1"

    def __init__(self, *, destination_conn_id: str, sync_task_id: str, approval_task_id: str,
                 lock_timeout: timedelta = timedelta(minutes=5), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.destination_conn_id = destination_conn_id
        self.sync_task_id = sync_task_id
        self.approval_task_id = approval_task_id
        self.lock_timeout = lock_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_bos.hooks.connections import engine_for_connection
        from airflow_provider_bos.warehouse.upkeep.retirements import (
            apply_held_retirements,
            reject_held_retirements,
        )

        held = _held_of(context, self.sync_task_id)
        if held is None:
            raise AirflowSkipException(f"{self.sync_task_id} held no retirements: nothing to decide.")
        answer = context["ti"].xcom_pull(task_ids=self.approval_task_id)
        chosen = list(answer.get("chosen_options") or []) if isinstance(answer, Mapping) else []
        if chosen not in ([ApprovalOperator.APPROVE], [ApprovalOperator.REJECT]):
            raise BosConfigurationError(f"Task {self.approval_task_id!r} gave no Approve/Reject answer ({chosen!r}); "
                                        "nothing was retired.")
        user = answer.get("responded_by_user") if isinstance(answer, Mapping) else None
        decided_by = str(user.get("id") or user.get("name")) if isinstance(user, Mapping) else None
        where = {"table": held["table"], "schema": held.get("schema"), "audit_table": held["audit_table"],
                 "run_id": held["run_id"], "decided_by": decided_by,
                 "lock_timeout_s": self.lock_timeout.total_seconds()}
        engine = engine_for_connection(self.destination_conn_id)
        try:
            if chosen == [ApprovalOperator.APPROVE]:
                decision = apply_held_retirements(engine, deletions=held.get("deletions", "soft"),
                                                  history=bool(held.get("history")), **where)
            else:
                decision = reject_held_retirements(engine, **where)
        finally:
            engine.dispose()
        (self.log.warning if decision.outcome == "overtaken" else self.log.info)(
            "BOS retirement decision on run %s: %s", decision.run_id, decision.note)
        return decision.as_dict()


def retirement_approval(
    sync: BosFederatedReadOperator, *, group_id: str = "retirement_approval",
    response_timeout: timedelta | None = timedelta(days=1), assigned_users: Sequence[Mapping[str, str]] | None = None,
    notifiers: Any = None, **approval_kwargs: Any,
) -> TaskGroup:
    """After ``sync`` (``on_retire_guard="ask"``): ask a person, then apply the answer.

    A task group of ``ask`` (:class:`BosRetirementApprovalOperator`; ``response_timeout``,
    ``assigned_users``, ``notifiers`` and other ``approval_kwargs`` are the HITL operator's) and
    ``decide`` (:class:`BosRetirementDecisionOperator`), downstream of ``sync``. Without an answer
    in time ``ask`` fails and nothing is retired: the held rows wait for the next read.
    """
    if getattr(sync, "on_retire_guard", None) != "ask":
        raise BosConfigurationError(f"Task {sync.task_id!r} must be a BosFederatedReadOperator with "
                                    "on_retire_guard='ask' (only then does it hold retirements to decide).")
    with TaskGroup(group_id=group_id) as group:
        ask = BosRetirementApprovalOperator(
            task_id="ask", sync_task_id=sync.task_id, response_timeout=response_timeout,
            assigned_users=list(assigned_users) if assigned_users else None, notifiers=notifiers, **approval_kwargs,
        )
        decide = BosRetirementDecisionOperator(
            task_id="decide", destination_conn_id=sync.destination_conn_id, sync_task_id=sync.task_id,
            approval_task_id=ask.task_id,
        )
        ask >> decide
    sync >> group
    return group
