"""The books: accounts, the credit they hold, and the journal every change of it is written
to. On top of the store only.

    journal      the append-only journal: entries whose postings sum to zero, hash-chained
                 per account (post, post_many, post_batch, entries_page, LockedAccount,
                 Leg, EntryDraft, the system accounts)
    accounts     customer accounts and their members (create_account, add_member, members,
                 lock_account, lock_accounts, read_account, check_name)
    tree         the account tree, as Slurm's (account_parents, set_parent, set_parents,
                 subtree, ancestors, tree_order)
    transfers    credit from one account to another, burn order kept (transfer)
    grants       credit: top-ups, grants and refunds, the burn order (topup, grant, consume,
                 create_grant, take_free, available_now, expire_grants, pay_debt, GrantState)
    balance      what is spendable and held, now or at any time (balance, account_summary,
                 available_credit)
    checkpoints  balance checkpoints, so a balance at any time reads no whole journal
                 (checkpoint_balances, sums_at)
    credit_use   how much of an account's credit is used (credit_use, CreditUse, parse_share)
    idempotency  keyed requests: a repeat returns the first result (once, replay, remember)
    payments     credit bought, pending until paid (open_payment, mark_paid, cancel_payment)
    audit        every chain, projection and checkpoint recomputed from the journal (verify),
                 and one account's journal for an auditor (journal_entries)
"""
