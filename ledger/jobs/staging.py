"""Data a job asked to have on its cloud nodes before it starts (docs/api.md, "Data"):
the paths, kept when the portal submitted the job, and each stage-in a node made.

The portal keeps the paths before it submits (`keep_job_data`, no job id yet) and binds
them to the job's id once sbatch has answered (`bind_job_data`): a job that starts at
once on an idle node may reach its Prolog before the bind, and the daemon then answers
"pending" while its user has paths kept within PENDING_SECONDS and not yet bound, so the
Prolog waits for them instead of starting the job without its data.

The node's Prolog copies the paths as the job's user into the node's stage directory
and reports what it copied; it asks for them, and reports, through the agents' MUNGE
channel (the node holds no ledger credentials). No money moves here: staging runs
inside the run, which is charged as any run is.

A job's paths are matched to it as a retry policy is (ledger.jobs.retries): kept for the
same user, at most CLOCK_SLACK before and KEPT_WITHIN after the job's first submission,
which is its run-0 hold's SubmitTime (the Prolog runs after PrologSlurmctld took the
hold). A job without a run-0 hold (started while the ledger was unreachable) stages
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ledger.errors import InvalidInput
from ledger.jobs.retries import CLOCK_SLACK, KEPT_WITHIN
from ledger.store.tables import holds_t, job_data_t, stagings_t
from ledger.timeutil import format_time

__all__ = [
    "MAX_DATA_PATHS",
    "PENDING_SECONDS",
    "JobData",
    "Staged",
    "bind_job_data",
    "check_data_paths",
    "data_pending",
    "data_to_stage",
    "forget_job_data",
    "job_data",
    "keep_job_data",
    "record_staged",
]

MAX_DATA_PATHS = 32
MAX_PATH_CHARS = 1024
MAX_ERROR_CHARS = 512
MAX_NODE_CHARS = 128
PENDING_SECONDS = 60  # paths kept this long without a job id: a submission in flight


@dataclass(frozen=True)
class Staged:
    """What one node's Prolog copied for one run of the job."""

    run: int
    node: str
    files: int
    bytes: int
    milliseconds: int
    error: str | None
    at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "node": self.node,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": f"{self.milliseconds / 1000:.3f}",
            "error": self.error,
            "at": format_time(self.at),
        }


@dataclass(frozen=True)
class JobData:
    data_id: int
    user: str
    paths: tuple[str, ...]
    kept_at: datetime
    staged: tuple[Staged, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "staged": [s.as_dict() for s in self.staged]}


def check_data_paths(paths: object) -> tuple[str, ...]:
    """The API's `data`: a list of absolute paths; InvalidInput naming `data` otherwise."""
    if not isinstance(paths, list) or not paths or len(paths) > MAX_DATA_PATHS:
        raise _refuse(f"must list 1 to {MAX_DATA_PATHS} absolute paths")
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/") or len(path) > MAX_PATH_CHARS:
            raise _refuse(f"{path!r} is not an absolute path of at most {MAX_PATH_CHARS} characters")
        if any(ord(c) < 32 or ord(c) == 127 for c in path) or "/../" in f"{path}/":
            raise _refuse(f"{path!r} holds a control character or '..'")
    return tuple(dict.fromkeys(paths))


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(f"data: {message}", details={"field": "data"})


def keep_job_data(s: Session, cluster: str, user: str, paths: Sequence[str], now: datetime) -> int:
    """Keep `paths` for the job `user` is about to submit; its id (for `bind_job_data`)."""
    return int(
        s.execute(
            job_data_t.insert()
            .values(
                cluster=cluster,
                job_id=None,
                user=user,
                paths=json.dumps(list(check_data_paths(list(paths)))),
                created_at=now,
            )
            .returning(job_data_t.c.id)
        ).scalar_one()
    )


def bind_job_data(s: Session, data_id: int, job_id: int) -> None:
    """The submission of `data_id`'s paths became job `job_id`."""
    s.execute(
        job_data_t.update()
        .where(job_data_t.c.id == data_id, job_data_t.c.job_id.is_(None))
        .values(job_id=job_id)
    )


