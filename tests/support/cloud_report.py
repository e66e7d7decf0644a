"""A hand-built ledger for the cloud report's tests: accounts, a price, and jobs run on
named nodes (a hold, its settle, and the bridge's job_runs row with the nodes), so each
test knows every second and every micro-credit it asserts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from ledger import api
from ledger.jobs import jobruns
from ledger.timeutil import utcnow

# An instance type at 36 credits an hour: a second costs 0.01 credits.
INSTANCE_PRICE_UCREDITS_PER_HOUR = 36_000_000
GPU_PRICE = "3.60"  # credits per h100-hour: 2 GPUs for 6 minutes cost 0.72
NOV_10_NOON = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def seed_accounts(s: Session, *accounts: str) -> None:
    api.set_price(s, "h100", GPU_PRICE, effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    for account in accounts:
        api.create_account(s, account)
        api.topup(s, account, "1000", effective_at=datetime(2026, 1, 1, tzinfo=UTC))


def run_job(
    s: Session,
    *,
    account: str,
    job_id: int,
    gpus: str,
    partition: str,
    nodes: str,
    started_at: datetime,
    seconds: int,
    user: str = "alice",
) -> int:
    """A job run that started at `started_at` on `nodes` and ran `seconds`, settled."""
    hold = api.create_hold(
        s,
        api.HoldRequest(
            account,
            user=user,
            job_id=job_id,
            gpus=gpus,
            seconds=seconds + 3600,
            partition=partition,
            at=started_at,
            started_at=started_at,
        ),
    )
    ended_at = started_at + timedelta(seconds=seconds)
    settled = api.settle_hold(s, hold.id, seconds, at=ended_at)
    jobruns.upsert_job_runs(
        s,
        [
            jobruns.JobRunRow(
                "default",
                job_id,
                0,
                hold.submitted_at,
                str(job_id),
                account,
                user,
                partition,
                "COMPLETED",
                started_at,
                ended_at,
                seconds,
                gpus,
                nodes,
                hold.id,
                "",
                settled.charged_ucredits,
                utcnow(),
            )
        ],
    )
    return hold.id


def span(
    id_: str, node: str, launched_at: datetime, ended_at: datetime | None, price: int | None = None
) -> api.InstanceSpan:
    return api.InstanceSpan(
        id_,
        node,
        "p5.48xlarge",
        launched_at,
        ended_at,
        INSTANCE_PRICE_UCREDITS_PER_HOUR if price is None else price,
    )


def seed_november(s: Session) -> None:
    """The worked example: physics runs job 4001 on cloud1 from 12:02 to 12:08 on
    10 November on 2 h100s (0.72 credits), inside instance i-1 (12:00 to 12:10)."""
    seed_accounts(s, "physics")
    run_job(
        s,
        account="physics",
        job_id=4001,
        gpus="h100:2",
        partition="cloud",
        nodes="cloud1",
        started_at=NOV_10_NOON + timedelta(minutes=2),
        seconds=360,
    )


# The journal of the worked example, as `cloud resume` and `cloud suspend` write it: i-1
# above, and i-2 on cloud2, launched at 23:00 on 30 November and still running.
JOURNAL_LINES = [
    '{"at": "2026-11-10T12:00:00+00:00", "event": "launched", "id": "i-1", "node": "cloud1", '
    '"region": "us-east-1", "type": "p5.48xlarge"}',
    '{"at": "2026-11-30T23:00:00+00:00", "event": "launched", "id": "i-2", "node": "cloud2", '
    '"region": "us-east-1", "type": "p5.48xlarge"}',
    '{"at": "2026-11-10T12:10:00+00:00", "by": "suspend", "event": "terminated", "id": "i-1", '
    '"launched_at": "2026-11-10T12:00:00+00:00", "node": "cloud1", "region": "us-east-1", '
    '"type": "p5.48xlarge"}',
]
# The worked example's November at 23:30 on 30 November, as CSV: i-2's half hour so far
# ran no job (its overhead is of no partition), i-1's as in the ledger test.
NOVEMBER_CSV = (
    "partition,account,instance_seconds,instance_hours,provider_cost,gpu_seconds,charged,"
    "overhead_seconds,overhead_share\n"
    """-,(overhead),1800,0.50,18.00,0,0.00,1800,100.0%
cloud,physics,360,0.10,3.60,720,0.72,0,-
cloud,(overhead),240,0.07,2.40,0,0.00,240,40.0%
*,*,2400,0.67,24.00,720,0.72,2040,85.0%
"""
)
NOVEMBER_NOW = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
