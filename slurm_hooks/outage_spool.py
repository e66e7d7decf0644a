"""The outage spool: GPU runs admitted while the ledger was unreachable, counted durably.

Under `policy.on_ledger_unreachable = "accept"` PrologSlurmctld cannot ask the ledger, so
it counts here instead, in `policy.outage_spool_dir` on the controller (docs/outage.md):

    sheet.json   written atomically by `gpucredit daemon` while the ledger is up: the
                 prices per GPU-hour the hook estimates with (micro-credits, per GPU
                 type and per partition), never below a price in force or scheduled
    runs.jsonl   one JSON line per run admitted (`"op": "admit"`: cluster, job_id, run,
                 submit, start, account, user, partition, gpus, seconds, rate and
                 estimate in micro-credits) and per admitted run that ended (`"op":
                 "end"`, from EpilogSlurmctld); appended and fsynced under spool.lock
    spool.lock   flock(2) taken by every writer and by the read-back; never replaced,
                 so a writer never appends to a file the read-back has just renamed away

A run is admitted while its account's spooled estimates, and the fleet's, stay within
their credit lines. When the ledger is back, the daemon's read-back
(accounting_bridge/outage/readback.py) charges each ended run as `unreserved`, once, and
forgets it here; until then it keeps counting against the lines.

Stdlib only and cheap to import: it runs inside the hooks. The estimate rule is the
ledger's (`ledger.money.charge_for`: cumulative seconds at a rate, rounded half-up once);
tests/hooks/test_outage.py checks the two agree.
"""

from __future__ import annotations

import fcntl
import json
import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime
    from typing import Any

__all__ = [
    "DEFAULT_SPOOL_DIR",
    "LOCK",
    "RUNS",
    "SHEET",
    "Admission",
    "Lines",
    "OutageSettings",
    "Spool",
    "SpooledRun",
    "charge_ucredits",
    "estimate",
    "format_ucredits",
    "lines_from_settings",
    "parse_credit_text",
    "read_sheet",
    "write_sheet",
]

DEFAULT_SPOOL_DIR = "/var/spool/gpucredit/outage"
SHEET = "sheet.json"
RUNS = "runs.jsonl"
LOCK = "spool.lock"
SHEET_VERSION = 1
UCREDITS_PER_CREDIT = 1_000_000
SECONDS_PER_HOUR = 3600

_CREDITS = re.compile(r"^\s*(\d{1,13})(?:\.(\d{1,6}))?\s*$")


def parse_credit_text(value: object) -> int:
    """A decimal credit string ("50", "12.5") as micro-credits; ValueError otherwise.

    The ledger's parse_credits accepts the same non-negative strings (tests check it)."""
    match = _CREDITS.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'{value!r} is not a decimal credit amount like "50" or "12.5"')
    whole, fraction = match.group(1), match.group(2) or ""
    return int(whole) * UCREDITS_PER_CREDIT + int(fraction.ljust(6, "0"))


def format_ucredits(ucredits: int) -> str:
    """As ledger.money.format_credits: 14400000 -> '14.40'."""
    sign = "-" if ucredits < 0 else ""
    whole, fraction = divmod(abs(ucredits), UCREDITS_PER_CREDIT)
    digits = f"{fraction:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{whole}.{digits}"


def charge_ucredits(rate_ucredits_per_hour: int, seconds: int) -> int:
    """`seconds` at a rate per hour, rounded half-up once (ledger.money.charge_for)."""
    quotient, remainder = divmod(rate_ucredits_per_hour * seconds, SECONDS_PER_HOUR)
    return quotient + (1 if 2 * remainder >= SECONDS_PER_HOUR else 0)


class Lines:
    """The outage credit lines in micro-credits; None means no line (no cap)."""

    __slots__ = ("accounts", "fleet", "per_account")

    def __init__(
        self,
        per_account: int | None = None,
        fleet: int | None = None,
        accounts: Mapping[str, int] | None = None,
    ) -> None:
        self.per_account = per_account
        self.fleet = fleet
        self.accounts = dict(accounts or {})

    def for_account(self, account: str) -> int | None:
        return self.accounts.get(account, self.per_account)

    def any(self) -> bool:
        return self.per_account is not None or self.fleet is not None or bool(self.accounts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lines):
            return NotImplemented
        return (self.per_account, self.fleet, self.accounts) == (
            other.per_account,
            other.fleet,
            other.accounts,
        )

    def __repr__(self) -> str:
        return f"Lines(per_account={self.per_account!r}, fleet={self.fleet!r}, accounts={self.accounts!r})"


