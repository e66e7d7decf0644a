"""Slurm 24.11 and later: the jobs API acts for a user through slurmrestd (auth/jwt).

    [portal]
    jobs_backend = "slurmrestd"
    slurmrestd_url = "http://127.0.0.1:6820"
    submitter_socket = "/run/gpucredit/submitter.sock"   # the root submitter signs (--jwt-key)
    # or: jwt_key = "/etc/slurm/jwt_hs256.key"         # the portal signs with the key itself

For each submit or cancel the portal gets a token for the logged-in user, valid for
`TOKEN_SECONDS` and signed with the cluster's key (HS256, the `sun` claim naming the
user: what `scontrol token` makes). slurmrestd passes it to slurmctld, which runs the
request as that user: the job is theirs and passes job_submit.lua like any sbatch.
Holding the key is being able to act as any user, root included. So by default the root
submitter (portal.jobs.submitter) holds it and signs only for uids in the people's
range, asked by the portal's uid alone: code run as the portal's user can then act as
people, not as root. With `jwt_key` the portal signs itself (one host's trial; the
portal checks the same range, docs/admin-guide.md §4b).

The REST API's version is the newest the server offers of those this module writes
(`DATA_PARSERS`); the job description is the same in each of them for the fields used.
Reads stay squeue / sacct (`CommandReader`).

Slurm keeps job_submit's words of a refusal in slurmrestd's log and answers only
"Batch job submission failed" (seen on 24.11 and 26.05); so a refused submit is worded
from the ledger's own quote of the same job (`words_of_refusal`), the rule job_submit
applies.
"""

from __future__ import annotations

import json
import math
import pwd
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from ledger.errors import InsufficientCredits, InvalidInput, LedgerError, LimitExceeded
from ledger.timeutil import parse_slurm_duration
from portal.auth import Forbidden
from portal.jobs.backend import COMMAND_TIMEOUT, CommandReader, JobSpec, Runner, SlurmUnavailable, Submitted
from portal.jobs.submitter import PATH, USER_NAME, ask, directive_comment, user_token

# slurmrestd's data parsers this module writes, oldest first (24.11 offers v0.0.40-42,
# 26.05 v0.0.42-45).
DATA_PARSERS = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
SUBMIT_PATH = re.compile(r"^/slurm/(v0\.0\.[0-9]+)/job/submit$")
# slurm_errno's codes in a cancel's per-job status: the job is not there to signal
# (ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE), or the caller may not (ESLURM_ACCESS_DENIED).
JOB_GONE = (2017, 2021)
ACCESS_DENIED = 2002
# A refusal: job_submit.lua's (-1, "Unspecified error") or slurmctld's own (slurm_errno's
# ESLURM_* 2000-2999). Anything else (1000s: slurmctld unreachable; 5000s: a socket timed
# out, when the job may even be queued; EAGAIN) is Slurm unavailable, not the job's fault.
REFUSALS = (-1, *range(2000, 3000))
MEMORY_UNITS_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
SIGNER_TIMEOUT = 5.0  # seconds for the submitter to sign a token (it reads a file)


def _passwd(user: str) -> tuple[int, str]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_dir


def memory_mib(memory: str) -> int:
    """sbatch's --mem (a number, M unless K/M/G/T follows) in MiB, rounded up."""
    unit = memory[-1] if memory[-1] in MEMORY_UNITS_MIB else "M"
    number = int(memory.rstrip("KMGT"))
    return math.ceil(number * MEMORY_UNITS_MIB[unit])


def job_description(spec: JobSpec, user: str, home: str) -> dict[str, Any]:
    """slurmrestd's job description for `spec` as `user`: what the submitter gives sbatch
    (its options, PATH, HOME and USER, the working directory, default the home)."""
    minutes = math.ceil(parse_slurm_duration(spec.time_limit) / 60)  # sbatch rounds up as well
    working_dir = spec.working_dir or home
    environment = {"PATH": PATH, "HOME": home, "USER": user, **spec.environment}
    job: dict[str, Any] = {
        "script": spec.script,
        "account": spec.account,
        "tres_per_node": f"gres/gpu:{spec.gpus}",
        "time_limit": {"set": True, "infinite": False, "number": minutes},
        "current_working_directory": working_dir,
        "standard_output": f"{working_dir.rstrip('/')}/slurm-%j.out",  # sbatch's default name
        "environment": [f"{name}={value}" for name, value in sorted(environment.items())],
    }
    if spec.name is not None:
        job["name"] = spec.name
    if spec.cpus is not None:
        job["cpus_per_task"] = spec.cpus
    if spec.memory is not None:
        job["memory_per_node"] = {"set": True, "infinite": False, "number": memory_mib(spec.memory)}
    if spec.container is not None:
        job["container"] = spec.container
    if spec.retry is not None:  # Slurm requeues only a requeueable job (retry_keeper.py)
        job["requeue"] = True
    comment = directive_comment(spec.max_cost, spec.cloud, spec.region)
    if comment is not None:
        job["comment"] = comment
    return job


