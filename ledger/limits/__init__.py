"""The limits: caps per account and user, and the rules a new hold must pass."""
