"""Each runtime lives in its own place, and no import can pull the ledger into a prolog.

Slurm waits on PrologSlurmctld before a job starts, and importing SQLAlchemy and
psycopg alone costs 0.5-1 s, so hook-process code (slurm_hooks/*.py, slurmtext/) is
standard library only. Daemon-side code lives in gpucredit/daemon/ (and job_submit's
answer), admin commands in slurm_hooks/admin/. tests/hooks/test_hooks.py measures what a hook
process actually imports; this test reads the source, so a lazy import inside a
function cannot slip through either.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.support import REPO

ROOT = REPO
HOOK_PROCESS_PACKAGES = {"slurm_hooks", "slurmtext"}


def hook_process_modules() -> list[Path]:
    return sorted((ROOT / "slurm_hooks").glob("*.py")) + sorted((ROOT / "slurmtext").glob("*.py"))


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, at any depth (lazy imports included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_hook_process_code_imports_only_the_standard_library_and_itself() -> None:
    assert hook_process_modules(), "no hook-process modules found"
    wrong = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in hook_process_modules()
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names | HOOK_PROCESS_PACKAGES
        or name.startswith("slurm_hooks.admin")
    ]
    assert wrong == []


def test_daemon_side_code_is_not_in_the_hook_package() -> None:
    """The daemon's hold/settle answers and the admin CLI used to sit beside the hooks."""
    top_level = {path.stem for path in (ROOT / "slurm_hooks").glob("*.py")}
    # outage_spool is the hooks' own: PrologSlurmctld appends to it when the ledger is down;
    # jobinfo, squeue and scontrol read the job the hooks run for; stage_in is the node
    # Prolog's copy of a cloud job's data.
    expected = {"__init__", "client", "hooks", "jobinfo", "outage_spool", "scontrol", "squeue", "stage_in"}
    assert top_level == expected
    assert (ROOT / "gpucredit" / "daemon" / "hook_service.py").exists()
