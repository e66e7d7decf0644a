"""The text parser's fast paths read exactly what the plain routines read.

parse_parsable2 reads each distinct value once per call, times from their minute's
UTC time plus the seconds, and builds records without the dataclass __init__; the
cyclic collector is paused while it runs. These tests hold each shortcut to the
routine it replaces (slurmtext.parse_time, SacctRun(...), the attempt order).
"""

from __future__ import annotations

import gc
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from accounting_bridge.slurm.gc_pause import cycle_collection_paused
from accounting_bridge.slurm.records import SacctRun, parse_parsable2
from slurmtext import SlurmTextError, parse_time

BERLIN = ZoneInfo("Europe/Berlin")
ALLOC = "billing=10,cpu=8,gres/gpu:a100=1,gres/gpu=1,node=1"


def line(
    job_id: int = 42,
    *,
    display: str | None = None,
    state: str = "COMPLETED",
    submit: str = "2026-12-01T10:00:00",
    start: str = "2026-12-01T10:00:05",
    end: str = "2026-12-01T11:00:05",
    elapsed: int = 3600,
    alloc: str = ALLOC,
    nodes: str = "gpu01",
) -> str:
    fields_ = [
        str(job_id), display or str(job_id), "lab", "alice", "physics", "gpu", state,
        submit, start, end, str(elapsed), "120", "1", nodes, alloc, alloc,
    ]  # fmt: skip
    return "|".join(fields_)


def test_a_parsed_run_is_the_record_its_constructor_builds() -> None:
    run = parse_parsable2(line() + "\n", tz=UTC).runs[0]
    assert set(vars(run)) == {f.name for f in fields(SacctRun)}
    rebuilt = SacctRun(**{f.name: getattr(run, f.name) for f in fields(SacctRun)})
    assert run == rebuilt and hash(run) == hash(rebuilt)
    assert run.name == "" and run.gpus == {"a100": 1} and run.run == 0
    assert run.start == datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC)


def test_runs_sharing_a_tres_text_do_not_share_their_gpu_dicts() -> None:
    first, second = parse_parsable2(line(1) + "\n" + line(2) + "\n", tz=UTC).runs
    first.gpus["h100"] = 1
    assert second.gpus == {"a100": 1} and second.requested_gpus == {"a100": 1}


@pytest.mark.parametrize(
    "local",
    [
        "2026-10-25T02:30:15",  # Berlin's DST fold: read as the first occurrence (CEST)
        "2026-10-25T02:59:59",
        "2026-10-25T03:00:01",
        "2026-03-29T01:59:59",  # the last second before the spring gap
        "2026-03-29T02:30:07",  # inside the gap
        "2026-03-29T03:00:00",
        "2026-12-31T23:59:59",
    ],
)
def test_times_read_through_their_minute_equal_parse_time(local: str) -> None:
    run = parse_parsable2(line(start="2026-01-01T00:00:00", end=local) + "\n", tz=BERLIN).runs[0]
    assert run.end == parse_time(local, BERLIN)


def test_every_second_of_a_minute_matches_parse_time_in_one_parse() -> None:
    ends = [f"2026-10-25T02:17:{second:02d}" for second in range(60)]
    text = "".join(line(100 + i, end=end) + "\n" for i, end in enumerate(ends))
    runs = parse_parsable2(text, tz=BERLIN).runs
    assert [run.end for run in runs] == [parse_time(end, BERLIN) for end in ends]


@pytest.mark.parametrize("bad", ["2026-12-01T10:00:60", "2026-12-01T10:00:6x", "2026-13-01T10:00:00"])
def test_a_bad_time_is_the_error_parse_time_gives(bad: str) -> None:
    result = parse_parsable2(line(end="2026-12-01T10:00:01") + "\n" + line(43, end=bad) + "\n", tz=UTC)
    assert [run.job_id for run in result.runs] == [42]
    with pytest.raises(SlurmTextError) as expected:
        parse_time(bad, UTC)
    assert [(e.line_no, e.reason, e.job_id) for e in result.errors] == [(2, str(expected.value), 43)]


def test_attempts_are_numbered_by_start_whatever_the_row_order() -> None:
    text = "".join(
        line(7, state=state, submit=submit, start=start, end=end) + "\n"
        for state, submit, start, end in [
            ("COMPLETED", "2026-12-01T12:00:00", "2026-12-01T12:00:05", "2026-12-01T13:00:00"),
            ("REQUEUED", "2026-12-01T10:00:00", "2026-12-01T10:00:05", "2026-12-01T11:00:00"),
            ("CANCELLED by 0", "2026-12-01T14:00:00", "Unknown", "2026-12-01T14:05:00"),
        ]
    )
    runs = parse_parsable2(text, tz=UTC).runs
    assert [(run.state, run.run) for run in runs] == [("COMPLETED", 1), ("REQUEUED", 0), ("CANCELLED", 2)]
    assert runs[2].cancelled_by == "0" and runs[2].start is None


def test_a_second_bad_field_does_not_hide_the_first() -> None:
    # A bad State comes before a bad time in the field order, as it always did.
    result = parse_parsable2(line(state="done", end="yesterday") + "\n", tz=UTC)
    assert result.errors[0].reason == "bad State 'done'"


def test_the_collector_is_resumed_after_a_parse_and_left_off_if_it_was_off() -> None:
    assert gc.isenabled()
    parse_parsable2(line() + "\n", tz=UTC)
    assert gc.isenabled()
    gc.disable()
    try:
        with cycle_collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), cycle_collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_plain_window_parses_linearly_and_completely() -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    times = [(start + timedelta(seconds=37 * i)).strftime("%Y-%m-%dT%H:%M:%S") for i in range(3000)]
    text = "".join(line(1000 + i, start=t, end=t) + "\n" for i, t in enumerate(times))
    runs = parse_parsable2(text, tz=UTC).runs
    assert [run.start for run in runs] == [start + timedelta(seconds=37 * i) for i in range(3000)]
