"""No import cycles among the product's modules, lazy imports included.

A cycle makes a module's meaning depend on which of its partners was imported first,
and it hides the floor plan: two modules that import each other are one module in two
files. The walk reads every module of the packages the wheel carries (setup.cfg's
`packages.find`) and records each import anywhere in it: at the top, inside a function
(a lazy import is still a dependency, only a later one) or under `if TYPE_CHECKING:`.

An edge goes to the module an import names: `from a.b import c` reaches `a.b.c` when that
is a module, else `a.b`; `import a.b` reaches `a.b`. The packages above the importing
module are not counted: Python imports them first whatever the module does, so a
package `__init__` that re-exports its own modules is no cycle.
"""

from __future__ import annotations

import ast
import configparser
from collections.abc import Iterable, Iterator
from fnmatch import fnmatch
from pathlib import Path

from tests.support import REPO

# Cycles known to exist, each allowed only until the change that removes it: an entry is
# the set of modules of one cycle (its strongly connected component). A component found
# here passes while it is one of these or a part of one (a cycle that shrank is progress);
# a new cycle, or one that grew, fails; an entry that matches no cycle any more fails too,
# so none outlives its cycle. Issue 28 removed the last three (accounts <-> checkpoints <->
# journal, accrual -> holds -> limits -> accrual, the payment providers' registry).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def product_packages() -> list[str]:
    """The top-level packages the wheel carries: setup.cfg's `packages.find` include list."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    patterns = config["options.packages.find"]["include"].split()
    return sorted(
        path.parent.name
        for path in REPO.glob("*/__init__.py")
        if any(fnmatch(path.parent.name, pattern) for pattern in patterns)
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    found = {}
    for package in product_packages():
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The product modules `name` (at `path`) imports, anywhere in its body."""
    known = set(modules)
    is_package = path.name == "__init__.py"
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name and m not in ancestors}


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One shortest cycle through the component's first module, as a path back to it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def cycle_problems(graph: dict[str, set[str]], known: dict[frozenset[str], str]) -> list[str]:
    problems = []
    found = components(graph)
    for component in found:
        if not any(component <= cycle for cycle in known):
            problems.append("import cycle: " + " -> ".join(a_cycle(graph, component)))
    for cycle in known:
        if not any(component <= cycle for component in found):
            problems.append(f"known cycle {sorted(cycle)} is gone: delete it from KNOWN_CYCLES")
    return sorted(problems)


def test_the_walk_reads_every_product_package() -> None:
    packages = {name.split(".")[0] for name in product_modules()}
    expected = {"ledger", "gpucredit", "portal", "accounting_bridge", "slurm_hooks", "job_submit"}
    assert expected | {"slurmtext"} <= packages
    assert "slurmbox" not in product_packages()  # the box's root-only harness is not the product


def test_no_import_cycle_among_the_products_modules() -> None:
    assert cycle_problems(import_graph(), KNOWN_CYCLES) == []


def test_a_cycle_is_named_module_by_module() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle_problems(graph, {}) == ["import cycle: a -> b -> c -> a"]
    assert cycle_problems(graph, {frozenset({"a", "b", "c"}): "known"}) == []
    assert cycle_problems(graph, {frozenset({"a", "b", "c", "d"}): "known"}) == []  # shrank: fine
    assert cycle_problems({"a": {"b"}, "b": set()}, {frozenset({"a", "b"}): "known"}) == [
        "known cycle ['a', 'b'] is gone: delete it from KNOWN_CYCLES"
    ]


def test_lazy_imports_and_relative_imports_are_edges(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.a import run\n")
    (package / "a.py").write_text("def run():\n    from . import b\n    return b\n")
    (package / "b.py").write_text("from .a import run\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert cycle_problems(graph, {}) == ["import cycle: pkg.a -> pkg.b -> pkg.a"]
