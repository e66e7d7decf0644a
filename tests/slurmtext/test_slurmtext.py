"""slurmtext: Slurm's text formats, one parser each, on recorded output and by property.

The recorded fixtures are described in tests/fixtures/sacct/README.md (Slurm
22.05.8 on the project's box, timezone UTC).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slurmtext
from slurmtext import (
    INFINITE,
    MAX_COMMENT_CHARS,
    NO_VAL,
    JobSpec,
    SlurmTextError,
    comment_text,
    expand_hostlist,
    format_time,
    gpu_gres,
    gpus_from_tres,
    gres_gpu_indices,
    gres_gpus,
    parse_array_indices,
    parse_duration,
    parse_index_list,
    parse_job_spec,
    parse_limit_minutes,
    parse_sinfo_gpu_types,
    parse_time,
    parse_tres,
    time_from_epoch,
)
from tests.support import REPO
from tests.support.recorded import fixture, utc

# --------------------------------------------------------------------------- recorded output


def _recorded_rows() -> list[dict[str, str]]:
    from accounting_bridge.slurm.records import SACCT_FIELDS

    rows = []
    for name in ("recorded_finished.txt", "recorded_running.txt", "recorded_requeue_pending.txt"):
        for line in fixture(name).splitlines():
            rows.append(dict(zip(SACCT_FIELDS, line.split("|", len(SACCT_FIELDS) - 1), strict=True)))
    return rows


def test_every_value_in_the_recorded_sacct_text_reads() -> None:
    rows = _recorded_rows()
    assert len(rows) == 21
    for row in rows:
        spec = parse_job_spec(row["JobID"])
        assert str(spec) == row["JobID"]
        for key in ("Submit", "Start", "End"):
            value = parse_time(row[key], UTC)
            assert value is None or value.tzinfo == UTC
        assert parse_limit_minutes(row["TimelimitRaw"]) in (60, 300)
        assert all(host in ("node1", "node2") for host in expand_hostlist(row["NodeList"]))
        gpus_from_tres(parse_tres(row["AllocTRES"]))
        gpus_from_tres(parse_tres(row["ReqTRES"]))
    by_id = {row["JobID"]: row for row in rows}
    assert expand_hostlist(by_id["7"]["NodeList"]) == ["node1", "node2"]
    assert expand_hostlist(by_id["13"]["NodeList"]) == []  # "None assigned"
    assert gpus_from_tres(parse_tres(by_id["5"]["AllocTRES"])) == {"a100": 1, "h100": 1}
    assert gpus_from_tres(parse_tres(by_id["5"]["ReqTRES"])) == {"gpu": 2}
    assert parse_tres(by_id["13"]["AllocTRES"]) == {}
    assert parse_time(by_id["4"]["Start"], UTC) == utc("2026-11-29T09:14:11")
    assert parse_time(by_id["13"]["Start"], UTC) is None  # "None": never started
    het = parse_job_spec("11+1")
    assert (het.base_id, het.het_offset, het.is_array) == (11, 1, False)
    task = parse_job_spec("8_2")
    assert (task.base_id, task.array_task_id, task.is_array) == (8, 2, True)


def test_recorded_squeue_gres_detail() -> None:
    jobs = json.loads(fixture("recorded_squeue_running.json"))["jobs"]
    details = sorted({detail for job in jobs for detail in job["gres_detail"]})
    assert details == ["gpu:a100:1(IDX:0)", "gpu:a100:1(IDX:1)", "gpu:h100:1(IDX:3)"]
    assert [gres_gpu_indices(detail) for detail in details] == [{0: "a100"}, {1: "a100"}, {3: "h100"}]


def test_recorded_scontrol_values() -> None:
    line = fixture("recorded_scontrol_show_job_d_running.txt")
    fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
    assert gres_gpu_indices(fields["GRES"]) == {3: "h100"}
    assert gres_gpus(fields["JOB_GRES"]) == {"h100": 1}
    assert gres_gpus(fields["TresPerNode"]) == {"h100": 1}
    assert gpus_from_tres(parse_tres(line.split("TRES=", 1)[1].split()[0])) == {"h100": 1}
    assert parse_duration(fields["TimeLimit"]) == 300
    assert parse_duration(fields["RunTime"]) == 6
    assert parse_time(fields["Deadline"], UTC) is None  # N/A
    assert parse_time(fields["SuspendTime"], UTC) is None  # None
    assert parse_time(fields["SubmitTime"], UTC) == utc("2026-11-29T09:14:11")


def test_recorded_json_epochs() -> None:
    job = json.loads(fixture("recorded_running.json"))["jobs"][0]
    assert job["time"]["end"] == 0
    assert time_from_epoch(job["time"]["end"]) is None
    assert time_from_epoch(job["time"]["start"]) == datetime.fromtimestamp(job["time"]["start"], UTC)


# --------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        ("node[1-2,5],gpu07", ["node1", "node2", "node5", "gpu07"]),
        ("gpu[08-10,12],cpu1", ["gpu08", "gpu09", "gpu10", "gpu12", "cpu1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[9-10]", ["n9", "n10"]),
        ("a.b-c_d", ["a.b-c_d"]),
        ("None assigned", []),
        ("(null)", []),
        ("", []),
        (None, []),
    ],
)
def test_hostlists(text: str | None, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text",
    ["node[1-", "node]1[", "node[2-1]", "node[a-b]", "a,,b", "n[0-999999]", "n[1-3:2]", "n[1-2", "a b",
     "node[1-2],", "n[]", "n[1-[2]]", "n[0-400]m[0-400]"],
)  # fmt: skip
def test_bad_hostlists(text: str) -> None:
    with pytest.raises(SlurmTextError):
        expand_hostlist(text)


_PREFIX = st.text(alphabet="abcxyz-.", min_size=1, max_size=4)


@st.composite
def hostlist_items(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One hostlist item and, built independently, the names it stands for."""
    groups = draw(st.lists(st.tuples(_PREFIX, st.lists(
        st.tuples(st.integers(0, 120), st.integers(0, 6), st.integers(1, 3)), min_size=1, max_size=3
    )), min_size=0, max_size=2))  # fmt: skip
    text = draw(_PREFIX)
    choices: list[list[str]] = [[text]]
    for prefix, ranges in groups:
        body = ",".join(
            f"{first:0{width}d}" + (f"-{first + span:0{width}d}" if span else "")
            for first, span, width in ranges
        )
        text += f"[{body}]{prefix}"
        numbers = [f"{n:0{width}d}" for first, span, width in ranges for n in range(first, first + span + 1)]
        choices += [numbers, [prefix]]
    return text, ["".join(parts) for parts in itertools.product(*choices)]


