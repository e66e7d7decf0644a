"""Pure parsers for Slurm's job records: text in, records out.

* :func:`parse_parsable2` reads ``sacct --parsable2 --noheader -D -X -o <SACCT_FIELDS>``.
* :func:`parse_json` reads ``sacct --json`` (openapi/dbv0.0.38 in Slurm 22.05).
* :func:`parse_squeue_json` reads ``squeue --json`` (openapi/v0.0.38 in 22.05).
* :func:`parse_squeue_compact` reads the meter's ``squeue --Format`` of running jobs.

Both sacct parsers return a :class:`ParseResult`: the job runs they understood
plus one :class:`ParseError` per input line (or ``jobs[]`` entry) they did not.
They never raise on bad input and never drop a line silently: every non-empty
input line ends up as a run, an error, or (for step lines such as ``1.batch``,
which carry nothing we charge for) in ``skipped_step_lines``.

The values inside a record (TRES, GRES detail, hostlists, times, limits, job
ids) are read by :mod:`slurmtext`, Slurm's text formats in one place; a value it
refuses (:class:`slurmtext.SlurmTextError`) makes its line or entry an error.

Facts these parsers rely on (Slurm 22.05.8, see docs/slurm-facts.md §7, §10):

* The allocation line is what we charge: it covers all nodes of a multi-node
  job; steps (``.batch``, ``.extern``, ``.0``) overlap it and must not be summed.
* GPU types come from AllocTRES (``gres/gpu:a100=1``). An untyped request
  (``--gpus=2``) lists only ``gres/gpu=2`` in ReqTRES but the typed GPUs it was
  actually given in AllocTRES.
* ``JobID`` is the display id (``6_0`` for array tasks, ``7+1`` for het
  components); ``JobIDRaw`` is the id the hooks see as ``SLURM_JOB_ID``. The
  array's own id goes to its *last* task.
* sacct has no restart counter. ``-D`` (and ``--json``, always) lists every
  requeued attempt as its own row; the run index is derived by ordering the
  attempts of one raw job id by start, then submit time (0-based), which is
  what the hooks see as ``SLURM_JOB_RESTART_COUNT``. The index is only right
  if the input holds *all* attempts of that job (see backends.py).
* Text timestamps are local time without a zone; JSON ones are epoch seconds.
  ``Unknown`` (0) and ``None`` (NO_VAL) mean "no such time". A local time that
  falls in a DST fold is ambiguous in the text format; the JSON format is not.
* No field of the text format is free text: a job name, comment or path may hold
  any character, a line break and a whole forged row included (a CPU job named
  ``x`` + newline + 16 ``|``-separated fields once posted a 7.20 charge to another
  user's account), so the text format asks for none of them; a run's ``name`` is
  read from ``--json`` only. Every row is then one line of Slurm's own values.
* ReqTRES is read with :func:`slurmtext.requested_gpus`: 22.05 can leave its typed
  counts above its total (docs/slurm-facts.md §9), and nothing is billed from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from types import MappingProxyType
from typing import Any

from accounting_bridge.slurm.gc_pause import cycle_collection_paused
from slurmtext import (
    JobSpec,
    SlurmTextError,
    expand_hostlist,
    format_time,
    gpus_from_tres,
    gres_gpu_indices,
    parse_job_spec,
    parse_limit_minutes,
    parse_time,
    parse_tres,
    requested_gpus,
    time_from_epoch,
)

__all__ = [
    "ALLOCATED_STATES",
    "SACCT_FIELDS",
    "SQUEUE_COMPACT_FIELDS",
    "TERMINAL_STATES",
    "ParseError",
    "ParseResult",
    "SacctRun",
    "SqueueJob",
    "SqueueResult",
    "parse_json",
    "parse_parsable2",
    "parse_squeue_compact",
    "parse_squeue_json",
    "sacct_argv",
    "sacct_jobs_argv",
    "squeue_argv",
    "squeue_compact_argv",
]

# Slurm's own values only: no free text (JobName, Comment, WorkDir...), whose line
# breaks could forge rows (see the module docstring).
SACCT_FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "JobID",
    "Cluster",
    "User",
    "Account",
    "Partition",
    "State",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "TimelimitRaw",
    "NNodes",
    "NodeList",
    "AllocTRES",
    "ReqTRES",
)

# Base job states after which a run (attempt) holds no resources any more.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REQUEUED",  # an earlier attempt of a requeued job: that attempt is over
        "RESIZING",  # the record closed by a job resize
        "REVOKED",
        "TIMEOUT",
    }
)

# squeue job_state strings of jobs that hold their allocation (and GPUs) now.
# job_state_string() reports flags first, so a RUNNING job being torn down
# reads COMPLETING, one whose nodes are booting reads CONFIGURING.
ALLOCATED_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING"})

_STATE_RE = re.compile(r"^(?P<state>[A-Z][A-Z_]*)(?: by (?P<by>\d+))?$")
_ERROR_LINE_MAX_CHARS = 500


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class SacctRun:
    """One run (attempt) of one job, from its allocation record.

    ``(cluster, job_id, run)`` identifies the run everywhere in gpucredit.
    """

    cluster: str
    job_id: int  # raw id, as the hooks see SLURM_JOB_ID
    display_id: str  # "42", "6_0", "7+1", "6_[0-2]"
    run: int  # 0-based attempt index, == SLURM_JOB_RESTART_COUNT of that attempt
    user: str
    account: str
    partition: str
    state: str  # base state: "CANCELLED by 0" -> "CANCELLED"
    submit: datetime | None  # aware, UTC
    start: datetime | None
    end: datetime | None
    elapsed_seconds: int
    time_limit_seconds: int | None  # None: UNLIMITED / partition limit
    gpus: dict[str, int] = field(hash=False)  # allocated, per GPU type (AllocTRES)
    requested_gpus: dict[str, int] = field(hash=False)  # ReqTRES
    nodes: tuple[str, ...]
    node_count: int  # allocated nodes; 0 when never allocated
    name: str  # from --json only; "" from the text format (see the module docstring)
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_offset: int | None = None
    # Who cancelled: a uid in text ("CANCELLED by 0"), a user name in JSON.
    cancelled_by: str | None = field(default=None, compare=False)
    # 1-based text line, or 1-based position in jobs[] for JSON.
    line_no: int | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.cluster, self.job_id, self.run)

    @property
    def finished(self) -> bool:
        """End known and state terminal: this run will not change any more."""
        return self.end is not None and self.state in TERMINAL_STATES

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    @property
    def gpu_seconds(self) -> dict[str, int]:
        """Allocated GPU-seconds per GPU type (elapsed × count)."""
        return {gpu_type: count * self.elapsed_seconds for gpu_type, count in self.gpus.items()}


@dataclass(frozen=True)
class ParseError:
    """One input line (or jobs[] entry) that could not be understood."""

    line_no: int  # 1-based; 0 for whole-document problems
    line: str
    reason: str
    job_id: int | None = None  # raw job id when it could still be read


@dataclass
class ParseResult:
    runs: list[SacctRun] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    skipped_step_lines: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def suspect_job_ids(self) -> set[int]:
        """Raw job ids with a malformed row: their other rows' run numbers may be off."""
        return {error.job_id for error in self.errors if error.job_id is not None}


