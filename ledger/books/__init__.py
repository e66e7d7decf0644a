"""The books: the journal, accounts, grants and balances."""
