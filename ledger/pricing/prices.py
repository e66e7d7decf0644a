"""Prices per GPU type (GRES type) and optionally per partition, versioned by effective time."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Select, insert, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger.books import idempotency
from ledger.errors import InvalidInput
from ledger.money import (
    MAX_GPUS_PER_JOB,
    MAX_PRICE_UCREDITS_PER_GPU_HOUR,
    MAX_RATE_UCREDITS_PER_HOUR,
    format_credits,
    parse_credits,
)
from ledger.store.tables import prices_t
from ledger.timeutil import format_time, utcnow

_GRES = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_gres(gres: str) -> str:
    if not isinstance(gres, str) or not _GRES.match(gres):
        raise InvalidInput(
            f"GPU type {gres!r} is not a valid GRES type name", code="invalid_gpus", details={"value": gres}
        )
    return gres


def parse_gpus(spec: str | dict[str, int]) -> dict[str, int]:
    """'h100:2,a100:1' (or a mapping) into {type: count}, refusing zero or malformed parts
    and more than MAX_GPUS_PER_JOB GPUs in all (the cap is the job's, not each part's)."""
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
    total = sum(gpus.values())
    if total > MAX_GPUS_PER_JOB:
        raise InvalidInput(
            f"{total} GPUs in one job exceed the cap of {MAX_GPUS_PER_JOB} GPUs per job",
            code="invalid_gpus",
            details={"value": str(spec), "limit": "gpus_per_job", "gpus": total, "cap": MAX_GPUS_PER_JOB},
        )
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
    if amount > MAX_PRICE_UCREDITS_PER_GPU_HOUR:
        raise InvalidInput(
            f"price {format_credits(amount)} exceeds the cap of "
            f"{format_credits(MAX_PRICE_UCREDITS_PER_GPU_HOUR)} credits per GPU-hour",
            code="invalid_amount",
            details={
                "field": "price",
                "limit": "price_per_gpu_hour",
                "value": format_credits(amount),
                "cap": format_credits(MAX_PRICE_UCREDITS_PER_GPU_HOUR),
            },
        )
    request = {
        "gres": gres,
        "partition": partition,
        "ucredits_per_gpu_hour": amount,
        "effective_at": format_time(effective_at),
    }

    def insert_version() -> dict[str, Any]:
        now = utcnow()
        in_force = _exact_version_at(s, gres, partition, now) if effective_at is None else None
        if in_force is not None and in_force[1] == amount:
            # The guide's `price set h100 3.60` repeated: a version from now with the price in
            # force changes no price from now on. Add none, and say so. A version with its own
            # time is always kept, the same price or not: a version set later, effective
            # before it, would otherwise outlast it (the model test found this).
            return {
                "gres": gres,
                "partition": partition,
                "credits_per_gpu_hour": format_credits(amount),
                "effective_at": format_time(in_force[0]),
                "unchanged": True,
            }
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
            "unchanged": False,
        }

    return idempotency.once(
        s, idempotency.GLOBAL_SCOPE, idempotency_key, "price_set", request, insert_version
    )


def _exact_version_at(
    s: Session, gres: str, partition: str | None, at: datetime
) -> tuple[datetime, int] | None:
    """(effective_at, price) of the version of exactly this type and partition (no general
    fallback) in force at `at`, by PriceTable's rule; None when there is none."""
    where = prices_t.c.partition.is_(None) if partition is None else prices_t.c.partition == partition
    rows = s.execute(
        select(prices_t.c.effective_at, prices_t.c.ucredits_per_gpu_hour)
        .where(prices_t.c.gres == gres, where, prices_t.c.effective_at <= at)
        .order_by(prices_t.c.effective_at.desc(), prices_t.c.id.desc())
        .limit(1)
    ).first()
    return None if rows is None else (rows[0], int(rows[1]))


PriceRow = tuple[str, str | None, datetime, int]


