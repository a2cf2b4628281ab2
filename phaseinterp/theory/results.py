"""Result objects of the idealized-model experiments (one flow, a sweep over seeds, a global search), on
the shared result protocol (`phaseinterp.results.Result`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from phaseinterp._checks import check_int, check_real
from phaseinterp.results import Result, plotting, premise_entries

KEY, VALUE = 0, 1


def _probability(name: str, value: Any, high_open: bool = False) -> float:
    """``value`` as a Python float in [0, 1] (``high_open``: [0, 1)): a slot probability to compare with."""
    return check_real(name, value, 0.0, 1.0, high_open=high_open, why=" (a slot probability)")


def _shape(config: dict) -> str:
    return "N={N} S={S} L={L} m={heads}".format(**config)


def effective_slots(p: np.ndarray) -> np.ndarray:
    """``exp(H(p))`` over the last axis: uniform over S slots = S, one-hot = 1."""
    p = np.clip(p, 1e-300, None)
    return np.exp(-(p * np.log(p)).sum(-1))


@dataclass(frozen=True, eq=False, repr=False)
class FlowResult(Result):
    """One gradient-flow (or gradient-descent) run of the log-linear gates.

    ``mean_p[i, h, b, r]``: population mean over chunks of p_h(r) for branch b (0 = key,
    1 = value) at time ``t[i]``; ``min_p``: the same in the worst chunk of the population.
    A head's *slot* r_h is the key slot with the largest ``min(p^K(r), p^V(r+1))`` at the end
    (r in 0..S-2); it *reached* a threshold when ``p^K(r_h)`` and ``p^V(r_h+1)`` are both at or
    above it in the worst chunk.
    """

    config: dict
    method: str
    settings: dict
    t: np.ndarray
    loss: np.ndarray
    mean_p: np.ndarray
    min_p: np.ndarray
    gate_norm: np.ndarray
    initial_gates: np.ndarray
    final_gates: np.ndarray

    @property
    def heads(self) -> int:
        return int(self.mean_p.shape[1])

    @property
    def S(self) -> int:
        return int(self.mean_p.shape[3])

    def _paired(self, p: np.ndarray) -> np.ndarray:
        """``min(p^K(r), p^V(r+1))`` for r = 0..S-2: ``[..., head, S-1]``."""
        return np.minimum(p[..., KEY, :-1], p[..., VALUE, 1:])

    def slots(self) -> list[int]:
        """Final key slot r_h chosen by each head."""
        return [int(r) for r in self._paired(self.mean_p[-1]).argmax(-1)]

    def final(self, worst_chunk: bool = True) -> pd.DataFrame:
        """Per head: its slot, p^K(r_h) and p^V(r_h+1) at the end (worst chunk, or population mean)."""
        p = (self.min_p if worst_chunk else self.mean_p)[-1]
        rows = [dict(head=h, slot=r, p_key=float(p[h, KEY, r]), p_value=float(p[h, VALUE, r + 1]))
                for h, r in enumerate(self.slots())]
        return pd.DataFrame(rows)

    def reached(self, threshold: float = 0.95) -> bool:
        """Every head has ``p^K(r_h) >= threshold`` and ``p^V(r_h+1) >= threshold`` in the worst chunk."""
        threshold = _probability("threshold", threshold)
        f = self.final()
        return bool(((f.p_key >= threshold) & (f.p_value >= threshold)).all())

    def time_to(self, threshold: float = 0.95) -> float:
        """First recorded time at which every head reaches ``threshold`` on its final slot; nan if never."""
        threshold = _probability("threshold", threshold)
        slots = self.slots()
        paired = self._paired(self.min_p)  # [T, head, S-1]
        ok = np.stack([paired[:, h, r] >= threshold for h, r in enumerate(slots)], -1).all(-1)
        return float(self.t[ok.argmax()]) if ok.any() else math.nan

    def choice_times(self, choose_at: float = 0.5) -> list[float]:
        """Per head, the first time its population-mean ``min(p^K(r), p^V(r+1))`` exceeds
        ``choose_at`` for some r (a slot is *chosen*); nan if never."""
        choose_at = _probability("choose_at", choose_at, high_open=True)
        paired = self._paired(self.mean_p).max(-1)  # [T, head]
        return [float(self.t[(paired[:, h] > choose_at).argmax()]) if (paired[:, h] > choose_at).any() else math.nan
                for h in range(self.heads)]

    def slot_fixed(self, choose_at: float = 0.5) -> bool:
        """Once chosen (`choice_times`), every head's leading key slot and leading value slot stay
        r_h and r_h+1 at every later recorded time (and a head that never chose is not fixed)."""
        choose_at = _probability("choose_at", choose_at, high_open=True)
        slots = self.slots()
        for h, t0 in enumerate(self.choice_times(choose_at)):
            if math.isnan(t0):
                return False
            after = self.t >= t0
            if not ((self.mean_p[after, h, KEY].argmax(-1) == slots[h]).all()
                    and (self.mean_p[after, h, VALUE].argmax(-1) == slots[h] + 1).all()):
                return False
        return True

    def collided(self) -> bool:
        """Two or more heads ended on the same slot."""
        return len(set(self.slots())) < self.heads

    def max_loss_increase(self) -> float:
        """Largest increase of the loss between consecutive records (<= 0: monotone)."""
        return float(np.diff(self.loss).max()) if len(self.loss) > 1 else 0.0

    def concentration(self) -> np.ndarray:
        """``[time, head, branch]`` effective number of slots ``exp(H(mean p))``."""
        return effective_slots(self.mean_p)

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of reading ``slots`` as where the flow ends that fail: a gradient flow never
        raises the loss (an increase beyond 1e-6 of the starting loss, with ``method`` the
        Dormand-Prince flow, is an integration error), and every head reached 0.95 on its slot
        (else the slots are where the run stopped, not where it converges)."""
        notes = list(super().premise_notes)
        rise = self.max_loss_increase()
        if self.method == "dormand_prince" and rise > 1e-6 * max(abs(float(self.loss[0])), 1e-12):
            notes.append(f"the loss rose by {rise:.3g} between records: a gradient flow cannot raise it, so the "
                         "integration did not follow the flow (tighten rtol/atol)")
        if not self.reached(0.95):
            notes.append(f"not every head reached 0.95 on its slot by t={float(self.t[-1]):g}: the slots are where "
                         "the run stopped, not where the flow converges (raise t_max)")
        return tuple(notes)

    @property
    def _title(self) -> str:
        return f"FlowResult: {self.method}, {_shape(self.config)}, seed {self.settings.get('seed')}"

    def to_dict(self) -> dict[str, Any]:
        """The model, the init, each head's final slot and worst-chunk p, whether and when every
        head reached 0.95, the loss at start and end, and ``premise`` / ``premise_notes``."""
        f = self.final()
        return dict(method=self.method, **{k: self.config[k] for k in ("N", "S", "L", "heads", "eps", "gamma", "beta")},
                    rho=self.settings.get("rho"), seed=self.settings.get("seed"), slots=self.slots(),
                    min_p_key=float(f.p_key.min()), min_p_value=float(f.p_value.min()),
                    reached_095=self.reached(0.95), time_to_095=self.time_to(0.95), slot_fixed=self.slot_fixed(),
                    collided=self.collided(), loss_start=float(self.loss[0]), loss_end=float(self.loss[-1]),
                    max_loss_increase=self.max_loss_increase(), t_end=float(self.t[-1]), records=len(self.t),
                    **premise_entries(self.premise_notes))

    def to_frame(self) -> pd.DataFrame:
        """Tidy: one row per (time, head, branch, slot) with mean and worst-chunk p, and the loss."""
        T, H, B, S = self.mean_p.shape
        idx = np.indices((T, H, B, S)).reshape(4, -1)
        return pd.DataFrame(dict(
            t=self.t[idx[0]], head=idx[1], branch=np.array(["key", "value"])[idx[2]], slot=idx[3],
            mean_p=self.mean_p.reshape(-1), min_p=self.min_p.reshape(-1), loss=self.loss[idx[0]],
        ))

    def plot(self, **kwargs):
        return plotting().theory.flow_figure(self, **kwargs)


