"""Drift of the model's inputs and score against the champion's training reference. Pure functions over
arrays and DataFrames: no paths, no clock, no MLflow.

Two tests per numeric input, one per categorical input:

- **PSI** (population stability index), sum over bins of (a - e) * ln(a / e), where e is a bin's share
  of the reference and a its share of the current rows.
  - Numeric bins are the reference's quantiles: `bins - 1` inner edges at the 1/bins .. (bins-1)/bins
    quantiles of its non-null values, bins right-closed ((-inf, q1], (q1, q2], ..., (qk, inf)). Tied
    quantiles (a discrete feature, or one value taking more than a bin's share) collapse into one edge,
    so such a feature has fewer, unequal bins. A constant c gets three: below c, c itself, above c, so a
    shift either way shows.
  - Nulls (NaN) are a bin of their own, on both sides: a feature that starts arriving empty has drifted.
  - Categorical bins are the values seen on either side (nulls again their own bin).
  - An empty bin on one side would make ln(a / e) infinite: every share is floored at EPSILON (1e-4, a
    hundredth of a percent) before the sum, so a bin that is empty on both sides adds exactly 0 and one
    that empties or appears adds a large but finite amount. Shares are not renormalised after flooring.
- **KS**, the two-sample Kolmogorov-Smirnov statistic (scipy.stats.ks_2samp): the largest gap between
  the two empirical CDFs. Nulls rank below every value (they are replaced by a number below both sides'
  minimum; KS depends on ranks only), so a moved null share is a gap in the CDFs as it is a bin in PSI.
  None where one side has no rows at all.

A numeric input (or the score) drifted when PSI > psi_threshold AND KS > ks_threshold. The two measure
different things and err differently: PSI sums every bin's change (many small moves add up, and on a
few hundred rows each bin's share is noisy), KS is the single largest CDF gap (blind to changes in the
tails that PSI's log ratio magnifies); requiring both keeps the alerts to shifts both see. A categorical
input drifted when PSI > psi_threshold. The check drifted when at least `min_drifted` inputs did; with fewer
than `min_rows` current (or reference) rows there is no verdict ("insufficient").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from core.settings import MonitoringSettings

EPSILON = 1e-4
InputKind = Literal["numeric", "categorical", "score"]
Verdict = Literal["drift", "no_drift", "insufficient"]


@dataclass(frozen=True)
class InputDrift:
    """One input's comparison: the figures and whether it counts as drifted."""

    name: str
    kind: InputKind
    psi: float
    ks: float | None  # None: categorical, or one side without rows
    drifted: bool
    rows: int
    reference_rows: int
    null_share: float
    reference_null_share: float

    def describe(self) -> str:
        """`log_amount_usd PSI 0.43 KS 0.31`: how the reason texts and asset events name it."""
        ks = "" if self.ks is None else f" KS {self.ks:.2f}"
        return f"{self.name} PSI {self.psi:.2f}{ks}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DriftReport:
    """The verdict over every input compared, and why."""

    verdict: Verdict
    inputs: tuple[InputDrift, ...]
    rows: int
    reference_rows: int
    reason: str

    @property
    def drifted(self) -> tuple[InputDrift, ...]:
        return tuple(i for i in self.inputs if i.drifted)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "rows": self.rows,
            "reference_rows": self.reference_rows,
            "reason": self.reason,
            "inputs": [i.to_dict() for i in self.inputs],
        }


def quantile_edges(reference: np.ndarray, bins: int) -> np.ndarray:
    """The inner bin edges of a numeric input: the reference's 1/bins .. (bins-1)/bins quantiles of its
    non-null values, ties collapsed (see the module docstring). Empty for a reference without values."""
    values = _finite(reference)
    if len(values) == 0:
        return np.zeros(0)
    edges = np.unique(np.quantile(values, np.arange(1, bins) / bins))
    if len(edges) == 1 and values.min() == values.max():
        # A constant: values below it need a bin apart from the constant's own, or a shift down would hide.
        edges = np.array([np.nextafter(edges[0], -np.inf), edges[0]])
    return edges


def bin_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Shares of `values` per right-closed bin of `edges` (len(edges) + 1 bins), then the null bin last.
    All zeros for an empty array."""
    values = np.asarray(values, dtype="float64")
    if len(values) == 0:
        return np.zeros(len(edges) + 2)
    null = np.isnan(values)
    index = np.searchsorted(edges, values[~null], side="left")  # e_{i-1} < x <= e_i -> bin i
    counts = np.bincount(index, minlength=len(edges) + 1).astype("float64")
    return np.append(counts, null.sum()) / len(values)


def psi_of_shares(expected: np.ndarray, actual: np.ndarray) -> float:
    """PSI of two share vectors over the same bins, each share floored at EPSILON."""
    e, a = np.maximum(expected, EPSILON), np.maximum(actual, EPSILON)
    return float(np.sum((a - e) * np.log(a / e)))


def psi(reference: np.ndarray, current: np.ndarray, bins: int) -> float:
    """PSI of a numeric input, on the reference's quantile bins plus a null bin."""
    edges = quantile_edges(np.asarray(reference, dtype="float64"), bins)
    return psi_of_shares(bin_shares(reference, edges), bin_shares(current, edges))