def forget_job_data(s: Session, data_id: int) -> None:
    """The submission of `data_id`'s paths failed: no job will ask for them."""
    s.execute(job_data_t.delete().where(job_data_t.c.id == data_id, job_data_t.c.job_id.is_(None)))


def data_pending(s: Session, cluster: str, user: str, now: datetime) -> bool:
    """Whether `user` has paths kept within PENDING_SECONDS and not yet bound to a job."""
    d = job_data_t.c
    found = select(d.id).where(
        d.cluster == cluster,
        d.user == user,
        d.job_id.is_(None),
        d.created_at >= now - timedelta(seconds=PENDING_SECONDS),
    )
    return s.execute(found.limit(1)).first() is not None


def job_data(s: Session, cluster: str, job_ids: Collection[int]) -> dict[int, JobData]:
    """The newest paths kept for each of `job_ids` that has some, with their stage-ins."""
    if not job_ids:
        return {}
    d, g = job_data_t.c, stagings_t.c
    rows = s.execute(
        select(d.id, d.job_id, d.user, d.paths, d.created_at)
        .where(d.cluster == cluster, d.job_id.in_(sorted(set(job_ids))))
        .order_by(d.job_id, d.created_at, d.id)
    ).all()
    newest = {row.job_id: row for row in rows}
    staged: dict[int, list[Staged]] = {row.id: [] for row in newest.values()}
    if staged:
        for row in s.execute(
            select(g.data_id, g.run, g.node, g.files, g.bytes, g.milliseconds, g.error, g.created_at)
            .where(g.data_id.in_(sorted(staged)))
            .order_by(g.data_id, g.run, g.node)
        ):
            staged[row.data_id].append(
                Staged(row.run, row.node, row.files, row.bytes, row.milliseconds, row.error, row.created_at)
            )
    return {
        job_id: JobData(row.id, row.user, tuple(json.loads(row.paths)), row.created_at, tuple(staged[row.id]))
        for job_id, row in newest.items()
    }


def data_to_stage(s: Session, cluster: str, job_id: int, user: str) -> JobData | None:
    """The job's paths, when `user`'s job `job_id` of `cluster` has some (the module's
    docstring says which are the job's); None when it has none."""
    kept = job_data(s, cluster, [job_id]).get(job_id)
    if kept is None or kept.user != user:
        return None
    h = holds_t.c
    first = s.execute(
        select(h.submitted_at)
        .where(h.cluster == cluster, h.job_id == job_id, h.run == 0, h.user == user)
        .order_by(h.submitted_at.desc())
        .limit(1)
    ).scalar()
    if first is None or not first - CLOCK_SLACK <= kept.kept_at <= first + KEPT_WITHIN:
        return None
    return kept


def record_staged(s: Session, data_id: int, cluster: str, job_id: int, user: str, staged: Staged) -> bool:
    """Record one node's stage-in of one run of `user`'s job `job_id`; False when that run
    and node has one already (a Prolog Slurm ran twice: the first report stands).
    InvalidInput for paths that are not that job's, or figures out of range."""
    d = job_data_t.c
    mine = s.execute(
        select(d.id).where(d.id == data_id, d.cluster == cluster, d.job_id == job_id, d.user == user)
    ).first()
    if mine is None:
        raise InvalidInput(f"no data kept for {user}'s job {job_id} of {cluster} as {data_id}")
    if not all(0 <= n < 2**31 for n in (staged.run, staged.files, staged.milliseconds)) or not (
        0 <= staged.bytes < 2**63
    ):
        raise InvalidInput("a stage-in's run, files, bytes and milliseconds are 0 or more, in range")
    if not 0 < len(staged.node) <= MAX_NODE_CHARS:
        raise InvalidInput(f"a node name is 1 to {MAX_NODE_CHARS} characters")
    try:
        with s.begin_nested():
            s.execute(
                stagings_t.insert().values(
                    data_id=data_id,
                    run=staged.run,
                    node=staged.node,
                    files=staged.files,
                    bytes=staged.bytes,
                    milliseconds=staged.milliseconds,
                    error=None if staged.error is None else staged.error[:MAX_ERROR_CHARS],
                    created_at=staged.at,
                )
            )
    except IntegrityError:
        return False
    return True
