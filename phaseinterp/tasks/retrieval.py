"""Key-value retrieval with phase as the only variable: moment-matched target placement (docs/science.md section 3)."""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from phaseinterp.tasks._serialize import task_from_fields
from phaseinterp.tasks.vocab import Vocab

PADDINGS = ("prefix", "in_sequence")

# Tolerances when exact matching is impossible: spread across residue groups.
MEAN_TOLERANCE = 0.5  # max_r mean_r - min_r mean_r, in tokens
STD_TOLERANCE = 0.01  # (max_r std_r - min_r std_r) / target std

# Seed-space separation: each split draws from its own SeedSequence spawn key.
SPLIT_CODES = {"eval": 0, "calibration": 1, "train": 2}
# Disjoint mappings: a mapping's split bit is the parity of sum(PAIR_BITS[key, value]) over its
# records (a fixed pseudo-random bit per key-value pair). generate() keeps parity 0 and
# calibration() parity 1, so no calibration mapping can equal an evaluation mapping, whatever
# the seeds. The table is fixed by this seed, never by the caller's.
_PAIR_BITS_SEED = 20260101
_SPLIT_PARITY = {"eval": 0, "calibration": 1}


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        valid = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name}={value} is out of range (valid: {valid})")


# =============================================================== moment matching
@dataclass(frozen=True, eq=False)
class TargetPlacement:
    """Target positions for every residue group ``r = 0..R-1``: equal counts, matched means and variances.

    ``positions[r]`` holds ``n`` positions ``p`` with ``p mod R == r`` (sorted). ``exact``: the
    sums of ``p`` and of ``p**2`` are identical across groups, so mean and (population)
    variance agree exactly. Otherwise ``within_tolerance`` says whether the spreads across
    groups meet ``mean_tolerance`` (tokens) and ``std_tolerance`` (relative to
    ``target_std``); only a non-strict request can return a placement that does not.
    """

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
        return pd.DataFrame(
            {
                "residue": np.arange(self.modulus),
                "n": np.full(self.modulus, self.n),
                "mean": self.means,
                "std": self.stds,
                "sum": self.positions.sum(axis=1),
                "sum_sq": (self.positions.astype(np.int64) ** 2).sum(axis=1),
                "target_mean": self.target_mean,
                "target_std": self.target_std,
                "exact": self.exact,
                "within_tolerance": self.within_tolerance,
            }
        )


def exact_matching_possible(n: int, modulus: int) -> bool:
    """Whether ``n`` integer positions per residue group can match mean *and* variance exactly.

    With ``p = r + R k`` the group sums satisfy ``sum p = n r (mod R)``, so equal means need
    ``R | n``; the sums of squares satisfy ``sum p^2 = n r^2 + 2 r R K + R^2 (K mod 2)
    (mod 2 R^2)`` with ``K = sum k``, and asking this to agree for r = 0, 1, 2 forces
    ``2 n = 0 (mod 2 R^2)``. Hence: exact iff ``n`` is a multiple of ``R**2`` (any ``n`` for
    R = 1); e.g. 576, 1152, ... prompts per group for R = 24. (Sufficient as soon as the
    position range is wide enough, which :func:`match_target_moments` checks by construction.)
    """
    return n % (modulus * modulus) == 0


