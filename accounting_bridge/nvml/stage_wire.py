"""A cloud node's stage-in on the agents' channel (channel.py, receiver.py): the node's
Prolog asks which paths its job wants staged, copies them as the job's user, and says
what it copied (slurm_hooks/stage_in.py). Same credential, same one line each way; the
payload names its kind:

    {"v": 1, "node": "cloud1", "stage": {"cluster", "job_id", "run", "user", "partition"}}
        -> {"ok": true, "result": {"data_id": 7, "paths": ["/data/set.tar", ...]}}
           ({"data_id": null, "paths": []}: nothing to stage, or not a cloud partition;
            "pending": true as well while the user has paths being submitted: ask again)
    {"v": 1, "node": "cloud1", "staged": {"data_id", "cluster", "job_id", "user", "run",
                                          "files", "bytes", "milliseconds", "error"}}
        -> {"ok": true, "result": {"recorded": true}}   (false: that run and node had one)

A report names its job, and is refused (bad_request) unless the paths it reports on are
that job's: a credential of another node's root cannot write another job's record.

Only jobs in partitions tagged `site = "cloud"` are staged: the on-premise nodes share
the site's file systems.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.errors import InvalidInput
from ledger.jobs.staging import Staged, data_pending, data_to_stage, record_staged

__all__ = ["answer_stage", "is_stage_payload"]

_ASK = {"cluster": str, "job_id": int, "run": int, "user": str, "partition": str}
_STAGED = {
    "data_id": int,
    "cluster": str,
    "job_id": int,
    "user": str,
    "run": int,
    "files": int,
    "bytes": int,
    "milliseconds": int,
}


def is_stage_payload(document: object) -> bool:
    return isinstance(document, dict) and ("stage" in document or "staged" in document)


def answer_stage(
    s: Session, document: Mapping[str, Any], cloud_partitions: Collection[str], now: datetime
) -> dict[str, Any]:
    """The result for a stage payload; ValueError for a malformed one."""
    node = document.get("node")
    if document.get("v") != 1 or not isinstance(node, str) or not node:
        raise ValueError("a version 1 stage payload names its node")
    if "stage" in document:
        ask = _fields(document["stage"], _ASK, "stage")
        if ask["partition"] not in cloud_partitions:
            return {"data_id": None, "paths": []}
        found = data_to_stage(s, ask["cluster"], ask["job_id"], ask["user"])
        if found is not None:
            return {"data_id": found.data_id, "paths": list(found.paths)}
        return {"data_id": None, "paths": [], "pending": data_pending(s, ask["cluster"], ask["user"], now)}
    told = _fields(document["staged"], _STAGED, "staged")
    error = document["staged"].get("error")
    if error is not None and not isinstance(error, str):
        raise ValueError("staged.error is text or null")
    staged = Staged(told["run"], node, told["files"], told["bytes"], told["milliseconds"], error, now)
    try:
        recorded = record_staged(s, told["data_id"], told["cluster"], told["job_id"], told["user"], staged)
    except InvalidInput as refused:
        raise ValueError(refused.message) from None
    return {"recorded": recorded}


def _fields(body: object, types: Mapping[str, type], name: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValueError(f"{name} is an object")
    for key, kind in types.items():
        value = body.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{name}.{key} is {'an integer' if kind is int else 'text'}")
    return dict(body)
