"""gpucredit's ledger core: money, accounts, grants, holds, journal, prices, limits.

The ledger imports nothing from the other gpucredit packages; they all depend on it.
Importing this package is cheap on purpose (hooks import `ledger.config` with the
stdlib only): the database layer lives in `ledger.store.db`/`ledger.store.models` and is imported
where it is used.

Public operations live in `ledger.api` and take a SQLAlchemy `Session`; they never
commit. The caller owns the transaction (`with Session() as s, s.begin(): ...`).
"""
