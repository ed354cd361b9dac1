"""The benchmarks' arithmetic: medians over rounds, ratios paired round by round."""

from __future__ import annotations

import pytest

from bench.common import channel_row, median_row, paired_ratio


def test_median_row_keeps_each_round() -> None:
    runs = [
        channel_row("discord", "gatehouse", 3, wall, [a / 1000, b / 1000, c / 1000])
        for wall, (a, b, c) in ((1.0, (1, 2, 3)), (2.0, (2, 4, 6)), (0.5, (10, 20, 30)))
    ]
    row = median_row(runs)
    assert row["p50_ms"] == 4.0 and row["msgs_per_s"] == 3.0 and row["rounds"] == 3
    assert [r["p50_ms"] for r in row["runs"]] == [2.0, 4.0, 20.0]


def test_paired_ratio_cancels_a_slower_round() -> None:
    # The machine ran 3x slower in the second round: both paths felt it.
    gatehouse = {"p50_ms": 0.0, "runs": [{"p50_ms": 3.0}, {"p50_ms": 9.0}, {"p50_ms": 3.3}]}
    floor = {"p50_ms": 0.0, "runs": [{"p50_ms": 2.0}, {"p50_ms": 6.0}, {"p50_ms": 2.0}]}
    assert paired_ratio(gatehouse, floor, "p50_ms") == pytest.approx(1.5)


def test_paired_ratio_without_rounds_is_the_plain_ratio() -> None:
    assert paired_ratio({"p50_ms": 6.0}, {"p50_ms": 4.0}, "p50_ms") == 1.5
