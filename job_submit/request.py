"""Turn the raw job_desc fields that job_submit.lua forwards into a JobRequest.

Pure and stdlib-only: the daemon calls `parse_submit` on every `submit`
request, so this module must stay cheap to import and free of I/O.

job_submit.lua copies these job_desc fields verbatim (Slurm 22.05.8; see
docs/slurm-facts.md §4), omitting the ones that are nil:

    user_name, user_id, account, default_account, partition,
    tres_per_node, tres_per_job, tres_per_task, time_limit (minutes),
    num_tasks, min_nodes, array_inx, comment, shared (0 for --exclusive),
    partitions: {name: {default_time, max_time, default}}

How GPUs arrive (the gres string is the same shape in each field):

    --gres=gpu:a100:1         tres_per_node = "gres:gpu:a100:1"
    --gres=gpu:2              tres_per_node = "gres:gpu:2"
    --gres=gpu:a100:1,gpu:h100:1
                              tres_per_node = "gres:gpu:a100:1,gres:gpu:h100:1"
    --gpus=2 / --gpus=a100:2  tres_per_job  = "gres:gpu:2" / "gres:gpu:a100:2"
    --gpus-per-node=h100:1    tres_per_node = "gres:gpu:h100:1"
    --gpus-per-task=a100:1    tres_per_task = "gres:gpu:a100:1"

Items without the `gres:` prefix (`gpu:a100:1`) and in the newer
`gres/gpu:a100:1` / `gres/gpu:a100=1` spelling are accepted too. The GRES and
array grammars are slurmtext's; this module turns its errors into codes.

The comment's `gpucredit:max_cost=25,cloud=yes` directives are slurmtext's
grammar too (`comment_directives`).

Errors: `InvalidRequest(code, message)` with code `invalid_gres`,
`invalid_time`, `invalid_array`, `invalid_comment` or `invalid_request`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmtext import (
    INFINITE,
    MAX_ARRAY_INDEX,
    NO_VAL,
    SlurmTextError,
    comment_directives,
    gres_gpus,
    parse_array_indices,
)

__all__ = [
    "INFINITE",
    "MAX_ARRAY_INDEX",
    "NO_VAL",
    "InvalidRequest",
    "JobRequest",
    "parse_array_inx",
    "parse_gres",
    "parse_submit",
]

# NO_VAL is slurm.NO_VAL ("not given"), INFINITE slurm.INFINITE ("no limit").
NO_VAL16 = 65534
INFINITE16 = 65535

# How the GPUs were asked for: which job_desc field carried them.
PER_NODE = "per_node"  # --gres, --gpus-per-node: × nodes
PER_JOB = "per_job"  # --gpus: as is
PER_TASK = "per_task"  # --gpus-per-task: × tasks

_COUNT = re.compile(r"[0-9]+")


class InvalidRequest(ValueError):
    """The forwarded job_desc fields do not describe a job we can price."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class JobRequest:
    """What a submission asks for, for ONE element of a task array.

    `gpus` maps GPU type to the count over the whole job (all nodes, all
    tasks); the key None means untyped GPUs (`--gpus=2`), whose type Slurm
    chooses at allocation. `time_limit_seconds` is None when the job is
    unbounded (INFINITE, or a partition with no limit): the caller refuses or
    caps it. A task array multiplies everything by `array_tasks`.
    """

    user: str
    user_id: int | None
    account: str | None
    partition: str | None
    gpus: dict[str | None, int] = field(default_factory=dict)
    gpus_requested_as: str | None = None  # PER_NODE | PER_JOB | PER_TASK
    time_limit_seconds: int | None = None
    time_limit_source: str = "explicit"  # explicit | partition_default | partition_max | unbounded
    array_tasks: int = 1
    array_max_concurrent: int | None = None
    directives: dict[str, str] = field(default_factory=dict)  # the comment's gpucredit:KEY=VALUE
    user_comment: str = ""  # the comment without those directives
    offered_partitions: tuple[str, ...] = ()  # part_list: the partitions Slurm offers this job
    exclusive: bool = False  # --exclusive: the whole node, every GPU on it included

    @property
    def gpus_per_element(self) -> int:
        return sum(self.gpus.values())

    @property
    def total_gpus(self) -> int:
        """GPUs over all array elements (what the whole submission may use)."""
        return self.gpus_per_element * self.array_tasks

    @property
    def is_array(self) -> bool:
        return self.array_tasks > 1 or self.array_max_concurrent is not None


