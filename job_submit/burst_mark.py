"""The burst mark in a job's AdminComment, written at submit and read by the burst pass.

    gpucredit-burst=cloud:5000000,burst:6000000       held back: each cloud partition
                                                      and the job's cost there
    gpucredit-burst-sent=cloud:5000000                added: the partitions given and
                                                      their costs, until the job starts

Costs are micro-credits, the submit quote's figure in that partition (every task), so the
pass can check the account's cloud budget again when it bursts, with no second quote: a
user cannot edit an AdminComment, so the figure is the ledger's. A mark written before
costs were (`gpucredit-burst=cloud`, `gpucredit-burst-sent`) reads with cost None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HELD_PREFIX", "SENT_PREFIX", "BurstMark"]

HELD_PREFIX = "gpucredit-burst="
SENT_PREFIX = "gpucredit-burst-sent"


@dataclass(frozen=True)
class BurstMark:
    sent: bool
    costs: Mapping[str, int | None]  # cloud partition -> the job's cost there (None: unknown)

    @property
    def text(self) -> str:
        parts = ",".join(name if cost is None else f"{name}:{cost}" for name, cost in self.costs.items())
        if self.sent:
            return f"{SENT_PREFIX}={parts}" if parts else SENT_PREFIX
        return HELD_PREFIX + parts

    @property
    def most(self) -> int:
        """The dearest known cost: what the job may still spend in the cloud."""
        return max((cost for cost in self.costs.values() if cost is not None), default=0)

    @classmethod
    def parse(cls, text: str) -> BurstMark | None:
        """The mark in `text` (an AdminComment), or None when it holds another or none.
        A malformed entry is left out, never guessed."""
        text = text.strip()
        if text.startswith(HELD_PREFIX):
            sent, body = False, text.removeprefix(HELD_PREFIX)
        elif text == SENT_PREFIX or text.startswith(SENT_PREFIX + "="):
            sent, body = True, text.removeprefix(SENT_PREFIX).removeprefix("=")
        else:
            return None
        costs: dict[str, int | None] = {}
        for entry in body.split(","):
            name, colon, cost = entry.partition(":")
            if not name:
                continue
            if not colon:
                costs[name] = None
            elif cost.isascii() and cost.isdigit():
                costs[name] = int(cost)
        return cls(sent, costs)
