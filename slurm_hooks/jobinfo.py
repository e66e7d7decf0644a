"""JobInfo: one job as the hooks and the daemon read it from slurmctld.

Filled by `slurm_hooks.squeue` (what is billed: ids, account, user, times, the
allocated GPUs) or by `slurm_hooks.scontrol` (the node hooks' GPU indices).
"""

from __future__ import annotations

from datetime import datetime


class JobInfo:
    """One job (or one component of a heterogeneous job, or one array task).

    Times are aware UTC datetimes; `gpus` are job totals by type
    (`{"a100": 1, "h100": 1}`); `node_gpus` maps each node to its node-local
    GPU indices and their types (`{"node1": {0: "a100", 2: "h100"}}`), known only
    from scontrol's `-d` text. `het_job_id` is the heterogeneous job's leader id
    (None for other jobs); `array_job_id`/`array_task_id` name an array task.
    `fields` are scontrol's raw `Key=Value` pairs (empty when read from squeue).

    A plain class rather than a dataclass: `dataclasses` imports `inspect`,
    which costs several milliseconds in every hook process (docs/design.md §3.8).
    """

    __slots__ = (
        "account", "array_job_id", "array_task_id", "end_time", "fields", "gpus", "het_job_id",
        "het_offset", "job_id", "node_gpus", "node_list", "num_nodes", "partition", "restarts",
        "start_time", "state", "submit_time", "time_limit_seconds", "uid", "user",
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
        het_job_id: int | None = None,
        het_offset: int | None = None,
        array_job_id: int | None = None,
        array_task_id: int | None = None,
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
        self.het_job_id = het_job_id
        self.het_offset = het_offset
        self.array_job_id = array_job_id
        self.array_task_id = array_task_id

    @property
    def job_spec(self) -> str:
        """How `scontrol update|release` names this job as a whole: a heterogeneous job
        by its leader (its parts are held and released together), an array task as
        ARRAYID_TASKID (the array's own id names the whole array)."""
        if self.het_job_id is not None:
            return str(self.het_job_id)
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobInfo):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__ if name != "fields")
        return f"JobInfo({items})"
