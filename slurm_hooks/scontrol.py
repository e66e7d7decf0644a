"""Parse `scontrol show job -d -o JOBID` (Slurm 22.05): text in, JobInfo out.

Only the node hooks read this text, for what no other output has: each node's
GPU indices (`GRES=gpu:a100:1(IDX:0)`), so the NVML agent samples the right
devices. What is billed (account, times, the allocated GPUs) the controller-side
hooks and the daemon read from `slurm_hooks.squeue`, whose fields hold no user
text. Pure and stdlib-only; the hooks run the command and hand the text here.

The one-line format is `Key=Value` pairs separated by spaces, but some values
contain spaces (`JobName=`, `Command=`, `WorkDir=`, `Comment=`, `Reason=`,
`StdOut=`...), and a job's name may hold any character, line breaks included:
`-o` then prints one job over several lines. So a record runs from `JobId=` to
the next line that starts with `JobId=`; a line break anywhere else belongs to
a value. Inside the free-text values only a *known* Slurm key ends the value;
elsewhere any ` Word=` does. Users control some free text (the job name, the
comment), so they could write ` TimeLimit=00:00:01` into a name: every key we
read must therefore occur exactly once, and the job's record exactly once, or
the text is ambiguous and `ScontrolParseError` is raised rather than guessing.

This module reads the record; the values in it (hostlists, TRES, GRES, times,
durations) are read by `slurmtext`, Slurm's text formats in one place, with its
strictness: a value in no form Slurm prints raises rather than being skipped.

With `-d`, one `Nodes=... CPU_IDs=... Mem=... GRES=...` group follows
`JOB_GRES=` per set of nodes with identical allocations; `Nodes=` may be a
hostlist (`node[1-2]`) and `GRES=` carries node-local indices, e.g.
`gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)`. Those groups are only read between
`JOB_GRES=` and `MinCPUsNode=`, where no free text can appear. `parse_node_gpus`, the
node hooks' reader, needs only those and `JobId=` to be unambiguous: a name spelling
other keys (22.05 prints `TRES=`, 26.05 the name again in `SubmitLine=`) leaves the
indices readable on every version.
"""

from __future__ import annotations

import re
from datetime import tzinfo

from slurm_hooks.jobinfo import JobInfo
from slurmtext import (
    UNTYPED_GPU,
    SlurmTextError,
    expand_hostlist,
    gpus_from_tres,
    gres_gpu_indices,
    gres_gpus,
    parse_duration,
    parse_time,
    parse_tres,
)

__all__ = ["UNTYPED_GPU", "JobInfo", "ScontrolParseError", "parse_job", "parse_line", "parse_node_gpus"]

# What the hooks catch: every malformed value is slurmtext's error, and so is an
# ambiguous or unusable line (one error type for all of Slurm's text).
ScontrolParseError = SlurmTextError

# Values that may contain spaces; only a KNOWN_KEYS key ends them.
FREE_TEXT_KEYS = frozenset(
    {
        "JobName",
        "Reason",
        "Command",
        "WorkDir",
        "AdminComment",
        "SystemComment",
        "Comment",
        "StdErr",
        "StdIn",
        "StdOut",
        "BurstBuffer",
        "BurstBufferState",
        "Container",
        "MailUser",
        "SubmitLine",  # 26.05: the sbatch command line as typed
    }
)

# Keys `scontrol show job -d` prints in 22.05 (src/api/job_info.c).
KNOWN_KEYS = FREE_TEXT_KEYS | frozenset(
    {
        "JobId", "ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle", "HetJobId",
        "HetJobOffset", "HetJobIdSet", "UserId", "GroupId", "MCS_label", "Priority",
        "Nice", "Account", "QOS", "WCKey", "JobState", "Dependency", "Requeue",
        "Restarts", "BatchFlag", "Reboot", "ExitCode", "DerivedExitCode", "RunTime",
        "TimeLimit", "TimeMin", "SubmitTime", "EligibleTime", "AccrueTime", "StartTime",
        "EndTime", "Deadline", "PreemptEligibleTime", "PreemptTime", "SuspendTime",
        "SecsPreSuspend", "LastSchedEval", "Scheduler", "ResizeTime", "Partition",
        "AllocNode:Sid", "ReqNodeList", "ExcNodeList", "NodeList", "SchedNodeList",
        "BatchHost", "NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "ReqB:S:C:T",
        "TRES", "Socks/Node", "NtasksPerN:B:S:C", "CoreSpec", "ThreadSpec", "JOB_GRES",
        "Nodes", "CPU_IDs", "Mem", "GRES", "MinCPUsNode", "MinMemoryNode",
        "MinMemoryCPU", "MinTmpDiskNode", "Features", "ClusterFeatures", "Reservation",
        "DelayBoot", "OverSubscribe", "Contiguous", "Licenses", "Network", "Power",
        "CpuFreqMin", "CpuFreqMax", "CpuFreqGov", "TresPerJob", "TresPerNode",
        "TresPerSocket", "TresPerTask", "TresBind", "TresFreq", "CpusPerTres",
        "MemPerTres", "NtasksPerTRES", "MailType", "Switches", "Wait-for-Switch",
        "KillOInInvalidDependent", "FedOrigin", "FedViaSiblings", "FedActiveSiblings",
        "FedOriginRaw", "FedViaSiblingsRaw", "FedActiveSiblingsRaw", "SelinuxContext",
        "ResvPorts", "Profile", "Gres", "GresEnforceBind", "Cluster",
        "SiblingsActive", "SiblingsViable", "OOMKillStep", "Epilog", "Prolog",
        # 24.11 and 26.05 (tests/fixtures/slurm-*/scontrol_show_job_d_o)
        "ReqTRES", "AllocTRES", "SLUID", "Exclusive", "LicensesAlloc", "CronJob", "Segment",
        "SegmentSize",
    }
)  # fmt: skip

