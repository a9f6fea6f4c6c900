"""The docs and the references generated from the code: current, and the pipeline files (the examples and
every complete pipeline a page shows) valid against the generated schema. The site's build and its
diagrams in a browser: tests/integration/test_docs_site.py."""

from __future__ import annotations

import re
import shlex
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


def pipelines_in_docs() -> list[tuple[str, dict]]:
    """Every YAML block of the docs and the README that is a whole pipeline file (it has a name and topics)."""
    docs = [(page, yaml.safe_load(block)) for page, block in blocks_in_docs("yaml")]
    return [(page, doc) for page, doc in docs if isinstance(doc, dict) and {"name", "topics"} <= doc.keys()]


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


def blocks_in_docs(*languages: str) -> list[tuple[str, str]]:
    """Every code block of those languages written on a page (the README's and the docs'), not included."""
    found = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for language, block in re.findall(r"```(\w*)\n(.*?)```", page.read_text(), flags=re.S):
            if language in languages and "--8<--" not in block:
                found.append((str(page.relative_to(REPO)), block))
    return found


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, a console's `$ ` prompt and comments dropped."""
    lines = block.replace("\\\n", " ").splitlines()
    commands = [line[2:] if line.startswith("$ ") else line for line in lines if not line.startswith((" ", "\t"))]
    return [_before_redirection(words) for words in (shlex.split(c, comments=True) for c in commands) if words]


def _before_redirection(words: list[str]) -> list[str]:
    """A command's own words: what a `>`, `|` or `&&` hands its output to is another command."""
    cut = next((i for i, word in enumerate(words) if word in {">", ">>", "|", "&&", ";"}), len(words))
    return words[:cut]


def test_every_offsetlake_and_make_command_a_page_shows_is_one_the_code_takes(capsys):
    from offsetlake.cli.arguments import build_parser

    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))
    checked = 0
    for page, block in blocks_in_docs("sh", "console"):
        for words in shell_commands(block):
            if words[0] == "offsetlake":
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit as exit:
                    if exit.code == 0:  # --help
                        continue
                    raise AssertionError(f"{page}: `{shlex.join(words)}`: {capsys.readouterr().err}") from None
                checked += 1
            elif words[0] == "make":
                assert set(w for w in words[1:] if "=" not in w) <= targets, f"{page}: `{shlex.join(words)}`"
                checked += 1
    assert checked > 20


def test_every_key_of_a_pipeline_fragment_a_page_shows_is_a_key_of_the_pipeline_file():
    schema = yaml.safe_load(generate.pages()["reference/pipeline.schema.json"])
    # a block whose first line names another file than a pipeline's (`# prometheus.yml`) is that file
    fragments = [
        (page, yaml.safe_load(block))
        for page, block in blocks_in_docs("yaml")
        if not re.match(r"# [\w.-]+\.ya?ml\n", block) or block.startswith("# include/pipelines/")
    ]
    assert len(fragments) > 5
    for page, fragment in fragments:
        unknown = _unknown_keys(fragment, schema, schema)
        assert not unknown, f"{page}: keys the pipeline file does not have: {unknown}"


def _unknown_keys(value, node: dict, root: dict, path: str = "") -> list[str]:
    """The keys of `value` (at any depth) that the JSON Schema `node` does not define."""
    node = _resolved(node, root)
    alternatives = node.get("anyOf") or node.get("oneOf")
    if alternatives:  # a key is known if one alternative knows it
        found = [_unknown_keys(value, alt, root, path) for alt in alternatives if _is_object(alt, root)]
        return min(found, key=len) if found else []
    if not isinstance(value, dict) or not _is_object(node, root):
        return []
    unknown = []
    for key, inner in value.items():
        if key in node.get("properties", {}):
            unknown += _unknown_keys(inner, node["properties"][key], root, f"{path}{key}.")
        elif not node.get("additionalProperties"):
            unknown.append(f"{path}{key}")
    return unknown


def _is_object(node: dict, root: dict) -> bool:
    node = _resolved(node, root)
    return node.get("type") == "object" or "properties" in node


