"""Fake Slurm for the hooks' tests: a command runner that answers only the exact argv it
was given, the lines scontrol and squeue print in Slurm 22.05.8's format, the daemon's
reply shapes, and the environment slurmctld gives a prolog."""

from __future__ import annotations

from typing import Any

from slurm_hooks.squeue import squeue_argv

SCONTROL = "/usr/bin/scontrol"


def ok(result: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "result": result}


def refused(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message, "details": details}}


def hold_object(**overrides: Any) -> dict[str, Any]:
    hold = {
        "id": "h-1",
        "account": "physics",
        "user": "alice",
        "cluster": "lab",
        "job_id": 5,
        "run": 0,
        "state": "active",
        "amount": "1.40",
        "charged": "0",
        "expires_at": "2026-12-02T10:25:01Z",
    }
    hold.update(overrides)
    return hold


class FakeSlurm:
    """Answers only the exact argv it was given; records every call."""

    def __init__(self, answers: dict[tuple[str, ...], str | Exception]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Any) -> str:
        argv = list(argv)
        self.calls.append(argv)
        answer = self.answers.get(tuple(argv))
        if answer is None:
            raise AssertionError(f"unexpected command {argv}")
        if isinstance(answer, Exception):
            raise answer
        return answer


def show(job_id: int) -> tuple[str, ...]:
    return (SCONTROL, "show", "job", "-d", "-o", str(job_id))


def hold_argv(job_id: int | str, text: str) -> tuple[str, ...]:
    return (
        SCONTROL,
        "update",
        f"jobid={job_id}",
        "priority=0",
        f"comment=gpucredit: {text}",
        "admincomment=gpucredit-hold",
    )


def job_line(
    job_id: int = 5,
    *,
    state: str = "CONFIGURING",
    restarts: int = 0,
    time_limit: str = "00:15:00",
    start: str = "2026-12-02T10:00:01",
    end: str = "2026-12-02T10:15:01",
    tres: str = "cpu=1,node=1,billing=31,gres/gpu=2,gres/gpu:a100=1,gres/gpu:h100=1",
    job_gres: str = "gpu:a100:1,gpu:h100:1",
    groups: tuple[tuple[str, str], ...] = (("node1", "gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)"),),
    node_list: str = "node1",
) -> str:
    """A `scontrol show job -d -o` line in Slurm 22.05.8's format."""
    detail = " ".join(f"Nodes={n} CPU_IDs=0 Mem=0 GRES={g}" for n, g in groups)
    return (
        f"JobId={job_id} JobName=wrap UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A "
        f"Priority=1 Nice=0 Account=physics QOS=normal JobState={state} Reason=None "
        f"Dependency=(null) Requeue=1 Restarts={restarts} BatchFlag=1 Reboot=0 ExitCode=0:0 "
        f"DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit={time_limit} TimeMin=N/A "
        f"SubmitTime=2026-12-02T10:00:00 EligibleTime=2026-12-02T10:00:00 "
        f"AccrueTime=2026-12-02T10:00:00 StartTime={start} EndTime={end} Deadline=N/A "
        f"SuspendTime=None SecsPreSuspend=0 LastSchedEval={start} Scheduler=Main "
        f"Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null) ExcNodeList=(null) "
        f"NodeList={node_list} BatchHost=node1 NumNodes={len(groups) or 1} NumCPUs=1 "
        f"NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES={tres} Socks/Node=* "
        f"NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES={job_gres} {detail} MinCPUsNode=1 "
        f"MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
        f"OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        f"WorkDir=/home/alice StdErr=/home/alice/slurm-{job_id}.out StdIn=/dev/null "
        f"StdOut=/home/alice/slurm-{job_id}.out Power=\n"
    )


SQUEUE = "/usr/bin/squeue"


def queue(job_spec: int | str) -> tuple[str, ...]:
    """The ctld hooks' read of one job (slurm_hooks/squeue.py)."""
    return tuple(squeue_argv(SQUEUE, str(job_spec)))


def queue_line(
    job_id: int = 5,
    *,
    state: str = "CONFIGURING",
    restarts: int = 0,
    time_limit: str = "15:00",
    submit: str = "2026-12-02T10:00:00",
    start: str = "2026-12-02T10:00:01",
    end: str = "2026-12-02T10:15:01",
    tres: str = "cpu=1,node=1,billing=31,gres/gpu=2,gres/gpu:a100=1,gres/gpu:h100=1",
    node_list: str = "node1",
    num_nodes: int = 1,
    account: str = "physics",
    het: tuple[int, int] | None = None,
    array: tuple[int, int] | None = None,
) -> str:
    """A `squeue --Format` line of SQUEUE_FIELDS in Slurm 22.05.8's format."""
    het_id, het_offset = ("N/A", "N/A") if het is None else map(str, het)
    array_id, task_id = (str(job_id), "N/A") if array is None else map(str, array)
    values = [
        str(job_id), het_id, het_offset, array_id, task_id, str(restarts), state, time_limit, submit, start,
        end, "alice", "1001", account, "debug", str(num_nodes), node_list, tres,
    ]  # fmt: skip
    return "".join(f"{value}|" for value in values) + "\n"


def ctld_env(config_path: str, job_id: int = 5, restart: int = 0, **extra: str) -> dict[str, str]:
    """PrologSlurmctld/EpilogSlurmctld environment (docs/slurm-facts.md §5): no PATH, no GPU variables."""
    env = {
        "GPUCREDIT_CONFIG": config_path,
        "SLURM_CLUSTER_NAME": "lab",
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_ACCOUNT": "physics",
        "SLURM_JOB_CPUS_PER_NODE": "1",
        "SLURM_JOB_GID": "1001",
        "SLURM_JOB_GROUP": "alice",
        "SLURM_JOB_NAME": "wrap",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_JOB_RESTART_COUNT": str(restart),
        "SLURM_JOB_STDIN": "/dev/null",
        "SLURM_JOB_STDOUT": f"/home/alice/slurm-{job_id}.out",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_WORK_DIR": "/home/alice",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
    }
    env.update(extra)
    return env
