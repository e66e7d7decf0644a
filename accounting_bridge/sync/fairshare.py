"""Slurm shares from the ledger's credit and spend: the formula, pure (figures in, shares out).

For a PI, in two sentences: *your account's shares are the credits it bought or was
granted in the last 90 days (or the credit it has left, if that is more), less half of
what it spent in the last 7 days; an account with credit left never gets fewer than a
tenth of the median account's, one with none gets nothing. Inside the account every
member starts at 100 shares, less up to half in proportion to their part of the
account's spend in those 7 days.*

The rule, with the config's names (`[fairshare]`, defaults in brackets)::

    account with no credit left (available + held <= 0)  ->  0
    base    = max(funded, left)                                           (credits)
    claim   = base - damping_percent [50] % x min(spent, base)
    shares  = claim rounded half up to a whole number, then to two significant figures
    floor   = floor_percent [10] % of the median shares of the accounts with credit left
              (the lower middle one of an even count), at least 1, two figures
    shares  = max(shares, floor), at most MAX_SHARES

    member  = member_shares [100] x (1 - damping_percent % x their spend / account's spend)
              member_shares when the account spent nothing; at least 1, two figures

`funded` is what top-ups and grants added with an effective time in the last
funded_days [90]; `left` what the account can still spend or has held now; `spent`
what it was charged in the last spent_days [7] (refunds subtract; never below 0).
The base takes credit left from older grants into account, so an account that bought
a year's credit at once keeps its claim after 90 days. Spend beyond the base damps no
further: a claim never falls below half its base. A median, not a mean, sets the
floor, so a few very large accounts do not lift every small one to the same figure.
Two significant figures keep Slurm quiet: a job's charge does not move an account
from 350 to 349.7 shares, and accounts that round alike share one `sacctmgr` call.

Worked example (the documentation's, and tests/bridge/test_fairshare.py's)::

    account    funded  spent   left    claim                     shares
    physics    400.00  100.00  300.00  400 - 50% x 100 = 350     350
    chemistry  100.00    0.00  100.00  100                       100
    biology      0.00    0.00   50.00  50 (left, from older credit)  50
    geology      0.00    0.00    2.00  2 -> floor                5    (10% of the median, 50)
    history    200.00  250.00    0.00  no credit left            0

Among siblings Slurm normalises these: physics gets 350/505 = 69% of their share,
chemistry 20%, biology 10%, geology 1%, history none. Inside physics, alice (75.00 of
its 100.00 spend), bob (25.00) and carol (nothing) get 100 - 50% x 75% = 62.5 -> 63,
88 and 100.

Through the tree (ledger/books/tree.py). Fair Tree ranks siblings level by level, so
each account's figures are its subtree's: funded, spent and left summed over the
account and every account below it, and the formula (floor included) runs once per set
of siblings, the children of one parent, which are the only ones Slurm compares. A
department that holds no credit itself gets the shares its groups' credit earns, not 0;
a flat ledger (every account top level) is one set of siblings, as before. Worked tree
(docs/fairshare.md; tests/test_fairshare_tree.py)::

    level  account  own credit  subtree left  shares  normalised among its siblings
    1      dept          0.00        110.00     110   110/160 = 69%
    2        grpa      100.00        100.00     100   100/110 = 91% of dept's
    2        grpb       10.00         10.00      10    10/110 =  9% of dept's
    1      ext          50.00         50.00      50    50/160 = 31%
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ledger import api
from ledger.money import format_credits

__all__ = ["MAX_SHARES", "FairsharePolicy", "Shares", "account_shares", "subtree_figures", "two_figures"]

UCREDITS_PER_CREDIT = 1_000_000
# Slurm keeps RawShares in 32 bits and reads 0x7fffffff as "parent": stay well below.
MAX_SHARES = 1_000_000_000


@dataclass(frozen=True)
class FairsharePolicy:
    """The formula's knobs (config `[fairshare]`), validated once."""

    funded_days: int = 90
    spent_days: int = 7
    damping_percent: int = 50
    floor_percent: int = 10
    member_shares: int = 100

    def __post_init__(self) -> None:
        bounds = {
            "funded_days": (1, 3660),
            "spent_days": (1, 3660),
            "damping_percent": (0, 100),
            "floor_percent": (0, 100),
            "member_shares": (1, 1_000_000),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(
                    f"fairshare.{name} must be a whole number from {low} to {high}, got {value!r}"
                )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FairsharePolicy:
        return cls(**config["fairshare"])


@dataclass(frozen=True)
class Shares:
    """What one association (an account, or a user in it) should have, and why."""

    account: str
    user: str | None  # None: the account's own association
    shares: int
    why: str
    parent: str | None = None  # the association's parent: an account's parent (None: top level),
    depth: int = 0  # a user's account; 0: top level (a child of Slurm's root)


def _half_up(numerator: int, denominator: int) -> int:
    return (2 * numerator + denominator) // (2 * denominator)


def two_figures(numerator: int, denominator: int = 1) -> int:
    """numerator/denominator (>= 0) rounded half up to a whole number below 100, else to
    two significant figures: 7.4 -> 7, 349.7 -> 350, 1234 -> 1200."""
    if numerator < 0 or denominator <= 0:
        raise ValueError("two_figures takes a non-negative ratio")
    whole = numerator // denominator
    if whole < 100:
        return _half_up(numerator, denominator)
    unit = 10 ** (len(str(whole)) - 2)
    return _half_up(numerator, denominator * unit) * unit


def subtree_figures(inputs: Iterable[api.FairnessInputs]) -> dict[str, api.FairnessInputs]:
    """Each account's figures summed over its subtree (itself and every account below),
    by name; members' spend stays the account's own. A parent no input names is taken
    as the top level. One pass up the tree, whatever its shape."""
    own = {figures.account: figures for figures in inputs}
    parents = {name: (f.parent if f.parent in own else None) for name, f in own.items()}
    sums = {name: [f.funded_ucredits, f.spent_ucredits, f.left_ucredits] for name, f in own.items()}
    for name, _depth in reversed(api.tree_order(parents)):  # children before their parents
        parent = parents[name]
        if parent is not None:
            for index, value in enumerate(sums[name]):
                sums[parent][index] += value
    return {
        name: api.FairnessInputs(
            account=name,
            funded_ucredits=sums[name][0],
            spent_ucredits=sums[name][1],
            left_ucredits=sums[name][2],
            member_spent_ucredits=figures.member_spent_ucredits,
            parent=parents[name],
        )
        for name, figures in own.items()
    }


def account_shares(inputs: Iterable[api.FairnessInputs], policy: FairsharePolicy) -> list[Shares]:
    """Every account's shares, from its subtree's figures, each followed by its members'
    (by name); accounts depth first through the tree, siblings by name."""
    own = {figures.account: figures for figures in inputs}
    totals = subtree_figures(own.values())
    parents = {name: figures.parent for name, figures in totals.items()}
    order = api.tree_order(parents)
    below = dict.fromkeys(parents, 0)  # how many accounts each has under it
    for name, _depth in reversed(order):
        parent = parents[name]
        if parent is not None:
            below[parent] += below[name] + 1
    level: dict[str, Shares] = {}
    for siblings in api.children_of(parents).values():
        for shares in _sibling_shares([totals[name] for name in siblings], below, policy):
            level[shares.account] = shares
    result: list[Shares] = []
    for name, depth in order:
        shares = level[name]
        result.append(Shares(name, None, shares.shares, shares.why, parents[name], depth))
        # a user's association sits under its account, one level deeper
        result.extend(replace(m, parent=name, depth=depth + 1) for m in _member_shares(own[name], policy))
    return result


def _sibling_shares(
    siblings: list[api.FairnessInputs], below: dict[str, int], policy: FairsharePolicy
) -> list[Shares]:
    """The formula for one set of siblings (figures of their subtrees; `below`: how many
    accounts each has under it)."""
    damping = policy.damping_percent
    claims: dict[str, tuple[int, str]] = {}
    for figures in siblings:
        if figures.left_ucredits <= 0:
            continue
        base = max(figures.funded_ucredits, figures.left_ucredits)
        damped = min(max(figures.spent_ucredits, 0), base)
        claim_x100 = base * 100 - damping * damped  # micro-credits x 100
        shares = two_figures(claim_x100, 100 * UCREDITS_PER_CREDIT)
        funded = f"funded {format_credits(figures.funded_ucredits)} in {policy.funded_days} d"
        if base > figures.funded_ucredits:
            funded = f"{format_credits(base)} left (more than {funded})"
        why = f"{funded} - {damping}% of {format_credits(damped)} spent in {policy.spent_days} d"
        claims[figures.account] = (shares, _subtree_note(below[figures.account]) + why)
    ordered = sorted(shares for shares, _why in claims.values())
    median = ordered[(len(ordered) - 1) // 2] if ordered else 0
    floor = max(1, two_figures(median * policy.floor_percent, 100))
    result: list[Shares] = []
    for figures in siblings:
        if figures.account not in claims:
            left = format_credits(figures.left_ucredits)
            note = _subtree_note(below[figures.account])
            result.append(Shares(figures.account, None, 0, f"{note}no credit left ({left})"))
            continue
        shares, why = claims[figures.account]
        if shares < floor:
            sibling = "account's" if figures.parent is None else "sibling's"
            shares, why = (
                floor,
                f"floor: {policy.floor_percent}% of the median {sibling} {median} (own claim {shares})",
            )
        if shares > MAX_SHARES:
            shares, why = MAX_SHARES, f"at most {MAX_SHARES} ({why})"
        result.append(Shares(figures.account, None, shares, why))
    return result


def _subtree_note(accounts_below: int) -> str:
    if not accounts_below:
        return ""
    return f"subtree of {accounts_below + 1} accounts: "


def _member_shares(figures: api.FairnessInputs, policy: FairsharePolicy) -> list[Shares]:
    account_spent = max(figures.spent_ucredits, 0)
    members = []
    for user, user_spent in sorted(figures.member_spent_ucredits.items()):
        base = policy.member_shares
        if account_spent == 0:
            members.append(Shares(figures.account, user, base, f"{base}: the account spent nothing"))
            continue
        part = min(max(user_spent, 0), account_spent)
        shares = two_figures(
            base * (100 * account_spent - policy.damping_percent * part), 100 * account_spent
        )
        percent = _half_up(100 * part, account_spent)
        why = f"{base} - {policy.damping_percent}% x {percent}% of the account's spend"
        members.append(Shares(figures.account, user, max(shares, 1), why))
    return members
