"""Airflow names the tests use that moved between the supported releases (3.1 to 3.3).

The package's own moved names are in airflow_provider_bos/airflow_compat.py; these are the ones only
the tests need (parsing DAG files as the DAG processor does). Import this module inside a test or
fixture, after tests/conftest.py has set AIRFLOW_HOME.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
else:
    try:
        from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import BundleDagBag, DagBag, sync_bag_to_db

__all__ = ["BundleDagBag", "DagBag", "bundle_dag_bag", "dag_test_hears_hitl_answers", "deadline_callback_trigger",
           "forget_fernet", "stored_deadline_alerts", "sync_bag_to_db"]


def forget_fernet() -> None:
    """Make Airflow's next ``get_fernet()`` read ``[core] fernet_key`` again (it keeps the first one)."""
    from airflow.models import crypto

    if hasattr(crypto.get_fernet, "cache_clear"):
        crypto.get_fernet.cache_clear()
    else:  # Airflow 3.1 keeps it in a module variable
        crypto._fernet = None  # type: ignore[attr-defined]


def bundle_dag_bag(dag_file: Path, bundle_path: Path, bundle_name: str) -> BundleDagBag:
    """The DAGs of one file of a bundle, parsed as the DAG processor does."""
    from airflow_provider_bos.airflow_compat import airflow_version

    # Airflow 3.1's DagBag takes no bundle name (sync_bag_to_db alone is told it).
    named = {"bundle_name": bundle_name} if airflow_version() >= (3, 2) else {}
    return BundleDagBag(dag_folder=str(dag_file), bundle_path=bundle_path, **named)


@contextmanager
def dag_test_hears_hitl_answers() -> Iterator[None]:
    """Let ``dag.test()`` on Airflow 3.1 see a Human-in-the-loop answer given through the API.

    On Airflow 3.3 a waiting HITL task is parked in ``awaiting_input`` and ``dag.test()`` resumes it
    once an answer is recorded (apache/airflow#68492). Airflow 3.1 defers it to ``HITLTrigger`` and
    runs that trigger in-process, through a test supervisor that has no answer for the trigger's
    ``GetHITLDetailResponse`` request (the triggerer of a deployment answers it:
    ``airflow.jobs.triggerer_job_runner``). Here the test supervisor answers it as the triggerer
    does; nothing of the provider is changed.
    """
    from airflow.utils.state import TaskInstanceState

    if hasattr(TaskInstanceState, "AWAITING_INPUT"):
        yield
        return
    from airflow.jobs.triggerer_job_runner import HITLDetailResponseResult
    from airflow.sdk.execution_time.comms import GetHITLDetailResponse
    from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor

    handle_request = InProcessTestSupervisor._handle_request

    def answering(self: InProcessTestSupervisor, msg: object, log: object, req_id: int) -> None:
        if not isinstance(msg, GetHITLDetailResponse):
            return handle_request(self, msg, log, req_id)
        answer = self.client.hitl.get_detail_response(ti_id=msg.ti_id)
        self.send_msg(HITLDetailResponseResult.from_api_response(response=answer), request_id=req_id, error=None)
        return None

    with mock.patch.object(InProcessTestSupervisor, "_handle_request", answering):
        yield


def stored_deadline_alerts(dag: Any) -> list[Any]:
    """The DAG's deadline alerts as the scheduler reads them back from the serialized DAG."""
    try:
        from airflow.serialization.decoders import decode_deadline_alert
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.sdk.definitions.deadline import DeadlineAlert
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

        decode_deadline_alert = DeadlineAlert.deserialize_deadline_alert
    return [decode_deadline_alert(encoded) for encoded in DagSerialization.to_dict(dag)["dag"]["deadline"]]


def deadline_callback_trigger(callback_path: str, callback_kwargs: dict[str, Any]) -> tuple[Any, str, list[str]]:
    """The trigger a missed deadline's callback runs in, the key of its events' state, and the states
    a callback that succeeds goes through (running, success)."""
    try:
        from airflow.models.callback import CallbackState
        from airflow.triggers.callback import PAYLOAD_STATUS_KEY, CallbackTrigger
    except ImportError:  # Airflow 3.1
        from airflow.models.deadline import DeadlineCallbackState as CallbackState
        from airflow.triggers.deadline import PAYLOAD_STATUS_KEY
        from airflow.triggers.deadline import DeadlineCallbackTrigger as CallbackTrigger
    trigger = CallbackTrigger(callback_path=callback_path, callback_kwargs=callback_kwargs)
    return trigger, PAYLOAD_STATUS_KEY, [CallbackState.RUNNING, CallbackState.SUCCESS]
