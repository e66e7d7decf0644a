"""How bought credit gets paid: the payment settings and the provider interface.

A payment is opened pending (not spendable); its provider then says how the buyer
pays it. `manual`: an invoice, paid when an admin marks it paid. `stripe`: a Checkout
Session the buyer is redirected to, paid when Stripe's signed webhook says so.

Prices in money are integers in the currency's smallest unit ("cents"): one credit
costs `payments.unit_amount_cents`, so an amount of credit costs a whole number of
cents or it is refused; floats never carry money here either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

from flask import Flask

from ledger.errors import InvalidInput, LedgerError
from ledger.money import format_credits

UCREDITS_PER_CREDIT = 1_000_000
PROVIDERS = ("manual", "stripe")
PAYMENTS_DEFAULTS: dict[str, Any] = {
    "provider": "manual",
    "currency": "usd",  # ISO 4217, lower case, as Stripe spells it
    "unit_amount_cents": 100,  # price of one credit in the currency's smallest unit
}
STRIPE_DEFAULTS: dict[str, Any] = {
    "secret_key": None,  # sk_live_... / sk_test_...: creates Checkout Sessions
    "webhook_secret": None,  # whsec_...: verifies the Stripe-Signature header
    "api_base": None,  # another address for Stripe's API (tests run a fake there)
    "tolerance_seconds": 300,  # older signed timestamps are refused (replays of old deliveries)
    "timeout_seconds": 10,  # one API call, network included
}
# Stripe's currencies whose smallest unit is the unit itself (their "cents" are whole yen).
ZERO_DECIMAL_CURRENCIES = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf"}
    | {"xof", "xpf"}
)
# Secrets may stay out of the TOML file, which every hook reads.
STRIPE_SECRETS_FROM_ENV = {
    "secret_key": "GPUCREDIT_STRIPE_SECRET_KEY",
    "webhook_secret": "GPUCREDIT_STRIPE_WEBHOOK_SECRET",
}


class PaymentProviderError(LedgerError):
    """The payment provider refused or could not be reached; nothing was opened."""

    code = "payment_provider_error"
    http_status = 502


@dataclass(frozen=True)
class StripeSettings:
    secret_key: str | None
    webhook_secret: str | None
    api_base: str | None
    tolerance_seconds: int
    timeout_seconds: float


@dataclass(frozen=True)
class PaymentSettings:
    provider: str
    currency: str
    unit_amount_cents: int
    stripe: StripeSettings

    def cents_for(self, amount_ucredits: int) -> int:
        """What `amount_ucredits` costs, refused unless it is a whole number of cents."""
        cents, rest = divmod(amount_ucredits * self.unit_amount_cents, UCREDITS_PER_CREDIT)
        if rest or cents <= 0:
            raise InvalidInput(
                f"{format_credits(amount_ucredits)} credits do not cost a whole number of cents "
                f"at {self.unit_amount_cents} cents per credit",
                code="invalid_amount",
                details={
                    "value": format_credits(amount_ucredits),
                    "unit_amount_cents": self.unit_amount_cents,
                },
            )
        return cents

    def credit_price(self) -> str:
        """What one credit costs, for people: "1.00 USD" (zero-decimal currencies: "100 JPY")."""
        code = self.currency.upper()
        if self.currency in ZERO_DECIMAL_CURRENCIES:
            return f"{self.unit_amount_cents} {code}"
        whole, cents = divmod(self.unit_amount_cents, 100)
        return f"{whole}.{cents:02d} {code}"

    def ucredits_for(self, cents: int) -> int | None:
        """The credit `cents` buy, or None when they buy no whole micro-credit."""
        ucredits, rest = divmod(cents * UCREDITS_PER_CREDIT, self.unit_amount_cents)
        return None if rest else ucredits


def payment_settings(app: Flask) -> PaymentSettings:
    """The `[payments]` table of the gpucredit configuration, checked, with defaults."""
    raw = {**PAYMENTS_DEFAULTS, **app.config["GPUCREDIT"].get("payments", {})}
    stripe = {**STRIPE_DEFAULTS, **(raw.get("stripe") or {})}
    for key, variable in STRIPE_SECRETS_FROM_ENV.items():
        stripe[key] = os.environ.get(variable) or stripe[key]
    provider = str(raw["provider"])
    currency = str(raw["currency"]).lower()
    unit = raw["unit_amount_cents"]
    if provider not in PROVIDERS:
        raise ValueError(f"payments.provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    if not re.fullmatch(r"[a-z]{3}", currency):
        raise ValueError(f"payments.currency must be a three-letter ISO 4217 code, not {currency!r}")
    if not isinstance(unit, int) or isinstance(unit, bool) or unit <= 0:
        raise ValueError(f"payments.unit_amount_cents must be a positive integer, not {unit!r}")
    return PaymentSettings(
        provider=provider,
        currency=currency,
        unit_amount_cents=unit,
        stripe=StripeSettings(
            secret_key=stripe["secret_key"],
            webhook_secret=stripe["webhook_secret"],
            api_base=stripe["api_base"],
            tolerance_seconds=int(stripe["tolerance_seconds"]),
            timeout_seconds=float(stripe["timeout_seconds"]),
        ),
    )


@dataclass(frozen=True)
class Checkout:
    """Where the buyer pays (None: nothing to visit, e.g. an invoice), and the
    provider's name for it (stored on the payment)."""

    url: str | None
    external_id: str | None = None


class Provider(Protocol):
    """Starts paying one pending payment. It runs outside any ledger transaction: a
    slow provider must never hold an account's lock (or SQLite's write lock)."""

    name: str

    def start(self, payment: dict[str, Any], *, success_url: str, cancel_url: str) -> Checkout:
        """Called again for a payment it started (a replayed request): the same checkout."""
        ...
