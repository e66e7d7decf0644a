"""Which provider pays a payment: the one module that knows every provider.

The providers (manual.py, stripe_provider.py) implement `providers.Provider` and import
only providers.py; this module imports them, so no provider imports another or the
registry (providers.py named them itself, a cycle: tests/architecture/test_import_cycles.py).
"""

from __future__ import annotations

from portal.payments.providers import PaymentSettings, Provider


def provider_for(name: str, settings: PaymentSettings) -> Provider:
    """The provider called `name` (a payment's `provider`): Stripe Checkout or the manual
    invoice. Stripe's module, and its SDK, is imported only when a payment needs it."""
    if name == "stripe":
        from portal.payments.stripe_provider import StripeProvider

        return StripeProvider(settings)
    from portal.payments.manual import ManualProvider

    return ManualProvider()
