"""job_submit/request.py: raw job_desc fields (as job_submit.lua forwards them) -> JobRequest.

The field values are those Slurm 22.05.8 put in job_desc (docs/slurm-facts.md §4 table).
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from job_submit.request import (
    INFINITE,
    NO_VAL,
    InvalidRequest,
    JobRequest,
    parse_array_inx,
    parse_gres,
    parse_submit,
)

DEBUG = {"debug": {"default_time": NO_VAL, "max_time": INFINITE, "default": True}}


def submit(**overrides: object) -> dict[str, object]:
    """A job_desc as sbatch with no options leaves it (user alice, default account physics)."""
    fields: dict[str, object] = {
        "user_name": "alice",
        "user_id": 1001,
        "default_account": "physics",
        "time_limit": 120,
        "num_tasks": NO_VAL,
        "min_nodes": NO_VAL,
        "partitions": DEBUG,
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not None}


# --- the docs/slurm-facts.md §4 table, row by row -------------------------------------------------


@pytest.mark.parametrize(
    ("option", "fields", "gpus", "requested_as"),
    [
        ("--gres=gpu:a100:1", {"tres_per_node": "gres:gpu:a100:1"}, {"a100": 1}, "per_node"),
        ("--gres=gpu:2", {"tres_per_node": "gres:gpu:2"}, {None: 2}, "per_node"),
        (
            "--gres=gpu:a100:1,gpu:h100:1",
            {"tres_per_node": "gres:gpu:a100:1,gres:gpu:h100:1"},
            {"a100": 1, "h100": 1},
            "per_node",
        ),
        ("--gpus=2", {"tres_per_job": "gres:gpu:2"}, {None: 2}, "per_job"),
        ("--gpus=a100:2", {"tres_per_job": "gres:gpu:a100:2"}, {"a100": 2}, "per_job"),
        ("--gpus-per-node=h100:1", {"tres_per_node": "gres:gpu:h100:1"}, {"h100": 1}, "per_node"),
        ("--gpus-per-node=2", {"tres_per_node": "gres:gpu:2"}, {None: 2}, "per_node"),
        ("--gpus-per-task=a100:1", {"tres_per_task": "gres:gpu:a100:1"}, {"a100": 1}, "per_task"),
    ],
)
def test_slurm_facts_table_rows(
    option: str, fields: dict[str, str], gpus: dict[str | None, int], requested_as: str
) -> None:
    request = parse_submit(submit(**fields))
    assert request.gpus == gpus, option
    assert request.gpus_requested_as == requested_as


def test_per_node_request_multiplies_by_nodes() -> None:
    # sbatch -N 2 --gres=gpu:h100:2
    request = parse_submit(submit(tres_per_node="gres:gpu:h100:2", min_nodes=2))
    assert request.gpus == {"h100": 4}


def test_per_job_request_ignores_nodes_and_tasks() -> None:
    request = parse_submit(submit(tres_per_job="gres:gpu:a100:2", min_nodes=2, num_tasks=8))
    assert request.gpus == {"a100": 2}


def test_per_task_request_multiplies_by_tasks() -> None:
    # sbatch -n 3 --gpus-per-task=a100:1
    request = parse_submit(submit(tres_per_task="gres:gpu:a100:1", num_tasks=3))
    assert request.gpus == {"a100": 3}
    assert request.gpus_requested_as == "per_task"


def test_no_val_nodes_and_tasks_count_as_one() -> None:
    assert parse_submit(submit(tres_per_node="gres:gpu:2", min_nodes=NO_VAL)).gpus == {None: 2}
    assert parse_submit(submit(tres_per_task="gres:gpu:2", num_tasks=NO_VAL)).gpus == {None: 2}


def test_job_without_gpus() -> None:
    request = parse_submit(submit())
    assert request.gpus == {}
    assert request.gpus_requested_as is None
    assert request.total_gpus == 0


def test_several_gpu_options_price_the_largest() -> None:
    # --gpus=4 --gpus-per-node=a100:1 -N 2: Slurm would refuse the mismatch; we
    # never under-estimate.
    request = parse_submit(submit(tres_per_job="gres:gpu:4", tres_per_node="gres:gpu:a100:1", min_nodes=2))
    assert request.gpus == {None: 4}
    assert request.gpus_requested_as == "per_job"


# --- GRES spellings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gres:gpu:a100:1,gres:gpu:h100:1", {"a100": 1, "h100": 1}),
        ("gres:gpu:2", {None: 2}),
        ("gpu:a100:1", {"a100": 1}),
        ("gpu:2", {None: 2}),
        ("gres/gpu:a100:1", {"a100": 1}),
        ("gres/gpu:a100=3", {"a100": 3}),
        ("gres/gpu=2", {None: 2}),
        ("gres:gpu", {None: 1}),
        ("gres:gpu:h100", {"h100": 1}),
        ("gres:gpu:a100:1,gres:gpu:a100:2", {"a100": 3}),
        ("gres:gpu:0", {}),
        ("gres:mps:100", {}),
        ("gres:shard:2,gres:gpu:h100:1", {"h100": 1}),
        ("", {}),
        (None, {}),
    ],
)
def test_gres_spellings(text: str | None, gpus: dict[str | None, int]) -> None:
    assert parse_gres(text) == gpus


@pytest.mark.parametrize(
    "text",
    [
        "gres:gpu:a100:x1",
        "gres:gpu:a100:-1",
        "gres:gpu:a100:1k",
        "gres:gpu::1",
        "gres:gpu:a100:",
        "gres:gpu:a100:1:2",
        "gres:gpu:a$100:1",
        "gres:",
        "gres:gpu=2=3",
        "gres:gpu:99999999999",
    ],
)
def test_garbage_gres_is_invalid(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(submit(tres_per_node=text))
    assert info.value.code == "invalid_gres"


def test_non_string_gres_is_invalid() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(submit(tres_per_job=2))
    assert info.value.code == "invalid_gres"


def test_a_gres_string_read_again_gives_its_counts_again() -> None:
    """The daemon reads each GRES string once; what one quote does with its counts
    never reaches the next quote of the same string."""
    first = parse_gres("gres:gpu:h100:2")
    first["h100"] = 99
    first[None] = 1
    assert parse_gres("gres:gpu:h100:2") == {"h100": 2}
    with pytest.raises(InvalidRequest):  # a refusal is not remembered as an answer either
        parse_gres("gres:gpu:h100:x")
    with pytest.raises(InvalidRequest):
        parse_gres("gres:gpu:h100:x")


# --- time limits ---------------------------------------------------------------------


def test_explicit_time_limit_in_minutes() -> None:
    request = parse_submit(submit(time_limit=90))  # -t 1:30:00
    assert request.time_limit_seconds == 5400
    assert request.time_limit_source == "explicit"


def test_no_val_time_uses_partition_default() -> None:
    partitions = {"gpu": {"default_time": 60, "max_time": 1440, "default": True}}
    request = parse_submit(submit(time_limit=NO_VAL, partitions=partitions))
    assert request.time_limit_seconds == 3600
    assert request.time_limit_source == "partition_default"


def test_no_val_time_without_partition_default_uses_max_time() -> None:
    partitions = {"gpu": {"default_time": NO_VAL, "max_time": 1440}}
    request = parse_submit(submit(time_limit=NO_VAL, partition="gpu", partitions=partitions))
    assert request.time_limit_seconds == 86400
    assert request.time_limit_source == "partition_max"


def test_no_val_time_on_unlimited_partition_is_unbounded() -> None:
    request = parse_submit(submit(time_limit=NO_VAL))  # debug: MaxTime=INFINITE
    assert request.time_limit_seconds is None
    assert request.time_limit_source == "unbounded"


def test_infinite_time_is_unbounded() -> None:
    request = parse_submit(submit(time_limit=INFINITE))
    assert request.time_limit_seconds is None
    assert request.time_limit_source == "unbounded"


def test_explicit_partition_is_used_for_the_default() -> None:
    partitions = {
        "short": {"default_time": 30, "max_time": 60, "default": True},
        "long": {"default_time": 600, "max_time": 2880, "default": False},
    }
    request = parse_submit(submit(time_limit=NO_VAL, partition="long", partitions=partitions))
    assert request.partition == "long"
    assert request.time_limit_seconds == 36000


def test_no_partition_uses_the_default_partition() -> None:
    partitions = {
        "short": {"default_time": 30, "max_time": 60, "default": True},
        "long": {"default_time": 600, "max_time": 2880, "default": False},
    }
    request = parse_submit(submit(time_limit=NO_VAL, partitions=partitions))
    assert request.partition is None
    assert request.time_limit_seconds == 1800


def test_several_partitions_price_the_longest_default() -> None:
    partitions = {
        "short": {"default_time": 30, "max_time": 60},
        "long": {"default_time": 600, "max_time": 2880},
    }
    request = parse_submit(submit(time_limit=NO_VAL, partition="short,long", partitions=partitions))
    assert request.time_limit_seconds == 36000


def test_unknown_partition_leaves_time_unbounded() -> None:
    request = parse_submit(submit(time_limit=NO_VAL, partition="nosuch"))
    assert request.time_limit_seconds is None


def test_no_default_partition_known_leaves_time_unbounded() -> None:
    partitions = {
        "a": {"default_time": 30, "max_time": 60},
        "b": {"default_time": 60, "max_time": 60},
    }
    assert parse_submit(submit(time_limit=NO_VAL, partitions=partitions)).time_limit_seconds is None


@pytest.mark.parametrize("value", [-5, "ten", 1.5, True, [1]])
def test_garbage_time_is_invalid(value: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(submit(time_limit=value))
    assert info.value.code == "invalid_time"


def test_integral_float_time_is_accepted() -> None:
    # Lua numbers are doubles; a JSON encoder may write 120.0.
    assert parse_submit(submit(time_limit=120.0)).time_limit_seconds == 7200


# --- arrays ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("array_inx", "count", "limit"),
    [
        ("0-1", 2, None),
        ("0-9:2", 5, None),
        ("1,3,5", 3, None),
        ("0-15%4", 16, 4),
        ("1-3,7,10-20:5%2", 7, 2),
        ("0-3,2-5", 6, None),  # overlaps count once
        ("7", 1, None),
        ("", 1, None),
        (None, 1, None),
    ],
)
def test_array_counts(array_inx: str | None, count: int, limit: int | None) -> None:
    assert parse_array_inx(array_inx) == (count, limit)


def test_array_request_is_per_element() -> None:
    request = parse_submit(submit(tres_per_node="gres:gpu:h100:1", array_inx="0-9%2"))
    assert request.gpus == {"h100": 1}
    assert request.array_tasks == 10
    assert request.array_max_concurrent == 2
    assert request.total_gpus == 10
    assert request.is_array


@pytest.mark.parametrize(
    "array_inx", ["a-b", "3-1", "0-9:0", "1,,2", "0-9%", "0-9%x", "%4", "-1", "0-5000000", "1;2"]
)
def test_garbage_array_is_invalid(array_inx: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(submit(array_inx=array_inx))
    assert info.value.code == "invalid_array"


# --- identity ----------------------------------------------------------------------------


def test_account_defaults_to_default_account() -> None:
    request = parse_submit(submit())
    assert request.user == "alice"
    assert request.user_id == 1001
    assert request.account == "physics"
    assert request.partition is None


def test_explicit_account_and_partition_win() -> None:
    request = parse_submit(submit(account="research", partition="debug"))
    assert request.account == "research"
    assert request.partition == "debug"


def test_no_account_at_all() -> None:
    assert parse_submit(submit(default_account=None)).account is None


def test_missing_user_name_falls_back_to_uid() -> None:
    assert parse_submit(submit(user_name=None)).user == "1001"


def test_no_user_at_all_is_invalid() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(submit(user_name=None, user_id=None))
    assert info.value.code == "invalid_request"


@pytest.mark.parametrize(
    "overrides",
    [
        {"partitions": ["debug"]},
        {"partitions": {"debug": "x"}},
        {"user_name": 5},
        {"min_nodes": "two"},
    ],
)
def test_garbage_fields_are_invalid(overrides: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        parse_submit(submit(time_limit=NO_VAL, tres_per_node="gres:gpu:1", **overrides))


def test_not_a_mapping_is_invalid() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_submit(["user_name", "alice"])  # type: ignore[arg-type]
    assert info.value.code == "invalid_request"


def test_invalid_request_carries_code_and_message() -> None:
    error = InvalidRequest("invalid_gres", "cannot read GRES 'x'")
    assert (error.code, error.message) == ("invalid_gres", "cannot read GRES 'x'")
    assert str(error) == "invalid_gres: cannot read GRES 'x'"
    assert isinstance(error, ValueError)


def test_job_request_is_frozen() -> None:
    request = parse_submit(submit())
    assert isinstance(request, JobRequest)
    with pytest.raises(AttributeError):
        request.user = "bob"  # type: ignore[misc]


# --- properties -------------------------------------------------------------------------


@given(
    counts=st.dictionaries(st.sampled_from(["a100", "h100", "l40s", None]), st.integers(1, 64), min_size=1),
    nodes=st.integers(1, 64),
)
def test_round_trip_of_generated_gres(counts: dict[str | None, int], nodes: int) -> None:
    text = ",".join(f"gres:gpu:{t}:{n}" if t else f"gres:gpu:{n}" for t, n in counts.items())
    request = parse_submit(submit(tres_per_node=text, min_nodes=nodes))
    assert request.gpus == {t: n * nodes for t, n in counts.items()}


@given(ranges=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 50), st.integers(1, 7)), min_size=1))
def test_array_count_matches_set_of_indices(ranges: list[tuple[int, int, int]]) -> None:
    text = ",".join(f"{a}-{a + span}:{step}" for a, span, step in ranges)
    expected = {i for a, span, step in ranges for i in range(a, a + span + 1, step)}
    assert parse_array_inx(text) == (len(expected), None)


@given(st.text(max_size=40))
def test_arbitrary_text_never_crashes(text: str) -> None:
    for key in ("tres_per_node", "array_inx"):
        with contextlib.suppress(InvalidRequest):
            parse_submit(submit(**{key: text}))