def chance_collision(heads: int, slots: int) -> float:
    """Probability that ``heads`` independent uniform choices among ``slots`` slots are not all distinct."""
    heads, slots = check_int("heads", heads, 1), check_int("slots", slots, 1)
    distinct = 1.0
    for i in range(heads):
        distinct *= max(0.0, 1 - i / slots)
    return 1 - distinct


@dataclass(frozen=True, eq=False, repr=False)
class FlowSweep(Result):
    """`gradient_flow` from many seeds: how often every head reaches ``threshold`` on one slot,
    whether slots stay fixed, how often heads collide. Each fraction rests on ``len(seeds)``
    runs; ``chance_collision`` is what heads picking slots independently and uniformly among
    the S-1 non-boundary slots would give. ``save`` writes each run to ``dir/runs/<i>/``."""

    runs: list
    seeds: list
    threshold: float = 0.95

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for seed, run in zip(self.seeds, self.runs):
            f = run.final()
            rows.append(dict(seed=seed, slots=tuple(run.slots()), reached=run.reached(self.threshold),
                             min_p_key=float(f.p_key.min()), min_p_value=float(f.p_value.min()),
                             time_to_threshold=run.time_to(self.threshold), slot_fixed=run.slot_fixed(),
                             collided=run.collided(), loss_end=float(run.loss[-1]),
                             max_loss_increase=run.max_loss_increase(), t_end=float(run.t[-1])))
        return pd.DataFrame(rows)

    @property
    def _title(self) -> str:
        return f"FlowSweep: {_shape(self.runs[0].config)}, {len(self.seeds)} seeds"

    def to_dict(self) -> dict[str, Any]:
        """The model, and over the seeds: fraction reaching ``threshold``, fraction whose slots stay
        fixed, collision frequency against chance, fraction with a monotone loss, slot counts."""
        df = self.to_frame()
        cfg = self.runs[0].config
        n = len(df)
        return dict(**{k: cfg[k] for k in ("N", "S", "L", "heads", "eps", "kappa", "gamma", "beta")},
                    rho=self.runs[0].settings.get("rho"), seeds=n, threshold=self.threshold,
                    fraction_reached=float(df.reached.mean()), fraction_slot_fixed=float(df.slot_fixed.mean()),
                    collision_frequency=float(df.collided.mean()),
                    chance_collision=chance_collision(cfg["heads"], cfg["S"] - 1),
                    monotone_fraction=float((df.max_loss_increase <= 1e-12).mean()),
                    median_time_to_threshold=float(df.time_to_threshold.median()),
                    slot_counts={int(r): int(c) for r, c in
                                 pd.Series([r for s in df.slots for r in s]).value_counts().sort_index().items()})

    def plot(self, **kwargs):
        return plotting().theory.sweep_figure(self, **kwargs)


