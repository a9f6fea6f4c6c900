"""The layout the packages' docstrings describe, held: no import cycle among offsetlake's modules (lazy
imports inside functions included), and each package imports only what its docstring allows."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def import_graph() -> dict[str, set[str]]:
    """module -> the offsetlake modules it imports, anywhere in it (a package's `from p import m` is m)."""
    modules = {
        ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (SRC / "offsetlake").rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "offsetlake":
                for alias in node.names:
                    inner = f"{node.module}.{alias.name}"
                    graph[module].add(inner if inner in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[module] |= {a.name for a in node.names if a.name.split(".")[0] == "offsetlake"}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def imports_of(package: str) -> set[str]:
    graph = import_graph()
    return {t for m, targets in graph.items() if m.startswith(f"offsetlake.{package}") for t in targets}


def third_party_of(package: str) -> set[str]:
    names = set()
    for path in (SRC / "offsetlake" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
    return names


def test_the_protocol_core_imports_no_spark_airflow_read_path_or_operations():
    assert not {
        t
        for t in imports_of("protocol")
        if t.startswith(("offsetlake.read", "offsetlake.operations", "offsetlake.spark", "offsetlake.airflow"))
    }
    assert not {"pyspark", "airflow"} & third_party_of("protocol")


def test_what_runs_in_executors_never_imports_deltalake():
    # delta-rs panics in a forked Python worker; the read path and the formats run in Spark's workers.
    assert "deltalake" not in third_party_of("read") | third_party_of("formats")
    assert not {t for t in imports_of("read") | imports_of("formats") if t in ("offsetlake.table",)}


def test_spark_set_up_imports_nothing_else_of_offsetlake():
    assert {t for t in imports_of("spark") if not t.startswith("offsetlake.spark")} == set()


def test_test_files_have_unique_names():
    """pytest imports test files by their base name (no packages under tests/): two of one name in different
    folders make the second an error at collection."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
