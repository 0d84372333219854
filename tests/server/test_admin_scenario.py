"""The reference server's admin scenario endpoint takes builtin names only, never a file path."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from airflow_provider_bos.testing.scenario import load_scenario


def test_a_file_path_is_not_a_scenario_name(bos_server, tmp_path: Path) -> None:
    scenario_file = tmp_path / "empty.json"
    scenario_file.write_text(json.dumps(load_scenario("empty").model_dump(mode="json")))
    before = bos_server.scenario.name
    with httpx.Client(timeout=10) as http:
        for name in (str(scenario_file), "/etc/passwd", "../scenarios/empty.json", ["empty"]):
            response = http.post(bos_server.base_url + "/_bos/admin/scenario", json={"name": name})
            assert response.status_code == 400, name
            assert "builtin" in response.json()["error"]
            assert "root:" not in response.text
        assert bos_server.scenario.name == before
        assert http.post(bos_server.base_url + "/_bos/admin/scenario", json={"name": "empty"}).status_code == 200
    assert bos_server.scenario.name == "empty"