@settings(max_examples=200, deadline=None)
@given(st.lists(hostlist_items(), min_size=1, max_size=4))
def test_hostlist_expansion_matches_an_independent_model(items: list[tuple[str, list[str]]]) -> None:
    text = ",".join(item for item, _ in items)
    assert expand_hostlist(text) == [name for _, names in items for name in names]


@given(st.lists(st.from_regex(r"[a-z][a-z0-9.\-]{0,8}", fullmatch=True), min_size=1, max_size=6))
def test_plain_names_round_trip(names: list[str]) -> None:
    assert expand_hostlist(",".join(names)) == names


def test_gpu_index_lists() -> None:
    assert parse_index_list("0-1,3") == [0, 1, 3]
    assert parse_index_list("N/A") == []
    assert parse_index_list("") == []
    for bad in ("3-1", "0-5000", "x", "1,,2", "1:2"):
        with pytest.raises(SlurmTextError):
            parse_index_list(bad)


# --------------------------------------------------------------------------- TRES


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("billing=11,cpu=1,gres/gpu:a100=1,gres/gpu=1,node=1", {"a100": 1}),
        ("billing=1,cpu=1,gres/gpu=2,mem=2000M,node=1", {"gpu": 2}),
        ("cpu=1,gres/gpu:a100=1,gres/gpu:h100=1,gres/gpu=2", {"a100": 1, "h100": 1}),
        ("cpu=1,gres/gpu:a100=1,gres/gpu=3", {"a100": 1, "gpu": 2}),  # a type not in AccountingStorageTRES
        ("cpu=1,gres/gpu:a100=2", {"a100": 2}),
        ("cpu=1,gres/gpu:a100=0,gres/gpu=0", {}),
        ("cpu=1,gres/gpumem=4G,gres/gpuutil=50,mem=1G", {}),
        ("cpu=1,gres/gpu:1g.10gb=2,gres/gpu=2", {"1g.10gb": 2}),
        ("(null)", {}),
        ("", {}),
    ],
)
def test_gpus_from_tres(tres: str, gpus: dict[str, int]) -> None:
    assert gpus_from_tres(parse_tres(tres)) == gpus


