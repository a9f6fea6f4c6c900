"""The embedded Airflow stack for `make demo` and the end-to-end test.

Airflow runs as four separate processes (api-server, scheduler, dag-processor,
triggerer), each with its own pid file, never `airflow standalone` (which
leaves orphaned workers when its parent is killed). Each is started in its own
process group so that stopping it by PID also stops the workers it forked.
Everything binds to 127.0.0.1. Login: the simple auth manager with one admin
user whose password is generated per AIRFLOW_HOME.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from offsetlake.errors import OffsetlakeError
from offsetlake_local import processes

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
HOST = "127.0.0.1"
USER = "admin"


def _secret(home: Path, name: str) -> str:
    path = home / name
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    return path.read_text().strip()


def password(home: Path) -> str:
    passwords = home / "simple_auth_manager_passwords.json"
    if not passwords.exists():
        passwords.write_text(json.dumps({USER: secrets.token_urlsafe(12)}))
        passwords.chmod(0o600)
    return json.loads(passwords.read_text())[USER]


def environment(
    home: Path,
    port: int,
    repo: Path,
    pipelines: Path | None = None,
    spark_master: str = "local[*]",
    extra: dict | None = None,
    host: str = HOST,
) -> dict[str, str]:
    """`host`: where the API server binds and is reached (127.0.0.1; a test's network address when workers
    on other hosts call its execution API)."""
    home.mkdir(parents=True, exist_ok=True)
    password(home)
    base_url = f"http://{host}:{port}"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(repo / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "simple_auth_manager_passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": _secret(home, "jwt_secret"),
        "AIRFLOW__API__SECRET_KEY": _secret(home, "api_secret"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # unpause on purpose, DAG by DAG
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        # Airflow's default: each parse of the DAG files costs CPU (docs/development/measurements.md)
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__TRIGGERER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
        "OFFSETLAKE_HOME": str(repo),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit
        "SPARK_LOCAL_IP": HOST,
    }
    if pipelines:
        env["OFFSETLAKE_PIPELINES_DIR"] = str(pipelines)
    env.update(extra or {})
    return env


def _airflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


Wrap = Callable[[list[str]], list[str]]


def start(env: dict[str, str], timeout: float = 180, wrap: Wrap | None = None) -> dict[str, int]:
    """Migrate the DB, start the four components, wait until the API answers. Returns {component: pid}.

    `wrap`: turns each component's command line into the one to run (a test host's namespaces, say); the
    wrapper must exec the command so that the pid stays the component's."""
    migrate = subprocess.run(_airflow("db", "migrate"), env=env, capture_output=True, text=True, timeout=900)
    if migrate.returncode != 0:
        raise OffsetlakeError(f"airflow db migrate failed: {migrate.stderr.strip().splitlines()[-1:]}")
    pids = {component: start_component(env, component, wrap) for component in COMPONENTS}
    wait_healthy(env["AIRFLOW__API__BASE_URL"], timeout)
    return pids


def start_component(env: dict[str, str], component: str, wrap: Wrap | None = None) -> int:
    """One component in its own process group, its pid in <AIRFLOW_HOME>/<component>.pid. Returns the pid."""
    home = Path(env["AIRFLOW_HOME"])
    args = (
        ("api-server", "--host", env["AIRFLOW__API__HOST"], "--port", env["AIRFLOW__API__PORT"])
        if component == "api-server"
        else (component,)
    )
    with open(home / f"{component}.log", "ab") as log:
        command = _airflow(*args)
        proc = subprocess.Popen(
            wrap(command) if wrap else command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (home / f"{component}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def wait_healthy(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/api/v2/monitor/health", timeout=5) as resp:
                health = json.loads(resp.read())
            if health.get("metadatabase", {}).get("status") == "healthy":
                return
            last = str(health)
        except (urllib.error.URLError, OSError, ValueError) as err:
            last = str(err)
        time.sleep(1)
    raise OffsetlakeError(f"Airflow API at {base_url} not healthy after {timeout:.0f}s: {last}")


def stop(home: Path, timeout: float = 30) -> list[str]:
    """SIGTERM each component's process group (by its pid file), SIGKILL what will not stop. The four
    shut down side by side: one's graceful stop need not wait for another's."""

    def stop_one(component: str) -> bool:
        return processes.stop_from_pid_file(home / f"{component}.pid", "airflow", group=True, timeout=timeout)

    with ThreadPoolExecutor(len(COMPONENTS)) as pool:
        stopped = list(pool.map(stop_one, COMPONENTS))
    return [c for c, ran in zip(COMPONENTS, stopped) if ran]


class Api:
    """A small client for Airflow's REST API v2 (token from POST /auth/token)."""

    def __init__(self, base_url: str, username: str, password_: str):
        self.base_url = base_url
        token = self._call("POST", "/auth/token", {"username": username, "password": password_}, auth=False)
        self.token = token["access_token"]

    def _call(self, method: str, path: str, body: dict | None = None, auth: bool = True):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                text = resp.read()
        except urllib.error.HTTPError as err:
            raise OffsetlakeError(f"Airflow API {method} {path}: HTTP {err.code}: {err.read()[:300]!r}") from err
        return json.loads(text) if text else None

    def get(self, path: str):
        return self._call("GET", path)

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get(f"/api/v2/dags/{dag_id}")
            except OffsetlakeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def unpause(self, dag_id: str, timeout: float = 60) -> None:
        """Unpause a DAG. On SQLite (the demo's metadata database) the API server answers 500 when the
        audit-log insert of the request waits out SQLite's 5 s lock timeout while the scheduler and the
        tasks write; setting the flag again is harmless, so a 500 is asked again until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
                return
            except OffsetlakeError as err:
                if "HTTP 500" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def asset_events(self, name: str, limit: int = 100) -> list[dict]:
        """The newest events of the Asset called `name`, newest first ([] while it has none)."""
        assets = self.get(f"/api/v2/assets?name_pattern={urllib.parse.quote(name)}")["assets"]
        ids = [a["id"] for a in assets if a["name"] == name]
        if not ids:
            return []
        return self.events(f"asset_id={ids[0]}&order_by=-timestamp&limit={limit}")

    def events(self, query: str, timeout: float = 60) -> list[dict]:
        """GET /api/v2/assets/events?`query`. Airflow 3.3 answers 500 while an event's downstream run is
        queued and not yet started (its start_date is NULL: apache/airflow#71360, fixed by #71379 after
        3.3.2): such a run starts within seconds, so a 500 is asked again until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get(f"/api/v2/assets/events?{query}")["asset_events"]
            except OffsetlakeError as err:
                if "HTTP 500" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
        while time.monotonic() < deadline:
            state = self.get(path)["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise OffsetlakeError(f"run {run_id} of {dag_id} did not finish within {timeout:.0f}s")
