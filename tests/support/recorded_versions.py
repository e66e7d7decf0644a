"""The jobs recorded in every Slurm version's box (tests/fixtures/slurm-<version>/), and
the figures they must read as on every version: what each asked for, what Slurm gave it.

record_slurm_version.py ran the same jobs in the same order on the same cluster in each
version; tests/slurmtext/test_recorded_versions.py, tests/hooks/test_hooks_versions.py
and tests/hooks/test_job_submit_lua_versions.py check gpucredit's readers against these.
"""

from __future__ import annotations

import json
from functools import cache

from job_submit.request import PER_JOB, PER_NODE, PER_TASK
from tests.support import FIXTURES

VERSIONS = ("22.05", "24.11", "26.05")

# What the submission asked for, per job_submit call (a het job calls it per component):
# parse_submit's GPUs (None: untyped), how they were asked for, the limit, array tasks.
SUBMITTED: dict[str, list[tuple[dict[str | None, int], str | None, int | None, int]]] = {
    "gres_a100_1": [({"a100": 1}, PER_NODE, 300, 1)],
    "gres_2": [({None: 2}, PER_NODE, 300, 1)],
    "gres_a100_1_h100_1": [({"a100": 1, "h100": 1}, PER_NODE, 300, 1)],
    "gpus_2": [({None: 2}, PER_JOB, 300, 1)],
    "gpus_a100_2": [({"a100": 2}, PER_JOB, 300, 1)],
    "gpus_per_node_h100_1": [({"h100": 1}, PER_NODE, 300, 1)],
    "gpus_per_task_a100_1": [({"a100": 1}, PER_TASK, 300, 1)],
    "hetjob": [({"a100": 1}, PER_NODE, 300, 1), ({"h100": 1}, PER_NODE, 300, 1)],
    "array": [({"a100": 1}, PER_NODE, 300, 2)],
    "evil_name": [({"a100": 1}, PER_NODE, 300, 1)],  # not the name's h100=8
    "evil_name_one_line": [({"h100": 2}, PER_NODE, 300, 1)],  # not the name's a100=1
    "no_gpu_no_time": [({}, None, None, 1)],  # no -t and no partition limits sent: unbounded
    "busy_typed": [({"h100": 1}, PER_NODE, 300, 1)],
    "busy_untyped": [({None: 2}, PER_JOB, 300, 1)],
    "busy_per_task": [({"a100": 1}, PER_TASK, 300, 1)],
    "nodes2_gpus_per_node_a100_1": [({"a100": 2}, PER_NODE, 300, 1)],
    "nodes2_gres_h100_1": [({"h100": 2}, PER_NODE, 300, 1)],
    "nodes2_gpus_a100_3": [({"a100": 3}, PER_JOB, 300, 1)],
    "tasks2_gpus_per_task_h100_1": [({"h100": 2}, PER_TASK, 300, 1)],
    "nodes2_tasks_per_node_1_gpus_per_task_a100_1": [({"a100": 2}, PER_TASK, 300, 1)],
    "comment_forged": [({"a100": 1}, PER_NODE, 300, 1)],
}

# What Slurm allocated, per raw job id in the job's order (a het job's components, an
# array's tasks): GPUs by type, and each node's GPU indices. Slurm picks a100 for
# untyped GPUs and the lowest free indices; the jobs ran one at a time, so every version
# allocates alike.
A1 = {"node1": {0: "a100"}}
A2 = {"node1": {0: "a100", 1: "a100"}}
ALLOCATED: dict[str, list[tuple[dict[str, int], dict[str, dict[int, str]]]]] = {
    "gres_a100_1": [({"a100": 1}, A1)],
    "gres_2": [({"a100": 2}, A2)],
    "gres_a100_1_h100_1": [({"a100": 1, "h100": 1}, {"node1": {0: "a100", 2: "h100"}})],
    "gpus_2": [({"a100": 2}, A2)],
    "gpus_a100_2": [({"a100": 2}, A2)],
    "gpus_per_node_h100_1": [({"h100": 1}, {"node1": {2: "h100"}})],
    "gpus_per_task_a100_1": [({"a100": 1}, A1)],
    "hetjob": [({"a100": 1}, A1), ({"h100": 1}, {"node2": {2: "h100"}})],
    "array": [({"a100": 1}, {"node1": {1: "a100"}}), ({"a100": 1}, A1)],  # task 1, then task 0
    "evil_name": [({"a100": 1}, A1)],
    "evil_name_one_line": [({"h100": 2}, {"node1": {2: "h100", 3: "h100"}})],
    "no_gpu_no_time": [({}, {})],
    "nodes2_gpus_per_node_a100_1": [({"a100": 2}, {"node1": {0: "a100"}, "node2": {0: "a100"}})],
    "nodes2_gres_h100_1": [({"h100": 2}, {"node1": {2: "h100"}, "node2": {2: "h100"}})],
    "nodes2_gpus_a100_3": [({"a100": 3}, {"node1": {0: "a100", 1: "a100"}, "node2": {0: "a100"}})],
    "tasks2_gpus_per_task_h100_1": [({"h100": 2}, {"node1": {2: "h100", 3: "h100"}})],
    "nodes2_tasks_per_node_1_gpus_per_task_a100_1": [
        ({"a100": 2}, {"node1": {0: "a100"}, "node2": {0: "a100"}})
    ],
    "comment_forged": [({"a100": 1}, A1)],
}
BUSY = {  # the three jobs left running for sinfo/squeue, then cancelled
    "busy_typed": ({"h100": 1}, {"node1": {2: "h100"}}),
    "busy_untyped": ({"a100": 2}, A2),
    "busy_per_task": ({"a100": 1}, {"node2": {0: "a100"}}),
}
TWO_NODES = {name for name in ALLOCATED if name.startswith("nodes2_")}


def recorded(version: str, name: str) -> str:
    return (FIXTURES / f"slurm-{version}" / name).read_text()


@cache
def job_ids(version: str) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = json.loads(recorded(version, "jobs.json"))
    return ids


def allocated(version: str) -> dict[int, tuple[str, dict[str, int], dict[str, dict[int, str]]]]:
    """Raw job id -> (job name, GPUs, node indices), for every recorded job."""
    out = {}
    for name, allocations in [*ALLOCATED.items(), *((n, [a]) for n, a in BUSY.items())]:
        ids = job_ids(version)[name]
        assert len(ids) == len(allocations), (name, ids)
        for job_id, (gpus, node_gpus) in zip(ids, allocations, strict=True):
            out[job_id] = (name, gpus, node_gpus)
    return out