# Keys the hooks and the daemon rely on: each must occur at most once (see module
# docstring). AdminComment marks a job the daemon held for credit and may release.
UNIQUE_KEYS = frozenset(
    {
        "JobId", "UserId", "Account", "JobState", "Restarts", "TimeLimit", "SubmitTime", "StartTime",
        "EndTime", "Partition", "NodeList", "NumNodes", "TRES", "AllocTRES", "JOB_GRES", "MinCPUsNode",
        "AdminComment",
    }
)  # fmt: skip

_KEY_START = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_:/\-]*)=")
_USER = re.compile(r"(.*)\(([0-9]+)\)")
_INT = re.compile(r"[0-9]+")


def parse_line(line: str) -> list[tuple[str, str]]:
    """Split one `-o` record into (key, value) pairs, in order, repeats kept. A line
    break inside the record is part of a value (only a space starts a key)."""
    line = line.strip(" \n")
    if not line:
        raise ScontrolParseError("empty scontrol output")
    starts = list(_KEY_START.finditer(line))
    if not starts or starts[0].start() != 0:
        raise ScontrolParseError(f"scontrol output does not start with Key=: {line[:80]!r}")
    pairs: list[tuple[str, str]] = []
    key = starts[0].group(1)
    value_start = starts[0].end()
    for match in starts[1:]:
        if match.start() < value_start:
            continue  # inside the current key's own `Key=` (cannot happen; be safe)
        candidate = match.group(1)
        if key in FREE_TEXT_KEYS and candidate not in KNOWN_KEYS:
            continue  # `sbatch -J "a b=c"`: still the job name
        pairs.append((key, line[value_start : match.start()].strip()))
        key = candidate
        value_start = match.end()
    pairs.append((key, line[value_start:].strip()))
    return pairs


def _job_gres(value: str) -> dict[str, int]:
    """GPU totals by type from `JOB_GRES=gpu:a100:1,gpu:2`; untyped ones as UNTYPED_GPU."""
    gpus: dict[str, int] = {}
    for gpu_type, count in gres_gpus(value).items():
        name = gpu_type or UNTYPED_GPU
        gpus[name] = gpus.get(name, 0) + count
    return gpus


def _time_limit(value: str | None) -> int | None:
    # No TimeLimit key reads as no limit (None), like UNLIMITED: the caller decides.
    return None if value is None else parse_duration(value)


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    match = _INT.match(value.strip())
    return int(match.group()) if match else None


# Where one job's record ends and the next begins: a line break right before `JobId=`.
_RECORD_START = re.compile(r"\n(?=JobId=)")


def _select_record(text: str, job_id: int | None) -> str:
    """The record of `job_id` (the only record, when None): exactly one, or raise."""
    records = [record for record in _RECORD_START.split(text.strip("\n")) if record.strip()]
    if not records:
        raise ScontrolParseError("empty scontrol output")
    if job_id is None:
        if len(records) != 1:
            raise ScontrolParseError(f"scontrol printed {len(records)} records; expected one job")
        return records[0]
    prefix = re.compile(rf"JobId={job_id}(?= |$)")
    mine = [record for record in records if prefix.match(record)]
    if len(mine) != 1:
        raise ScontrolParseError(
            f"job {job_id} not in scontrol output"
            if not mine
            else f"ambiguous scontrol output: {len(mine)} records start JobId={job_id} "
            "(a job name or comment holding a line break and 'JobId=' text?)"
        )
    return mine[0]


