"""Scores of the gate-cycling prediction ``A_d(r) = A_0((r - d) mod S)`` (docs/science.md, "Gate cycling"):
parameter-free R², squared correlation, displacement, movement R² and the identification / permutation
tests that `gate_cycling`, `CyclingResult` and `UnitCyclingResult` score with."""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any

import numpy as np
import pandas as pd

from phaseinterp._checks import check_fraction, check_int, check_seed
from phaseinterp.errors import UserInputError


def coefficient_of_determination(predicted: np.ndarray, observed: np.ndarray) -> float:
    """``1 - SS_res / SS_tot`` of a parameter-free prediction: ``SS_res = sum (obs - pred)^2``,
    ``SS_tot = sum (obs - mean obs)^2``. 1 is a perfect prediction, 0 predicts no better than
    the observations' mean, and a prediction of the wrong size or sign is negative (unbounded).
    NaN with fewer than 2 points or when the observations do not vary."""
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    ss_tot = float(((observed - observed.mean()) ** 2).sum()) if observed.size else 0.0
    if observed.size < 2 or ss_tot <= 1e-12:
        return float("nan")
    return 1.0 - float(((observed - predicted) ** 2).sum()) / ss_tot


def squared_correlation(predicted: np.ndarray, observed: np.ndarray) -> float:
    """Squared Pearson correlation: the R^2 of a least-squares line ``obs ~ a + b pred`` (slope
    and intercept fitted). Blind to scale and offset: a prediction 5x too large scores 1.
    NaN with fewer than 3 points (two points always lie on a line) or without variation."""
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    if observed.size < 3 or np.std(predicted) == 0 or np.std(observed) == 0:
        return float("nan")
    return float(np.corrcoef(predicted, observed)[0, 1] ** 2)


