"""The documented command: ``python -m airflow_provider_bos.testing.server``."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.testing import BosReferenceServer

COMMAND = [sys.executable, "-m", "airflow_provider_bos.testing.server"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_serves_and_shuts_down_cleanly(tmp_path, sig):
    scenario = tmp_path / "scenario.json"
    scenario.write_text('{"name": "mine", "sources": [{"source_identity": "crm-x", "records": 3}]}')
    process = subprocess.Popen([*COMMAND, "--port", "0", "--scenario", str(scenario), "--access-token-ttl", "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first_line = process.stdout.readline()
        mcp_url = first_line.rsplit(" ", 1)[-1].strip()
        assert mcp_url.startswith("http://127.0.0.1:") and mcp_url.endswith("/mcp/apps/bos/platform")
        response = httpx.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                              timeout=10)
        assert response.status_code == 401 and "resource_metadata=" in response.headers["www-authenticate"]
        process.send_signal(sig)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_refuses_a_non_loopback_host():
    result = subprocess.run([*COMMAND, "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 2 and "allow-remote" in result.stderr


def test_cli_reports_an_unknown_scenario():
    result = subprocess.run([*COMMAND, "--port", "0", "--scenario", "no-such-scenario"], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2 and "no-such-scenario" in result.stderr


def test_constructor_refuses_a_non_loopback_host():
    with pytest.raises(BosConfigurationError):
        BosReferenceServer(host="0.0.0.0")
