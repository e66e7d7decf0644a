"""The instances this site launched and ended: one JSON line per event, append-only.

The provider forgets a terminated instance within about an hour; the bill does not.
`resume` writes a `launched` line once RunInstances has answered, `suspend`,
`resume-fail` and `reconcile` a `terminated` line once TerminateInstances has: the
launch and end times the cost is figured from. Several programs append at once
(Slurm runs one per hostlist), so each line is written under an exclusive lock, in one
write, and fsync'd.

    {"event": "launched", "id": "i-0abc", "node": "cloud1", "type": "p5.48xlarge",
     "region": "us-east-1", "at": "2026-12-03T20:01:02+00:00"}
    {"event": "terminated", "id": "i-0abc", "at": "2026-12-03T20:09:40+00:00", "by": "suspend"}

A line that cannot be read raises JournalError with its number: a bill is never made
from part of the record.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from accounting_bridge.cloud.provider import Instance

__all__ = ["Journal", "JournalEntry", "JournalError"]

FILE_NAME = "instances.jsonl"


class JournalError(ValueError):
    """The journal has a line that is not one of its two events."""


@dataclass(frozen=True)
class JournalEntry:
    id: str
    node: str | None
    instance_type: str
    region: str
    launched_at: datetime
    terminated_at: datetime | None = None
    ended_by: str | None = None


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME

    def launched(self, instance: Instance) -> None:
        self._append(
            {
                "event": "launched",
                "id": instance.id,
                "node": instance.node,
                "type": instance.instance_type,
                "region": instance.region,
                "at": instance.launched_at.isoformat(),
            }
        )

    def terminated(self, instance: Instance, at: datetime, by: str) -> None:
        """An end, with the instance's launch as the provider knows it: an instance the
        journal never saw launched (a leak after a crash) is on the record from here."""
        self._append(
            {
                "event": "terminated",
                "id": instance.id,
                "node": instance.node,
                "type": instance.instance_type,
                "region": instance.region,
                "launched_at": instance.launched_at.isoformat(),
                "at": at.isoformat(),
                "by": by,
            }
        )

    def entries(self) -> dict[str, JournalEntry]:
        """Each instance on the record, by id, its first end kept."""
        if not self.path.exists():
            return {}
        found: dict[str, JournalEntry] = {}
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    _apply(found, _read(line, number, self.path))
        return found

    def _append(self, event: dict[str, object]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(event, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


def _read(line: str, number: int, path: Path) -> dict[str, str]:
    try:
        event = json.loads(line)
        if event["event"] not in ("launched", "terminated"):
            raise KeyError("event")
        datetime.fromisoformat(event["at"])
    except (ValueError, KeyError, TypeError) as error:
        raise JournalError(f"{path}:{number}: not a journal event ({error}): {line[:200]!r}") from None
    return dict(event)


def _apply(found: dict[str, JournalEntry], event: dict[str, str]) -> None:
    at = datetime.fromisoformat(event["at"])
    known = found.get(event["id"])
    if event["event"] == "launched":
        if known is None:
            found[event["id"]] = JournalEntry(
                event["id"], event.get("node"), event["type"], event["region"], at
            )
        return
    if known is None:
        known = JournalEntry(
            event["id"],
            event.get("node"),
            event["type"],
            event["region"],
            datetime.fromisoformat(event["launched_at"]),
        )
    if known.terminated_at is None:
        known = JournalEntry(
            known.id, known.node, known.instance_type, known.region, known.launched_at, at, event.get("by")
        )
    found[event["id"]] = known
