"""A real Airflow deployment for one test module: PostgreSQL metadata DB, API server, scheduler, DAG
processor and (CeleryExecutor) two Celery workers, all separate processes from the project venv.

Its ``airflow.cfg`` is ``airflow.cfg.fragment`` (the copy-paste fragment of docs/deployment.md) with the
placeholders filled in; the few test-only settings are environment variables (see ``_test_env``).
Every process runs in its own session (process group) and is stopped by that group, also on failure;
it gets SIGTERM if the test process dies, and a later run drops the databases a killed one left.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import sqlalchemy as sa
from cryptography.fernet import Fernet

HERE = Path(__file__).resolve().parent
FRAGMENT = HERE / "airflow.cfg.fragment"
AIRFLOW = str(Path(sys.executable).parent / "airflow")
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except httpx.TransportError:  # an API server busy with a burst of task calls: ask again
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def create_database(prefix: str) -> str:
    """A new database ``<prefix>_<this pid>_<random>`` (the pid lets a later run spot it orphaned)."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    return name


def drop_database(name: str) -> None:
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def drop_orphaned_databases(prefixes: tuple[str, ...] = ("bos_af", "bos_wh")) -> list[str]:
    """Drop the databases of earlier runs whose process is gone (a test run killed hard never
    reached its teardown); return their names. A live run's databases are left alone."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        names = conn.exec_driver_sql("SELECT datname FROM pg_database").scalars().all()
    orphaned = []
    for name in names:
        prefix, _, rest = name.rpartition("_")[0].rpartition("_")
        if prefix in prefixes and rest.isdigit() and not psutil.pid_exists(int(rest)):
            drop_database(name)
            orphaned.append(name)
    return orphaned


def _die_with_the_test_run() -> None:
    """In the child before exec: SIGTERM it when the test process dies, even by SIGKILL
    (Linux ``PR_SET_PDEATHSIG``), so a killed run leaves no Airflow component running."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class Deployment:
    """``start()`` brings it up, ``stop()`` tears everything down (idempotent)."""

    def __init__(self, home: Path, executor: str, *, dags: Path, env: dict[str, str]) -> None:
        self.home = home
        self.executor = executor
        self.dags_src = dags
        self.extra_env = env
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.queue = f"bos_{uuid.uuid4().hex[:8]}"
        self.processes: dict[str, subprocess.Popen] = {}
        self.databases: list[str] = []
        self.metadata_db = ""

    # --- configuration ----------------------------------------------------------------------

    def airflow_cfg(self) -> str:
        values = {
            "<LocalExecutor or CeleryExecutor>": self.executor,
            "<API_PORT>": str(self.api_port),
            "<FERNET_KEY>": Fernet.generate_key().decode(),
            "<DAGS_FOLDER>": str(self.home / "dags"),
            "<AIRFLOW_DB>": self.metadata_db,
            "<SECRET_KEY>": secrets.token_urlsafe(64),
            "<JWT_SECRET>": secrets.token_urlsafe(64),
            "<LOG_SERVER_PORT>": str(free_port()),
        }
        text = FRAGMENT.read_text()
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        assert "<" not in text, "a placeholder of airflow.cfg.fragment was left unfilled"
        return text

    def _test_env(self) -> dict[str, str]:
        # The outer test session's Airflow settings (its own AIRFLOW_HOME, SQLite DB) must not leak in.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")) and k != "AIRFLOW_HOME"}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            # Test-only: REST calls without a login, no examples, DAGs active at once, a private
            # Celery queue on the shared Redis, and a killed worker's task noticed in seconds.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            **self.extra_env,
        })
        return env

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.metadata_db = create_database("bos_af")
        self.databases.append(self.metadata_db)
        (self.home / "proc").mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.dags_src, self.home / "dags", dirs_exist_ok=True)
        (self.home / "airflow.cfg").write_text(self.airflow_cfg())
        self.run_cli("db", "migrate")
        self.spawn("api-server", "api-server")
        self.spawn("scheduler", "scheduler")
        self.spawn("dag-processor", "dag-processor")
        if self.executor == "CeleryExecutor":
            for n in (1, 2):
                # Two workers sharing one AIRFLOW_HOME: each its own pid file and Celery name; the
                # task logs are files in the shared home, so neither runs the log server.
                self.spawn(f"worker{n}", "celery", "worker", "--concurrency", "4", "--queues", self.queue,
                           "--celery-hostname", f"worker{n}@%h", "--pid", str(self.home / f"worker{n}.pid"),
                           "--skip-serve-logs")
        wait_for("the API server", self._api_up, timeout=120)

    def _api_up(self) -> bool:
        self.check_alive()
        return httpx.get(f"{self.api}/api/v2/monitor/health", timeout=5).status_code == 200

    def run_cli(self, *args: str) -> str:
        proc = subprocess.run([AIRFLOW, *args], env=self._test_env(), capture_output=True, text=True, timeout=300,
                              check=False)
        if proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc.stdout

    def spawn(self, name: str, *args: str) -> None:
        out = open(self.home / "proc" / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen([AIRFLOW, *args], env=self._test_env(), stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                preexec_fn=_die_with_the_test_run)  # noqa: PLW1509 - only prctl, no locks
        out.close()

    def check_alive(self, *, except_: tuple[str, ...] = ()) -> None:
        for name, proc in self.processes.items():
            if name not in except_ and proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.proc_log(name)}")

    def proc_log(self, name: str, tail: int = 4000) -> str:
        path = self.home / "proc" / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL one component and everything in its process group (a crashed host, say)."""
        proc = self.processes[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def owner_of(self, pid: int) -> str:
        """The component whose process tree holds ``pid``."""
        ancestors = {p.pid for p in psutil.Process(pid).parents()} | {pid}
        for name, proc in self.processes.items():
            if proc.pid in ancestors:
                return name
        raise AssertionError(f"pid {pid} belongs to no process this deployment started")

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after 20 s, then drop the databases."""
        for proc in self.processes.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The group may outlive its leader (task processes, Celery pool children): kill it whole.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for name in self.databases:
            drop_database(name)
        self.databases.clear()

    # --- REST API ---------------------------------------------------------------------------

    def rest(self, method: str, path: str, **kwargs: Any) -> Any:
        for attempt in range(3 if method == "GET" else 1):
            try:
                response = httpx.request(method, f"{self.api}/api/v2{path}", timeout=60, **kwargs)
                break
            except httpx.TimeoutException:  # a busy API server; a GET is safe to ask again
                if attempt == 2 or method != "GET":
                    raise
        if response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        def parsed() -> bool:
            self.check_alive()
            return httpx.get(f"{self.api}/api/v2/dags/{dag_id}", timeout=10).status_code == 200
        wait_for(f"DAG {dag_id} to be parsed", parsed, timeout=timeout)

    def trigger(self, dag_id: str) -> str:
        return self.rest("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 240, *, except_: tuple[str, ...] = ()) -> str:
        def finished() -> str | None:
            self.check_alive(except_=except_)
            state = self.run_state(dag_id, run_id)
            return state if state in {"success", "failed"} else None
        return wait_for(f"run {run_id} of {dag_id} to finish", finished, timeout=timeout, interval=1)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})[
            "task_instances"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def mark_failed(self, dag_id: str, run_id: str, task_id: str) -> None:
        """What "Mark as failed" in the UI does."""
        self.rest("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
                  json={"new_state": "failed"})

    def import_connections(self, connections: dict[str, dict[str, Any]]) -> None:
        """Store connections in the metadata DB (encrypted with the Fernet key), as an admin would."""
        path = self.home / "connections.json"
        path.write_text(json.dumps(connections))
        try:
            self.run_cli("connections", "import", str(path))
        finally:
            path.unlink()

    def task_log_files(self) -> list[Path]:
        return [p for p in (self.home / "logs").rglob("*") if p.is_file()]