class PriceTable:
    """Prices in force at any time: the one rule every price lookup follows (a hold, a
    quote, the job_submit snapshot, reconciliation).

    A partition's own price wins over the type's general one; among prices of one kind,
    the latest effective at `at` wins (on a tie, the one recorded last).
    """

    __slots__ = ("_history",)

    def __init__(self, rows: Iterable[PriceRow]) -> None:
        """`rows`: (gres, partition, effective_at, micro-credits per GPU-hour), in the
        order they were recorded (the `prices` ids)."""
        history: dict[tuple[str, str | None], list[tuple[datetime, int]]] = {}
        for gres, partition, effective_at, price in rows:
            history.setdefault((gres, partition), []).append((effective_at, int(price)))
        for versions in history.values():
            versions.sort(key=lambda version: version[0])  # stable: recording order on ties
        self._history = history

    def gpu_types(self) -> list[str]:
        """Every GPU type that has a price (in some partition, at some time)."""
        return sorted({gres for gres, _partition in self._history})

    def price_at(self, gres: str, partition: str | None, at: datetime) -> int | None:
        """Micro-credits per GPU-hour in force at `at`: the partition's own, else the type's."""
        for key in ([(gres, partition)] if partition else []) + [(gres, None)]:
            version = self.version_in_force(key[0], key[1], at)
            if version is not None:
                return self._history[key][version][1]
        return None

    def version_in_force(self, gres: str, partition: str | None, at: datetime) -> int | None:
        """Which of the versions set for exactly this type and partition (counted in
        effective order, ties in recording order) is the latest effective at `at`."""
        versions = self._history.get((gres, partition), ())
        for position in range(len(versions) - 1, -1, -1):
            if versions[position][0] <= at:
                return position
        return None

    def unit_prices(self, gres: Iterable[str], partition: str | None, at: datetime) -> dict[str, int]:
        """Each type's price at `at`; a type without one is refused (`unknown_gres`)."""
        prices: dict[str, int] = {}
        for name in gres:
            price = self.price_at(name, partition, at)
            if price is None:
                raise InvalidInput(
                    f"no price for GPU type {name!r}"
                    + (f" in partition {partition}" if partition else "")
                    + f" at {format_time(at)}; set one with `gpucredit price set`",
                    code="unknown_gres",
                    details={"gres": name, "partition": partition},
                )
            prices[name] = price
        return prices

    def next_change_after(self, at: datetime) -> datetime | None:
        """When the next price version takes effect after `at` (None: none is set): until
        then every price in force at `at` stays in force."""
        return min(
            (effective for versions in self._history.values() for effective, _ in versions if effective > at),
            default=None,
        )

    def rate_for(
        self, gpus: Mapping[str, int], partition: str | None, at: datetime
    ) -> tuple[int, dict[str, int]]:
        """Micro-credits per hour of a GPU mix at `at`, and each type's price."""
        unit_prices = self.unit_prices(gpus, partition, at)
        return rate_of(gpus, unit_prices), unit_prices

    def dearest(self, gres: Iterable[str], partition: str | None, at: datetime) -> str | None:
        """The most expensive of `gres` at `at` (None when none is priced): what an untyped
        GPU is estimated at before Slurm picks its type."""
        priced = [(price, name) for name in gres if (price := self.price_at(name, partition, at)) is not None]
        return max(priced)[1] if priced else None


def rate_of(gpus: Mapping[str, int], unit_prices: Mapping[str, int]) -> int:
    """Micro-credits per hour of a GPU mix at the given prices per GPU-hour (each type
    priced), refused above MAX_RATE_UCREDITS_PER_HOUR: so one run's charge, at most this
    rate for the longest time limit, stays within the ledger's bounds (ledger.money)."""
    rate = sum(unit_prices[gres] * count for gres, count in gpus.items())
    if rate > MAX_RATE_UCREDITS_PER_HOUR:
        raise InvalidInput(
            f"{format_gpus(dict(gpus))} cost {format_credits(rate)} credits per hour, "
            f"above the cap of {format_credits(MAX_RATE_UCREDITS_PER_HOUR)} credits per hour for one job",
            code="invalid_gpus",
            details={
                "limit": "rate_per_job",
                "value": format_credits(rate),
                "cap": format_credits(MAX_RATE_UCREDITS_PER_HOUR),
            },
        )
    return rate


