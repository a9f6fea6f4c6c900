"""The docs site's JavaScript, fetched from npm when the site is built and never committed: Mermaid, whose
version docs/package.json pins, served with the site so that its diagrams draw offline, behind a proxy or
air-gapped (Material for MkDocs loads Mermaid from a CDN unless the page already has it).

`python docs/assets.py` puts `docs/javascripts/mermaid.min.js` in place (git ignores it); `make docs` and the
docs test run it. `npm pack` fetches the release's tarball once per version, checked against the registry's
integrity hash, into the cache the JVM artifacts share (`~/.cache/offsetlake/npm/`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
MERMAID = DOCS / "javascripts" / "mermaid.min.js"
BUNDLE = "package/dist/mermaid.min.js"  # the browser build: it defines the `mermaid` global Material looks for


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offsetlake" / "npm"


def mermaid_version() -> str:
    return json.loads((DOCS / "package.json").read_text())["dependencies"]["mermaid"]


def bundle_mermaid() -> Path:
    """The pinned Mermaid's browser build at `docs/javascripts/mermaid.min.js`, fetched once per version."""
    version = mermaid_version()
    cached = cache_root() / f"mermaid-{version}.min.js"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.partial")
        partial.write_bytes(_fetch(f"mermaid@{version}"))
        os.replace(partial, cached)
    if not MERMAID.exists() or MERMAID.read_bytes() != cached.read_bytes():
        MERMAID.parent.mkdir(exist_ok=True)
        shutil.copyfile(cached, MERMAID)
    return MERMAID


def _fetch(spec: str) -> bytes:
    if shutil.which("npm") is None:
        raise SystemExit(f"npm is missing: the docs site's {spec} comes from npm (apt-get install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        packed = subprocess.run(
            ["npm", "pack", spec, "--pack-destination", tmp, "--json", "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if packed.returncode != 0:
            raise SystemExit(f"npm pack {spec} failed: {packed.stderr.strip()[-500:]}")
        [tarball] = Path(tmp).glob("*.tgz")
        with tarfile.open(tarball) as tar:
            member = tar.extractfile(BUNDLE)
            if member is None:
                raise SystemExit(f"{spec}: no {BUNDLE} in its tarball")
            return member.read()


if __name__ == "__main__":
    print(bundle_mermaid())
