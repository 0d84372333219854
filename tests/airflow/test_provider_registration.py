"""The provider is visible to Airflow: what `airflow providers list/hooks/widgets` show, and the form metadata.

Those three commands print what ``ProvidersManager`` discovers; the tests read it there, in this
process, instead of starting the CLI three times (about 10 s each). The commands themselves, on the
built wheel installed into a fresh venv (providers list, hooks, plugins), are checked by
``.ci/package``, which ``.ci/run`` runs at every landing.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_provider_bos.airflow_compat import airflow_version
from airflow_provider_bos.get_provider_info import get_provider_info


def _providers_manager() -> Any:
    from airflow.providers_manager import ProvidersManager

    return ProvidersManager()


def _hooks() -> dict[str, Any]:
    with warnings.catch_warnings():  # `.hooks` moved to the task SDK; the CLI still lists this one
        warnings.simplefilter("ignore")
        return dict(_providers_manager().hooks.items())


def test_provider_info_validates_against_airflow_schema() -> None:
    import airflow

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_package_name_equals_distribution() -> None:
    from importlib.metadata import distribution

    assert distribution(get_provider_info()["package-name"]).metadata["Name"] == "airflow-provider-bos"


def test_airflow_providers_list_shows_bos() -> None:
    providers = {info.data["package-name"]: info for info in _providers_manager().providers.values()}
    assert "airflow-provider-bos" in providers
    from importlib.metadata import version

    assert providers["airflow-provider-bos"].version == version("airflow-provider-bos")
    assert get_provider_info()["versions"] == [version("airflow-provider-bos")]


def test_airflow_providers_hooks_shows_bos_connection_type() -> None:
    hook = _hooks()["bos"]
    assert hook is not None, "the bos hook failed to import"
    assert hook.hook_class_name == "airflow_provider_bos.hooks.bos.BosHook"
    assert hook.connection_id_attribute_name == "bos_conn_id"


@pytest.mark.skipif(airflow_version() < (3, 2), reason="Airflow 3.1 builds connection forms from hook methods; "
                    "the provider info's conn-fields are read from Airflow 3.2 on (docs/deployment.md)")
def test_connection_form_fields_are_declared() -> None:
    widgets = {name for name, widget in _providers_manager().connection_form_widgets.items()
               if widget.hook_class_name == "airflow_provider_bos.hooks.bos.BosHook"}
    for field in ("auth_type", "client_id", "protocol", "scopes", "token_store_conn_id", "context_handle",
                  "timeout", "stream_idle_timeout", "operation_deadline", "max_event_mib"):
        assert f"extra__bos__{field}" in widgets

    from airflow.providers_manager import ProvidersManager

    behaviour = ProvidersManager().field_behaviours["bos"]
    assert "extra" in behaviour["hidden_fields"]
    assert behaviour["relabeling"]["password"] == "Refresh token (OAuth) or API key"
    assert behaviour["relabeling"]["host"] == "MCP resource URL"


@pytest.mark.parametrize("field", ["auth_type", "protocol"])
def test_enumerated_fields_offer_their_choices(field: str) -> None:
    conn_fields = get_provider_info()["connection-types"][0]["conn-fields"]
    assert conn_fields[field]["schema"]["enum"]


def test_the_stream_idle_timeout_field_says_what_it_bounds() -> None:
    field = get_provider_info()["connection-types"][0]["conn-fields"]["stream_idle_timeout"]
    assert field["label"] == "Stream idle timeout (seconds)"
    assert field["schema"]["default"] == 300
    assert "keepalive" in field["description"] and "HTTP timeout" in field["description"]
