"""Data a job asked to have on its cloud nodes before it starts (docs/api.md, "Data"):
the paths, kept when the portal submitted the job, and each stage-in a node made.

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
from datetime import datetime
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
    "JobData",
    "Staged",
    "check_data_paths",
    "data_to_stage",
    "job_data",
    "keep_job_data",
    "record_staged",
]

MAX_DATA_PATHS = 32
MAX_PATH_CHARS = 1024
MAX_ERROR_CHARS = 512


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


def keep_job_data(
    s: Session, cluster: str, job_id: int, user: str, paths: Sequence[str], now: datetime
) -> None:
    """Keep `paths` for the job just submitted as `job_id`."""
    s.execute(
        job_data_t.insert().values(
            cluster=cluster,
            job_id=job_id,
            user=user,
            paths=json.dumps(list(check_data_paths(list(paths)))),
            created_at=now,
        )
    )


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


def record_staged(s: Session, data_id: int, staged: Staged) -> bool:
    """Record one node's stage-in of one run; False when that run and node has one already
    (a Prolog Slurm ran twice: the first report stands)."""
    if staged.files < 0 or staged.bytes < 0 or staged.milliseconds < 0:
        raise InvalidInput("a stage-in's files, bytes and milliseconds are 0 or more")
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
