"""gpucredit's ledger: money, in layers, each a sub-package that imports only those below::

    store/     tables, engines and sessions, the schema and its migrations, bulk writes
    books/     the journal, accounts and members, grants (the burn order), balances,
               checkpoints, idempotency, payments, the audit
    limits/    the caps and the rules that hold a job to them
    pricing/   prices, quotes, routing, job_submit's in-memory snapshot
    holds/     the hold rules, by act (create, usage, resolve, expire, adjustments, ...),
               their batches, leases, cost so far, outage bounds
    views/     read models: reports, history, efficiency, totals, fairshare inputs, Slurm
               enforcement, /metrics counters
    jobs/      the bridge's job runs and cursors
    access/    roles, portal logins, API tokens

    api.py     the public surface: every read and change of money, one name per act
    cli.py     the ledger's commands (cli_support.py: what every command shares)
    errors.py  every expected failure, with its code and HTTP and exit statuses
    money.py   integer micro-credits; timeutil.py: aware UTC times; config.py: settings

tests/architecture/test_boundaries.py holds the layers (its FLOOR_PLAN) and the boundary: the ledger
imports nothing from the other gpucredit packages, and they read and change money
through ledger.api and a few plumbing modules only. Importing this package is cheap on
purpose (hooks import `ledger.config` with the stdlib only): the database layer is
imported where it is used.

Functions take a SQLAlchemy `Session` and never commit: the caller owns the transaction
(`with Session() as s, s.begin(): ...`).
"""
