"""Where finished runs and running jobs come from.

A :class:`JobSource` answers two questions:

* ``finished_runs(since, until)`` -- every finished run (attempt) of the jobs
  that were active in ``[since, until]``, from Slurm's accounting database;
* ``running_jobs()`` -- the jobs that hold an allocation right now.

Both return parse results (records *and* errors): nothing Slurm printed is
dropped silently, and the caller decides what a partial answer is worth.

:class:`CommandsSource` runs ``sacct`` and ``squeue`` through a
:class:`~accounting_bridge.slurm.slurmcmd.Runner` and parses their output with the
pure parsers in :mod:`accounting_bridge.slurm.records`. It is always available.

:class:`PyslurmSource` uses ``pyslurm`` for running jobs. It is chosen only
when ``pyslurm`` imports *and* its major.minor equals the running Slurm's
(pyslurm 22.5.x for Slurm 22.05; PyPI's current pyslurm targets 25.11, so on
22.05 it is never chosen). Even then finished runs come from ``sacct``:
pyslurm 22.5's ``slurmdb_jobs().get()`` returns a dict keyed by job id, so the
earlier attempts of a requeued job overwrite each other, and its TRES strings
carry numeric TRES ids instead of names. :func:`select_backend` is the pure
decision; :func:`make_job_source` applies it.

Why ``finished_runs`` queries twice: a ``-S/-E`` window returns only the
attempts that overlap the window, but the run index of an attempt is its
position among *all* attempts of its job (sacct has no restart counter in
22.05). So the window query finds the job ids, and a second query by id (with
a look-back) fetches every attempt of those jobs before runs are numbered.
Rows can also surface late (a job with a future ``--begin`` is not returned
by a window query until it becomes eligible); callers should overlap their
windows, and rely on ``(cluster, job_id, run)`` being idempotent.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from types import ModuleType
from typing import Any, Literal, Protocol

from accounting_bridge.slurm.records import (
    ParseError,
    ParseResult,
    SqueueJob,
    SqueueResult,
    parse_json,
    parse_parsable2,
    parse_squeue_json,
    sacct_argv,
    sacct_jobs_argv,
    squeue_argv,
)
from accounting_bridge.slurm.slurmcmd import Runner
from slurmtext import (
    JobSpec,
    expand_hostlist,
    gpus_from_tres,
    parse_limit_minutes,
    parse_tres,
    requested_gpus,
    time_from_epoch,
)

__all__ = [
    "DEFAULT_ATTEMPT_LOOKBACK",
    "MAX_JOB_IDS_PER_QUERY",
    "BackendChoice",
    "CommandsSource",
    "JobSource",
    "PyslurmSource",
    "make_job_source",
    "parse_slurm_version",
    "select_backend",
    "slurm_version",
]

# How far before `since` the by-id query looks for earlier attempts of a job.
DEFAULT_ATTEMPT_LOOKBACK = timedelta(days=30)
# Job ids per `sacct --jobs` call: keeps argv well below ARG_MAX.
MAX_JOB_IDS_PER_QUERY = 500


class JobSource(Protocol):
    """Where finished runs and running jobs come from."""

    def finished_runs(self, since: datetime, until: datetime) -> ParseResult: ...

    def running_jobs(self) -> SqueueResult: ...


# --------------------------------------------------------------------------- commands


class CommandsSource:
    """Finished runs from ``sacct``, running jobs from ``squeue --json``."""

    def __init__(
        self,
        runner: Runner,
        *,
        cluster: str | None = None,
        sacct_format: Literal["parsable2", "json"] = "parsable2",
        tz: tzinfo | None = None,
        attempt_lookback: timedelta = DEFAULT_ATTEMPT_LOOKBACK,
        max_job_ids_per_query: int = MAX_JOB_IDS_PER_QUERY,
    ) -> None:
        if sacct_format not in ("parsable2", "json"):
            raise ValueError(f"sacct_format must be 'parsable2' or 'json', got {sacct_format!r}")
        if max_job_ids_per_query < 1:
            raise ValueError("max_job_ids_per_query must be at least 1")
        if attempt_lookback < timedelta(0):
            raise ValueError("attempt_lookback must not be negative")
        self.runner = runner
        self.cluster = cluster
        self.sacct_format = sacct_format
        self.tz = tz
        self.attempt_lookback = attempt_lookback
        self.max_job_ids_per_query = max_job_ids_per_query

    def _parse(self, text: str) -> ParseResult:
        if self.sacct_format == "json":
            return parse_json(text)
        return parse_parsable2(text, tz=self.tz)

    def window_argv(self, since: datetime, until: datetime) -> list[str]:
        return sacct_argv(
            since,
            until,
            cluster=self.cluster,
            json_format=self.sacct_format == "json",
            tz=self.tz,
        )

    def jobs_argv(self, job_ids: Iterable[int], since: datetime, until: datetime) -> list[str]:
        return sacct_jobs_argv(
            job_ids,
            since - self.attempt_lookback,
            until,
            cluster=self.cluster,
            json_format=self.sacct_format == "json",
            tz=self.tz,
        )

    def finished_runs(self, since: datetime, until: datetime) -> ParseResult:
        """Every finished run of the jobs active in [since, until], runs numbered.

        Raises SlurmCommandError when sacct itself fails.
        """
        window = self._parse(self.runner(self.window_argv(since, until)))
        job_ids = {run.job_id for run in window.runs}
        job_ids |= {error.job_id for error in window.errors if error.job_id is not None}
        # Rows whose id could be read come back in the by-id query; report them once, there.
        result = ParseResult(errors=[e for e in window.errors if e.job_id is None])
        ordered = sorted(job_ids)
        seen: set[tuple[str, int, int]] = set()
        seen_errors: set[tuple[str, str]] = set()
        for start in range(0, len(ordered), self.max_job_ids_per_query):
            batch = ordered[start : start + self.max_job_ids_per_query]
            complete = self._parse(self.runner(self.jobs_argv(batch, since, until)))
            for error in complete.errors:
                if (error.line, error.reason) not in seen_errors:
                    seen_errors.add((error.line, error.reason))
                    result.errors.append(error)
            for run in complete.runs:
                # `--jobs 6` also returns array 6's other tasks: keep each run once.
                if run.finished and run.key not in seen:
                    seen.add(run.key)
                    result.runs.append(run)
        return result

    def running_jobs(self) -> SqueueResult:
        """Jobs holding an allocation now (see SqueueJob.allocated)."""
        everything = parse_squeue_json(self.runner(squeue_argv()))
        return SqueueResult(jobs=[job for job in everything.jobs if job.allocated], errors=everything.errors)


# --------------------------------------------------------------------------- pyslurm


class PyslurmSource:
    """Running jobs through pyslurm's ``job().get()``; finished runs through sacct.

    Written against pyslurm 22.5's dict API (keys as in pyslurm/pyslurm.pyx of
    that release); only selected when the versions match (see select_backend).
    """

    def __init__(self, pyslurm: Any, commands: CommandsSource, *, cluster: str) -> None:
        self.pyslurm = pyslurm
        self.commands = commands
        self.cluster = cluster

    def finished_runs(self, since: datetime, until: datetime) -> ParseResult:
        return self.commands.finished_runs(since, until)

    def running_jobs(self) -> SqueueResult:
        result = SqueueResult()
        jobs: Mapping[Any, Mapping[str, Any]] = self.pyslurm.job().get()
        for position, (job_id, record) in enumerate(sorted(jobs.items()), start=1):
            try:
                job = _job_from_pyslurm(record, self.cluster, position)
            except (KeyError, TypeError, ValueError) as exc:
                result.errors.append(
                    ParseError(position, repr(record)[:500], f"pyslurm record: {exc!r}", job_id)
                )
                continue
            if job.allocated:
                result.jobs.append(job)
        return result


def _job_from_pyslurm(record: Mapping[str, Any], cluster: str, position: int) -> SqueueJob:
    def epoch(key: str) -> datetime | None:
        value = record.get(key)
        return None if value is None else time_from_epoch(int(value))

    limit = record.get("time_limit")
    alloc = parse_tres(record.get("tres_alloc_str") or "")
    job_id = int(record["job_id"])
    array_job_id = record.get("array_job_id") or None
    array_task_id = record.get("array_task_id")
    het_job_id = record.get("het_job_id") or None
    het_offset = record.get("het_job_offset")
    if het_job_id is not None:
        spec = JobSpec(het_job_id, het_offset=het_offset)
    elif array_job_id is not None:
        spec = JobSpec(array_job_id, array_task_id=array_task_id)
    else:
        spec = JobSpec(job_id)
    nodes = tuple(expand_hostlist(record.get("nodes") or "")) if alloc else ()
    return SqueueJob(
        cluster=cluster,
        job_id=job_id,
        display_id=str(spec),
        run=int(record["restart_cnt"]),
        user=_user_name(int(record["user_id"])),
        account=record.get("account") or "",
        partition=record.get("partition") or "",
        state=str(record["job_state"]),
        submit=epoch("submit_time"),
        start=epoch("start_time"),
        end=epoch("end_time"),
        time_limit_seconds=parse_limit_minutes(limit) if isinstance(limit, int) else None,
        gpus=gpus_from_tres(alloc),
        requested_gpus=requested_gpus(parse_tres(record.get("tres_req_str") or "")),
        nodes=nodes,
        node_count=int(record.get("num_nodes") or 0) if alloc else 0,
        name=record.get("name") or "",
        gpu_indices={},
        array_job_id=array_job_id,
        array_task_id=array_task_id if array_job_id is not None else None,
        het_job_id=het_job_id,
        het_offset=het_offset if het_job_id is not None else None,
        line_no=position,
    )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# --------------------------------------------------------------------------- selection


_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


def parse_slurm_version(text: str) -> tuple[int, int]:
    """``slurm 22.05.8`` / ``slurm-wlm 22.05.8`` (Debian) / ``22.5.1`` -> (22, 5)."""
    match = _VERSION_RE.search(text)
    if match is None:
        raise ValueError(f"no version number in {text!r}")
    return int(match[1]), int(match[2])


def slurm_version(runner: Runner) -> str:
    """What ``sinfo --version`` prints, stripped."""
    return runner(["sinfo", "--version"]).strip()


def _pyslurm_version(module: Any) -> str | None:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    legacy = getattr(module, "version", None)  # pyslurm <= 22.5: a function
    if callable(legacy):
        value = legacy()
        return value if isinstance(value, str) else None
    return None


@dataclass(frozen=True)
class BackendChoice:
    kind: Literal["pyslurm", "commands"]
    reason: str


def select_backend(pyslurm: Any, slurm_version_text: str) -> BackendChoice:
    """Pure: pyslurm only when it imported (not None) and its major.minor equals Slurm's."""
    if pyslurm is None:
        return BackendChoice("commands", "pyslurm is not installed")
    try:
        slurm = parse_slurm_version(slurm_version_text)
    except ValueError:
        return BackendChoice("commands", f"cannot read Slurm version from {slurm_version_text!r}")
    version_text = _pyslurm_version(pyslurm)
    if version_text is None:
        return BackendChoice("commands", "pyslurm does not report a version")
    try:
        binding = parse_slurm_version(version_text)
    except ValueError:
        return BackendChoice("commands", f"cannot read pyslurm version {version_text!r}")
    if binding != slurm:
        return BackendChoice(
            "commands",
            f"pyslurm {version_text} targets Slurm {binding[0]}.{binding[1]:02d}, "
            f"running Slurm is {slurm[0]}.{slurm[1]:02d}",
        )
    return BackendChoice("pyslurm", f"pyslurm {version_text} matches Slurm {slurm_version_text}")


def _import_pyslurm() -> ModuleType | None:
    try:
        import pyslurm  # optional extra: gpucredit[slurm]
    except ImportError:
        return None
    return pyslurm


def make_job_source(
    runner: Runner,
    *,
    cluster: str,
    sacct_format: Literal["parsable2", "json"] = "parsable2",
    tz: tzinfo | None = None,
    import_pyslurm: Callable[[], Any] = _import_pyslurm,
) -> tuple[JobSource, BackendChoice]:
    """The job source for this machine, and why it was chosen."""
    commands = CommandsSource(runner, cluster=cluster, sacct_format=sacct_format, tz=tz)
    module = import_pyslurm()
    choice = select_backend(module, slurm_version(runner) if module is not None else "")
    if choice.kind == "pyslurm" and module is not None:
        return PyslurmSource(module, commands, cluster=cluster), choice
    return commands, choice
