"""The daemon keeps Slurm's GPU limits in step with the ledger (`limits_sync.in_daemon`).

Why the daemon and not the meter: the daemon is resident on the controller, where
sacctmgr runs with the rights to change associations, and it already watches for
credit arriving, every couple of seconds, to release jobs the prolog held; a block must
lift on the same event, within seconds of a top-up. The meter ticks every 30 s, only
when GPU jobs run, and may run on any host with sacct; a blocked account has nothing
running for it to notice.

Every tick (the daemon's release interval, 2 s by default) the keeper reads each
account's and member's blocks from the ledger (a few aggregate queries, no Slurm
command). When a block appeared or went (a top-up, a charge that reached a daily cap, a
new UTC day) it re-syncs those accounts at once; everything, scarcity caps included,
is synced every `limits_sync.interval_seconds` (and at the first tick), which also
picks up `limits set` changes and hand edits in Slurm. A sync that fails is tried again
at the next tick. The clock is injectable: tests move it past midnight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from accounting_bridge.sync.limits_sync import LimitsPlan, apply_plan, plan_limits, read_slurm
from accounting_bridge.sync.scarcity import ScarcityPolicy
from ledger import api
from ledger.timeutil import utcnow
from slurmtext import SlurmTextError

__all__ = ["LimitsKeeper"]

log = logging.getLogger("gpucredit.daemon")

BlockState = dict[tuple[str, str | None], tuple[str, ...]]


def _block_state(ledger: Sequence[api.AccountEnforcement]) -> BlockState:
    state: BlockState = {}
    for account in ledger:
        state[(account.account, None)] = tuple(block.code for block in account.blocks)
        for member in account.members:
            state[(account.account, member.user)] = tuple(block.code for block in member.blocks)
    return state


class LimitsKeeper:
    """No I/O until `tick`; every collaborator injectable."""

    def __init__(
        self,
        sessions: Callable[[], Any],
        run: Runner,
        config: dict[str, Any],
        *,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = sessions
        self.run = run
        self.cluster = str(config["slurm"]["cluster"])
        self.policy = ScarcityPolicy.from_config(config)
        self.full_every_seconds = float(config["limits_sync"]["interval_seconds"])
        self.clock = clock
        self._monotonic = monotonic
        self._blocks: BlockState | None = None
        self._last_full: float | None = None

    def tick(self) -> LimitsPlan | None:
        """Sync what is due; returns the plan applied, or None when nothing was due."""
        with self.sessions() as s, s.begin():
            ledger = api.enforcement(s, self.clock())
        blocks = _block_state(ledger)
        started = self._monotonic()
        full = self._last_full is None or started - self._last_full >= self.full_every_seconds
        if not full:
            previous = self._blocks or {}
            changed = {
                key[0] for key in blocks.keys() | previous.keys() if blocks.get(key) != previous.get(key)
            }
            if not changed:
                return None
            ledger = [account for account in ledger if account.account in changed]
        plan = plan_limits(
            ledger, read_slurm(self.run, self.cluster), self.policy, self.cluster, scarcity=full
        )
        apply_plan(self.run, plan)
        for change in plan.changes:
            log.info(
                "limits: %s %s: %s -> %s (%s)",
                change.scope,
                change.name,
                change.old,
                change.new,
                change.reason,
            )
        self._blocks = blocks  # only once applied: a failed sync is tried again next tick
        if full:
            self._last_full = started
        return plan

    def run_forever(self, stop: threading.Event, interval_seconds: float) -> None:
        """Tick every `interval_seconds` until `stop`; failures are logged and retried."""
        while not stop.is_set():
            try:
                self.tick()
            except (SlurmCommandError, SlurmTextError, SQLAlchemyError) as error:
                log.warning("limits sync failed (tried again in %g s): %s", interval_seconds, error)
            stop.wait(interval_seconds)
