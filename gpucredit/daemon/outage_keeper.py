"""The daemon keeps the outage spool's ledger side current (docs/outage.md).

While `policy.on_ledger_unreachable = "accept"` (or a spool is left to read back), every
`policy.outage_sheet_seconds` the keeper rewrites the hooks' price sheet from the
ledger's prices and reads the spool back, charging each admitted run that ended
(accounting_bridge/outage/readback.py, which `gpucredit policy readback` runs by hand).
A round that fails (the database or the spool directory) is tried again next interval.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from accounting_bridge.outage.readback import ReadBack, Sessions, read_back, refresh_sheet
from ledger import api
from ledger.errors import InvalidInput
from ledger.timeutil import utcnow
from slurm_hooks.outage_spool import DEFAULT_SPOOL_DIR, RUNS

__all__ = ["OutageKeeper"]

log = logging.getLogger("gpucredit.daemon")


def _give_to_slurm_user(directory: str, user: str | None) -> None:
    """The hooks run as SlurmUser and append to the spool: a daemon running as root makes
    the directory theirs (`daemon.socket_user`), and every file in it follows its owner."""
    os.makedirs(directory, mode=0o750, exist_ok=True)
    if user and os.geteuid() == 0:
        import pwd

        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)


class OutageKeeper:
    """The daemon's background loop: the sheet and the read-back, every `interval`."""

    def __init__(self, sessions: Sessions, directory: str, interval: float) -> None:
        self.sessions = sessions
        self.directory = directory
        self.interval = interval

    @classmethod
    def from_config(cls, sessions: Sessions, config: Mapping[str, Any]) -> OutageKeeper | None:
        """A keeper when the site accepts jobs in an outage or a spool is left to read
        back, else None; bad outage settings are refused here (the daemon stops)."""
        api.OutageConfig.from_config(config)
        policy = config.get("policy", {})
        directory = policy.get("outage_spool_dir", DEFAULT_SPOOL_DIR)
        interval = policy.get("outage_sheet_seconds", 30.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise InvalidInput(
                f"policy.outage_sheet_seconds = {interval!r}: expected a positive number of seconds",
                code="invalid_setting",
            )
        spool_left = os.path.exists(os.path.join(directory, RUNS))
        if policy.get("on_ledger_unreachable") != "accept" and not spool_left:
            return None
        _give_to_slurm_user(directory, config.get("daemon", {}).get("socket_user"))
        return cls(sessions, directory, float(interval))

    def tick(self, now: datetime | None = None) -> ReadBack | None:
        now = now or utcnow()
        try:
            refresh_sheet(self.sessions, self.directory, now)
            result = read_back(self.sessions, self.directory, now)
        except (SQLAlchemyError, OSError) as error:
            log.warning("outage sheet or read-back failed (tried again in %g s): %s", self.interval, error)
            return None
        for charged in result.charged:
            log.info("outage read-back: charged %s", charged)
        return result

    def start(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            while not stop.is_set():
                self.tick()
                stop.wait(self.interval)

        thread = threading.Thread(target=loop, name="gpucredit-outage", daemon=True)
        thread.start()
        return thread
