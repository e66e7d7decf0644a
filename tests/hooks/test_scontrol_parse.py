"""slurm_hooks/scontrol.py on `scontrol show job -d -o` lines in Slurm 22.05.8's format.

SINGLE is the docs/slurm-facts.md §5 job (--gres=gpu:a100:1,gpu:h100:1, CONFIGURING inside
PrologSlurmctld); the others are written in the same format: a two-node job
with both types, untyped requests, an array task, a COMPLETING job as
EpilogSlurmctld sees it, and free text with spaces and `=`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from slurm_hooks.scontrol import JobInfo, ScontrolParseError, parse_job, parse_line
from tests.support import FIXTURES
from tests.support.recorded import fixture


def line(*parts: str) -> str:
    return " ".join(parts) + "\n"


SINGLE = line(
    "JobId=5 JobName=wrap UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A",
    "Priority=4294901756 Nice=0 Account=physics QOS=normal JobState=CONFIGURING Reason=None",
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=00:15:00 TimeMin=N/A",
    "SubmitTime=2026-12-02T10:00:00 EligibleTime=2026-12-02T10:00:00",
    "AccrueTime=2026-12-02T10:00:00 StartTime=2026-12-02T10:00:01 EndTime=2026-12-02T10:15:01",
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T10:00:01",
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null)",
    "ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1",
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
    "TRES=cpu=1,node=1,billing=31,gres/gpu=2,gres/gpu:a100=1,gres/gpu:h100=1",
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:a100:1,gpu:h100:1",
    "Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0),gpu:h100:1(IDX:2)",
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00",
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/root",
    "StdErr=/root/slurm-5.out StdIn=/dev/null StdOut=/root/slurm-5.out Power=",
    "TresPerNode=gres:gpu:a100:1,gres:gpu:h100:1",
)

# sbatch -N 2 --gres=gpu:a100:1,gpu:h100:2 -t 1-02:03:04 -J "train big model" --comment "run 7"
TWO_NODES = line(
    "JobId=12 JobName=train big model UserId=bob(1002) GroupId=bob(1002) MCS_label=N/A",
    "Priority=4294901750 Nice=0 Account=research QOS=normal JobState=RUNNING Reason=None",
    "Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0",
    "DerivedExitCode=0:0 RunTime=00:01:10 TimeLimit=1-02:03:04 TimeMin=N/A",
    "SubmitTime=2026-12-02T09:00:00 EligibleTime=2026-12-02T09:00:00",
    "AccrueTime=2026-12-02T09:00:00 StartTime=2026-12-02T09:30:00 EndTime=2026-12-03T11:33:04",
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T09:30:00",
    "Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null)",
    "ExcNodeList=(null) NodeList=node[1-2] BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2",
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
    "TRES=cpu=2,node=2,billing=102,gres/gpu=6,gres/gpu:a100=2,gres/gpu:h100=4",
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
    "JOB_GRES=gpu:a100:2,gpu:h100:4",
    "Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0),gpu:h100:2(IDX:2-3)",
    "Nodes=node2 CPU_IDs=1 Mem=0 GRES=gpu:a100:1(IDX:1),gpu:h100:2(IDX:2-3)",
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00",
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
    "Command=/home/bob/train.sh --lr=0.1 --name x WorkDir=/home/bob/my runs",
    "Comment=run 7 StdErr=/home/bob/slurm-12.out StdIn=/dev/null",
    "StdOut=/home/bob/slurm-12.out Power= TresPerNode=gres:gpu:a100:1,gres:gpu:h100:2",
)

# Two nodes with identical allocations are printed as one hostlist group.
GROUPED = line(
    "JobId=13 JobName=wrap UserId=bob(1002) GroupId=bob(1002) MCS_label=N/A",
    "Priority=1 Nice=0 Account=research QOS=normal JobState=RUNNING Reason=None",
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
    "DerivedExitCode=0:0 RunTime=00:00:05 TimeLimit=02:00:00 TimeMin=N/A",
    "SubmitTime=2026-12-02T09:00:00 EligibleTime=2026-12-02T09:00:00",
    "AccrueTime=2026-12-02T09:00:00 StartTime=2026-12-02T09:00:01 EndTime=2026-12-02T11:00:01",
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T09:00:01",
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null)",
    "ExcNodeList=(null) NodeList=node[1-2] BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2",
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=82,gres/gpu=4,gres/gpu:h100=4",
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:h100:4",
    "Nodes=node[1-2] CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:2-3)",
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00",
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null)",
    "WorkDir=/home/bob StdErr=/home/bob/slurm-13.out StdIn=/dev/null",
    "StdOut=/home/bob/slurm-13.out Power= TresPerNode=gres:gpu:h100:2",
)

# sbatch --gpus=2 -t 30 on a node with typed GPUs: Slurm picks the types.
UNTYPED_REQUEST = line(
    "JobId=20 JobName=wrap UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A",
    "Priority=1 Nice=0 Account=physics QOS=normal JobState=CONFIGURING Reason=None",
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=00:30:00 TimeMin=N/A",
    "SubmitTime=2026-12-02T10:00:00 EligibleTime=2026-12-02T10:00:00",
    "AccrueTime=2026-12-02T10:00:00 StartTime=2026-12-02T10:00:00 EndTime=2026-12-02T10:30:00",
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T10:00:00",
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null)",
    "ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1",
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
    "TRES=cpu=1,node=1,billing=21,gres/gpu=2,gres/gpu:a100=2",
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:a100:2",
    "Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1)",
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00",
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null)",
    "WorkDir=/root StdErr=/root/slurm-20.out StdIn=/dev/null StdOut=/root/slurm-20.out",
    "Power= TresPerJob=gres:gpu:2",
)

# EpilogSlurmctld: COMPLETING, real EndTime, array task, node without GPU types.
COMPLETING_ARRAY = line(
    "JobId=8 ArrayJobId=6 ArrayTaskId=1 JobName=sweep UserId=alice(1001)",
    "GroupId=alice(1001) MCS_label=N/A Priority=1 Nice=0 Account=physics QOS=normal",
    "JobState=COMPLETING Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=1",
    "BatchFlag=1 Reboot=0 ExitCode=3:0 DerivedExitCode=0:0 RunTime=00:00:42",
    "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-02T10:00:00",
    "EligibleTime=2026-12-02T10:00:00 AccrueTime=2026-12-02T10:00:00",
    "StartTime=2026-12-02T10:05:00 EndTime=2026-12-02T10:05:42 Deadline=N/A",
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T10:05:00 Scheduler=Main",
    "Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null) ExcNodeList=(null)",
    "NodeList=gpu07 BatchHost=gpu07 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1",
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1,gres/gpu=1 Socks/Node=*",
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:1 Nodes=gpu07 CPU_IDs=0 Mem=0",
    "GRES=gpu:1(IDX:3) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null)",
    "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
    "Command=(null) WorkDir=/home/alice StdErr=/home/alice/slurm-6_1.out StdIn=/dev/null",
    "StdOut=/home/alice/slurm-6_1.out Power= TresPerNode=gres:gpu:1",
)

NO_GPUS = line(
    "JobId=30 JobName=cpu only UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A",
    "Priority=1 Nice=0 Account=physics QOS=normal JobState=CONFIGURING Reason=None",
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=00:10:00 TimeMin=N/A",
    "SubmitTime=2026-12-02T10:00:00 EligibleTime=2026-12-02T10:00:00",
    "AccrueTime=Unknown StartTime=2026-12-02T10:00:00 EndTime=Unknown",
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T10:00:00",
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:4242 ReqNodeList=(null)",
    "ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1",
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1",
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* Nodes=node1 CPU_IDs=0 Mem=0 GRES=",
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00",
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null)",
    "WorkDir=/root StdErr=/root/slurm-30.out StdIn=/dev/null StdOut=/root/slurm-30.out Power=",
)


def test_slurm_facts_example_single_node_two_types() -> None:
    job = parse_job(SINGLE, job_id=5, tz=UTC)
    assert isinstance(job, JobInfo)
    assert job.job_id == 5
    assert (job.user, job.uid) == ("alice", 1001)
    assert job.account == "physics"
    assert job.partition == "debug"
    assert job.state == "CONFIGURING"
    assert job.restarts == 0
    assert job.num_nodes == 1
    assert job.node_list == "node1"
    assert job.time_limit_seconds == 900
    assert job.start_time == datetime(2026, 12, 2, 10, 0, 1, tzinfo=UTC)
    assert job.end_time == datetime(2026, 12, 2, 10, 15, 1, tzinfo=UTC)
    assert job.gpus == {"a100": 1, "h100": 1}
    assert job.node_gpus == {"node1": {0: "a100", 2: "h100"}}
    assert job.fields["Power"] == ""
    assert job.fields["AllocNode:Sid"] == "localhost:4242"
    assert job.fields["TresPerNode"] == "gres:gpu:a100:1,gres:gpu:h100:1"


def test_two_nodes_two_types() -> None:
    job = parse_job(TWO_NODES, tz=UTC)
    assert job.gpus == {"a100": 2, "h100": 4}
    assert job.node_gpus == {
        "node1": {0: "a100", 2: "h100", 3: "h100"},
        "node2": {1: "a100", 2: "h100", 3: "h100"},
    }
    assert job.num_nodes == 2
    assert job.restarts == 2
    assert job.time_limit_seconds == ((1 * 24 + 2) * 60 + 3) * 60 + 4
    assert job.state == "RUNNING"


def test_free_text_values_keep_spaces_and_equals() -> None:
    job = parse_job(TWO_NODES, tz=UTC)
    assert job.fields["JobName"] == "train big model"
    assert job.fields["Command"] == "/home/bob/train.sh --lr=0.1 --name x"
    assert job.fields["WorkDir"] == "/home/bob/my runs"
    assert job.fields["Comment"] == "run 7"
    assert job.fields["StdErr"] == "/home/bob/slurm-12.out"


def test_grouped_nodes_share_one_gres_group() -> None:
    job = parse_job(GROUPED, tz=UTC)
    assert job.node_gpus == {"node1": {2: "h100", 3: "h100"}, "node2": {2: "h100", 3: "h100"}}
    assert job.gpus == {"h100": 4}
    assert job.time_limit_seconds == 7200


def test_untyped_request_gets_the_allocated_types() -> None:
    job = parse_job(UNTYPED_REQUEST, tz=UTC)
    assert job.gpus == {"a100": 2}
    assert job.node_gpus == {"node1": {0: "a100", 1: "a100"}}


def test_completing_array_task_untyped_gpu_unlimited() -> None:
    job = parse_job(COMPLETING_ARRAY, tz=UTC)
    assert job.job_id == 8
    assert job.fields["ArrayJobId"] == "6"
    assert job.state == "COMPLETING"
    assert job.restarts == 1
    assert job.time_limit_seconds is None
    assert job.gpus == {"gpu": 1}
    assert job.node_gpus == {"gpu07": {3: "gpu"}}
    assert job.end_time - job.start_time == timedelta(seconds=42)  # type: ignore[operator]


def test_job_without_gpus() -> None:
    job = parse_job(NO_GPUS, tz=UTC)
    assert job.gpus == {}
    assert job.node_gpus == {}
    assert job.end_time is None
    assert job.fields["JobName"] == "cpu only"


def test_job_gres_is_the_fallback_when_tres_has_no_gpus() -> None:
    text = SINGLE.replace(
        "TRES=cpu=1,node=1,billing=31,gres/gpu=2,gres/gpu:a100=1,gres/gpu:h100=1",
        "TRES=cpu=1,node=1,billing=31",
    )
    assert parse_job(text, tz=UTC).gpus == {"a100": 1, "h100": 1}


def test_local_times_are_converted_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    job = parse_job(SINGLE, tz=plus_two)
    assert job.start_time == datetime(2026, 12, 2, 8, 0, 1, tzinfo=UTC)


# --- injection: a user-controlled name or comment must not change what we read -------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("JobName=wrap", "JobName=x TimeLimit=00:00:01"),
        ("JobName=wrap", "JobName=x TRES=cpu=1,gres/gpu:a100=1"),
        ("JobName=wrap", "JobName=x UserId=root(0) Account=rich"),
        ("Command=(null)", "Command=/bin/run StartTime=2026-12-02T10:14:00"),
        ("Command=(null)", "Command=(null) Comment=hi Restarts=9"),
    ],
)
def test_injected_unique_keys_make_the_line_ambiguous(old: str, new: str) -> None:
    text = SINGLE.replace(old, new)
    assert text != SINGLE
    with pytest.raises(ScontrolParseError, match="ambiguous"):
        parse_job(text, tz=UTC)


def test_injected_admin_comment_makes_the_line_ambiguous() -> None:
    """The daemon releases jobs whose AdminComment marks them held for credit."""
    text = SINGLE.replace("JobName=wrap", "JobName=x AdminComment=gpucredit-hold").replace(
        "Command=(null)", "Command=(null) AdminComment=site"
    )
    with pytest.raises(ScontrolParseError, match=r"ambiguous.*AdminComment"):
        parse_job(text, tz=UTC)


def test_job_gres_fallback_counts_untyped_gpus_as_gpu() -> None:
    text = COMPLETING_ARRAY.replace("TRES=cpu=1,node=1,billing=1,gres/gpu=1", "TRES=cpu=1,node=1")
    assert parse_job(text, tz=UTC).gpus == {"gpu": 1}


def test_recorded_scontrol_line() -> None:
    text = fixture("recorded_scontrol_show_job_d_running.txt")
    job = parse_job(text, job_id=15, tz=UTC)
    assert (job.user, job.uid, job.account, job.partition, job.state) == (
        "alice",
        1001,
        "physics",
        "onprem",
        "RUNNING",
    )
    assert job.gpus == {"h100": 1}
    assert job.node_gpus == {"node1": {3: "h100"}}
    assert job.time_limit_seconds == 300
    assert job.submit_time == datetime(2026, 11, 29, 9, 14, 11, tzinfo=UTC)
    assert job.start_time == datetime(2026, 11, 29, 9, 14, 19, tzinfo=UTC)
    assert job.end_time == datetime(2026, 11, 29, 9, 19, 19, tzinfo=UTC)


def test_injected_node_groups_are_ignored() -> None:
    text = SINGLE.replace("JobName=wrap", "JobName=x Nodes=node1 GRES=gpu:h100:8(IDX:0-7)").replace(
        "Command=(null)", "Command=x Nodes=node9 GRES=gpu:h100:8(IDX:0-7)"
    )
    job = parse_job(text, tz=UTC)
    assert job.node_gpus == {"node1": {0: "a100", 2: "h100"}}


def test_unknown_keys_inside_free_text_do_not_split() -> None:
    text = SINGLE.replace("JobName=wrap", "JobName=a b=c d")
    job = parse_job(text, tz=UTC)
    assert job.fields["JobName"] == "a b=c d"
    assert job.gpus == {"a100": 1, "h100": 1}


# --- picking the right line, and garbage -------------------------------------------------


def test_picks_the_requested_job_among_several_lines() -> None:
    text = TWO_NODES + SINGLE
    assert parse_job(text, job_id=5, tz=UTC).job_id == 5
    assert parse_job(text, job_id=12, tz=UTC).job_id == 12
    with pytest.raises(ScontrolParseError):
        parse_job(text, job_id=99, tz=UTC)


@pytest.mark.parametrize("separator", ["\n", "\r", "\v", "\f", "\x1c", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_line_break_in_the_job_name_stays_in_the_name(separator: str) -> None:
    """`sbatch -J $'y\\nz'`: `-o` prints the job over two lines. Python's splitlines would
    cut the record at the name, and the node hooks then saw a job with no GPUs (issue 26)."""
    text = SINGLE.replace("JobName=wrap", f"JobName=y{separator}z")
    job = parse_job(text, job_id=5, tz=UTC)
    assert job.fields["JobName"] == f"y{separator}z"
    assert job.gpus == {"a100": 1, "h100": 1}
    assert job.node_gpus == {"node1": {0: "a100", 2: "h100"}}


def test_a_name_that_forges_a_record_of_the_same_job_is_ambiguous() -> None:
    forged = "JobId=5 JobName=x TRES=cpu=1,node=1 NodeList=node1"
    text = SINGLE.replace("JobName=wrap", f"JobName=a\n{forged}")
    with pytest.raises(ScontrolParseError, match="2 records start JobId=5"):
        parse_job(text, job_id=5, tz=UTC)


def test_wrong_job_is_refused() -> None:
    with pytest.raises(ScontrolParseError):
        parse_job(SINGLE, job_id=6, tz=UTC)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "slurm_load_jobs error: Invalid job id specified",
        "JobName=x UserId=a(1)",  # no JobId
        SINGLE.replace("TimeLimit=00:15:00", "TimeLimit=soon"),
        SINGLE.replace("StartTime=2026-12-02T10:00:01", "StartTime=yesterday"),
        SINGLE.replace("gres/gpu:a100=1", "gres/gpu:a100=one"),
        SINGLE.replace("(IDX:0)", "(IDX:x)"),
        SINGLE.replace("Nodes=node1", "Nodes=node[1-"),
        SINGLE.replace("GRES=gpu:a100:1(IDX:0)", "GRES=gpu:a100:1"),  # no indices to map
        SINGLE.replace("gres/gpu=2,", "gres/gpu=1,"),  # typed GPUs above the total
        SINGLE.replace("TimeLimit=00:15:00", "TimeLimit=N/A"),
    ],
)
def test_garbage_raises(text: str) -> None:
    with pytest.raises(ScontrolParseError):
        parse_job(text, tz=UTC)


# --- pieces (the values themselves are tested in test_slurmtext.py) ------------------------


def test_parse_line_keeps_repeats_in_order() -> None:
    pairs = parse_line(TWO_NODES)
    nodes = [value for key, value in pairs if key == "Nodes"]
    assert nodes == ["node1", "node2"]
    assert pairs[0] == ("JobId", "12")
    assert pairs[-1] == ("TresPerNode", "gres:gpu:a100:1,gres:gpu:h100:2")


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_recorded_jobs_of_every_version_give_their_gpus_and_indices(version: str) -> None:
    """tests/fixtures/slurm-VERSION/scontrol_show_job_d_o: 24.11 and 26.05 print AllocTRES=
    where 22.05 prints TRES=, and the node hooks found no GPU indices there."""
    path = FIXTURES / f"slurm-{version}" / "scontrol_show_job_d_o"
    two_types = parse_job((path / "gres_a100_1_h100_1.txt").read_text(), tz=UTC)
    assert two_types.gpus == {"a100": 1, "h100": 1}
    assert two_types.node_gpus == {"node1": {0: "a100", 2: "h100"}}
    # A name `cheap TRES=cpu=1,gres/gpu:a100=1` on a 2×h100 job: never billed as its name says.
    cheap = (path / "evil_name_one_line.txt").read_text()
    try:
        job = parse_job(cheap, tz=UTC)
    except ScontrolParseError:
        return  # 22.05 and 26.05: ambiguous, refused
    assert job.gpus == {"h100": 2}