@dataclass(frozen=True, eq=False, repr=False)
class SearchResult(Result):
    """Theorem-1 search at one model (`phaseinterp.theory.global_search`).

    ``one_hot``: exact loss of every one-hot assignment (rows up to relabelling heads), sorted;
    ``refined``: where projected gradient descent ended from each start. The claim *holds*
    when every one-hot assignment within ``tol`` of the best loss is of the claimed form
    (``p^K_h = e_{r_h}``, ``p^V_h = e_{r_h+1}``, distinct r_h in 0..S-2) and no refined point is
    lower than that by more than ``tol``. ``margin``: best non-claimed one-hot loss minus the
    best claimed one (> 0 when the claimed form wins; a wrong form scores ``margin`` worse).
    """

    config: dict
    population: str
    n_sequences: int
    tol: float
    one_hot: pd.DataFrame
    refined: pd.DataFrame
    refined_p_key: np.ndarray = field(default_factory=lambda: np.zeros(0))
    refined_p_value: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def best_one_hot_loss(self) -> float:
        return float(self.one_hot.loss.min())

    @property
    def best_refined_loss(self) -> float:
        return float(self.refined.loss.min()) if len(self.refined) else math.inf

    @property
    def claimed_loss(self) -> float:
        claimed = self.one_hot[self.one_hot.claimed_form]
        return float(claimed.loss.min()) if len(claimed) else math.nan

    @property
    def margin(self) -> float:
        other = self.one_hot[~self.one_hot.claimed_form]
        return float(other.loss.min()) - self.claimed_loss if len(other) else math.inf

    def minimizers(self) -> pd.DataFrame:
        """One-hot assignments within ``tol`` of the best loss found (one-hot or refined)."""
        best = min(self.best_one_hot_loss, self.best_refined_loss)
        return self.one_hot[self.one_hot.loss <= best + self.tol]

    def holds(self) -> bool:
        mins = self.minimizers()
        return bool(len(mins) > 0 and mins.claimed_form.all()
                    and self.best_refined_loss >= self.best_one_hot_loss - self.tol)

    @property
    def _title(self) -> str:
        return f"SearchResult: {_shape(self.config)}, eps={self.config['eps']:g}"

    def to_dict(self) -> dict[str, Any]:
        """The model, the best one-hot and refined losses, the claimed form's margin, the minimizer,
        how many random starts reached the best loss, and whether the claim holds."""
        mins = self.minimizers()
        random = self.refined[self.refined.start == "random"] if len(self.refined) else self.refined
        return dict(**{k: self.config[k] for k in ("N", "S", "L", "heads", "eps", "gamma", "beta")},
                    population=self.population, one_hot_assignments=len(self.one_hot),
                    best_loss=self.best_one_hot_loss, claimed_loss=self.claimed_loss, margin=self.margin,
                    best_refined_loss=self.best_refined_loss, n_minimizers=len(mins),
                    minimizer=f"K{list(mins.key_slots.iloc[0])} V{list(mins.value_slots.iloc[0])}" if len(mins) else "",
                    random_starts=len(random),
                    random_starts_reaching_best=int((random.loss <= self.best_one_hot_loss + 1e-6).sum())
                    if len(random) else 0,
                    holds=self.holds())

    def to_frame(self) -> pd.DataFrame:
        return self.one_hot.copy()

    def plot(self, **kwargs):
        return plotting().theory.search_figure(self, **kwargs)


@dataclass(frozen=True, eq=False, repr=False)
class SearchGrid(Result):
    """`SearchResult` at every (N, S, m) of a grid; one row each (its ``to_dict()``) in
    ``to_frame()``. ``save`` writes each point to ``dir/results/<i>/``."""

    results: list

    @property
    def _title(self) -> str:
        return f"SearchGrid: {len(self.results)} points"

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.to_dict() for r in self.results])

    def holds(self) -> bool:
        return all(r.holds() for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        """Grid points, at how many the claim holds, and the smallest margin."""
        df = self.to_frame()
        return dict(grid_points=len(df), holds=int(df.holds.sum()), min_margin=float(df.margin.min()),
                    all_hold=bool(df.holds.all()))

    def plot(self, **kwargs):
        return plotting().theory.search_grid_figure(self, **kwargs)
