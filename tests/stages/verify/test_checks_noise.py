"""Issue 23: noise is decided from the spread of the repetitions, and the size that decides a
check is the one every view shows."""

from __future__ import annotations

import pytest

from dedal.stages.verify.checks import Thresholds, compare_bandwidth, compare_latency, deciding_size

SIZES = [1 << i for i in range(0, 21)]


def lat(size: int) -> float:
    return 0.2 + size / 10000.0


def tight(value: float) -> list:
    return [value * f for f in (1.0, 1.01, 0.99, 1.02, 1.0)]


def test_a_large_regression_with_tight_repetitions_fails_even_when_an_outlier_makes_the_ranges_touch() -> None:
    native = {s: tight(lat(s)) for s in SIZES}
    container = {s: [v * 1.005 for v in vals] for s, vals in native.items()}
    container[262144] = [v * 3.29 for v in native[262144]]  # +229 % at 256 KiB
    container[262144][3] = native[262144][4] * 0.9  # one lucky repetition: the old rule called this noise
    r = compare_latency(native, container)
    big = next(s for s in r.sizes if s.size == 262144)
    assert big.state == "fail" and not big.within_noise and big.spread is not None
    assert big.delta_pct == pytest.approx(229.0, abs=2.0)
    assert r.verdict == "bad" and [f.code for f in r.findings] == ["latency-overhead"]
    assert deciding_size(r) is big


def test_an_excess_within_the_spread_of_the_repetitions_is_noise() -> None:
    native = {1024: [0.30, 0.31, 0.30, 1.80, 1.20]}  # two slow native repetitions: a wide spread
    container = {1024: [1.00, 1.90, 0.95, 1.10, 1.05]}
    r = compare_latency(native, container)
    (s,) = r.sizes
    assert s.state == "noise" and r.verdict == "suboptimal" and r.findings[0].code == "latency-noisy"


def test_the_noise_factor_is_a_threshold() -> None:
    native = {1024: [0.30, 0.31, 0.30, 1.80, 1.20]}
    container = {1024: [1.00, 1.90, 0.95, 1.10, 1.05]}
    strict = compare_latency(native, container, Thresholds.from_mapping({"noise_sigmas": 0}))
    assert strict.sizes[0].state == "fail" and strict.verdict == "bad"


def test_two_repetitions_give_no_spread_and_an_exceeded_threshold_fails() -> None:
    r = compare_latency({8: [1.0, 1.1]}, {8: [1.6, 1.7]})
    assert r.sizes[0].spread is None and r.sizes[0].state == "fail" and r.verdict == "bad"


def test_the_deciding_size_is_where_the_container_is_worst_not_the_smallest() -> None:
    bw = {s: tight(min(s / lat(s), 20000.0)) for s in SIZES}
    faster_small = {s: [v * (1.28 if s < 65536 else 0.99) for v in vals] for s, vals in bw.items()}
    r = compare_bandwidth(bw, faster_small)
    pick = deciding_size(r)
    assert r.verdict == "good" and pick.checked and pick.state == "ok"
    assert pick.container.median < pick.native.median  # the numbers shown are the ones nearest the limit
    slower_big = {s: [v * (1.28 if s < 65536 else 0.9) for v in vals] for s, vals in bw.items()}
    bad = compare_bandwidth(bw, slower_big)
    assert bad.verdict == "bad" and deciding_size(bad).state == "fail"
    assert deciding_size(bad).container.median < deciding_size(bad).native.median


def test_a_faster_container_is_never_over_the_threshold() -> None:
    native = {s: tight(lat(s)) for s in SIZES}
    faster = {s: [v * 0.5 for v in vals] for s, vals in native.items()}
    r = compare_latency(native, faster)
    assert r.verdict == "good" and all(s.state in ("ok", "not checked") for s in r.sizes) and not r.findings
