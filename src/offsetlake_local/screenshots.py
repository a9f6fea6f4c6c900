"""The docs' pictures of the Airflow UI, taken in headless Chromium from a running Airflow: `make screenshots`
takes them from `make demo`'s (its pipelines, its data) into docs/images/.

Each picture: the offsetlake view inside Airflow (light and dark, on the pipeline's ingest or stream DAG), the
DAG list, that DAG's newest run's graph and the backfill DAG's trigger form. The UI tests take the same
pictures of their own Airflow into a temporary directory, so this stays working; only the demo's go into
the docs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from offsetlake_local import stack

CHROMIUM = "/usr/bin/chromium"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEWPORT = {"width": 1400, "height": 1000}


def take(base_url: str, user: str, password: str, pipeline: str, out: Path) -> list[Path]:
    """The pictures of `pipeline` in the Airflow at `base_url`, written into `out`; their paths."""
    from playwright.sync_api import sync_playwright

    api = stack.Api(base_url, user, password)
    dag_id, run_id = _newest_run(api, pipeline)
    backfill = f"offsetlake__{pipeline}__backfill"
    out.mkdir(parents=True, exist_ok=True)
    taken = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{base_url}/dags")
            _log_in(page, user, password)
            for mode, name in (("light", "offsetlake-view.png"), ("dark", "offsetlake-view-dark.png")):
                page.evaluate("mode => localStorage.setItem('theme', mode)", mode)
                page.goto(f"{base_url}/dags/{dag_id}/plugin/offsetlake-dag")
                view = page.frame_locator("iframe").locator("figure.chart canvas").first
                taken.append(_picture(page, view, out / name))
            page.evaluate("() => localStorage.setItem('theme', 'light')")
            page.goto(f"{base_url}/dags")
            taken.append(_picture(page, page.get_by_text(dag_id).first, out / "airflow-dags.png"))
            page.goto(f"{base_url}/dags/{dag_id}/runs/{run_id}")
            page.get_by_title("Show Graph (Press g)").first.click(timeout=60_000)
            taken.append(_picture(page, page.locator(".react-flow__node").first, out / "airflow-run-graph.png"))
            page.goto(f"{base_url}/dags/{backfill}")
            page.get_by_role("button", name="Trigger").first.click(timeout=60_000)
            form = page.get_by_role("dialog").get_by_text("ranges").first
            taken.append(_picture(page, form, out / "airflow-trigger-form.png"))
        finally:
            browser.close()
    return taken


def _newest_run(api: stack.Api, pipeline: str) -> tuple[str, str]:
    """(DAG, run) of the pipeline's newest run that did not fail: its ingest DAG's, else its stream DAG's."""
    for kind in ("ingest", "stream"):
        dag_id = f"offsetlake__{pipeline}__{kind}"
        runs = api.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit=1&state=success&state=running")
        if runs["dag_runs"]:
            return dag_id, runs["dag_runs"][0]["dag_run_id"]
    raise SystemExit(f"screenshots: {pipeline} has no ingest or stream run yet: wait for the demo's first commit")


def _picture(page, shown, path: Path) -> Path:
    """A screenshot once `shown` is on the page, replacing `path` whole (a docs build may be reading it)."""
    shown.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)  # the rest of the page draws (the UI polls its API: the network is never idle)
    partial = path.with_name(f".partial-{path.name}")  # a dot file: the docs build skips it
    page.screenshot(path=str(partial))
    os.replace(partial, path)
    return path


def _log_in(page, user: str, password: str) -> None:
    page.wait_for_selector("input[name=username]", timeout=60_000)
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "/login" not in url, timeout=60_000)


def main(argv: list[str] | None = None) -> int:
    from offsetlake_local import demo

    parser = argparse.ArgumentParser(prog="make screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS_IMAGES, help="where the pictures go (docs/images)")
    args = parser.parse_args(argv)
    home = demo.airflow_home()
    if not (home / "simple_auth_manager_passwords.json").exists():
        print(f"screenshots: no demo Airflow in {home}: run `make demo` first", file=sys.stderr)
        return 1
    base_url = f"http://127.0.0.1:{demo.UI_PORT}"
    for path in take(base_url, stack.USER, stack.password(home), demo.PIPELINE, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