@dataclass(frozen=True)
class SqueueJob:
    """A job slurmctld knows about now (``squeue --json``)."""

    cluster: str
    job_id: int
    display_id: str
    run: int  # restart_cnt: the run the job is in now
    user: str
    account: str
    partition: str
    state: str
    submit: datetime | None
    start: datetime | None  # for pending jobs: Slurm's *expected* start
    end: datetime | None  # for running jobs: the *expected* end (start + limit)
    time_limit_seconds: int | None
    gpus: dict[str, int] = field(hash=False)
    requested_gpus: dict[str, int] = field(hash=False)
    nodes: tuple[str, ...]
    node_count: int
    name: str
    # node -> {node-local GPU index: GPU type}, from gres_detail
    gpu_indices: dict[str, dict[int, str]] = field(hash=False)
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_offset: int | None = None
    # Site marks set by admins (users cannot edit them); gpucredit marks jobs it held for credit.
    admin_comment: str = ""
    line_no: int | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.cluster, self.job_id, self.run)

    @property
    def allocated(self) -> bool:
        """Holds its allocation now (running, suspended, completing, ...)."""
        return self.state in ALLOCATED_STATES and self.start is not None


@dataclass
class SqueueResult:
    jobs: list[SqueueJob] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


# --------------------------------------------------------------------------- argv


def sacct_argv(
    since: datetime,
    until: datetime,
    *,
    cluster: str | None = None,
    json_format: bool = False,
    tz: tzinfo | None = None,
) -> list[str]:
    """argv for all users' job allocations active in [since, until], every attempt.

    Text form: ``-X`` (allocations only: steps are never charged) and ``-D``
    (every requeued attempt). ``--json`` always lists attempts and embeds steps.
    """
    if until < since:
        raise ValueError(f"until ({until}) is before since ({since})")
    argv = ["sacct", "--allusers"]
    if cluster is not None:
        argv += ["--clusters", cluster]
    argv += ["--starttime", format_time(since, tz), "--endtime", format_time(until, tz)]
    if json_format:
        return [*argv, "--json"]
    return [
        *argv,
        "--duplicates",
        "--allocations",
        "--parsable2",
        "--noheader",
        "--format",
        ",".join(SACCT_FIELDS),
    ]


def sacct_jobs_argv(
    job_ids: Iterable[int],
    since: datetime,
    until: datetime,
    *,
    cluster: str | None = None,
    json_format: bool = False,
    tz: tzinfo | None = None,
) -> list[str]:
    """Like :func:`sacct_argv` but for the given raw job ids only."""
    ids = sorted(set(job_ids))
    if not ids:
        raise ValueError("no job ids given")
    argv = sacct_argv(since, until, cluster=cluster, json_format=json_format, tz=tz)
    return [*argv[:2], "--jobs", ",".join(str(i) for i in ids), *argv[2:]]