def _grid(lo: int, hi: int, modulus: int, r: int) -> tuple[int, int]:
    """First position >= lo with residue r, and how many such positions lie in lo..hi."""
    first = lo + (r - lo) % modulus
    return first, max(0, (hi - first) // modulus + 1)


def _variance_interval(lo: int, hi: int, modulus: int) -> tuple[float, float]:
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

    Every group gets exactly ``n`` positions ``p`` with ``p mod R = r``; the mean and the
    (population) variance of ``p`` agree across groups. Target moments: mean ``(lo+hi)/2``;
    variance inside the interval every group can reach (a group's variance around that
    mean lies between the product of the distances to its two grid points around the mean
    and the product of the distances to its extreme grid points).

    - Exact (equal sums of ``p`` and ``p**2``) iff ``n`` is a multiple of ``R**2`` (see
      :func:`exact_matching_possible`; 576 for R = 24) and the range allows it.
    - Otherwise each group takes the achievable (sum, sum of squares) nearest a common
      target, the target variance being scanned to minimize the spreads (``_plans``), and
      the chosen moments are realized exactly with integer positions (``_realize_counts``).
      Guaranteed: mean spread <= ``mean_tolerance`` tokens and std spread <=
      ``std_tolerance`` (relative). Small ``n`` cannot meet this (a group's sum is ``n r
      mod R``; its sum of squares moves in steps of ``2 R^2``): ``strict`` raises a
      ValueError naming the smallest workable size, ``strict=False`` returns the best
      effort with ``within_tolerance=False`` (for smoke tests, not for measurements).

    Deterministic: no randomness is involved.
    """
    _check_int("modulus", modulus, 1)
    _check_int("n", n, 1)
    if hi - lo + 1 < modulus:
        raise ValueError(
            f"target positions {lo}..{hi} ({max(hi - lo + 1, 0)} positions) cannot realize every residue "
            f"mod {modulus}; need at least {modulus} positions (more for matched variances)"
        )
    var_lo, var_hi = _variance_interval(lo, hi, modulus)
    if not var_lo < var_hi:
        raise ValueError(
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
    raise ValueError(
        f"n_per_residue={n} cannot match the target-position moments across {modulus} residue groups in "
        f"{lo}..{hi} within {mean_tolerance} token (mean) and {std_tolerance:.0%} (std): "
        f"{_smallest_workable(lo, hi, modulus, n, var_lo, var_hi, mean_tolerance, std_tolerance)}; exact "
        f"matching needs a multiple of {modulus * modulus} (or pass strict=False for a best-effort placement)"
    )


def _smallest_workable(
    lo: int, hi: int, modulus: int, n: int, var_lo: float, var_hi: float, mean_tol: float, std_tol: float
) -> str:
    """The next size whose best plan meets the tolerances (plans only, nothing realized: ~1 ms per size)."""
    for size in range(n + 1, n + modulus * modulus + 1):
        if exact_matching_possible(size, modulus) or _plans(lo, hi, modulus, size, var_lo, var_hi, mean_tol, std_tol)[0][0] <= 1:
            return f"the smallest workable n_per_residue above {n} is about {size}"
    return f"no size up to {n + modulus * modulus} works"


# ==================================================================== batches
@dataclass(frozen=True, eq=False)
class TaskBatch:
    """Prompts to score: the logits at ``answer_pos`` must rank ``answer`` first.

    ``meta`` has one row per prompt (target position, residue, distance, padding,
    mapping_id, seed, split, ...; ``phase`` when a stride was given). ``moments`` has one row per
    residue group: achieved mean/std of the target position and the common target.
    ``answer_tokens`` holds the whole answer when it spans several tokens (its first column
    equals ``answer``).
    """

    tokens: Int[Tensor, "batch pos"]
    answer: Int[Tensor, " batch"]
    answer_pos: Int[Tensor, " batch"]
    meta: pd.DataFrame
    moments: pd.DataFrame
    residue_modulus: int
    answer_tokens: Int[Tensor, "batch answer_len"] | None = None
    task: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if len(self.meta) != self.tokens.shape[0]:
            raise ValueError(f"meta has {len(self.meta)} rows but there are {self.tokens.shape[0]} prompts")
        bad = (self.answer_pos < 0) | (self.answer_pos >= self.tokens.shape[1])
        if bool(bad.any()):
            raise ValueError(f"answer_pos must lie in 0..{self.tokens.shape[1] - 1}")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def subset(self, index: Any) -> "TaskBatch":
        """The prompts selected by ``index`` (slice, boolean mask or integer indices)."""
        idx = torch.arange(len(self))[index]
        rows = idx.numpy()
        return dataclasses.replace(
            self,
            tokens=self.tokens[idx],
            answer=self.answer[idx],
            answer_pos=self.answer_pos[idx],
            meta=self.meta.iloc[rows].reset_index(drop=True),
            answer_tokens=None if self.answer_tokens is None else self.answer_tokens[idx],
        )


@dataclass(frozen=True, eq=False)
class TrainBatch:
    """Training prompts. Position ``t``'s logits predict ``targets[:, t]`` (= ``tokens[:, t+1]``).

    ``answer_mask[b, t]``: ``targets[b, t]`` is the value of a query (put the retrieval loss
    here); ``value_mask``: ``targets[b, t]`` is any value token, records included (optional
    extra loss). The last position has no next token: its target is ``<pad>``, both masks off.
    """

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    answer_mask: Bool[Tensor, "batch pos"]
    value_mask: Bool[Tensor, "batch pos"]
    n_records: Int[Tensor, " batch"]


# ============================================================== layout helpers
def _feasible_index_range(
    p: Int[np.ndarray, " batch"], start: int, record_len: int, slack: int, n_records: int
) -> tuple[Int[np.ndarray, " batch"], Int[np.ndarray, " batch"]]:
    """Record indices i that put a record's first token at p: ``G = p - start - L i`` in 0..slack."""
    low = np.maximum(0, -((slack - (p - start)) // record_len))  # ceil((p - start - slack) / L)
    high = np.minimum(n_records - 1, (p - start) // record_len)
    return low, high


def _gaps(
    target_index: Int[np.ndarray, " batch"],
    before: Int[np.ndarray, " batch"],
    slack: int,
    n_records: int,
    padding: str,
    rng: np.random.Generator,
) -> Int[np.ndarray, "batch gap"]:
    """Filler counts in the ``n_records + 1`` gaps (before record 0, ..., after the last record).

    ``before`` fillers go before the target record, the rest after it. ``prefix``: all of
    them in one run at the start and one run after the records, so the records stay
    contiguous and move together. ``in_sequence``: each filler drops into a uniformly random
    gap on its side of the target, so distractors move independently of the target.
    """
    batch = len(target_index)
    gaps = np.zeros((batch, n_records + 1), dtype=np.int64)
    rows = np.arange(batch)
    if padding == "prefix":
        gaps[rows, 0] = before
        gaps[rows, n_records] += slack - before
        return gaps
    if slack == 0:
        return gaps
    u = rng.random((batch, slack))
    k = np.arange(slack)[None, :]
    i = target_index[:, None]
    left = np.minimum((u * (i + 1)).astype(np.int64), i)
    right = np.minimum(i + 1 + (u * (n_records - i)).astype(np.int64), n_records)
    part = np.where(k < before[:, None], left, right)
    np.add.at(gaps, (np.repeat(rows, slack), part.ravel()), 1)
    return gaps


def _lay_out(
    records: Int[np.ndarray, "batch record token"],
    gaps: Int[np.ndarray, "batch gap"],
    tail: Int[np.ndarray, "batch tail"],
    seq_len: int,
    head: Int[np.ndarray, " head"],
    filler_ids: Int[np.ndarray, " filler"],
    rng: np.random.Generator,
) -> tuple[Int[np.ndarray, "batch {seq_len}"], Int[np.ndarray, "batch record"]]:
    """Tokens ``head + (gap, record)* + gap + tail``; returns tokens and each record's first position."""
    batch, n_records, record_len = records.shape
    tokens = rng.choice(filler_ids, size=(batch, seq_len))
    tokens[:, : len(head)] = head
    starts = len(head) + np.cumsum(gaps[:, :n_records], axis=1) + record_len * np.arange(n_records)
    rows = np.arange(batch)[:, None]
    for offset in range(record_len):
        tokens[rows, starts + offset] = records[:, :, offset]
    tokens[:, seq_len - tail.shape[1] :] = tail
    return tokens, starts


def _pair_bits(n_keys: int, n_values: int) -> np.ndarray:
    return np.random.default_rng(_PAIR_BITS_SEED).integers(0, 2, size=(n_keys, n_values))


def _draw_mappings(
    count: int, n_records: int, n_keys: int, n_values: int, split: str, rng: np.random.Generator
) -> tuple[Int[np.ndarray, "{count} {n_records}"], Int[np.ndarray, "{count} {n_records}"]]:
    """``count`` random injective mappings (key index, value index) with the split's parity bit."""
    keys = np.argsort(rng.random((count, n_keys)), axis=1)[:, :n_records]
    values = np.argsort(rng.random((count, n_values)), axis=1)[:, :n_records]
    if split not in _SPLIT_PARITY:
        return keys, values
    bits, wanted = _pair_bits(n_keys, n_values), _SPLIT_PARITY[split]
    while True:
        bad = np.flatnonzero(bits[keys, values].sum(axis=1) % 2 != wanted)
        if len(bad) == 0:
            return keys, values
        keys[bad] = np.argsort(rng.random((len(bad), n_keys)), axis=1)[:, :n_records]
        values[bad] = np.argsort(rng.random((len(bad), n_values)), axis=1)[:, :n_records]


def mapping_split(
    keys: Int[np.ndarray, "*batch record"], values: Int[np.ndarray, "*batch record"], n_keys: int, n_values: int
) -> Int[np.ndarray, "*batch"]:
    """Parity bit of each mapping (key/value *indices* of its records): 0 = evaluation, 1 = calibration."""
    return np.asarray(_pair_bits(n_keys, n_values)[keys, values].sum(axis=-1) % 2)


def _rng(seed: int, split: str, *extra: int) -> np.random.Generator:
    _check_int("seed", seed, 0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SPLIT_CODES[split], *extra)))


def _check_stride(stride: int | None, modulus: int) -> None:
    if stride is None:
        return
    _check_int("stride", stride, 1)
    if modulus % stride:
        divisors = [d for d in range(1, modulus + 1) if modulus % d == 0]
        raise ValueError(
            f"residue_modulus={modulus} is not a multiple of stride={stride}, so residues cannot be folded "
            f"to phases (valid strides: {divisors})"
        )


# ========================================================== key-value retrieval
@dataclass(frozen=True)
class KeyValueRetrieval:
    """Single-token key-value retrieval with phase as the only variable (docs/science.md section 3).

    Prompt (``T = seq_len`` tokens, fixed)::

        <bos> [fillers] k1 v1 [fillers] k2 v2 ... kN vN [fillers] <sep> d1 w1 ... dD wD k*

    ``N = n_records`` records (keys distinct, values distinct, random per prompt), ``D =
    n_demos`` demonstration queries of other records, and the target key ``k*`` at ``T - 1``:
    the logits there must rank its value first. The target record's key sits at distance
    ``T - 1 - p`` in ``min_distance..max_distance`` (default 34..: its key *and* value lie
    beyond two 16-token local windows).

    ``padding``: ``"prefix"`` keeps the records contiguous and slides them together with a
    filler run at the start (the rest of the fillers sit before ``<sep>``); ``"in_sequence"``
    scatters the fillers over the gaps between records, so distractors do not move in
    lockstep with the target. Both keep ``T`` and the query position fixed.
    """

    seq_len: int = 128
    n_records: int = 40
    n_demos: int = 4
    residue_modulus: int = 24
    min_distance: int = 34
    max_distance: int | None = None
    padding: str = "in_sequence"
    vocab: Vocab = field(default_factory=Vocab.default)

    def __post_init__(self) -> None:
        _check_int("seq_len", self.seq_len, 8)
        _check_int("residue_modulus", self.residue_modulus, 1)
        max_records = min(len(self.vocab.keys), len(self.vocab.values))
        _check_int("n_records", self.n_records, 2, max_records)
        # Demonstrations query other records; querying most of them would let a model answer
        # the target by elimination.
        _check_int("n_demos", self.n_demos, 0, (self.n_records - 1) // 2)
        if self.padding not in PADDINGS:
            raise ValueError(f"padding={self.padding!r} is not one of {PADDINGS}")
        if self.slack < 0:
            raise ValueError(
                f"seq_len={self.seq_len} is too short for {self.n_records} records and {self.n_demos} demos "
                f"(needs >= {self.fixed_tokens} tokens)"
            )
        _check_int("min_distance", self.min_distance, 1, self.seq_len - 2)
        if self.max_distance is not None:
            _check_int("max_distance", self.max_distance, self.min_distance, self.seq_len - 2)
        lo, hi = self.target_range
        var_lo, var_hi = _variance_interval(lo, hi, self.residue_modulus) if hi - lo + 1 >= self.residue_modulus else (1, 0)
        if not var_lo < var_hi:
            raise ValueError(
                f"seq_len={self.seq_len} is too short to realize every residue mod {self.residue_modulus} with "
                f"matched moments: the target key can only sit at positions {lo}..{hi} "
                f"({max(hi - lo + 1, 0)} positions; about {2 * self.residue_modulus + 1} or more are needed). "
                f"Lengthen seq_len, or lower n_records/n_demos/min_distance"
            )

    # -------------------------------------------------------------- geometry
    @property
    def fixed_tokens(self) -> int:
        """<bos>, the records, <sep>, the demos and the query: everything but fillers."""
        return 2 * self.n_records + 2 * self.n_demos + 3

    @property
    def slack(self) -> int:
        """Filler tokens per prompt."""
        return self.seq_len - self.fixed_tokens

    @property
    def query_pos(self) -> int:
        return self.seq_len - 1

    @property
    def target_range(self) -> tuple[int, int]:
        """Positions the target key can take: distance range intersected with what the layout reaches."""
        max_distance = self.seq_len - 2 if self.max_distance is None else self.max_distance
        lo = max(1, self.query_pos - max_distance)
        hi = min(self.query_pos - self.min_distance, 1 + self.slack + 2 * (self.n_records - 1))
        return lo, hi

    def placement(self, n_per_residue: int, *, strict: bool = True) -> TargetPlacement:
        """Moment-matched target positions for ``n_per_residue`` prompts per residue (see ``match_target_moments``)."""
        lo, hi = self.target_range
        return match_target_moments(lo, hi, self.residue_modulus, n_per_residue, strict=strict)

    # ------------------------------------------------------------- prompts
    def _build(
        self, positions: np.ndarray, split: str, seed: int, rng: np.random.Generator, mapping_rows: np.ndarray,
        keys: np.ndarray, values: np.ndarray,
    ) -> tuple[np.ndarray, pd.DataFrame, np.ndarray]:
        """Prompts whose target keys sit at ``positions``; ``mapping_rows`` picks each prompt's mapping."""
        batch, n, d = len(positions), self.n_records, self.n_demos
        key_ids, value_ids = np.array(self.vocab.key_ids), np.array(self.vocab.value_ids)
        # The mapping is a set of pairs; record order is drawn per prompt.
        order = np.argsort(rng.random((batch, n)), axis=1)
        k = np.take_along_axis(keys[mapping_rows], order, axis=1)
        v = np.take_along_axis(values[mapping_rows], order, axis=1)
        low, high = _feasible_index_range(positions, 1, 2, self.slack, n)
        target = low + (rng.random(batch) * (high - low + 1)).astype(np.int64)
        gaps = _gaps(target, positions - 1 - 2 * target, self.slack, n, self.padding, rng)
        # Demos: D distinct records other than the target.
        scores = rng.random((batch, n))
        scores[np.arange(batch), target] = np.inf
        demos = np.argsort(scores, axis=1)[:, :d]
        rows = np.arange(batch)[:, None]
        tail = np.empty((batch, 2 * d + 2), dtype=np.int64)
        tail[:, 0] = self.vocab.sep_id
        tail[:, 1:-1:2] = key_ids[k[rows, demos]]
        tail[:, 2:-1:2] = value_ids[v[rows, demos]]
        tail[:, -1] = key_ids[k[np.arange(batch), target]]
        records = np.stack([key_ids[k], value_ids[v]], axis=-1)
        tokens, starts = _lay_out(
            records, gaps, tail, self.seq_len, np.array([self.vocab.bos_id]), np.array(self.vocab.filler_ids), rng
        )
        assert np.array_equal(starts[np.arange(batch), target], positions)
        answer = value_ids[v[np.arange(batch), target]]
        meta = pd.DataFrame(
            {
                "target_pos": positions,
                "residue": positions % self.residue_modulus,
                "distance": self.query_pos - positions,
                "target_index": target,
                "first_record_pos": starts[:, 0],
                "target_key": tokens[:, -1],
                "answer": answer,
                "padding": self.padding,
                "n_records": n,
                "split": split,
                "seed": seed,
            }
        )
        return tokens, meta, answer

    def _batch(self, tokens: np.ndarray, meta: pd.DataFrame, answer: np.ndarray, moments: pd.DataFrame) -> TaskBatch:
        batch = len(tokens)
        return TaskBatch(
            tokens=torch.as_tensor(tokens, dtype=torch.long),
            answer=torch.as_tensor(answer, dtype=torch.long),
            answer_pos=torch.full((batch,), self.query_pos, dtype=torch.long),
            meta=meta,
            moments=moments,
            residue_modulus=self.residue_modulus,
            task=self.to_dict(),
        )

    def generate(
        self,
        n_per_residue: int,
        seed: int = 0,
        *,
        stride: int | None = None,
        n_mappings: int | None = None,
        strict: bool = True,
    ) -> TaskBatch:
        """``n_per_residue`` prompts for every residue ``r = 0..R-1`` (residue-major order).

        Target positions come from :meth:`placement` (moment-matched, see
        :func:`match_target_moments`), shuffled within each group. Every prompt draws its own
        mapping unless ``n_mappings`` is given: then prompts share a pool of that many mappings
        (``meta.mapping_id``; record order, target and demos still vary), and the profile's
        intervals come from a cluster bootstrap over mappings. ``stride`` adds a ``phase``
        column (``target_pos mod S``) and requires ``S | R``. Sizes too small to match the
        moments raise (default ``T = 128``, ``R = 24``: from about 72 per residue) unless
        ``strict=False`` (best effort, flagged in ``moments.within_tolerance``; for smoke tests).
        """
        _check_int("n_per_residue", n_per_residue, 1)
        _check_stride(stride, self.residue_modulus)
        placement = self.placement(n_per_residue, strict=strict)
        rng = _rng(seed, "eval")
        positions = rng.permuted(placement.positions, axis=1).reshape(-1)
        total = len(positions)
        if n_mappings is None:
            mapping_rows = np.arange(total)
        else:
            _check_int("n_mappings", n_mappings, 1, total)
            mapping_rows = rng.permutation(np.arange(total) % n_mappings)
        pool = total if n_mappings is None else n_mappings
        keys, values = _draw_mappings(pool, self.n_records, len(self.vocab.keys), len(self.vocab.values), "eval", rng)
        tokens, meta, answer = self._build(positions, "eval", seed, rng, mapping_rows, keys, values)
        meta.insert(0, "mapping_id", mapping_rows)
        if stride is not None:
            meta.insert(meta.columns.get_loc("residue") + 1, "phase", positions % stride)
        return self._batch(tokens, meta, answer, placement.moments())

    def calibration(self, n: int, seed: int = 0) -> TaskBatch:
        """``n`` prompts whose mappings are disjoint from every :meth:`generate` mapping.

        Same format; residues cycle ``0..R-1`` and positions are uniform over each residue's
        allowed positions (no moment matching: these prompts only supply mean activations).
        Disjointness: mapping parity bit 1 here, 0 in ``generate`` (see ``mapping_split``), and a
        separate seed stream.
        """
        _check_int("n", n, 1)
        rng = _rng(seed, "calibration")
        lo, hi = self.target_range
        residues = np.arange(n) % self.residue_modulus
        firsts = lo + (residues - lo) % self.residue_modulus
        counts = (hi - firsts) // self.residue_modulus + 1
        positions = firsts + self.residue_modulus * (rng.random(n) * counts).astype(np.int64)
        keys, values = _draw_mappings(n, self.n_records, len(self.vocab.keys), len(self.vocab.values), "calibration", rng)
        tokens, meta, answer = self._build(positions, "calibration", seed, rng, np.arange(n), keys, values)
        meta.insert(0, "mapping_id", np.arange(n))
        grouped = meta.groupby("residue")["target_pos"]
        moments = pd.DataFrame(
            {"n": grouped.size(), "mean": grouped.mean(), "std": grouped.std(ddof=0)}
        ).reset_index()
        return self._batch(tokens, meta, answer, moments)

    # --------------------------------------------------------------- training
    def sample_train(
        self,
        batch_size: int,
        rng: np.random.Generator | int,
        *,
        n_records: int | tuple[int, int] | None = None,
        n_queries: int | None = None,
        query_distance: tuple[int, int] | None = None,
    ) -> TrainBatch:
        """Random training prompts: records, ``<sep>``, then a query section ``k v k v ...``.

        No moment matching: the filler count (hence every position) is random, laid out with
        this task's ``padding``. Curriculum knobs:

        - ``n_records``: an int or an inclusive range ``(lo, hi)`` drawn per prompt
          (default: this task's ``n_records``).
        - ``n_queries``: queries per prompt; ``None`` fills the rest of the sequence with
          queries after a random amount of padding.
        - ``query_distance``: ``(lo, hi)`` tokens from a queried record's key to the query key;
          each query draws among the records in that range, and uniformly among all records
          when none is (so later queries of a long query section stay ordinary queries). The
          closest a query can be is 3 tokens (``kN vN <sep> kN``), so ``hi < 3`` is refused.
        Otherwise queries draw records uniformly with replacement. Use ``answer_mask`` for the
        loss on queried values, ``value_mask`` for the loss on every value.
        """
        _check_int("batch_size", batch_size, 1)
        if not isinstance(rng, np.random.Generator):
            rng = _rng(rng, "train")
        max_records = min(len(self.vocab.keys), len(self.vocab.values))
        lo_n, hi_n = (self.n_records, self.n_records) if n_records is None else (
            (n_records, n_records) if isinstance(n_records, (int, np.integer)) else n_records
        )
        _check_int("n_records (lower)", lo_n, 1, max_records)
        _check_int("n_records (upper)", hi_n, lo_n, max_records)
        need = 2 * hi_n + 2 + 2 * (n_queries or 1)
        if need > self.seq_len:
            raise ValueError(
                f"seq_len={self.seq_len} cannot hold {hi_n} records, <bos>, <sep> and {n_queries or 1} queries "
                f"({need} tokens)"
            )
        if n_queries is not None:
            _check_int("n_queries", n_queries, 1)
        if query_distance is not None and not (1 <= query_distance[0] <= query_distance[1] and query_distance[1] >= 3):
            raise ValueError(
                f"query_distance={query_distance} must satisfy 1 <= lo <= hi and hi >= 3: the first query key "
                "sits at least 3 tokens after the last record's key"
            )
        key_ids, value_ids = np.array(self.vocab.key_ids), np.array(self.vocab.value_ids)
        filler_ids = np.array(self.vocab.filler_ids)
        T = self.seq_len
        tokens = np.full((batch_size, T), self.vocab.pad_id, dtype=np.int64)
        answer = np.zeros((batch_size, T), dtype=bool)
        value = np.zeros((batch_size, T), dtype=bool)
        counts = rng.integers(lo_n, hi_n + 1, size=batch_size)
        for b, n in enumerate(counts.tolist()):
            keys, values = _draw_mappings(1, n, len(key_ids), len(value_ids), "train", rng)
            free = T - 2 * n - 2
            if n_queries is None:
                slack = int(rng.integers(0, free - 2 + 1))
                n_q = (free - slack) // 2
                slack = free - 2 * n_q  # an odd leftover becomes padding
            else:
                n_q, slack = n_queries, free - 2 * n_queries
            target = np.array([int(rng.integers(0, n))])
            before = np.array([int(rng.integers(0, slack + 1))])
            gaps = _gaps(target, before, slack, n, self.padding, rng)
            records = np.stack([key_ids[keys[0]], value_ids[values[0]]], axis=-1)[None]
            sep_at = T - 2 * n_q - 1
            queried = self._draw_queries(rng, n, n_q, gaps[0], sep_at, query_distance)
            tail = np.empty((1, 2 * n_q + 1), dtype=np.int64)
            tail[0, 0] = self.vocab.sep_id
            tail[0, 1::2] = records[0, queried, 0]
            tail[0, 2::2] = records[0, queried, 1]
            row, starts = _lay_out(records, gaps, tail, T, np.array([self.vocab.bos_id]), filler_ids, rng)
            tokens[b] = row[0]
            answer[b, sep_at + 1 : T : 2] = True  # positions of query keys predict their values
            value[b, starts[0]] = True
            value[b, sep_at + 1 : T : 2] = True
        targets = np.full_like(tokens, self.vocab.pad_id)
        targets[:, :-1] = tokens[:, 1:]
        return TrainBatch(
            tokens=torch.as_tensor(tokens),
            targets=torch.as_tensor(targets),
            answer_mask=torch.as_tensor(answer),
            value_mask=torch.as_tensor(value),
            n_records=torch.as_tensor(counts, dtype=torch.long),
        )

    @staticmethod
    def _draw_queries(
        rng: np.random.Generator, n: int, n_q: int, gaps: np.ndarray, sep_at: int, distance: tuple[int, int] | None
    ) -> np.ndarray:
        if distance is None:
            return rng.integers(0, n, size=n_q)
        starts = 1 + np.cumsum(gaps[:n]) + 2 * np.arange(n)
        out = np.empty(n_q, dtype=np.int64)
        for q in range(n_q):
            d = sep_at + 1 + 2 * q - starts
            inside = np.flatnonzero((d >= distance[0]) & (d <= distance[1]))
            out[q] = rng.choice(inside) if len(inside) else rng.integers(0, n)
        return out

    # --------------------------------------------------------- (de)serialize
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["vocab"] = self.vocab.to_dict()
        return {"kind": type(self).__name__, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KeyValueRetrieval":
        return task_from_fields(cls, d)
