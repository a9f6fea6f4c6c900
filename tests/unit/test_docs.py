"""The docs site and the references generated from the code: current, buildable with --strict, and the
pipeline files (the examples and every complete pipeline a page shows) valid against the generated schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docs"))
import generate  # noqa: E402 - docs/generate.py

DOCS = REPO / "docs"
HEADER = "# yaml-language-server: $schema=../../docs/reference/pipeline.schema.json"


def test_the_generated_reference_pages_are_what_the_code_gives():
    assert generate.stale() == [], "run `make docs` and commit docs/reference/"


def test_the_site_builds_with_no_broken_link_or_missing_page(tmp_path):
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-d", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "reference" / "pipeline" / "index.html").exists()


def pipelines_in_docs() -> list[tuple[str, dict]]:
    """Every YAML block of the docs and the README that is a whole pipeline file (it has a name and topics)."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and {"name", "topics"} <= doc.keys():
                found.append((str(page.relative_to(REPO)), doc))
    return found


def test_every_example_pipeline_carries_the_schema_header_and_is_valid_against_it():
    schema = generate.pages()["reference/pipeline.schema.json"]
    validator = jsonschema.Draft202012Validator(yaml.safe_load(schema))
    examples = sorted((REPO / "include" / "pipelines").glob("*.yaml"))
    assert examples
    for path in examples:
        text = path.read_text()
        assert text.startswith(HEADER + "\n"), f"{path.name}: no yaml-language-server header"
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(text))]
        assert not errors, f"{path.name}: {errors}"
    for page, doc in pipelines_in_docs():
        errors = [e.message for e in validator.iter_errors(doc)]
        assert not errors, f"a pipeline in {page}: {errors}"


def test_the_readme_shows_a_pipeline_and_the_loader_takes_it(tmp_path, monkeypatch):
    from offsetlake.config import load_pipeline

    [(_, doc)] = [(page, doc) for page, doc in pipelines_in_docs() if page == "README.md"]
    (tmp_path / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KAFKA_USER", "u")
    monkeypatch.setenv("KAFKA_PASSWORD", "p")
    assert load_pipeline(doc["name"], tmp_path).topics == doc["topics"]


def test_offsetlake_schema_prints_the_generated_schema(capsys):
    import json

    from offsetlake.cli import main

    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(generate.pages()["reference/pipeline.schema.json"])


def test_the_schema_refuses_what_the_loader_refuses():
    validator = jsonschema.Draft202012Validator(yaml.safe_load(generate.pages()["reference/pipeline.schema.json"]))
    good = yaml.safe_load((REPO / "include" / "pipelines" / "demo_events.yaml").read_text())
    assert not list(validator.iter_errors(good))
    assert list(validator.iter_errors({**good, "tpoics": ["x"]}))  # a misspelt key
    assert list(validator.iter_errors({**good, "on_data_loss": "ignore"}))  # a value not allowed
    assert list(validator.iter_errors({**good, "batch": {"max_records_per_batch": "many"}}))  # a wrong type


def test_every_snippet_include_is_intact_and_names_a_file_that_exists():
    """`--8<-- "file"` lines (pymdownx.snippets): a formatter that took one for Python would leave text the
    build keeps silently; each names a file under docs/examples/ or the repository."""
    includes = []
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        assert "8 < --" not in text, f"{page}: a snippet include was reformatted"
        includes += re.findall(r'^--8<-- "([^":]+)', text, flags=re.M)
    assert includes, "no page includes a snippet"
    for name in includes:
        assert (DOCS / "examples" / name).is_file() or (DOCS.parent / name).is_file(), name
