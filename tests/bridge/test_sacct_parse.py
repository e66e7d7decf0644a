"""sacct/squeue parsers, the Slurm command runner and the job sources.

Fixtures live in tests/fixtures/sacct/ (README.md there says which are recorded
on the Slurm box and which are hand-written, and from what).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting_bridge.slurm import records
from accounting_bridge.slurm.backends import (
    CommandsSource,
    PyslurmSource,
    make_job_source,
    parse_slurm_version,
    select_backend,
)
from accounting_bridge.slurm.records import (
    SACCT_FIELDS,
    ParseError,
    SacctRun,
    parse_json,
    parse_parsable2,
    parse_squeue_json,
    sacct_argv,
    sacct_jobs_argv,
)
from accounting_bridge.slurm.slurmcmd import (
    FakeResponse,
    FakeRunner,
    SlurmCommandError,
    SlurmCommandTimeout,
    SubprocessRunner,
    UnexpectedCommandError,
)
from tests.support.recorded import fixture, utc


def unnamed(runs: Any) -> Any:
    """Runs as the text format reads them: it asks for no name (free text)."""
    if isinstance(runs, dict):
        return {key: replace(run, name="") for key, run in runs.items()}
    return [replace(run, name="") for run in runs]


def recorded_run(**fields: Any) -> SacctRun:
    """A run as recorded on the box on 2026-11-29; fields override the common values."""
    values: dict[str, Any] = {
        "cluster": "lab",
        "run": 0,
        "user": "alice",
        "account": "physics",
        "partition": "onprem",
        "state": "COMPLETED",
        "submit": utc("2026-11-29T09:14:11"),
        "time_limit_seconds": 300,
        "node_count": 1,
    }
    values.update(fields)
    values.setdefault("display_id", str(values["job_id"]))
    values.setdefault("requested_gpus", dict(values["gpus"]))
    return SacctRun(**values)


# Every job record.sh submitted, exactly as the parser must return it.
RECORDED_FINISHED = {
    # typed GPU
    ("lab", 4, 0): recorded_run(
        job_id=4, start=utc("2026-11-29T09:14:11"), end=utc("2026-11-29T09:14:14"),
        elapsed_seconds=3, gpus={"a100": 1}, nodes=("node1",), name="single-a100",
    ),
    # untyped request (--gpus=2): billed per type from AllocTRES
    ("lab", 5, 0): recorded_run(
        job_id=5, start=utc("2026-11-29T09:14:11"), end=utc("2026-11-29T09:14:14"),
        elapsed_seconds=3, gpus={"a100": 1, "h100": 1}, requested_gpus={"gpu": 2},
        nodes=("node1",), name="untyped-gpus2",
    ),
    # two GPU types
    ("lab", 6, 0): recorded_run(
        job_id=6, start=utc("2026-11-29T09:14:11"), end=utc("2026-11-29T09:14:14"),
        elapsed_seconds=3, gpus={"a100": 1, "h100": 1}, nodes=("node2",), name="two-types",
    ),
    # multi-node: one allocation line, GPUs of both nodes
    ("lab", 7, 0): recorded_run(
        job_id=7, start=utc("2026-11-29T09:14:14"), end=utc("2026-11-29T09:14:16"),
        elapsed_seconds=2, gpus={"h100": 2}, nodes=("node1", "node2"), node_count=2,
        name="multi-node",
    ),
    ("lab", 9, 0): recorded_run(
        job_id=9, state="FAILED", start=utc("2026-11-29T09:14:16"),
        end=utc("2026-11-29T09:14:16"), elapsed_seconds=0, gpus={"h100": 1},
        nodes=("node1",), name="fails",
    ),
    # a "|" in the job name
    ("lab", 10, 0): recorded_run(
        job_id=10, start=utc("2026-11-29T09:14:16"), end=utc("2026-11-29T09:14:17"),
        elapsed_seconds=1, gpus={"a100": 1}, nodes=("node1",), name="my|job|name",
    ),
    # heterogeneous job: two components, two raw ids
    ("lab", 11, 0): recorded_run(
        job_id=11, display_id="11+0", het_job_id=11, het_offset=0,
        start=utc("2026-11-29T09:14:18"), end=utc("2026-11-29T09:14:21"), elapsed_seconds=3,
        gpus={"a100": 1}, nodes=("node2",), name="het",
    ),
    ("lab", 12, 0): recorded_run(
        job_id=12, display_id="11+1", het_job_id=11, het_offset=1,
        start=utc("2026-11-29T09:14:18"), end=utc("2026-11-29T09:14:21"), elapsed_seconds=3,
        gpus={"h100": 1}, nodes=("node1",), name="het",
    ),
    # cancelled while pending: never allocated, nothing to charge, finished
    ("lab", 13, 0): recorded_run(
        job_id=13, state="CANCELLED", start=None, end=utc("2026-11-29T09:14:12"),
        elapsed_seconds=0, gpus={}, requested_gpus={"h100": 2}, nodes=(), node_count=0,
        name="pending-cancel",
    ),
    ("lab", 14, 0): recorded_run(
        job_id=14, state="TIMEOUT", start=utc("2026-11-29T09:14:11"),
        end=utc("2026-11-29T09:15:28"), elapsed_seconds=77, time_limit_seconds=60,
        gpus={"a100": 1}, nodes=("node2",), name="times-out",
    ),
    ("lab", 15, 0): recorded_run(
        job_id=15, state="CANCELLED", start=utc("2026-11-29T09:14:19"),
        end=utc("2026-11-29T09:14:27"), elapsed_seconds=8, gpus={"h100": 1},
        nodes=("node1",), name="cancel-me",
    ),
    # requeued: two runs of raw id 16, rows not adjacent in the output
    ("lab", 16, 0): recorded_run(
        job_id=16, state="REQUEUED", start=utc("2026-11-29T09:14:21"),
        end=utc("2026-11-29T09:14:25"), elapsed_seconds=4, gpus={"a100": 1},
        nodes=("node1",), name="requeue-me",
    ),
    ("lab", 16, 1): recorded_run(
        job_id=16, run=1, submit=utc("2026-11-29T09:14:25"), start=utc("2026-11-29T09:14:36"),
        end=utc("2026-11-29T09:14:51"), elapsed_seconds=15, gpus={"a100": 1},
        nodes=("node2",), name="requeue-me",
    ),
    # array 8: raw ids 18, 19, 8 -- the array's own id went to the last task
    ("lab", 18, 0): recorded_run(
        job_id=18, display_id="8_0", array_job_id=8, array_task_id=0,
        start=utc("2026-11-29T09:14:14"), end=utc("2026-11-29T09:14:16"), elapsed_seconds=2,
        gpus={"a100": 1}, nodes=("node1",), name="array3",
    ),
    ("lab", 19, 0): recorded_run(
        job_id=19, display_id="8_1", array_job_id=8, array_task_id=1,
        start=utc("2026-11-29T09:14:16"), end=utc("2026-11-29T09:14:18"), elapsed_seconds=2,
        gpus={"a100": 1}, nodes=("node1",), name="array3",
    ),
    ("lab", 8, 0): recorded_run(
        job_id=8, display_id="8_2", array_job_id=8, array_task_id=2,
        start=utc("2026-11-29T09:14:16"), end=utc("2026-11-29T09:14:18"), elapsed_seconds=2,
        gpus={"a100": 1}, nodes=("node2",), name="array3",
    ),
}  # fmt: skip


# --------------------------------------------------------------------------- argv


def test_fields_cover_what_charging_needs_and_hold_no_free_text() -> None:
    required = {
        "JobID", "JobIDRaw", "Cluster", "User", "Account", "Partition", "State", "Submit",
        "Start", "End", "ElapsedRaw", "TimelimitRaw", "AllocTRES", "ReqTRES", "NodeList",
        "NNodes",
    }  # fmt: skip
    assert required <= set(SACCT_FIELDS)
    # What a user writes can hold a line break, and with it whole forged rows (issue 26).
    free_text = {"JobName", "Comment", "AdminComment", "SystemComment", "WorkDir", "WCKey", "MailUser",
                 "Constraints", "SubmitLine", "Reason", "QOS", "Reservation"}  # fmt: skip
    assert not free_text & set(SACCT_FIELDS)
    assert "Restarts" not in SACCT_FIELDS  # 22.05: "Invalid field requested"
    assert len(set(SACCT_FIELDS)) == len(SACCT_FIELDS)


def test_sacct_argv_is_exact() -> None:
    since, until = utc("2026-11-29T09:00:00"), utc("2026-11-29T10:00:00")
    assert sacct_argv(since, until, cluster="lab", tz=UTC) == [
        "sacct", "--allusers", "--clusters", "lab",
        "--starttime", "2026-11-29T09:00:00", "--endtime", "2026-11-29T10:00:00",
        "--duplicates", "--allocations", "--parsable2", "--noheader",
        "--format", ",".join(SACCT_FIELDS),
    ]  # fmt: skip
    assert sacct_argv(since, until, json_format=True, tz=timezone(timedelta(hours=1))) == [
        "sacct", "--allusers",
        "--starttime", "2026-11-29T10:00:00", "--endtime", "2026-11-29T11:00:00", "--json",
    ]  # fmt: skip
    assert sacct_jobs_argv([16, 4, 16], since, until, tz=UTC)[:4] == [
        "sacct", "--allusers", "--jobs", "4,16",
    ]  # fmt: skip


def test_sacct_argv_refuses_naive_times_reversed_windows_and_no_ids() -> None:
    with pytest.raises(ValueError, match="aware"):
        sacct_argv(datetime(2026, 1, 1), datetime(2026, 1, 2), tz=UTC)
    with pytest.raises(ValueError, match="before"):
        sacct_argv(utc("2026-01-02T00:00:00"), utc("2026-01-01T00:00:00"))
    with pytest.raises(ValueError, match="no job ids"):
        sacct_jobs_argv([], utc("2026-01-01T00:00:00"), utc("2026-01-02T00:00:00"))


# --------------------------------------------------------------------------- recorded text


def test_recorded_finished_text_gives_exact_runs() -> None:
    result = parse_parsable2(fixture("recorded_finished.txt"), tz=UTC)
    assert result.errors == []
    assert result.skipped_step_lines == []
    assert {run.key: run for run in result.runs} == unnamed(RECORDED_FINISHED)
    assert len(result.runs) == len(RECORDED_FINISHED)
    assert all(run.finished for run in result.runs)
    by_key = {run.key: run for run in result.runs}
    assert by_key[("lab", 15, 0)].cancelled_by == "0"  # "CANCELLED by 0"
    assert by_key[("lab", 13, 0)].cancelled_by == "0"
    assert by_key[("lab", 16, 1)].line_no == 16
    assert by_key[("lab", 7, 0)].gpu_seconds == {"h100": 4}
    assert by_key[("lab", 5, 0)].gpu_count == 2


def test_step_lines_are_parsed_and_skipped_not_summed() -> None:
    result = parse_parsable2(fixture("recorded_finished_with_steps.txt"), tz=UTC)
    assert result.errors == []
    assert {run.key: run for run in result.runs} == unnamed(RECORDED_FINISHED)
    assert result.skipped_step_lines == [2, 4, 6, 8, 9, 11, 13, 15, 16, 18, 21, 23, 25, 27, 29, 31, 33]
    # the multi-node job is one run with both nodes' GPUs, not .batch + .0
    multi = [run for run in result.runs if run.job_id == 7]
    assert [(run.gpus, run.nodes) for run in multi] == [({"h100": 2}, ("node1", "node2"))]


def test_running_jobs_have_unknown_end_and_are_not_finished() -> None:
    result = parse_parsable2(fixture("recorded_running.txt"), tz=UTC)
    assert result.errors == []
    assert [(r.key, r.state, r.end, r.finished, r.elapsed_seconds) for r in result.runs] == [
        (("lab", 14, 0), "RUNNING", None, False, 13),
        (("lab", 15, 0), "RUNNING", None, False, 5),
        (("lab", 16, 0), "RUNNING", None, False, 3),
    ]
    assert result.runs[1].start == utc("2026-11-29T09:14:19")


def test_requeued_job_waiting_for_its_next_run() -> None:
    result = parse_parsable2(fixture("recorded_requeue_pending.txt"), tz=UTC)
    assert result.errors == []
    assert result.runs == unnamed(
        [
            RECORDED_FINISHED[("lab", 16, 0)],
            recorded_run(
                job_id=16,
                run=1,
                state="PENDING",
                submit=utc("2026-11-29T09:14:25"),
                start=None,
                end=None,
                elapsed_seconds=0,
                gpus={},
                requested_gpus={"a100": 1},
                nodes=(),
                node_count=0,
                name="requeue-me",
            ),
        ]
    )
    assert [run.finished for run in result.runs] == [True, False]


# --------------------------------------------------------------------------- recorded JSON


@pytest.mark.parametrize("name", ["recorded_finished", "recorded_running", "recorded_requeue_pending"])
def test_json_and_text_of_the_same_jobs_agree(name: str) -> None:
    text = parse_parsable2(fixture(f"{name}.txt"), tz=UTC)
    document = parse_json(fixture(f"{name}.json"))
    assert text.errors == [] and document.errors == []
    assert sorted(unnamed(document.runs), key=lambda r: r.key) == sorted(text.runs, key=lambda r: r.key)


def test_json_finished_runs_are_exact_and_name_who_cancelled() -> None:
    result = parse_json(fixture("recorded_finished.json"))
    assert {run.key: run for run in result.runs} == RECORDED_FINISHED
    by_key = {run.key: run for run in result.runs}
    assert by_key[("lab", 15, 0)].cancelled_by == "root"  # kill_request_user
    assert by_key[("lab", 4, 0)].cancelled_by is None
    # --json lists the earlier attempt first
    assert result.runs[0].key == ("lab", 16, 0)
    assert by_key[("lab", 16, 1)].line_no == 14


# --------------------------------------------------------------------------- hand-written


def hand_run(**fields: Any) -> SacctRun:
    values: dict[str, Any] = {
        "cluster": "lab",
        "run": 0,
        "user": "alice",
        "account": "physics",
        "partition": "onprem",
        "state": "COMPLETED",
        "time_limit_seconds": 3600,
        "gpus": {"a100": 1},
        "node_count": 1,
        "nodes": ("node1",),
    }
    values.update(fields)
    values.setdefault("display_id", str(values["job_id"]))
    values.setdefault("requested_gpus", dict(values["gpus"]))
    return SacctRun(**values)


HANDWRITTEN = [
    hand_run(
        job_id=1001, submit=utc("2026-12-02T09:59:58"), start=utc("2026-12-02T10:00:00"),
        end=utc("2026-12-02T10:30:02"), elapsed_seconds=1802, time_limit_seconds=7200,
        gpus={"h100": 2}, name="worked-example",
    ),
    hand_run(
        job_id=1010, state="NODE_FAIL", submit=utc("2026-12-02T11:00:00"),
        start=utc("2026-12-02T11:00:05"), end=utc("2026-12-02T11:10:31"), elapsed_seconds=626,
        nodes=("node2",), name="node-fail-requeued",
    ),
    hand_run(
        job_id=1011, state="NODE_FAIL", submit=utc("2026-12-02T11:00:00"),
        start=utc("2026-12-02T11:00:06"), end=utc("2026-12-02T11:10:31"), elapsed_seconds=625,
        gpus={"h100": 1}, nodes=("node2",), name="node-fail-no-requeue",
    ),
    # PrologSlurmctld refused: a REQUEUED attempt with Start = End
    hand_run(
        job_id=1012, state="REQUEUED", submit=utc("2026-12-02T11:20:00"),
        start=utc("2026-12-02T11:20:01"), end=utc("2026-12-02T11:20:01"), elapsed_seconds=0,
        name="prolog-refused",
    ),
    hand_run(
        job_id=1013, state="NODE_FAIL", submit=utc("2026-12-02T11:30:00"),
        start=utc("2026-12-02T11:30:02"), end=utc("2026-12-02T11:30:28"), elapsed_seconds=26,
        nodes=("node2",), name="node-fail-waiting",
    ),
    hand_run(
        job_id=1013, run=1, state="PENDING", submit=utc("2026-12-02T11:30:28"), start=None,
        end=None, elapsed_seconds=0, gpus={}, requested_gpus={"a100": 1}, nodes=(),
        node_count=0, name="node-fail-waiting",
    ),
    hand_run(
        job_id=1014, state="OUT_OF_MEMORY", submit=utc("2026-12-02T12:00:00"),
        start=utc("2026-12-02T12:00:01"), end=utc("2026-12-02T12:05:01"), elapsed_seconds=300,
        name="oom",
    ),
    hand_run(
        job_id=1015, state="PREEMPTED", partition="cloud", submit=utc("2026-12-02T12:00:00"),
        start=utc("2026-12-02T12:00:01"), end=utc("2026-12-02T12:20:01"), elapsed_seconds=1200,
        gpus={"h100": 1}, nodes=("node2",), name="preempted",
    ),
    hand_run(
        job_id=1016, state="CANCELLED", submit=utc("2026-12-02T12:00:00"),
        start=utc("2026-12-02T12:00:02"), end=utc("2026-12-02T12:01:02"), elapsed_seconds=60,
        name="cancelled-by-owner",
    ),
    hand_run(
        job_id=1017, submit=utc("2026-12-02T12:00:00"), start=utc("2026-12-02T12:00:02"),
        end=utc("2026-12-02T12:10:02"), elapsed_seconds=600, time_limit_seconds=None,
        name="unlimited",
    ),
    hand_run(
        job_id=1018, submit=utc("2026-12-02T12:00:00"), start=utc("2026-12-02T12:00:02"),
        end=utc("2026-12-02T12:10:02"), elapsed_seconds=600, time_limit_seconds=None,
        name="partition-limit",
    ),
    # typed GPUs sum below gres/gpu (a type not in AccountingStorageTRES): keep the rest
    hand_run(
        job_id=1019, submit=utc("2026-12-02T12:00:00"), start=utc("2026-12-02T12:00:02"),
        end=utc("2026-12-02T12:10:02"), elapsed_seconds=600, gpus={"a100": 1, "gpu": 1},
        requested_gpus={"gpu": 2}, name="type-not-tracked",
    ),
    hand_run(
        job_id=1010, run=1, submit=utc("2026-12-02T11:10:31"), start=utc("2026-12-02T11:10:45"),
        end=utc("2026-12-02T11:40:45"), elapsed_seconds=1800, name="node-fail-requeued",
    ),
    hand_run(
        job_id=1012, run=1, submit=utc("2026-12-02T11:20:12"), start=utc("2026-12-02T11:20:14"),
        end=utc("2026-12-02T11:50:14"), elapsed_seconds=1800, name="prolog-refused",
    ),
    hand_run(
        job_id=1020, display_id="1020_[0-2]", array_job_id=1020, state="PENDING",
        submit=utc("2026-12-02T12:30:00"), start=None, end=None, elapsed_seconds=0, gpus={},
        requested_gpus={"a100": 1}, nodes=(), node_count=0, name="pending-array",
    ),
]  # fmt: skip


def test_handwritten_failure_states_requeues_and_limits() -> None:
    result = parse_parsable2(fixture("handwritten_failures.txt"), tz=UTC)
    assert result.errors == []
    assert result.skipped_step_lines == [3]  # NODE_FAIL's .batch reads CANCELLED
    assert result.runs == unnamed(HANDWRITTEN)
    finished = {run.key: run.finished for run in result.runs}
    assert finished[("lab", 1013, 1)] is False
    assert finished[("lab", 1020, 0)] is False
    assert all(finished[key] for key in finished if key not in {("lab", 1013, 1), ("lab", 1020, 0)})
    assert result.runs[8].cancelled_by == "1001"


def test_handwritten_json_agrees_with_text() -> None:
    text = parse_parsable2(fixture("handwritten_failures.txt"), tz=UTC)
    document = parse_json(fixture("handwritten_failures.json"))
    assert document.errors == []
    expected = sorted((r for r in text.runs if r.job_id != 1020), key=lambda r: r.key)
    assert sorted(unnamed(document.runs), key=lambda r: r.key) == expected
    cancelled = next(run for run in document.runs if run.job_id == 1016)
    assert cancelled.cancelled_by == "alice"


def test_malformed_lines_are_reported_with_line_numbers_never_dropped() -> None:
    result = parse_parsable2(fixture("handwritten_malformed.txt"), tz=UTC)
    assert [run.job_id for run in result.runs] == [2001, 2013]
    assert [(e.line_no, e.job_id) for e in result.errors] == [
        (2, 2002), (4, 2003), (5, None), (6, 2005), (7, 2006), (8, 2007), (9, 2009),
        (10, 2010), (11, 2011), (12, None), (13, None),
    ]  # fmt: skip
    reasons = [error.reason for error in result.errors]
    assert "expected 16 '|'-separated fields" in reasons[0] and reasons[0].endswith("got 8")
    assert reasons[1] == "bad time 'yesterday' (want YYYY-MM-DDTHH:MM:SS, Unknown or None)"
    assert reasons[2] == "bad JobIDRaw 'x2004' (want a non-negative integer)"
    assert reasons[3] == "bad State 'completed'"
    assert reasons[4] == "bad count 'one' for gres/gpu:a100"
    assert reasons[5] == "JobID '2008' and JobIDRaw 2007 disagree"
    assert reasons[6] == "bad ElapsedRaw '-5' (want a non-negative integer)"
    assert reasons[7] == "typed GPU counts {'a100': 3} exceed the gres/gpu total 1"
    assert reasons[8] == "NodeList 'node[1-3]' has 3 nodes, NNodes 2"
    assert result.errors[10].line == "   "
    assert result.suspect_job_ids == {2002, 2003, 2005, 2006, 2007, 2009, 2010, 2011}
    assert not result.ok


# --------------------------------------------------------------------------- time zones


def test_text_times_are_read_in_the_given_zone() -> None:
    plus_one = parse_parsable2(fixture("recorded_finished.txt"), tz=timezone(timedelta(hours=1)))
    first = plus_one.runs[0]
    assert first.start == utc("2026-11-29T08:14:11")
    assert first.start is not None and first.start.tzinfo == UTC


# Times, TRES, hostlists and GRES detail themselves: tests/slurmtext/test_slurmtext.py.


# --------------------------------------------------------------------------- JSON documents


def test_json_document_problems_are_errors_not_exceptions() -> None:
    assert parse_json("").errors[0].reason.startswith("invalid JSON")
    assert parse_json("[1, 2]").errors[0].reason == "not a Slurm JSON document: no 'jobs' list"
    assert parse_json('{"jobs": {}}').errors[0].line_no == 0
    result = parse_json('{"errors": [{"error": "boom"}], "jobs": []}')
    assert result.errors == [ParseError(0, '{"error": "boom"}', "Slurm reported an error")]
    assert parse_json('{"errors": 5, "jobs": []}').errors == [ParseError(0, "5", "Slurm reported an error")]
    assert parse_json('{"errors": null, "jobs": []}').ok


def test_recorded_empty_sacct_json_is_empty_not_an_error() -> None:
    # sacct --json answers an empty window with errors: [{"error_number": 9003, ...}]
    result = parse_json(fixture("recorded_sacct_json_empty.json"))
    assert (result.runs, result.errors) == ([], [])
    document = json.loads(fixture("recorded_sacct_json_empty.json"))
    document["jobs"] = [json.loads(fixture("recorded_finished.json"))["jobs"][1]]
    assert parse_json(json.dumps(document)).errors[0].reason == "Slurm reported an error"


def test_json_bad_entries_are_reported_by_position() -> None:
    document = json.loads(fixture("recorded_finished.json"))
    good = document["jobs"][1]  # job 4
    no_id = dict(good)
    del no_id["job_id"]
    null_gpu = json.loads(json.dumps(good))
    null_gpu["tres"]["allocated"][-1]["count"] = None
    document["jobs"] = [good, "junk", no_id, null_gpu, good]
    result = parse_json(json.dumps(document))
    assert [run.job_id for run in result.runs] == [4, 4]
    assert [run.run for run in result.runs] == [0, 1]
    assert [(e.line_no, e.job_id, e.reason) for e in result.errors] == [
        (2, None, "job entry is not an object"),
        (3, None, "missing 'job_id'"),
        (4, 4, "bad tres.allocated count for gres/gpu:a100 None (want a non-negative integer)"),
    ]


# --------------------------------------------------------------------------- squeue


def test_recorded_squeue_running_jobs() -> None:
    result = parse_squeue_json(fixture("recorded_squeue_running.json"))
    assert result.errors == []
    assert len(result.jobs) == 20  # slurmctld also remembers finished jobs
    allocated = [job for job in result.jobs if job.allocated]
    assert [(j.key, j.state, j.gpus, j.nodes, j.gpu_indices) for j in allocated] == [
        (("lab", 14, 0), "RUNNING", {"a100": 1}, ("node2",), {"node2": {1: "a100"}}),
        (("lab", 15, 0), "RUNNING", {"h100": 1}, ("node1",), {"node1": {3: "h100"}}),
        (("lab", 16, 0), "RUNNING", {"a100": 1}, ("node1",), {"node1": {0: "a100"}}),
    ]
    job = allocated[1]
    assert (job.user, job.account, job.partition, job.name) == ("alice", "physics", "onprem", "cancel-me")
    assert job.start == utc("2026-11-29T09:14:19")
    assert job.end == utc("2026-11-29T09:19:19")  # expected end: start + limit
    assert job.time_limit_seconds == 300
    by_id = {job.job_id: job for job in result.jobs}
    assert (by_id[8].display_id, by_id[18].display_id) == ("8_2", "8_0")
    assert (by_id[12].display_id, by_id[12].het_offset, by_id[4].het_offset) == ("11+1", 1, None)
    assert by_id[13].gpus == {} and by_id[13].requested_gpus == {"h100": 2}


def test_recorded_squeue_load_error_is_an_error_not_an_empty_queue() -> None:
    result = parse_squeue_json(fixture("recorded_squeue_load_error.json"))
    assert result.jobs == []
    assert not result.ok
    assert "slurm_load_jobs" in result.errors[0].line


# --------------------------------------------------------------------------- properties


_FIELD_TEXT = st.text(alphabet="0123456789abcdefXYZ_.-+[]|:=,/ TN", max_size=12)


@st.composite
def sacct_like_lines(draw: st.DrawFn) -> str:
    fields = draw(st.lists(_FIELD_TEXT, min_size=0, max_size=20))
    if draw(st.booleans()):  # often start from a plausible row
        fields = ["42", "42", "lab", "alice", "physics", "onprem", "COMPLETED",
                  "2026-11-29T09:14:11", "2026-11-29T09:14:11", "Unknown", "3", "5", "1",
                  "node1", "cpu=1,gres/gpu:a100=1", "", "name"]  # fmt: skip
        index = draw(st.integers(0, len(fields) - 1))
        fields[index] = draw(_FIELD_TEXT)
    return "|".join(fields)


def _check_line_accounting(text: str) -> None:
    result = parse_parsable2(text, tz=UTC)
    run_lines = [run.line_no for run in result.runs]
    error_lines = [error.line_no for error in result.errors]
    skipped = result.skipped_step_lines
    every = run_lines + error_lines + skipped
    assert len(every) == len(set(every)), "a line was counted twice"
    lines = text.split("\n")
    non_empty = {n for n, line in enumerate(lines, 1) if line.removesuffix("\r") != ""}
    assert set(every) == non_empty, "a non-empty line was dropped or invented"
    for number in skipped:
        assert "." in lines[number - 1].split("|", 1)[0], "only step lines may be skipped"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises_and_every_line_is_accounted_for(text: str) -> None:
    _check_line_accounting(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(sacct_like_lines(), max_size=8))
def test_sacct_like_lines_never_raise_and_every_line_is_accounted_for(lines: list[str]) -> None:
    _check_line_accounting("\n".join(lines))


_JSON_KEYS = st.sampled_from(
    ["jobs", "job_id", "time", "start", "tres", "allocated", "count", "type", "name", "state",
     "current", "cluster", "nodes", "array", "het", "job_offset", "elapsed", "allocation_nodes",
     "errors"]
)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**33) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_JSON_KEYS, children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _JSON.map(json.dumps)))
def test_json_parsers_never_raise(text: str) -> None:
    entries = json.loads(text).get("jobs") if _is_jobs_document(text) else None
    _check_entries(text, entries if isinstance(entries, list) else None)


_RECORDED_JOBS = json.loads(fixture("recorded_finished.json"))["jobs"]
_RECORDED_QUEUE = json.loads(fixture("recorded_squeue_running.json"))["jobs"]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mutated_jobs(draw: st.DrawFn, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    job = json.loads(json.dumps(draw(st.sampled_from(jobs))))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(job)))
        parent = job
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = draw(_JSON)
    return job


@settings(max_examples=300, deadline=None)
@given(
    st.lists(mutated_jobs(_RECORDED_JOBS), max_size=4),
    st.lists(mutated_jobs(_RECORDED_QUEUE), max_size=4),
    _JSON,
)
def test_mutated_recorded_json_never_raises_and_every_entry_is_accounted_for(
    accounting: list[dict[str, Any]], queue: list[dict[str, Any]], errors: Any
) -> None:
    _check_entries(json.dumps({"errors": errors, "jobs": accounting}), accounting, squeue=False)
    _check_entries(json.dumps({"errors": errors, "jobs": queue}), queue, sacct_json=False)


def _check_entries(
    text: str, entries: list[Any] | None, *, sacct_json: bool = True, squeue: bool = True
) -> None:
    """Both JSON parsers never raise; each jobs[] entry becomes a record or an error."""
    results: list[tuple[list[int | None], list[ParseError]]] = []
    if sacct_json:
        accounting = parse_json(text)
        results.append(([run.line_no for run in accounting.runs], accounting.errors))
    if squeue:
        queue = parse_squeue_json(text)
        results.append(([job.line_no for job in queue.jobs], queue.errors))
    for record_positions, errors in results:
        if entries is None:
            continue
        positions = [p or 0 for p in record_positions] + [e.line_no for e in errors if e.line_no]
        assert sorted(positions) == list(range(1, len(entries) + 1))


def _is_jobs_document(text: str) -> bool:
    try:
        document = json.loads(text)
    except ValueError:
        return False
    return isinstance(document, dict)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(fixture("recorded_finished.txt").splitlines()), max_size=10))
def test_run_numbers_are_dense_per_job_whatever_the_row_order(lines: list[str]) -> None:
    result = parse_parsable2("\n".join(lines), tz=UTC)
    numbers: dict[int, list[int]] = {}
    for run in result.runs:
        numbers.setdefault(run.job_id, []).append(run.run)
    for runs in numbers.values():
        assert sorted(runs) == list(range(len(runs)))


# --------------------------------------------------------------------------- slurmcmd


def test_fake_runner_answers_only_exact_argv() -> None:
    runner = FakeRunner({("sinfo", "--version"): "slurm-wlm 22.05.8\n"})
    assert runner(["sinfo", "--version"]) == "slurm-wlm 22.05.8\n"
    with pytest.raises(UnexpectedCommandError, match=r"\['sinfo', '-V'\]"):
        runner(["sinfo", "-V"])
    assert runner.calls == [("sinfo", "--version"), ("sinfo", "-V")]


def test_fake_runner_failures_look_like_real_ones() -> None:
    runner = FakeRunner()
    runner.add(["sacct", "-j", "1"], FakeResponse(returncode=1, stderr="sacct: error: boom\n"))
    runner.add(["squeue", "--json"], FakeResponse(timeout=True))
    with pytest.raises(SlurmCommandError) as failed:
        runner(["sacct", "-j", "1"])
    assert (failed.value.argv, failed.value.returncode) == (("sacct", "-j", "1"), 1)
    assert failed.value.stderr == "sacct: error: boom\n"
    with pytest.raises(SlurmCommandTimeout):
        runner(["squeue", "--json"])


def test_subprocess_runner_runs_from_its_directory_with_captured_output() -> None:
    runner = SubprocessRunner("/bin", timeout_seconds=5)
    assert runner(["echo", "a|b"]) == "a|b\n"
    with pytest.raises(SlurmCommandError) as failed:
        runner(["sh", "-c", "echo out; echo 'sacct: error: no' >&2; exit 3"])
    assert failed.value.argv == ("/bin/sh", "-c", "echo out; echo 'sacct: error: no' >&2; exit 3")
    assert failed.value.returncode == 3
    assert failed.value.stderr == "sacct: error: no\n"
    assert "sacct: error: no" in str(failed.value)


def test_subprocess_runner_timeout_missing_binary_and_bad_argv(tmp_path: Path) -> None:
    runner = SubprocessRunner("/bin", timeout_seconds=5)
    with pytest.raises(SlurmCommandTimeout) as timed_out:
        runner(["sleep", "5"], timeout_seconds=0.2)
    assert timed_out.value.returncode is None
    with pytest.raises(SlurmCommandError, match="could not run"):
        SubprocessRunner(str(tmp_path))(["sacct"])
    with pytest.raises(TypeError):
        runner("sacct -a")
    with pytest.raises(ValueError):
        runner(["/usr/bin/sacct"])
    with pytest.raises(ValueError):
        SubprocessRunner("usr/bin")


def test_subprocess_runner_forces_standard_time_format() -> None:
    runner = SubprocessRunner("/bin", env={"PATH": "/bin", "SLURM_TIME_FORMAT": "relative", "TZ": "UTC"})
    assert runner(["sh", "-c", "echo $SLURM_TIME_FORMAT $TZ"]) == "standard UTC\n"


def test_subprocess_runner_does_not_use_a_shell() -> None:
    assert SubprocessRunner("/bin")(["echo", "$HOME", ";", "false"]) == "$HOME ; false\n"


# --------------------------------------------------------------------------- sources


SINCE, UNTIL = utc("2026-11-29T09:14:20"), utc("2026-11-29T09:20:00")


def _recorded_lines(*job_ids: int) -> str:
    lines = fixture("recorded_finished.txt").splitlines()
    return "".join(line + "\n" for line in lines if int(line.split("|", 1)[0]) in job_ids)


def test_finished_runs_refetches_every_attempt_before_numbering() -> None:
    source = CommandsSource(FakeRunner(), cluster="lab", tz=UTC)
    runner = FakeRunner()
    source.runner = runner
    # The window saw only the second attempt of 16 (the first ended before it) and job 4.
    window_rows = "\n".join(
        line for line in fixture("recorded_finished.txt").splitlines()
        if line.startswith("4|") or (line.startswith("16|") and "|COMPLETED|" in line)
    ) + "\n"  # fmt: skip
    runner.add(source.window_argv(SINCE, UNTIL), window_rows)
    runner.add(
        [
            "sacct", "--allusers", "--jobs", "4,16", "--clusters", "lab",
            "--starttime", "2026-10-30T09:14:20", "--endtime", "2026-11-29T09:20:00",
            "--duplicates", "--allocations", "--parsable2", "--noheader",
            "--format", ",".join(SACCT_FIELDS),
        ],
        _recorded_lines(4, 16),
    )  # fmt: skip
    result = source.finished_runs(SINCE, UNTIL)
    assert result.errors == []
    assert sorted(run.key for run in result.runs) == [("lab", 4, 0), ("lab", 16, 0), ("lab", 16, 1)]
    assert {run.key: run for run in result.runs}[("lab", 16, 1)] == unnamed(RECORDED_FINISHED)[("lab", 16, 1)]
    assert len(runner.calls) == 2


def test_finished_runs_batches_ids_keeps_runs_once_and_drops_unfinished() -> None:
    runner = FakeRunner()
    source = CommandsSource(runner, tz=UTC, sacct_format="json", max_job_ids_per_query=1)
    document = json.loads(fixture("recorded_finished.json"))
    running = json.loads(fixture("recorded_running.json"))

    def only(doc: dict[str, Any], *ids: int) -> str:
        return json.dumps({**doc, "jobs": [j for j in doc["jobs"] if j["job_id"] in ids]})

    runner.add(source.window_argv(SINCE, UNTIL), only(document, 8, 14))
    runner.add(source.jobs_argv([8], SINCE, UNTIL), only(document, 18, 19, 8))  # --jobs 8: the array
    runner.add(source.jobs_argv([14], SINCE, UNTIL), only(running, 14))
    result = source.finished_runs(SINCE, UNTIL)
    assert result.errors == []
    assert [run.key for run in result.runs] == [("lab", 8, 0), ("lab", 18, 0), ("lab", 19, 0)]


def test_finished_runs_reports_window_errors_once() -> None:
    runner = FakeRunner()
    source = CommandsSource(runner, tz=UTC)
    bad = "x|y|broken\n"
    runner.add(source.window_argv(SINCE, UNTIL), bad + _recorded_lines(4))
    runner.add(source.jobs_argv([4], SINCE, UNTIL), _recorded_lines(4))
    result = source.finished_runs(SINCE, UNTIL)
    assert [run.key for run in result.runs] == [("lab", 4, 0)]
    assert [(e.line_no, e.line) for e in result.errors] == [(1, "x|y|broken")]


def test_finished_runs_with_an_empty_window_asks_once() -> None:
    runner = FakeRunner()
    source = CommandsSource(runner, tz=UTC)
    runner.add(source.window_argv(SINCE, UNTIL), "")
    assert source.finished_runs(SINCE, UNTIL).runs == []
    assert len(runner.calls) == 1


def test_running_jobs_from_squeue() -> None:
    runner = FakeRunner({("squeue", "--all", "--json"): fixture("recorded_squeue_running.json")})
    result = CommandsSource(runner).running_jobs()
    assert [job.key for job in result.jobs] == [("lab", 14, 0), ("lab", 15, 0), ("lab", 16, 0)]
    failing = FakeRunner({("squeue", "--all", "--json"): fixture("recorded_squeue_load_error.json")})
    assert not CommandsSource(failing).running_jobs().ok


def test_commands_source_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        CommandsSource(FakeRunner(), sacct_format="yaml")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CommandsSource(FakeRunner(), max_job_ids_per_query=0)


# --------------------------------------------------------------------------- backend selection


def test_parse_slurm_version() -> None:
    assert parse_slurm_version(fixture("recorded_sinfo_version.txt")) == (22, 5)
    assert parse_slurm_version("slurm 22.05.8") == (22, 5)
    assert parse_slurm_version("25.11.0") == (25, 11)
    with pytest.raises(ValueError):
        parse_slurm_version("slurm")


def test_select_backend() -> None:
    recorded = fixture("recorded_sinfo_version.txt")
    assert select_backend(None, recorded).kind == "commands"
    pypi = select_backend(SimpleNamespace(__version__="25.11.0"), recorded)
    assert pypi.kind == "commands"
    assert pypi.reason == "pyslurm 25.11.0 targets Slurm 25.11, running Slurm is 22.05"
    assert select_backend(SimpleNamespace(__version__="22.5.1"), recorded).kind == "pyslurm"
    assert select_backend(SimpleNamespace(version=lambda: "22.5.0"), "slurm 22.05.8").kind == "pyslurm"
    assert select_backend(SimpleNamespace(), recorded).kind == "commands"
    assert select_backend(SimpleNamespace(__version__="dev"), recorded).kind == "commands"
    assert select_backend(SimpleNamespace(__version__="22.5.1"), "garbage").kind == "commands"


def test_make_job_source_without_pyslurm_never_asks_slurm_for_its_version() -> None:
    runner = FakeRunner()
    source, choice = make_job_source(runner, cluster="lab", import_pyslurm=lambda: None)
    assert isinstance(source, CommandsSource)
    assert choice.kind == "commands"
    assert runner.calls == []


def _fake_pyslurm(version: str, jobs: dict[int, dict[str, Any]]) -> Any:
    return SimpleNamespace(__version__=version, job=lambda: SimpleNamespace(get=lambda: jobs))


def test_make_job_source_with_matching_pyslurm() -> None:
    runner = FakeRunner({("sinfo", "--version"): fixture("recorded_sinfo_version.txt")})
    job = {
        "job_id": 15, "job_state": "RUNNING", "restart_cnt": 0, "user_id": os.getuid(),
        "account": "physics", "partition": "onprem", "name": "cancel-me",
        "submit_time": 1795943651, "start_time": 1795943659, "end_time": 1795943959,
        "time_limit": 5, "tres_alloc_str": "cpu=1,node=1,billing=21,gres/gpu=1,gres/gpu:h100=1",
        "tres_req_str": "cpu=1,mem=2000M,node=1,billing=21,gres/gpu=1,gres/gpu:h100=1",
        "nodes": "node1", "num_nodes": 1, "array_job_id": None, "array_task_id": None,
        "het_job_id": None, "het_job_offset": None,
    }  # fmt: skip
    pending = {**job, "job_id": 21, "job_state": "PENDING", "start_time": 0, "tres_alloc_str": ""}
    broken = {"job_id": 22}
    unlimited_task = {**job, "job_id": 23, "time_limit": 0xFFFFFFFF, "array_job_id": 20, "array_task_id": 3}
    module = _fake_pyslurm("22.5.1", {15: job, 21: pending, 22: broken, 23: unlimited_task})
    source, choice = make_job_source(runner, cluster="lab", import_pyslurm=lambda: module)
    assert isinstance(source, PyslurmSource)
    assert choice.kind == "pyslurm"
    result = source.running_jobs()
    assert [(j.key, j.display_id, j.gpus, j.nodes, j.time_limit_seconds) for j in result.jobs] == [
        (("lab", 15, 0), "15", {"h100": 1}, ("node1",), 300),
        (("lab", 23, 0), "20_3", {"h100": 1}, ("node1",), None),  # INFINITE: no limit
    ]
    assert result.jobs[0].start == datetime.fromtimestamp(1795943659, UTC)
    assert [(e.line_no, e.job_id) for e in result.errors] == [(3, 22)]


def test_python_is_new_enough_for_the_parsers() -> None:
    assert sys.version_info >= (3, 11)
    assert records.__all__  # the public surface is declared


def test_a_request_22_05_left_inconsistent_is_read_and_the_run_billed_from_its_allocation() -> None:
    """Recorded on the box (issue 26, S3): a held `gpu:a100:1` job updated with
    `TresPerNode=gres:gpu:h100:1` is given both GPUs; ReqTRES then lists typed counts above
    its total. The row was refused every round and the run charged nothing."""
    row = (
        "3|3|lab|alice|physics|onprem|COMPLETED|2026-12-03T09:21:05|2026-12-03T09:21:05|"
        "2026-12-03T09:21:55|50|5|1|node1|"
        "billing=31,cpu=1,gres/gpu:a100=1,gres/gpu:h100=1,gres/gpu=2,node=1|"
        "billing=31,cpu=1,gres/gpu:a100=1,gres/gpu:h100=1,gres/gpu=1,mem=2000M,node=1\n"
    )
    result = parse_parsable2(row, tz=UTC)
    assert result.errors == []
    [run] = result.runs
    assert run.gpus == {"a100": 1, "h100": 1} and run.gpu_seconds == {"a100": 50, "h100": 50}
    assert run.requested_gpus == {"a100": 1, "h100": 1}


def test_a_row_with_a_field_too_many_is_an_error_not_a_run() -> None:
    """No field may hold a '|' any more: a 17th field (a job name, as rows had) is refused."""
    good = fixture("recorded_finished.txt").split("\n")[0]
    result = parse_parsable2(good + "|x\n", tz=UTC)
    assert result.runs == []
    assert [e.reason for e in result.errors] == [
        "expected 16 '|'-separated fields (" + ",".join(SACCT_FIELDS) + "), got 17"
    ]
