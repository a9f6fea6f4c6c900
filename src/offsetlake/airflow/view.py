"""The offsetlake view inside the Airflow UI: a FastAPI app the plugin mounts on the api-server at /offsetlake.

- `/offsetlake/` is the page the UI shows (an external view: the "offsetlake" item in the navigation,
  and an "offsetlake" tab on every DAG, which shows that DAG's pipeline), in Airflow's look (page.py,
  static/): per pipeline the lag per partition (ledger vs Kafka's LSO) and in total, charts of each
  ingest commit's lag, rows per second, duration and quarantined records per table and of the lag per
  partition, the recent commits with kind, rows, quarantined records and exact ranges, the recent
  audits (runs of the recovery DAG) and links to the pipeline's DAGs. It reloads itself every 30 s.
- `/offsetlake/static/` serves the page's script and style and the charting library (uPlot).
- `/offsetlake/api/pipelines` is the same as JSON.
- `/offsetlake/metrics` is the Prometheus text endpoint (`metrics.prometheus_text`).

The page and the JSON are behind Airflow's login, as every other page: the user comes from
Airflow's own session (the `_token` cookie the UI sets, or an `Authorization: Bearer` token), and
sees only the pipelines whose DAGs the auth manager lets them read. Someone not logged in is sent
to Airflow's login page. `/metrics` answers without a login, because a Prometheus scraper cannot
log in: it holds numbers only (offsets, counts, durations), no record or setting; bind the
api-server where you would expose Airflow's API (the demo binds 127.0.0.1).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment

from offsetlake.airflow.page import PAGE

app = FastAPI(title="offsetlake", description="Lag, commits and audits of offsetlake pipelines")
_templates = Environment(autoescape=True)
_page = _templates.from_string(PAGE)
_totals = None  # metrics.CommitTotals, made on the first scrape (imports Delta only when used)
# The page's script and style, and the charting library it draws with (uPlot, vendored: static/vendor/).
app.mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")


async def _user(request: Request):
    """The logged-in Airflow user, as Airflow's own API decides it; HTTPException 401/403 otherwise."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    return await get_user(request, None, credentials)


def _readable(user, names: list[str]) -> list[str]:
    """The pipelines whose DAGs this user may read."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    manager = get_auth_manager()
    return [
        n for n in names if manager.is_authorized_dag(method="GET", details=DagDetails(id=dag_ids(n)[0]), user=user)
    ]


def dag_ids(pipeline: str) -> list[str]:
    return [f"offsetlake__{pipeline}__{kind}" for kind in ("ingest", "stream", "backfill", "recovery", "maintenance")]


def pipeline_of_dag(dag_id: str | None) -> str | None:
    parts = (dag_id or "").split("__")
    return parts[1] if len(parts) == 3 and parts[0] == "offsetlake" else None


def _chosen(request: Request) -> tuple[list[str], str | None]:
    """The pipelines to show (all, `?pipeline=`, or the one of `?dag_id=`), and a note when none match."""
    from offsetlake.config import list_pipelines

    names = list_pipelines()
    dag_id = request.query_params.get("dag_id")
    wanted = request.query_params.get("pipeline") or pipeline_of_dag(dag_id)
    if dag_id and wanted is None:
        return [], f"{dag_id} is not an offsetlake DAG."
    if wanted is not None:
        return ([wanted], None) if wanted in names else ([], f"no pipeline named {wanted!r}.")
    return names, None if names else "no pipelines in include/pipelines/."


def _pipeline_view(name: str) -> dict:
    """Everything the page shows of one pipeline, JSON-ready."""
    from offsetlake.airflow.metrics import RECENT_COMMITS, snapshot
    from offsetlake.config import load_pipeline
    from offsetlake.operations.status import ranges_text

    cfg = load_pipeline(name)
    snap = snapshot(cfg)
    commits = [
        {
            "version": h.version,
            "time": _time(h.timestamp),
            "kind": h.meta.change,
            "batch": h.meta.batch,
            "rows": h.meta.records.rows,
            "quarantined": h.meta.records.quarantined,
            "seconds": h.meta.seconds,
            "conflicts": h.meta.conflicts,
            "ranges": h.meta.ranges,
            "ranges_text": ranges_text(h.meta.ranges),
            "by": h.meta.run.dag_id or h.meta.run.by,
        }
        for h in snap.commits[-RECENT_COMMITS:]
    ][::-1]
    return {
        "pipeline": name,
        "mode": cfg.mode,
        "format": cfg.format.type,
        "topics": list(cfg.topics),
        "table": cfg.table_path,
        "version": snap.version,
        "tables": snap.tables,
        "error": snap.error,
        "partitions": [p.as_dict() for p in snap.partitions],
        "total_lag": snap.total_lag,
        "commits": commits,
        "series": snap.series(),
        "audits": (audits := recent_audits(name)),
        "audit": audits[0] if audits else None,
        "dags": dag_ids(name),
    }


def recent_audits(pipeline: str, limit: int = 10) -> list[dict]:
    """The newest runs of the pipeline's recovery DAG, newest first (it fails when the audit finds a problem)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag_id = f"offsetlake__{pipeline}__recovery"
    verdict = {"success": "ok: every record exactly once", "failed": "PROBLEMS FOUND (or the audit failed)"}
    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.run_after.desc()).limit(limit)
        ).all()
        return [
            {
                "dag_id": dag_id,
                "run_id": run.run_id,
                "state": str(run.state),
                "verdict": verdict.get(str(run.state), f"running ({run.state})"),
                "when": _time(run.end_date or run.start_date or run.run_after),
            }
            for run in runs
        ]


def last_runs_failed(pipeline: str) -> dict[str, bool]:
    """Per DAG of the pipeline with a finished run: whether its newest finished run failed (after its retries;
    the recovery DAG's fails when the audit finds a problem)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    failed = {}
    with create_session() as session:
        for dag_id in dag_ids(pipeline):
            newest = select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.state.in_(("success", "failed")))
            state = session.scalars(newest.order_by(DagRun.run_after.desc()).limit(1)).first()
            if state is not None:
                failed[dag_id] = str(state) == "failed"
    return failed


def _time(value) -> str:
    if isinstance(value, int):
        value = dt.datetime.fromtimestamp(value / 1000, dt.UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


@app.get("/", response_class=HTMLResponse)
async def page(request: Request):
    try:
        user = await _user(request)
    except HTTPException:
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=302)
    names, note = _chosen(request)
    names = _readable(user, names)
    pipelines = [await run_in_threadpool(_pipeline_view, n) for n in names]
    static = f"{request.scope.get('root_path', '')}/static"
    html = _page.render(pipelines=pipelines, note=note, now=_time(dt.datetime.now(dt.UTC)), static=static)
    return HTMLResponse(html)


@app.get("/api/pipelines")
async def pipelines_json(request: Request):
    user = await _user(request)
    names, note = _chosen(request)
    views = [await run_in_threadpool(_pipeline_view, n) for n in _readable(user, names)]
    return JSONResponse({"pipelines": views, "note": note})


@app.get("/metrics")
async def metrics():
    from offsetlake.airflow.metrics import CommitTotals, prometheus_text
    from offsetlake.config import list_pipelines, load_pipeline

    global _totals
    _totals = _totals or CommitTotals()
    configs = [load_pipeline(n) for n in list_pipelines()]
    body = await run_in_threadpool(prometheus_text, configs, _totals, last_runs_failed)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
