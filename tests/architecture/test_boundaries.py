"""One boundary for money: outside ledger/, code reads and changes money through the
ledger's public modules only, and ledger/ imports nothing of the packages that use it.

An AST walk over every module outside ledger/ (tests and benchmarks aside: they may
look inside) fails on an import of any other ledger module, on a name a public module
does not publish, and on a ledger table (`*_t`) or private name reached through one.
So the price in force, the rate of a GPU mix, the rounding of a charge, the burn order,
available credit and the caps are found in ledger/ alone.

The floor plan (FLOOR_PLAN) is the same idea one level up: which package, bridge
sub-package or the daemon may import which, lazy imports included, so each process and
each external system keeps one home and arrows point toward ledger/. Inside ledger/ it
draws the layers: the store at the bottom, then the books, the limits, pricing, the hold
rules, and the read models, with ledger.api over them all.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

NOT_CHECKED = {"ledger", "tests", "bench", "build", "dist", "docs", "conf", "mk"}

# The public ledger modules, and which of their names other packages may use
# (None: every name in the module's __all__, or every public name without one).
PUBLIC: dict[str, frozenset[str] | None] = {
    "ledger.api": None,  # money: every read and change
    "ledger.jobs.jobruns": None,  # the bridge's projections (job_runs, cursors) and bulk hold reads
    "ledger.jobs.jobrun_records": None,  # the bridge's one compact read of stored runs per batch
    "ledger.jobs.retries": None,  # jobs' retry policies: the portal keeps them, the daemon acts
    "ledger.jobs.staging": None,  # jobs' data: the portal keeps the paths, the daemon answers nodes
    "ledger.errors": None,
    "ledger.money": frozenset({"format_credits", "parse_credits", "format_rate"}),  # the edge only
    "ledger.timeutil": None,
    "ledger.config": None,
    "ledger.store.db": None,
    "ledger.store.schema": None,
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


def _ledger_package(name: str) -> bool:
    """`ledger` or one of its sub-packages (whose names are modules, not functions)."""
    return (REPO / name.replace(".", "/") / "__init__.py").is_file()


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
            if _ledger_package(node.module):  # `from ledger.jobs import jobruns`: modules by name
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    if module not in PUBLIC:
                        breach(node, f"from {node.module} import {alias.name}: not a public ledger module")
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
        ("from ledger.books.grants import take_free", "from ledger.books.grants import ..." + NOT_MODULE),
        ("from ledger.pricing.prices import price_at", "from ledger.pricing.prices import ..." + NOT_MODULE),
        ("from ledger.limits.rules import check_limits", "from ledger.limits.rules import ..." + NOT_MODULE),
        ("import ledger.holds.create", "import ledger.holds.create" + NOT_MODULE),
        ("from ledger import models", "from ledger import models" + NOT_MODULE),
        ("from ledger.books import grants", "from ledger.books import grants" + NOT_MODULE),
        ("from ledger.money import charge_for", "ledger.money.charge_for" + NOT_PUBLIC),
        ("from ledger import api\napi.entries_t", "ledger.api.entries_t" + NOT_PUBLIC),
        ("from ledger import api\napi._grants.take_free", "ledger.api._grants" + NOT_PUBLIC),
        ("from ledger import api as a\na.lock_account(s, 'x')", "ledger.api.lock_account" + NOT_PUBLIC),
        (
            "import importlib\nimportlib.import_module('ledger.pricing.quotes')",
            "a ledger module imported by name at run time",
        ),
    ],
)
def test_each_way_around_the_boundary_is_caught(source: str, expected: str) -> None:
    assert [b.what for b in breaches(source, "x.py")] == [expected]


def test_the_public_ways_pass() -> None:
    source = (
        "from ledger import api\n"
        "from ledger.jobs import jobruns\n"
        "from ledger.money import format_credits\n"
        "from ledger.errors import LedgerError\n"
        "rate = api.rate_of({'a100': 1}, {'a100': 2_000_000})\n"
        "api.charge_for(rate, 60)\n"
        "jobruns.upsert_job_runs\n"
    )
    assert breaches(source, "x.py") == []


# --------------------------------------------------------------------------- the floor plan

# Which of this repository's packages each one may import, lazy imports included. A
# sub-package of the bridge, and the daemon, count as their own: each process and each
# external system has one home, and arrows point toward ledger/ and slurmtext/. A module
# belongs to the longest name here that it starts with. Other packages see the ledger as
# one unit, "ledger" (which of its modules they may use is PUBLIC's business); inside it,
# each sub-package is a layer that imports only the layers below it.
FLOOR_PLAN: dict[str, frozenset[str]] = {
    # The ledger's base modules (errors, money, timeutil, config), which every layer uses.
    "ledger": frozenset(),
    "ledger.store": frozenset({"ledger"}),  # tables, engines, schema, bulk writes, sums
    "ledger.books": frozenset({"ledger", "ledger.store"}),  # journal, accounts, grants, balances
    "ledger.limits": frozenset({"ledger", "ledger.store", "ledger.books"}),  # caps and their rules
    "ledger.pricing": frozenset({"ledger", "ledger.store", "ledger.books", "ledger.limits"}),
    "ledger.holds": frozenset({"ledger", "ledger.store", "ledger.books", "ledger.limits", "ledger.pricing"}),
    "ledger.views": frozenset({"ledger", "ledger.store", "ledger.books", "ledger.pricing", "ledger.holds"}),
    "ledger.jobs": frozenset({"ledger", "ledger.store", "ledger.pricing"}),  # job runs, retry policies
    "ledger.access": frozenset({"ledger", "ledger.store", "ledger.books"}),  # roles, logins, tokens
    "ledger.api": frozenset(
        {
            "ledger",
            "ledger.store",
            "ledger.books",
            "ledger.limits",
            "ledger.pricing",
            "ledger.holds",
            "ledger.views",
            "ledger.access",
        }
    ),
    "ledger.cli_support": frozenset({"ledger", "ledger.store"}),
    "ledger.cli": frozenset({"ledger", "ledger.api", "ledger.cli_support", "ledger.store", "ledger.views"}),
    "slurmtext": frozenset(),
    "slurm_hooks": frozenset({"slurmtext"}),  # hook processes: the stdlib and slurmtext only
    "slurm_hooks.admin": frozenset({"slurm_hooks", "ledger", "slurmtext"}),  # slurm config|install
    "job_submit": frozenset({"ledger", "slurmtext"}),  # the daemon's answer to job_submit.lua
    "accounting_bridge": frozenset(),  # its __init__: a docstring
    "accounting_bridge.slurm": frozenset({"slurmtext"}),  # Slurm's commands and records
    "accounting_bridge.cli_support": frozenset({"accounting_bridge.slurm", "ledger"}),
    "accounting_bridge.sacct": frozenset(
        {"accounting_bridge.slurm", "accounting_bridge.cli_support", "ledger"}
    ),
    "accounting_bridge.meter": frozenset({"accounting_bridge.slurm", "ledger", "slurmtext"}),
    "accounting_bridge.nvml": frozenset({"ledger"}),
    "accounting_bridge.sync": frozenset(
        {"accounting_bridge.slurm", "accounting_bridge.cli_support", "ledger", "slurmtext"}
    ),
    "accounting_bridge.outage": frozenset({"accounting_bridge.cli_support", "ledger", "slurm_hooks"}),
    "accounting_bridge.cli": frozenset({"accounting_bridge.sacct", "accounting_bridge.meter"}),
    # Cloud nodes: the provider's API, Slurm's power-saving programs, the instances' bill.
    "accounting_bridge.cloud": frozenset({"accounting_bridge.slurm", "ledger", "slurmtext"}),
    "gpucredit.daemon": frozenset(
        {
            "accounting_bridge.slurm",
            "accounting_bridge.sync",  # the limits keeper runs the limits sync
            "accounting_bridge.outage",  # the outage keeper runs the read-back
            "accounting_bridge.nvml",  # the agents' receiver writes the GPU nodes' samples
            "job_submit",
            "ledger",
            "slurm_hooks",
            "slurmtext",
        }
    ),
    "gpucredit.examples": frozenset(),  # `gpucredit example`: files to copy, and click
    # The CLI root assembles every package's commands; `make demo` serves the portal.
    "gpucredit": frozenset(
        {
            "accounting_bridge.cli",
            "accounting_bridge.cloud",
            "accounting_bridge.nvml",
            "accounting_bridge.outage",
            "accounting_bridge.sync",
            "gpucredit.daemon",
            "gpucredit.examples",
            "ledger",
            "portal",
            "slurm_hooks",
            "slurm_hooks.admin",
        }
    ),
    "portal": frozenset({"ledger", "slurmtext"}),  # portal.jobs reads squeue/sacct with slurmtext
    # the box installs the hooks as an admin would; its cloud nodes boot when the provider runs them
    "slurmbox": frozenset({"slurm_hooks.admin", "accounting_bridge.cloud"}),
}


def unit_of(module: str, seen_from: str | None = None) -> str | None:
    """The floor plan's name for `module`: the longest one it is or starts with; from a
    unit outside the ledger (`seen_from`), any of the ledger's is "ledger"."""
    found = [name for name in FLOOR_PLAN if module == name or module.startswith(name + ".")]
    unit = max(found, key=len) if found else None
    if unit is not None and seen_from is not None and _in_ledger(unit) and not _in_ledger(seen_from):
        return "ledger"
    return unit


