"""Moment-matched target placement (docs/science.md section 3): `match_target_moments` places ``n`` target
positions per residue ``r = 0..R-1`` with equal means and variances across groups, so phase is the only
variable (exactly when ``R**2`` divides ``n``, within tolerances otherwise)."""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from jaxtyping import Int

from phaseinterp.errors import UserInputError
from phaseinterp._checks import check_int, check_real

# Tolerances when exact matching is impossible: spread across residue groups.
MEAN_TOLERANCE = 0.5  # max_r mean_r - min_r mean_r, in tokens
STD_TOLERANCE = 0.01  # (max_r std_r - min_r std_r) / target std


def check_tolerances(mean_tolerance: float, std_tolerance: float) -> tuple[float, float]:
    """The moment-matching tolerances as Python floats, each a finite number > 0 (the spreads are
    measured in units of them); else a `UserInputError` naming the one that is not."""
    return (check_real("mean_tolerance", mean_tolerance, 0.0, low_open=True, why=" (tokens of mean spread)"),
            check_real("std_tolerance", std_tolerance, 0.0, low_open=True,
                       why=" (std spread relative to the target std)"))


@dataclass(frozen=True, eq=False)
class TargetPlacement:
    """Target positions for every residue group ``r = 0..R-1``: equal counts, matched means and variances.

    ``positions[r]`` holds ``n`` sorted positions ``p`` with ``p mod R == r``. ``exact``: the sums of ``p``
    and ``p**2`` agree across groups. Otherwise ``within_tolerance`` says whether the spreads meet
    ``mean_tolerance`` (tokens) and ``std_tolerance`` (relative to ``target_std``)."""

    modulus: int
    positions: Int[np.ndarray, "residue n"]
    target_mean: float
    target_std: float
    exact: bool
    mean_tolerance: float = MEAN_TOLERANCE
    std_tolerance: float = STD_TOLERANCE

    @property
    def n(self) -> int:
        return self.positions.shape[1]

    @property
    def means(self) -> np.ndarray:
        return self.positions.mean(axis=1)

    @property
    def stds(self) -> np.ndarray:
        return self.positions.std(axis=1)

    @property
    def mean_spread(self) -> float:
        """``max_r mean_r - min_r mean_r`` in tokens."""
        return float(self.means.max() - self.means.min())

    @property
    def std_spread(self) -> float:
        """Relative: ``(max_r std_r - min_r std_r) / target_std``."""
        return float((self.stds.max() - self.stds.min()) / self.target_std) if self.target_std > 0 else 0.0

    @property
    def within_tolerance(self) -> bool:
        return self.exact or (
            self.mean_spread <= self.mean_tolerance + 1e-9 and self.std_spread <= self.std_tolerance + 1e-12
        )

    def moments(self) -> pd.DataFrame:
        """One row per residue group: achieved and target moments."""
        return pd.DataFrame(dict(residue=np.arange(self.modulus), n=np.full(self.modulus, self.n), mean=self.means,
                                 std=self.stds, sum=self.positions.sum(axis=1),
                                 sum_sq=(self.positions.astype(np.int64) ** 2).sum(axis=1),
                                 target_mean=self.target_mean, target_std=self.target_std, exact=self.exact,
                                 within_tolerance=self.within_tolerance))


def exact_matching_possible(n: int, modulus: int) -> bool:
    """Whether ``n`` integer positions per residue group can match mean *and* variance exactly: iff ``n``
    is a multiple of ``R**2`` (any ``n`` for R = 1), from ``sum p = n r (mod R)`` and ``sum p^2 = n r^2 +
    2 r R K + R^2 (K mod 2) (mod 2 R^2)`` with ``p = r + R k``, ``K = sum k``."""
    return n % (modulus * modulus) == 0


