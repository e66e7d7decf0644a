"""Scarcity caps: while a partition's GPUs are nearly all allocated, nobody may hold more
than a share of them. Pure: figures in, a decision out.

Per partition, with share = GPUs allocated / GPUs on its nodes that can take jobs
(sinfo; a node shared by two partitions counts in both)::

    caps now   share                             caps then
    off        > engage_above   [0.8]            on
    on         < lift_below     [0.6]            off
    either     in between                        as they are (hysteresis)
    either     the partition has no usable GPUs  off

While on, a user may hold at most max(1, floor(user_share [0.5] x GPUs)) of the
partition's GPUs, an account max(1, floor(account_share [0.75] x GPUs)); a share left
out (`user_share = false`) caps nobody at that level. Slurm enforces them as the
partition QOS's MaxTRESPerUser / MaxTRESPerAccount on gres/gpu (which counts typed and
untyped requests alike), so the user's next job waits with QOSMaxGRESPerUser while
others' start; nothing running is stopped.

The on/off state is kept in Slurm itself, as whether the partition's QOS carries a
gres/gpu per-user or per-account limit: every process that syncs (the daemon, an
admin's `limits sync`, `slurm check --sync`) reads the same state, it survives
restarts of all of them, and it cannot disagree with what Slurm enforces. The QOS is
gpucredit's to manage (docs/limits-sync.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = ["ScarcityDecision", "ScarcityPolicy", "decide"]


def _share(section: dict[str, Any], key: str) -> Fraction:
    raw = section.get(key)
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"scarcity.{key} must be a number between 0 and 1, not {raw!r}")
    try:
        value = Fraction(str(raw))
    except ValueError:
        raise ValueError(f"scarcity.{key} must be a number between 0 and 1, not {raw!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"scarcity.{key} must be above 0 and at most 1, not {raw!r}")
    return value


def _optional_share(section: dict[str, Any], key: str) -> Fraction | None:
    return None if section.get(key) in (None, False) else _share(section, key)


@dataclass(frozen=True)
class ScarcityPolicy:
    """The `[scarcity]` settings, validated once."""

    engage_above: Fraction
    lift_below: Fraction
    user_share: Fraction | None
    account_share: Fraction | None
    partitions: tuple[str, ...]  # the partitions gpucredit caps (each with a QOS of its own)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ScarcityPolicy:
        section = config["scarcity"]
        engage, lift = _share(section, "engage_above"), _share(section, "lift_below")
        if lift > engage:
            raise ValueError(f"scarcity.lift_below ({lift}) must not exceed scarcity.engage_above ({engage})")
        partitions = section.get("partitions") or []
        if not isinstance(partitions, list) or not all(isinstance(p, str) and p for p in partitions):
            raise ValueError(f"scarcity.partitions must be a list of partition names, not {partitions!r}")
        return cls(
            engage,
            lift,
            _optional_share(section, "user_share"),
            _optional_share(section, "account_share"),
            tuple(partitions),
        )


@dataclass(frozen=True)
class ScarcityDecision:
    partition: str
    gpus: int
    allocated: int
    engaged: bool
    max_per_user: int | None  # None: no cap at that level
    max_per_account: int | None
    reason: str


def _cap(share: Fraction | None, gpus: int) -> int | None:
    return None if share is None else max(1, int(share * gpus))


def _percent(value: Fraction) -> str:
    return f"{int(value * 100)}%"


def decide(
    policy: ScarcityPolicy, partition: str, gpus: int, allocated: int, engaged_now: bool
) -> ScarcityDecision:
    """Caps on or off for one partition, by the table in the module docstring."""
    if gpus <= 0:
        return ScarcityDecision(partition, gpus, allocated, False, None, None, "no GPUs that can take jobs")
    share = Fraction(allocated, gpus)
    figures = f"{allocated} of {gpus} GPUs allocated ({_percent(share)})"
    if engaged_now:
        engaged = share >= policy.lift_below
        why = (
            f"not below {_percent(policy.lift_below)} yet"
            if engaged
            else f"below {_percent(policy.lift_below)}"
        )
    else:
        engaged = share > policy.engage_above
        why = (
            f"more than {_percent(policy.engage_above)}"
            if engaged
            else f"not more than {_percent(policy.engage_above)}"
        )
    if not engaged:
        return ScarcityDecision(partition, gpus, allocated, False, None, None, f"{figures}, {why}: no caps")
    per_user, per_account = _cap(policy.user_share, gpus), _cap(policy.account_share, gpus)
    limits = [f"{n} per {who}" for n, who in ((per_user, "user"), (per_account, "account")) if n is not None]
    until = f"until below {_percent(policy.lift_below)}"
    caps = " and ".join(limits) or "no cap"
    return ScarcityDecision(
        partition, gpus, allocated, True, per_user, per_account, f"{figures}, {why}: at most {caps} {until}"
    )
