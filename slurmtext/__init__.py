"""Slurm's text formats (22.05), one parser each, standard library only.

Every module that reads or writes Slurm text calls these; none keeps a copy.

* Hostlists: ``node[1-2,5],gpu07`` -> names (:func:`expand_hostlist`); GPU index
  lists ``0-1,3`` (:func:`parse_index_list`).
* TRES strings: ``cpu=1,gres/gpu:a100=1,gres/gpu=2`` (:func:`parse_tres`, and
  :func:`gpus_from_tres` for the GPU counts by type; :func:`requested_gpus` for a
  request, which 22.05 can leave inconsistent); the gpu/nvml plugin's gauges in a
  step's ``TRESUsageIn*``, ``gres/gpuutil=100,gres/gpumem=36266M``
  (:func:`gpu_use_from_tres`; sizes ``628748K``, ``1.50G`` by :func:`tres_bytes`).
* GRES strings, one grammar for all of: job_desc's ``gres:gpu:a100:2`` and
  ``gres/gpu:a100=1``, scontrol's ``JOB_GRES=gpu:a100:1`` and node
  ``GRES=gpu:a100:2(IDX:0-1)``, squeue's ``gres_detail``, sinfo's ``%G``
  ``gpu:a100:2(S:0)`` (:func:`gpu_gres`, :func:`gres_gpus`,
  :func:`gres_gpu_indices`, :func:`parse_sinfo_gpu_types`); GPUs configured and
  allocated per partition from sinfo's node lines (:func:`parse_sinfo_gpu_use`).
* ``scontrol show partition -o``: each partition's QOS (:func:`parse_partition_qos`).
* ``--noheader --parsable2`` tables (sacctmgr, sshare): rows of named fields
  (:func:`parse_parsable`); an association's fairshare, ``7`` or ``parent``
  (:func:`parse_raw_shares`).
* ``squeue --noheader --Format=Field:|,...`` lines, each value followed by ``|``
  (:func:`split_format_line`, and :func:`parse_format_rows` for named rows).
* Times: the local ``YYYY-MM-DDTHH:MM:SS`` scontrol and sacct print and take,
  ``Unknown``/``None`` (:func:`parse_time`, :func:`format_time`); JSON epochs
  (:func:`time_from_epoch`).
* Durations: time limits and sacct's ``Elapsed`` (``M``, ``M:S``, ``H:M:S``,
  ``D-H``, ``D-H:M``, ``D-H:M:S``, ``UNLIMITED``; :func:`parse_duration`) and
  limits in whole minutes (``TimelimitRaw``, JSON; :func:`parse_limit_minutes`).
* Job specs: ``6``, ``6_2``, ``6_[0-2]``, ``7+1`` (:func:`parse_job_spec`,
  ``str(JobSpec)``); array index expressions ``0-15:3%4``
  (:func:`parse_array_indices`).
* Output file names: ``sbatch -o`` patterns (``slurm-%j.out``, ``%x-%A_%a.log``) as
  the batch step expands them (:func:`expand_output_path`).
* Comment text: the one-line ``gpucredit: ...`` comment the hooks and the meter
  set on a job (:func:`comment_text`); the ``gpucredit:max_cost=25,cloud=yes``
  directives a user writes into a job's comment (:func:`comment_directives`) and
  the comment job_submit gives a routed job (:func:`routed_comment`).

Strictness, the same for every format: text that is not one of the forms above
raises :class:`SlurmTextError` (a ``ValueError``) naming the text; nothing is
guessed, skipped or clipped silently. The words Slurm prints for "nothing"
(``(null)``, ``Unknown``, ``None assigned``, ...) are listed per format and read
as empty or None; a value that is absent (``None``) is the caller's to decide.

Hook processes import this module, so it imports only ``re`` and ``datetime``
(no dataclasses, typing or subprocess: tests/hooks/test_hooks.py checks). It runs
no command and reads no file. ``job_submit/job_submit.lua`` runs inside
slurmctld's Lua and cannot import Python: it forwards job_desc's raw strings to
the daemon, which parses them here (job_submit/request.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo

__all__ = [
    "COMMENT_DIRECTIVE",
    "COMMENT_PREFIX",
    "INFINITE",
    "MAX_ARRAY_INDEX",
    "MAX_COMMENT_CHARS",
    "MAX_GPUS_PER_ITEM",
    "MAX_HOSTS",
    "NO_VAL",
    "UNTYPED_GPU",
    "JobSpec",
    "SlurmTextError",
    "comment_directives",
    "comment_text",
    "expand_hostlist",
    "expand_output_path",
    "format_time",
    "gpu_gres",
    "gpu_use_from_tres",
    "gpus_from_tres",
    "gres_gpu_indices",
    "gres_gpus",
    "parse_array_indices",
    "parse_duration",
    "parse_format_rows",
    "parse_index_list",
    "parse_job_spec",
    "parse_limit_minutes",
    "parse_parsable",
    "parse_partition_qos",
    "parse_raw_shares",
    "parse_sinfo_gpu_types",
    "parse_sinfo_gpu_use",
    "parse_time",
    "parse_tres",
    "requested_gpus",
    "routed_comment",
    "split_format_line",
    "time_from_epoch",
    "tres_bytes",
]


class SlurmTextError(ValueError):
    """Slurm text that is not one of the forms this module reads."""


# Slurm's 32-bit "not set" and "no limit" (slurm.h NO_VAL, INFINITE).
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF

# GPUs with no type (`gres/gpu=2` and nothing typed, `gpu:2(IDX:0-1)`) go by this name.
UNTYPED_GPU = "gpu"

# Limits on what one string may expand to: past them the text is garbage, not a job.
MAX_HOSTS = 100_000
MAX_GPU_INDEX_SPAN = 4096
MAX_GPUS_PER_ITEM = 1_000_000
# Slurm caps MaxArraySize at 4000001, so no valid index exceeds 4000000 (this also
# caps the bitmap parse_array_indices builds at 4 MB).
MAX_ARRAY_INDEX = 4_000_000

# What the hooks and the meter write into a job's Comment.
COMMENT_PREFIX = "gpucredit: "
MAX_COMMENT_CHARS = 240
# What a user writes into a job's comment to steer gpucredit: gpucredit:max_cost=25,cloud=yes
COMMENT_DIRECTIVE = "gpucredit:"
_DIRECTIVE_VALUES = {
    "max_cost": r"[0-9]{1,13}(?:\.[0-9]{1,6})?",
    "cloud": r"yes|no",
    "region": r"[a-z][a-z0-9-]{0,31}",  # the cloud region the job prefers (docs/routing.md)
}
_DIRECTIVE_WORD = r"(?<!\S)" + re.escape(COMMENT_DIRECTIVE) + r"(\S+)"

_RANGE = r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?"
_HOST_TEXT = r"[A-Za-z0-9._\-]*"
_NAME = r"[A-Za-z0-9_.\-]+"
_GRES_ITEM = (
    rf"(?:gres[:/])?(?P<name>{_NAME})(?::(?P<type>{_NAME}))?"
    r"(?:[:=](?P<count>[^:=()]+))?(?:\((?P<detail>[^()]*)\))?"
)
_TIME = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
_JOB_SPEC = r"([0-9]+)(?:_([0-9]+)|_\[([^\[\]]+)\]|\+([0-9]+))?"
_SPACES = r"\s+"

# Patterns are compiled on first use (re caches them): a hook process pays only for
# the formats it reads.

# What Slurm prints for "no value", per format.
_NO_HOSTS = frozenset({"", "(null)", "None assigned"})
_NO_INDICES = frozenset({"", "(null)", "N/A"})
_NO_GRES = frozenset({"", "(null)", "N/A"})
_NO_TRES = frozenset({"", "(null)"})
_NO_TIME = frozenset({"", "Unknown", "None", "N/A", "(null)"})
# scontrol/sacct print Partition_Limit for NO_VAL and UNLIMITED for INFINITE;
# Slurm reads INFINITE as UNLIMITED too.
_NO_LIMIT = frozenset({"UNLIMITED", "INFINITE", "Partition_Limit"})


# --------------------------------------------------------------------------- shared pieces


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _split_top_level(text: str, opening: str, closing: str) -> list[str]:
    """Split on commas that are not inside `opening`...`closing`; brackets must balance."""
    if opening not in text and closing not in text:
        return text.split(",")  # the usual GRES or host list: no brackets to track
    items: list[str] = []
    depth = 0
    start = 0
    for position, char in enumerate(text):
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth < 0:
                raise SlurmTextError(f"unbalanced {closing!r} in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    if depth != 0:
        raise SlurmTextError(f"unbalanced {opening!r} in {text!r}")
    items.append(text[start:])
    return items


def _ranges(body: str, what: str, *, max_span: int, steps: bool = False) -> list[tuple[str, int, int, int]]:
    """`0-1,3` (with `steps`, also `0-9:2`) -> [(first as printed, first, last, step), ...]."""
    ranges: list[tuple[str, int, int, int]] = []
    for part in body.split(","):
        match = re.fullmatch(_RANGE, part)
        if match is None or (match[3] is not None and not steps):
            raise SlurmTextError(f"bad {what} {part!r} in {body!r}")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise SlurmTextError(f"{what} {part!r} runs backwards")
        if step == 0:
            raise SlurmTextError(f"{what} {part!r} has step 0")
        if last - first > max_span:
            raise SlurmTextError(f"{what} {part!r} is too large")
        ranges.append((match[1], first, last, step))
    return ranges


# --------------------------------------------------------------------------- hostlists


def expand_hostlist(text: str | None) -> list[str]:
    """``node[1-2,5],gpu07`` -> ['node1', 'node2', 'node5', 'gpu07'], in Slurm's order.

    Zero padding follows the range's first number (``gpu[08-10]``); several bracket
    groups multiply (``rack[1-2]-n[1-2]``). ``(null)``, ``None assigned`` and ''
    (never allocated) give []; None (no such field) too.
    """
    if text is None or text in _NO_HOSTS:
        return []
    hosts: list[str] = []
    for item in _split_top_level(text, "[", "]"):
        if not item:
            raise SlurmTextError(f"empty host in hostlist {text!r}")
        hosts.extend(_expand_host(item, text, MAX_HOSTS - len(hosts)))
    return hosts


def _expand_host(item: str, text: str, room: int) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        if not re.fullmatch(_HOST_TEXT, item):
            raise SlurmTextError(f"bad host {item!r} in hostlist {text!r}")
        return [item]
    close_at = item.find("]", open_at)
    prefix, body = item[:open_at], item[open_at + 1 : close_at]
    if close_at < 0 or not re.fullmatch(_HOST_TEXT, prefix):
        raise SlurmTextError(f"bad hostlist {text!r}")
    ranges = _ranges(body, "hostlist range", max_span=MAX_HOSTS)
    tails = _expand_host(item[close_at + 1 :], text, room) if close_at + 1 < len(item) else [""]
    if sum(last - first + 1 for _, first, last, _ in ranges) * len(tails) > room:
        raise SlurmTextError(f"hostlist {text!r} names more than {MAX_HOSTS} hosts")
    heads = [
        f"{prefix}{number:0{len(printed)}d}"
        for printed, first, last, _ in ranges
        for number in range(first, last + 1)
    ]
    return [head + tail for head in heads for tail in tails]


def parse_index_list(text: str) -> list[int]:
    """GPU indices ``0-1,3`` -> [0, 1, 3]; ``N/A``, ``(null)`` or '' -> []."""
    if text in _NO_INDICES:
        return []
    return [
        index
        for _, first, last, _ in _ranges(text, "GPU index range", max_span=MAX_GPU_INDEX_SPAN)
        for index in range(first, last + 1)
    ]


# --------------------------------------------------------------------------- TRES


def parse_tres(text: str) -> dict[str, str]:
    """``billing=1,cpu=1,gres/gpu:a100=1,mem=2000M`` -> {name: value}; '' or (null) -> {}."""
    if text in _NO_TRES:
        return {}
    result: dict[str, str] = {}
    for piece in text.split(","):
        name, sep, value = piece.partition("=")
        if not sep or not name or not value or "=" in value:
            raise SlurmTextError(f"bad TRES entry {piece!r} in {text!r}")
        if name in result:
            raise SlurmTextError(f"TRES {name!r} listed twice in {text!r}")
        result[name] = value
    return result


def gpus_from_tres(tres: Mapping[str, str] | Mapping[str, int]) -> dict[str, int]:
    """GPUs per type from TRES entries (`parse_tres`, or counts from JSON).

    Typed entries (``gres/gpu:a100``) win. ``gres/gpu`` is the total: GPUs in it
    beyond the typed ones (no typed entries, or a type missing from
    AccountingStorageTRES) are kept as :data:`UNTYPED_GPU` rather than dropped;
    typed counts above the total are an error.
    """
    typed: dict[str, int] = {}
    total: int | None = None
    for name, raw in tres.items():
        if name != "gres/gpu" and not name.startswith("gres/gpu:"):
            continue  # cpu, mem, node, billing, gres/gpumem, ...
        count = _tres_count(raw, name)
        if name == "gres/gpu":
            total = count
            continue
        gpu_type = name[len("gres/gpu:") :]
        if not gpu_type:
            raise SlurmTextError(f"empty GPU type in {name!r}")
        if count:
            typed[gpu_type] = typed.get(gpu_type, 0) + count
    typed_sum = sum(typed.values())
    if total is not None:
        if typed_sum > total:
            raise SlurmTextError(f"typed GPU counts {typed} exceed the gres/gpu total {total}")
        if total > typed_sum:
            typed[UNTYPED_GPU] = typed.get(UNTYPED_GPU, 0) + total - typed_sum
    return typed


def requested_gpus(tres: Mapping[str, str] | Mapping[str, int]) -> dict[str, int]:
    """GPUs per type a job *asked for* (ReqTRES, tres_req_str), as :func:`gpus_from_tres`,
    except that typed counts above the ``gres/gpu`` total are kept as typed.

    Slurm 22.05 adds instead of replacing on ``scontrol update jobid=J
    TresPerNode=gres:gpu:h100:1`` of a pending ``gpu:a100:1`` job (docs/slurm-facts.md §9):
    ReqTRES then reads ``gres/gpu=1,gres/gpu:a100=1,gres/gpu:h100=1`` while the job is
    given, and AllocTRES bills, both GPUs. Nothing is billed from a request, and a record
    refused for it was never billed at all; so the typed counts stand, the total goes.
    """
    try:
        return gpus_from_tres(tres)
    except SlurmTextError:
        typed = {name: count for name, count in tres.items() if name != "gres/gpu"}
        return gpus_from_tres(typed)  # type: ignore[arg-type]


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"([0-9]{1,19})(?:\.([0-9]{1,2}))?([KMGTP]?)")


def tres_bytes(value: str) -> int:
    """A size as sacct prints usage TRES (``mem=628748K``, ``gres/gpumem=36266M``,
    ``1.50G``; powers of 1024, no unit = bytes) -> whole bytes, rounded half up."""
    match = _SIZE.fullmatch(value)
    if match is None:
        raise SlurmTextError(f"bad size {value!r}")
    whole, fraction, unit = match.groups()
    scale = _SIZE_UNITS[unit]
    hundredths = int(whole) * 100 + int((fraction or "0").ljust(2, "0"))
    return (hundredths * scale + 50) // 100


def gpu_use_from_tres(tres: Mapping[str, str]) -> tuple[int | None, int | None]:
    """Slurm's own GPU gauges in one step's ``TRESUsageIn*`` -> (``gres/gpuutil``,
    ``gres/gpumem`` in bytes), None where the step has none.

    Only the gpu/nvml (or rsmi) plugin fills them (23.02 and later list the TRES unasked;
    docs/slurm-facts.md §17). ``gpuutil`` is a percentage summed over the step's GPUs
    (100 per busy GPU, since 24.05) as last sampled -- a gauge, not a time average.
    """
    util = tres.get("gres/gpuutil")
    memory = tres.get("gres/gpumem")
    if util is not None and not _is_digits(util):
        raise SlurmTextError(f"bad gres/gpuutil {util!r}")
    return (int(util) if util is not None else None, tres_bytes(memory) if memory is not None else None)


def _tres_count(raw: str | int, name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise SlurmTextError(f"bad count {raw!r} for {name}")
    if isinstance(raw, str):
        if not _is_digits(raw):
            raise SlurmTextError(f"bad count {raw!r} for {name}")
        return int(raw)
    if raw < 0:
        raise SlurmTextError(f"negative count {raw} for {name}")
    return raw


# --------------------------------------------------------------------------- GRES


def gpu_gres(text: str) -> list[tuple[str | None, int, str | None]]:
    """The GPU items of a GRES string: [(type or None, count, detail or None), ...].

    One item is ``[gres:|gres/]NAME[:TYPE][:COUNT|=COUNT][(DETAIL)]``, items are
    comma-separated (commas inside the parentheses belong to the detail). A
    second part that is all digits is a count (``gpu:2``); a count left out is
    the number of indices an ``(IDX:...)`` detail names, else 1 (Slurm's default).
    Other GRES (mps, shard, ...) must have the same shape; they are not returned.
    ``(null)``, ``N/A`` and '' -> [].
    """
    if text in _NO_GRES:
        return []
    gpus: list[tuple[str | None, int, str | None]] = []
    for item in _split_top_level(text, "(", ")"):
        match = re.fullmatch(_GRES_ITEM, item)
        if match is None:
            raise SlurmTextError(f"cannot read GRES {item!r} in {text!r}")
        if match["name"] != "gpu":
            continue
        gpu_type, count_text, detail = match["type"], match["count"], match["detail"]
        if count_text is None and gpu_type is not None and _is_digits(gpu_type):
            gpu_type, count_text = None, gpu_type  # gpu:2 is a count, not a type
        if count_text is None:
            count = len(_detail_indices(detail, item)) if detail and detail.startswith("IDX:") else 1
        elif _is_digits(count_text):
            count = int(count_text)
        else:
            raise SlurmTextError(f"GPU count {count_text!r} in {item!r} is not a whole number")
        if count > MAX_GPUS_PER_ITEM:
            raise SlurmTextError(f"GPU count in {item!r} is too large")
        gpus.append((gpu_type, count, detail))
    return gpus


def _detail_indices(detail: str | None, item: str) -> list[int]:
    if detail is None or not detail.startswith("IDX:"):
        raise SlurmTextError(f"GPU entry {item!r} has no (IDX:...)")
    return parse_index_list(detail[len("IDX:") :])


def gres_gpus(text: str) -> dict[str | None, int]:
    """GPU counts by type from a GRES string; None is "untyped" (``--gpus=2``).

    >>> gres_gpus("gres:gpu:a100:1,gres:gpu:h100:1,gres:mps:100")
    {'a100': 1, 'h100': 1}
    """
    gpus: dict[str | None, int] = {}
    for gpu_type, count, _ in gpu_gres(text):
        if count:
            gpus[gpu_type] = gpus.get(gpu_type, 0) + count
    return gpus


def gres_gpu_indices(text: str) -> dict[int, str]:
    """Node-local GPU index -> type from one node's GRES detail.

    ``gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)`` -> {0: 'a100', 2: 'h100'}, as
    ``scontrol show job -d`` (``GRES=``) and ``squeue --json`` (``gres_detail``)
    print it. Untyped GPUs are :data:`UNTYPED_GPU`. A GPU item without
    ``(IDX:...)``, or an index named twice, is an error.
    """
    indices: dict[int, str] = {}
    for item_type, _, detail in gpu_gres(text):
        for index in _detail_indices(detail, text):
            if index in indices:
                raise SlurmTextError(f"GPU index {index} listed twice in {text!r}")
            indices[index] = item_type or UNTYPED_GPU
    return indices


def parse_sinfo_gpu_types(text: str) -> dict[str, list[str]]:
    """``sinfo -h -o '%R|%G'`` -> {partition: [GPU type, ...]}, types in first-seen order.

    sinfo prints one line per partition and node configuration, e.g.
    ``onprem|gpu:a100:2,gpu:h100:2`` or ``cloud|gpu:a100:2(S:0)``; a partition may
    appear on several lines. Untyped GPUs, other GRES and ``(null)`` add no type
    (the partition is still listed). Blank lines are skipped.
    """
    table: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line:
            continue
        partition, sep, gres = line.partition("|")
        if not sep or not partition or "|" in gres:
            raise SlurmTextError(f"bad sinfo line {line!r} (want PARTITION|GRES)")
        types = table.setdefault(partition, [])
        for gpu_type, _, _ in gpu_gres(gres):
            if gpu_type is not None and gpu_type not in types:
                types.append(gpu_type)
    return table


def parse_sinfo_gpu_use(text: str) -> dict[str, tuple[int, int]]:
    """``sinfo -h -N -O NodeList:0|,Partition:0|,Gres:0|,GresUsed:0|,StateLong:0`` ->
    {partition: (GPUs, GPUs allocated)} over the partition's nodes that can take jobs.

    One line per node and partition, e.g. ``node1|onprem*|gpu:a100:2,gpu:h100:2|``
    ``gpu:a100:1(IDX:0),gpu:h100:0(IDX:N/A)|mixed`` (``*`` marks the default
    partition). A node that cannot take a job (down, drained or draining, failing,
    not yet configured, in maintenance, state unknown; flags such as ``*`` and ``~``
    read as the state they qualify) adds nothing, so its GPUs do not dilute the share
    of the others. A node in two partitions counts in both: GPUs busy for one are
    busy for the other. Blank lines are skipped.
    """
    use: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        if not line:
            continue
        fields = line.split("|")
        if len(fields) != 5 or not fields[0] or not fields[1]:
            raise SlurmTextError(f"bad sinfo line {line!r} (want NODE|PARTITION|GRES|GRES_USED|STATE)")
        _node, partition, gres, used, state = fields
        partition = partition.removesuffix("*")
        total, allocated = use.get(partition, (0, 0))
        if _takes_jobs(state, line):
            total += sum(gres_gpus(gres).values())
            allocated += sum(count for _, count, _ in gpu_gres(used))
        if allocated > total:
            raise SlurmTextError(f"more GPUs allocated than configured in {line!r}")
        use[partition] = (total, allocated)
    return use


# Node states (sinfo's StateLong, flags removed) whose GPUs cannot take a new job.
_NO_NEW_JOBS = frozenset(
    {"down", "drain", "drained", "draining", "fail", "failing", "future", "inval", "maint", "unknown"}
)


def _takes_jobs(state: str, line: str) -> bool:
    base = state.rstrip("*~#!%$@^-")
    if not re.fullmatch(r"[a-z_]+(?:\+[a-z_]+)*", base):
        raise SlurmTextError(f"bad node state {state!r} in {line!r}")
    return not any(part in _NO_NEW_JOBS for part in base.split("+"))


def parse_partition_qos(text: str) -> dict[str, str | None]:
    """``scontrol show partition -o`` -> {partition: its QOS, or None for ``N/A``}.

    One line per partition of ``Key=Value`` words (no value holds a space); a word
    without ``=``, or a line without PartitionName and QoS, raises.
    """
    table: dict[str, str | None] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", key):
                raise SlurmTextError(f"bad word {word!r} in scontrol's partition line {line!r}")
            fields.setdefault(key, value)
        if not fields:
            continue
        if not fields.get("PartitionName") or "QoS" not in fields:
            raise SlurmTextError(f"partition line without PartitionName or QoS: {line!r}")
        qos = fields["QoS"]
        table[fields["PartitionName"]] = None if qos in ("N/A", "", "(null)") else qos
    return table


# --------------------------------------------------------------------------- times


def parse_time(text: str | None, tz: tzinfo | None = None) -> datetime | None:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` as an aware UTC datetime.

    ``Unknown``, ``None``, ``N/A``, ``(null)`` and '' (no such time) give None,
    and so does None. `tz` is the zone the Slurm command printed in (that of
    its process); None means this process's local zone. A local time in a DST
    fold reads as its first occurrence.
    """
    if text is None or text in _NO_TIME:
        return None
    # Not datetime.strptime: its first call imports _strptime and builds locale
    # tables, ~10 ms that every PrologSlurmctld would pay (fromisoformat is C).
    if not re.fullmatch(_TIME, text):
        raise SlurmTextError(f"bad time {text!r} (want YYYY-MM-DDTHH:MM:SS, Unknown or None)")
    try:
        naive = datetime.fromisoformat(text)
        local = naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()
        return local.astimezone(UTC)
    except (OverflowError, OSError, ValueError) as exc:  # month 13; out of the platform's range
        raise SlurmTextError(f"bad time {text!r}: {exc}") from None


