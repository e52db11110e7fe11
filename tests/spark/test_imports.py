"""The audit's modules import each other without a cycle, and its commands name functions that
exist (the prepare command moved from spark/jvm_archive.py to spark/prepare.py to end one)."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

SPARK = Path(__file__).parents[2] / "spark"
PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def imported_modules(path: Path) -> set[str]:
    """The spark.* modules a file imports anywhere, in a function body too: an import put off
    into a function is still a cycle a reader has to untangle."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("spark.")}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "spark":
                out |= {f"spark.{a.name}" for a in node.names}
            elif node.module.startswith("spark."):
                out.add(node.module)
    return out


def import_graph() -> dict[str, set[str]]:
    return {f"spark.{p.stem}": imported_modules(p) for p in SPARK.glob("*.py")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (cycle := visit(other)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_audit_s_modules_import_each_other_without_a_cycle() -> None:
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()) or [])


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_archive_lookup_does_not_import_the_session() -> None:
    assert "spark.session" not in imported_modules(SPARK / "jvm_archive.py")


def test_every_audit_command_names_a_function_that_exists() -> None:
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    for name in ("dledger-audit", "dledger-audit-prepare"):
        module, function = scripts[name].split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def _top_level_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_the_audit_reads_no_file_through_the_code_that_wrote_it() -> None:
    """spark/ parses the log's and the broker's formats itself (spark/formats.py,
    spark/broker_formats.py): it never imports dledger/, broker/ or remoting/."""
    for path in sorted(SPARK.glob("*.py")):
        writers = _top_level_imports(path) & {"dledger", "broker", "remoting"}
        assert not writers, f"{path.name} imports {sorted(writers)}"