def newest_parser(paths: list[str]) -> str | None:
    """The newest data parser this module writes whose submit path the server's OpenAPI
    document lists (24.11's names no parsers elsewhere; 26.05's also in info.x-slurm)."""
    offered = {found.group(1) for found in map(SUBMIT_PATH.match, paths) if found}
    known = [name for name in DATA_PARSERS if name in offered]
    return known[-1] if known else None


class RefusedBySlurm(LedgerError):
    """slurmrestd refused a submit without job_submit's words (`words_of_refusal`)."""

    code = "slurm_refused"
    http_status = 422


# The routing verdict a refusal names (ledger.pricing.routing), in plain words.
VERDICT_WORDS = {
    "cloud_not_allowed": "it may run only in the cloud, and the cloud is not allowed (gpucredit:cloud=yes)",
    "other_region": "it may run only in the cloud, and not in the region it asks for",
    "over_limit": "over its limit of {limit} a run: raise max_cost, or ask for fewer GPUs or less time",
    "over_cloud_budget": "over the account's cloud budget for the month",
    "over_cap": "over a cap of the account",
    "over_credit": "more than is available in {account}: top up, or ask for fewer GPUs or less time",
}


def words_of_refusal(
    quote: dict[str, Any], refused: RefusedBySlurm, cap: LimitExceeded | None = None
) -> LedgerError:
    """The API's refusal for a submit slurmrestd refused, from the ledger's quote of the
    same job and, for a job not routed, the cap job_submit finds it over on its own
    (`api.cap_refusal`), in job_submit's order: routing's verdict, or the cap, then credit.
    (A routed job's cap is per partition, which job_submit weighs beside the rest.)"""
    details = {"slurmrestd": refused.message}
    routing = quote.get("routing") or {}
    verdict = routing.get("refusal")
    if cap is not None and not routing:
        return LimitExceeded(cap.code, f"gpucredit: {cap.code}: {cap.message}", {**cap.details, **details})
    if verdict:
        [named] = [p for p in routing["partitions"] if p["partition"] == routing.get("refused_at")] or [None]
        where = "" if named is None else f" in {named['partition'] or 'the default partition'}"
        cost = "" if named is None else f" would cost {named['cost']} credits{where},"
        why = VERDICT_WORDS.get(verdict, verdict).format(limit=routing.get("limit"), account=quote["account"])
        words = f"gpucredit: the job's cheapest run{cost} {why}"
        if verdict == "over_credit":
            return InsufficientCredits(words, details={**details, "available": quote["available"]})
        return InvalidInput(words, code="refused", details={**details, "verdict": verdict})
    if not quote.get("affordable", True):
        return InsufficientCredits(
            f"gpucredit: this job would cost {quote['cost']} credits; {quote['available']} available in "
            f"{quote['account']}: top up, or ask for fewer GPUs or less time",
            details=details,
        )
    return refused