def _resolved(node: dict, root: dict) -> dict:
    """The schema a `$ref` names (the generated schema's refs are all `#/$defs/<name>`), or `node` itself."""
    return root["$defs"][node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else node


def test_the_delta_spark_the_docs_name_is_the_one_the_tests_resolve():
    """The docs' Spark session asks Maven Central for the delta-spark release the POM pins for the tests."""
    pom = (REPO / "src" / "offsetlake_local" / "poms" / "delta-spark.xml").read_text()
    line, version = (re.search(rf"<{p}>([^<]+)</{p}>", pom).group(1) for p in ("spark.line", "delta.version"))
    session = (DOCS / "examples" / "integrations" / "spark_session.py").read_text()
    assert f'"io.delta:delta-spark_{line}_2.13:{version}"' in session


def test_the_prerequisites_the_readme_and_getting_started_name_are_the_packages_make_installs():
    """The demo's packages, then the five more `make test` needs (the docs' npm among them), as
    .ci/system-packages.sh checks them."""
    script = (REPO / ".ci" / "system-packages.sh").read_text()
    product, rest = script.split('case "${1:-}" in docs | tests)', 1)
    docs_line, tests_only = rest.split('if [ "${1:-}" = tests ]', 1)
    tests_only = tests_only.split("\nfi\n", 1)[0]
    demo, docs, tests_only_packages = (
        set(re.findall(r"missing\+=\(([\w.-]+)\)", part)) for part in (product, docs_line, tests_only)
    )
    assert (len(demo), docs, len(tests_only_packages)) == (6, {"npm"}, 4), (demo, docs, tests_only_packages)
    for page in (REPO / "README.md", DOCS / "getting-started.md"):
        text = " ".join(page.read_text().split())
        shown = text[text.index("**Prerequisites:**") :].split("`make` installs", 1)[0]
        demo_part, test_part = shown.split("`make test` needs five more", 1)
        assert "six Debian packages" in demo_part, page
        assert set(re.findall(r"`([\w.-]+)`", demo_part)) == demo, page
        assert set(re.findall(r"`([\w.-]+)`", test_part)) - {"make docs"} == tests_only_packages | docs, page


def test_the_capture_how_to_configures_what_the_tested_chain_configures():
    """The PostgreSQL, Connect worker and connector settings the how-to shows are those the CDC tests run
    with (offsetlake_local.postgres and .connect): each key, and each value that is not the reader's own."""
    from offsetlake_local import connect, postgres

    page = (DOCS / "how-to" / "capture-postgresql.md").read_text()
    blocks = re.findall(r"```(?:ini|properties)\n(.*?)```", page, flags=re.S)
    settings = [dict(_setting(line) for line in b.splitlines() if line.strip() and line[0] != "#") for b in blocks]
    server, worker, shown = settings
    assert server == postgres.LOGICAL_DECODING
    tested = connect.debezium_postgres(
        "db.example.com", 5432, "debezium", "shop", "pg", ["shop"], heartbeat_table="shop.heartbeat"
    )
    readers_own = {"database.password", "heartbeat.interval.ms"}  # a secret; the tests' 1 s beats quicker
    assert {k: v for k, v in shown.items() if k not in readers_own} == {
        k: v for k, v in tested.items() if k in shown and k not in readers_own
    }
    assert set(shown) <= set(tested) and set(tested) - set(shown) <= {"tasks.max"}
    assert worker == connect.converters(schemas_enable=True)


def _setting(line: str) -> tuple[str, str]:
    key, _, value = line.partition("=")
    return key.strip(), value.split("#", 1)[0].strip()


def test_the_release_notes_newest_version_is_the_packages():
    """The release notes (CHANGELOG.md, included by the site's page) name the version pyproject.toml builds."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    releases = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert releases and releases[0] == version, (releases, version)


# How a lab notebook speaks, not a product page: its runs, its machine, its verdicts on targets, its issues.
NOTEBOOK_PHRASES = (
    r"\bissue \d+",
    r"this run's",
    r"an earlier run",
    r"stand-in broker",
    r"this machine",
    r"\bnot met\b",
    r": met\b",
    r"\(noida-db\)",
    r"it now starts",
)


def test_product_pages_speak_of_the_product_not_of_how_it_was_built():
    """History and how a figure came about go to docs/development/; a product page states what is."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if "development" in page.relative_to(DOCS).parts or page.name == "changelog.md":
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            found += [f"{page.relative_to(DOCS)}:{number}: {p}" for p in NOTEBOOK_PHRASES if re.search(p, line, re.I)]
    assert not found, "\n".join(found)