def lines_from_settings(policy: Mapping[str, Any]) -> tuple[Lines, list[str]]:
    """The lines in a `[policy]` table, and the problems found.

    A bad value becomes a line of 0 (admit nothing), never "no line": a typo must not
    lift the cap. ledger.holds.bounds.outage_lines refuses the same values with a clear error.
    """
    problems: list[str] = []

    def line(key: str, value: object) -> int | None:
        if value is None:
            return None
        try:
            return parse_credit_text(value)
        except ValueError as e:
            problems.append(f"bad value for policy.{key}: {e}; using a line of 0")
            return 0

    per_account = line("outage_credit_line_per_account", policy.get("outage_credit_line_per_account"))
    fleet = line("outage_credit_line_fleet", policy.get("outage_credit_line_fleet"))
    accounts: dict[str, int] = {}
    table = policy.get("outage_credit_lines")
    if table is not None and not isinstance(table, dict):
        problems.append(f"bad value for policy.outage_credit_lines: {table!r} is not a table; ignored")
        per_account = 0 if per_account is None else per_account
    elif table:
        for name, value in table.items():
            accounts[str(name)] = line(f"outage_credit_lines.{name}", value) or 0
    return Lines(per_account, fleet, accounts), problems


# --- the price sheet -------------------------------------------------------------------------


def read_sheet(directory: str) -> dict[str, Any]:
    """The daemon's price sheet; ValueError (with what is wrong) when missing or unusable."""
    path = os.path.join(directory, SHEET)
    try:
        with open(path, encoding="utf-8") as f:
            sheet = json.load(f)
    except FileNotFoundError:
        raise ValueError(
            f"no outage price sheet {path} (the daemon writes it while the ledger is up)"
        ) from None
    except (OSError, ValueError) as e:
        raise ValueError(f"outage price sheet {path} is unreadable ({e})") from None
    if not isinstance(sheet, dict) or sheet.get("version") != SHEET_VERSION:
        raise ValueError(f"outage price sheet {path} is not version {SHEET_VERSION}")
    prices, by_partition = sheet.get("prices"), sheet.get("partition_prices")
    if not isinstance(prices, dict) or not isinstance(by_partition, dict):
        raise ValueError(f"outage price sheet {path} has no prices")
    return sheet


def write_sheet(directory: str, sheet: Mapping[str, Any]) -> str:
    """Replace the sheet atomically (whole file or none, fsynced); returns its path."""
    os.makedirs(directory, mode=0o750, exist_ok=True)
    path = os.path.join(directory, SHEET)
    _replace(path, json.dumps({**sheet, "version": SHEET_VERSION}, sort_keys=True) + "\n")
    return path


def estimate(
    sheet: Mapping[str, Any], gpus: Mapping[str, int], partition: str | None, seconds: int
) -> tuple[int, int]:
    """(rate per hour, estimate) of a run, in micro-credits: each GPU at its partition's
    price, else its type's, else the dearest price on the sheet (an untyped or unpriced
    GPU is never estimated low); ValueError when the sheet has no price at all."""
    general: Mapping[str, int] = sheet["prices"]
    own: Mapping[str, int] = sheet["partition_prices"].get(partition or "", {}) if partition else {}
    dearest = max([*general.values(), *own.values()], default=None)
    rate = 0
    for gpu_type, count in gpus.items():
        price = own.get(gpu_type, general.get(gpu_type, dearest))
        if price is None:
            raise ValueError("the outage price sheet has no prices")
        rate += int(price) * int(count)
    return rate, charge_ucredits(rate, seconds)


# --- the spool of admitted runs ---------------------------------------------------------------


def run_key(record: Mapping[str, Any]) -> tuple[str, int, int, str | None]:
    """What names an attempt: Slurm reuses job ids, never (id, run, SubmitTime)."""
    return (str(record["cluster"]), int(record["job_id"]), int(record["run"]), record.get("submit"))


class Admission:
    """The spool's answer: admitted, or refused by `limit` with the value and the cap."""

    __slots__ = ("admitted", "cap", "limit", "record", "repeat", "value")

    def __init__(
        self,
        admitted: bool,
        record: Mapping[str, Any],
        *,
        limit: str | None = None,
        value: int = 0,
        cap: int = 0,
        repeat: bool = False,
    ) -> None:
        self.admitted = admitted
        self.record = record
        self.limit = limit  # "account" or "fleet" when refused
        self.value = value  # spooled estimates with this run, micro-credits
        self.cap = cap
        self.repeat = repeat


class SpooledRun:
    """An admitted run and, once EpilogSlurmctld saw it end, its end (ISO text)."""

    __slots__ = ("admit", "end")

    def __init__(self, admit: dict[str, Any], end: str | None = None) -> None:
        self.admit = admit
        self.end = end

    @property
    def key(self) -> tuple[str, int, int, str | None]:
        return run_key(self.admit)


