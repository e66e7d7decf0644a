"""The recorded Slurm output in tests/fixtures/sacct/ (see its README.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from tests import support

FIXTURES = support.FIXTURES / "sacct"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def utc(text: str) -> datetime:
    """An ISO time without a zone, read as UTC (the box records in UTC)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