def categorical_psi(reference: pd.Series, current: pd.Series) -> float:
    """PSI of a categorical input over the values seen on either side, nulls as their own value."""
    import pandas as pd

    ref = reference.astype("object").where(reference.notna(), None)
    cur = current.astype("object").where(current.notna(), None)
    values = pd.Index(pd.concat([ref, cur], ignore_index=True).fillna("\x00null").unique())
    ref_shares = ref.fillna("\x00null").value_counts(normalize=True).reindex(values, fill_value=0.0)
    cur_shares = cur.fillna("\x00null").value_counts(normalize=True).reindex(values, fill_value=0.0)
    return psi_of_shares(ref_shares.to_numpy(dtype="float64"), cur_shares.to_numpy(dtype="float64"))


def ks_statistic(reference: np.ndarray, current: np.ndarray) -> float | None:
    """The two-sample KS statistic, nulls ranked below every value; None when one side has no rows."""
    from scipy.stats import ks_2samp  # type: ignore[import-untyped]  # no stubs in the lock

    ref = np.asarray(reference, dtype="float64")
    cur = np.asarray(current, dtype="float64")
    if len(ref) == 0 or len(cur) == 0:
        return None
    finite = np.concatenate([_finite(ref), _finite(cur)])
    below = finite.min() - 1.0 if len(finite) else 0.0
    return float(ks_2samp(np.nan_to_num(ref, nan=below), np.nan_to_num(cur, nan=below)).statistic)


def numeric_drift(
    name: str,
    reference: np.ndarray,
    current: np.ndarray,
    settings: MonitoringSettings,
    kind: InputKind = "numeric",
) -> InputDrift:
    reference = np.asarray(reference, dtype="float64")
    current = np.asarray(current, dtype="float64")
    value = psi(reference, current, settings.bins)
    ks = ks_statistic(reference, current)
    drifted = value > settings.psi_threshold and ks is not None and ks > settings.ks_threshold
    return InputDrift(
        name=name,
        kind=kind,
        psi=value,
        ks=ks,
        drifted=bool(drifted),
        rows=len(current),
        reference_rows=len(reference),
        null_share=_null_share(current),
        reference_null_share=_null_share(reference),
    )


def categorical_drift(
    name: str, reference: pd.Series, current: pd.Series, settings: MonitoringSettings
) -> InputDrift:
    value = categorical_psi(reference, current)
    return InputDrift(
        name=name,
        kind="categorical",
        psi=value,
        ks=None,
        drifted=value > settings.psi_threshold,
        rows=len(current),
        reference_rows=len(reference),
        null_share=float(current.isna().mean()) if len(current) else 0.0,
        reference_null_share=float(reference.isna().mean()) if len(reference) else 0.0,
    )


def compare_inputs(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    settings: MonitoringSettings,
    numeric: Sequence[str],
    categorical: Sequence[str],
) -> list[InputDrift]:
    """Every listed input of `current` against the same column of `reference` (neither is changed)."""
    found = [
        numeric_drift(name, reference[name].to_numpy("float64"), current[name].to_numpy("float64"), settings)
        for name in numeric
    ]
    return found + [categorical_drift(name, reference[name], current[name], settings) for name in categorical]


def drift_report(
    inputs: Sequence[InputDrift], rows: int, reference_rows: int, settings: MonitoringSettings
) -> DriftReport:
    """The verdict: insufficient below min_rows on either side, drift when at least min_drifted inputs
    drifted, else no drift; the reason names the figures."""
    if rows < settings.min_rows or reference_rows < settings.min_rows:
        return DriftReport(
            "insufficient",
            tuple(inputs),
            rows,
            reference_rows,
            f"{rows} current and {reference_rows} reference rows; a verdict needs "
            f"{settings.min_rows} of each",
        )
    drifted = [i for i in inputs if i.drifted]
    listed = "; ".join(i.describe() for i in sorted(drifted, key=lambda i: -i.psi)) or "none"
    verdict: Verdict = "drift" if len(drifted) >= settings.min_drifted else "no_drift"
    return DriftReport(
        verdict,
        tuple(inputs),
        rows,
        reference_rows,
        f"{len(drifted)} of {len(inputs)} inputs drifted (a retrain needs {settings.min_drifted}): {listed}",
    )


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype="float64")
    return values[~np.isnan(values)]


def _null_share(values: np.ndarray) -> float:
    return float(np.isnan(values).mean()) if len(values) else 0.0