def _in_ledger(unit: str) -> bool:
    return unit == "ledger" or unit.startswith("ledger.")


def imported_units(source: str, path: str, seen_from: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, unit) of every import of one of our packages, anywhere in the module."""
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            unit = unit_of(name, seen_from)
            if unit is not None:
                yield node.lineno, unit


def floor_plan_breaches(source: str, path: str, module: str) -> list[str]:
    own = unit_of(module)
    allowed = FLOOR_PLAN[own] if own is not None else frozenset()
    return [
        f"{path}:{line}: {own} imports {unit}"
        for line, unit in imported_units(source, path, own)
        if unit != own and unit not in allowed
    ]


def product_modules() -> Iterator[tuple[Path, str]]:
    for package in sorted({name.split(".")[0] for name in FLOOR_PLAN}):
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_each_package_imports_only_what_the_floor_plan_allows() -> None:
    found = [
        breach
        for path, module in product_modules()
        for breach in floor_plan_breaches(
            path.read_text(encoding="utf-8"), str(path.relative_to(REPO)), module
        )
    ]
    assert found == []


def test_every_sub_package_of_the_bridge_and_the_daemon_has_a_row() -> None:
    """A new sub-package gets its own row (its arrows), not its parent's."""
    packages = {
        ".".join(path.parent.relative_to(REPO).parts)
        for top in ("accounting_bridge", "gpucredit")
        for path in (REPO / top).rglob("__init__.py")
    }
    assert packages - set(FLOOR_PLAN) == set()