class RestBackend(CommandReader):
    """Submit and cancel as the user through slurmrestd; read with squeue / sacct."""

    def __init__(
        self,
        url: str,
        key_path: str | None,
        bin_dir: str = "/usr/bin",
        run: Runner = subprocess.run,
        passwd: Callable[[str], tuple[int, str]] | None = None,
        min_uid: int = 1000,
        max_uid: int = 59999,
        signer: str | None = None,
    ) -> None:
        """Tokens are signed here with the key at `key_path`, or, with no key, by the
        submitter at the socket `signer` (which alone reads the key)."""
        super().__init__(bin_dir, run)
        if (key_path is None) == (signer is None):
            raise ValueError("give the JWT key's path or the signing submitter's socket: one of them")
        self.url = url.rstrip("/")
        self.key_path = key_path
        self.signer = signer
        self.passwd = passwd or _passwd
        self.min_uid = min_uid
        self.max_uid = max_uid
        self.parser: str | None = None

    def _home(self, user: str) -> str:
        """The user's home; refuses a token for any uid outside the people's range (root,
        system users, Debian's SlurmUser at 64030, nobody): slurmctld would take it as that
        user's word."""
        try:
            uid, home = self.passwd(user) if USER_NAME.fullmatch(user) else (None, "")
        except KeyError:
            uid = None
        if uid is None:
            raise InvalidInput(f"{user} is not a user on the cluster", details={"field": "user"})
        if not self.min_uid <= uid <= self.max_uid:
            raise InvalidInput(
                f"{user} is a system user (uid outside {self.min_uid}-{self.max_uid})",
                details={"field": "user"},
            )
        return home

    def _token(self, user: str) -> str:
        if self.signer is not None:
            return self._signed_by_submitter(self.signer, user)
        assert self.key_path is not None
        try:
            with open(self.key_path, "rb") as key:
                return user_token(key.read(), user, time.time())
        except OSError as error:
            raise SlurmUnavailable(f"the portal cannot read the JWT key {self.key_path}: {error}") from None

    @staticmethod
    def _signed_by_submitter(socket_path: str, user: str) -> str:
        try:
            answer = ask(socket_path, {"op": "token", "user": user}, timeout=SIGNER_TIMEOUT)
        except (OSError, ValueError) as error:
            raise SlurmUnavailable(f"the submitter at {socket_path} did not answer: {error}") from None
        if not isinstance(answer, dict):
            raise SlurmUnavailable(f"the submitter at {socket_path} answered {answer!r}")
        token = answer.get("token")
        if answer.get("ok") and isinstance(token, str):
            return token
        if answer.get("error") == "invalid_input" and answer.get("field") == "user":
            raise InvalidInput(str(answer.get("message")), details={"field": "user"})
        raise SlurmUnavailable(f"the submitter signed no token for {user}: {answer.get('message', answer)}")

    def _call(self, user: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "X-SLURM-USER-NAME": user,
                "X-SLURM-USER-TOKEN": self._token(user),
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=COMMAND_TIMEOUT) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.load(error)
            except ValueError:
                raise SlurmUnavailable(f"slurmrestd {method} {path}: HTTP {error.code}") from None
        except (OSError, ValueError) as error:
            raise SlurmUnavailable(f"slurmrestd at {self.url} did not answer: {error}") from None

    def _parser(self, user: str) -> str:
        if self.parser is None:
            status, spec = self._call(user, "GET", "/openapi/v3")
            found = newest_parser(list(spec.get("paths", {})) if isinstance(spec, dict) else [])
            if status != 200 or found is None:
                raise SlurmUnavailable(f"slurmrestd at {self.url} offers none of {', '.join(DATA_PARSERS)}")
            self.parser = found
        return self.parser

    def submit(self, user: str, spec: JobSpec) -> Submitted:
        body = {"job": job_description(spec, user, self._home(user))}
        status, answer = self._call(user, "POST", f"/slurm/{self._parser(user)}/job/submit", body)
        if status == 200 and answer.get("job_id"):
            return Submitted(int(answer["job_id"]), str(answer.get("job_submit_user_msg") or ""))
        errors = answer.get("errors") or []
        words = "; ".join(f"{e.get('description')} ({e.get('error')})" for e in errors) or f"HTTP {status}"
        if status == 404:  # an upgraded slurmrestd without this REST version: look again next time
            self.parser = None
        if not errors or not all(e.get("error_number") in REFUSALS for e in errors):
            raise SlurmUnavailable(f"slurmrestd could not submit the job: {words}")
        raise RefusedBySlurm(words)

    def cancel(self, user: str, job_id: int) -> None:
        """Signal the job as `user`. Slurm answers 200 and names each job it did not
        signal in `status` (a job that is gone counts as cancelled)."""
        self._home(user)
        status, answer = self._call(user, "DELETE", f"/slurm/{self._parser(user)}/job/{job_id}")
        errors = [e.get("error") or {} for e in answer.get("status") or []]
        failed = [e for e in errors if e.get("code") and e.get("code") not in JOB_GONE]
        if any(e.get("code") == ACCESS_DENIED for e in failed):
            raise Forbidden(f"Slurm refused to cancel job {job_id} as {user}: access/permission denied")
        if status != 200 or failed or answer.get("errors"):
            words = "; ".join(
                str(e.get("message") or e.get("description") or e.get("error"))
                for e in [*failed, *(answer.get("errors") or [])]
            )
            raise SlurmUnavailable(f"slurmrestd could not cancel job {job_id}: {words or f'HTTP {status}'}")
