"""Prices per GPU type (GRES type) and optionally per partition, versioned by effective time."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger import idempotency
from ledger.errors import InvalidInput
from ledger.models import Price, table_of
from ledger.money import format_credits, parse_credits
from ledger.timeutil import format_time, utcnow

prices_t = table_of(Price)
_GRES = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_GPUS_PER_JOB = 100_000


def check_gres(gres: str) -> str:
    if not isinstance(gres, str) or not _GRES.match(gres):
        raise InvalidInput(
            f"GPU type {gres!r} is not a valid GRES type name", code="invalid_gpus", details={"value": gres}
        )
    return gres


def parse_gpus(spec: str | dict[str, int]) -> dict[str, int]:
    """'h100:2,a100:1' (or a mapping) into {type: count}, refusing zero or malformed parts."""
    if isinstance(spec, dict):
        items: list[tuple[str, str | int]] = list(spec.items())
    else:
        items = []
        for part in str(spec).split(","):
            gres, sep, count_text = part.strip().rpartition(":")
            if not sep:
                raise InvalidInput(
                    f"GPU spec {spec!r}: expected TYPE:N[,TYPE:N]",
                    code="invalid_gpus",
                    details={"value": str(spec)},
                )
            items.append((gres, count_text))
    gpus: dict[str, int] = {}
    for name, count in items:
        check_gres(name)
        try:
            n = int(count)
        except (TypeError, ValueError):
            raise InvalidInput(
                f"GPU count {count!r} for {name} is not a whole number",
                code="invalid_gpus",
                details={"value": str(spec)},
            ) from None
        if n <= 0 or n > MAX_GPUS_PER_JOB:
            raise InvalidInput(
                f"GPU count {n} for {name} must be between 1 and {MAX_GPUS_PER_JOB}",
                code="invalid_gpus",
                details={"value": str(spec)},
            )
        gpus[name] = gpus.get(name, 0) + n
    if not gpus:
        raise InvalidInput("no GPUs given", code="invalid_gpus", details={"value": str(spec)})
    return dict(sorted(gpus.items()))


def parse_pairs(text: str) -> dict[str, int]:
    """The stored 'name:int,...' form (GPU counts or unit prices), trusted as written by us."""
    return {
        name: int(value) for name, _sep, value in (part.rpartition(":") for part in text.split(",") if part)
    }


def format_gpus(gpus: dict[str, int]) -> str:
    return ",".join(f"{name}:{count}" for name, count in sorted(gpus.items()))


def set_price(
    s: Session,
    gres: str,
    credits_per_gpu_hour: str,
    *,
    partition: str | None = None,
    effective_at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """A new price version (prices are append-only: the latest effective at a time wins).

    Prices belong to no account, so the key lives in the global scope; a repeat without
    `effective_at` replays the first version, effective when the first request ran.
    """
    check_gres(gres)
    amount = parse_credits(credits_per_gpu_hour, field="price", allow_zero=True)
    request = {
        "gres": gres,
        "partition": partition,
        "ucredits_per_gpu_hour": amount,
        "effective_at": format_time(effective_at),
    }

    def insert_version() -> dict[str, Any]:
        now = utcnow()
        s.execute(
            insert(prices_t).values(
                gres=gres,
                partition=partition,
                ucredits_per_gpu_hour=amount,
                effective_at=effective_at or now,
                recorded_at=now,
            )
        )
        return {
            "gres": gres,
            "partition": partition,
            "credits_per_gpu_hour": format_credits(amount),
            "effective_at": format_time(effective_at or now),
        }

    return idempotency.once(
        s, idempotency.GLOBAL_SCOPE, idempotency_key, "price_set", request, insert_version
    )


def price_at(s: Session, gres: str, partition: str | None, at: datetime) -> int | None:
    """Micro-credits per GPU-hour in force at `at`: the partition's own price, else the type's."""
    for part in ([partition] if partition else []) + [None]:
        where = prices_t.c.partition.is_(None) if part is None else prices_t.c.partition == part
        row = s.execute(
            select(prices_t.c.ucredits_per_gpu_hour)
            .where(prices_t.c.gres == gres, where, prices_t.c.effective_at <= at)
            .order_by(prices_t.c.effective_at.desc(), prices_t.c.id.desc())
            .limit(1)
        ).first()
        if row is not None:
            return int(row[0])
    return None


def rate_for(
    s: Session, gpus: dict[str, int], partition: str | None, at: datetime
) -> tuple[int, dict[str, int]]:
    """Combined micro-credits per hour for a GPU mix, and each type's price; unknown types refused.

    One query for every type: the partition's own price wins over the type's general one,
    the latest effective at `at` over older ones.
    """
    where_partition: ColumnElement[bool] = prices_t.c.partition.is_(None)
    if partition:
        where_partition = or_(where_partition, prices_t.c.partition == partition)
    found: dict[str, tuple[bool, int]] = {}
    for gres, part, price in s.execute(
        select(prices_t.c.gres, prices_t.c.partition, prices_t.c.ucredits_per_gpu_hour)
        .where(prices_t.c.gres.in_(list(gpus)), prices_t.c.effective_at <= at, where_partition)
        .order_by(prices_t.c.effective_at.desc(), prices_t.c.id.desc())
    ):
        specific = part is not None
        if gres not in found or (specific and not found[gres][0]):
            found[gres] = (specific, int(price))
    unit_prices: dict[str, int] = {}
    for gres in gpus:
        if gres not in found:
            raise InvalidInput(
                f"no price for GPU type {gres!r}"
                + (f" in partition {partition}" if partition else "")
                + f" at {format_time(at)}; set one with `gpucredit price set`",
                code="unknown_gres",
                details={"gres": gres, "partition": partition},
            )
        unit_prices[gres] = found[gres][1]
    return sum(unit_prices[g] * n for g, n in gpus.items()), unit_prices


def list_prices(s: Session) -> list[dict[str, Any]]:
    return [
        {
            "gres": r.gres,
            "partition": r.partition,
            "credits_per_gpu_hour": format_credits(r.ucredits_per_gpu_hour),
            "effective_at": format_time(r.effective_at),
        }
        for r in s.execute(
            select(prices_t).order_by(prices_t.c.gres, prices_t.c.partition, prices_t.c.effective_at)
        )
    ]
