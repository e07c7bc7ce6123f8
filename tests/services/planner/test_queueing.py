"""M/G/1 formulas and the fewest-workers search, on numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from services.planner.queueing import (
    ceil_div,
    mg1_max_rate,
    mg1_wait_quantile_s,
    mg1_wait_s,
    smallest_workers,
)


def test_mg1_wait_is_md1_for_fixed_service_and_inf_when_saturated() -> None:
    # M/D/1: rho S / (2 (1 - rho)); S = 0.1, lam = 6.667 -> rho = 2/3 -> 0.1 s.
    assert mg1_wait_s(20 / 3, 0.1, 0.01) == pytest.approx(0.1)
    assert mg1_wait_s(0.0, 0.1, 0.01) == 0.0
    assert mg1_wait_s(10.0, 0.1, 0.01) == math.inf
    # Variance adds wait (P-K): E[S^2] = 0.0125 instead of 0.01 -> 0.125 s.
    assert mg1_wait_s(20 / 3, 0.1, 0.0125) == pytest.approx(0.125)


def test_mg1_max_rate_inverts_the_wait() -> None:
    lam = mg1_max_rate(0.1, 0.01, 0.2)
    assert lam == pytest.approx(8.0)  # 2 * 0.2 / (0.01 + 2 * 0.2 * 0.1)
    assert mg1_wait_s(lam, 0.1, 0.01) == pytest.approx(0.2)
    assert mg1_max_rate(0.1, 0.01, -0.01) == 0.0


def test_mg1_wait_quantile() -> None:
    # rho = 0.5, deterministic 1 s service: Wq = 0.5 s; waiters' mean 1 s; p90 = ln(0.5 / 0.1) = 1.609 s.
    assert mg1_wait_quantile_s(0.5, 1.0, 1.0, 0.9) == pytest.approx(math.log(5.0))
    assert mg1_wait_s(0.5, 1.0, 1.0) == pytest.approx(0.5)
    assert mg1_wait_quantile_s(0.05, 1.0, 1.0, 0.9) == 0.0  # 95% never wait
    assert mg1_wait_quantile_s(1.0, 1.0, 1.0, 0.9) == math.inf


def test_ceil_div_forgives_float_noise() -> None:
    assert ceil_div(0.1 * 3, 0.1) == 3
    assert ceil_div(3.0001, 1) == 4
    assert ceil_div(0, 5) == 0


def test_smallest_workers() -> None:
    assert smallest_workers(lambda n: n >= 37, 1, 1000) == 37
    assert smallest_workers(lambda n: n >= 3, 5, 1000) == 5
    assert smallest_workers(lambda n: n >= 37, 1, 30) is None
