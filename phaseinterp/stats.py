"""Statistics for phase profiles: Wilson intervals, cluster bootstrap, folding, gaps, period and homogeneity tests."""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd
from einops import reduce
from jaxtyping import Float
from scipy import stats as scipy_stats

from phaseinterp._checks import check_fraction, check_int, check_seed, check_real
from phaseinterp.errors import UserInputError
from phaseinterp.phase import check_residue_modulus

# Inputs accepted wherever numpy would take them (scalars, arrays, lists, pandas Series).
ArrayLike = int | float | np.number | np.ndarray | Sequence[Any] | pd.Series


def _z(confidence: float) -> float:
    confidence = check_fraction("confidence", confidence)
    return float(scipy_stats.norm.ppf(0.5 + confidence / 2))


def wilson_interval(
    k: ArrayLike, n: ArrayLike, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for ``k`` successes in ``n`` trials (vectorized; numpy broadcasting).

    ``(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``p = k/n`` and ``z``
    the two-sided normal quantile. ``n = 0`` gives the uninformative ``(0, 1)``.
    """
    k_arr = np.asarray(k, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    if np.any(n_arr < 0) or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise UserInputError(f"need 0 <= k <= n (got k={k}, n={n})")
    z = _z(confidence)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k_arr / n_arr
        denom = 1 + z * z / n_arr
        center = (p + z * z / (2 * n_arr)) / denom
        half = z * np.sqrt(p * (1 - p) / n_arr + z * z / (4 * n_arr * n_arr)) / denom
        # k = 0 and k = n hit 0 and 1 exactly (the formula only up to round-off).
        lower = np.where((n_arr > 0) & (k_arr > 0), np.clip(center - half, 0.0, 1.0), 0.0)
        upper = np.where((n_arr > 0) & (k_arr < n_arr), np.clip(center + half, 0.0, 1.0), 1.0)
    return lower, upper


@dataclass(frozen=True, eq=False)
class BootstrapInterval:
    """Per-group point estimates (group means) and percentile intervals from a cluster bootstrap."""

    estimate: Float[np.ndarray, " group"]
    lower: Float[np.ndarray, " group"]
    upper: Float[np.ndarray, " group"]
    n_replicates: int
    confidence: float


def cluster_bootstrap(
    values: ArrayLike,
    clusters: ArrayLike,
    groups: ArrayLike | None = None,
    n_groups: int | None = None,
    *,
    n_replicates: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    weights: ArrayLike | None = None,
) -> BootstrapInterval:
    """Percentile intervals for per-group means when observations share clusters.

    Each replicate draws the clusters with replacement and recomputes every group's mean from all
    observations of the drawn clusters. ``groups`` are labels ``0..n_groups-1`` (default: one group);
    groups left empty by a replicate are ignored for it. ``weights`` (one per observation, default 1)
    make each group's mean a weighted one."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    _, cluster_idx = np.unique(np.asarray(clusters).reshape(-1), return_inverse=True)
    g = np.zeros(len(x), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64).reshape(-1)
    if not len(x) == len(cluster_idx) == len(g):
        raise UserInputError(f"values ({len(x)}), clusters ({len(cluster_idx)}) and groups ({len(g)}) must have equal lengths")
    if len(x) == 0:
        raise UserInputError("cluster_bootstrap needs at least one observation")
    n_groups = int(g.max()) + 1 if n_groups is None else check_int("n_groups", n_groups, 1)
    if g.min() < 0 or g.max() >= n_groups:
        raise UserInputError(f"group labels must lie in 0..{n_groups - 1} (got {g.min()}..{g.max()})")
    n_replicates = check_int("n_replicates", n_replicates, 1)
    seed = check_seed("seed", seed)
    z_alpha = (1 - check_fraction("confidence", confidence)) / 2
    n_clusters = int(cluster_idx.max()) + 1
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(w) != len(x) or not (np.isfinite(w).all() and (w > 0).all()):
        raise UserInputError(f"weights must be {len(x)} finite positive numbers, one per observation")
    sums = np.zeros((n_clusters, n_groups))
    counts = np.zeros((n_clusters, n_groups))
    np.add.at(sums, (cluster_idx, g), x * w if weights is not None else x)
    np.add.at(counts, (cluster_idx, g), w)
    with np.errstate(invalid="ignore"):
        estimate = sums.sum(0) / counts.sum(0)
    rng = np.random.default_rng(seed)
    replicates = np.empty((n_replicates, n_groups))
    chunk = max(1, 2_000_000 // n_clusters)  # bounds the (replicates x clusters) weight matrix
    for start in range(0, n_replicates, chunk):
        size = min(chunk, n_replicates - start)
        weights = rng.multinomial(n_clusters, np.full(n_clusters, 1 / n_clusters), size=size).astype(np.float64)
        with np.errstate(invalid="ignore"):
            replicates[start : start + size] = (weights @ sums) / (weights @ counts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a group with no observations at all stays NaN
        lower = np.nanquantile(replicates, z_alpha, axis=0)
        upper = np.nanquantile(replicates, 1 - z_alpha, axis=0)
    return BootstrapInterval(estimate, lower, upper, n_replicates, confidence)


def fold_residues(values: ArrayLike, stride: int) -> np.ndarray:
    """Fold a residue profile ``[..., R]`` to phases ``[..., S]``: phase ``s`` averages residues ``s, s+S, ...``."""
    arr = np.asarray(values, dtype=np.float64)
    check_residue_modulus(arr.shape[-1], stride)
    return reduce(arr, "... (repeat phase) -> ... phase", "mean", phase=stride)


def gap(values: ArrayLike) -> float:
    """Best minus worst: ``max - min`` (NaNs ignored)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0 or np.all(np.isnan(arr)):
        raise UserInputError("gap needs at least one non-NaN value")
    return float(np.nanmax(arr) - np.nanmin(arr))


@dataclass(frozen=True, eq=False)
class PeriodTest:
    """Result of :func:`detect_period`.

    ``period`` is None unless the omnibus test (max F over candidates) has ``p_value <= alpha``;
    it is then the fundamental (see :func:`detect_period`), which may be smaller than
    ``best_period`` (the candidate with the largest F). ``p_values[P]`` is the permutation p of
    ``F_P`` alone; ``harmonic_share[P] = SS_P / SS_total`` is the share of the profile's variance
    across residues that the P-periodic harmonics carry.
    """

    period: int | None
    best_period: int | None
    p_value: float
    statistic: float
    f_statistics: dict[int, float]
    power: Float[np.ndarray, " frequency"]
    alpha: float
    p_values: dict[int, float] = field(default_factory=dict)
    harmonic_share: dict[int, float] = field(default_factory=dict)
    min_share: float = 0.9
    min_attainable_p: float = float("nan")

    @property
    def undetermined(self) -> bool:
        """True when no arrangement of these R values could reach ``alpha``: the test cannot say yes at
        this design (``min_attainable_p > alpha``), so its ``period=None`` is no evidence of "no period"."""
        return self.period is None and bool(self.min_attainable_p > self.alpha)

    def verdict(self, n_residues: int | None = None) -> str:
        """The result in words: ``"4 (p=0.0005)"``, ``"none (best 6, p=0.426)"``, or ``"undetermined at this
        design (...)"`` with the attainable minimum p and what design would decide it."""
        if self.period is not None:
            return f"{self.period} (p={self.p_value:.3g})"
        if self.undetermined:
            R = f"R={n_residues} residues" if n_residues else "these residues"
            more = f" (e.g. R={3 * self.best_period})" if self.best_period else ""
            return (f"undetermined at this design: the best attainable p with {R} of these values is "
                    f"{self.min_attainable_p:.3g} > alpha={self.alpha:g} (observed p={self.p_value:.3g}); more "
                    f"repeats of the candidate period{more} would decide it")
        best = f"best {self.best_period}, " if self.best_period else ""
        return f"none ({best}p={self.p_value:.3g})"


def _harmonic_sums(profiles: np.ndarray, periods: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(SS_P [n, period], SS_total [n])``: the sum of squares of the P-periodic DFT harmonics
    (frequencies that are multiples of R/P, k != 0) and of every non-constant harmonic."""
    R = profiles.shape[1]
    power = np.abs(np.fft.fft(profiles, axis=1)) ** 2 / R
    total = power[:, 1:].sum(axis=1)
    ss = np.stack([power[:, np.arange(R // P, R, R // P)].sum(axis=1) for P in periods], axis=1)
    return ss, total


def _period_f_statistics(profiles: np.ndarray, periods: list[int]) -> np.ndarray:
    """F statistic per candidate period for each row of ``profiles [n, R]``.

    The P-periodic part of a length-R profile lives on the DFT frequencies that are multiples
    of R/P, so its sum of squares is the harmonic sum ``SS_P = (1/R) sum |X_k|^2`` over those
    k != 0 (Parseval). ``F_P = (SS_P / (P-1)) / ((SS_total - SS_P) / (R-P))``: the variance
    the folded profile explains per degree of freedom, against what it leaves.
    """
    R = profiles.shape[1]
    ss_all, total = _harmonic_sums(profiles, periods)
    out = np.empty((profiles.shape[0], len(periods)))
    for i, P in enumerate(periods):
        ss = ss_all[:, i]
        resid = np.maximum(total - ss, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            f = (ss / (P - 1)) / (resid / (R - P))
        # A residual at round-off level means the profile is exactly P-periodic.
        f = np.where(resid <= 1e-12 * np.maximum(total, 1e-300), np.inf, f)
        out[:, i] = np.where(total <= 1e-24, 0.0, f)
    return out


# An arrangement whose statistic equals the observed one up to round-off counts as at least as extreme:
# the F of a permuted copy of the same values differs from it in the last bits.
_TIED = 1 - 1e-9


def _beyond_p(x: np.ndarray, P: int, best: int, ss_p: float, ss_best: float, n_permutations: int, seed: int) -> float:
    """Permutation p that the ``best``-periodic harmonics of ``x`` (sum of squares ``ss_best``) add nothing to
    its ``P``-periodic ones (``ss_p``; ``P`` divides ``best``). Each phase of ``P`` keeps its values, shuffled
    among its own R/P repeats (so the P-periodic part, and any noise level that differs by phase, stay as
    they are), and the statistic is ``SS_best``: ``(1 + #{shuffled >= observed}) / (1 + n_permutations)``."""
    if P == best:
        return 1.0
    R = len(x)
    if ss_best - ss_p <= 1e-12 * max(float(np.var(x)) * R, 1e-300):
        return 1.0
    rng = np.random.default_rng([seed, P, best])
    shuffled = rng.permuted(np.tile(x.reshape(R // P, P), (n_permutations, 1, 1)), axis=1)
    null = _harmonic_sums(shuffled.reshape(n_permutations, R), [best])[0][:, 0]
    return float((1 + np.sum(null >= ss_best * _TIED)) / (1 + n_permutations))


def detect_period(
    profile: ArrayLike,
    *,
    periods: list[int] | None = None,
    n_permutations: int = 1999,
    alpha: float = 0.05,
    min_share: float = 0.9,
    seed: int = 0,
) -> PeriodTest:
    """The period of a residue profile (its fundamental) and a permutation test of its significance.

    Statistic: for every candidate period ``P`` (default: divisors of R with ``2 <= P <= R/2``) the F
    statistic of the P-periodic DFT harmonics (``_period_f_statistics``). Test: the maximum F over
    candidates against its distribution under ``n_permutations`` seeded permutations of the R values
    (``p = (1 + #{perm >= observed}) / (1 + n_permutations)``): periodic arrangement, not mere
    heterogeneity (:func:`homogeneity_test`). A flat profile gives ``period=None, p_value=1``.

    The reported ``period`` is the fundamental: the smallest divisor ``P`` of ``best_period`` (the
    largest F; itself included) with ``SS_P >= min_share * SS_best``, a significant own ``F_P``
    (``p_values[P] <= alpha``), and nothing significant beyond it (``_beyond_p``: the best period's
    harmonics against shuffles of each P-phase's repeats, ``p > alpha / len(periods)``), since a
    4-periodic profile is also 8-, 12- and 24-periodic while one whose phases 0 and 2 differ is not
    2-periodic."""
    x = np.asarray(profile, dtype=np.float64).reshape(-1)
    R = len(x)
    if np.isnan(x).any():
        raise UserInputError("profile contains NaN (a residue without prompts?)")
    if periods is None:
        periods = [P for P in range(2, R // 2 + 1) if R % P == 0]
    periods = sorted(check_int("periods", P, 2, why=" (a candidate period)") for P in periods)
    for P in periods:
        if P >= R or R % P:  # P >= 2: checked above
            raise UserInputError(f"candidate period {P} must divide R={R} and lie in 2..{R - 1}")
    alpha = check_fraction("alpha", alpha)
    min_share = check_real("min_share", min_share, 0.0, 1.0, low_open=True, high_open=False,
                           why=" (the share of the best period's harmonic power a divisor must carry)")
    n_permutations = check_int("n_permutations", n_permutations, 1, why=" (permutations of the permutation test)")
    seed = check_seed("seed", seed)
    power = np.abs(np.fft.rfft(x)) ** 2 / R
    if not periods or np.ptp(x) <= 1e-12 * max(1.0, np.abs(x).max()):
        return PeriodTest(None, None, 1.0, 0.0, {P: 0.0 for P in periods}, power, alpha,
                          {P: 1.0 for P in periods}, {P: 0.0 for P in periods}, min_share)
    observed = _period_f_statistics(x[None, :], periods)[0]
    ss, total = _harmonic_sums(x[None, :], periods)
    share = ss[0] / total[0]
    best = int(np.argmax(observed))  # argmax returns the first (smallest) period among ties
    rng = np.random.default_rng(seed)
    null_f = _period_f_statistics(rng.permuted(np.tile(x, (n_permutations, 1)), axis=1), periods)
    statistic = float(observed[best])
    null_max = null_f.max(axis=1)
    p_value = float((1 + np.sum(null_max >= statistic * _TIED)) / (1 + n_permutations))
    # The smallest p any arrangement of these values can get: the share of permutations tied with the most
    # extreme one (8 residues holding one failing residue per 4: 4 of the 28 arrangements, p >= 0.14).
    top = max(statistic, float(null_max.max()))
    min_attainable_p = float((1 + np.sum(null_max >= top * _TIED)) / (1 + n_permutations))
    p_each = (1 + (null_f >= observed[None, :] * _TIED).sum(axis=0)) / (1 + n_permutations)
    fundamental = periods[best]
    for i, P in enumerate(periods):
        if (periods[best] % P == 0 and share[i] >= min_share * share[best] and p_each[i] <= alpha
                and _beyond_p(x, P, periods[best], ss[0, i], ss[0, best], n_permutations, seed) > alpha / len(periods)):
            fundamental = P
            break
    return PeriodTest(
        period=fundamental if p_value <= alpha else None,
        best_period=periods[best],
        p_value=p_value,
        statistic=statistic,
        f_statistics={P: float(f) for P, f in zip(periods, observed)},
        power=power,
        alpha=alpha,
        p_values={P: float(p) for P, p in zip(periods, p_each)},
        harmonic_share={P: float(s) for P, s in zip(periods, share)},
        min_share=min_share,
        min_attainable_p=min_attainable_p,
    )


@dataclass(frozen=True)
class ChiSquareTest:
    statistic: float
    dof: int
    p_value: float


def homogeneity_test(k: ArrayLike, n: ArrayLike) -> ChiSquareTest:
    """Chi-square test that the success rate is the same in every group (``k`` of ``n`` each).

    ``scipy.stats.chi2_contingency`` on the ``groups x (correct, wrong)`` table (no Yates
    correction beyond scipy's 2x2 default). Groups with ``n = 0`` are dropped; when every
    prompt is right (or every one wrong) the groups are trivially homogeneous: ``p = 1``.
    """
    k_arr = np.asarray(k, dtype=np.int64).reshape(-1)
    n_arr = np.asarray(n, dtype=np.int64).reshape(-1)
    if k_arr.shape != n_arr.shape or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise UserInputError(f"need matching k and n with 0 <= k <= n (got k={k_arr}, n={n_arr})")
    keep = n_arr > 0
    table = np.stack([k_arr[keep], n_arr[keep] - k_arr[keep]], axis=1)
    if table.shape[0] < 2 or np.any(table.sum(axis=0) == 0):
        return ChiSquareTest(0.0, max(table.shape[0] - 1, 0), 1.0)
    result = scipy_stats.chi2_contingency(table)
    return ChiSquareTest(float(result.statistic), int(result.dof), float(result.pvalue))



# ----------------------------------------------------------- multiplicity
def adjust_p_values(p_values: ArrayLike, method: str = "holm") -> np.ndarray:
    """Multiplicity-adjusted p-values (same shape as ``p_values``; NaNs stay NaN and are not counted).

    ``"holm"``: Holm's step-down, which controls the family-wise error rate:
    ``p_adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))`` over the ascending p's.
    ``"bh"``: Benjamini-Hochberg, which controls the false discovery rate:
    ``p_adj_(i) = min_{j >= i} min(1, m p_(j) / j)``. Reject where ``p_adj <= alpha``.
    """
    if method not in ("holm", "bh"):
        raise UserInputError(f"method={method!r} is not one of ('holm', 'bh')")
    p = np.asarray(p_values, dtype=np.float64)
    flat = p.reshape(-1)
    out = np.full(flat.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(flat))
    if np.any((flat[ok] < 0) | (flat[ok] > 1)):
        raise UserInputError("p-values must lie in [0, 1]")
    m = ok.size
    if m == 0:
        return out.reshape(p.shape)
    order = ok[np.argsort(flat[ok], kind="stable")]
    sorted_p = flat[order]
    ranks = np.arange(1, m + 1)
    if method == "holm":
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - ranks + 1) * sorted_p))
    else:
        adjusted = np.minimum.accumulate(np.minimum(1.0, m * sorted_p / ranks)[::-1])[::-1]
    out[order] = adjusted
    return out.reshape(p.shape)


@dataclass(frozen=True, eq=False)
class PairedChange:
    """Exact paired test of a change in accuracy (McNemar) with a matching interval.

    ``change = (gained - lost) / n`` (fraction; x100 for percentage points), where ``lost``
    counts prompts right before and wrong after, ``gained`` the reverse. ``p_value``: exact
    two-sided McNemar (binomial on the ``lost + gained`` discordant prompts, central method).
    ``lower``/``upper``: Clopper-Pearson on the discordant split mapped to the change,
    conditional on the discordant count, at level ``1 - alpha`` per element; it excludes zero
    exactly when ``p_value <= alpha``."""

    change: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    p_value: np.ndarray
    lost: np.ndarray
    gained: np.ndarray
    n: np.ndarray


def paired_change(before: ArrayLike, after: ArrayLike, alpha: ArrayLike = 0.05) -> PairedChange:
    """:class:`PairedChange` of 0/1 correctness ``before [prompt, ...]`` -> ``after [prompt, ...]``
    (prompts on axis 0, any trailing shape; ``alpha`` broadcasts against the trailing shape)."""
    b = np.asarray(before, dtype=bool)
    a = np.asarray(after, dtype=bool)
    if b.shape != a.shape:
        raise UserInputError(f"before {b.shape} and after {a.shape} must have the same shape")
    alpha_arr = np.asarray(alpha, dtype=np.float64)
    if np.any((alpha_arr <= 0) | (alpha_arr >= 1)):
        raise UserInputError(f"alpha={alpha} is out of range (0, 1)")
    n = np.full(b.shape[1:], b.shape[0], dtype=np.int64)
    lost = (b & ~a).sum(0)
    gained = (~b & a).sum(0)
    m = lost + gained
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.minimum(lost, gained)
        p = np.where(m > 0, np.minimum(1.0, 2 * scipy_stats.binom.cdf(k, np.maximum(m, 1), 0.5)), 1.0)
        alpha_b = np.broadcast_to(alpha_arr, m.shape)
        lo_pi = np.where(gained > 0, scipy_stats.beta.ppf(alpha_b / 2, gained, m - gained + 1), 0.0)
        hi_pi = np.where(gained < m, scipy_stats.beta.ppf(1 - alpha_b / 2, gained + 1, m - gained), 1.0)
        nn = np.maximum(n, 1)
        change = (gained - lost) / nn
        lower = np.where(m > 0, m * (2 * np.nan_to_num(lo_pi) - 1) / nn, 0.0)
        upper = np.where(m > 0, m * (2 * np.nan_to_num(hi_pi, nan=1.0) - 1) / nn, 0.0)
    return PairedChange(change, lower, upper, p, lost, gained, n)


# ------------------------------------------------------------ premise checks
# Shared tests of what an experiment's logic assumes, on its own data (`Result.premise_notes`).
COLLAPSE_FRACTION = 0.5  # a shifted model below this fraction of the unshifted mean accuracy has collapsed
NOISE_SE = 3.0  # a best-minus-worst phase gap within this many standard errors is no gap
MIN_CLEAN = 0.10  # a relative change of accuracy needs at least this clean accuracy per phase


def phase_gap_note(accuracy: np.ndarray, n: np.ndarray, what: str) -> Optional[str]:
    """A premise note when the best-minus-worst gap of the per-phase accuracies ``accuracy`` ``[S]``
    (fractions, ``n[r]`` prompts each; binomial standard errors) is within `NOISE_SE` standard
    errors of no gap: there is no phase gap to move or to explain. None when there is one."""
    accuracy, n = np.asarray(accuracy, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(accuracy * (1 - accuracy) / n)
    return mean_gap_note(accuracy, np.where(n > 0, se, np.nan), what, unit="pp", scale=100)


def mean_gap_note(means: np.ndarray, se: np.ndarray, what: str, unit: str = "", scale: float = 1.0) -> Optional[str]:
    """A premise note when the best-minus-worst gap of per-phase means ``means`` ``[S]`` (standard
    errors ``se``) is within `NOISE_SE` standard errors of the difference of those two phases: the
    phases do not differ beyond sampling noise. ``scale``/``unit`` only format the message."""
    means, se = np.asarray(means, dtype=float), np.asarray(se, dtype=float)
    ok = np.isfinite(means) & np.isfinite(se)
    if ok.sum() < 2:
        return f"{what}: fewer than 2 phases measured, so there is no phase gap to test"
    m, e = means[ok], se[ok]
    hi, lo = int(np.argmax(m)), int(np.argmin(m))
    bound = NOISE_SE * float(np.hypot(e[hi], e[lo]))
    gap = float(m[hi] - m[lo])
    if gap > bound and gap > 0:
        return None
    u = f" {unit}" if unit else ""
    return (f"{what} has no phase gap: best minus worst phase is {scale * gap:.3g}{u}, within {NOISE_SE:g} "
            f"standard errors ({scale * bound:.3g}{u}) of no gap")


def collapse_note(unshifted_mean: float, shifted_mean: float, label: str) -> Optional[str]:
    """A note when an intervention that should only move accuracy between phases (the mean is kept
    by the prediction) drops the mean accuracy below `COLLAPSE_FRACTION` of the unshifted mean."""
    if not (np.isfinite(unshifted_mean) and np.isfinite(shifted_mean)) or unshifted_mean <= 0:
        return None
    if shifted_mean >= COLLAPSE_FRACTION * unshifted_mean:
        return None
    return (f"{label} collapses accuracy ({100 * shifted_mean:.1f}% mean against {100 * unshifted_mean:.1f}% "
            f"unshifted): the model no longer works, so where its weak spots moved is not measured")


def collapsed_profile_note(accuracy: np.ndarray, what: str, minimum: float = MIN_CLEAN) -> Optional[str]:
    """A premise note when every phase's clean accuracy is below ``minimum`` (a collapsed profile): a
    knockout cannot lower what is not there, so no phase can show specialization. One weak phase is
    no failure (the boundary phase often is; `AblationResult.specialization` skips it)."""
    accuracy = np.asarray(accuracy, dtype=float)
    if accuracy.size == 0 or np.any(accuracy >= minimum):
        return None
    return (f"{what} has collapsed: clean accuracy below {100 * minimum:.0f}% at every phase (at most "
            f"{100 * float(np.nanmax(accuracy, initial=0.0)):.1f}%); a knockout cannot lower what is not there, so no "
            "phase can show specialization")
