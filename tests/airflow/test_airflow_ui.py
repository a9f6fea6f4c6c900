"""What a user sees in Airflow, through real Airflow processes (api-server, scheduler, dag-processor,
triggerer), a real Spark job per task, a real broker and a real headless Chromium.

One Airflow for the module, two pipelines:
- `batch_cfg` (mode batch): two batches ingested before Airflow starts (the chart needs points),
  one ingest DAG run (its OpenLineage event), one recovery DAG run (the audit verdict), then more
  records that nobody ingests, so the view has lag to show;
- `stream_cfg` (mode stream): its stream DAG keeps a run going, and the example consumer DAG,
  scheduled on the table's Asset, must start within 5 minutes of a stream commit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from hosts import descendants
from offsetlake.batch import ingest
from offsetlake_local import processes, screenshots, stack
from offsetlake_local.broker import free_port
from support import REPO, assert_exactly_once, new_pipeline, pipeline_commits, produce

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
WITHIN = 300  # seconds from a commit to the downstream DAG's start


@pytest.fixture(scope="module")
def ui(spark, bootstrap, tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    pipelines = root / "pipelines"
    batch_cfg, batch_topic = new_pipeline(
        bootstrap, pipelines, root / "lake", partitions=2, records=600, schedule=None, mode="batch"
    )
    stream_cfg, stream_topic = new_pipeline(
        bootstrap, pipelines, root / "lake", partitions=2, records=300, mode="stream", stream_interval_seconds=2
    )
    ingest(spark, batch_cfg)
    produce(batch_cfg.kafka, batch_topic, 400, transactional_share=0.5, abort_share=0.2, seed=2)
    ingest(spark, batch_cfg)
    produce(batch_cfg.kafka, batch_topic, 300, transactional_share=0.5, abort_share=0.2, seed=3)

    home = root / "airflow"
    lineage = root / "openlineage.jsonl"
    env = stack.environment(
        home,
        free_port(),
        REPO,
        pipelines,
        spark_master="local[1]",
        extra={
            "OFFSETLAKE_EXAMPLE_CONSUMERS": stream_cfg.name,
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(lineage), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "offsetlake-test",
        },
    )
    pids = stack.start(env)
    api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
    try:
        consumer = f"example__{stream_cfg.name}__on_change"
        for dag_id in (
            consumer,
            f"offsetlake__{stream_cfg.name}__stream",
            f"offsetlake__{batch_cfg.name}__ingest",
            f"offsetlake__{batch_cfg.name}__recovery",
        ):
            api.wait_for_dag(dag_id)
            api.unpause(dag_id)
        ingest_run = api.trigger(f"offsetlake__{batch_cfg.name}__ingest")
        yield {
            "api": api,
            "env": env,
            "home": home,
            "lineage": lineage,
            "batch": batch_cfg,
            "batch_topic": batch_topic,
            "stream": stream_cfg,
            "stream_topic": stream_topic,
            "consumer": consumer,
            "ingest_run": ingest_run,
            "root": root,
        }
    finally:
        # The stream's run would go on for an hour, its task in a session of its own: what the scheduler
        # started goes first (a killed stream commits nothing it had not committed), then Airflow.
        for pid in descendants(pids["scheduler"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stack.stop(home, timeout=10)  # graceful or not: a test teardown need not wait 30 s for it


def test_the_ingest_task_reports_openlineage_inputs_and_outputs(ui):
    api, cfg = ui["api"], ui["batch"]
    dag_id = f"offsetlake__{cfg.name}__ingest"
    assert api.wait_for_run(dag_id, ui["ingest_run"], timeout=600) == "success", _logs(ui["home"])
    committed = [h for h in pipeline_commits(cfg) if h.meta.run.dag_id == dag_id]
    assert committed, "the triggered run had 300 records to ingest"

    events = _wait_for_lineage(ui["lineage"], f"{dag_id}.ingest")
    complete = events[-1]
    assert {(d["namespace"], d["name"]) for d in complete["inputs"]} == {
        (f"kafka://{cfg.kafka.bootstrap_servers}", ui["batch_topic"])
    }
    [out] = complete["outputs"]
    assert (out["namespace"], out["name"]) == ("file", cfg.table_path)
    assert out["facets"]["version"]["datasetVersion"] == str(committed[-1].version)
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == sum(h.meta.records.rows for h in committed)


def test_a_downstream_dag_starts_within_minutes_of_a_stream_commit(ui):
    api, cfg = ui["api"], ui["stream"]
    deadline = time.monotonic() + WITHIN + 240
    streamed: list[tuple[dict, list[dict]]] = []  # consumer runs, with the stream's events they were started by
    seed = 100
    while time.monotonic() < deadline and not streamed:  # keep the stream committing until the consumer ran for it
        for run in api.get(f"/api/v2/dags/{ui['consumer']}/dagRuns")["dag_runs"]:
            if not run.get("start_date"):  # Airflow 3.3 answers 500 for a queued run's events (no start date)
                continue
            events = api.get(f"/api/v2/dags/{ui['consumer']}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")
            payloads = [e["extra"]["payload"] for e in events["asset_events"]]
            if any(p["kind"] == "stream" for p in payloads):
                streamed.append((run, payloads))
        seed += 1
        produce(cfg.kafka, ui["stream_topic"], 50, transactional_share=0.5, abort_share=0.2, seed=seed)
        time.sleep(5)
    assert streamed, f"the consumer DAG never ran for a stream commit\n{_logs(ui['home'])}"
    run, payloads = min(streamed, key=lambda r: r[0]["start_date"])
    assert all(p["pipeline"] == cfg.name and p["kind"] in ("create", "stream") for p in payloads), payloads
    payloads = [p for p in payloads if p["kind"] == "stream"]

    commits = {h.version: h for h in pipeline_commits(cfg)}
    versions = [v for p in payloads for v in p["versions"]]
    first_commit = min(commits[v].timestamp for v in versions) / 1000
    started = dt.datetime.fromisoformat(run["start_date"].replace("Z", "+00:00")).timestamp()
    assert 0 <= started - first_commit < WITHIN, (run["start_date"], versions)
    for p in payloads:  # each event says exactly which batches: their rows and offset ranges
        named = [commits[v] for v in p["versions"]]
        assert all(h.meta.run.via == "stream" and h.meta.run.dag_id == f"offsetlake__{cfg.name}__stream" for h in named)
        assert p["rows"] == sum(h.meta.records.rows for h in named)
        for topic, parts in p["ranges"].items():
            for partition, (start, end) in parts.items():
                spans = [h.meta.ranges[topic][partition] for h in named if partition in h.meta.ranges.get(topic, {})]
                assert [start, end] == [min(s for s, _ in spans), max(e for _, e in spans)]

    # Every commit from the first one announced on is announced, once.
    announced = sorted(
        v
        for e in api.events("limit=100")
        if e["extra"].get("payload", {}).get("pipeline") == cfg.name
        for v in e["extra"]["payload"]["versions"]
    )
    assert announced == list(range(announced[0], announced[-1] + 1)), announced
    assert_exactly_once(cfg)


def test_the_offsetlake_view_in_a_real_browser_shows_what_status_says(ui, tmp_path):
    from playwright.sync_api import sync_playwright

    api, cfg, env = ui["api"], ui["batch"], ui["env"]
    recovery = f"offsetlake__{cfg.name}__recovery"
    assert api.wait_for_run(recovery, api.trigger(recovery), timeout=600) == "success", _logs(ui["home"])
    for run in api.get(f"/api/v2/dags/{recovery}/dagRuns")["dag_runs"]:  # the @daily one unpausing made too
        assert api.wait_for_run(recovery, run["dag_run_id"], timeout=600) == "success"
    produce(cfg.kafka, ui["batch_topic"], 250, transactional_share=0.5, abort_share=0.2, seed=4)
    base = env["AIRFLOW__API__BASE_URL"]
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{base}/offsetlake/api/pipelines", timeout=30)
    assert anonymous.value.code in (401, 403)  # behind Airflow's login

    status = _cli(env, "status", cfg.name)
    history = _cli(env, "history", cfg.name)[::-1]  # newest first, as the page lists them
    assert sum(p["lag"] for p in status) > 0  # nothing ingests this pipeline now: its lag stays put
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/offsetlake/?pipeline={cfg.name}")
            _log_in(page, stack.USER, stack.password(ui["home"]))  # sent to Airflow's login, then back
            page.wait_for_url("**/offsetlake/**", timeout=60_000)
            view = page.locator(f"section[data-pipeline='{cfg.name}']")
            shown = {
                (row.get_attribute("data-topic"), int(row.get_attribute("data-partition"))): tuple(
                    int(row.get_by_test_id(k).inner_text()) for k in ("committed", "end", "lag")
                )
                for row in view.locator("tr[data-testid=partition]").all()
            }
            assert shown == {(p["topic"], p["partition"]): (p["committed"], p["end"], p["lag"]) for p in status}
            assert int(view.get_by_test_id("total-lag").inner_text()) == sum(p["lag"] for p in status)
            assert view.get_by_test_id("audit").inner_text().startswith("ok")
            commits = view.locator("tr[data-testid=commit]").all()
            assert [
                (
                    int(r.get_attribute("data-version")),
                    r.get_by_test_id("kind").inner_text(),
                    int(r.get_by_test_id("rows").inner_text()),
                    int(r.get_by_test_id("quarantined").inner_text()),
                )
                for r in commits
            ] == [
                (h["version"], h["kind"], h["records"].get("rows", 0), h["records"].get("quarantined", 0))
                for h in history[: len(commits)]
            ]
            assert len(commits) == len(history) < 30  # all of them: 2 from here, 1 from Airflow
            for row, h in zip(commits, history):
                assert row.get_by_test_id("ranges").inner_text() == "; ".join(
                    f"{t}[{p}] {r[0]}-{r[1]}" for t, parts in h["ranges"].items() for p, r in parts.items()
                )
            assert_charts_are_the_ledger(page, view, cfg)
            page.screenshot(path=str(tmp_path / "offsetlake-view.png"), full_page=True)

            # Inside the Airflow UI: the navigation's "offsetlake" item, and the tab on the pipeline's DAGs.
            page.goto(f"{base}/plugin/offsetlake")
            frame = page.frame_locator("iframe")
            frame.locator(f"section[data-pipeline='{cfg.name}']").wait_for(timeout=60_000)
            assert frame.locator(f"section[data-pipeline='{ui['stream'].name}']").count() == 1
            for mode in ("dark", "light"):  # Airflow's colour mode (its setting, kept in localStorage), then back
                page.evaluate("mode => localStorage.setItem('theme', mode)", mode)
                page.reload()
                assert_view_follows_airflows_theme(page, cfg.name, mode)
                page.screenshot(path=str(tmp_path / f"airflow-offsetlake-nav-{mode}.png"))
            ingest_id = f"offsetlake__{cfg.name}__ingest"
            page.goto(f"{base}/dags/{ingest_id}/plugin/offsetlake-dag")
            frame = page.frame_locator("iframe")
            frame.locator(f"section[data-pipeline='{cfg.name}']").wait_for(timeout=60_000)
            assert frame.locator("section[data-testid=pipeline]").count() == 1  # this DAG's pipeline only
            page.screenshot(path=str(tmp_path / "airflow-offsetlake-dag-tab.png"))
        finally:
            browser.close()

    from prometheus_client.parser import text_string_to_metric_families

    assert api.wait_for_run(ingest_id, ui["ingest_run"], timeout=600) == "success"  # its newest finished run
    # The docs' pictures, as `make screenshots` takes them from the demo, here of this Airflow.
    pictures = screenshots.take(base, stack.USER, stack.password(ui["home"]), cfg.name, tmp_path / "pictures")
    assert [p.name for p in pictures] == [
        "offsetlake-view.png",
        "offsetlake-view-dark.png",
        "airflow-dags.png",
        "airflow-run-graph.png",
        "airflow-trigger-form.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in pictures)
    text = urllib.request.urlopen(f"{base}/offsetlake/metrics", timeout=60).read().decode()  # no login: scrapers
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    status = _cli(env, "status", cfg.name)
    for p in status:
        labels = tuple(sorted({"pipeline": cfg.name, "topic": p["topic"], "partition": str(p["partition"])}.items()))
        assert samples[("offsetlake_committed_offset", labels)] == p["committed"]
        assert samples[("offsetlake_lag_records", labels)] == p["lag"]
    assert samples[("offsetlake_pipeline_lag_records", (("pipeline", cfg.name),))] == sum(p["lag"] for p in status)
    assert samples[("offsetlake_up", (("pipeline", cfg.name),))] == 1
    # what the alert rules read: the newest ingest commit's time (the table's history), each DAG's newest
    # finished run (Airflow's), and the thresholds of the pipeline file (defaults here; a stream's floor)
    newest_ingest = max(h["timestamp"] for h in _cli(env, "history", cfg.name) if h["kind"] == "ingest") / 1000
    assert samples[("offsetlake_last_ingest_timestamp_seconds", (("pipeline", cfg.name),))] == newest_ingest
    for dag_id in (ingest_id, recovery):
        assert samples[("offsetlake_last_run_failed", (("dag_id", dag_id), ("pipeline", cfg.name)))] == 0
    assert samples[("offsetlake_alert_max_quarantine_share", (("pipeline", cfg.name),))] == 0.01
    assert ("offsetlake_alert_max_lag_records", (("pipeline", cfg.name),)) not in samples  # none set: never fires
    assert samples[("offsetlake_alert_stall_seconds", (("pipeline", ui["stream"].name),))] == 300
    assert ("offsetlake_alert_stall_seconds", (("pipeline", cfg.name),)) not in samples  # a batch pipeline


def test_a_real_prometheus_scrapes_the_endpoint_with_the_shipped_rules_and_dashboard(ui, tmp_path):
    """Prometheus (Debian's package) scrapes Airflow's /offsetlake/metrics with the rules `offsetlake monitoring
    rules` prints: what it stores is what `status` says, every rule evaluates, and every query of the dashboard
    answers without an error, the lag panel's with each pipeline."""
    env, cfg = ui["env"], ui["batch"]
    base = env["AIRFLOW__API__BASE_URL"]

    def shipped_file(what: str) -> bytes:  # `offsetlake monitoring rules|dashboard`, as a user runs it
        command = [sys.executable, "-m", "offsetlake.cli", "monitoring", what]
        return subprocess.run(command, env=env, capture_output=True, check=True).stdout

    rules = shipped_file("rules")
    (tmp_path / "offsetlake-rules.yml").write_bytes(rules)
    target = base.split("://", 1)[1].split("/", 1)[0]
    (tmp_path / "prometheus.yml").write_text(
        json.dumps(  # YAML takes JSON
            {
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                "rule_files": ["offsetlake-rules.yml"],
                "scrape_configs": [
                    {
                        "job_name": "offsetlake",
                        "metrics_path": "/offsetlake/metrics",
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    pid = processes.start_background(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
        tmp_path / "prometheus.pid",
    )
    prometheus = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list[dict]:
        url = f"{prometheus}/query?{urllib.parse.urlencode({'query': expr})}"
        answer = json.loads(urllib.request.urlopen(url, timeout=30).read())
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    try:
        deadline = time.monotonic() + 180
        lag: list[dict] = []
        while time.monotonic() < deadline and not lag:
            time.sleep(2)
            with contextlib.suppress(OSError):
                lag = query(f'offsetlake_pipeline_lag_records{{pipeline="{cfg.name}"}}')
        assert lag, (tmp_path / "prometheus.log").read_text()[-3000:]
        assert float(lag[0]["value"][1]) == sum(p["lag"] for p in _cli(env, "status", cfg.name))

        def loaded_rules() -> dict[str, dict]:
            groups = json.loads(urllib.request.urlopen(f"{prometheus}/rules", timeout=30).read())["data"]["groups"]
            return {rule["name"]: rule for group in groups for rule in group["rules"]}

        loaded = loaded_rules()
        shipped = {rule["alert"] for group in yaml.safe_load(rules)["groups"] for rule in group["rules"]}
        assert set(loaded) == shipped
        deadline = time.monotonic() + 60  # a rule's health is known once it has been evaluated
        while time.monotonic() < deadline and any(r["health"] == "unknown" for r in loaded.values()):
            time.sleep(2)
            loaded = loaded_rules()
        assert {name: r["health"] for name, r in loaded.items()} == dict.fromkeys(shipped, "ok"), loaded

        dashboard = json.loads(shipped_file("dashboard"))
        for panel in dashboard["panels"]:
            for panel_target in panel["targets"]:
                result = query(panel_target["expr"].replace("$pipeline", ".*"))
                if panel_target["expr"].startswith("offsetlake_pipeline_lag_records"):
                    assert {cfg.name, ui["stream"].name} <= {r["metric"].get("pipeline") for r in result}
    finally:
        processes.stop(pid)


def assert_charts_are_the_ledger(page, view, cfg) -> None:
    """Each chart has a time axis and a value axis with its unit, and its points are the table's ingest commits
    as its Delta log holds them (read here with json), in order."""
    page.wait_for_function("name => (window.offsetlakeCharts || {})[name]?.partition_lag", arg=cfg.name)
    charts = page.evaluate(
        """name => Object.fromEntries(Object.entries(offsetlakeCharts[name]).map(([key, u]) =>
            [key, {data: u.data, labels: u.axes.map(a => a.label)}]))""",
        cfg.name,
    )
    logged = ingest_commits_in_log(cfg.table_path)
    assert len(logged) >= 3  # two before Airflow, one by its ingest DAG
    times = [c["timestamp"] / 1000 for c in logged]
    expected = {
        "lag": [c["lag"] for c in logged],
        "seconds": [c["seconds"] for c in logged],
        "quarantined": [c["records"].get("quarantined", 0) for c in logged],
        "rows_per_second": [round(c["records"].get("rows", 0) / c["seconds"], 1) for c in logged],
    }
    units = {"lag": "lag (records)", "seconds": "seconds", "quarantined": "records", "rows_per_second": "rows/s"}
    for key, values in expected.items():
        assert charts[key]["labels"] == ["time (UTC)", units[key]], key
        assert charts[key]["data"] == [times, values], key
    partitions = view.locator("tr[data-testid=partition]").all()
    assert charts["partition_lag"]["data"][1] == [int(r.get_by_test_id("lag").inner_text()) for r in partitions]
    for figure in view.locator("figure.chart").all():
        assert figure.locator(".u-axis").count() == 2 and figure.locator("canvas").count() == 1


def ingest_commits_in_log(table_path: str) -> list[dict]:
    """The metadata of each ingest commit in the table's log (each commit's userMetadata, and its time)."""
    found = []
    for commit in sorted(Path(table_path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            meta = json.loads(info["userMetadata"]) if info and info.get("userMetadata") else {}
            if meta.get("kind") == "ingest":
                found.append({**meta, "timestamp": info["timestamp"]})
    return found


def assert_view_follows_airflows_theme(page, pipeline: str, mode: str) -> None:
    """Inside the Airflow UI in `mode`, the view is in that mode with Airflow's own colours, and its charts
    are drawn again in them."""
    frame = page.frame_locator("iframe")
    frame.locator(f"section[data-pipeline='{pipeline}'] figure.chart canvas").first.wait_for(timeout=60_000)
    airflow = page.evaluate(
        """() => { const s = getComputedStyle(document.documentElement);
            return {dark: document.documentElement.classList.contains('dark'),
                    bg: s.getPropertyValue('--chakra-colors-bg').trim(),
                    fg: s.getPropertyValue('--chakra-colors-fg').trim()}; }"""
    )
    assert airflow["dark"] == (mode == "dark") and airflow["bg"] and airflow["fg"]
    view = page.locator("iframe").element_handle().content_frame()
    shown = view.evaluate(
        """() => { const s = getComputedStyle(document.documentElement);
            const pixel = document.createElement('canvas').getContext('2d');  // any CSS colour to sRGB
            pixel.fillStyle = getComputedStyle(document.body).backgroundColor; pixel.fillRect(0, 0, 1, 1);
            const rgb = pixel.getImageData(0, 0, 1, 1).data;
            return {theme: document.documentElement.dataset.theme, bg: s.getPropertyValue('--ol-bg').trim(),
                    fg: s.getPropertyValue('--ol-fg').trim(), luminance: (rgb[0] + rgb[1] + rgb[2]) / 765}; }"""
    )
    assert shown["theme"] == mode and (shown["bg"], shown["fg"]) == (airflow["bg"], airflow["fg"])
    assert (shown["luminance"] < 0.3) == (mode == "dark"), shown


def _log_in(page, user: str, password: str) -> None:
    page.wait_for_selector("input[name=username]", timeout=60_000)
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.locator("button[type=submit]").click()


def _cli(env: dict, command: str, pipeline: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "offsetlake.cli", command, "--pipeline", pipeline, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _wait_for_lineage(path, job: str, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        events = [e for e in map(json.loads, lines) if e.get("job", {}).get("name") == job]
        complete = [e for e in events if e.get("eventType") == "COMPLETE"]
        if complete:
            return complete
        time.sleep(2)
    raise AssertionError(f"no COMPLETE OpenLineage event for {job} in {path}")


def _logs(home) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(home.glob("*.log")))