@pytest.mark.parametrize("text", ["cpu", "cpu=1,", "=1", "cpu=", "cpu=1,cpu=2", "a=b=c", ",cpu=1"])
def test_bad_tres_strings(text: str) -> None:
    with pytest.raises(SlurmTextError):
        parse_tres(text)


def test_bad_gpu_tres_counts() -> None:
    with pytest.raises(SlurmTextError, match="bad count 'one' for gres/gpu:a100"):
        gpus_from_tres(parse_tres("gres/gpu:a100=one"))
    with pytest.raises(SlurmTextError, match=r"typed GPU counts \{'a100': 3\} exceed the gres/gpu total 1"):
        gpus_from_tres(parse_tres("gres/gpu:a100=3,gres/gpu=1"))
    with pytest.raises(SlurmTextError, match="empty GPU type"):
        gpus_from_tres(parse_tres("gres/gpu:=1"))
    for count in (-1, True, 1.0, None):
        with pytest.raises(SlurmTextError):
            gpus_from_tres({"gres/gpu": count})  # type: ignore[arg-type]


def test_gpus_from_json_tres_counts() -> None:
    assert gpus_from_tres({"cpu": 1, "gres/gpu": 2, "gres/gpu:h100": 2}) == {"h100": 2}


# --------------------------------------------------------------------------- GRES


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        # job_desc (job_submit): tres_per_node / tres_per_job / tres_per_task
        ("gres:gpu:a100:1,gres:gpu:h100:1", {"a100": 1, "h100": 1}),
        ("gres:gpu:2", {None: 2}),
        ("gres:gpu", {None: 1}),
        ("gres:gpu:h100", {"h100": 1}),
        ("gres/gpu:a100=3", {"a100": 3}),
        ("gres/gpu=2", {None: 2}),
        ("gres:gpu:a100:1,gres:gpu:a100:2", {"a100": 3}),
        ("gres:gpu:0", {}),
        ("gres:mps:100,gres:shard:2", {}),
        ("gres:mps:1k,gres:gpu:h100:1", {"h100": 1}),  # other GRES keep Slurm's own counts
        ("gres:gpu:3090:2", {"3090": 2}),
        # scontrol JOB_GRES and node GRES
        ("gpu:a100:1,gpu:h100:1", {"a100": 1, "h100": 1}),
        ("gpu:a100:2(IDX:0-1)", {"a100": 2}),
        ("gpu:a100(IDX:0,2)", {"a100": 2}),  # no count: the indices count
        ("gpu:a100:0(IDX:N/A)", {}),
        # sinfo %G
        ("gpu:a100:2(S:0-1),gpu:h100:2(S:0)", {"a100": 2, "h100": 2}),
        ("(null)", {}),
        ("N/A", {}),
        ("", {}),
    ],
)
def test_gres_gpus(text: str, gpus: dict[str | None, int]) -> None:
    assert gres_gpus(text) == gpus


@pytest.mark.parametrize(
    "text",
    ["gres:gpu:a100:x1", "gres:gpu:a100:-1", "gres:gpu:a100:1k", "gres:gpu::1", "gres:gpu:a100:",
     "gres:gpu:a100:1:2", "gres:gpu:a$100:1", "gres:", "gres:gpu=2=3", "gres:gpu:99999999999",
     "gpu:a100:1,", "gpu:a100:1, gpu:h100:1", "gpu(x", "gpu:a100:1(IDX:0", "gpu:a100:1)(",
     "gpu(IDX:x)", "gpu(IDX:3-1)", " gpu:1"],
)  # fmt: skip
def test_bad_gres(text: str) -> None:
    with pytest.raises(SlurmTextError):
        gres_gpus(text)


