"""One boundary for money: outside ledger/, code reads and changes money through the
ledger's public modules only, and ledger/ imports nothing of the packages that use it.

An AST walk over every module outside ledger/ (tests and benchmarks aside: they may
look inside) fails on an import of any other ledger module, on a name a public module
does not publish, and on a ledger table (`*_t`) or private name reached through one.
So the price in force, the rate of a GPU mix, the rounding of a charge, the burn order,
available credit and the caps are found in ledger/ alone.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOT_CHECKED = {"ledger", "tests", "bench", "build", "dist", "docs", "conf", "mk"}

# The public ledger modules, and which of their names other packages may use
# (None: every name in the module's __all__, or every public name without one).
PUBLIC: dict[str, frozenset[str] | None] = {
    "ledger.api": None,  # money: every read and change
    "ledger.jobruns": None,  # the bridge's projections (job_runs, cursors) and bulk hold reads
    "ledger.jobrun_records": None,  # the bridge's one compact read of stored runs per batch
    "ledger.errors": None,
    "ledger.money": frozenset({"format_credits", "parse_credits", "format_rate"}),  # the edge only
    "ledger.timeutil": None,
    "ledger.config": None,
    "ledger.db": None,
    "ledger.schema": None,
    "ledger.cli_support": None,
    "ledger.cli": frozenset({"COMMANDS", "account_group", "limits_group"}),  # the CLI root assembles groups
}
# Packages of this repository; ledger/ imports none of them.
OUR_PACKAGES = {
    "accounting_bridge",
    "gpucredit",
    "job_submit",
    "portal",
    "slurm_hooks",
    "slurmbox",
    "slurmtext",
}


def allowed_names(module: str) -> frozenset[str]:
    listed = PUBLIC[module]
    if listed is not None:
        return listed
    loaded = importlib.import_module(module)
    names = getattr(loaded, "__all__", None) or [n for n in vars(loaded) if not n.startswith("_")]
    return frozenset(n for n in names if not n.endswith("_t"))  # Core tables stay inside


@dataclass(frozen=True)
class Breach:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _ledger_module(name: str) -> bool:
    return name == "ledger" or name.startswith("ledger.")


def breaches(source: str, path: str) -> list[Breach]:
    """Every use of the ledger that goes around its public modules, in one file."""
    tree = ast.parse(source, filename=path)
    found: list[Breach] = []
    aliases: dict[str, str] = {}  # local name -> public ledger module bound to it

    def breach(node: ast.AST, what: str) -> None:
        found.append(Breach(path, getattr(node, "lineno", 0), what))

    def check_name(node: ast.AST, module: str, name: str) -> None:
        if name.startswith("_") or name.endswith("_t") or name not in allowed_names(module):
            breach(node, f"{module}.{name} is not part of the ledger's public surface")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _ledger_module(alias.name):
                    continue
                if alias.name not in PUBLIC:
                    breach(node, f"import {alias.name}: not a public ledger module")
                elif alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    breach(node, f"import {alias.name}: bind it with `from ledger import ...`")
        elif isinstance(node, ast.ImportFrom) and node.module and _ledger_module(node.module):
            if node.level:
                continue
            if node.module == "ledger":
                for alias in node.names:
                    module = f"ledger.{alias.name}"
                    if module not in PUBLIC:
                        breach(node, f"from ledger import {alias.name}: not a public ledger module")
                    else:
                        aliases[alias.asname or alias.name] = module
            elif node.module not in PUBLIC:
                breach(node, f"from {node.module} import ...: not a public ledger module")
            else:
                for alias in node.names:
                    check_name(node, node.module, alias.name)
        elif isinstance(node, ast.Call) and _dynamic_ledger_import(node):
            breach(node, "a ledger module imported by name at run time")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            check_name(node, aliases[node.value.id], node.attr)
    return found


def _dynamic_ledger_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__") or not node.args:
        return False
    first = node.args[0]
    return isinstance(first, ast.Constant) and isinstance(first.value, str) and _ledger_module(first.value)


def modules_outside_ledger() -> Iterator[Path]:
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if parts[0] in NOT_CHECKED or any(part.startswith(".") for part in parts):
            continue
        yield path


def test_the_walk_sees_the_packages_that_use_money() -> None:
    seen = {path.relative_to(REPO).parts[0] for path in modules_outside_ledger()}
    assert {"accounting_bridge", "gpucredit", "job_submit", "slurm_hooks"} <= seen


def test_other_packages_use_only_the_ledgers_public_modules() -> None:
    found = [
        str(b)
        for path in modules_outside_ledger()
        for b in breaches(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert found == []


def test_the_ledger_imports_none_of_the_packages_that_use_it() -> None:
    found = []
    for path in sorted((REPO / "ledger").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            found += [
                f"{path.relative_to(REPO)}:{node.lineno}: {name}"
                for name in names
                if name.split(".")[0] in OUR_PACKAGES
            ]
    assert found == []


NOT_MODULE = ": not a public ledger module"
NOT_PUBLIC = " is not part of the ledger's public surface"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ledger.grants import take_free", "from ledger.grants import ..." + NOT_MODULE),
        ("from ledger.prices import price_at", "from ledger.prices import ..." + NOT_MODULE),
        ("from ledger.limits import check_limits", "from ledger.limits import ..." + NOT_MODULE),
        ("import ledger.holds", "import ledger.holds" + NOT_MODULE),
        ("from ledger import models", "from ledger import models" + NOT_MODULE),
        ("from ledger.money import charge_for", "ledger.money.charge_for" + NOT_PUBLIC),
        ("from ledger import api\napi.entries_t", "ledger.api.entries_t" + NOT_PUBLIC),
        ("from ledger import api\napi._grants.take_free", "ledger.api._grants" + NOT_PUBLIC),
        ("from ledger import api as a\na.lock_account(s, 'x')", "ledger.api.lock_account" + NOT_PUBLIC),
        (
            "import importlib\nimportlib.import_module('ledger.quotes')",
            "a ledger module imported by name at run time",
        ),
    ],
)
def test_each_way_around_the_boundary_is_caught(source: str, expected: str) -> None:
    assert [b.what for b in breaches(source, "x.py")] == [expected]


def test_the_public_ways_pass() -> None:
    source = (
        "from ledger import api, jobruns\n"
        "from ledger.money import format_credits\n"
        "from ledger.errors import LedgerError\n"
        "rate = api.rate_of({'a100': 1}, {'a100': 2_000_000})\n"
        "api.charge_for(rate, 60)\n"
        "jobruns.upsert_job_runs\n"
    )
    assert breaches(source, "x.py") == []