def squeue_argv() -> list[str]:
    """argv for every job slurmctld holds (22.05's squeue --json ignores filters)."""
    return ["squeue", "--all", "--json"]


# --------------------------------------------------------------------------- field helpers


def _parse_display_id(display: str, job_id: int) -> dict[str, Any]:
    spec = parse_job_spec(display)
    ids: dict[str, Any] = {
        "array_job_id": None,
        "array_task_id": None,
        "het_job_id": None,
        "het_offset": None,
    }
    if spec.is_array:  # 6_2, or 6_[0-2]: pending array tasks not yet split off
        ids["array_job_id"], ids["array_task_id"] = spec.base_id, spec.array_task_id
    elif spec.het_offset is not None:
        ids["het_job_id"], ids["het_offset"] = spec.base_id, spec.het_offset
        if spec.het_offset == 0 and spec.base_id != job_id:
            raise SlurmTextError(f"het leader {display!r} has raw id {job_id}, expected {spec.base_id}")
    elif spec.base_id != job_id:
        raise SlurmTextError(f"JobID {display!r} and JobIDRaw {job_id} disagree")
    return ids


def _parse_state(text: str) -> tuple[str, str | None]:
    match = _STATE_RE.match(text)
    if match is None:
        raise SlurmTextError(f"bad State {text!r}")
    return match["state"], match["by"]


