"""The docs site as a reader opens it: built with `mkdocs build --strict` (no broken link or missing page),
served from 127.0.0.1 with every request anywhere else refused (offline, air-gapped), in Chromium: each
Mermaid diagram is drawn, by the Mermaid served with the site (docs/assets.py), its labels at a size one
can read, in light and in dark."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "docs"))
import assets  # noqa: E402 - docs/assets.py

CHROMIUM = "/usr/bin/chromium"
LEGIBLE_PX = 12  # the smallest label a diagram may show, as drawn on the page
# Playwright reads into open shadow roots only; Material draws each diagram into a closed one.
OPEN_SHADOWS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) { return attach.call(this, { ...init, mode: "open" }); };
"""
# Per diagram on the page: the smallest font size of its labels as drawn (font size times the SVG's scale).
LABEL_SIZES = """
() => [...document.querySelectorAll("div.mermaid")].map((host) => {
  const svg = host.shadowRoot && host.shadowRoot.querySelector("svg");
  if (!svg) return 0;
  const box = svg.viewBox.baseVal;
  const scale = box && box.width ? svg.getBoundingClientRect().width / box.width : 1;
  const labels = [...svg.querySelectorAll(".nodeLabel, .edgeLabel, text")].filter((e) => e.textContent.trim());
  if (!labels.length) return 0;
  return Math.min(...labels.map((e) => parseFloat(getComputedStyle(e).fontSize) * scale));
})
"""


def diagram_pages() -> dict[str, int]:
    """Each page's path on the site, with the number of diagrams its Markdown holds."""
    pages = {}
    for page in sorted((REPO / "docs").rglob("*.md")):
        count = len(re.findall(r"^```mermaid$", page.read_text(), flags=re.MULTILINE))
        if count:
            relative = page.relative_to(REPO / "docs").with_suffix("")
            pages["" if relative.name == "index" else f"{relative.as_posix()}/"] = count
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    assets.bundle_mermaid()
    built = tmp_path_factory.mktemp("site")
    subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-q", "-d", str(built)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=600,
    )
    assert (built / "reference" / "pipeline" / "index.html").exists()  # and --strict: no broken link, no missing page
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_diagram_is_drawn_offline_with_labels_one_can_read(site, scheme):
    from playwright.sync_api import sync_playwright

    pages = diagram_pages()
    assert pages, "the docs have diagrams"
    refused: list[str] = []

    def only_the_site(route):
        if route.request.url.startswith(site):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(color_scheme=scheme, viewport={"width": 1280, "height": 900})
            page.add_init_script(OPEN_SHADOWS)
            page.route("**/*", only_the_site)
            for path, count in pages.items():
                page.goto(site + path)
                drawn = "n => [...document.querySelectorAll('div.mermaid')].filter(d => d.shadowRoot).length === n"
                page.wait_for_function(drawn, arg=count, timeout=60_000)
                assert page.locator("pre.mermaid").count() == 0, path  # no diagram left as its source text
                sizes = page.evaluate(LABEL_SIZES)
                assert len(sizes) == count and min(sizes) >= LEGIBLE_PX, (path, sizes)
        finally:
            browser.close()
    assert not [url for url in refused if "mermaid" in url], refused  # the site's own Mermaid, not a CDN's
