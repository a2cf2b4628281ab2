"""Statistics: Wilson intervals, cluster bootstrap, folding, gaps, period detection, homogeneity."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from phaseinterp import stats


# ------------------------------------------------------------------ Wilson
def wilson_closed_form(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def test_wilson_matches_closed_form_and_scipy():
    for n in (1, 5, 20, 250, 2560):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            lower, upper = stats.wilson_interval(k, n)
            assert np.allclose((lower, upper), wilson_closed_form(k, n), atol=1e-12)
            ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
            assert np.allclose((lower, upper), (ci.low, ci.high), atol=1e-9)
    ci = scipy_stats.binomtest(30, 80).proportion_ci(confidence_level=0.9, method="wilson")
    assert np.allclose(stats.wilson_interval(30, 80, confidence=0.9), (ci.low, ci.high))


def test_wilson_is_vectorized_and_handles_edges():
    k, n = np.array([[0, 5], [10, 10]]), np.array([[10, 10], [10, 0 + 10]])
    lower, upper = stats.wilson_interval(k, n)
    assert lower.shape == (2, 2) and lower[0, 0] == 0 and upper[1, 1] == 1
    assert (lower <= k / n).all() and (k / n <= upper).all()
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        stats.wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence=1.5"):
        stats.wilson_interval(1, 10, confidence=1.5)


# ------------------------------------------------------------ fold and gap
def test_fold_and_gap_on_hand_made_profiles():
    profile = np.arange(24, dtype=float)
    assert stats.fold_residues(profile, 4).tolist() == [10, 11, 12, 13]  # mean of s, s+4, ..., s+20
    assert stats.fold_residues(profile, 24).tolist() == profile.tolist()
    assert stats.fold_residues(profile, 1).tolist() == [11.5]
    two = np.stack([profile, 2 * profile])
    assert stats.fold_residues(two, 8).shape == (2, 8)
    dip = np.tile([0.9, 0.8, 0.9, 0.1], 6)
    assert np.allclose(stats.fold_residues(dip, 4), [0.9, 0.8, 0.9, 0.1])
    assert stats.gap(dip) == pytest.approx(0.8)
    assert stats.gap([0.5, np.nan, 0.25]) == 0.25
    with pytest.raises(ValueError, match=r"cannot fold R=24 residues to stride=5 phases \(valid strides: \[1, 2, 3, 4, 6, 8, 12, 24\]\)"):
        stats.fold_residues(profile, 5)
    with pytest.raises(ValueError, match="at least one"):
        stats.gap([np.nan])


# ------------------------------------------------------------------ period
def weak_phase_profile(period: int, seed: int, n: int = 250, R: int = 24) -> np.ndarray:
    """Binomial noise around 70% accuracy with one weak phase (30%) and a half-weak neighbour."""
    rng = np.random.default_rng(seed)
    acc = np.full(period, 0.7)
    weak = rng.integers(period)
    acc[weak], acc[(weak + 1) % period] = 0.3, 0.5
    return rng.binomial(n, np.tile(acc, R // period)) / n


@pytest.mark.parametrize("period", [4, 6, 8, 12])
def test_detect_period_finds_the_period_in_noisy_profiles(period):
    for seed in range(5):
        result = stats.detect_period(weak_phase_profile(period, seed), seed=seed)
        assert result.period == period and result.p_value <= 0.01


def test_detect_period_reports_no_period_on_flat_noisy_profiles():
    rng = np.random.default_rng(0)
    flat = [rng.binomial(250, 0.6, size=24) / 250 for _ in range(200)]
    found = [stats.detect_period(p, seed=i, n_permutations=499).period for i, p in enumerate(flat)]
    assert sum(f is not None for f in found) <= 20  # a 5% test: about 10 of 200 expected
    assert all(stats.detect_period(p, seed=i).period is None for i, p in enumerate(flat[:50]) if found[i] is None)
    constant = stats.detect_period(np.full(24, 0.6))
    assert constant.period is None and constant.p_value == 1.0


def test_detect_period_exact_profiles_and_errors():
    exact = stats.detect_period(np.tile([1.0, 1.0, 1.0, 0.0], 6))
    assert exact.period == 4 and exact.best_period == 4  # the fundamental, not 8 or 12
    trend = stats.detect_period(np.linspace(0, 1, 24))  # structure, but not periodic
    assert trend.period is None
    assert len(stats.detect_period(np.random.default_rng(0).random(24)).power) == 13
    with pytest.raises(ValueError, match="candidate period 5 must divide R=24"):
        stats.detect_period(np.ones(24), periods=[5])
    with pytest.raises(ValueError, match="NaN"):
        stats.detect_period(np.array([np.nan] + [0.5] * 23))


def test_detect_period_prefers_the_fundamental_over_a_harmonic():
    """Issue 10: a w4s4-like profile (phases 100/100/100/1.5%) whose weak-phase noise happens to
    line up mod 12 makes F_12 the largest F; the period reported is still 4."""
    rng = np.random.default_rng(24)  # a binomial draw (250 prompts) on which F_12 > F_4
    drawn = rng.binomial(250, np.tile([1.0, 1.0, 1.0, 0.015], 6)) / 250
    seed_1_like = np.tile([1.0, 1.0, 1.0, 0.0], 6)
    seed_1_like[3::4] = np.tile([0.012, 0.024, 0.009], 2)  # phase 3 at 1.5%, exactly 12-periodic
    assert seed_1_like[3::4].mean() == pytest.approx(0.015)
    for profile in (drawn, seed_1_like):
        result = stats.detect_period(profile)
        assert result.best_period == 12  # the old rule (argmax F) answered 12
        assert result.period == 4 and result.p_values[4] <= 0.001
        assert result.harmonic_share[4] >= 0.99 * result.harmonic_share[12]


def test_detect_period_with_strong_12_harmonics_and_a_true_12_period():
    """A 4-periodic profile with a 12-periodic wiggle reads 12 when the wiggle stands above the noise
    (the 4-periodic harmonics carry over 90% of the power, but the rest is real), and 4 when the same
    wiggle is buried in noise of its own size."""
    arange = np.arange(24)
    wiggle = 0.03 * (np.sin(2 * np.pi * arange / 12) + np.cos(2 * np.pi * 5 * arange / 12))  # 12-periodic
    base = np.tile([0.9, 0.9, 0.9, 0.1], 6) + wiggle
    result = stats.detect_period(base + np.random.default_rng(0).normal(0, 0.002, 24))
    assert result.best_period == 12 and result.f_statistics[12] > 10 * result.f_statistics[4]
    assert result.harmonic_share[4] >= 0.9 * result.harmonic_share[12] and result.period == 12
    noisy = [stats.detect_period(base + np.random.default_rng(s).normal(0, 0.03, 24), n_permutations=999).period
             for s in range(10)]
    assert noisy.count(4) >= 8
    # A profile whose weak residue repeats every 12 (not every 4) keeps 12: its 4-periodic
    # harmonics carry a small share of the variance.
    twelve = stats.detect_period(np.tile([0.7] * 5 + [0.2, 0.45] + [0.7] * 5, 2))
    assert twelve.period == 12 and twelve.harmonic_share[4] < 0.5 * twelve.harmonic_share[12]
    with pytest.raises(ValueError, match="min_share=0"):
        stats.detect_period(base, min_share=0)


def test_a_significant_structure_beyond_a_dominant_divisor_keeps_the_longer_period():
    """W8/S4-like: phases 48/85/54/81% (an even/odd alternation carries over 90% of the variance) with
    phase 2 above phase 0 in every repeat: the period is 4, not 2. Each phase's repeats shuffled among
    themselves is the null, so noise that is larger on one phase (issue 10's profiles) does not count."""
    rng = np.random.default_rng(0)
    profile = np.tile([0.48, 0.85, 0.54, 0.81], 6) + rng.normal(0, 0.01, 24)
    result = stats.detect_period(profile)
    assert result.harmonic_share[2] >= 0.9 * result.harmonic_share[4]
    assert result.best_period == 4 and result.period == 4
    alternation = np.tile([0.5, 0.83], 12) + rng.normal(0, 0.01, 24)  # no phase-0/phase-2 difference
    assert stats.detect_period(alternation).period == 2


def test_a_p_value_counts_the_arrangements_tied_with_the_observed_one():
    """p = (1 + #{null >= observed}) / (1 + n) counts permuted copies whose F equals the observed one up to
    round-off: a 6-residue alternation has 10 arrangements, 1 as extreme (exact p 0.1), and its p is never
    below the floor it reports."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        hi, lo = rng.uniform(0.6, 1, 3), rng.uniform(0, 0.4, 3)
        profile = np.array([hi[0], lo[0], hi[1], lo[1], hi[2], lo[2]])
        result = stats.detect_period(profile, seed=int(rng.integers(1000)))
        assert result.p_value >= result.min_attainable_p and result.p_value > 0.05 and result.period is None


def test_detect_period_is_deterministic():
    profile = weak_phase_profile(4, 0)
    a, b = stats.detect_period(profile, seed=3), stats.detect_period(profile, seed=3)
    assert a.p_value == b.p_value and a.f_statistics == b.f_statistics


# --------------------------------------------------------------- bootstrap
def test_cluster_bootstrap_widens_with_shared_clusters():
    rng = np.random.default_rng(0)
    n_clusters, reps = 400, 5
    outcome = rng.random(n_clusters) < 0.6
    groups = np.repeat(np.arange(n_clusters) % 4, reps)
    # every prompt of a mapping (all in one group) gets the same outcome: fully correlated clusters
    shared = stats.cluster_bootstrap(np.repeat(outcome, reps), np.repeat(np.arange(n_clusters), reps), groups, 4)
    independent = stats.cluster_bootstrap(np.repeat(outcome, reps), np.arange(n_clusters * reps), groups, 4)
    width_shared, width_indep = shared.upper - shared.lower, independent.upper - independent.lower
    assert np.allclose(shared.estimate, independent.estimate)
    assert (width_shared > 1.6 * width_indep).all()  # about sqrt(5) = 2.2 wider
    assert ((shared.lower <= shared.estimate) & (shared.estimate <= shared.upper)).all()
    assert shared.n_replicates == 2000


def test_cluster_bootstrap_agrees_with_wilson_for_singletons_and_is_seeded():
    rng = np.random.default_rng(1)
    x = rng.random(2000) < 0.3
    boot = stats.cluster_bootstrap(x, np.arange(2000), seed=5)
    lower, upper = stats.wilson_interval(x.sum(), 2000)
    assert abs(boot.lower[0] - lower) < 0.01 and abs(boot.upper[0] - upper) < 0.01
    again = stats.cluster_bootstrap(x, np.arange(2000), seed=5)
    assert boot.lower[0] == again.lower[0] and boot.upper[0] == again.upper[0]
    with pytest.raises(ValueError, match="equal lengths"):
        stats.cluster_bootstrap(x, np.arange(10))
    with pytest.raises(ValueError, match=r"group labels must lie in 0..1"):
        stats.cluster_bootstrap(x[:3], np.arange(3), [0, 1, 2], 2)


# ------------------------------------------------------------ homogeneity
def test_homogeneity_test_against_scipy_and_edge_cases():
    k, n = np.array([120, 130, 125, 60]), np.array([250, 250, 250, 250])
    table = np.stack([k, n - k], axis=1)
    expected = scipy_stats.chi2_contingency(table)
    result = stats.homogeneity_test(k, n)
    assert result.p_value == pytest.approx(expected.pvalue) and result.dof == 3
    assert result.p_value < 1e-6
    assert stats.homogeneity_test([125, 123, 127, 124], [250] * 4).p_value > 0.5
    assert stats.homogeneity_test([250, 250], [250, 250]).p_value == 1.0
    with pytest.raises(ValueError, match="0 <= k <= n"):
        stats.homogeneity_test([3], [2])