def _parse_int(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise SlurmTextError(f"bad {what} {text!r} (want a non-negative integer)")
    return int(text)


def _clip(line: str) -> str:
    return line if len(line) <= _ERROR_LINE_MAX_CHARS else line[:_ERROR_LINE_MAX_CHARS] + "…"


# --------------------------------------------------------------------------- runs


def _assign_runs(runs: Sequence[SacctRun]) -> list[SacctRun]:
    """Number the attempts of each (cluster, raw job id): by start, then submit, then input order.

    Attempts that never started (pending, cancelled while pending) sort last.
    """
    groups: dict[tuple[str, int], list[tuple[int, SacctRun]]] = {}
    for position, run in enumerate(runs):
        groups.setdefault((run.cluster, run.job_id), []).append((position, run))
    numbered: dict[int, SacctRun] = {}
    for members in groups.values():

        def order(item: tuple[int, SacctRun]) -> tuple[bool, datetime, bool, datetime, int]:
            position, run = item
            floor = datetime.min.replace(tzinfo=UTC)
            return (
                run.start is None,
                run.start or floor,
                run.submit is None,
                run.submit or floor,
                position,
            )

        for index, (position, run) in enumerate(sorted(members, key=order)):
            numbered[position] = replace(run, run=index)
    return [numbered[position] for position in range(len(runs))]


# --------------------------------------------------------------------------- parsable2


def parse_parsable2(text: str, *, tz: tzinfo | None = None) -> ParseResult:
    """Parse ``sacct --parsable2 --noheader -o <SACCT_FIELDS>`` output.

    Never raises on content. Lines are split on "\\n" only; empty lines are
    ignored; step lines are counted in ``skipped_step_lines``.

    Linear and cheap (a window of 100,000 runs is read on every round): values that
    repeat across rows (TRES, node lists, states, limits, the minute of a time) are
    read once per call, and each record is built once, after its run index is known.
    """
    with cycle_collection_paused():
        return _parse_parsable2(text, tz)


def _parse_parsable2(text: str, tz: tzinfo | None) -> ParseResult:
    result = ParseResult()
    reader = _RowReader(tz)
    rows: list[dict[str, Any]] = []
    field_count = len(SACCT_FIELDS)
    for line_no, raw_line in enumerate(text.split("\n"), start=1):
        line = raw_line[:-1] if raw_line.endswith("\r") else raw_line
        if line == "":
            continue
        parts = line.split("|")
        if len(parts) == field_count and "." in parts[0]:
            result.skipped_step_lines.append(line_no)
            continue
        try:
            if len(parts) != field_count:
                raise SlurmTextError(
                    f"expected {field_count} '|'-separated fields "
                    f"({','.join(SACCT_FIELDS)}), got {len(parts)}"
                )
            rows.append(reader.run_fields(parts, line_no))
        except SlurmTextError as exc:
            job_id = parts[0] if parts[0].isascii() and parts[0].isdigit() else None
            result.errors.append(ParseError(line_no, _clip(line), str(exc), int(job_id) if job_id else None))
    _number_attempts(rows)
    result.runs = [_built_run(values) for values in rows]
    return result


_new_object = object.__new__


def _built_run(values: dict[str, Any]) -> SacctRun:
    """A SacctRun from validated values, without the frozen dataclass's __init__.

    That __init__ sets each of the 24 fields through object.__setattr__: 2.7 µs a run,
    a quarter of the whole parse. `values` must name every field (the parser's do).
    """
    run: SacctRun = _new_object(SacctRun)
    run.__dict__.update(values)
    return run


def _number_attempts(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's "run": the attempt index within its (cluster, raw job id), as
    :func:`_assign_runs` orders attempts (start, then submit, then input order)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for values in rows:
        key = (values["cluster"], values["job_id"])
        group = groups.get(key)
        if group is None:
            groups[key] = [values]
            values["run"] = 0
        else:
            group.append(values)
    floor = datetime.min.replace(tzinfo=UTC)
    for group in groups.values():
        if len(group) == 1:
            continue
        ordered = sorted(
            enumerate(group),
            key=lambda item: (
                item[1]["start"] is None,
                item[1]["start"] or floor,
                item[1]["submit"] is None,
                item[1]["submit"] or floor,
                item[0],
            ),
        )
        for index, (_, values) in enumerate(ordered):
            values["run"] = index


# Seconds 0-59 of a minute, added to the minute's UTC time.
_SECOND_STEPS = tuple(timedelta(seconds=second) for second in range(60))
# The same by their two digits: one look-up checks and converts a time's seconds.
_SECOND_STEPS_BY_TEXT = {f"{second:02d}": step for second, step in enumerate(_SECOND_STEPS)}


class _RowReader:
    """Reads one sacct text row's values, each distinct value once per parse.

    The caches live as long as one parse_parsable2 call, so they are bounded by its input.
    """

    def __init__(self, tz: tzinfo | None) -> None:
        self.tz = tz
        self.minutes: dict[str, datetime] = {}
        self.states: dict[str, tuple[str, str | None]] = {}
        self.tres: dict[str, dict[str, str]] = {}
        self.gpus: dict[str, dict[str, int]] = {}
        self.requested: dict[str, dict[str, int]] = {}
        self.hosts: dict[str, tuple[str, ...]] = {}
        self.limits: dict[str, int | None] = {}

    def time(self, text: str) -> datetime | None:
        """parse_time(text, tz), from the UTC time of its minute plus its seconds.

        Exact: a zone changes its offset only on a minute boundary, so every second of
        a local minute has the offset of its first (the DST fold included: both read
        as their first occurrence).
        """
        if len(text) == 19 and text[16] == ":":
            step = _SECOND_STEPS_BY_TEXT.get(text[17:19])
            if step is not None:
                minute = text[:16]
                base = self.minutes.get(minute)
                if base is None:
                    try:
                        base = parse_time(minute + ":00", self.tz)
                    except SlurmTextError:
                        return parse_time(text, self.tz)  # the whole text's own error
                    assert base is not None  # a YYYY-MM-DDTHH:MM:SS text
                    self.minutes[minute] = base
                return base + step
        return parse_time(text, self.tz)

    def state(self, text: str) -> tuple[str, str | None]:
        found = self.states.get(text)
        if found is None:
            found = self.states[text] = _parse_state(text)
        return found

    def tres_of(self, text: str) -> dict[str, str]:
        found = self.tres.get(text)
        if found is None:
            found = self.tres[text] = parse_tres(text)
        return found

    def gpus_of(self, text: str) -> dict[str, int]:
        """GPUs per type of a TRES text: a fresh dict per run (SacctRun.gpus is a dict)."""
        found = self.gpus.get(text)
        if found is None:
            found = self.gpus[text] = gpus_from_tres(self.tres_of(text))
        return dict(found)

    def requested_of(self, text: str) -> dict[str, int]:
        """GPUs per type of a request (slurmtext.requested_gpus), a fresh dict per run."""
        found = self.requested.get(text)
        if found is None:
            found = self.requested[text] = requested_gpus(self.tres_of(text))
        return dict(found)

    def nodes(self, text: str) -> tuple[str, ...]:
        found = self.hosts.get(text)
        if found is None:
            found = self.hosts[text] = tuple(expand_hostlist(text))
        return found

    def limit(self, text: str) -> int | None:
        if text in self.limits:
            return self.limits[text]
        found = self.limits[text] = parse_limit_minutes(text)
        return found

    def run_fields(self, parts: Sequence[str], line_no: int) -> dict[str, Any]:
        """The SacctRun fields of one allocation row (`run` is set once all rows are read).

        Checks in the order the fields are listed, so a row with two faults reports the first.
        """
        (
            job_id_text, display_id, cluster, user, account, partition, state_text, submit, start, end,
            elapsed, limit, node_count_text, node_list, alloc_text, req_text,
        ) = parts  # fmt: skip
        job_id = _parse_int(job_id_text, "JobIDRaw")
        # A display id equal to the raw one is a plain job: no array task, no het component.
        plain = display_id == job_id_text
        ids = _PLAIN_JOB_IDS if plain else _parse_display_id(display_id, job_id)
        if not cluster:
            raise SlurmTextError("empty Cluster")
        state, by = self.state(state_text)
        alloc_tres = self.tres_of(alloc_text)
        nodes = self.nodes(node_list) if alloc_tres else ()
        node_count = _parse_int(node_count_text, "NNodes") if alloc_tres else 0
        if nodes and len(nodes) != node_count:
            raise SlurmTextError(f"NodeList {node_list!r} has {len(nodes)} nodes, NNodes {node_count}")
        return {
            "cluster": cluster,
            "job_id": job_id,
            "display_id": display_id,
            "run": -1,
            "user": user,
            "account": account,
            "partition": partition,
            "state": state,
            "submit": self.time(submit),
            "start": self.time(start),
            "end": self.time(end),
            "elapsed_seconds": _parse_int(elapsed, "ElapsedRaw"),
            "time_limit_seconds": self.limit(limit),
            "gpus": self.gpus_of(alloc_text),
            "requested_gpus": self.requested_of(req_text),
            "nodes": nodes,
            "node_count": node_count,
            "name": "",
            **ids,
            "cancelled_by": by,
            "line_no": line_no,
        }


_PLAIN_JOB_IDS: Mapping[str, int | None] = MappingProxyType(
    {"array_job_id": None, "array_task_id": None, "het_job_id": None, "het_offset": None}
)


# --------------------------------------------------------------------------- JSON helpers


def _get(obj: Any, path: str) -> Any:
    current = obj
    for key in path.split("."):
        if not isinstance(current, dict) or key not in current:
            raise SlurmTextError(f"missing {path!r}")
        current = current[key]
    return current


def _opt(obj: Any, path: str) -> Any:
    try:
        return _get(obj, path)
    except SlurmTextError:
        return None


# Where the versions' JSON differs (docs/slurm-facts.md §16), read in this one place:
# data_parser v0.0.40+ (Slurm 23.11 on; measured 24.11 and 26.05) writes many numbers as
# {"set": bool, "infinite": bool, "number": N} where dbv0.0.38 (22.05) wrote N or null,
# and states as a list (["PENDING", "REQUEUED"]: the base state, then its flags) where
# 22.05 wrote one string.
_NUMBER_OBJECT_KEYS = frozenset({"set", "infinite", "number"})


def _number(value: Any) -> Any:
    """A number as every version writes it: N, null, or a number object (unset/infinite: None)."""
    if isinstance(value, dict) and value.keys() == _NUMBER_OBJECT_KEYS:
        if value["set"] is not True or value["infinite"] is not False:
            return None
        return value["number"]
    return value


def _json_state(value: Any, what: str) -> str:
    """A job's base state: 22.05's string, or the first of 23.11+'s list of state and flags."""
    if isinstance(value, list):
        if not value or not all(isinstance(item, str) for item in value):
            raise SlurmTextError(f"bad {what} {value!r} (want a list of state names)")
        return value[0]
    return _json_str(value, what, allow_none=False)


def _json_int(value: Any, what: str) -> int:
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SlurmTextError(f"bad {what} {value!r} (want a non-negative integer)")
    return value


def _json_opt_int(value: Any, what: str) -> int | None:
    value = _number(value)
    return None if value is None else _json_int(value, what)


def _json_str(value: Any, what: str, *, allow_none: bool = True) -> str:
    if value is None and allow_none:
        return ""
    if not isinstance(value, str):
        raise SlurmTextError(f"bad {what} {value!r} (want a string)")
    return value


def _epoch(value: Any, what: str) -> datetime | None:
    seconds = _json_opt_int(value, what)
    return None if seconds is None else time_from_epoch(seconds)


def _minutes(value: Any, what: str) -> int | None:
    minutes = _json_opt_int(value, what)
    return None if minutes is None else parse_limit_minutes(minutes)


def _tres_list(value: Any, what: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise SlurmTextError(f"bad {what} (want a list)")
    entries: dict[str, int] = {}
    for entry in value:
        tres_type = _json_str(_get(entry, "type"), f"{what} type", allow_none=False)
        name = _json_str(_opt(entry, "name"), f"{what} name")
        key = f"{tres_type}/{name}" if name else tres_type
        raw_count = _number(_opt(entry, "count"))
        if tres_type != "gres" and (raw_count is None or (isinstance(raw_count, int) and raw_count < 0)):
            continue  # every job lists energy: count null (22.05) or -2 (24.11+, "not set")
        count = _json_int(raw_count, f"{what} count for {key}")
        if key in entries:
            raise SlurmTextError(f"{what}: {key!r} listed twice")
        entries[key] = count
    return entries


# ESLURM_REST_EMPTY_RESULT: sacct --json reports an empty result as an error
# ("Nothing found with query", recorded); it is not one.
_EMPTY_RESULT_ERROR_NUMBER = 9003


def _load_document(text: str) -> tuple[dict[str, Any] | None, list[ParseError]]:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, [ParseError(0, _clip(text), f"invalid JSON: {exc}")]
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        return None, [ParseError(0, _clip(text), "not a Slurm JSON document: no 'jobs' list")]
    reported = document.get("errors")
    if reported is None:
        reported = []
    elif not isinstance(reported, list):
        reported = [reported]
    errors = [
        ParseError(0, _clip(json.dumps(error, sort_keys=True)), "Slurm reported an error")
        for error in reported
        if not (
            not document["jobs"]
            and isinstance(error, dict)
            and error.get("error_number") == _EMPTY_RESULT_ERROR_NUMBER
        )
    ]
    return document, errors


def _entry_error(index: int, job: Any, exc: Exception) -> ParseError:
    job_id = job.get("job_id") if isinstance(job, dict) else None
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        job_id = None
    return ParseError(index + 1, _clip(json.dumps(job, sort_keys=True, default=str)), str(exc), job_id)


# --------------------------------------------------------------------------- sacct --json


def parse_json(text: str) -> ParseResult:
    """Parse ``sacct --json``. Never raises on content.

    Each ``jobs[]`` entry is one attempt's allocation record; its ``steps`` are
    ignored. Errors carry the 1-based position in ``jobs[]`` as ``line_no``.
    """
    with cycle_collection_paused():
        return _parse_json(text)


def _parse_json(text: str) -> ParseResult:
    result = ParseResult()
    document, result.errors = _load_document(text)
    if document is None:
        return result
    runs: list[SacctRun] = []
    for index, job in enumerate(document["jobs"]):
        try:
            runs.append(_run_from_json(job, index + 1))
        except SlurmTextError as exc:
            result.errors.append(_entry_error(index, job, exc))
    result.runs = _assign_runs(runs)
    return result


def _run_from_json(job: Any, position: int) -> SacctRun:
    if not isinstance(job, dict):
        raise SlurmTextError("job entry is not an object")
    job_id = _json_int(_get(job, "job_id"), "job_id")
    cluster = _json_str(_opt(job, "cluster"), "cluster") or _json_str(
        _opt(job, "association.cluster"), "association.cluster"
    )
    if not cluster:
        raise SlurmTextError("no cluster")
    user = _json_str(_opt(job, "user"), "user") or _json_str(
        _opt(job, "association.user"), "association.user"
    )
    account = _json_str(_opt(job, "account"), "account") or _json_str(
        _opt(job, "association.account"), "association.account"
    )
    state, _ = _parse_state(_json_state(_get(job, "state.current"), "state.current"))
    ids = _json_ids(job, job_id)
    allocated = _tres_list(_opt(job, "tres.allocated"), "tres.allocated")
    nodes = tuple(expand_hostlist(_json_str(_opt(job, "nodes"), "nodes"))) if allocated else ()
    node_count = _json_int(_get(job, "allocation_nodes"), "allocation_nodes") if allocated else 0
    if nodes and len(nodes) != node_count:
        raise SlurmTextError(f"nodes {job.get('nodes')!r} has {len(nodes)} nodes, expected {node_count}")
    elapsed = _json_int(_get(job, "time.elapsed"), "time.elapsed")
    cancelled_by = _json_str(_opt(job, "kill_request_user"), "kill_request_user") or None
    return SacctRun(
        cluster=cluster,
        job_id=job_id,
        display_id=_json_display_id(job_id, ids, _opt(job, "array.task")),
        run=-1,
        user=user,
        account=account,
        partition=_json_str(_opt(job, "partition"), "partition"),
        state=state,
        submit=_epoch(_opt(job, "time.submission"), "time.submission"),
        start=_epoch(_opt(job, "time.start"), "time.start"),
        end=_epoch(_opt(job, "time.end"), "time.end"),
        elapsed_seconds=elapsed,
        time_limit_seconds=_minutes(_opt(job, "time.limit"), "time.limit"),
        gpus=gpus_from_tres(allocated),
        requested_gpus=requested_gpus(_tres_list(_opt(job, "tres.requested"), "tres.requested")),
        nodes=nodes,
        node_count=node_count,
        name=_json_str(_opt(job, "name"), "name"),
        cancelled_by=cancelled_by if state == "CANCELLED" else None,
        line_no=position,
        **ids,
    )


def _json_ids(job: Mapping[str, Any], job_id: int) -> dict[str, int | None]:
    # dbv0.0.38: array.job_id is 0 and array.task_id null outside arrays;
    # het.job_id is 0 and het.job_offset null outside het jobs.
    array_job_id = _json_opt_int(_opt(job, "array.job_id"), "array.job_id") or None
    array_task_id = _json_opt_int(_opt(job, "array.task_id"), "array.task_id")
    het_job_id = _json_opt_int(_opt(job, "het.job_id"), "het.job_id") or None
    het_offset = _json_opt_int(_opt(job, "het.job_offset"), "het.job_offset")
    if array_job_id is None:
        array_task_id = None
    if het_job_id is None:
        het_offset = None
    elif het_offset is None:
        raise SlurmTextError(f"het job {het_job_id} without het.job_offset")
    elif het_offset == 0 and het_job_id != job_id:
        raise SlurmTextError(f"het leader of {het_job_id} has job_id {job_id}")
    return {
        "array_job_id": array_job_id,
        "array_task_id": array_task_id,
        "het_job_id": het_job_id,
        "het_offset": het_offset,
    }


def _json_display_id(job_id: int, ids: Mapping[str, int | None], array_tasks: Any) -> str:
    if ids["het_job_id"] is not None:
        return str(JobSpec(ids["het_job_id"], het_offset=ids["het_offset"]))
    if ids["array_job_id"] is not None:
        if ids["array_task_id"] is not None:
            return str(JobSpec(ids["array_job_id"], array_task_id=ids["array_task_id"]))
        tasks = array_tasks if isinstance(array_tasks, str) else ""
        return str(JobSpec(ids["array_job_id"], array_tasks=tasks))
    return str(job_id)


# --------------------------------------------------------------------------- squeue --json


def parse_squeue_json(text: str) -> SqueueResult:
    """Parse ``squeue --json`` (every job slurmctld holds). Never raises on content."""
    result = SqueueResult()
    document, result.errors = _load_document(text)
    if document is None:
        return result
    for index, job in enumerate(document["jobs"]):
        try:
            result.jobs.append(_squeue_job(job, index + 1))
        except SlurmTextError as exc:
            result.errors.append(_entry_error(index, job, exc))
    return result


def _squeue_job(job: Any, position: int) -> SqueueJob:
    if not isinstance(job, dict):
        raise SlurmTextError("job entry is not an object")
    job_id = _json_int(_get(job, "job_id"), "job_id")
    cluster = _json_str(_get(job, "cluster"), "cluster")
    if not cluster:
        raise SlurmTextError("no cluster")
    state, _ = _parse_state(_json_state(_get(job, "job_state"), "job_state"))
    run = _json_int(_get(job, "restart_cnt"), "restart_cnt")
    array_job_id = _json_opt_int(_opt(job, "array_job_id"), "array_job_id") or None
    array_task_id = _json_opt_int(_opt(job, "array_task_id"), "array_task_id")
    het_job_id = _json_opt_int(_opt(job, "het_job_id"), "het_job_id") or None
    het_offset = _json_opt_int(_opt(job, "het_job_offset"), "het_job_offset")
    ids: dict[str, int | None] = {
        "array_job_id": array_job_id,
        "array_task_id": array_task_id if array_job_id is not None else None,
        "het_job_id": het_job_id,
        "het_offset": het_offset if het_job_id is not None else None,
    }
    if het_job_id is not None and het_offset is None:
        raise SlurmTextError(f"het job {het_job_id} without het_job_offset")
    alloc = parse_tres(_json_str(_opt(job, "tres_alloc_str"), "tres_alloc_str"))
    nodes = tuple(expand_hostlist(_json_str(_opt(job, "nodes"), "nodes"))) if alloc else ()
    details = _opt(job, "gres_detail") or []
    if not isinstance(details, list) or not all(isinstance(d, str) for d in details):
        raise SlurmTextError("bad gres_detail (want a list of strings)")
    gpu_indices: dict[str, dict[int, str]] = {}
    if details and nodes:
        if len(details) != len(nodes):
            raise SlurmTextError(f"gres_detail has {len(details)} entries for {len(nodes)} nodes")
        for node, detail in zip(nodes, details, strict=True):
            indices = gres_gpu_indices(detail)
            if indices:
                gpu_indices[node] = indices
    node_count = _json_opt_int(_opt(job, "node_count"), "node_count") or 0
    return SqueueJob(
        cluster=cluster,
        job_id=job_id,
        display_id=_json_display_id(job_id, ids, _opt(job, "array_task_string")),
        run=run,
        user=_json_str(_opt(job, "user_name"), "user_name"),
        account=_json_str(_opt(job, "account"), "account"),
        partition=_json_str(_opt(job, "partition"), "partition"),
        state=state,
        submit=_epoch(_opt(job, "submit_time"), "submit_time"),
        start=_epoch(_opt(job, "start_time"), "start_time"),
        end=_epoch(_opt(job, "end_time"), "end_time"),
        time_limit_seconds=_minutes(_opt(job, "time_limit"), "time_limit"),
        gpus=gpus_from_tres(alloc),
        requested_gpus=requested_gpus(parse_tres(_json_str(_opt(job, "tres_req_str"), "tres_req_str"))),
        nodes=nodes,
        node_count=node_count if alloc else 0,
        name=_json_str(_opt(job, "name"), "name"),
        gpu_indices=gpu_indices,
        line_no=position,
        admin_comment=_json_str(_opt(job, "admin_comment"), "admin_comment"),
        **ids,
    )


# --------------------------------------------------------------------------- squeue, compact

# What the meter reads every tick: the running jobs' identity and clock, nothing else.
# `squeue --json` of 20,000 jobs is ~56 MB (1.4-3.2 s to parse); this is ~2 MB. Each
# field ends with "|" (-O "Field:|": no width, so nothing is padded or cut); none of
# them is free text, so no value holds a "|".
SQUEUE_COMPACT_FIELDS: tuple[str, ...] = (
    "JobID",  # the raw id (SLURM_JOB_ID)
    "ArrayJobID",
    "ArrayTaskID",
    "HetJobID",
    "HetJobOffset",
    "RestartCnt",
    "State",
    "SubmitTime",
    "StartTime",
    "UserName",
    "Account",
    "Cluster",
)
_NO_ID = frozenset({"", "N/A", "(null)", "4294967294", "4294967295"})


def squeue_compact_argv() -> list[str]:
    """argv for the running jobs in :data:`SQUEUE_COMPACT_FIELDS`, one "|"-ended line each."""
    return [
        "squeue",
        "--all",
        "--noheader",
        "--states=RUNNING",
        "--Format=" + ",".join(f"{name}:|" for name in SQUEUE_COMPACT_FIELDS),
    ]


def parse_squeue_compact(text: str, *, cluster: str, tz: tzinfo | None = None) -> SqueueResult:
    """Parse :func:`squeue_compact_argv`'s output. Never raises on content.

    The jobs carry no GPUs, nodes or limits (the meter needs none); `cluster` names
    jobs whose Cluster field is empty. Times are local (`tz` as in parse_parsable2).
    Read every tick, so values that repeat (times, states) are read once per call.
    """
    result = SqueueResult()
    count = len(SQUEUE_COMPACT_FIELDS)
    cache: dict[str, Any] = {}
    for line_no, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = line.split("|")
        try:
            if len(parts) != count + 1 or parts[-1].strip() != "":
                raise SlurmTextError(f"expected {count} '|'-ended fields ({','.join(SQUEUE_COMPACT_FIELDS)})")
            if " " in line:  # padded fields (a squeue that pads): strip each
                parts = [p.strip() for p in parts]
            result.jobs.append(_compact_job(parts, line_no, cluster, tz, cache))
        except SlurmTextError as exc:
            job_id = parts[0].strip()
            known = job_id if job_id.isascii() and job_id.isdigit() else None
            result.errors.append(ParseError(line_no, _clip(line), str(exc), int(known) if known else None))
    return result


def _opt_id(text: str, what: str) -> int | None:
    return None if text in _NO_ID else _parse_int(text, what)


_PLAIN_IDS: dict[str, int | None] = {
    "array_job_id": None,
    "array_task_id": None,
    "het_job_id": None,
    "het_offset": None,
}


def _compact_job(
    parts: list[str], line_no: int, cluster: str, tz: tzinfo | None, cache: dict[str, Any]
) -> SqueueJob:
    job_id_text, array_job, array_task, het_job, het_offset, restarts, state_text = parts[:7]
    submit_text, start_text, user, account, job_cluster = parts[7:12]
    if not (job_id_text.isascii() and job_id_text.isdigit()):
        raise SlurmTextError(f"bad JobID {job_id_text!r} (want a non-negative integer)")
    job_id = int(job_id_text)
    ids = _PLAIN_IDS
    if array_job not in _NO_ID or het_job not in _NO_ID:
        array_job_id = _opt_id(array_job, "ArrayJobID") or None
        het_job_id = _opt_id(het_job, "HetJobID") or None
        array_task_id = _opt_id(array_task, "ArrayTaskID") if array_job_id is not None else None
        het_offset_id = _opt_id(het_offset, "HetJobOffset") if het_job_id is not None else None
        if het_job_id is not None and het_offset_id is None:
            raise SlurmTextError(f"het job {het_job_id} without HetJobOffset")
        ids = {
            "array_job_id": array_job_id if array_task_id is not None else None,  # else not a task
            "array_task_id": array_task_id,
            "het_job_id": het_job_id,
            "het_offset": het_offset_id,
        }
    values = cache.get(state_text)
    if values is None:
        values = cache[state_text] = _parse_state(state_text)[0]
    state = values
    submit = cache.get(submit_text, cache)
    if submit is cache:
        submit = cache[submit_text] = parse_time(submit_text, tz)
    start = cache.get(start_text, cache)
    if start is cache:
        start = cache[start_text] = parse_time(start_text, tz)
    job: SqueueJob = _new_object(SqueueJob)
    job.__dict__.update(  # every field, without the frozen dataclass's slow __init__
        ids,
        cluster=job_cluster if job_cluster not in _NO_ID else cluster,
        job_id=job_id,
        display_id=job_id_text if ids is _PLAIN_IDS else _json_display_id(job_id, ids, None),
        run=_parse_int(restarts, "RestartCnt"),
        user=user,
        account=account,
        partition="",
        state=state,
        submit=submit,
        start=start,
        end=None,
        time_limit_seconds=None,
        gpus={},
        requested_gpus={},
        nodes=(),
        node_count=0,
        name="",
        gpu_indices={},
        admin_comment="",
        line_no=line_no,
    )
    return job
