"""The export's choice of the file to serve, by hand on small tables: the smallest file whose holdout AUC-PR
is within the tolerance of fp32's, the faster at batch 1 on a tie, fp32 when nothing smaller qualifies."""

from __future__ import annotations

import pytest

from training.export import VARIANT_FILES, choose_serving, within_tolerance


def row(variant: str, size: int, auc_pr: float, batch1_us: float = 10.0) -> dict:
    return {
        "variant": variant,
        "file": VARIANT_FILES[variant],
        "bytes": size,
        "p50_us_batch1": batch1_us,
        "p50_us_batch256": 25 * batch1_us,
        "auc_pr": auc_pr,
    }


# fp32 at AUC-PR 0.75 and a tolerance of 0.25: binary fractions, so "exactly at the tolerance" is exact
FP32 = row("fp32", 40_000, 0.75, batch1_us=30.0)


@pytest.mark.parametrize(
    ("others", "tolerance", "expected"),
    [
        pytest.param(
            [row("int8", 12_000, 0.74), row("pruned", 15_000, 0.75), row("student", 5_000, 0.70)],
            0.25,
            "student",
            id="the smallest within the tolerance wins",
        ),
        pytest.param(
            [row("int8", 12_000, 0.74), row("pruned", 15_000, 0.75), row("student", 5_000, 0.49)],
            0.25,
            "int8",
            id="a smaller variant beyond the tolerance loses",
        ),
        pytest.param(
            [row("int8", 12_000, 0.74), row("student", 5_000, 0.5)],
            0.25,
            "student",
            id="exactly at the tolerance qualifies",
        ),
        pytest.param(
            [row("int8", 12_000, 0.4), row("pruned", 15_000, 0.3), row("student", 5_000, 0.2)],
            0.25,
            "fp32",
            id="fp32 when nothing else qualifies",
        ),
        pytest.param(
            [row("pruned", 9_000, 0.75, batch1_us=8.0), row("student", 9_000, 0.75, batch1_us=6.0)],
            0.0,
            "student",
            id="equal sizes: the faster at batch 1",
        ),
        pytest.param(
            [row("pruned", 9_000, 0.8), row("student", 5_000, 0.9)],
            0.0,
            "student",
            id="better than fp32 qualifies at no tolerance",
        ),
        pytest.param([], 0.25, "fp32", id="fp32 alone"),
        pytest.param([row("student", 50_000, 0.75)], 0.25, "fp32", id="a larger variant never replaces fp32"),
    ],
)
def test_the_smallest_file_within_the_tolerance_serves(others, tolerance, expected):
    chosen, reason = choose_serving([FP32, *others], tolerance)
    assert chosen["variant"] == expected
    assert reason.startswith(f"{VARIANT_FILES[expected]} ({expected})")
    # the reason names the figures it compared
    assert f"{chosen['bytes']} bytes" in reason and f"{chosen['auc_pr']:.4f}" in reason
    assert f"fp32 {FP32['auc_pr']:.4f}" in reason


def test_the_reason_names_the_variants_beyond_the_tolerance():
    rows = [FP32, row("int8", 12_000, 0.74), row("student", 5_000, 0.45)]
    chosen, reason = choose_serving(rows, 0.25)
    assert chosen["variant"] == "int8"
    assert "beyond the tolerance: student (AUC-PR 0.4500 < 0.5000)" in reason
    assert [r["variant"] for r in within_tolerance(rows, 0.25)] == ["fp32", "int8"]


def test_fp32_qualifies_whatever_its_own_figures():
    rows = [row("fp32", 40_000, 0.0), row("student", 5_000, 0.0)]
    assert choose_serving(rows, 0.0)[0]["variant"] == "student"
    assert within_tolerance([row("fp32", 40_000, float("nan"))], 0.1)[0]["variant"] == "fp32"


def test_a_table_without_fp32_is_refused():
    with pytest.raises(ValueError, match="no fp32 row"):
        choose_serving([row("student", 5_000, 0.9)], 0.25)
