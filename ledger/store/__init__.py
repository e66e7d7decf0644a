"""The store: where the ledger's rows live and how they are read and written in bulk. It
imports nothing of the ledger but its base modules (errors, money, timeutil).

    models      the mapped classes (the schema, SQLAlchemy 2), UNKNOWN_SUBMIT, HoldStatus
    tables      every table as a Core Table, defined once (accounts_t, holds_t, ...)
    db          engines and sessions for SQLite and PostgreSQL (make_engine, make_sessionmaker)
    schema      create or upgrade the database (upgrade), with the Alembic migrations in
                migrations/ (their module names are Alembic's)
    bulk        many rows in one statement (insert_rows, update_rows, select_many,
                deferred_writes)
    sums        sums that cannot overflow on either store (split_sum, joined)
"""
