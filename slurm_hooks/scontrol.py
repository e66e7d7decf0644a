"""Parse `scontrol show job -d -o JOBID` (Slurm 22.05): text in, JobInfo out.

Pure and stdlib-only; the hooks run the command and hand the text here.

The one-line format is `Key=Value` pairs separated by spaces, but some values
contain spaces (`JobName=`, `Command=`, `WorkDir=`, `Comment=`, `Reason=`,
`StdOut=`...). Inside those free-text values only a *known* Slurm key ends
the value; elsewhere any ` Word=` does. Users control some free text (the job
name, the comment), so they could write ` TimeLimit=00:00:01` into a name to
shrink their hold: every key we read must therefore occur exactly once, or
the line is ambiguous and `ScontrolParseError` is raised rather than guessing.

With `-d`, one `Nodes=... CPU_IDs=... Mem=... GRES=...` group follows
`JOB_GRES=` per set of nodes with identical allocations; `Nodes=` may be a
hostlist (`node[1-2]`) and `GRES=` carries node-local indices, e.g.
`gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)`. Those groups are only read between
`TRES=` and `MinCPUsNode=`, where no free text can appear.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo

__all__ = [
    "UNTYPED_GPU",
    "JobInfo",
    "ScontrolParseError",
    "expand_hostlist",
    "parse_gpu_tres",
    "parse_index_list",
    "parse_job",
    "parse_job_gres",
    "parse_line",
    "parse_node_gres",
    "parse_time_limit",
    "parse_timestamp",
]

# GPUs with no type (gres/gpu=2 and nothing typed) are reported under this name.
UNTYPED_GPU = "gpu"

# A job spanning more nodes than this is garbage in the output, not a job.
MAX_HOSTS = 100_000

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
    }
)  # fmt: skip

# Keys the hooks rely on: each must occur at most once (see module docstring).
UNIQUE_KEYS = frozenset(
    {
        "JobId", "UserId", "Account", "JobState", "Restarts", "TimeLimit", "SubmitTime", "StartTime",
        "EndTime", "Partition", "NodeList", "NumNodes", "TRES", "JOB_GRES", "MinCPUsNode",
    }
)  # fmt: skip

_KEY_START = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_:/\-]*)=")
_USER = re.compile(r"(.*)\(([0-9]+)\)")
_INT = re.compile(r"[0-9]+")
# scontrol's `%Y-%m-%dT%H:%M:%S`, checked here and read by datetime.fromisoformat.
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")
_NO_TIME = frozenset({"", "Unknown", "None", "N/A", "(null)"})
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "Partition_Limit", "NONE", "N/A"})
_NODE_GRES_ITEM = re.compile(
    r"(?P<name>[A-Za-z0-9_.\-]+)(?::(?P<type>[A-Za-z0-9_.\-]+))?(?::(?P<count>[0-9]+))?"
    r"(?:\((?P<inner>[^)]*)\))?"
)


class ScontrolParseError(ValueError):
    """The scontrol output could not be read (or could be read two ways)."""


class JobInfo:
    """What the hooks need from `scontrol show job -d -o`.

    Times are aware UTC datetimes; `gpus` are job totals by type
    (`{"a100": 1, "h100": 1}`); `node_gpus` maps each node to its node-local
    GPU indices and their types (`{"node1": {0: "a100", 2: "h100"}}`).

    A plain class rather than a dataclass: `dataclasses` imports `inspect`,
    which costs several milliseconds in every hook process (DESIGN §3).
    """

    __slots__ = (
        "account", "end_time", "fields", "gpus", "job_id", "node_gpus", "node_list", "num_nodes",
        "partition", "restarts", "start_time", "state", "submit_time", "time_limit_seconds", "uid",
        "user",
    )  # fmt: skip

    def __init__(
        self,
        *,
        job_id: int,
        user: str | None,
        uid: int | None,
        account: str | None,
        partition: str | None,
        state: str | None,
        restarts: int,
        num_nodes: int | None,
        node_list: str | None,
        time_limit_seconds: int | None,
        start_time: datetime | None,
        end_time: datetime | None,
        submit_time: datetime | None = None,
        gpus: dict[str, int] | None = None,
        node_gpus: dict[str, dict[int, str]] | None = None,
        fields: dict[str, str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.user = user
        self.uid = uid
        self.account = account
        self.partition = partition
        self.state = state
        self.restarts = restarts
        self.num_nodes = num_nodes
        self.node_list = node_list
        self.time_limit_seconds = time_limit_seconds
        self.start_time = start_time
        self.end_time = end_time
        # This attempt's SubmitTime: Slurm resets it on every requeue, and a reused job
        # id gets a new one, so (cluster, job_id, run, submit_time) names one attempt.
        self.submit_time = submit_time
        self.gpus: dict[str, int] = {} if gpus is None else gpus
        self.node_gpus: dict[str, dict[int, str]] = {} if node_gpus is None else node_gpus
        self.fields: dict[str, str] = {} if fields is None else fields

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobInfo):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__ if name != "fields")
        return f"JobInfo({items})"


def parse_line(line: str) -> list[tuple[str, str]]:
    """Split one `-o` line into (key, value) pairs, in order, repeats kept."""
    line = line.strip()
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


def parse_time_limit(value: str | None) -> int | None:
    """Seconds from a Slurm duration; None for UNLIMITED (no limit).

    Slurm's forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`.
    """
    if value is None or value.strip() in _UNLIMITED:
        return None
    text = value.strip()
    days = 0
    if "-" in text:
        day_text, _, text = text.partition("-")
        if not _INT.fullmatch(day_text):
            raise ScontrolParseError(f"bad time limit {value!r}")
        days = int(day_text)
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not all(_INT.fullmatch(p) for p in parts):
            raise ScontrolParseError(f"bad time limit {value!r}")
        hours, minutes, seconds = ([int(p) for p in parts] + [0, 0])[:3]
    else:
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not all(_INT.fullmatch(p) for p in parts):
            raise ScontrolParseError(f"bad time limit {value!r}")
        numbers = [int(p) for p in parts]
        if len(numbers) == 1:
            hours, minutes, seconds = 0, numbers[0], 0
        elif len(numbers) == 2:
            hours, minutes, seconds = 0, numbers[0], numbers[1]
        else:
            hours, minutes, seconds = numbers
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_timestamp(value: str | None, tz: tzinfo | None = None) -> datetime | None:
    """An aware UTC datetime from scontrol's local `YYYY-MM-DDTHH:MM:SS`.

    scontrol prints local time without an offset; `tz` is that zone (None:
    this process's local zone, which is the one scontrol used).
    """
    if value is None or value.strip() in _NO_TIME:
        return None
    # Not datetime.strptime: its first call imports _strptime and builds locale
    # tables, ~10 ms that every PrologSlurmctld would pay (fromisoformat is C).
    text = value.strip()
    if not _TIMESTAMP.fullmatch(text):
        raise ScontrolParseError(f"bad timestamp {value!r}")
    try:
        naive = datetime.fromisoformat(text)
    except ValueError as e:  # month 13, hour 24...
        raise ScontrolParseError(f"bad timestamp {value!r}") from e
    local = naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()
    return local.astimezone(UTC)


def parse_gpu_tres(tres: str | None) -> dict[str, int]:
    """GPU counts by type from a TRES string (`...,gres/gpu:a100=1,gres/gpu=2`).

    Typed entries win; GPUs counted by `gres/gpu=N` beyond the typed ones
    are untyped and reported as `UNTYPED_GPU`.
    """
    typed: dict[str, int] = {}
    total: int | None = None
    for item in (tres or "").split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not (key == "gres/gpu" or key.startswith("gres/gpu:")):
            continue
        if not _INT.fullmatch(value):
            raise ScontrolParseError(f"bad GPU count in TRES item {item!r}")
        if key == "gres/gpu":
            total = int(value)
        else:
            gpu_type = key[len("gres/gpu:") :]
            typed[gpu_type] = typed.get(gpu_type, 0) + int(value)
    gpus = {t: n for t, n in typed.items() if n > 0}
    untyped = (total or 0) - sum(gpus.values())
    if untyped > 0:
        gpus[UNTYPED_GPU] = gpus.get(UNTYPED_GPU, 0) + untyped
    return gpus


def _split_outside_parens(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_job_gres(value: str | None) -> dict[str, int]:
    """GPU counts by type from `JOB_GRES=gpu:a100:1,gpu:h100:1` (or `gpu:2`)."""
    gpus: dict[str, int] = {}
    if value is None or value.strip() in ("", "(null)", "N/A"):
        return gpus
    for item in _split_outside_parens(value):
        match = _NODE_GRES_ITEM.fullmatch(item)
        if not match:
            raise ScontrolParseError(f"bad GRES item {item!r}")
        if match["name"] != "gpu":
            continue
        gpu_type, count = _type_and_count(match)
        if count is None:
            count = len(_indices_of(match["inner"]))
        if count > 0:
            gpus[gpu_type] = gpus.get(gpu_type, 0) + count
    return gpus


def _type_and_count(match: re.Match[str]) -> tuple[str, int | None]:
    gpu_type, count = match["type"], match["count"]
    if count is None and gpu_type is not None and _INT.fullmatch(gpu_type):
        gpu_type, count = None, gpu_type  # gpu:2 is a count, not a type
    return gpu_type or UNTYPED_GPU, int(count) if count is not None else None


def _indices_of(inner: str | None) -> list[int]:
    if not inner or not inner.startswith("IDX:"):
        return []
    return parse_index_list(inner[len("IDX:") :])


def parse_index_list(spec: str) -> list[int]:
    """`0-1,3` -> [0, 1, 3]; `N/A` or empty -> []."""
    spec = spec.strip()
    if spec in ("", "N/A", "(null)"):
        return []
    indices: list[int] = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not _INT.fullmatch(first) or (dash and not _INT.fullmatch(last)):
            raise ScontrolParseError(f"bad GPU index list {spec!r}")
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high - low > 4096:
            raise ScontrolParseError(f"bad GPU index range {part!r}")
        indices.extend(range(low, high + 1))
    return indices


def parse_node_gres(value: str | None) -> dict[int, str]:
    """Node-local GPU index -> type from a `-d` group's `GRES=` value.

    `gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)` -> {0: "a100", 2: "h100"}.
    """
    by_index: dict[int, str] = {}
    if value is None or value.strip() in ("", "(null)", "N/A"):
        return by_index
    for item in _split_outside_parens(value):
        match = _NODE_GRES_ITEM.fullmatch(item)
        if not match:
            raise ScontrolParseError(f"bad GRES item {item!r}")
        if match["name"] != "gpu":
            continue
        gpu_type, _ = _type_and_count(match)
        for index in _indices_of(match["inner"]):
            by_index[index] = gpu_type
    return by_index


def _split_brackets(text: str) -> list[str]:
    """Split a hostlist on commas that are not inside [...]."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ScontrolParseError(f"bad hostlist {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ScontrolParseError(f"bad hostlist {text!r}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_host(pattern: str, out: list[str]) -> None:
    open_at = pattern.find("[")
    if open_at < 0:
        out.append(pattern)
        return
    close_at = pattern.index("]", open_at)
    prefix, body, suffix = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    for part in body.split(","):
        first, dash, last = part.strip().partition("-")
        if not _INT.fullmatch(first) or (dash and not _INT.fullmatch(last)):
            raise ScontrolParseError(f"bad hostlist range {part!r} in {pattern!r}")
        width = len(first)
        for number in range(int(first), (int(last) if dash else int(first)) + 1):
            if len(out) >= MAX_HOSTS:
                raise ScontrolParseError(f"hostlist {pattern!r} is too long")
            _expand_host(f"{prefix}{number:0{width}d}{suffix}", out)


def expand_hostlist(expr: str | None) -> list[str]:
    """`node[1-2,5],gpu07` -> ["node1", "node2", "node5", "gpu07"]."""
    hosts: list[str] = []
    if expr is None or expr.strip() in ("", "(null)", "None"):
        return hosts
    for item in _split_brackets(expr.strip()):
        _expand_host(item, hosts)
    return hosts


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    match = _INT.match(value.strip())
    return int(match.group()) if match else None


def _select_line(text: str, job_id: int | None) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ScontrolParseError("empty scontrol output")
    if len(lines) == 1 or job_id is None:
        return lines[0]
    for line in lines:
        if line.strip().startswith(f"JobId={job_id} "):
            return line
    raise ScontrolParseError(f"job {job_id} not in scontrol output")


def _node_groups(pairs: list[tuple[str, str]]) -> dict[str, dict[int, str]]:
    keys = [key for key, _ in pairs]
    start = keys.index("TRES") if "TRES" in keys else 0
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
            by_index = parse_node_gres(value)
            for node in current:
                node_gpus[node].update(by_index)
    return {node: gpus for node, gpus in node_gpus.items() if gpus}


def parse_job(text: str, job_id: int | None = None, tz: tzinfo | None = None) -> JobInfo:
    """Parse `scontrol show job -d -o` output (the line of `job_id` if several)."""
    pairs = parse_line(_select_line(text, job_id))
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

    gpus = parse_gpu_tres(fields.get("TRES"))
    if not gpus:
        gpus = parse_job_gres(fields.get("JOB_GRES"))
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
        time_limit_seconds=parse_time_limit(fields.get("TimeLimit")),
        start_time=parse_timestamp(fields.get("StartTime"), tz),
        end_time=parse_timestamp(fields.get("EndTime"), tz),
        submit_time=parse_timestamp(fields.get("SubmitTime"), tz),
        gpus=gpus,
        node_gpus=_node_groups(pairs),
        fields=fields,
    )