def test_gres_items_keep_their_detail() -> None:
    assert gpu_gres("gpu:a100:2(S:0-1),mps:100,gpu:2(IDX:0,2)") == [
        ("a100", 2, "S:0-1"),
        (None, 2, "IDX:0,2"),
    ]


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:h100:1(IDX:3)", {3: "h100"}),
        ("gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)", {0: "a100", 2: "h100"}),
        ("gpu:a100:2(IDX:0-1),gpu:h100:2(IDX:2,3)", {0: "a100", 1: "a100", 2: "h100", 3: "h100"}),
        ("gpu:h100:3(IDX:0-1,3)", {0: "h100", 1: "h100", 3: "h100"}),
        ("gpu:2(IDX:0-1)", {0: "gpu", 1: "gpu"}),
        ("gpu:a100:0(IDX:N/A)", {}),
        ("mps:100(0/100),gpu:a100:1(IDX:1)", {1: "a100"}),
        ("", {}),
    ],
)
def test_gres_gpu_indices(detail: str, indices: dict[int, str]) -> None:
    assert gres_gpu_indices(detail) == indices


@pytest.mark.parametrize(
    "detail",
    ["gpu:a100:1", "gpu:a100:1(S:0)", "gpu:a100:1(IDX:0),gpu:h100:1(IDX:0)", "gpu(x", "gpu:1(IDX:a)"],
)
def test_bad_gres_gpu_indices(detail: str) -> None:
    with pytest.raises(SlurmTextError):
        gres_gpu_indices(detail)


def test_sinfo_partition_gpu_types() -> None:
    text = (
        "onprem|gpu:a100:2,gpu:h100:2\n"
        "cloud|gpu:a100:2(S:0)\n"
        "onprem|gpu:l40s:4(S:0-1),gpu:a100:1\n"  # a second node configuration
        "cpu|(null)\n"
        "old|gpu:2,mps:100\n"
        "\n"
    )
    assert parse_sinfo_gpu_types(text) == {
        "onprem": ["a100", "h100", "l40s"],
        "cloud": ["a100"],
        "cpu": [],
        "old": [],
    }
    assert parse_sinfo_gpu_types("") == {}


@pytest.mark.parametrize(
    "text", ["onprem gpu:a100:2\n", "|gpu:a100:2\n", "a|gpu:a100:2|x\n", "a|gpu(\n", " \n"]
)
def test_bad_sinfo_lines(text: str) -> None:
    with pytest.raises(SlurmTextError):
        parse_sinfo_gpu_types(text)


# --------------------------------------------------------------------------- times


@pytest.mark.parametrize("text", ["Unknown", "None", "N/A", "(null)", "", None])
def test_no_time(text: str | None) -> None:
    assert parse_time(text, UTC) is None


def test_times_are_read_in_the_given_zone() -> None:
    assert parse_time("2026-12-02T10:00:01", timezone(timedelta(hours=2))) == utc("2026-12-02T08:00:01")


def test_times_default_to_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(time, "tzset"):
        pytest.fail("time.tzset is needed to change the local zone")
    monkeypatch.setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")  # POSIX rule: no tzdata needed
    time.tzset()
    try:
        assert parse_time("2026-11-29T09:14:11") == utc("2026-11-29T08:14:11")
        assert parse_time("2026-07-01T12:00:00") == utc("2026-07-01T10:00:00")  # CEST
        assert format_time(utc("2026-07-01T10:00:00")) == "2026-07-01T12:00:00"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "text",
    ["2026-12-02", "2026-12-02T10:00", "2026-12-2T10:00:01", "20261202T100001", "2026-12-02 10:00:01",
     "2026-12-02T10:00:01Z", "2026-12-02T10:00:01+01:00", "2026-12-02T10:00:01.5", "2026-13-02T10:00:01",
     "2026-12-02T24:00:01", "２０２６-12-02T10:00:01", "yesterday", " 2026-12-02T10:00:01", "unknown"],
)  # fmt: skip
def test_bad_times(text: str) -> None:
    """Only Slurm's own `%Y-%m-%dT%H:%M:%S`, not everything ISO 8601 allows."""
    with pytest.raises(SlurmTextError, match="bad time"):
        parse_time(text, UTC)