def format_time(when: datetime, tz: tzinfo | None = None) -> str:
    """An aware datetime as Slurm takes it (sacct -S/-E): local wall time, no zone."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"need an aware datetime, got naive {when!r}")
    local = when.astimezone(tz) if tz is not None else when.astimezone()
    return local.strftime(_TIME_FORMAT)


def time_from_epoch(seconds: int) -> datetime | None:
    """A JSON time (epoch seconds) as aware UTC; 0, NO_VAL and INFINITE (not set) give None."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise SlurmTextError(f"bad epoch time {seconds!r} (want a non-negative integer)")
    if seconds in (0, NO_VAL, INFINITE):
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise SlurmTextError(f"epoch time {seconds} is out of range") from None


# --------------------------------------------------------------------------- durations


def parse_duration(text: str) -> int | None:
    """Seconds from a Slurm duration; None for ``UNLIMITED``/``INFINITE``/``Partition_Limit``.

    Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` (time
    limits, sacct's ``Elapsed``). Fields are whole numbers and not range-checked,
    as Slurm does not (``90`` is 90 minutes).
    """
    if text in _NO_LIMIT:
        return None
    days_text, dash, clock = text.rpartition("-")
    parts = clock.split(":")
    if len(parts) > 3 or not all(_is_digits(p) for p in [*parts, *([days_text] if dash else [])]):
        raise SlurmTextError(f"bad duration {text!r} (want [D-]HH:MM:SS, M, M:S, D-H or UNLIMITED)")
    values = [int(p) for p in parts]
    days = int(days_text) if dash else 0
    if dash:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = [*values, 0, 0][:3]
    elif len(values) == 3:  # H:M:S
        hours, minutes, seconds = values
    else:  # M, M:S
        hours, minutes, seconds = 0, values[0], values[1] if len(values) == 2 else 0
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_limit_minutes(value: str | int) -> int | None:
    """Seconds from a limit in whole minutes: sacct's ``TimelimitRaw`` text or a JSON number.

    ``UNLIMITED``/``INFINITE``/``Partition_Limit`` and the numbers NO_VAL and
    INFINITE give None (no limit of the job's own).
    """
    if isinstance(value, str):
        if value in _NO_LIMIT:
            return None
        if not _is_digits(value):
            raise SlurmTextError(f"bad limit in minutes {value!r}")
        minutes = int(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        minutes = value
    else:
        raise SlurmTextError(f"bad limit in minutes {value!r}")
    return None if minutes in (NO_VAL, INFINITE) else minutes * 60


# --------------------------------------------------------------------------- job specs


class JobSpec:
    """One job spec: ``6`` (job 6), ``6_2`` (array 6, task 2), ``6_[0-2]`` (array 6's
    tasks not yet split off), ``7+1`` (heterogeneous job 7, component 1).

    `base_id` is the leading number; ``str(spec)`` prints it back. A plain class,
    not a dataclass: `dataclasses` costs every hook process milliseconds.
    """

    __slots__ = ("array_task_id", "array_tasks", "base_id", "het_offset")

    def __init__(
        self,
        base_id: int,
        *,
        array_task_id: int | None = None,
        array_tasks: str | None = None,
        het_offset: int | None = None,
    ) -> None:
        if sum(x is not None for x in (array_task_id, array_tasks, het_offset)) > 1:
            raise ValueError("a job spec is a job, an array task, pending array tasks or a het component")
        self.base_id = base_id
        self.array_task_id = array_task_id
        self.array_tasks = array_tasks
        self.het_offset = het_offset

    @property
    def is_array(self) -> bool:
        return self.array_task_id is not None or self.array_tasks is not None

    def __str__(self) -> str:
        if self.het_offset is not None:
            return f"{self.base_id}+{self.het_offset}"
        if self.array_task_id is not None:
            return f"{self.base_id}_{self.array_task_id}"
        if self.array_tasks is not None:
            return f"{self.base_id}_[{self.array_tasks}]"
        return str(self.base_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobSpec):
            return NotImplemented
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"JobSpec({str(self)!r})"


def parse_job_spec(text: str) -> JobSpec:
    """``6``, ``6_2``, ``6_[0-2]`` (an array expression, see parse_array_indices), ``7+1``."""
    match = re.fullmatch(_JOB_SPEC, text)
    if match is None:
        raise SlurmTextError(f"bad job id {text!r} (want 6, 6_2, 6_[0-2] or 7+1)")
    base, task, tasks, offset = match.groups()
    if tasks is not None:
        parse_array_indices(tasks)
    return JobSpec(
        int(base),
        array_task_id=int(task) if task is not None else None,
        array_tasks=tasks,
        het_offset=int(offset) if offset is not None else None,
    )


def parse_array_indices(text: str) -> tuple[int, int | None]:
    """(number of tasks, concurrency limit) for an array expression.

    Forms: ``0-1``, ``0-9:2``, ``1,3,5``, ``0-15%4``, mixed ``1-3,7,10-20:5%2``.
    Repeated indices count once (Slurm keeps a bitmap); ``%N`` limits how many
    run at once and does not change the count.
    """
    spec, percent, limit_text = text.partition("%")
    limit: int | None = None
    if percent:
        if not _is_digits(limit_text):
            raise SlurmTextError(f"bad task limit in array {text!r}")
        limit = int(limit_text)
    ranges = _ranges(spec, "array range", max_span=MAX_ARRAY_INDEX, steps=True)
    top = max(last for _, _, last, _ in ranges)
    if top > MAX_ARRAY_INDEX:
        raise SlurmTextError(f"array index {top} exceeds the maximum {MAX_ARRAY_INDEX}")
    seen = bytearray(top + 1)
    for _, first, last, step in ranges:
        seen[first : last + 1 : step] = b"\x01" * len(range(first, last + 1, step))
    return seen.count(1), limit


# --------------------------------------------------------------------------- output paths

_OUTPUT_PATTERN = r"%(?:(%)|([0-9]{0,2})([AaJjNnstux]))"


def expand_output_path(
    pattern: str | None,
    *,
    job_id: int,
    user: str,
    name: str,
    work_dir: str,
    node: str = "",
    array_job_id: int | None = None,
    array_task_id: int | None = None,
) -> str:
    """Where a batch job's stdout goes: its ``-o`` pattern as the batch step expands it
    (`SLURM_JOB_STDOUT`, which PrologSlurmctld gets unexpanded), or Slurm's default
    ``slurm-%j.out`` (``slurm-%A_%a.out`` for an array task) when none was given; a
    relative path is under `work_dir`. Replaced: ``%%`` ``%A`` ``%a`` ``%J`` ``%j`` ``%N``
    ``%n`` ``%s`` ``%t`` ``%u`` ``%x``, a number between ``%`` and the letter zero-pads
    (``%4a``); a pattern with a backslash in it is taken as written, less its backslashes.
    """
    array = array_job_id is not None and array_task_id is not None
    if not pattern:
        pattern = "slurm-%A_%a.out" if array else "slurm-%j.out"
    if "\\" in pattern:
        path = pattern.replace("\\", "")
    else:
        values = {
            "A": str(array_job_id if array else job_id),
            "a": str(array_task_id if array else 4294967294),
            "J": f"{job_id}.batch",
            "j": str(job_id),
            "N": node,
            "n": "0",
            "s": "batch",
            "t": "0",
            "u": user,
            "x": name,
        }

        def replace(match: re.Match[str]) -> str:
            if match.group(1):
                return "%"
            value = values[match.group(3)]
            width = int(match.group(2) or 0)
            return value.zfill(width) if value.isdigit() else value

        path = re.sub(_OUTPUT_PATTERN, replace, pattern)
    return path if path.startswith("/") else f"{work_dir.rstrip('/')}/{path}"


# --------------------------------------------------------------------------- comments


def comment_text(message: str) -> str:
    """``gpucredit: <message>`` on one line, at most MAX_COMMENT_CHARS, for ``comment=``.

    One line and no ``=``: scontrol prints the comment inside its ``Key=Value``
    line, and a ``Key=`` in free text makes slurm_hooks/scontrol.py refuse the line.
    """
    text = re.sub(_SPACES, " ", message).replace("=", ":").strip()
    room = MAX_COMMENT_CHARS - len(COMMENT_PREFIX)
    if len(text) > room:
        text = text[: room - 3] + "..."
    return COMMENT_PREFIX + text


def comment_directives(text: str | None) -> tuple[dict[str, str], str]:
    """A job comment's gpucredit directives, and the user's own text without them.

    A directive is a word ``gpucredit:KEY=VALUE[,KEY=VALUE]``; a comment may hold
    several. Keys: ``max_cost`` (credits, ``25`` or ``12.5``) and ``cloud`` (``yes``
    or ``no``). Another key, a value of another form or a key given twice raises
    SlurmTextError. ``gpucredit:`` followed by a space (gpucredit's own comments) is
    text, not a directive.

    >>> comment_directives("run 7 gpucredit:max_cost=25,cloud=yes")
    ({'max_cost': '25', 'cloud': 'yes'}, 'run 7')
    """
    if not text:
        return {}, ""
    directives: dict[str, str] = {}
    for body in re.findall(_DIRECTIVE_WORD, text):
        for pair in body.split(","):
            key, sep, value = pair.partition("=")
            pattern = _DIRECTIVE_VALUES.get(key)
            if pattern is None or not sep:
                keys = ", ".join(f"{k}=..." for k in _DIRECTIVE_VALUES)
                raise SlurmTextError(f"unknown gpucredit directive {pair!r} in the comment (known: {keys})")
            if not re.fullmatch(pattern, value):
                raise SlurmTextError(f"bad value {value!r} for gpucredit directive {key} in the comment")
            if key in directives:
                raise SlurmTextError(f"gpucredit directive {key} given twice in the comment")
            directives[key] = value
    rest = re.sub(r"\s*" + _DIRECTIVE_WORD, "", text).strip() if directives else text.strip()
    return directives, rest


def routed_comment(decision: str, user_text: str) -> str:
    """The comment of a routed job: ``gpucredit: <decision>`` (as :func:`comment_text`),
    then `` | `` and the user's own text, when there is some."""
    ours = comment_text(decision)
    return f"{ours} | {user_text}" if user_text else ours


def parse_parsable(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``--noheader --parsable2`` output (one row per line, ``|`` between fields) -> one
    dict per row keyed by `fields`, values as printed. A line with another number of
    fields raises SlurmTextError; blank lines are skipped. For tables without free text
    (sacctmgr's and sshare's names cannot hold ``|``); sshare indents Account by depth,
    and the spaces are kept.

    >>> parse_parsable("physics|alice|7", ("account", "user", "fairshare"))
    [{'account': 'physics', 'user': 'alice', 'fairshare': '7'}]
    """
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(fields):
            raise SlurmTextError(f"line {number} has {len(values)} fields, expected {len(fields)}: {line!r}")
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def split_format_line(line: str, count: int) -> list[str]:
    """One ``squeue --noheader --Format=F1:|,F2:|,...`` line -> its `count` values.

    Each value is followed by ``|``, so a line is exactly `count` pieces and an empty
    last one; anything else raises. Only for fields Slurm sets itself (ids, states,
    times, TRES, and account, partition, node and user names): none of them can hold
    ``|`` or a line break, which is why a job's name, comment or paths are never asked
    for in this format. Values a squeue pads with spaces are stripped.
    """
    parts = line.split("|")
    if len(parts) != count + 1 or parts[-1].strip():
        raise SlurmTextError(f"expected {count} '|'-ended fields, got {len(parts) - 1}: {line[:200]!r}")
    del parts[-1]
    if " " in line:
        parts = [part.strip() for part in parts]
    return parts


def parse_format_rows(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``squeue --noheader --Format=`` output of `fields` (each ``Field:|``) -> one dict
    per line, keyed by field. Lines are split on "\\n" only (never on the other line
    breaks Python's splitlines knows); blank lines are skipped; a bad line raises.

    >>> parse_format_rows("5|RUNNING|\\n", ("JobID", "State"))
    [{'JobID': '5', 'State': 'RUNNING'}]
    """
    return [
        dict(zip(fields, split_format_line(line, len(fields)), strict=True))
        for line in text.split("\n")
        if line.strip()
    ]


def parse_raw_shares(text: str) -> int | None:
    """An association's fairshare as sacctmgr and sshare print it: ``7`` -> 7, ``parent``
    (it competes with its parent's share) -> None."""
    if text == "parent":
        return None
    if not _is_digits(text):
        raise SlurmTextError(f"fairshare {text!r} is neither a number nor 'parent'")
    return int(text)
