"""The fixed world the synthetic feed is drawn from: cardholders, merchants and their habits.

Everything here is a pure function of the seed and the sizes, so every arrival date of one run (and of
a rerun) sees the same customers and merchants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.contracts import (
    CHANNELS,
    COUNTRIES,
    CURRENCY_PER_USD,
    HOME_COUNTRIES,
    MERCHANT_CATEGORIES,
)

# Share of cardholders per home country (same order as HOME_COUNTRIES).
HOME_COUNTRY_SHARE = np.array([0.34, 0.12, 0.10, 0.09, 0.06, 0.06, 0.04, 0.06, 0.05, 0.03, 0.03, 0.02])

# Per merchant category: log-mean of the amount in USD, its log-sd, the channel mix
# (pos, contactless, online, atm), the share of merchants in that category, and how attractive the
# category is to fraudsters (resellable goods, cash, travel).
CATEGORY_PROFILE: dict[str, tuple[float, float, tuple[float, float, float, float], float, float]] = {
    "grocery": (np.log(42.0), 0.55, (0.45, 0.50, 0.05, 0.0), 0.20, 0.3),
    "fuel": (np.log(55.0), 0.35, (0.70, 0.30, 0.00, 0.0), 0.08, 0.6),
    "restaurant": (np.log(36.0), 0.60, (0.40, 0.55, 0.05, 0.0), 0.17, 0.3),
    "retail": (np.log(68.0), 0.80, (0.45, 0.30, 0.25, 0.0), 0.16, 0.8),
    "pharmacy": (np.log(24.0), 0.60, (0.45, 0.50, 0.05, 0.0), 0.06, 0.2),
    "subscription": (np.log(18.0), 0.50, (0.00, 0.00, 1.00, 0.0), 0.06, 0.5),
    "electronics": (np.log(240.0), 0.90, (0.35, 0.10, 0.55, 0.0), 0.07, 4.0),
    "travel": (np.log(380.0), 0.90, (0.15, 0.05, 0.80, 0.0), 0.05, 2.5),
    "digital_goods": (np.log(28.0), 1.00, (0.00, 0.00, 1.00, 0.0), 0.05, 4.0),
    "jewelry": (np.log(310.0), 1.00, (0.70, 0.10, 0.20, 0.0), 0.02, 3.5),
    "cash_withdrawal": (np.log(120.0), 0.50, (0.00, 0.00, 0.00, 1.0), 0.08, 3.0),
}
assert tuple(CATEGORY_PROFILE) == MERCHANT_CATEGORIES
CATEGORY_LOG_MEAN = np.array([p[0] for p in CATEGORY_PROFILE.values()])
CATEGORY_LOG_SD = np.array([p[1] for p in CATEGORY_PROFILE.values()])
CATEGORY_CHANNEL_MIX = np.array([p[2] for p in CATEGORY_PROFILE.values()])
CATEGORY_SHARE = np.array([p[3] for p in CATEGORY_PROFILE.values()])
CATEGORY_FRAUD_APPEAL = np.array([p[4] for p in CATEGORY_PROFILE.values()])
assert CATEGORY_CHANNEL_MIX.shape[1] == len(CHANNELS)

FAVOURITE_MERCHANTS = 6


@dataclass(frozen=True)
class World:
    # customers
    customer_home: np.ndarray  # index into COUNTRIES
    customer_currency_rate: np.ndarray  # units of the card currency per USD
    customer_currency: np.ndarray  # index into the CURRENCY_PER_USD keys
    customer_spend_offset: np.ndarray  # added to the log amount
    customer_activity: np.ndarray  # relative transaction rate, sums to 1
    customer_favourites: np.ndarray  # (customers, FAVOURITE_MERCHANTS) merchant indices, home country
    # merchants
    merchant_category: np.ndarray  # index into MERCHANT_CATEGORIES
    merchant_country: np.ndarray  # index into COUNTRIES
    merchant_popularity: np.ndarray  # relative, sums to 1
    merchant_fraud_weight: np.ndarray  # relative attractiveness to fraudsters, sums to 1
    merchants_by_country: tuple[np.ndarray, ...]  # merchant indices per country index
    popularity_by_country: tuple[np.ndarray, ...]  # normalised popularity within that country

    @property
    def customers(self) -> int:
        return len(self.customer_home)

    @property
    def merchants(self) -> int:
        return len(self.merchant_category)


def build_world(seed: int, customers: int, merchants: int) -> World:
    """Draw the cardholders and merchants for `seed`; the same arguments give the same world."""
    if customers < 1 or merchants < len(COUNTRIES):
        raise ValueError(
            f"need at least 1 customer and {len(COUNTRIES)} merchants (one per country), "
            f"got customers={customers}, merchants={merchants}"
        )
    rng = np.random.default_rng([seed, 0xC0FFEE])
    home_countries = len(HOME_COUNTRIES)
    currencies = list(CURRENCY_PER_USD)
    home_currency_index = np.array([currencies.index(c) for c in HOME_COUNTRIES.values()])

    customer_home = rng.choice(home_countries, size=customers, p=HOME_COUNTRY_SHARE)
    customer_currency = home_currency_index[customer_home]
    rates = np.array(list(CURRENCY_PER_USD.values()))
    # Activity is heavy-tailed: a few cards transact a lot, most rarely.
    activity = rng.gamma(shape=0.8, scale=1.0, size=customers) + 0.05
    activity /= activity.sum()

    # Merchants: every country gets at least one; cardholder countries get most of them.
    merchant_country = np.concatenate(
        [
            np.arange(len(COUNTRIES)),
            rng.choice(
                len(COUNTRIES),
                size=merchants - len(COUNTRIES),
                p=_merchant_country_share(home_countries),
            ),
        ]
    )
    merchant_category = rng.choice(len(MERCHANT_CATEGORIES), size=merchants, p=CATEGORY_SHARE)
    popularity = rng.pareto(1.5, size=merchants) + 1.0
    popularity /= popularity.sum()
    # A few merchants are fraud magnets (breached checkouts, lax verification).
    magnet = rng.random(merchants) < 0.03
    fraud_weight = popularity * CATEGORY_FRAUD_APPEAL[merchant_category] * np.where(magnet, 25.0, 1.0)
    fraud_weight /= fraud_weight.sum()

    by_country = tuple(np.flatnonzero(merchant_country == c) for c in range(len(COUNTRIES)))
    popularity_by_country = tuple(popularity[m] / popularity[m].sum() for m in by_country)
    favourites = np.empty((customers, FAVOURITE_MERCHANTS), dtype=np.int64)
    for country in range(home_countries):
        who = np.flatnonzero(customer_home == country)
        if who.size:
            favourites[who] = rng.choice(
                by_country[country],
                size=(who.size, FAVOURITE_MERCHANTS),
                p=popularity_by_country[country],
            )
    return World(
        customer_home=customer_home,
        customer_currency_rate=rates[customer_currency],
        customer_currency=customer_currency,
        customer_spend_offset=rng.normal(0.0, 0.35, size=customers),
        customer_activity=activity,
        customer_favourites=favourites,
        merchant_category=merchant_category,
        merchant_country=merchant_country,
        merchant_popularity=popularity,
        merchant_fraud_weight=fraud_weight,
        merchants_by_country=by_country,
        popularity_by_country=popularity_by_country,
    )


def _merchant_country_share(home_countries: int) -> np.ndarray:
    share = np.concatenate(
        [
            HOME_COUNTRY_SHARE * 0.9,
            np.full(len(COUNTRIES) - home_countries, 0.1 / (len(COUNTRIES) - home_countries)),
        ]
    )
    return share / share.sum()