def _node_groups(pairs: list[tuple[str, str]]) -> dict[str, dict[int, str]]:
    """Each node's GPU indices, from the `Nodes= ... GRES=` groups right after JOB_GRES
    (after 22.05's TRES, 24.11's and 26.05's AllocTRES: no free text between)."""
    keys = [key for key, _ in pairs]
    if "JOB_GRES" not in keys:
        return {}
    start = keys.index("JOB_GRES")
    node_gpus: dict[str, dict[int, str]] = {}
    current: list[str] = []
    for key, value in pairs[start + 1 :]:
        if key == "MinCPUsNode" or key in FREE_TEXT_KEYS:
            break
        if key == "Nodes":
            current = expand_hostlist(value)
            for node in current:
                node_gpus.setdefault(node, {})
        elif key == "GRES":
            by_index = gres_gpu_indices(value)
            for node in current:
                node_gpus[node].update(by_index)
    return {node: gpus for node, gpus in node_gpus.items() if gpus}


def parse_node_gpus(text: str, job_id: int) -> dict[str, dict[int, str]]:
    """Each node's GPU indices and types for `job_id`: all the node hooks read.

    Only the keys this reads must be unique: the record's `JobId=` and `JOB_GRES=` (the
    groups follow it, up to `MinCPUsNode=`, with no free text between). A job name that
    spells `TRES=` or `AdminComment=` leaves the indices readable on every version,
    where parse_job refuses the whole record: 22.05 prints `TRES=` itself, 26.05 prints
    the name twice (`JobName=` and `SubmitLine=`), 24.11 neither (docs/slurm-facts.md §16).
    """
    pairs = parse_line(_select_record(text, job_id))
    if _int_or_none(pairs[0][1]) != job_id:
        raise ScontrolParseError(f"scontrol answered for {pairs[0][0]}={pairs[0][1]}, not job {job_id}")
    if sum(1 for key, _ in pairs if key == "JOB_GRES") > 1:
        raise ScontrolParseError(
            "ambiguous scontrol output: JOB_GRES appears more than once "
            "(a job name or comment containing 'JOB_GRES=' text?)"
        )
    return _node_groups(pairs)


def parse_job(text: str, job_id: int | None = None, tz: tzinfo | None = None) -> JobInfo:
    """Parse `scontrol show job -d -o` output (the line of `job_id` if several)."""
    pairs = parse_line(_select_record(text, job_id))
    counts: dict[str, int] = {}
    fields: dict[str, str] = {}
    for key, value in pairs:
        counts[key] = counts.get(key, 0) + 1
        fields.setdefault(key, value)
    repeated = sorted(k for k in UNIQUE_KEYS if counts.get(k, 0) > 1)
    if repeated:
        raise ScontrolParseError(
            f"ambiguous scontrol output: {', '.join(repeated)} appear(s) more than once "
            "(a job name or comment containing 'Key=' text?)"
        )
    parsed_id = _int_or_none(fields.get("JobId"))
    if parsed_id is None:
        raise ScontrolParseError("scontrol output has no JobId")
    if job_id is not None and parsed_id != job_id:
        raise ScontrolParseError(f"scontrol answered for job {parsed_id}, not {job_id}")

    user: str | None = fields.get("UserId")
    uid: int | None = None
    if user is not None:
        match = _USER.fullmatch(user)
        if match:
            user, uid = match.group(1) or None, int(match.group(2))
        elif _INT.fullmatch(user):  # a uid with no name
            uid = int(user)
            user = None

    # 22.05 prints the job's TRES as TRES=, 24.11 and later as AllocTRES= (and ReqTRES=):
    # there, a `TRES=` is no key of Slurm's, and only a job name can have put it in.
    tres = fields["AllocTRES"] if "AllocTRES" in fields else fields.get("TRES", "")
    gpus = gpus_from_tres(parse_tres(tres))
    if not gpus:
        gpus = _job_gres(fields.get("JOB_GRES", ""))
    restarts = _int_or_none(fields.get("Restarts"))
    return JobInfo(
        job_id=parsed_id,
        user=user,
        uid=uid,
        account=fields.get("Account") or None,
        partition=fields.get("Partition") or None,
        state=fields.get("JobState") or None,
        restarts=restarts or 0,
        num_nodes=_int_or_none(fields.get("NumNodes")),
        node_list=fields.get("NodeList") or None,
        time_limit_seconds=_time_limit(fields.get("TimeLimit")),
        start_time=parse_time(fields.get("StartTime"), tz),
        end_time=parse_time(fields.get("EndTime"), tz),
        submit_time=parse_time(fields.get("SubmitTime"), tz),
        gpus=gpus,
        node_gpus=_node_groups(pairs),
        fields=fields,
    )