def test_every_sub_package_of_the_ledger_has_a_row() -> None:
    """A new layer of the ledger gets its own row (what it may import)."""
    packages = {f"ledger.{path.parent.name}" for path in (REPO / "ledger").glob("*/__init__.py")}
    assert packages - set(FLOOR_PLAN) == set()
    assert {"ledger.store", "ledger.books", "ledger.holds"} <= packages


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "ledger.store.tables",
            "from ledger.books.journal import REVENUE",
            ["x.py:1: ledger.store imports ledger.books"],
        ),
        (
            "ledger.books.journal",
            "def f():\n    from ledger.holds.state import get_hold",
            ["x.py:2: ledger.books imports ledger.holds"],
        ),
        (
            "ledger.pricing.quotes",
            "from ledger.holds import keyed",
            ["x.py:1: ledger.pricing imports ledger.holds"],
        ),
        (
            "ledger.holds.create",
            "from ledger.views import reports",
            ["x.py:1: ledger.holds imports ledger.views"],
        ),
        ("ledger.books.grants", "from ledger import api", ["x.py:1: ledger.books imports ledger.api"]),
        ("ledger.views.reports", "from ledger.holds.accrual import accruals", []),
        ("portal.api.holds", "from ledger.holds.state import HoldState", []),  # the boundary test's to refuse
        (
            "accounting_bridge.slurm.records",
            "from ledger import api",
            ["x.py:1: accounting_bridge.slurm imports ledger"],
        ),
        (
            "accounting_bridge.sync.limits_sync",
            "def f():\n    from accounting_bridge.sacct.ingest import ingest_round",
            ["x.py:2: accounting_bridge.sync imports accounting_bridge.sacct"],
        ),
        (
            "accounting_bridge.nvml.agent",
            "import gpucredit.daemon",
            ["x.py:1: accounting_bridge.nvml imports gpucredit.daemon"],
        ),
        (
            "slurm_hooks.hooks",
            "from accounting_bridge.slurm import records",
            ["x.py:1: slurm_hooks imports accounting_bridge.slurm"],
        ),
        ("accounting_bridge.sync.fairshare", "from accounting_bridge.sync import scarcity", []),
        ("gpucredit.daemon.server", "from accounting_bridge.sync.limits_sync import plan_limits", []),
    ],
)
def test_each_arrow_against_the_floor_plan_is_caught(module: str, source: str, expected: list[str]) -> None:
    assert floor_plan_breaches(source, "x.py", module) == expected


# --------------------------------------------------------------------------- the public surface


def test_the_api_only_re_exports() -> None:
    """ledger.api is a docstring, imports and __all__: each name's logic lives in the
    sub-package its part names, never in the surface itself."""
    tree = ast.parse((REPO / "ledger" / "api.py").read_text(encoding="utf-8"))
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds[0] == "Expr"  # the docstring
    assert set(kinds[1:-1]) <= {"ImportFrom", "Import"}
    assert kinds[-1] == "Assign" and ast.unparse(tree.body[-1]).startswith("__all__ =")


def test_the_apis_docstring_names_every_name_it_exports() -> None:
    """The docstring is the surface's table of contents: every exported name is in a part."""
    api = importlib.import_module("ledger.api")
    words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", api.__doc__ or ""))
    assert [name for name in api.__all__ if name not in words] == []
