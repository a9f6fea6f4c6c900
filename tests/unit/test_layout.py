"""The layout the packages' docstrings describe, held: no import cycle among offsetlake's modules (lazy
imports inside functions included), each package imports only what its docstring allows, the layers run
one way (docs/development/layout.md draws them), no module keeps a table's storage on the side, and no
module grows past MAX_LINES unless it is listed with a reason."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
TOPS = ("offsetlake", "offsetlake_local")
MAX_LINES = 450
# Modules allowed past MAX_LINES, each with the reason it is one piece: none today.
LONG_MODULES: dict[str, str] = {}


def import_graph(top: str = "offsetlake") -> dict[str, set[str]]:
    """module -> the offsetlake modules it imports, anywhere in it (a package's `from p import m` is m)."""
    modules = {
        ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (SRC / top).rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in TOPS:
                for alias in node.names:
                    inner = f"{node.module}.{alias.name}"
                    graph[module].add(inner if inner in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[module] |= {a.name for a in node.names if a.name.split(".")[0] in TOPS}
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


def imported_by(package: str) -> set[str]:
    """The modules outside `package` that import it."""
    graph = import_graph()
    inside = (f"offsetlake.{package}", f"offsetlake.{package}.")
    return {
        m for m, targets in graph.items() if not m.startswith(inside) and any(t.startswith(inside) for t in targets)
    }


def test_operations_never_import_the_batch_loops_that_use_them():
    assert not {
        t
        for t in imports_of("operations")
        if t in ("offsetlake.batch", "offsetlake.streaming", "offsetlake.runs", "offsetlake.cli")
    }


def test_the_batch_does_not_import_the_operations_and_only_the_stream_loop_compacts():
    graph = import_graph()
    assert not {t for t in graph["offsetlake.batch"] if t.startswith("offsetlake.operations")}
    assert imported_by("runs") <= {"offsetlake.cli.commands"}  # the front ends call the library, not back


def test_configuration_and_storage_sit_below_everything_that_reads_records_or_talks_to_kafka():
    allowed = ("offsetlake.config", "offsetlake.errors", "offsetlake.storage")
    assert {t for t in imports_of("config") if not t.startswith(allowed)} == set()
    assert {t for t in imports_of("storage") if not t.startswith(("offsetlake.storage", "offsetlake.errors"))} == set()
    assert "pyspark" not in third_party_of("config") | third_party_of("storage")


def test_the_product_package_leaves_the_local_stack_to_the_cli_commands_that_start_it():
    """offsetlake_local (the embedded broker, registry, PostgreSQL, Connect, the demo) imports the product;
    the product imports it only in the `produce` and `broker` commands, which run the local stack."""
    product = import_graph()
    assert {m for m, targets in product.items() if any(t.startswith("offsetlake_local") for t in targets)} <= {
        "offsetlake.cli.commands"
    }


def test_no_module_keeps_storage_options_or_other_mutable_state_at_module_level_in_storage():
    for path in (SRC / "offsetlake" / "storage").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("dict", "list", "set")
            )
            assert not mutable, f"{path.name}:{node.lineno}: module-level mutable state"


def test_no_module_is_longer_than_max_lines_unless_listed_with_a_reason():
    long = {
        str(p.relative_to(SRC)): n
        for top in TOPS
        for p in (SRC / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert {k: n for k, n in long.items() if k not in LONG_MODULES} == {}
    assert set(LONG_MODULES) <= set(long), "a listed module is short again: take it off LONG_MODULES"


def test_the_batch_reaches_its_table_only_through_its_commit_engine():
    """offsetlake.engine is the seam a second commit engine implements: the batch opens, reads, writes and
    commits its table through it, never through delta-rs or the modules that use it."""
    imported = {
        (node.module, alias.name)
        for node in ast.walk(ast.parse((SRC / "offsetlake" / "batch.py").read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    through_the_engine = {
        ("offsetlake.protocol.commit", "commit"),
        ("offsetlake.protocol.commit", "attempt_files"),
        ("offsetlake.protocol.ledger", "read_ledger"),
        ("offsetlake.protocol.quarantine", "commit_quarantine"),
        ("offsetlake.read_job", "run_tasks"),
    }
    assert imported & through_the_engine == set()
    modules = {module for module, _ in imported}
    assert not {m for m in modules if m.startswith(("deltalake", "offsetlake.table", "offsetlake.storage"))}
