"""The hold rules: a reservation for one job run, resolved exactly once. On top of the
books, the limits and pricing. By act:

    request      a hold request (HoldRequest) and the same checked (CheckedHoldRequest)
    create       taking a hold: limits, credit, earmarks in burn order (create_hold);
                 a heterogeneous job's parts together (create_holds_together); the
                 refusal a hold would get now (hold_refusal)
    usage        provisional charges for time run (hold_usage; the meter's hold_usage_many)
    resolve      settled or released, once (settle_hold, release_hold)
    expire       past the time limit and grace (expire_holds); an account's upkeep (sweep)
    adjustments  corrections of a run's charge (adjust_hold, adjust_holds) and an admin's
                 correction linked to an entry (adjust)
    unreserved   runs no hook reserved, charged once (record_unreserved_run[s])
    charges      how every change of a hold's charge moves credit (Charge, plan_charge,
                 apply_charge, draw, refund): the money rules the acts share
    state        a hold as read (HoldState) and the reads (get_hold, find_hold,
                 find_active_hold, list_holds, holds_page, list_active_runs)
    batch        many holds and settles in a few statements, for the daemon's group commit
                 (lock_batch, create_holds, settle_holds, apply_holds_and_settles)
    keyed        the acts for callers with an idempotency key (the CLI, the HTTP API)
    leases       lease mode: a hold that covers a window the meter renews (renew_leases)
    accrual      running jobs' cost so far, on read (cost_so_far, accruals, set_accrual)
    overruns     the daily caps running jobs have crossed (daily_cap_overruns)
    bounds       how much an outage can overspend (current_outage_bound, outage_prices)

Names the acts share inside the package (public here, not in ledger.api): state's
hold_query, to_state, lock_hold; request's check_job, submit_time, lease_window;
charges' Allocation, load_allocations, save_allocations_many; create's same_run,
run_conflict, new_hold, earmark, earmark_rows, hold_amount, hold_fields, hold_memo;
resolve's settlement_of; adjustments' grants_of_accounts.
"""
