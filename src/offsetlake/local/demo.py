"""`make demo` / `make down`: the embedded stack with data flowing, started and stopped by PID.

up:   broker on 127.0.0.1:19092, demo events (with aborted transactions and a few
      malformed records), a producer that keeps writing, Airflow (api-server on
      127.0.0.1:8080, scheduler, dag-processor, triggerer), the demo pipeline's
      DAGs unpaused and a first ingest run triggered and awaited.
down: everything above, stopped by its pid file.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from offsetlake.local import broker, processes, stack
from offsetlake.config import load_pipeline, project_home
from offsetlake.errors import OffsetlakeError

PIPELINE = "demo_events"
UI_PORT = int(os.environ.get("OFFSETLAKE_DEMO_UI_PORT", "8080"))
BROKER_PORT = 19092


def _dir() -> Path:
    return project_home() / ".offsetlake"


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "offsetlake.cli", *args], check=True)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((stack.HOST, port)) != 0


def up() -> None:
    base = _dir()
    if (base / "airflow" / "api-server.pid").exists():
        raise OffsetlakeError("the demo is already running (make down stops it)")
    if not _port_free(UI_PORT):
        raise OffsetlakeError(f"port {UI_PORT} on 127.0.0.1 is taken; set OFFSETLAKE_DEMO_UI_PORT to another port")
    _cli("broker", "start", "--data-dir", str(base / "broker"), "--pid-file", str(base / "broker.pid"),
         "--port", str(BROKER_PORT))
    _cli("produce", "--pipeline", PIPELINE, "--count", "20000", "--abort-share", "0.2", "--bad-share", "0.002")
    with open(base / "producer.log", "ab") as log:
        producer = subprocess.Popen(
            [sys.executable, "-m", "offsetlake.cli", "produce", "--pipeline", PIPELINE, "--count", "300",
             "--every", "5", "--abort-share", "0.2", "--bad-share", "0.002"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (base / "producer.pid").write_text(f"{producer.pid}\n")
    print(f"demo producer running (pid {producer.pid}): 300 events every 5 s, some in aborted transactions")

    home = base / "airflow"
    env = stack.environment(home, UI_PORT, project_home())
    print("starting Airflow: api-server, scheduler, dag-processor, triggerer ...", flush=True)
    stack.start(env)
    api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
    for kind in ("ingest", "stream", "backfill"):
        api.wait_for_dag(f"offsetlake__{PIPELINE}__{kind}")
        api.unpause(f"offsetlake__{PIPELINE}__{kind}")
    dag_id = f"offsetlake__{PIPELINE}__ingest"
    run_id = api.trigger(dag_id)
    print(f"triggered {dag_id} ({run_id}); waiting for it ...", flush=True)
    state = api.wait_for_run(dag_id, run_id, timeout=300)
    api.unpause(f"offsetlake__{PIPELINE}__recovery")  # its daily audit needs the table the first ingest made
    _cli("status", "--pipeline", PIPELINE)
    _cli("history", "--pipeline", PIPELINE, "--limit", "5")
    cfg = load_pipeline(PIPELINE)
    print(f"""
first ingest run: {state}
Airflow UI:   {env['AIRFLOW__API__BASE_URL']}   login: {stack.USER} / {stack.password(home)}
DAGs:         offsetlake__{PIPELINE}__ingest (hourly), __stream (micro-batches), __backfill (trigger form), __recovery (daily audit), __maintenance (daily optimize, vacuum, checkpoint)
Delta table:  {cfg.table_path}
quarantine:   {cfg.quarantine_path}
broker:       127.0.0.1:{BROKER_PORT} (topic {', '.join(cfg.topics)})
logs:         {home}/*.log, {base}/producer.log
stop it all:  make down""")
    if state != "success":
        raise OffsetlakeError(f"the first ingest run ended {state}; see {home}/scheduler.log")


def down() -> None:
    base = _dir()
    stopped = stack.stop(base / "airflow")
    print(f"stopped Airflow components: {', '.join(stopped) or 'none running'}")
    if processes.stop_from_pid_file(base / "producer.pid", "offsetlake.cli"):
        print("stopped the demo producer")
    print("broker stopped" if broker.stop_from_pid_file(base / "broker.pid") else "broker was not running")


def main(argv: list[str] | None = None) -> int:
    action = (argv or sys.argv[1:] or ["up"])[0]
    try:
        {"up": up, "down": down}[action]()
    except KeyError:
        print(f"offsetlake demo: unknown action {action!r} (up or down)", file=sys.stderr)
        return 2
    except (OffsetlakeError, subprocess.CalledProcessError) as err:
        print(f"offsetlake demo: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