def _grid(lo: int, hi: int, modulus: int, r: int) -> tuple[int, int]:
    """First position >= lo with residue r, and how many such positions lie in lo..hi."""
    first = lo + (r - lo) % modulus
    return first, max(0, (hi - first) // modulus + 1)


def variance_interval(lo: int, hi: int, modulus: int) -> tuple[float, float]:
    """Target variances every group can reach with mean (lo+hi)/2: [max of minima, min of maxima]."""
    mu = (lo + hi) / 2
    var_lo, var_hi = 0.0, math.inf
    for r in range(modulus):
        first, m = _grid(lo, hi, modulus, r)
        grid = first + modulus * np.arange(m)
        below, above = grid[grid <= mu], grid[grid >= mu]
        if len(below) == 0 or len(above) == 0:
            return math.inf, -math.inf
        var_lo = max(var_lo, (mu - below.max()) * (above.min() - mu))
        var_hi = min(var_hi, (mu - grid.min()) * (grid.max() - mu))
    return var_lo, var_hi


def check_target_band(lo: int, hi: int, modulus: int, problem: str, remedy: str) -> None:
    """A ValueError (``problem`` + ``remedy``) unless every residue group mod ``modulus`` can get
    positions in ``lo..hi`` with a common mean and variance."""
    var_lo, var_hi = variance_interval(lo, hi, modulus) if hi - lo + 1 >= modulus else (1, 0)
    if not var_lo < var_hi:
        raise UserInputError(
            f"{problem} ({max(hi - lo + 1, 0)} positions; about {2 * modulus + 1} or more are needed): {remedy}"
        )


def _sum_sq_class(n: int, r: int, modulus: int, total: int | np.ndarray) -> int | np.integer | np.ndarray:
    """``sum p^2 mod 2R^2`` for n positions of residue r with ``sum p = total`` (see exact_matching_possible)."""
    k_sum = (total - n * r) // modulus
    return (n * r * r + 2 * r * modulus * k_sum + modulus * modulus * (k_sum % 2)) % (2 * modulus * modulus)


def _realize_counts(n: int, m: int, sum_j: int, sum_j2: int) -> np.ndarray | None:
    """Counts ``c_0..c_{m-1} >= 0`` with ``sum c = n``, ``sum j c_j = sum_j``, ``sum j^2 c_j = sum_j2``.

    Starts from the quantiles of a uniform band with the target mean and variance (so the
    placement looks like a band, not a few spikes), fixes the sum with single +-1 moves, then
    the sum of squares with sum-preserving pair moves (spread ``x-1, y+1``: +2(y-x+1);
    contract ``x+1, y-1``: -2(y-x-1)), largest step first. Returns None if it gets stuck.
    """
    if m == 1:
        return np.array([n]) if sum_j == 0 and sum_j2 == 0 else None
    if not 0 <= sum_j <= n * (m - 1):
        return None
    mu = sum_j / n
    var = sum_j2 / n - mu * mu
    if var < 0:
        return None
    half = math.sqrt(3 * var)
    quantiles = (np.arange(n) + 0.5) / n
    start = np.clip(np.rint(mu - half + 2 * half * quantiles), 0, m - 1).astype(np.int64)
    c = np.bincount(start, minlength=m).astype(np.int64)
    j = np.arange(m, dtype=np.int64)
    while (d_sum := sum_j - int(c @ j)) != 0:
        step = 1 if d_sum > 0 else -1
        movable = (c > 0) & ((j < m - 1) if step > 0 else (j > 0))
        candidates = j[movable]
        after = int(c @ (j * j)) + 2 * candidates * step + 1
        pick = int(candidates[np.argmin(np.abs(sum_j2 - after))])
        c[pick] -= 1
        c[pick + step] += 1
    for _ in range(10_000):
        d_sq = sum_j2 - int(c @ (j * j))
        if d_sq == 0:
            return c
        occupied = j[c > 0]
        x, y = np.meshgrid(occupied, occupied, indexing="ij")
        if d_sq > 0:
            ok = (x >= 1) & (y <= m - 2) & (y >= x) & ((x != y) | (c[x] >= 2))
            steps = 2 * (y - x + 1)
        else:
            ok = y - x >= 2
            steps = 2 * (y - x - 1)
        ok &= steps <= abs(d_sq)
        if not ok.any():
            return None
        k = int(np.argmax(np.where(ok, steps, -1)))
        a, b, s = int(x.flat[k]), int(y.flat[k]), int(steps.flat[k])
        times = max(1, min(abs(d_sq) // s, c[a] // 2 if a == b else min(c[a], c[b])))
        sign = -1 if d_sq > 0 else 1  # spread moves a down and b up
        c[a] -= times
        c[a + sign] += times
        c[b] -= times
        c[b - sign] += times
    return None


def _solve_group(lo: int, hi: int, modulus: int, r: int, n: int, total: int, total_sq: int) -> np.ndarray | None:
    """n positions of residue r in lo..hi with the given sum and sum of squares, or None."""
    first, m = _grid(lo, hi, modulus, r)
    if m == 0 or (total - n * first) % modulus:
        return None
    sum_j = (total - n * first) // modulus
    rest = total_sq - n * first * first - 2 * first * modulus * sum_j
    if rest % (modulus * modulus):
        return None
    counts = _realize_counts(n, m, sum_j, rest // (modulus * modulus))
    if counts is None:
        return None
    return np.repeat(first + modulus * np.arange(m), counts)


def _try_exact(lo: int, hi: int, modulus: int, n: int, target_var: float) -> np.ndarray | None:
    """Common sum and sum of squares for all groups (possible iff R^2 | n), realized per group."""
    mu = (lo + hi) / 2
    r2 = 2 * modulus * modulus
    residues = np.arange(modulus)
    totals = np.arange(round(n * mu) - modulus * modulus, round(n * mu) + modulus * modulus + 1)
    totals = totals[np.argsort(np.abs(totals - n * mu), kind="stable")]
    tried = 0
    for total in totals.tolist():
        if np.any((total - n * residues) % modulus):
            continue
        classes = {int(_sum_sq_class(n, r, modulus, total)) for r in range(modulus)}
        if len(classes) != 1:
            continue
        cls = classes.pop()
        wanted = n * (target_var + (total / n) ** 2)
        base = cls + r2 * round((wanted - cls) / r2)
        for total_sq in sorted((base + r2 * d for d in range(-3, 4)), key=lambda q: abs(q - wanted)):
            groups = [_solve_group(lo, hi, modulus, r, n, total, total_sq) for r in range(modulus)]
            if all(g is not None for g in groups):
                return np.stack(groups)
        tried += 1
        if tried >= 3:
            break
    return None


def _plans(
    lo: int, hi: int, modulus: int, n: int, var_lo: float, var_hi: float, mean_tol: float, std_tol: float
) -> list[tuple[float, float, np.ndarray, np.ndarray]]:
    """Candidate (sum, sum of squares) per group, best first, for a scan of common target variances.

    Each group's sum is restricted to its class ``n r mod R`` within ``n * mean_tol / 2`` of
    ``n * mean`` (so the mean spread stays within ``mean_tol``), its sum of squares to the
    lattice its residue allows (spacing ``2 R^2``). Score: the larger of the two spreads in
    units of their tolerances (<= 1 means the plan meets both). Cheap: nothing is realized.
    """
    mu = (lo + hi) / 2
    r2 = 2 * modulus * modulus
    variances = np.linspace(var_lo, var_hi, 81)[16:65]
    sds_target = np.sqrt(variances)
    totals = np.empty((modulus, len(variances)), dtype=np.int64)
    squares = np.empty_like(totals)
    sds = np.empty((modulus, len(variances)))
    half = n * mean_tol / 2
    for r in range(modulus):
        cls = (n * r) % modulus
        low = math.ceil(n * mu - half)
        first = low + (cls - low) % modulus
        options = np.arange(first, math.floor(n * mu + half) + 1, modulus, dtype=np.int64)
        if len(options) == 0:  # n too small for the mean tolerance: the nearest sums on both sides
            options = np.array([first - modulus, first], dtype=np.int64)
        sq_class = _sum_sq_class(n, r, modulus, options)[:, None]
        wanted = n * (variances[None, :] + (options[:, None] / n) ** 2)
        sq = sq_class + r2 * np.rint((wanted - sq_class) / r2).astype(np.int64)
        sd = np.sqrt(np.maximum(sq / n - (options[:, None] / n) ** 2, 0.0))
        # Normalized to the tolerances, so neither moment uses up its budget for the other.
        score = np.abs(sd - sds_target) / (sds_target * std_tol) + np.abs(options[:, None] / n - mu)[:, :] / mean_tol
        pick = np.argmin(score, axis=0)
        cols = np.arange(len(variances))
        totals[r], squares[r], sds[r] = options[pick], sq[pick, cols], sd[pick, cols]
    means = totals / n
    score = np.maximum(np.ptp(means, axis=0) / mean_tol, np.ptp(sds, axis=0) / (sds_target * std_tol))
    order = np.argsort(score, kind="stable")
    return [(float(score[i]), float(variances[i]), totals[:, i], squares[:, i]) for i in order]


def _nearest_positions(lo: int, hi: int, modulus: int, n: int, mu: float) -> np.ndarray:
    """Best effort for tiny groups: each group cycles through its grid points nearest the centre."""
    groups = []
    for r in range(modulus):
        first, m = _grid(lo, hi, modulus, r)
        grid = first + modulus * np.arange(m)
        near = grid[np.argsort(np.abs(grid - mu), kind="stable")][: max(2, min(m, 4))]
        groups.append(np.sort(np.resize(near, n)))
    return np.stack(groups)


def match_target_moments(
    lo: int,
    hi: int,
    modulus: int,
    n: int,
    *,
    mean_tolerance: float = MEAN_TOLERANCE,
    std_tolerance: float = STD_TOLERANCE,
    strict: bool = True,
) -> TargetPlacement:
    """Place ``n`` target positions per residue group ``r = 0..R-1`` inside ``lo..hi``.

    Every group gets ``n`` positions ``p`` with ``p mod R = r``, with mean ``(lo+hi)/2`` and a common
    (population) variance every group can reach.

    - Exact (equal sums of ``p`` and ``p**2``) iff ``n`` is a multiple of ``R**2``
      (:func:`exact_matching_possible`) and the range allows it.
    - Otherwise each group takes the achievable (sum, sum of squares) nearest a common target, the
      target variance scanned to minimize the spreads (``_plans``), realized with integer positions
      (``_realize_counts``): mean spread <= ``mean_tolerance`` tokens, std spread <= ``std_tolerance``
      (relative). A size too small for that raises a ValueError naming the smallest workable one with
      ``strict``; ``strict=False`` returns the best effort with ``within_tolerance=False``.

    Deterministic."""
    check_int("modulus", modulus, 1)
    check_int("n", n, 1)
    lo, hi = check_int("lo", lo, 0, why=" (the first target position)"), check_int("hi", hi, 0, why=" (the last target position)")
    mean_tolerance, std_tolerance = check_tolerances(mean_tolerance, std_tolerance)
    if hi - lo + 1 < modulus:
        raise UserInputError(
            f"target positions {lo}..{hi} ({max(hi - lo + 1, 0)} positions) cannot realize every residue "
            f"mod {modulus}; need at least {modulus} positions (more for matched variances)"
        )
    var_lo, var_hi = variance_interval(lo, hi, modulus)
    if not var_lo < var_hi:
        raise UserInputError(
            f"target positions {lo}..{hi} ({hi - lo + 1} positions) are too few to give every residue group "
            f"mod {modulus} the same mean and variance; widen the range (about {2 * modulus + 1} positions "
            "or more), e.g. a longer seq_len, fewer records/demos or a wider distance range"
        )
    mu = (lo + hi) / 2

    def placement(positions: np.ndarray, var: float, exact: bool) -> TargetPlacement:
        return TargetPlacement(
            modulus, positions.astype(np.int64), mu, math.sqrt(var), exact, mean_tolerance, std_tolerance
        )

    if exact_matching_possible(n, modulus):
        positions = _try_exact(lo, hi, modulus, n, (var_lo + var_hi) / 2)
        if positions is not None:
            return placement(positions, (var_lo + var_hi) / 2, True)
    plans = _plans(lo, hi, modulus, n, var_lo, var_hi, mean_tolerance, std_tolerance)
    for score, var, totals, squares in plans[:8]:
        if strict and score > 1:
            break  # plans are sorted: none of the rest meets the tolerances either
        groups = [_solve_group(lo, hi, modulus, r, n, int(totals[r]), int(squares[r])) for r in range(modulus)]
        if all(g is not None for g in groups):
            return placement(np.stack(groups), var, False)
    if not strict:
        return placement(_nearest_positions(lo, hi, modulus, n, mu), (var_lo + var_hi) / 2, False)
    raise UserInputError(
        f"n_per_residue={n} cannot match the target-position moments across {modulus} residue groups in "
        f"{lo}..{hi} within {mean_tolerance} token (mean) and {std_tolerance:.0%} (std): "
        f"{_smallest_workable(lo, hi, modulus, n, var_lo, var_hi, mean_tolerance, std_tolerance)}; exact "
        f"matching needs a multiple of {modulus * modulus} (or pass strict=False for a best-effort placement)"
    )


def _smallest_workable(
    lo: int, hi: int, modulus: int, n: int, var_lo: float, var_hi: float, mean_tol: float, std_tol: float
) -> str:
    """The next size whose best plan meets the tolerances (plans only, nothing realized)."""
    for size in range(n + 1, n + modulus * modulus + 1):
        if exact_matching_possible(size, modulus) or _plans(lo, hi, modulus, size, var_lo, var_hi, mean_tol, std_tol)[0][0] <= 1:
            return f"the smallest workable n_per_residue above {n} is about {size}"
    return f"no size up to {n + modulus * modulus} works"

