"""docs/design.md §6, the worked example, step by step with every figure exact, on both stores."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ledger import api
from ledger.errors import LimitExceeded
from ledger.store.tables import entries_t

T = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def test_worked_example(tx) -> None:
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=datetime(2026, 11, 1, tzinfo=UTC))
        api.grant(
            s,
            "physics",
            "20",
            effective_at=datetime(2026, 12, 1, tzinfo=UTC),
            expires_at=datetime(2026, 12, 8, tzinfo=UTC),
        )
        api.set_limits(s, "physics", user="alice", max_gpus=4, max_rate="0.005", daily_cap="30")

    # 1: 2×H100 for 2 h: hold 14.4, all earmarked on the promotion (it expires first).
    with tx() as s:
        h1 = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1001, gpus="h100:2", seconds=7200, cluster="lab", at=T
            ),
        )
    assert (h1.amount_ucredits, h1.rate_ucredits_per_hour) == (14_400_000, 7_200_000)
    with tx() as s:
        grants = {g["source"]: g for g in api.balance(s, "physics", T)["grants"]}
        assert api.balance(s, "physics", T)["held"] == "14.40"
    assert grants["grant"]["remaining"] == "20.00"

    # 2: 2×A100 for 4 h is refused by the daily cap: 14.4 + 16.0 = 30.4 > 30.
    with tx() as s, pytest.raises(LimitExceeded) as refused:
        api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1002, gpus="a100:2", seconds=4 * 3600, cluster="lab", at=T
            ),
        )
    assert refused.value.code == "daily_cap"
    assert refused.value.http_status == 429
    assert (refused.value.details["value"], refused.value.details["cap"]) == ("30.40", "30.00")
    assert "30.40" in refused.value.message and "30.00" in refused.value.message

    # 3: with 3 h it fits: hold 12.0 = 5.6 promotion + 6.4 top-up; alice burns 0.003111/s.
    with tx() as s:
        h2 = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1002, gpus="a100:2", seconds=3 * 3600, cluster="lab", at=T
            ),
        )
    assert h2.amount_ucredits == 12_000_000
    with tx() as s:
        b = api.balance(s, "physics", T)
    assert (b["available"], b["held"]) == ("93.60", "26.40")
    with tx() as s:
        from ledger.holds.charges import load_allocations as _load_allocations

        earmarks = {g: a.earmarked_ucredits for g, a in _load_allocations(s, h2.id).items()}
    assert sorted(earmarks.values()) == [5_600_000, 6_400_000]

    # 4: one more H100 breaks the GPU cap (5 > 4) although rate and daily cap would pass.
    with tx() as s, pytest.raises(LimitExceeded) as refused:
        api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1003, gpus="h100:1", seconds=3600, cluster="lab", at=T
            ),
        )
    assert refused.value.code == "concurrent_gpus"
    assert (refused.value.details["value"], refused.value.details["cap"]) == (5, 4)

    # 5 and 6: the runs end; each charge comes out of the promotion, the rest returns.
    with tx() as s:
        done1 = api.settle_hold(s, h1.id, 1800)
    assert (done1.state, done1.charged_ucredits) == ("settled", 3_600_000)
    with tx() as s:
        done2 = api.settle_hold(s, h2.id, 3600)
    assert (done2.state, done2.charged_ucredits) == ("settled", 4_000_000)

    # 7: balance at 12:00Z: 112.4 = promotion 12.4 + top-up 100.0.
    with tx() as s:
        b = api.balance(s, "physics", datetime(2026, 12, 2, 12, tzinfo=UTC))
    assert (b["available"], b["held"]) == ("112.40", "0.00")
    assert {g["source"]: g["remaining"] for g in b["grants"]} == {"grant": "12.40", "topup": "100.00"}

    # 8: a week later the promotion's 12.4 has expired: 100.0.
    with tx() as s:
        b = api.balance(s, "physics", datetime(2026, 12, 9, tzinfo=UTC))
    assert b["available"] == "100.00"
    assert [g["source"] for g in b["grants"]] == ["topup"]

    # 9: sacct says job 1001 ran 1802 s: one adjustment of +0.004 linked to its charge.
    with tx() as s:
        settle_entry = s.execute(
            entries_t.select().where(entries_t.c.hold_id == h1.id, entries_t.c.kind == "settle")
        ).one()
        result = api.adjust(
            s,
            "physics",
            "0.004",
            links_entry_id=settle_entry.id,
            reason="sacct elapsed 1802 s",
            at=datetime(2026, 12, 2, 12, 5, tzinfo=UTC),
        )
    assert result["adjustment"] == "0.004"
    assert result["hold"]["charged"] == "3.604"
    with tx() as s:
        adjustment = s.execute(entries_t.select().where(entries_t.c.kind == "adjust")).one()
        assert adjustment.links_entry_id == settle_entry.id
        assert api.balance(s, "physics", datetime(2026, 12, 2, 13, tzinfo=UTC))["available"] == "112.396"
        assert api.verify(s).ok