class Spool:
    """runs.jsonl in `directory`, read and written only under spool.lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, RUNS)

    def _locked(self) -> _Lock:
        return _Lock(os.path.join(self.directory, LOCK))

    def _records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash mid-write: its run was never admitted
            if isinstance(record, dict) and record.get("op") in ("admit", "end"):
                records.append(record)
        return records

    def _append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            _own(fd, self.directory)
            size = os.fstat(fd).st_size
            if size and _last_byte(self.path, size) != b"\n":
                line = b"\n" + line  # after a torn line, start afresh
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def runs(self) -> list[SpooledRun]:
        with self._locked():
            return _merge(self._records())

    def totals(self) -> tuple[dict[str, int], int]:
        """Spooled estimates per account and for the fleet, micro-credits."""
        with self._locked():
            return _totals(_merge(self._records()))

    def admit(self, record: Mapping[str, Any], lines: Lines) -> Admission:
        """Append `record` (an admit line) if its account and the fleet stay within their
        lines; a run already spooled is admitted again without a second line."""
        key = run_key(record)
        account, cost = str(record["account"]), int(record.get("estimate_ucredits") or 0)
        with self._locked():
            runs = _merge(self._records())
            for run in runs:
                if run.key == key:
                    return Admission(True, run.admit, repeat=True)
            per_account, fleet = _totals(runs)
            account_line = lines.for_account(account)
            if account_line is not None and per_account.get(account, 0) + cost > account_line:
                return Admission(
                    False, record, limit="account", value=per_account.get(account, 0) + cost, cap=account_line
                )
            if lines.fleet is not None and fleet + cost > lines.fleet:
                return Admission(False, record, limit="fleet", value=fleet + cost, cap=lines.fleet)
            self._append({**record, "op": "admit"})
        return Admission(True, record)

    def record_end(self, cluster: str, job_id: int, run: int, submit: str | None, end: str) -> bool:
        """Note that a spooled run ended (EpilogSlurmctld); False when none of this job's
        runs up to `run` is spooled and still open (nothing written)."""
        end_record = {
            "op": "end",
            "cluster": cluster,
            "job_id": job_id,
            "run": run,
            "submit": submit,
            "end": end,
        }
        with self._locked():
            if _match_end(_merge(self._records()), end_record) is None:
                return False
            self._append(end_record)
        return True

    def forget(self, keys: Iterable[tuple[str, int, int, str | None]]) -> int:
        """Drop these runs (charged or held by the ledger) and their end lines; rewrite the
        file atomically under the lock. Returns how many runs were dropped."""
        gone = set(keys)
        if not gone:
            return 0
        with self._locked():
            runs = _merge(self._records())
            kept = [run for run in runs if run.key not in gone]
            if len(kept) == len(runs):
                return 0
            lines = []
            for run in kept:
                lines.append(json.dumps(run.admit, sort_keys=True, separators=(",", ":")))
                if run.end is not None:
                    lines.append(json.dumps(_end_of(run), sort_keys=True, separators=(",", ":")))
            _replace(self.path, "".join(line + "\n" for line in lines))
            return len(runs) - len(kept)


def _end_of(run: SpooledRun) -> dict[str, Any]:
    cluster, job_id, number, submit = run.key
    return {
        "op": "end",
        "cluster": cluster,
        "job_id": job_id,
        "run": number,
        "submit": submit,
        "end": run.end,
    }


def _merge(records: list[dict[str, Any]]) -> list[SpooledRun]:
    runs: list[SpooledRun] = []
    seen: set[tuple[str, int, int, str | None]] = set()
    for record in records:
        try:
            if record["op"] == "admit":
                key = run_key(record)
                if key not in seen:
                    seen.add(key)
                    runs.append(SpooledRun(record))
            else:
                run = _match_end(runs, record)
                if run is not None:
                    run.end = str(record["end"])
        except (KeyError, TypeError, ValueError):
            continue  # not one of ours
    return runs


def _match_end(runs: list[SpooledRun], end: Mapping[str, Any]) -> SpooledRun | None:
    """The open run an end line closes: same job and attempt, the latest run up to the
    epilog's (which already counts a requeue: docs/slurm-facts.md §11)."""
    best: SpooledRun | None = None
    for run in runs:
        cluster, job_id, number, submit = run.key
        if run.end is not None or cluster != end["cluster"] or job_id != int(end["job_id"]):
            continue
        if submit and end.get("submit") and submit != end["submit"]:
            continue
        if number <= int(end["run"]) and (best is None or number > best.key[2]):
            best = run
    return best


def _totals(runs: list[SpooledRun]) -> tuple[dict[str, int], int]:
    per_account: dict[str, int] = {}
    for run in runs:
        account = str(run.admit["account"])
        per_account[account] = per_account.get(account, 0) + int(run.admit.get("estimate_ucredits") or 0)
    return per_account, sum(per_account.values())


