"""Read a job as slurmctld holds it now: `squeue --Format` of fields Slurm sets itself.

What PrologSlurmctld holds and EpilogSlurmctld settles is read here, never from
scontrol's one-line text. A job's name, comment, paths, mail user and wckey are the
user's text and may hold any character: a line break, ` TimeLimit=1`, a whole forged
record. scontrol prints them among the fields that are billed, Slurm 22.05 has no
`scontrol --json`, and its `squeue --json` dumps every job whatever the filter
(docs/slurm-facts.md §13). So the hooks ask squeue, which filters by job id, for the
fields below only: ids, states, times, names of users, accounts and partitions, and
the allocated TRES. None of them is free text, so each line is one job, and
`slurmtext.split_format_line` reads it strictly. The job's output path, the one
user-set field a hook needs, comes from the hook's environment (SLURM_JOB_STDOUT).

`squeue --jobs=ID` answers one job; for a heterogeneous job's leader it answers every
component, which is how a hook reads the parts it holds together. Pure and
stdlib-only: the hooks run the command and hand the text here.
"""

from __future__ import annotations

from datetime import tzinfo

from slurm_hooks.jobinfo import JobInfo
from slurmtext import (
    SlurmTextError,
    expand_hostlist,
    gpus_from_tres,
    parse_duration,
    parse_time,
    parse_tres,
    split_format_line,
)

__all__ = ["SQUEUE_FIELDS", "parse_jobs", "squeue_argv"]

# In this order on each line, each followed by "|" (`--Format=JobID:|,...`).
SQUEUE_FIELDS = (
    "JobID",  # the raw id, as SLURM_JOB_ID
    "HetJobID",
    "HetJobOffset",
    "ArrayJobID",
    "ArrayTaskID",
    "RestartCnt",
    "State",
    "TimeLimit",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "UserName",
    "UserID",
    "Account",
    "Partition",
    "NumNodes",
    "NodeList",
    "tres-alloc",  # the allocation once running; the request while pending
)
_NONE = frozenset({"", "N/A", "(null)"})


def squeue_argv(squeue: str, job_spec: str) -> list[str]:
    """argv for one job (every component of a heterogeneous job's leader), in any state."""
    return [
        squeue,
        "--noheader",
        "--states=all",
        f"--jobs={job_spec}",
        "--Format=" + ",".join(f"{name}:|" for name in SQUEUE_FIELDS),
    ]


def _int(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise SlurmTextError(f"bad {what} {text!r}")
    return int(text)


def _optional_int(text: str, what: str) -> int | None:
    return None if text in _NONE else _int(text, what)


def _name(text: str) -> str | None:
    return None if text in _NONE else text


def _job(values: list[str], tz: tzinfo | None) -> JobInfo:
    (
        job_id, het_job_id, het_offset, array_job_id, array_task_id, restarts, state, time_limit,
        submit, start, end, user, uid, account, partition, num_nodes, node_list, tres,
    ) = values  # fmt: skip
    raw_id = _int(job_id, "JobID")
    het = _optional_int(het_job_id, "HetJobID")
    task: int | None = None
    array: int | None = None
    if array_task_id not in _NONE:
        array = _int(array_job_id, "ArrayJobID")
        # A pending array not yet split prints its indices (`0-2`): no one task.
        task = int(array_task_id) if array_task_id.isascii() and array_task_id.isdigit() else None
    nodes = _name(node_list)
    if nodes is not None:
        expand_hostlist(nodes)  # a hostlist, strictly, or raise
    return JobInfo(
        job_id=raw_id,
        user=_name(user),
        uid=_optional_int(uid, "UserID"),
        account=_name(account),
        partition=_name(partition),
        state=_name(state),
        restarts=_int(restarts, "RestartCnt"),
        num_nodes=_optional_int(num_nodes, "NumNodes"),
        node_list=nodes,
        time_limit_seconds=None if time_limit in _NONE else parse_duration(time_limit),
        start_time=parse_time(start, tz),
        end_time=parse_time(end, tz),
        submit_time=parse_time(submit, tz),
        gpus=gpus_from_tres(parse_tres(tres)),
        het_job_id=het or None,  # 0 is "not heterogeneous" too
        het_offset=_optional_int(het_offset, "HetJobOffset") if het else None,
        array_job_id=array,
        array_task_id=task,
    )


def parse_jobs(text: str, tz: tzinfo | None = None) -> list[JobInfo]:
    """Every line of :func:`squeue_argv`'s output as a JobInfo; a bad line raises
    SlurmTextError (the hooks then hold the job rather than guess)."""
    jobs = []
    for line in text.split("\n"):
        if line.strip():
            jobs.append(_job(split_format_line(line, len(SQUEUE_FIELDS)), tz))
    return jobs
