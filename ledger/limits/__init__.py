"""The limits: each account's and member's caps, and the rules that hold a job to them.
On top of the books.

    caps    the caps as stored: at most N GPUs at once, a spend rate, a daily spend
            (Limits, set_limits, show_limits, limits_of)
    rules   what a new hold must pass and what job_submit tells before the job exists
            (check_limits, limit_breach, static_limit_breach, capped_usage, Usage)

The daily caps that running jobs cross, which the meter watches, need the running jobs'
cost so far, so they live with the holds (ledger.holds.overruns).
"""
