"""The Admin -> BOS page's Check and probe hold only small answers, whatever the Connection says.

They run in the API server: a Connection's 'Largest event' (``max_event_mib``, up to 16 GiB) is the
bound of a task's read result and must not raise what the page buffers and decodes whole.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_bos.hooks.bos import BosHook
from airflow_provider_bos.mcp.session import DEFAULT_MAX_ANSWER_BYTES
from airflow_provider_bos.plugins.checks import PageHook, check_contexts
from airflow_provider_bos.plugins.outbound import Deadline, OutboundPolicy

MIB = 1024 * 1024


@pytest.fixture()
def huge_event_conn(bos_server, tmp_path, monkeypatch):
    grant = bos_server.mint_grant()
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": grant["refresh_token"],
        "extra": {"client_id": grant["client_id"], "token_store_url": f"sqlite:///{tmp_path / 'tokens.db'}",
                  "max_event_mib": 16 * 1024},
    }))
    # A store named by URL: the page opens it only when the operator allows such stores.
    monkeypatch.setenv("AIRFLOW__BOS__ALLOW_TOKEN_STORE_URLS", "True")


def test_the_page_ignores_the_largest_event_field(bos_server, huge_event_conn) -> None:
    policy = OutboundPolicy.from_setting("127.0.0.1")
    with BosHook() as task_hook:  # a task's read keeps the Connection's bound
        assert task_hook.get_conn().max_event_bytes == 16 * 1024 * MIB
    with PageHook("bos_default", policy=policy, deadline=Deadline(30)) as page_hook:
        session = page_hook.get_conn()
        assert session.max_event_bytes == DEFAULT_MAX_ANSWER_BYTES
        assert session.max_answer_bytes == DEFAULT_MAX_ANSWER_BYTES
    # The Check still works under it.
    contexts = check_contexts("bos_default", bos_server.mcp_url, policy=policy, deadline=Deadline(30))
    assert len(contexts) == 2
