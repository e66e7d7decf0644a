"""Expected failures of the ledger: domain exceptions with stable codes.

    LedgerError                      code, message, details, http_status
    ├── InvalidInput         422     invalid_amount, invalid_time, invalid_duration,
    │                                invalid_gpus, unknown_gres, invalid_limit,
    │                                unknown_parent, parent_cycle, parent_other_cluster, ...
    ├── NotFound             404     not_found
    ├── Conflict             409     already_exists, hold_resolved
    │   └── IdempotencyConflict      idempotency_conflict
    ├── InsufficientCredits  402     insufficient_credits
    └── LimitExceeded        429     concurrent_gpus, spend_rate, daily_cap

Every refusal names the limit, the current value and the cap in `details`, and its
message says the same in words. The CLI maps InvalidInput to exit status 2 (bad
usage) and every other LedgerError to 1 (refused); HTTP uses `http_status`.
"""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    code = "ledger_error"
    http_status = 400

    def __init__(
        self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or {}

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(LedgerError):
    code = "invalid_input"
    http_status = 422  # well-formed request, values the ledger cannot take


class NotFound(LedgerError):
    code = "not_found"
    http_status = 404


class Conflict(LedgerError):
    code = "conflict"
    http_status = 409


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"


class InsufficientCredits(LedgerError):
    code = "insufficient_credits"
    http_status = 402


class LimitExceeded(LedgerError):
    http_status = 429

    def __init__(self, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(message, code=code, details=details)
