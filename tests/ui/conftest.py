"""A real ``airflow api-server`` with the BOS plugin, a reference server, and headless Chromium.

The API server runs with the default SimpleAuthManager and two users: ``admin`` (Admin) and
``viewer`` (Viewer, no connection-edit rights), or in all-admins mode (no login, no cookie). Both
have ``[core] test_connection = Enabled`` and ``[bos] allowed_hosts = 127.0.0.1`` (the reference
server's host). Everything started here is stopped at teardown.
Screenshots go to ``$BOS_UI_ARTIFACTS`` when set, else under the test's tmp dir.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagefixtures import API_SECRET_KEY, USERS, bearer, build_page

CHROMIUM = os.environ.get("BOS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry_point_installed() -> bool:
    return any(
        ep.value.startswith("airflow_provider_bos.")
        for ep in importlib.metadata.entry_points(group="airflow.plugins")
    )


class ApiServer:
    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log_file: Path) -> None:
        self.base_url = base_url
        self.process = process
        self.log_file = log_file

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def token(self, user: str) -> str:
        response = httpx.post(f"{self.base_url}/auth/token", json={"username": user, "password": USERS[user]})
        response.raise_for_status()
        return str(response.json()["access_token"])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def process_fernet_key() -> str:
    """The one Fernet key of this test process: the configured one, else one generated once.

    A key generated per module would leave the Connections one module wrote unreadable in the next.
    """
    from airflow.configuration import conf
    from cryptography.fernet import Fernet

    return conf.get("core", "fernet_key", fallback="") or Fernet.generate_key().decode()


@pytest.fixture(scope="module")
def shared_fernet_key(process_fernet_key: str) -> Iterator[str]:
    """One Fernet key for this process and the api-server it starts, set for this module and unset after.

    Airflow reads ``[core] fernet_key`` once per process: this one loaded its config before
    ``airflow db migrate`` wrote an airflow.cfg with a generated key, which a later api-server reads.
    Without one key on both sides the page's encrypted Connections and token-store rows are
    unreadable here (and the CLI here writes rows the page cannot compare). ``get_fernet`` caches
    its Fernet: cleared on the way in and out, so no later test reads with this module's key.
    """
    from tests.airflow_names import forget_fernet

    previous = os.environ.get("AIRFLOW__CORE__FERNET_KEY")
    os.environ["AIRFLOW__CORE__FERNET_KEY"] = process_fernet_key
    forget_fernet()
    try:
        yield process_fernet_key
    finally:
        if previous is None:
            os.environ.pop("AIRFLOW__CORE__FERNET_KEY", None)
        else:
            os.environ["AIRFLOW__CORE__FERNET_KEY"] = previous
        forget_fernet()


@pytest.fixture(scope="module")
def password_page(airflow_db: Path, shared_fernet_key: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Airflow's API app in this process (``pagefixtures.build_page``) with password users ``admin`` and
    ``viewer``. The Fernet key of the whole tests/ui session: Connections other modules left behind stay
    readable."""
    with build_page(tmp_path_factory.mktemp("password-page"), all_admins=False) as client:
        yield client


@pytest.fixture()
def admin(password_page: Any) -> dict[str, str]:
    """The ``Authorization`` header of ``admin`` on ``password_page``."""
    return bearer(password_page, "admin")


@contextmanager
def _running_api_server(workdir: Path, fernet_key: str, *, all_admins: bool) -> Iterator[ApiServer]:
    passwords = workdir / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(all_admins),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API_AUTH__JWT_SECRET": "bos-ui-test-jwt-secret-0123456789abcdef",
        "AIRFLOW__API__SECRET_KEY": API_SECRET_KEY,
        "AIRFLOW__CORE__FERNET_KEY": fernet_key,
        # The page probes and checks (Airflow's connection test is Disabled by default), and may
        # reach the reference server on loopback (refused unless allow-listed).
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        "AIRFLOW__BOS__ALLOWED_HOSTS": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(
            p for p in [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")] if p
        ),
    }
    if not _entry_point_installed():
        # A development venv installed before the entry point existed: load it from the provider info.
        env["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = "False"
    log_file = workdir / "api-server.log"
    airflow = str(Path(sys.executable).parent / "airflow")
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [airflow, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = ApiServer(base_url, process, log_file)
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                pytest.fail(f"airflow api-server exited with {process.returncode}:\n{server.log()[-4000:]}")
            try:
                if httpx.get(f"{base_url}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"airflow api-server did not start within 180 s:\n{server.log()[-4000:]}")
            time.sleep(0.5)  # polling for readiness, not papering over a race
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api_server(
    airflow_db: Path, shared_fernet_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    """Password login: ``admin`` (Admin) and ``viewer`` (Viewer)."""
    with _running_api_server(tmp_path_factory.mktemp("api-server"), shared_fernet_key, all_admins=False) as server:
        yield server


@pytest.fixture(scope="module")
def all_admins_api_server(
    airflow_db: Path, shared_fernet_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    """``simple_auth_manager_all_admins``: everyone is admin, and no session cookie exists."""
    with _running_api_server(tmp_path_factory.mktemp("api-server-all-admins"), shared_fernet_key,
                             all_admins=True) as server:
        yield server


@pytest.fixture(scope="module")
def reference_server() -> Iterator[Any]:
    from airflow_provider_bos.testing.server import BosReferenceServer

    server = BosReferenceServer(scenario="complete")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium package.")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); CI runs this test.")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    root = os.environ.get("BOS_UI_ARTIFACTS")
    folder = Path(root) / request.node.name if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture()
def browser_as(chromium: Any, api_server: ApiServer) -> Iterator[Callable[[str], Any]]:
    """``browser_as("admin")``: a page whose browser carries that user's Airflow session cookie."""
    contexts: list[Any] = []

    def open_page(user: str) -> Any:
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        context.add_cookies([{"name": "_token", "value": api_server.token(user), "url": api_server.base_url}])
        return context.new_page()

    try:
        yield open_page
    finally:
        for context in contexts:
            context.close()
