"""The demo ends by pointing at the BOS page as an optional next step."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_bos.demo import ui_next_step
from airflow_provider_bos.plugins.app import URL_PREFIX


def test_the_demo_names_the_page_and_how_to_serve_it() -> None:
    kept = ui_next_step(Path("/tmp/bos-demo-x/airflow_home"), kept=True)
    assert f"http://localhost:8080{URL_PREFIX}/" in kept and "Admin -> BOS" in kept
    assert "AIRFLOW_HOME=/tmp/bos-demo-x/airflow_home airflow api-server --port 8080" in kept
    # Without these the page cannot reach the demo's loopback BOS: Check is off, loopback refused.
    assert "AIRFLOW__CORE__TEST_CONNECTION=Enabled" in kept and "AIRFLOW__BOS__ALLOWED_HOSTS=127.0.0.1" in kept
    assert "BOS_DEMO_KEEP=1" in ui_next_step(Path("/tmp/bos-demo-x/airflow_home"), kept=False)