def test_bad_time_message_names_the_forms() -> None:
    with pytest.raises(SlurmTextError) as info:
        parse_time("yesterday", UTC)
    assert str(info.value) == "bad time 'yesterday' (want YYYY-MM-DDTHH:MM:SS, Unknown or None)"


_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9, minutes=-30))])


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9000, 1, 1)), _ZONES)
def test_format_then_parse_is_the_same_instant(moment: datetime, zone: timezone) -> None:
    instant = moment.replace(microsecond=0, tzinfo=UTC)
    assert parse_time(format_time(instant, zone), zone) == instant


def test_format_time_refuses_naive_times() -> None:
    with pytest.raises(ValueError, match="aware"):
        format_time(datetime(2026, 1, 1))


def test_epochs() -> None:
    assert time_from_epoch(1795943659) == datetime(2026, 11, 29, 9, 14, 19, tzinfo=UTC)
    assert [time_from_epoch(v) for v in (0, NO_VAL, INFINITE)] == [None, None, None]
    for bad in (-1, True, "5", 2**62):
        with pytest.raises(SlurmTextError):
            time_from_epoch(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("Partition_Limit", None),
        ("1-02:03:04", 93784),
        ("02:00:00", 7200),
        ("30:00", 1800),
        ("30", 1800),
        ("90", 5400),  # minutes are not range-checked, as in Slurm
        ("2-12", 216000),
        ("2-12:30", 217800),
        ("0-00:00:05", 5),
        ("00:00:06", 6),  # sacct Elapsed / scontrol RunTime
        ("45:10", 2710),
    ],
)
def test_durations(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "1:2:3:4", "a-01:00:00", "1-", "01:xx:00", "-5", "1-2-3", "N/A", "NONE", " 5", "1.5", "unlimited"],
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(SlurmTextError, match="bad duration"):
        parse_duration(text)


@given(
    days=st.integers(0, 400), hours=st.integers(0, 23), minutes=st.integers(0, 59), seconds=st.integers(0, 59)
)
def test_every_duration_form_round_trips(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    forms = [
        f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}",
        f"{days * 24 + hours}:{minutes:02d}:{seconds:02d}",
        f"{(days * 24 + hours) * 60 + minutes}:{seconds:02d}",
    ]
    if seconds == 0:
        forms += [f"{days}-{hours}:{minutes}", f"{(days * 24 + hours) * 60 + minutes}"]
        if minutes == 0:
            forms.append(f"{days}-{hours}")
    for form in forms:
        assert parse_duration(form) == total, form


def test_limits_in_minutes() -> None:
    assert parse_limit_minutes("5") == 300
    assert parse_limit_minutes(5) == 300
    assert parse_limit_minutes(0) == 0
    assert [parse_limit_minutes(v) for v in ("UNLIMITED", "Partition_Limit", NO_VAL, INFINITE)] == [None] * 4
    for bad in ("", "5m", "-1", -1, True, 1.5):
        with pytest.raises(SlurmTextError):
            parse_limit_minutes(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- job specs


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("6", (6, None, None, None)),
        ("6_2", (6, 2, None, None)),
        ("1020_[0-2]", (1020, None, "0-2", None)),
        ("6_[1,3-5%2]", (6, None, "1,3-5%2", None)),
        ("7+1", (7, None, None, 1)),
        ("11+0", (11, None, None, 0)),
    ],
)
def test_job_specs(text: str, fields: tuple[Any, ...]) -> None:
    spec = parse_job_spec(text)
    assert (spec.base_id, spec.array_task_id, spec.array_tasks, spec.het_offset) == fields
    assert str(spec) == text
    assert spec == parse_job_spec(text) and hash(spec) == hash(parse_job_spec(text))
    assert repr(spec) == f"JobSpec({text!r})"


@pytest.mark.parametrize(
    "text",
    ["", "x6", "6_", "6_x", "6+", "6_[]", "6_[3-1]", "6_[0-2", "6.batch", "6_1+2", " 6", "-6", "6_[a]"],
)
def test_bad_job_specs(text: str) -> None:
    with pytest.raises(SlurmTextError):
        parse_job_spec(text)


def test_a_job_spec_is_one_kind() -> None:
    with pytest.raises(ValueError, match="a job, an array task"):
        JobSpec(6, array_task_id=1, het_offset=0)


