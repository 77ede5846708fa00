"""The statistics of ``gradzip reproduce --seeds`` against closed forms and textbook values."""

from __future__ import annotations

import math

import pytest

from gradzip_lab.reproduce.stats import (
    mean,
    paired_t_test,
    regularized_beta,
    sample_sd,
    t_quantile,
    t_two_sided_p,
)

#: Student's sleep data (Cushny & Peebles, 1905): extra hours of sleep with drug 2 minus
#: drug 1 for 10 patients, the classic paired t-test example
SLEEP_DIFFERENCES = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]


def test_mean_and_sample_sd_divide_by_n_minus_1() -> None:
    assert mean([2.0, 4.0, 9.0]) == pytest.approx(5.0)
    # deviations -3, -1, 4: squares 26, over n - 1 = 2
    assert sample_sd([2.0, 4.0, 9.0]) == pytest.approx(math.sqrt(13.0))
    assert sample_sd([3.0]) is None
    with pytest.raises(ValueError):
        mean([])


def test_regularized_beta_closed_forms() -> None:
    # I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b; symmetry
    assert regularized_beta(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-12)
    assert regularized_beta(2.5, 1.0, 0.6) == pytest.approx(0.6**2.5, abs=1e-12)
    assert regularized_beta(1.0, 4.0, 0.2) == pytest.approx(1 - 0.8**4, abs=1e-12)
    assert regularized_beta(3.0, 7.0, 0.9) == pytest.approx(
        1 - regularized_beta(7.0, 3.0, 0.1), abs=1e-12
    )
    assert regularized_beta(2.0, 3.0, 0.0) == 0.0 and regularized_beta(2.0, 3.0, 1.0) == 1.0


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 3.0, 12.7, 100.0])
def test_t_p_value_matches_the_closed_forms_for_1_and_2_degrees_of_freedom(t: float) -> None:
    # df 1 is the Cauchy distribution; df 2 has P(|T| >= t) = 1 - t / sqrt(2 + t^2)
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)
    assert t_two_sided_p(-t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_t_p_value_and_quantiles_match_the_tables() -> None:
    assert t_two_sided_p(2.0, 5) == pytest.approx(0.101939, abs=1e-6)
    assert t_two_sided_p(math.inf, 3) == 0.0
    # the 97.5% points of the t tables
    for df, expected in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)]:
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)


def test_paired_t_test_on_the_sleep_data() -> None:
    # the published values (e.g. R's t.test(extra ~ group, sleep, paired = TRUE)):
    # t = 4.0621, df = 9, p = 0.002833, 95% CI 0.7001 to 2.4599
    test = paired_t_test(SLEEP_DIFFERENCES)
    assert test.n == 10 and test.mean == pytest.approx(1.58)
    assert test.t == pytest.approx(4.0621, abs=1e-4)
    assert test.p == pytest.approx(0.002833, abs=1e-6)
    assert test.ci_low == pytest.approx(0.7001142, abs=1e-6)
    assert test.ci_high == pytest.approx(2.4598858, abs=1e-6)
    assert test.significant and "significant at the 5% level" in test.verdict()


def test_three_noisy_seeds_are_not_significant_and_the_report_says_so() -> None:
    test = paired_t_test([0.5, -0.2, 0.4])
    assert test.p is not None and test.p > 0.05
    assert test.significant is False
    assert test.verdict().startswith("NOT significant") and "3 seeds" in test.verdict()
    assert test.ci_low is not None and test.ci_high is not None
    assert test.ci_low < 0 < test.ci_high


def test_degenerate_differences() -> None:
    one = paired_t_test([1.0])
    assert one.p is None and one.significant is None and one.verdict() == "no test: one seed"
    same = paired_t_test([0.0, 0.0, 0.0])
    assert same.p is None and same.verdict() == "identical in every seed"
    constant = paired_t_test([2.0, 2.0, 2.0])  # e.g. a bit count: no noise at all
    assert constant.p == 0.0 and constant.significant
