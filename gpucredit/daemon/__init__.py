"""`gpucredit daemon`: the one resident process on the controller that owns the ledger's
database connections and answers job_submit.lua and the hooks over a Unix socket.

Everything that runs inside it lives here: the socket server (`server`), its answers to
the hooks' hold and settle requests (`hook_service`), and the Slurm facts it refreshes in
the background (`slurm_facts`); its answer to job_submit.lua is `job_submit.answer`.
Hook processes never import this package (they are stdlib clients, `slurm_hooks`), so
SQLAlchemy never reaches a prolog; tests/test_runtimes.py keeps it so.
"""

from gpucredit.daemon.server import Daemon

__all__ = ["Daemon"]
