"""gpucredit's configuration: built-in defaults, then a TOML file, then the environment.

Stdlib only: the Slurm hooks read it too, and they must start fast.
The file is `GPUCREDIT_CONFIG`, else /etc/gpucredit/gpucredit.toml when it exists;
the database is `GPUCREDIT_DATABASE_URL`, else `database.url`, else an embedded
SQLite file under the user's data directory.
"""

from __future__ import annotations

import copy
import os
import tomllib
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/gpucredit/gpucredit.toml")

DEFAULTS: dict[str, Any] = {
    "database": {"url": None},
    "holds": {"mode": "full", "grace_seconds": 600, "lease_seconds": 900},
    "meter": {"interval_seconds": 30, "on_exhausted": "cancel"},
    "daemon": {
        "socket": "/run/gpucredit/daemon.sock",
        "timeout_seconds": 2.0,
        # None: "Top up at <portal.url> or ask your PI." once portal.url is set, else
        # the `gpucredit topup` command (gpucredit.daemon.top_up_hint).
        "top_up_hint": None,
        "slurm_refresh_seconds": 60.0,  # how often the daemon re-reads partitions (sinfo)
        # Holds and settles are committed in batches of at most this many (group commit).
        "batch_max": 64,
        "writers": 1,  # batches written at once on PostgreSQL (each its own connection); SQLite: 1
    },
    "policy": {
        "on_ledger_unreachable": "reject",
        "refund_node_fail": True,
        "epilog_grace_seconds": 300,
        "warn_at_used_share": 0.8,  # an accepted job's message warns from this share of credit used
        # Under on_ledger_unreachable = "accept" (docs/outage.md): the hooks count runs they
        # start without the ledger in outage_spool_dir, against these credit lines (decimal
        # credit strings; None: no line); the daemon rewrites their price sheet and reads
        # the spool back every outage_sheet_seconds.
        "outage_spool_dir": "/var/spool/gpucredit/outage",
        "outage_credit_line_per_account": None,
        "outage_credit_line_fleet": None,
        "outage_credit_lines": {},  # ACCOUNT = "credits": an account's own line
        "outage_sheet_seconds": 30.0,
    },
    # Partition sites and accounts' default cost limits for routing (docs/routing.md).
    "partitions": {},  # NAME: {"site": "onprem" | "cloud"}
    # accounts: NAME: {"max_cost": "25", "cloud": True, "cloud_budget": "500"}; a job allowed both
    # sites waits burst_after_seconds on-premise before its cloud partitions are added (0: at once).
    "routing": {"accounts": {}, "burst_after_seconds": 0},
    # Slurm shares from credit (docs/fairshare.md): funded in the last funded_days, less
    # damping_percent of what was spent in the last spent_days; a funded account gets at
    # least floor_percent of the median; each member starts at member_shares.
    "fairshare": {
        "funded_days": 90,
        "spent_days": 7,
        "damping_percent": 50,
        "floor_percent": 10,
        "member_shares": 100,
    },
    # Slurm's own GPU limits and blocks from the ledger, and scarcity caps (docs/limits-sync.md).
    # in_daemon: the daemon re-syncs an account within seconds of its block changing, and
    # everything every interval_seconds; off until an admin has looked at `slurm check`.
    "limits_sync": {"in_daemon": False, "interval_seconds": 30.0},
    "scarcity": {
        "engage_above": 0.8,  # caps on when more than this share of a partition's GPUs is allocated,
        "lift_below": 0.6,  # off when less than this is (between the two: as they were)
        "user_share": 0.5,  # while on, a user may hold this share of the partition's GPUs (false: no cap)
        "account_share": 0.75,  # and an account this share
        # the partitions to cap: each needs a QOS of its own in slurm.conf, which gpucredit manages
        "partitions": [],
    },
    "slurm": {"cluster": "lab", "bin_dir": "/usr/bin"},
    "agent": {"spool_dir": "/var/spool/gpucredit/jobs", "interval_seconds": 10},
    "portal": {"host": "127.0.0.1", "port": 8080, "url": None},  # url: public address, shown in refusals
}


def default_sqlite_url() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(base) / 'gpucredit' / 'gpucredit.db'}"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def config_path() -> Path | None:
    env = os.environ.get("GPUCREDIT_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def load_config(path: Path | None = None) -> dict[str, Any]:
    config = copy.deepcopy(DEFAULTS)
    path = path if path is not None else config_path()
    if path is not None:
        with open(path, "rb") as handle:
            _merge(config, tomllib.load(handle))
    env_url = os.environ.get("GPUCREDIT_DATABASE_URL")
    if env_url:
        config["database"]["url"] = env_url
    if not config["database"]["url"]:
        config["database"]["url"] = default_sqlite_url()
    return config
