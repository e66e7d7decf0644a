"""The provider's side of tests/cloud/ (its fixtures are in tests/cloud/conftest.py): a
`[cloud]` section on a test endpoint, and the rig a test drives CloudPrograms with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from accounting_bridge.cloud.config import CloudConfig
from accounting_bridge.cloud.programs import CloudPrograms
from accounting_bridge.slurm.slurmcmd import FakeRunner

PRICE_UCREDITS_PER_HOUR = 98_320_000  # p5.48xlarge at 98.32 credits an hour
IMAGE_ID = "ami-12c6146b"


def cloud_section(endpoint_url: str, state_dir: Path, **overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "endpoint_url": endpoint_url,
        "region": "us-east-1",
        "image_id": IMAGE_ID,
        "state_dir": str(state_dir),
        "launch_attempts": 1,
        "terminate_attempts": 4,
        "terminate_backoff_seconds": 1.0,
        "nodes": {"cloud[1-2]": "h100"},
        "instance_types": {"h100": "p5.48xlarge"},
        "prices_ucredits_per_hour": {"p5.48xlarge": PRICE_UCREDITS_PER_HOUR},
        "tags": {"Project": "gpucredit-tests"},
    }
    section.update(overrides)
    return section


@dataclass
class Rig:
    programs: CloudPrograms
    config: CloudConfig
    slurm: FakeRunner
    said: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    now: list[datetime] = field(default_factory=lambda: [datetime(2026, 12, 3, 20, 0, tzinfo=UTC)])

    def at(self, when: datetime) -> None:
        self.now[0] = when
