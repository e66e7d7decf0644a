"""An account's books as one value to compare: its journal, grants, holds and balance, with
ids left out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from ledger import api
from ledger.store.tables import grants_t, holds_t


def picture(tx: Callable[[], Any], account: str, holds: list[int]) -> dict[str, Any]:
    with tx() as s:
        entries = api.journal_entries(s, account, limit=100)
        account_id = s.execute(select(holds_t.c.account_id).where(holds_t.c.id == holds[0])).scalar()
        grant_ids = {
            row.id: n
            for n, row in enumerate(
                s.execute(
                    select(grants_t.c.id).where(grants_t.c.account_id == account_id).order_by(grants_t.c.id)
                )
            )
        }
        return {
            "entries": [
                (
                    e["kind"],
                    {k: v for k, v in (e["memo"] or {}).items() if k != "job"},
                    [
                        (p["account"] != account, p["bucket"], p["amount"], grant_ids.get(p["grant_id"]))
                        for p in e["postings"]
                    ],
                )
                for e in entries
            ],
            "grants": [
                (r.source, r.amount_ucredits, r.remaining_ucredits, r.earmarked_ucredits)
                for r in s.execute(
                    select(grants_t).where(grants_t.c.account_id == account_id).order_by(grants_t.c.id)
                )
            ],
            "holds": [
                tuple(
                    s.execute(
                        select(holds_t.c.charged_ucredits, holds_t.c.debt_ucredits, holds_t.c.state).where(
                            holds_t.c.id == h
                        )
                    ).one()
                )
                for h in holds
            ],
            "balance": _without_ids(api.balance(s, account)),
        }


def _without_ids(balance: dict[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in balance.items() if k not in ("account", "at")}
    shown["grants"] = [{k: v for k, v in g.items() if k != "id"} for g in shown["grants"]]
    return shown