def _price_rows(
    s: Session,
    gres: Collection[str] | None,
    partition: str | None,
    at: datetime | None,
    every_partition: bool,
) -> list[PriceRow]:
    query = price_rows_query()
    if gres is not None:
        query = query.where(prices_t.c.gres.in_(list(gres)))
    if at is not None:
        query = query.where(prices_t.c.effective_at <= at)
    if not every_partition:
        where_partition: ColumnElement[bool] = prices_t.c.partition.is_(None)
        if partition:
            where_partition = or_(where_partition, prices_t.c.partition == partition)
        query = query.where(where_partition)
    return [(row[0], row[1], row[2], int(row[3])) for row in s.execute(query)]


def price_rows_query() -> Select[Any]:
    """Every price version as `PriceTable` takes them, in recorded order (callers that
    send it along with other reads build the table with `price_table`)."""
    return select(
        prices_t.c.gres, prices_t.c.partition, prices_t.c.effective_at, prices_t.c.ucredits_per_gpu_hour
    ).order_by(prices_t.c.id)


def price_table(rows: Iterable[Any]) -> PriceTable:
    """The table of `price_rows_query`'s rows."""
    return PriceTable((row[0], row[1], row[2], int(row[3])) for row in rows)


def load_price_table(s: Session) -> PriceTable:
    """Every price ever set (a small table): for readers that price many runs or jobs."""
    return PriceTable(_price_rows(s, None, None, None, every_partition=True))


def prices_for_job(s: Session, gres: Collection[str], partition: str | None, at: datetime) -> PriceTable:
    """Only the prices of these types that can be in force in `partition` at `at` (one query)."""
    return PriceTable(_price_rows(s, gres, partition, at, every_partition=False))


def price_at(s: Session, gres: str, partition: str | None, at: datetime) -> int | None:
    """Micro-credits per GPU-hour in force at `at` (see PriceTable)."""
    return prices_for_job(s, [gres], partition, at).price_at(gres, partition, at)


def rate_for(
    s: Session, gpus: dict[str, int], partition: str | None, at: datetime
) -> tuple[int, dict[str, int]]:
    """Combined micro-credits per hour for a GPU mix, and each type's price; unknown types
    refused. One query reads the prices of these types that can be in force at `at`."""
    return prices_for_job(s, gpus, partition, at).rate_for(gpus, partition, at)


def list_prices(s: Session) -> list[dict[str, Any]]:
    """Every price version: by type, the general price before partitions' (on both stores:
    PostgreSQL sorts NULL last unless told), then by effective time."""
    return [
        {
            "gres": r.gres,
            "partition": r.partition,
            "credits_per_gpu_hour": format_credits(r.ucredits_per_gpu_hour),
            "effective_at": format_time(r.effective_at),
        }
        for r in s.execute(
            select(prices_t).order_by(
                prices_t.c.gres, prices_t.c.partition.nulls_first(), prices_t.c.effective_at, prices_t.c.id
            )
        )
    ]


def price_versions(s: Session, at: datetime | None = None) -> list[dict[str, Any]]:
    """Every price version (as `list_prices`), each marked `in_force` when it is the
    version of its type and partition that PriceTable finds in force at `at` (default now)."""
    at = at or utcnow()
    table = load_price_table(s)
    seen: dict[tuple[str, str | None], int] = {}
    marked = []
    for version in list_prices(s):  # per type and partition, in PriceTable's version order
        key = (version["gres"], version["partition"])
        seen[key] = position = seen.get(key, -1) + 1
        marked.append({**version, "in_force": position == table.version_in_force(key[0], key[1], at)})
    return marked
