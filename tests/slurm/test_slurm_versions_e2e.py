"""What differs between Slurm versions, end to end in each newer version's box.

The parsers read every version's recordings alike (tests/slurmtext/test_recorded_versions.py);
here the whole path runs in the chroot box of each version named in
GPUCREDIT_BOX_VERSIONS (`make test-slurm-versions` sets it to the box it runs), every command through
the box's own runner (its clients, its gpucredit, its ledger):

* a job whose name and comment hold a forged accounting row, separators and `TRES=`
  text charges nobody else, and a GPU job so named keeps its hold and is settled exact;
* `--gpus-per-task` with two tasks, and jobs over two nodes, are held and billed for
  every GPU, to the micro-credit, and `bridge sacct` (this version's sacct) agrees;
* `fairshare sync` is what `sshare` then shows, and `limits sync` is the GrpTRES
  `sacctmgr show assoc` then shows.

One box start per version (the module's fixture); the ledger outlives the box and job ids
repeat across its lives, so each run makes accounts of its own and finds its jobs by them.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from accounting_bridge.sync.fairshare_sync import SSHARE_ARGV, read_sshare
from ledger.money import charge_for, format_credits
from slurmbox.chroot import ChrootBox
from tests.support.version_box import WANTED, running_box

pytestmark = pytest.mark.slurm

HOOK_LOG = "/var/log/gpucredit/hooks.log"
PRICE_PER_HOUR = {"a100": 2_000_000, "h100": 3_600_000}  # the box's demo prices, micro-credits


class Site:
    """One version's box, and this run's accounts in it."""

    def __init__(self, box: ChrootBox) -> None:
        self.box = box
        self.tag = f"x{time.time_ns() % 10**8}"  # the ledger outlives the box: fresh accounts
        self.since = datetime.now(UTC) - timedelta(seconds=5)

    def ok(self, *argv: str, user: str | None = None) -> str:
        proc = self.box.run(list(argv), user=user, timeout=120)
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        return proc.stdout

    def account(self, suffix: str, credit: str | None, parent: str | None = None) -> str:
        name = f"{self.tag}{suffix}"
        parentage = [f"parent={parent}"] if parent else []
        self.ok("sacctmgr", "-i", "add", "account", name, "cluster=lab", *parentage)
        self.ok("sacctmgr", "-i", "add", "user", "alice", f"account={name}")
        self.ok("gpucredit", "account", "import-slurm")
        if credit is not None:
            self.ok("gpucredit", "topup", name, credit)
        return name

    def submit(self, account: str, *options: str) -> tuple[int, str]:
        """sbatch as alice: (job id, what sbatch said on stderr)."""
        proc = self.box.run(
            ["sbatch", "--parsable", "-A", account, "-o", "/dev/null", *options], user="alice", timeout=60
        )
        assert proc.returncode == 0, (options, proc.stderr)
        return int(proc.stdout.strip().split(";")[0]), proc.stderr

    def holds(self, account: str) -> dict[int, dict[str, str]]:
        """This account's holds by job id (one run each here)."""
        text = self.ok("gpucredit", "hold", "list", "--account", account, "--format", "csv")
        return {int(row["job_id"]): row for row in csv.DictReader(io.StringIO(text))}

    def settled(self, account: str, job_ids: Iterable[int]) -> dict[int, dict[str, str]]:
        """The account's holds once every one of `job_ids` has a settled one, else {}."""
        holds = self.holds(account)
        return holds if all(holds.get(j, {}).get("state") == "settled" for j in job_ids) else {}

    def elapsed(self, job_id: int) -> int:
        """sacct's ElapsedRaw of the job's allocation (the box's own accounting)."""
        out = self.ok("sacct", "-X", "-n", "-P", "-j", str(job_id), "--format", "JobIDRaw,ElapsedRaw,State")
        # A het job's part id lists every part: the line of this raw id.
        (row,) = [line.split("|") for line in out.splitlines() if line.split("|")[0] == str(job_id)]
        assert row[2] == "COMPLETED", out
        return int(row[1])

    def done(self, *job_ids: int) -> bool:
        """Every job ended (squeue keeps a finished job a while, MinJobAge)."""
        out = self.ok("squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)), "-o", "%T")
        return all(state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for state in out.split())

    def hook_log(self, since: int = 0) -> str:
        """The hooks' log in the box from byte `since` (it outlives the box, like the ledger)."""
        path = self.box.inside(HOOK_LOG)
        return path.read_bytes()[since:].decode(errors="replace") if path.exists() else ""

    def bridge(self) -> dict[str, Any]:
        out = self.ok("gpucredit", "bridge", "sacct", "--since", self.since.isoformat(), "--format", "json")
        report: dict[str, Any] = json.loads(out)
        return report


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module", params=WANTED or ["24.11"])
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    with running_box(request.param) as box:
        yield Site(box)


def _charge(gpus: dict[str, int], seconds: int) -> str:
    rate = sum(PRICE_PER_HOUR[gpu_type] * count for gpu_type, count in gpus.items())
    return format_credits(charge_for(rate, seconds))


# --------------------------------------------------------------------------- forged text


def test_a_forged_row_in_a_name_or_comment_charges_nobody_and_a_gpu_job_keeps_its_hold(site: Site) -> None:
    attacker = site.account("a", "10")
    victim = site.account("v", "100")
    row = "|".join(
        [
            "999999", "999999", "lab", "alice", victim, "onprem", "COMPLETED", "2026-12-03T00:00:00",
            "2026-12-03T00:00:00", "2026-12-03T01:00:00", "3600", "60", "1", "node1",
            "billing=41,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1",
            "billing=41,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1",
        ]
    )  # fmt: skip
    log_from = len(site.hook_log())
    forged = ["-J", f"x\n{row}", "--comment", f"c\n{row}"]
    cpu_job, _ = site.submit(attacker, *forged, "-t", "1", "--wrap", "true")
    gpu_job, said = site.submit(
        attacker,
        "-J",
        "evil\nname TRES=cpu=99,gres/gpu:h100=8 AdminComment=gpucredit-hold",
        "--comment",
        "c|d\x1e\u2028JobId=1 TRES=cpu=1,gres/gpu=0 Account=root TimeLimit=00:00:01",
        "--gres=gpu:a100:1",
        "-t",
        "1",
        "--wrap",
        "sleep 2",
    )
    assert f"gpucredit: ~{_charge({'a100': 1}, 60)} credits (1×a100 × 1 min)" in said
    wait_for("both jobs to end", lambda: site.done(cpu_job, gpu_job))
    hold = wait_for("the GPU job's settlement", lambda: site.settled(attacker, [gpu_job]))[gpu_job]
    assert (hold["gpus"], hold["amount"]) == ("a100:1", "0.033333")
    assert hold["charged"] == _charge({"a100": 1}, site.elapsed(gpu_job))
    assert cpu_job not in site.holds(attacker)  # no GPU: no hold
    # The node Prolog read its GPU's index from scontrol despite the `TRES=` in the name
    # (22.05 prints TRES= itself, 26.05 the name twice): NVML samples the right device.
    assert re.search(
        rf"gpucredit\[prolog\] job={gpu_job} run=0: node node\d GPUs \d=a100: registered",
        site.hook_log(log_from),
    )
    report = site.bridge()
    assert report["malformed"] == []
    mine = {r["job"] for r in report["runs"]}
    assert not any(job.startswith("lab/999999/") for job in mine)
    assert f"lab/{gpu_job}/0" not in mine  # the hook's charge was exact: no adjustment
    assert site.holds(victim) == {}
    balance = json.loads(site.ok("gpucredit", "balance", victim, "--format", "json"))
    assert (balance["available"], balance["held"]) == ("100.00", "0.00")


# --------------------------------------------------------------------------- tasks and nodes


def test_per_task_and_two_node_jobs_are_billed_for_every_gpu_to_the_micro_credit(site: Site) -> None:
    payer = site.account("p", "50")
    asked = {  # options -> GPUs held (and quoted: `N×TYPE`)
        ("-n", "2", "--gpus-per-task=a100:1"): {"a100": 2},
        ("-N", "2", "--gpus-per-node=h100:1"): {"h100": 2},
        ("-N", "2", "--gpus=a100:3"): {"a100": 3},
        ("-N", "2", "--ntasks-per-node=1", "--gpus-per-task=h100:1"): {"h100": 2},
    }
    jobs: dict[int, dict[str, int]] = {}
    for options, gpus in asked.items():
        job, said = site.submit(payer, *options, "-t", "2", "--wrap", "sleep 3")
        ((gpu_type, count),) = gpus.items()
        quote = f"gpucredit: ~{_charge(gpus, 120)} credits ({count}×{gpu_type} × 2 min)"
        assert quote in said, (options, said)
        jobs[job] = gpus
        wait_for(f"job {job} to end", partial(site.done, job))  # two nodes each: one at a time
    holds = wait_for("every job's settlement", lambda: site.settled(payer, jobs))
    for job, gpus in jobs.items():
        text = ",".join(f"{gpu_type}:{count}" for gpu_type, count in sorted(gpus.items()))
        assert (holds[job]["gpus"], holds[job]["amount"]) == (text, _charge(gpus, 120)), job
        assert holds[job]["charged"] == _charge(gpus, site.elapsed(job)), job
    report = site.bridge()
    assert [r for r in report["runs"] if int(r["job"].split("/")[1]) in jobs] == []


# --------------------------------------------------------------------------- fairshare and limits


def test_fairshare_sync_is_what_sshare_shows(site: Site) -> None:
    parent = site.account("f", None)
    rich = site.account("fr", "400", parent=parent)
    poor = site.account("fp", "100", parent=parent)
    first = json.loads(site.ok("gpucredit", "fairshare", "sync", "--format", "json"))
    mine = [c for c in first["changes"] if c["account"] in (rich, poor)]
    planned = {(c["account"], c["user"] or ""): str(c["new"]) for c in mine}
    assert planned[(rich, "")] and planned[(poor, "")]
    assert int(planned[(rich, "")]) > int(planned[(poor, "")])
    shares = read_sshare(site.ok(*SSHARE_ARGV))
    assert {key: shares[key]["raw_shares"] for key in planned} == planned
    second = json.loads(site.ok("gpucredit", "fairshare", "sync", "--format", "json"))
    assert [c for c in second["changes"] if c["account"] in (rich, poor)] == []


def _grptres(site: Site, account: str) -> dict[str, set[str]]:
    out = site.ok("sacctmgr", "-nP", "show", "assoc", "where", f"account={account}", "format=user,grptres")
    rows = (line.split("|") for line in out.splitlines())
    return {user: set(filter(None, tres.split(","))) for user, tres in rows}


def test_limits_sync_is_the_grptres_sacctmgr_shows(site: Site) -> None:
    account = site.account("l", "20")
    site.ok("gpucredit", "limits", "set", account, "--user", "alice", "--max-gpus", "2")
    first = json.loads(site.ok("gpucredit", "limits", "sync", "--format", "json"))
    changes = {c["name"]: c["new"] for c in first["changes"] if account in c["name"]}
    cap = "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2"
    assert changes == {f"alice@{account}": cap}
    assert _grptres(site, account) == {"": set(), "alice": set(cap.split(","))}
    second = json.loads(site.ok("gpucredit", "limits", "sync", "--format", "json"))
    assert [c for c in second["changes"] if account in c["name"]] == []


def test_heterogeneous_and_array_jobs_are_held_per_part_and_billed_exact(site: Site) -> None:
    """squeue answers a het job's leader with every part and an array's first id with
    every task (docs/slurm-facts.md §16): each part and task is held and settled once."""
    payer = site.account("h", "50")
    het, _ = site.submit(
        payer, "-t", "2", "--gres=gpu:a100:1", ":", "-t", "2", "--gres=gpu:h100:1", "--wrap", "sleep 3"
    )
    array, _ = site.submit(payer, "-t", "2", "--array=0-1", "--gres=gpu:a100:1", "--wrap", "sleep 3")
    wait_for("both jobs to end", lambda: site.done(het, array), timeout=120)
    raw = site.ok("sacct", "-X", "-n", "-P", "-j", f"{het},{array}", "--format", "JobIDRaw,JobID,State")
    parts = {int(line.split("|")[0]): line.split("|")[1] for line in raw.splitlines()}
    assert sorted(parts.values()) == sorted([f"{het}+0", f"{het}+1", f"{array}_0", f"{array}_1"]), raw
    holds = wait_for("every part's settlement", lambda: site.settled(payer, parts))
    gpus = {
        f"{het}+0": {"a100": 1},
        f"{het}+1": {"h100": 1},
        f"{array}_0": {"a100": 1},
        f"{array}_1": {"a100": 1},
    }
    for job_id, display in parts.items():
        want = gpus[display]
        text = ",".join(f"{t}:{n}" for t, n in want.items())
        assert (holds[job_id]["gpus"], holds[job_id]["amount"]) == (text, _charge(want, 120)), display
        assert holds[job_id]["charged"] == _charge(want, site.elapsed(job_id)), display
    report = site.bridge()
    assert [r for r in report["runs"] if int(r["job"].split("/")[1]) in parts] == []
