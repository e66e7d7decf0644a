"""Running sums of what the journal charged, by account and by GPU type, for /metrics.

Prometheus counters must never go down, and the journal never changes, so each entry
is added once: its positive posting to revenue is a charge, its negative one (a settle
below a provisional charge, a correction, a refund) a return, each summed on its own.
Scanning the whole journal at every scrape would cost as much as the journal is long
(with 10,000 jobs running the meter writes some 300 entries a second), so a counter
remembers which entries it has read and reads only newer ones.

Entry ids come from one sequence, but on PostgreSQL transactions commit out of id
order: an entry may become visible after one with a higher id. An id passed over is
kept as a gap and looked for again at each read for `gap_seconds` (ledger transactions
are short); after that it is taken for a rolled-back insert (sequences have holes).

Charges are split across GPU types in proportion to GPUs × unit price (the rule
`usage_report` uses, so the two agree); GPU-seconds come from each charge's own
seconds. Charges outside any job run (`consume`, corrections of no run) and holds
without a partition are labelled "none".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE
from ledger.pricing.prices import parse_pairs
from ledger.store.tables import accounts_t, entries_t, holds_t, postings_t
from ledger.views.reports import split_by_weights

__all__ = ["AccountCharges", "ChargeCounter", "ChargeTotals", "GresCharges"]

log = logging.getLogger(__name__)
NONE = "none"
# Kinds whose memo carries the seconds a charge covers (`delta_seconds`).
TIMED_KINDS = ("usage", "settle")


@dataclass
class AccountCharges:
    charged_ucredits: int = 0
    returned_ucredits: int = 0


@dataclass
class GresCharges:
    charged_ucredits: int = 0
    gpu_seconds: int = 0


@dataclass(frozen=True)
class ChargeTotals:
    """A copy of a counter's sums; `caught_up` is False while the first reads of a long
    journal are still on their way to its end (the sums are then partial)."""

    caught_up: bool
    accounts: dict[str, AccountCharges] = field(default_factory=dict)
    gres: dict[tuple[str, str], GresCharges] = field(default_factory=dict)  # (gres, partition)


class ChargeCounter:
    """Sums that only grow, read from the journal a little at a time. Thread-safe;
    no I/O until `read`."""

    def __init__(
        self,
        *,
        batch_rows: int = 20_000,
        max_rows_per_read: int = 200_000,
        gap_seconds: float = 120.0,
        max_gaps: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_rows = batch_rows
        self.max_rows_per_read = max_rows_per_read
        self.gap_seconds = gap_seconds
        self.max_gaps = max_gaps
        self.clock = clock
        self._accounts: dict[str, AccountCharges] = {}
        self._gres: dict[tuple[str, str], GresCharges] = {}
        self._caught_up = False
        self._next_id = 1  # every id below it was read, or is a gap (ids start at 1)
        self._gaps: dict[int, float] = {}  # id -> when first passed over
        self._lock = threading.Lock()

    def read(self, s: Session) -> ChargeTotals:
        """Add the entries committed since the last read (at most `max_rows_per_read`
        of them) and return the sums."""
        with self._lock:
            rows_read = 0
            while rows_read < self.max_rows_per_read:
                self._forget_old_gaps()
                rows = s.execute(self._query()).all()
                for row in rows:
                    self._advance(row.id)
                    self._add(row)
                rows_read += len(rows)
                if len(rows) < self.batch_rows:
                    self._caught_up = True
                    break
            return ChargeTotals(
                self._caught_up,
                {k: dataclasses.replace(v) for k, v in self._accounts.items()},
                {k: dataclasses.replace(v) for k, v in self._gres.items()},
            )

    def _query(self) -> Any:
        revenue = (
            select(func.sum(postings_t.c.amount_ucredits))
            .where(postings_t.c.entry_id == entries_t.c.id, postings_t.c.account_id == REVENUE)
            .scalar_subquery()
        )
        wanted = entries_t.c.id >= self._next_id
        if self._gaps:
            wanted = or_(wanted, entries_t.c.id.in_(sorted(self._gaps)))
        return (
            select(
                entries_t.c.id,
                entries_t.c.kind,
                entries_t.c.memo,
                accounts_t.c.name.label("account"),
                revenue.label("revenue_ucredits"),
                holds_t.c.gpus,
                holds_t.c.unit_prices,
                holds_t.c.partition,
            )
            .join(accounts_t, accounts_t.c.id == entries_t.c.account_id)
            .outerjoin(holds_t, holds_t.c.id == entries_t.c.hold_id)
            .where(wanted)
            .order_by(entries_t.c.id)
            .limit(self.batch_rows)
        )

    def _advance(self, entry_id: int) -> None:
        if entry_id < self._next_id:
            self._gaps.pop(entry_id, None)
            return
        now = self.clock()
        # Ids passed over; a jump longer than max_gaps keeps only the newest of them.
        for missing in range(max(self._next_id, entry_id - self.max_gaps), entry_id):
            self._gaps[missing] = now
        self._next_id = entry_id + 1

    def _forget_old_gaps(self) -> None:
        before = len(self._gaps)
        now = self.clock()
        for entry_id in [i for i, since in self._gaps.items() if now - since > self.gap_seconds]:
            del self._gaps[entry_id]
        for entry_id in sorted(self._gaps)[: max(len(self._gaps) - self.max_gaps, 0)]:
            del self._gaps[entry_id]
        if len(self._gaps) < before:
            log.info(
                "%d journal ids never appeared (rolled back); no longer looked for", before - len(self._gaps)
            )

    def _add(self, row: Any) -> None:
        amount = int(row.revenue_ucredits or 0)
        account = self._accounts.setdefault(row.account, AccountCharges())
        gpus = parse_pairs(row.gpus) if row.gpus else {}
        partition = row.partition or NONE
        if amount < 0:
            account.returned_ucredits -= amount
        elif amount > 0:
            account.charged_ucredits += amount
            prices = parse_pairs(row.unit_prices) if row.unit_prices else {}
            weights = {gres: count * prices.get(gres, 0) for gres, count in gpus.items()}
            if not any(weights.values()):
                weights = {NONE: 1}
            for gres, share in split_by_weights(amount, weights).items():
                self._by_gres(gres, partition).charged_ucredits += share
        if gpus and row.kind in TIMED_KINDS and row.memo:
            seconds = int(json.loads(row.memo).get("delta_seconds", 0))
            if seconds > 0:
                for gres, count in gpus.items():
                    self._by_gres(gres, partition).gpu_seconds += count * seconds

    def _by_gres(self, gres: str, partition: str) -> GresCharges:
        return self._gres.setdefault((gres, partition), GresCharges())