def _hypothesis_scores(acc0: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Headline score (coefficient of determination on the S-1 non-boundary phases) of every
    hypothesised shift d' = 0..S-1 for one observed profile ``acc``: ``[S]``."""
    S = len(acc0)
    keep = np.arange(S - 1)
    observed = (acc - acc0)[keep]
    return np.array([coefficient_of_determination((np.roll(acc0, k) - acc0)[keep], observed) for k in range(S)])


def displacement(acc0: np.ndarray, acc: np.ndarray) -> int:
    """How far the weak spots moved, estimated circularly: the hypothesised shift ``k`` whose
    prediction ``A_0((r - k) mod S)`` best explains ``acc`` on the non-boundary phases (highest
    coefficient of determination, i.e. least squares), as its representative in (-S/2, S/2].
    Nothing pulls the estimate toward the shift that was applied (no unwrapping)."""
    S = len(acc0)
    scores = np.nan_to_num(_hypothesis_scores(np.asarray(acc0, float), np.asarray(acc, float)), nan=-np.inf)
    k = int(np.argmax(scores))
    return k - S if k > S // 2 else k


def _permutation_p(acc0: np.ndarray, observed: dict[int, np.ndarray], n_permutations: int,
                   seed: int) -> tuple[dict[int, float], float]:
    """Permutation p-values of the applied shift's headline score, per shift and jointly.

    Null: the shifted accuracies on the S-1 non-boundary phases are exchangeable. Per shift the
    statistic is its score over every arrangement of its S-1 values; jointly, the mean score over
    shifts with independent arrangements. Exact enumeration (p = share of arrangements scoring >=
    observed, the observed included) when they number at most ``n_permutations``; else seeded Monte
    Carlo, ``p = (1 + #{>= observed}) / (1 + n_permutations)``."""
    S = len(acc0)
    keep = np.arange(S - 1)
    shifts = list(observed)
    rng = np.random.default_rng(seed)
    rows, exact_each = _permutations(S - 1, n_permutations, rng)  # the joint draws below continue ``rng``
    null_by_shift, per_p, stats = {}, {}, {}
    for d in shifts:
        acc = observed[d]
        pred = (np.roll(acc0, d % S) - acc0)[keep]
        null = np.array([coefficient_of_determination(pred, acc[keep][row] - acc0[keep]) for row in rows])
        null_by_shift[d] = np.nan_to_num(null, nan=-np.inf)
        stats[d] = float(np.nan_to_num(coefficient_of_determination(pred, (acc - acc0)[keep]), nan=-np.inf))
        hits = int(np.sum(null_by_shift[d] >= stats[d] - 1e-12))
        per_p[d] = hits / len(rows) if exact_each else (1 + hits) / (1 + len(rows))
    observed_mean = float(np.mean([stats[d] for d in shifts]))
    if exact_each and len(rows) ** len(shifts) <= max(n_permutations, 1):
        grids = np.meshgrid(*[null_by_shift[d] for d in shifts], indexing="ij")
        joint = np.mean(np.stack([g.reshape(-1) for g in grids]), axis=0)
        joint_p = float(np.mean(joint >= observed_mean - 1e-12))
    else:
        draws = np.stack([null_by_shift[d][rng.integers(0, len(rows), n_permutations)] for d in shifts])
        joint_p = float((1 + np.sum(draws.mean(axis=0) >= observed_mean - 1e-12)) / (1 + n_permutations))
    return per_p, joint_p


def cycling_scores(acc0: np.ndarray, observed: dict[int, np.ndarray], *, n_permutations: int = 0,
                   seed: int = 0) -> dict:
    """How well ``A_d(r) = A_0((r-d) mod S)`` predicts the per-phase accuracies under each shift.

    ``acc0`` ``[S]`` is unshifted, ``observed[d]`` ``[S]`` per applied shift ``d`` (distinct, nonzero mod
    S). Every score compares changes from the unshifted model: predicted ``A_0((r-d) mod S) - A_0(r)``
    against observed ``A_d(r) - A_0(r)``.

    ``per_shift`` columns:
      - ``r2`` (headline): coefficient of determination of the prediction on the S-1 non-boundary phases;
      - ``r2_all`` on all S phases; ``r2_interior`` also without ``(S-1+d) mod S``;
      - ``corr2``, ``corr2_all``, ``corr2_interior``: squared Pearson correlation on the same sets, with
        ``slope`` and ``intercept`` of observed on predicted (NaN on two points);
      - ``mae``: mean |observed - predicted| on the non-boundary phases;
      - ``mean_drop``: mean over all phases of ``A_0 - A_d``;
      - ``hypothesis_<k>``: the headline score of hypothesised shift ``k = 0..S-1``; ``displacement``: the
        best ``k``, signed; ``identified``: it equals the applied shift mod S; ``identification_p`` (with
        ``n_permutations > 0``): the permutation p (`_permutation_p`);
      - ``boundary_accuracy``, ``boundary_rank`` (0 = the weakest phase), ``n_points`` (S-1).

    Pooled: ``r2_pooled`` and ``corr2_pooled`` on every non-boundary point; ``n_identified`` of
    ``n_shifts``; ``identification_p``, the joint permutation p; ``movement_r2`` / ``movement_corr2``
    (`movement_scores`; NaN with fewer than 2 shifts)."""
    n_permutations = check_int("n_permutations", n_permutations, 0, why=" (0: no permutation test)")
    seed = check_seed("seed", seed)
    acc0 = np.asarray(acc0, float)
    S = len(acc0)
    boundary = S - 1
    not_boundary = np.arange(S - 1)
    rows, pooled_pred, pooled_obs = [], [], []
    for d, a in observed.items():
        a = np.asarray(a, float)
        predicted = np.roll(acc0, d % S) - acc0  # A_0((r-d) mod S) - A_0(r)
        change = a - acc0
        interior = np.array([r for r in range(S) if r not in (boundary, (boundary + d) % S)])
        pooled_pred.append(predicted[not_boundary])
        pooled_obs.append(change[not_boundary])
        if np.std(predicted[not_boundary]) > 0:
            slope, intercept = np.polyfit(predicted[not_boundary], change[not_boundary], 1)
        else:
            slope, intercept = np.nan, np.nan
        hyp = _hypothesis_scores(acc0, a)
        best = int(np.argmax(np.nan_to_num(hyp, nan=-np.inf)))
        row = dict(
            shift=int(d), r2=coefficient_of_determination(predicted[not_boundary], change[not_boundary]),
            r2_all=coefficient_of_determination(predicted, change),
            r2_interior=coefficient_of_determination(predicted[interior], change[interior]),
            corr2=squared_correlation(predicted[not_boundary], change[not_boundary]),
            corr2_all=squared_correlation(predicted, change),
            corr2_interior=squared_correlation(predicted[interior], change[interior]),
            slope=float(slope), intercept=float(intercept),
            mae=float(np.abs(predicted - change)[not_boundary].mean()),
            mean_drop=float(acc0.mean() - a.mean()),
            displacement=best - S if best > S // 2 else best, identified=bool(best == d % S),
            boundary_accuracy=float(a[boundary]), boundary_rank=int((a < a[boundary]).sum()),
            n_points=S - 1,
        )
        row.update({f"hypothesis_{k}": float(v) for k, v in enumerate(hyp)})
        rows.append(row)
    per_shift = pd.DataFrame(rows)
    out: dict = dict(per_shift=per_shift, n_shifts=len(rows),
                     n_identified=int(per_shift["identified"].sum()) if rows else 0)
    if rows:
        pred, obs = np.concatenate(pooled_pred), np.concatenate(pooled_obs)
        out["r2_pooled"] = coefficient_of_determination(pred, obs)
        out["corr2_pooled"] = squared_correlation(pred, obs)
    else:
        out["r2_pooled"] = out["corr2_pooled"] = float("nan")
    out["movement_r2"], out["movement_corr2"] = movement_point(
        per_shift["displacement"] if rows else [], [int(d) for d in observed], S)
    out["identification_p"] = float("nan")
    # the smallest p each test can reach at this design (exact enumeration): a single shift's S-1 values
    # have (S-1)! arrangements (1/6 at S = 4: never below 0.05), the joint test ((S-1)!)^shifts
    out["identification_min_p"] = float((1 / math.factorial(S - 1)) ** max(len(rows), 1))
    out["identification_min_p_by_shift"] = float(1 / math.factorial(S - 1))
    if n_permutations > 0 and rows:
        per_p, joint_p = _permutation_p(acc0, {d: np.asarray(a, float) for d, a in observed.items()},
                                        n_permutations, seed)
        per_shift["identification_p"] = [per_p[d] for d in per_shift["shift"]]
        out["identification_p"] = joint_p
    return out


def attainable_note(name: str, min_p: float, alpha: float = 0.05, design: str = "") -> str | None:
    """Words for a test that cannot say yes at this design: None when ``min_p <= alpha``, else
    ``"<name> undetermined at this design: p >= min_p > alpha (design); ..."``."""
    alpha = check_fraction("alpha", alpha)
    if not min_p > alpha:
        return None
    return (f"{name} undetermined at this design: its p cannot go below {min_p:.3g} > {alpha:g}"
            + (f" ({design})" if design else "") + "; read the pooled (joint) test instead")


# ---------------------------------------------------------------- unit level
def _rolled_index(S: int, shifts: np.ndarray) -> np.ndarray:
    """``idx[d, r] = (r - d) mod S``: ``x[..., idx[d]]`` is ``x`` rolled by ``d`` (``x((r - d) mod S)``)."""
    return (np.arange(S)[None, :] - np.asarray(shifts)[:, None]) % S


def unit_score_arrays(c0: np.ndarray, c: np.ndarray, shifts, boundary: int) -> dict[str, np.ndarray]:
    """The unit-level scores, vectorised over any leading axes (bootstrap replicates).

    ``c0`` ``[..., S]``: the unit's contribution per phase, unshifted; ``c`` ``[..., D, S]``: under each
    ``shifts[k]``; prediction ``C_d(r) = C_0((r - d) mod S)``. Returns ``[..., D]`` arrays ``r2`` (all S
    phases), ``r2_no_boundary``, ``corr2``, ``mae``; ``ss_res_by_hypothesis`` ``[..., D, S]`` (residual of
    every hypothesised shift); and ``r2_pooled`` ``[...]``."""
    c0, c = np.asarray(c0, float), np.asarray(c, float)
    S = c0.shape[-1]
    shifts = np.asarray(shifts, int)
    pred = c0[..., _rolled_index(S, shifts)]  # [..., D, S]
    hyp = c0[..., _rolled_index(S, np.arange(S))]  # [..., K, S]
    resid = c - pred
    ss_res = (resid ** 2).sum(-1)
    ss_tot = ((c - c.mean(-1, keepdims=True)) ** 2).sum(-1)
    keep = np.arange(S) != boundary
    cb, pb = c[..., keep], pred[..., keep]
    ss_tot_b = ((cb - cb.mean(-1, keepdims=True)) ** 2).sum(-1)
    ss_res_b = ((cb - pb) ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(ss_tot > 1e-12, 1 - ss_res / ss_tot, np.nan)
        r2_nb = np.where(ss_tot_b > 1e-12, 1 - ss_res_b / ss_tot_b, np.nan)
        pc, cc = pred - pred.mean(-1, keepdims=True), c - c.mean(-1, keepdims=True)
        denom = np.sqrt((pc ** 2).sum(-1) * (cc ** 2).sum(-1))
        corr2 = np.where(denom > 1e-12, ((pc * cc).sum(-1) / denom) ** 2, np.nan)
        flat = c.reshape(c.shape[:-2] + (-1,))
        pooled_tot = ((flat - flat.mean(-1, keepdims=True)) ** 2).sum(-1)
        r2_pooled = np.where(pooled_tot > 1e-12, 1 - ss_res.sum(-1) / pooled_tot, np.nan)
    ss_hyp = ((c[..., :, None, :] - hyp[..., None, :, :]) ** 2).sum(-1)  # [..., D, K]
    return dict(r2=r2, r2_no_boundary=r2_nb, corr2=corr2, mae=np.abs(resid).mean(-1), ss_res_by_hypothesis=ss_hyp,
                ss_tot=ss_tot, r2_pooled=r2_pooled)


def strictly_identified(ss_hyp: np.ndarray, shifts) -> np.ndarray:
    """Whether the applied shift's hypothesis has a strictly smaller residual than every other
    hypothesis (a tie, e.g. a unit whose contribution is flat, identifies nothing): ``[..., D]``."""
    S = ss_hyp.shape[-1]
    applied = np.asarray(shifts, int) % S
    own = np.take_along_axis(ss_hyp, np.broadcast_to(applied[:, None], ss_hyp.shape[:-1] + (1,)), -1)[..., 0]
    others = np.where(np.arange(S) == applied[:, None], np.inf, ss_hyp).min(-1)
    return own < others - 1e-12 * np.maximum(1.0, np.abs(others))


def _permutations(S: int, limit: int, seed) -> tuple[np.ndarray, bool]:
    """Every arrangement of S phases when there are at most ``limit`` (exact), else ``limit``
    random ones drawn with ``seed`` (an int or a `numpy.random.Generator`, then advanced)."""
    if math.factorial(S) <= limit:
        return np.array(list(itertools.permutations(range(S)))), True
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(S) for _ in range(limit)]), False


