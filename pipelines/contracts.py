"""Column contracts of the landing feeds, shared by the generator, ingestion and validation.

Plain Python on purpose: Spark schemas built from these live in the Spark I/O layer, so importing the
contract costs nothing.
"""

from __future__ import annotations

TRANSACTION_COLUMNS: tuple[str, ...] = (
    "transaction_id",
    "customer_id",
    "merchant_id",
    "amount",
    "currency",
    "country",
    "channel",
    "merchant_category",
    "event_timestamp",
)
# A transaction without one of these cannot be used at all.
REQUIRED_TRANSACTION_COLUMNS: tuple[str, ...] = (
    "transaction_id",
    "customer_id",
    "merchant_id",
    "amount",
    "currency",
    "event_timestamp",
)
LABEL_COLUMNS: tuple[str, ...] = ("transaction_id", "is_fraud", "label_timestamp")

CHANNELS: tuple[str, ...] = ("pos", "contactless", "online", "atm")

# Card billing currencies, and units of each per US dollar (fixed reference rates, not market data).
CURRENCY_PER_USD: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "CAD": 1.36,
    "AUD": 1.52,
    "CHF": 0.88,
    "SGD": 1.34,
    "NZD": 1.65,
}
# Country (ISO 3166-1 alpha-2) -> home currency, for countries where cardholders live.
HOME_COUNTRIES: dict[str, str] = {
    "US": "USD",
    "GB": "GBP",
    "DE": "EUR",
    "FR": "EUR",
    "ES": "EUR",
    "IT": "EUR",
    "NL": "EUR",
    "CA": "CAD",
    "AU": "AUD",
    "CH": "CHF",
    "SG": "SGD",
    "NZ": "NZD",
}
# Countries with merchants but no cardholders in the synthetic portfolio.
MERCHANT_ONLY_COUNTRIES: tuple[str, ...] = ("BR", "NG", "RO", "ID", "VN", "TH", "MX", "TR")
COUNTRIES: tuple[str, ...] = (*HOME_COUNTRIES, *MERCHANT_ONLY_COUNTRIES)

MERCHANT_CATEGORIES: tuple[str, ...] = (
    "grocery",
    "fuel",
    "restaurant",
    "retail",
    "pharmacy",
    "subscription",
    "electronics",
    "travel",
    "digital_goods",
    "jewelry",
    "cash_withdrawal",
)
# Amounts are billing amounts in the card's currency; anything outside this range is out of range.
AMOUNT_MIN_EXCLUSIVE = 0.0
AMOUNT_MAX = 50_000.0
