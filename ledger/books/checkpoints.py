"""Balance checkpoints: an account's balance at any effective time without a journal scan.

A checkpoint version (T, S) holds, per (grant, bucket), the sum of the account's own
postings in entries effective at or before T and numbered (`seq`) at most S. A balance
at t starts from the checkpoint nearest t and adds (or, from one after t, subtracts)
only the entries effective between the two, read through the (account, effective_at)
index: the cost follows how often checkpoints are taken, not the journal's length.

Late entries. An entry can be effective before a checkpoint yet recorded after it:
usage learned late from sacct, the sweep's expiry entries (effective when the grant
expired), a backdated grant. We add their effects rather than trust a watermark,
because lateness has no bound (the daemon down for a day, an admin's backdated
grant) and clocks differ between hosts, while `seq` is given under the account's lock
and says exactly what was recorded after what. Each run of `checkpoint_balances`,
under that lock, keeps one invariant:

    for every checkpoint time T whose newest version is through S_T, no entry numbered
    in (S_T, S_last] is effective at or before T, S_last being the highest S of any
    version of the account's checkpoints.

A run looks at the entries numbered since the previous run, (S_last, S_now], and
appends a new version through S_now of every checkpoint one of them precedes (rows are
never updated). So a read needs the checkpoint's rows, the entries effective between
T and t, and the entries numbered after S_last (recorded since the last run) effective
at or before T: all bounded by the period between runs. Checkpoints are taken at
`now - CHECKPOINT_LAG` so that ordinary lateness (the sweep's period, sacct polling)
seldom makes a new version at all.

A checkpoint always has its debt row (grant NULL, bucket 'debt', possibly 0), which
marks the version; other rows are written only when not zero, so grants used up or
expired cost nothing in later checkpoints.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import any_, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger.books.accounts import lock_account
from ledger.money import format_credits
from ledger.store.bulk import insert_rows
from ledger.store.tables import checkpoints_t, entries_t, postings_t
from ledger.timeutil import format_time, utcnow

# A checkpoint is taken this long before now: late entries seldom precede it.
CHECKPOINT_LAG = timedelta(hours=1)
# The sweep takes one when the newest is older than this.
CHECKPOINT_EVERY = timedelta(hours=1)

Key = tuple[int | None, str]
Sums = dict[Key, int]
HEADER: Key = (None, "debt")


@dataclass(frozen=True)
class Version:
    as_of: datetime
    through_seq: int


def _postings_of_entries(s: Session, account_id: int, conditions: tuple[ColumnElement[bool], ...]) -> Any:
    """Postings of the account's entries matching `conditions`, reached through the entries.

    The entries are chosen first (a range of one of their indexes) and their postings
    read by entry id. As a join, PostgreSQL may instead read all of the account's
    postings through their (account, grant) index, which grows with history;
    `= ANY(ARRAY(subquery))` computes the ids once and probes the entry-id index.
    """
    ids = select(entries_t.c.id).where(entries_t.c.account_id == account_id, *conditions)
    if s.get_bind().dialect.name == "postgresql":
        return postings_t.c.entry_id == any_(func.array(ids.scalar_subquery()))
    return postings_t.c.entry_id.in_(ids)


def journal_sums(s: Session, account_id: int, *conditions: ColumnElement[bool]) -> Sums:
    """The account's own postings summed per (grant, bucket) over entries matching `conditions`.

    An entry's postings are its account's legs and system accounts' (no entry touches
    two customer accounts), so the account is picked out after summing.
    """
    sums: Sums = {}
    for posting_account, grant_id, bucket, total in s.execute(
        select(
            postings_t.c.account_id,
            postings_t.c.grant_id,
            postings_t.c.bucket,
            func.sum(postings_t.c.amount_ucredits),
        )
        .where(_postings_of_entries(s, account_id, conditions))
        .group_by(postings_t.c.account_id, postings_t.c.grant_id, postings_t.c.bucket)
    ):
        if posting_account == account_id:
            sums[(grant_id, bucket)] = int(total)
    return sums


def scan_sums(s: Session, account_id: int, at: datetime) -> Sums:
    """The whole journal up to `at`: what every checkpointed read must equal."""
    sums: Sums = {}
    for grant_id, bucket, total in s.execute(
        select(postings_t.c.grant_id, postings_t.c.bucket, func.sum(postings_t.c.amount_ucredits))
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(
            entries_t.c.account_id == account_id,
            postings_t.c.account_id == account_id,
            entries_t.c.effective_at <= at,
        )
        .group_by(postings_t.c.grant_id, postings_t.c.bucket)
    ):
        sums[(grant_id, bucket)] = int(total)
    return sums


def _add(into: Sums, other: Sums, sign: int = 1) -> Sums:
    for key, amount in other.items():
        into[key] = into.get(key, 0) + sign * amount
    return into


def _version_rows(s: Session, account_id: int, version: Version) -> Sums:
    sums: Sums = {}
    for grant_id, bucket, amount in s.execute(
        select(checkpoints_t.c.grant_id, checkpoints_t.c.bucket, checkpoints_t.c.amount_ucredits).where(
            checkpoints_t.c.account_id == account_id,
            checkpoints_t.c.as_of == version.as_of,
            checkpoints_t.c.through_seq == version.through_seq,
        )
    ):
        sums[(grant_id, bucket)] = int(amount)
    return sums


def _last_seq(s: Session, account_id: int) -> int | None:
    last = s.execute(
        select(func.max(checkpoints_t.c.through_seq)).where(checkpoints_t.c.account_id == account_id)
    ).scalar_one()
    return None if last is None else int(last)


def _nearest(s: Session, account_id: int, at: datetime, last_seq: int, *, after: bool) -> Version | None:
    """The newest version (through at most `last_seq`) of the checkpoint nearest `at`:
    at or before it, or (after=True) strictly after it."""
    header = [
        checkpoints_t.c.account_id == account_id,
        checkpoints_t.c.grant_id.is_(None),
        checkpoints_t.c.through_seq <= last_seq,
    ]
    if after:
        order = [checkpoints_t.c.as_of.asc(), checkpoints_t.c.through_seq.desc()]
        header.append(checkpoints_t.c.as_of > at)
    else:
        order = [checkpoints_t.c.as_of.desc(), checkpoints_t.c.through_seq.desc()]
        header.append(checkpoints_t.c.as_of <= at)
    row = s.execute(
        select(checkpoints_t.c.as_of, checkpoints_t.c.through_seq).where(*header).order_by(*order).limit(1)
    ).first()
    return None if row is None else Version(row.as_of, int(row.through_seq))


def sums_at(s: Session, account_id: int, entry_count: int, created_at: datetime, at: datetime) -> Sums:
    """The account's postings per (grant, bucket) over entries effective at or before `at`:
    equal to `scan_sums`, read from the nearest checkpoint and the entries around it.

    `entry_count` is the account row's count as read by the caller: the entries read
    are bounded by it (or by the checkpoints' own bound, if higher), so an entry
    committed meanwhile is counted in every term or in none.
    """
    last_seq = _last_seq(s, account_id)
    if last_seq is None:
        return scan_sums(s, account_id, at)
    before = _nearest(s, account_id, at, last_seq, after=False)
    after = _nearest(s, account_id, at, last_seq, after=True)
    bound = max(entry_count, last_seq)
    since_start = at - (before.as_of if before else min(created_at, at))
    start = before
    if after is not None and (after.as_of - at) < since_start:
        start = after
    if start is None:
        return journal_sums(s, account_id, entries_t.c.effective_at <= at, entries_t.c.seq <= bound)
    sums = _version_rows(s, account_id, start)
    # Recorded since the last run and effective by the checkpoint: the invariant says no
    # other entry numbered after the version is.
    _add(
        sums,
        journal_sums(
            s,
            account_id,
            entries_t.c.seq > last_seq,
            entries_t.c.seq <= bound,
            entries_t.c.effective_at <= start.as_of,
        ),
    )
    low, high, sign = (start.as_of, at, 1) if start is before else (at, start.as_of, -1)
    between = journal_sums(
        s,
        account_id,
        entries_t.c.effective_at > low,
        entries_t.c.effective_at <= high,
        entries_t.c.seq <= bound,
    )
    return {key: amount for key, amount in _add(sums, between, sign).items() if amount or key == HEADER}


def _latest_versions(s: Session, account_id: int, since: datetime | None = None) -> list[Version]:
    """The newest version of each checkpoint time (from `since` on), by time."""
    query = select(checkpoints_t.c.as_of, func.max(checkpoints_t.c.through_seq)).where(
        checkpoints_t.c.account_id == account_id, checkpoints_t.c.grant_id.is_(None)
    )
    if since is not None:
        query = query.where(checkpoints_t.c.as_of >= since)
    rows = s.execute(query.group_by(checkpoints_t.c.as_of).order_by(checkpoints_t.c.as_of))
    return [Version(as_of, int(seq)) for as_of, seq in rows]


def _write(s: Session, account_id: int, version: Version, sums: Sums, taken_at: datetime) -> int:
    """Append one version: its debt row always (it marks the version), other rows when not 0."""
    kept = {HEADER: sums.get(HEADER, 0)} | {k: v for k, v in sums.items() if v and k != HEADER}
    rows = [
        {
            "account_id": account_id,
            "as_of": version.as_of,
            "through_seq": version.through_seq,
            "grant_id": grant_id,
            "bucket": bucket,
            "amount_ucredits": amount,
            "taken_at": taken_at,
        }
        for (grant_id, bucket), amount in kept.items()
    ]
    insert_rows(s, checkpoints_t, rows)
    return len(rows)


def _late_postings(s: Session, account_id: int, after_seq: int, through_seq: int, by: datetime) -> list[Any]:
    """The account's postings (effective_at, grant_id, bucket, amount) in entries numbered
    in (after_seq, through_seq] and effective by `by`."""
    conditions = (entries_t.c.seq > after_seq, entries_t.c.seq <= through_seq, entries_t.c.effective_at <= by)
    effective = dict(
        s.execute(
            select(entries_t.c.id, entries_t.c.effective_at).where(
                entries_t.c.account_id == account_id, *conditions
            )
        ).all()
    )
    if not effective:
        return []
    return [
        (effective[entry_id], grant_id, bucket, int(amount))
        for entry_id, posting_account, grant_id, bucket, amount in s.execute(
            select(
                postings_t.c.entry_id,
                postings_t.c.account_id,
                postings_t.c.grant_id,
                postings_t.c.bucket,
                postings_t.c.amount_ucredits,
            ).where(_postings_of_entries(s, account_id, conditions))
        )
        if posting_account == account_id
    ]


def checkpoint_balances(
    s: Session, account: str, at: datetime | None = None, *, every: timedelta | None = None
) -> dict[str, Any]:
    """Checkpoint `account`'s balance as of effective time `at` (default now less
    CHECKPOINT_LAG), first appending new versions of the checkpoints that entries
    recorded since the last run precede. With `every`, nothing is done while the newest
    checkpoint is younger than that. Locks the account row (briefly: the work is bounded
    by the entries since the last run); run it periodically, never in a hot path.
    """
    acct = lock_account(s, account)
    taken_at = utcnow()
    at = at or taken_at - CHECKPOINT_LAG
    result: dict[str, Any] = {"account": account, "at": format_time(at), "written": False, "reissued": 0}
    newest = s.execute(
        select(func.max(checkpoints_t.c.as_of)).where(
            checkpoints_t.c.account_id == acct.id, checkpoints_t.c.grant_id.is_(None)
        )
    ).scalar_one()
    if every is not None and newest is not None and at - newest < every:
        return result
    now_seq = acct.entry_count
    last_seq = _last_seq(s, acct.id)
    if newest is not None and last_seq is not None and now_seq > last_seq:
        late = _late_postings(s, acct.id, last_seq, now_seq, newest)
        if late:
            first = min(effective_at for effective_at, *_leg in late)
            for version in _latest_versions(s, acct.id, since=first):
                sums = _version_rows(s, acct.id, version)
                for effective_at, grant_id, bucket, amount in late:
                    if effective_at <= version.as_of:
                        _add(sums, {(grant_id, bucket): amount})
                _write(s, acct.id, Version(version.as_of, now_seq), sums, taken_at)
                result["reissued"] += 1
    result["through_seq"] = now_seq
    base = _nearest(s, acct.id, at, now_seq, after=False)  # re-versioned above if need be
    if base is not None and base.as_of == at:
        return result  # already taken, and right by the invariant
    if base is None:
        sums = journal_sums(s, acct.id, entries_t.c.effective_at <= at, entries_t.c.seq <= now_seq)
    else:
        sums = _add(
            _version_rows(s, acct.id, base),
            journal_sums(
                s,
                acct.id,
                entries_t.c.effective_at > base.as_of,
                entries_t.c.effective_at <= at,
                entries_t.c.seq <= now_seq,
            ),
        )
    result["rows"] = _write(s, acct.id, Version(at, now_seq), sums, taken_at)
    result["written"] = True
    return result


def verify_checkpoints(s: Session, account_id: int, name: str) -> list[str]:
    """Problems with the account's checkpoints: each time's newest version, plus what was
    recorded since the last run, must equal the journal up to that time (what a read
    relies on). One pass over the account's postings in effective order."""
    latest = _latest_versions(s, account_id)
    if not latest:
        return []
    last_seq = _last_seq(s, account_id) or 0
    expected = {v.as_of: _version_rows(s, account_id, v) for v in latest}
    problems: list[str] = []
    running: Sums = defaultdict(int)
    recent: Sums = defaultdict(int)
    pending = iter(latest)
    current = next(pending, None)

    def check(version: Version) -> None:
        journal = {k: v for k, v in running.items() if v and k != HEADER}
        journal[HEADER] = running.get(HEADER, 0)
        stored = _add(dict(expected[version.as_of]), recent)
        stored = {k: v for k, v in stored.items() if v or k == HEADER}
        stored.setdefault(HEADER, 0)
        if stored != journal:
            differ = sorted(
                (k for k in set(stored) | set(journal) if stored.get(k, 0) != journal.get(k, 0)),
                key=lambda k: (k[0] or 0, k[1]),
            )
            shown = ", ".join(
                f"grant {g if g is not None else '-'} {b}: {format_credits(stored.get((g, b), 0))} "
                f"!= journal {format_credits(journal.get((g, b), 0))}"
                for g, b in differ
            )
            problems.append(
                f"account {name} checkpoint as of {format_time(version.as_of)} "
                f"(through seq {version.through_seq}): {shown}"
            )

    rows = s.execute(
        select(
            entries_t.c.effective_at,
            entries_t.c.seq,
            postings_t.c.grant_id,
            postings_t.c.bucket,
            postings_t.c.amount_ucredits,
        )
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(entries_t.c.account_id == account_id, postings_t.c.account_id == entries_t.c.account_id)
        .order_by(entries_t.c.effective_at)
    )
    for effective_at, seq, grant_id, bucket, amount in rows:
        while current is not None and effective_at > current.as_of:
            check(current)
            current = next(pending, None)
        running[(grant_id, bucket)] += int(amount)
        if seq > last_seq:
            recent[(grant_id, bucket)] += int(amount)
    while current is not None:
        check(current)
        current = next(pending, None)
    return problems


__all__ = [
    "CHECKPOINT_EVERY",
    "CHECKPOINT_LAG",
    "checkpoint_balances",
    "scan_sums",
    "sums_at",
    "verify_checkpoints",
]