def poisson_binomial_tail(probabilities, k: int) -> float:
    """``P(X >= k)`` for ``X`` a sum of independent Bernoulli(p_i) (exact, by convolution)."""
    dist = np.array([1.0])
    for p in probabilities:
        dist = np.convolve(dist, [1 - p, p])
    return float(dist[k:].sum()) if k < dist.size else 0.0


def unit_permutation_tests(c0: np.ndarray, c: np.ndarray, shifts, *, limit: int = 50_000,
                           seed: int = 0) -> dict[str, Any]:
    """Permutation tests of the unit-level prediction, per shift and jointly.

    Null: the shifted unit's S per-phase contributions are exchangeable. Per shift, over every
    arrangement of its S values (exact when S! <= ``limit``, else ``limit`` seeded draws): ``r2_p``, the
    share whose R² is >= the observed (identity included, so ``p >= 1/S!``), and
    ``identification_null``, the share in which the applied shift is strictly best (about 1/S).
    Jointly: ``identification_p = P(at least n_identified identified)``, exact (Poisson-binomial)."""
    limit = check_int("limit", limit, 1, why=" (permutations per shift at most)")
    seed = check_seed("seed", seed)
    c0, c = np.asarray(c0, float), np.asarray(c, float)
    S = c0.size
    shifts = np.asarray(shifts, int)
    perms, exact = _permutations(S, limit, seed)
    observed = unit_score_arrays(c0, c, shifts, boundary=S - 1)
    identified = strictly_identified(observed["ss_res_by_hypothesis"], shifts)
    r2_p, null_id = [], []
    for k, d in enumerate(shifts):
        permuted = c[k][perms][:, None, :]  # [P, 1, S]
        null = unit_score_arrays(np.broadcast_to(c0, (len(perms), S)), permuted, [d], boundary=S - 1)
        r2_null = np.nan_to_num(null["r2"][:, 0], nan=-np.inf)
        obs = np.nan_to_num(observed["r2"][k], nan=-np.inf)
        hits = int(np.sum(r2_null >= obs - 1e-12))
        r2_p.append(hits / len(perms) if exact else (1 + hits) / (1 + len(perms)))
        null_id.append(float(strictly_identified(null["ss_res_by_hypothesis"], [d])[:, 0].mean()))
    n_identified = int(identified.sum())
    return dict(r2_p=np.array(r2_p), identification_null=np.array(null_id), identified=identified,
                n_identified=n_identified, identification_p=poisson_binomial_tail(null_id, n_identified),
                exact=exact, n_arrangements=len(perms))


