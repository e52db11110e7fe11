"""The repository's import graph: no cycles, the raft core free of I/O, and the layering of
DESIGN.md (client/ never imports broker/; remoting/ and dledger/ import none of their users).

Read from the source with `ast`, so a cycle hidden in a function-level import counts too;
imports under `if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
IO_MODULES = {
    "trio",
    "socket",
    "os",
    "time",
    "threading",
    "asyncio",
    "subprocess",
    "io",
    "mmap",
    "selectors",
    "datetime",
    "shutil",
    "pathlib",
}  # codecs (msgpack, struct) are not I/O


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name `module` imports at run time, `from a import b` as both a and a.b."""
    is_package = path.name == "__init__.py"
    stack: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in imported_names(module, path):
            # the longest project module the name starts with (a.b.func -> a.b)
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            target = ".".join(parts)
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)  # a module importing its own package is no cycle
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the walk found the packages"
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_a_function_level_import_counts(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from pkg import other\n")
    assert "pkg.other" in set(imported_names("pkg.m", path))


def test_a_type_checking_import_does_not(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.other\n")
    assert "pkg.other" not in set(imported_names("pkg.m", path))


def test_the_raft_core_does_no_io() -> None:
    modules = module_files()
    for module, path in modules.items():
        if not module.startswith("dledger.raft") or module.startswith("dledger.raft.sim"):
            continue
        roots = {name.split(".")[0] for name in imported_names(module, path)}
        assert not roots & IO_MODULES, f"{module} imports {sorted(roots & IO_MODULES)}"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("client", {"broker", "namesrv", "chaos", "spark"}),
        ("remoting", {"broker", "namesrv", "client", "dledger"}),
        (
            "netio",
            {"dledger", "remoting", "broker", "namesrv", "client", "devcluster", "chaos", "spark"},
        ),
        # the log: what the broker is built on (dledger-dev, on top of both, is devcluster/)
        ("dledger", {"broker", "namesrv", "client", "remoting", "devcluster", "chaos", "spark"}),
    ],
)
def test_layering(package: str, forbidden: set[str]) -> None:
    graph = import_graph()
    for module, targets in graph.items():
        if module == package or module.startswith(package + "."):
            bad = {t for t in targets if t.split(".")[0] in forbidden}
            assert not bad, f"{module} imports {sorted(bad)}"