_SPECS = st.one_of(
    st.builds(JobSpec, st.integers(1, 10**9)),
    st.builds(lambda b, t: JobSpec(b, array_task_id=t), st.integers(1, 10**9), st.integers(0, 4_000_000)),
    st.builds(lambda b, o: JobSpec(b, het_offset=o), st.integers(1, 10**9), st.integers(0, 127)),
    st.builds(
        lambda b, first, span, limit: JobSpec(
            b, array_tasks=f"{first}-{first + span}" + (f"%{limit}" if limit else "")
        ),
        st.integers(1, 10**6), st.integers(0, 1000), st.integers(0, 50), st.integers(0, 9),
    ),
)  # fmt: skip


@given(_SPECS)
def test_job_specs_round_trip(spec: JobSpec) -> None:
    assert parse_job_spec(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "count", "limit"),
    [("0-1", 2, None), ("0-9:2", 5, None), ("1,3,5", 3, None), ("0-15%4", 16, 4), ("1-3,7,10-20:5%2", 7, 2),
     ("0-3,2-5", 6, None), ("7", 1, None)],
)  # fmt: skip
def test_array_indices(text: str, count: int, limit: int | None) -> None:
    assert parse_array_indices(text) == (count, limit)


@pytest.mark.parametrize(
    "text", ["", "a-b", "3-1", "0-9:0", "1,,2", "0-9%", "0-9%x", "%4", "-1", "0-5000000", "1;2"]
)
def test_bad_array_indices(text: str) -> None:
    with pytest.raises(SlurmTextError):
        parse_array_indices(text)


# --------------------------------------------------------------------------- comments


def test_comment_text() -> None:
    assert comment_text("daily cap: spent=30.4 cap=30\n(see portal)") == (
        "gpucredit: daily cap: spent:30.4 cap:30 (see portal)"
    )
    long = comment_text("x" * 500)
    assert len(long) == MAX_COMMENT_CHARS
    assert long == "gpucredit: " + "x" * (MAX_COMMENT_CHARS - len("gpucredit: ") - 3) + "..."
    assert comment_text("x" * (MAX_COMMENT_CHARS - len("gpucredit: "))).endswith("xxx")


@given(st.text())
def test_comment_text_is_one_short_line_without_key_text(message: str) -> None:
    text = comment_text(message)
    assert text.startswith("gpucredit: ")
    assert len(text) <= MAX_COMMENT_CHARS
    assert "=" not in text and not any(c.isspace() and c != " " for c in text)


# --------------------------------------------------------------------------- one strictness


_TEXT_PARSERS = [
    expand_hostlist, parse_index_list, parse_tres, gres_gpus, gres_gpu_indices, parse_sinfo_gpu_types,
    parse_time, parse_duration, parse_limit_minutes, parse_job_spec, parse_array_indices,
    lambda text: gpus_from_tres(parse_tres(text)),
]  # fmt: skip
_SLURMISH = st.text(alphabet="0123456789abgpuNo:=,-_+[]()/%IDX. |TnlU\n", max_size=24)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=24), _SLURMISH))
def test_unknown_text_raises_slurm_text_error_and_nothing_else(text: str) -> None:
    for parse in _TEXT_PARSERS:
        with contextlib.suppress(SlurmTextError):
            parse(text)


def test_module_is_cheap_and_stands_alone() -> None:
    """Hook processes import it: no slow stdlib module, no other gpucredit package."""
    code = (
        "import sys, slurmtext\n"
        "slow = ('dataclasses', 'typing', 'subprocess', 'inspect', '_strptime', 'socket', 'pathlib')\n"
        "ours = ('ledger', 'slurm_hooks', 'accounting_bridge', 'job_submit', 'gpucredit')\n"
        "print(sorted(m for m in sys.modules if m in slow or m.split('.')[0] in ours))\n"
    )
    root = REPO
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "[]", "")


def test_public_surface_is_declared() -> None:
    defined = {
        name
        for name, value in vars(slurmtext).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == "slurmtext"
    }
    assert defined <= set(slurmtext.__all__)
    assert all(hasattr(slurmtext, name) for name in slurmtext.__all__)
    assert issubclass(SlurmTextError, ValueError)