# ---------------------------------------------------------------- movement R²
# The paper's figure ("R² between shift and weak-spot movement"): per applied shift d, where did
# the weak spot (whole profile) or the unit's contribution peak go, and does that displacement
# equal d? docs/science.md, "Movement R²".
def representative_shift(shifts, stride: int) -> np.ndarray:
    """Each shift's representative in ``(-S/2, S/2]`` (``d mod S``, minus S above S/2): the one
    convention for applied shifts and measured displacements, fixed before any data."""
    d = np.asarray(shifts, int) % stride
    return np.where(d > stride // 2, d - stride, d)


def profile_displacements(acc0: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Where the weak spots went, for whole-profile results, vectorised over leading axes.

    ``acc0`` ``[..., S]``, ``acc`` ``[..., D, S]``. The hypothesised shift ``k`` whose ``A_0((r - k) mod S)``
    best explains the observed change on the S-1 non-boundary phases (least squares), as its
    representative in (-S/2, S/2]; ties (and flat observations) go to the smallest k."""
    acc0, acc = np.asarray(acc0, float), np.asarray(acc, float)
    S = acc0.shape[-1]
    keep = np.arange(S - 1)
    hyp = acc0[..., _rolled_index(S, np.arange(S))]  # [..., K, S]: A_0((r - k) mod S)
    change = (acc - acc0[..., None, :])[..., keep]  # [..., D, S-1]
    pred = (hyp - acc0[..., None, :])[..., keep]  # [..., K, S-1]
    ss_res = ((change[..., :, None, :] - pred[..., None, :, :]) ** 2).sum(-1)  # [..., D, K]
    ss_tot = ((change - change.mean(-1, keepdims=True)) ** 2).sum(-1)  # [..., D]
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(ss_tot[..., None] > 1e-12, 1.0 - ss_res / ss_tot[..., None], -np.inf)
    return representative_shift(np.argmax(score, axis=-1), S)


def contribution_displacements(ss_res_by_hypothesis: np.ndarray) -> np.ndarray:
    """Where a unit's contribution peak went: the hypothesised shift with the smallest residual over
    all S phases (``ss_res_by_hypothesis`` ``[..., D, S]``), in (-S/2, S/2]; ties go to the smallest k."""
    ss = np.asarray(ss_res_by_hypothesis, float)
    return representative_shift(np.argmin(ss, axis=-1), ss.shape[-1])


def _movement_arrays(displacement: np.ndarray, applied: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Movement R² and squared correlation over the last axis (shifts), vectorised."""
    delta = np.asarray(displacement, float)
    ss_res = ((delta - applied) ** 2).sum(-1)
    centred = delta - delta.mean(-1, keepdims=True)
    ss_tot = (centred ** 2).sum(-1)
    applied_c = applied - applied.mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        # every displacement equal while the applied shifts differ: nothing moved, R² = -inf
        r2 = np.where(ss_tot > 1e-12, 1.0 - ss_res / ss_tot, np.where(ss_res > 1e-12, -np.inf, np.nan))
        denom = np.sqrt(ss_tot * (applied_c ** 2).sum())
        corr2 = np.where((denom > 1e-12) & (delta.shape[-1] >= 3), ((centred * applied_c).sum(-1) / denom) ** 2, np.nan)
    return r2, corr2


def _check_movement_inputs(displacement, shifts, stride) -> tuple[np.ndarray, np.ndarray, int]:
    stride = check_int("stride", stride, 2, why=" (a phase needs at least two values)")
    shifts = list(np.asarray(shifts).reshape(-1)) if not isinstance(shifts, (list, tuple)) else list(shifts)
    for d in shifts:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral):
            raise UserInputError(f"shift={d!r} must be an integer number of slots")
        if d % stride == 0:
            raise UserInputError(f"shift={d} is 0 mod S={stride}: it moves nothing and cannot be scored; use shifts "
                                 f"in 1..{stride - 1} or their negatives")
    if len({d % stride for d in shifts}) != len(shifts):
        raise UserInputError(f"shifts={[int(d) for d in shifts]} repeat a shift mod S={stride} (d and d - S are one "
                             "intervention; count it once)")
    if len(shifts) < 2:
        raise UserInputError(f"shifts={[int(d) for d in shifts]}: movement R² needs at least 2 shifts distinct mod "
                             f"S={stride} (an R² over one point is undefined); S = {stride} allows up to {stride - 1}")
    delta = np.asarray(displacement)
    if delta.shape[-1:] != (len(shifts),):
        raise UserInputError(f"displacement has shape {delta.shape}, expected [..., {len(shifts)}] (one per shift)")
    if not np.issubdtype(delta.dtype, np.integer):
        raise UserInputError(f"displacement must hold integer slot counts, got dtype {delta.dtype}")
    low, high = -((stride - 1) // 2), stride // 2
    bad = delta[(delta < low) | (delta > high)]
    if bad.size:
        raise UserInputError(f"displacement={int(bad.flat[0])} is out of range for S={stride} ({low}..{high}: the "
                             "representative in (-S/2, S/2])")
    return delta.astype(int), representative_shift(np.asarray(shifts, int), stride), stride


def movement_scores(displacement, shifts, stride: int, *, bootstrap=None, confidence: float = 0.95) -> dict:
    """Movement R²: did the weak spot (or a unit's contribution peak) move by the applied shift?

    ``displacement`` ``[D]``: measured displacements, integers in (-S/2, S/2]; ``shifts`` ``[D]``: the
    applied shifts (nonzero and distinct mod S, at least 2; compared as representatives in (-S/2, S/2],
    no unwrapping); ``bootstrap`` ``[B, D]`` (optional): resampled displacements.

    Returns ``movement_r2 = 1 - sum (delta - d)^2 / sum (delta - mean delta)^2`` (-inf when every
    displacement is the same while the shifts differ), ``movement_corr2`` (NaN below 3 points),
    ``n_points``, ``per_shift`` (``shift``, ``applied``, ``displacement``, ``low``/``high`` percentile
    interval, ``error``, ``circular_error`` in (-S/2, S/2]) and, with ``bootstrap``, ``movement_r2_ci``.
    Raises `UserInputError` naming the value for fewer than 2 shifts, repeated or zero shifts mod S,
    and displacements that are not integers in (-S/2, S/2]."""
    delta, applied, S = _check_movement_inputs(displacement, shifts, stride)
    if delta.ndim != 1:
        raise UserInputError(f"displacement has shape {delta.shape}; pass one displacement per shift, [{len(applied)}]")
    check_fraction("confidence", confidence)
    r2, corr2 = _movement_arrays(delta, applied)
    error = delta - applied
    per = pd.DataFrame(dict(shift=[int(d) for d in shifts], applied=applied, displacement=delta,
                            low=np.nan, high=np.nan, error=error, circular_error=representative_shift(error, S)))
    out = dict(movement_r2=float(r2), movement_corr2=float(corr2), n_points=len(applied), per_shift=per)
    if bootstrap is not None:
        boot, _, _ = _check_movement_inputs(bootstrap, shifts, S)
        if boot.ndim != 2:
            raise UserInputError(f"bootstrap has shape {boot.shape}, expected [replicates, {len(applied)}]")
        a = (1 - confidence) / 2
        per["low"] = np.quantile(boot, a, axis=0, method="inverted_cdf")
        per["high"] = np.quantile(boot, 1 - a, axis=0, method="inverted_cdf")
        boot_r2, _ = _movement_arrays(boot, applied)
        finite = boot_r2[~np.isnan(boot_r2)]
        out["movement_r2_ci"] = ([float(np.quantile(finite, a, method="inverted_cdf")),
                                  float(np.quantile(finite, 1 - a, method="inverted_cdf"))] if finite.size
                                 else [float("nan"), float("nan")])
    return out


def movement_point(displacement, shifts, stride: int) -> tuple[float, float]:
    """``(movement_r2, movement_corr2)`` for a result's `scores`: NaN, NaN with fewer than 2 shifts
    (one point has no R²; `movement_scores` raises there instead)."""
    if len(shifts) < 2:
        return float("nan"), float("nan")
    s = movement_scores(np.asarray(displacement, int), list(shifts), stride)
    return s["movement_r2"], s["movement_corr2"]

def phase_means_bootstrap(values: np.ndarray, residue: np.ndarray, residue_modulus: int, stride: int, n_boot: int,
                          rng: np.random.Generator) -> np.ndarray:
    """Per-phase means of ``values`` ``[shift, prompt]`` over ``n_boot`` resamples of the prompts, each
    drawn within its residue group and shared by every shift (a paired bootstrap): ``[B, shift, S]``."""
    S = stride
    sums = np.zeros((n_boot, values.shape[0], S))
    counts = np.zeros(S)
    for g in range(residue_modulus):
        idx = np.flatnonzero(residue == g)
        if idx.size == 0:
            continue
        draw = idx[rng.integers(0, idx.size, size=(n_boot, idx.size))]  # [B, n_g]
        sums[:, :, g % S] += values[:, draw].sum(-1).T
        counts[g % S] += idx.size
    return sums / counts