def _last_byte(path: str, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def _own(fd: int, directory: str) -> None:
    """Give a file root creates here the directory's owner: the hooks run as SlurmUser,
    the daemon or an admin's `gpucredit policy readback` perhaps as root, and each must
    be able to append to and lock what the other created."""
    if os.geteuid() == 0:
        info = os.stat(directory)
        os.fchown(fd, info.st_uid, info.st_gid)


def _replace(path: str, text: str) -> None:
    """Write `text` to `path` atomically and durably (temp file, fsync, rename, fsync dir)."""
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        _own(fd, directory)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _Lock:
    """flock(2) on the spool's lock file for a `with` block."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> _Lock:
        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        _own(self.fd, os.path.dirname(self.path))
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


class OutageSettings:
    """The hooks' outage settings (`[policy]`): the spool directory and the lines."""

    __slots__ = ("directory", "lines", "problems")

    def __init__(self, directory: str, lines: Lines, problems: list[str]) -> None:
        self.directory = directory
        self.lines = lines
        self.problems = problems

    @classmethod
    def from_policy(cls, policy: Mapping[str, Any]) -> OutageSettings:
        lines, problems = lines_from_settings(policy)
        directory = policy.get("outage_spool_dir", DEFAULT_SPOOL_DIR)
        if not (isinstance(directory, str) and os.path.isabs(directory)):
            problems.append(f"bad value {directory!r} for policy.outage_spool_dir; using {DEFAULT_SPOOL_DIR}")
            directory = DEFAULT_SPOOL_DIR
        return cls(directory, lines, problems)

    def admit(self, request: Mapping[str, Any] | None, now: datetime) -> tuple[bool, str, str]:
        """Whether PrologSlurmctld lets this run start without the ledger, why (a refusal
        is the reason the user sees on the held job) and, for the log, any detail."""
        capped = self.lines.any()
        if request is None or request.get("seconds") is None:
            what = "its GPU request could not be read" if request is None else "it has no time limit"
            if capped:
                return (
                    False,
                    (
                        f"ledger unreachable and {what}, so it cannot be counted against the outage "
                        "credit line; job held by site policy until the ledger returns"
                    ),
                    "",
                )
            return True, f"not counted ({what})", ""
        if not capped and not os.path.isdir(self.directory):
            return True, f"not spooled (no {self.directory}); the bridge charges it from sacct", ""
        sheet: Mapping[str, Any] | None = None
        try:
            sheet = read_sheet(self.directory)
            rate, cost = estimate(sheet, request["gpus"], request.get("partition"), int(request["seconds"]))
        except ValueError as e:
            if capped:
                return (
                    False,
                    (
                        "ledger unreachable and no usable outage price sheet, so this job cannot be "
                        "counted against the outage credit line; job held by site policy until the "
                        "ledger returns"
                    ),
                    f" ({e})",
                )
            rate, cost = None, None
        record = {
            "op": "admit",
            "cluster": request["cluster"],
            "job_id": request["job_id"],
            "run": request["run"],
            "submit": request.get("submit"),
            "start": request.get("start"),
            "account": request["account"],
            "user": request["user"],
            "partition": request.get("partition"),
            "gpus": dict(request["gpus"]),
            "seconds": int(request["seconds"]),
            "rate_ucredits_per_hour": rate,
            "estimate_ucredits": cost,
            "admitted_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        try:
            admission = Spool(self.directory).admit(record, self.lines)
        except OSError as e:
            if capped:
                return (
                    False,
                    (
                        "ledger unreachable and the outage spool is unwritable; "
                        "job held by site policy until the ledger returns"
                    ),
                    f" ({e})",
                )
            return True, f"not spooled ({e}); the bridge charges it from sacct", ""
        cost_text = "?" if cost is None else format_ucredits(cost)
        if admission.admitted:
            again = " (already spooled)" if admission.repeat else ""
            return True, f"spooled{again} at ~{cost_text} credits in {Spool(self.directory).path}", ""
        what = (
            f"outage credit line of account {record['account']}"
            if admission.limit == "account"
            else "fleet outage credit line"
        )
        return (
            False,
            (
                f"ledger unreachable; {what}: {format_ucredits(admission.value)} > "
                f"{format_ucredits(admission.cap)} credits with this job (~{cost_text}); "
                "job held by site policy until the ledger returns"
            ),
            "",
        )

    def end(self, request: Mapping[str, Any]) -> str:
        """Note in the spool that a run admitted there ended (EpilogSlurmctld); what to log."""
        if not os.path.isdir(self.directory):
            return ""
        try:
            noted = Spool(self.directory).record_end(
                str(request["cluster"]),
                int(request["job_id"]),
                int(request["run"]),
                request.get("submit"),
                str(request["end"]),
            )
        except OSError as e:
            return f"; cannot note its end in the outage spool ({e})"
        return "; its end is noted in the outage spool" if noted else ""