def _int_field(fields: Mapping[str, Any], key: str, code: str) -> int | None:
    """An integer job_desc field; Lua sends numbers as JSON numbers."""
    value = fields.get(key)
    if value is None:
        return None
    if type(value) is int and value >= 0:
        return value  # what the Lua script sends: a JSON integer
    if isinstance(value, bool):
        raise InvalidRequest(code, f"{key} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidRequest(code, f"{key} must be an integer, got {value!r}")
        value = int(value)
    if isinstance(value, str):
        if not _COUNT.fullmatch(value.strip()):
            raise InvalidRequest(code, f"{key} must be an integer, got {value!r}")
        value = int(value.strip())
    if not isinstance(value, int) or value < 0:
        raise InvalidRequest(code, f"{key} must be a non-negative integer, got {value!r}")
    return value


def _str_field(fields: Mapping[str, Any], key: str) -> str | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("invalid_request", f"{key} must be a string, got {value!r}")
    return value or None


def _multiplier(value: int | None) -> int:
    """Nodes or tasks to multiply a per-node/per-task count by (unset -> 1)."""
    if value is None or value in (NO_VAL, INFINITE, NO_VAL16, INFINITE16) or value == 0:
        return 1
    return value


def parse_gres(value: str | None) -> dict[str | None, int]:
    """GPU counts by type from one tres_per_* string; other GRES are ignored.

    The grammar is slurmtext's (one GRES parser for every Slurm format).

    >>> parse_gres("gres:gpu:a100:1,gres:gpu:h100:1")
    {'a100': 1, 'h100': 1}
    >>> parse_gres("gres:gpu:2")
    {None: 2}
    """
    if value is None:
        return {}
    if not isinstance(value, str):
        raise InvalidRequest("invalid_gres", f"GRES must be a string, got {value!r}")
    try:
        return dict(_gres_gpus(value))
    except SlurmTextError as error:
        raise InvalidRequest("invalid_gres", str(error)) from None


# Every quote parses its GRES strings, and a site's few shapes repeat ("gres:gpu:h100:1"):
# the daemon reads each once. Bounded, as users write these strings; a copy goes out.
_gres_gpus = functools.lru_cache(maxsize=1024)(gres_gpus)


def parse_array_inx(value: str | None) -> tuple[int, int | None]:
    """(number of tasks, concurrency limit) for an array_inx string; no array: (1, None).

    Formats (slurmtext.parse_array_indices): `0-1`, `0-9:2`, `1,3,5`, `0-15%4`,
    mixed `1-3,7,10-20:5%2`. Repeated indices count once; `%N` limits how many
    run at once and does not change the count.
    """
    if value is None or value == "":
        return 1, None
    if not isinstance(value, str):
        raise InvalidRequest("invalid_array", f"array_inx must be a string, got {value!r}")
    try:
        return parse_array_indices(value)
    except SlurmTextError as error:
        raise InvalidRequest("invalid_array", str(error)) from None


def _partition_times(partitions: Mapping[str, Any], name: str) -> tuple[int | None, int | None] | None:
    entry = partitions.get(name)
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise InvalidRequest("invalid_request", f"partition {name!r} entry is not an object")
    return (
        _int_field(entry, "default_time", "invalid_time"),
        _int_field(entry, "max_time", "invalid_time"),
    )


def _default_partition(partitions: Mapping[str, Any]) -> str | None:
    """The partition Slurm uses when none is given, if we can tell."""
    flagged = [
        name
        for name, entry in partitions.items()
        if isinstance(entry, Mapping) and entry.get("default") in (True, 1)
    ]
    if len(flagged) == 1:
        return flagged[0]
    if len(partitions) == 1:
        return next(iter(partitions))
    return None


def _resolve_time(
    time_limit: int | None, partition: str | None, partitions: Mapping[str, Any]
) -> tuple[int | None, str]:
    """(seconds or None, source). None means unbounded or unknown."""
    if time_limit is not None and time_limit != NO_VAL:
        if time_limit in (INFINITE, 0):  # -t 0 / -t UNLIMITED: no limit
            return None, "unbounded"
        return time_limit * 60, "explicit"
    # Not given: the partition's DefaultTime, else its MaxTime. A job may name
    # several partitions (-p a,b): price the longest so the estimate is safe.
    names = [p.strip() for p in partition.split(",") if p.strip()] if partition else []
    if not names:
        default = _default_partition(partitions)
        names = [default] if default else []
    best: tuple[int | None, str] | None = None
    for name in names:
        times = _partition_times(partitions, name)
        if times is None:
            return None, "unbounded"
        default_time, max_time = times
        if default_time is not None and default_time not in (NO_VAL, INFINITE):
            candidate: tuple[int | None, str] = (default_time * 60, "partition_default")
        elif max_time is not None and max_time not in (NO_VAL, INFINITE):
            candidate = (max_time * 60, "partition_max")
        else:
            return None, "unbounded"
        if best is None or (candidate[0] or 0) > (best[0] or 0):
            best = candidate
    return best if best is not None else (None, "unbounded")


def _gpu_request(fields: Mapping[str, Any]) -> tuple[dict[str | None, int], str | None]:
    nodes = _multiplier(_int_field(fields, "min_nodes", "invalid_request"))
    tasks = _multiplier(_int_field(fields, "num_tasks", "invalid_request"))
    candidates: list[tuple[dict[str | None, int], str]] = []
    per_job = parse_gres(fields.get("tres_per_job"))
    if per_job:
        candidates.append((per_job, PER_JOB))
    per_node = parse_gres(fields.get("tres_per_node"))
    if per_node:
        candidates.append(({t: n * nodes for t, n in per_node.items()}, PER_NODE))
    per_task = parse_gres(fields.get("tres_per_task"))
    if per_task:
        candidates.append(({t: n * tasks for t, n in per_task.items()}, PER_TASK))
    if not candidates:
        return {}, None
    # Several options at once (--gpus=4 --gpus-per-node=2) must agree for
    # Slurm to accept the job; if they do not, price the largest.
    return max(candidates, key=lambda c: sum(c[0].values()))


def parse_submit(fields: Mapping[str, Any]) -> JobRequest:
    """Parse the `submit` request's raw job_desc fields; raises InvalidRequest."""
    if not isinstance(fields, Mapping):
        raise InvalidRequest("invalid_request", "submit fields must be an object")
    user_id = _int_field(fields, "user_id", "invalid_request")
    user = _str_field(fields, "user_name")
    if user is None:
        if user_id is None:
            raise InvalidRequest("invalid_request", "neither user_name nor user_id was given")
        user = str(user_id)
    account = _str_field(fields, "account") or _str_field(fields, "default_account")
    partition = _str_field(fields, "partition")
    partitions = fields.get("partitions") or {}
    if not isinstance(partitions, Mapping):
        raise InvalidRequest("invalid_request", "partitions must be an object")

    gpus, requested_as = _gpu_request(fields)
    time_limit = _int_field(fields, "time_limit", "invalid_time")
    seconds, source = _resolve_time(time_limit, partition, partitions)
    array_tasks, array_limit = parse_array_inx(fields.get("array_inx"))
    try:
        directives, user_comment = comment_directives(_str_field(fields, "comment"))
    except SlurmTextError as error:
        raise InvalidRequest("invalid_comment", str(error)) from None
    return JobRequest(
        user=user,
        user_id=user_id,
        account=account,
        partition=partition,
        gpus=gpus,
        gpus_requested_as=requested_as,
        time_limit_seconds=seconds,
        time_limit_source=source,
        array_tasks=array_tasks,
        array_max_concurrent=array_limit,
        directives=directives,
        user_comment=user_comment,
        offered_partitions=tuple(sorted(partitions)),
        # job_desc.shared is JOB_SHARED_NONE (0) for `--exclusive`; =user and =mcs are 2, 3.
        exclusive=_int_field(fields, "shared", "invalid_request") == 0,
    )
