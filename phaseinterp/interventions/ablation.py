"""Per-KV-head mean replacement across phases (docs/science.md section 2): `ablate` replaces ``hook_z``
of the query heads reading a KV head, at the answer position only, by its calibration mean, and reports
``100 * (knockout - clean) / clean`` accuracy per residue and phase. The fast path (`interventions.knockout`)
equals the naive one (a hooked full forward per unit, ``method="naive"``) to 1e-5."""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Union, no_type_check

import numpy as np
import pandas as pd

from phaseinterp._checks import DEFAULT_N_PER_RESIDUE
from phaseinterp.models.protocol import model_label as label_of
from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp._checks import (check_device, check_fraction, check_int, check_n_per_residue, check_name, check_prompt_batch,
                                 check_real, check_seed, check_tensor, listed)
from phaseinterp._files import progress_bar
from phaseinterp.phase import check_residue_modulus
from phaseinterp.interventions._common import (check_calibrated_sweep, check_calibration_size, check_layers,
                                               fixed_answer_position, paired_bootstrap_relative_change,
                                               phase_model_note)
from phaseinterp.interventions.knockout import calibration_mean_z, knockout_measures
from phaseinterp.models.protocol import phase_model
from phaseinterp.tasks import resolve_task
from phaseinterp import stats
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp._checks import AblationOptions, experiment


@dataclass(frozen=True, eq=False, repr=False)
class AblationResult(Result):
    """Clean and knockout correctness per prompt, and everything derived from it (`ablate`'s result).

    ``relative_change`` is in RELATIVE percent, ``100 * (knockout - clean) / clean`` (-100: the phase is
    wiped out), not percentage points; accuracies are fractions. ``units`` lists the knockouts (layer,
    kv_head or -1 for a whole layer or custom head set, the query heads replaced); ``clean_correct`` is
    ``[prompt]``, ``knockout_correct`` ``[prompt, unit]``, ``residue`` each prompt's target residue.

    A published map (`phaseinterp.paper.knockout`) has no prompts: ``source`` names its origin,
    ``published_change`` ``[unit, residue]`` (%) and ``published_clean`` ``[residue]`` (NaN where not
    published) hold it; its phase map is the mean over residues, `phase_tests` refuses it and
    `specialization` applies the threshold alone."""

    units: pd.DataFrame
    residue: np.ndarray
    clean_correct: np.ndarray
    knockout_correct: np.ndarray
    residue_modulus: int
    stride: int
    scope: str
    model_label: str = ""
    n_calibration: int = 0
    clean_logit_answer: Optional[np.ndarray] = None
    knockout_logit_answer: Optional[np.ndarray] = None
    premise_recorded: tuple[str, ...] = ()  # from the model when it ran (a full-attention model)
    published_change: Optional[np.ndarray] = None  # [unit, residue] relative change (%): published maps only
    published_clean: Optional[np.ndarray] = None  # [residue] clean accuracy (fraction): published maps only
    source: str = ""  # where a published map comes from; empty when measured here

    @property
    def published(self) -> bool:
        """True for a published map (`phaseinterp.paper.knockout`): no per-prompt records behind it."""
        return self.published_change is not None

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of phase specialization that fail: the model compresses (``premise_recorded``:
        on full attention a phase is a label), and some phase has a clean accuracy a knockout can
        lower (a collapsed profile, below 10% at every phase, the threshold `specialization` uses, has none)."""
        notes = list(super().premise_notes)
        clean = self.clean.reindex(range(self.stride)).to_numpy(dtype=float)
        if np.isnan(clean).all():  # a published map without its clean profile: nothing to check
            return tuple(notes)
        low = stats.collapsed_profile_note(clean, "the clean profile")
        return tuple(notes + ([low] if low else []))

    # ---------------------------------------------------------------- numbers
    @property
    def clean(self) -> pd.Series:
        """Clean accuracy per phase."""
        if self.published:
            clean = np.full(self.residue_modulus, np.nan) if self.published_clean is None else self.published_clean
            return pd.Series(stats.fold_residues(clean, self.stride), index=pd.Index(range(self.stride), name="phase"),
                             name="correct")
        return pd.Series(self._phase_mean(self.clean_correct), index=pd.Index(range(self.stride), name="phase"),
                         name="correct")

    def _phase_mean(self, values: np.ndarray) -> np.ndarray:
        """Per-prompt ``values`` (``[prompt]`` or ``[prompt, unit]``) by phase, as the paper folds: each
        residue's mean, then each phase's mean over its residues (those with prompts); ``[(unit,) phase]``."""
        by_residue = self._residue_mean(values)  # [(unit,) residue]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a phase without prompts stays NaN
            return np.nanmean(by_residue.reshape(*by_residue.shape[:-1], -1, self.stride), axis=-2)

    def _published_values(self, fold: bool, absolute: bool = False) -> np.ndarray:
        """A published map per unit x residue (or phase: the mean of its residues, the paper's fold):
        the relative change (%), or (``absolute``) the change in percentage points, ``relative x clean``."""
        values = np.asarray(self.published_change, dtype=float)
        if absolute:
            clean = np.full(self.residue_modulus, np.nan) if self.published_clean is None else self.published_clean
            values = values * np.asarray(clean, dtype=float)[None, :]
        return stats.fold_residues(values, self.stride) if fold else values

    def _relative(self, fold: bool, n_boot: int = 2000, seed: int = 0):
        if self.published:
            est = self._published_values(fold)
            return est, np.full_like(est, np.nan), np.full_like(est, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return paired_bootstrap_relative_change(
                self.clean_correct.astype(float), self.knockout_correct.astype(float), self.residue,
                self.residue_modulus, self.stride if fold else None, n_boot=n_boot, seed=seed,
            )

    def _grid(self, values: np.ndarray, columns_name: str) -> pd.DataFrame:
        index = pd.MultiIndex.from_frame(self.units[["layer", "kv_head"]])
        frame = pd.DataFrame(values, index=index)
        frame.columns.name = columns_name
        return frame

    @property
    def relative_change(self) -> pd.DataFrame:
        """``100 (knockout - clean) / clean`` per (layer, kv_head) x phase: the mean of the phase's residues'
        relative changes (the paper's fold; a residue whose clean accuracy is 0 has none and is left out)."""
        est, _, _ = self._relative(fold=True, n_boot=1)
        return self._grid(est, "phase")

    @property
    def relative_change_residue(self) -> pd.DataFrame:
        """The same per (layer, kv_head) x residue."""
        est, _, _ = self._relative(fold=False, n_boot=1)
        return self._grid(est, "residue")

    def to_frame(self, level: str = "phase", n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
        """Tidy rows per (layer, kv_head, phase|residue): accuracies, relative change, 95% CI."""
        check_name("level", level, ("phase", "residue"))
        n_boot, seed = check_int("n_boot", n_boot, 1, why=" (bootstrap replicates)"), check_seed("seed", seed)
        fold = level == "phase"
        est, low, high = self._relative(fold=fold, n_boot=n_boot, seed=seed)
        if self.published:
            return self._published_frame(level, est)
        groups = self.residue % self.stride if fold else self.residue
        n_groups = self.stride if fold else self.residue_modulus
        if fold:  # accuracies as the paper folds them: the mean of the phase's residues
            clean, knocked = self._phase_mean(self.clean_correct), self._phase_mean(self.knockout_correct)
        else:
            clean, knocked = self._residue_mean(self.clean_correct), self._residue_mean(self.knockout_correct)
        rows = []
        for u, unit in self.units.reset_index(drop=True).iterrows():
            for g in range(n_groups):
                rows.append(dict(
                    layer=int(unit.layer), kv_head=int(unit.kv_head), heads=unit.heads, **{level: g},
                    n=int((groups == g).sum()), clean_accuracy=float(clean[g]), knockout_accuracy=float(knocked[u, g]),
                    change_pp=100 * float(knocked[u, g] - clean[g]),
                    relative_change=est[u, g], ci_low=low[u, g], ci_high=high[u, g],
                ))
        return pd.DataFrame(rows)

    def _residue_mean(self, values: np.ndarray) -> np.ndarray:
        """Per-prompt ``values`` by residue, ``[(unit,) residue]`` (NaN for a residue without prompts)."""
        values = np.asarray(values, dtype=float)
        out = np.full((self.residue_modulus,) + values.shape[1:], np.nan)
        for r in np.unique(self.residue):
            out[r] = values[self.residue == r].mean(0)
        return out.T

    def _published_frame(self, level: str, est: np.ndarray) -> pd.DataFrame:
        """`to_frame` of a published map: no prompts (``n`` 0), no intervals (NaN)."""
        fold = level == "phase"
        pp = self._published_values(fold, absolute=True)
        clean = self.clean.to_numpy(dtype=float) if fold else (
            np.full(self.residue_modulus, np.nan) if self.published_clean is None else self.published_clean)
        rows = []
        for u, unit in self.units.reset_index(drop=True).iterrows():
            for g in range(est.shape[1]):
                rows.append(dict(layer=int(unit.layer), kv_head=int(unit.kv_head), heads=unit.heads, **{level: g}, n=0,
                                 clean_accuracy=float(clean[g]), knockout_accuracy=float(clean[g] + pp[u, g] / 100),
                                 change_pp=float(pp[u, g]), relative_change=float(est[u, g]), ci_low=np.nan,
                                 ci_high=np.nan))
        return pd.DataFrame(rows)

    @property
    def absolute_change(self) -> pd.DataFrame:
        """``100 (knockout - clean)`` accuracy in percentage points per (layer, kv_head) x phase."""
        if self.published:
            return self._grid(self._published_values(True, absolute=True), "phase")
        values = 100 * (self._phase_mean(self.knockout_correct) - self._phase_mean(self.clean_correct)[None])
        return self._grid(values, "phase")

    def phase_tests(self, correction: str = "holm", alpha: float = 0.05) -> pd.DataFrame:
        """Per (unit, phase): the knockout's change with a multiplicity-controlled test.

        Each cell is an exact paired McNemar test (`phaseinterp.stats.paired_change`); the p-values of all
        units x phases are adjusted together (``correction``: ``"holm"`` or ``"bh"``,
        `phaseinterp.stats.adjust_p_values`). ``ci_low_pp``/``ci_high_pp`` bound the change (pp) at level
        ``1 - alpha_effective`` (``alpha * p / p_adjusted``), so the interval excludes zero exactly when
        ``significant`` (``p_adjusted <= alpha``). ``change_pp`` is absolute and, with the test, its interval
        and ``clean_accuracy``, on the phase's prompts pooled; ``relative_change`` is the paper's fold
        (`relative_change`: the mean of the residues' relative changes). The two folds agree on ``change_pp``
        when every residue has the same number of prompts."""
        check_fraction("alpha", alpha)
        if self.published:
            raise UserInputError(f"phase_tests needs per-prompt records; {self.model_label!r} is a published map "
                                 f"({self.source}) of relative changes only: read .relative_change, or run ablate() "
                                 "on a model for the tests")
        phases = self.residue % self.stride
        U, S = len(self.units), self.stride
        tests = [stats.paired_change(np.broadcast_to(self.clean_correct[phases == g, None],
                                                     (int((phases == g).sum()), U)),
                                     self.knockout_correct[phases == g]) for g in range(S)]
        p = np.stack([t.p_value for t in tests], 1)  # [unit, phase]
        p_adj = stats.adjust_p_values(p, correction)
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha_eff = np.where(p_adj > 0, alpha * p / p_adj, alpha / p.size)
        alpha_eff = np.clip(np.nan_to_num(alpha_eff, nan=alpha / p.size), 1e-300, alpha)
        folded, _, _ = self._relative(fold=True, n_boot=1)
        rows = []
        for g in range(S):
            sel = phases == g
            ci = stats.paired_change(np.broadcast_to(self.clean_correct[sel, None], (int(sel.sum()), U)),
                                     self.knockout_correct[sel], alpha_eff[:, g])
            clean = float(self.clean_correct[sel].mean()) if sel.any() else np.nan
            for u, unit in enumerate(self.units.itertuples()):
                change = 100 * float(ci.change[u])
                rows.append(dict(
                    layer=int(unit.layer), kv_head=int(unit.kv_head), phase=g, n=int(sel.sum()),
                    clean_accuracy=clean, knockout_accuracy=clean + change / 100, change_pp=change,
                    ci_low_pp=100 * float(ci.lower[u]), ci_high_pp=100 * float(ci.upper[u]),
                    relative_change=float(folded[u, g]), p_value=float(p[u, g]), p_adjusted=float(p_adj[u, g]), alpha_effective=float(alpha_eff[u, g]),
                    significant=bool(p_adj[u, g] <= alpha),
                ))
        return pd.DataFrame(rows)

    def specialization(self, threshold: float = -50.0, min_clean: float = 0.10, correction: str = "holm",
                       alpha: float = 0.05) -> pd.DataFrame:
        """Per unit: the phases where its knockout hurts, and how they are arranged.

        A phase is *hurt* when the change is significant after the correction (`phase_tests`), the relative
        change is ``<= threshold`` (percent) and the clean accuracy is ``>= min_clean``. Columns: ``phases``
        (the longest circular run of adjacent hurt phases), ``n_phases``, ``contiguous`` (every hurt phase
        lies in the run), ``concentration`` (share of the relative loss on the run), ``worst_change`` (%),
        ``worst_change_pp``, ``hurt_phases``. A published map is judged on the threshold and ``min_clean``
        alone."""
        threshold = check_real("threshold", threshold, -100.0, 0.0, high_open=False,
                               why=" (a relative change in percent: a knockout lowers accuracy by at most 100%)")
        min_clean = check_real("min_clean", min_clean, 0.0, 1.0, high_open=False, why=" (a clean accuracy)")
        alpha = check_fraction("alpha", alpha)
        U, S = len(self.units), self.stride
        if self.published:
            rel = self.relative_change.to_numpy(dtype=float)
            pp = self.absolute_change.to_numpy(dtype=float)
            significant = np.ones((U, S), dtype=bool)
        else:
            tests = self.phase_tests(correction, alpha)
            rel = tests.relative_change.to_numpy().reshape(S, U).T
            pp = tests.change_pp.to_numpy().reshape(S, U).T
            significant = tests.significant.to_numpy().reshape(S, U).T
        clean = self.clean.reindex(range(S)).to_numpy(dtype=float)
        clean_ok = np.where(np.isnan(clean), True, clean >= min_clean)
        rows = []
        for u, unit in self.units.reset_index(drop=True).iterrows():
            hurt = significant[u] & (np.nan_to_num(rel[u], nan=0.0) <= threshold) & clean_ok
            run = _longest_circular_run(hurt)
            loss = np.clip(-np.where(clean_ok, np.nan_to_num(rel[u], nan=0.0), 0.0), 0, None)
            share = float(loss[run].sum() / loss.sum()) if loss.sum() > 0 else 0.0
            rows.append(dict(
                layer=int(unit.layer), kv_head=int(unit.kv_head), heads=unit.heads, phases=run,
                n_phases=len(run), contiguous=bool(hurt.sum() == len(run)), concentration=share,
                worst_change=float(np.nanmin(np.where(clean_ok, rel[u], np.nan))) if clean_ok.any() else np.nan,
                worst_change_pp=float(np.nanmin(pp[u])) if np.isfinite(pp[u]).any() else np.nan,
                hurt_phases=[int(g) for g in np.flatnonzero(hurt)],
            ))
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """Headline numbers: model, scope, prompt count, clean accuracy (fraction), the
        specialized units (knockout change <= -50% relative, significant after Holm's correction
        over units x phases, on 1..3 adjacent phases), the units hurt on several phases, and
        ``premise`` / ``premise_notes``."""
        spec = self.specialization()
        strong = spec[(spec.n_phases >= 1) & (spec.n_phases <= 3) & spec.contiguous]
        label = lambda r: f"L{r.layer}H{r.kv_head}" if r.kv_head >= 0 else f"L{r.layer}{list(r.heads)}"  # noqa: E731
        if self.published:
            return {
                "model": self.model_label, "scope": self.scope, "source": self.source, "n_prompts": 0,
                "clean_accuracy": float(np.nanmean(self.clean.to_numpy(dtype=float))) if not self.clean.isna().all()
                else float("nan"),
                "specialized_heads": [f"{label(r)}: phases {r.phases}" for r in strong.itertuples()],
                "multi_phase_units": [f"{label(r)}: phases {r.hurt_phases}" for r in spec.itertuples()
                                      if len(r.hurt_phases) >= 2],
                "test": "none (published map, no prompts): knockout change <= -50% relative on the phase",
                **premise_entries(self.premise_notes),
            }
        return {
            "model": self.model_label, "scope": self.scope, "n_prompts": int(self.residue.size),
            "clean_accuracy": float(self.clean_correct.mean()),
            "specialized_heads": [f"{label(r)}: phases {r.phases}" for r in strong.itertuples()],
            "multi_phase_units": [f"{label(r)}: phases {r.hurt_phases}" for r in spec.itertuples()
                                  if len(r.hurt_phases) >= 2],
            "test": "exact McNemar per unit x phase, Holm over all, alpha 0.05",
            **premise_entries(self.premise_notes),
        }

    def plot(self, **kwargs):
        return plotting().specialization_heatmap(self, **kwargs)


def _longest_circular_run(mask: np.ndarray) -> list[int]:
    n = len(mask)
    if mask.all():
        return list(range(n))
    best: list[int] = []
    for start in range(n):
        if mask[start] and not mask[(start - 1) % n]:
            run = []
            i = start
            while mask[i % n] and len(run) < n:
                run.append(i % n)
                i += 1
            if len(run) > len(best):
                best = run
    return best


def _head_groups(heads: Sequence[Sequence[int]], n_heads: int) -> list[tuple[int, ...]]:
    """Custom knockout units: non-empty groups of query-head ids in ``0..n_heads-1``."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, (list, tuple)) or len(heads) == 0:
        raise UserInputError(f"heads={heads!r} must be a non-empty list of query-head groups, e.g. [[0, 1], [2]] "
                             f"(ids in 0..{n_heads - 1})")
    groups = []
    for given in heads:
        group = listed(given)
        if isinstance(given, numbers.Number) or not isinstance(group, list) or any(
                isinstance(h, bool) or not isinstance(h, numbers.Integral) for h in group):
            raise UserInputError(f"heads={list(heads)!r}: each group must be a list of query head ids in "
                                 f"0..{n_heads - 1}, got {given!r}")
        group = tuple(int(h) for h in group)
        bad = [h for h in group if not (0 <= h < n_heads)]
        if bad or not group:
            raise UserInputError(f"heads={list(heads)}: query head ids must be in 0..{n_heads - 1}, got {group}")
        if len(set(group)) != len(group):
            raise UserInputError(f"heads={[list(g) for g in heads]}: the group {list(group)} names a query head twice "
                                 "(a head is knocked out once per unit)")
        if any(set(group) == set(g) for g in groups):
            raise UserInputError(f"heads={[list(g) for g in heads]}: the group {list(group)} is given twice (identical "
                                 "units would be measured twice and counted twice in the Holm correction)")
        groups.append(group)
    return groups


def _units(model, layers: list[int], scope: str, heads: Optional[Sequence[Sequence[int]]]) -> pd.DataFrame:
    """One row (layer, kv_head, query heads) per knockout unit of ``layers``."""
    cfg = model.cfg
    family = phase_model(model)
    rows = []
    for layer in layers:
        if heads is not None:
            for i, group in enumerate(_head_groups(heads, cfg.n_heads)):
                rows.append(dict(layer=layer, kv_head=-1 - i, heads=group))
        elif scope == "kv_head":
            for kv in family.kv_heads(layer):
                rows.append(dict(layer=layer, kv_head=kv, heads=family.knockout_point(layer, kv).query_heads))
        elif scope == "layer":
            rows.append(dict(layer=layer, kv_head=-1, heads=tuple(range(cfg.n_heads))))
        else:
            raise UserInputError(f"scope={scope!r} is not one of ('kv_head', 'layer')")
    return pd.DataFrame(rows)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class AblationSpec(AblationOptions):
    """`ablate`'s options, checked when made; their meanings are `ablate`'s parameters."""

    def validate(self) -> None:
        check_calibrated_sweep(self)  # method and scope: their declared choices (AblationOptions)
        check_device(self.device)

    def check_model(self, model) -> None:
        """Layer indices in range; custom head groups of query-head ids in range."""
        check_layers(model, self.layer)
        if self.heads is not None:
            _head_groups(self.heads, model.cfg.n_heads)

    def check_task(self, task) -> None:
        """The residue modulus against the stride is checked by `ablate`; here the prompt count
        and a mean over every residue (``n_calibration >= R``)."""
        modulus = task.residue_modulus
        check_n_per_residue(self.n_per_residue, modulus)
        check_calibration_size(self.n_calibration, modulus)


@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(AblationSpec)
def ablate(
    model,
    task=None,
    *,
    layer: Union[int, Sequence[int], None] = None,
    scope: str = "kv_head",
    heads: Optional[Sequence[Sequence[int]]] = None,
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    n_calibration: int = 256,
    seed: int = 0,
    calibration_seed: int = 1,
    batch_size: int = 64,
    method: str = "fast",
    device=None,
    progress: bool = True,
    prompts=None,
    calibration_mean=None,
    spec: Optional[AblationSpec] = None,
) -> AblationResult:
    """Mean replacement per KV head: knock out each unit's ``hook_z`` at the answer position
    and measure the accuracy change per residue and phase (docs/science.md, "Mean replacement").

    The units' ``hook_z`` are replaced by their mean over ``n_calibration`` calibration prompts,
    disjoint from the evaluation prompts. Steps: ``spec`` (`AblationSpec`), `ablation_records`,
    the `AblationResult`.

    Parameters:
        model: a `CompressedTransformer` in eval mode.
        task: default: the evaluation task stored with the model.
        layer: None (every layer), one index or a list of distinct indices in ``0..n_layers-1``.
        scope: ``"kv_head"`` (one unit per KV head and the query heads reading it) or ``"layer"``.
        heads: instead of ``scope``, custom units: lists of query-head ids in ``0..n_heads-1``.
        n_per_residue: evaluation prompts per residue (at most 500,000 prompts per call).
        n_calibration: calibration prompts for the mean, at least R (every residue in the mean).
        seed / calibration_seed: prompt seeds.
        method: ``"fast"`` (the clean prefix once, only the answer position recomputed) or ``"naive"``
            (one hooked full forward per unit); they agree to 1e-5.
        device: move the model there first (default: leave it where it is).
        prompts: a pre-generated ``task.generate(...)`` batch to reuse across calls.
        calibration_mean: a precomputed `calibration_mean_z` ``[layer, head, d_head]`` of these
            calibration settings (`phaseinterp.parallel`).
        spec: a ready `AblationSpec` instead of the options above (not both).

    Returns an `AblationResult` (``relative_change`` in RELATIVE percent)."""
    if getattr(model, "training", False):
        raise UserInputError("ablate needs the model in eval mode; call model.eval() first")
    task = resolve_task(model, task)
    units = _units(model, check_layers(model, spec.layer), spec.scope, spec.heads)
    stride = phase_model(model).stride
    modulus = task.residue_modulus
    check_residue_modulus(modulus, stride)
    if prompts is not None:
        spec.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
    if prompts is None:
        spec.check_task(task)
    else:
        check_prompt_batch(prompts)
        check_calibration_size(spec.n_calibration, modulus)
    if calibration_mean is not None:  # calibration_mean_z's shape
        check_tensor("calibration_mean", calibration_mean, (phase_model(model).n_layers, model.cfg.n_heads,
                                                            model.cfg.d_head))
    device = check_device(spec.device)
    if device is not None:
        model = model.to(device)
    batch = prompts if prompts is not None else task.generate(spec.n_per_residue, seed=spec.seed)
    clean_ok, ko_ok, clean_logit, ko_logit = ablation_records(model, task, batch, units, spec, calibration_mean)
    return AblationResult(
        units=units, residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
        clean_correct=clean_ok.numpy(), knockout_correct=ko_ok.numpy(), residue_modulus=modulus, stride=stride,
        scope="custom" if spec.heads is not None else spec.scope, model_label=label_of(model),
        n_calibration=spec.n_calibration, clean_logit_answer=clean_logit.numpy(), knockout_logit_answer=ko_logit.numpy(),
        premise_recorded=tuple(n for n in [phase_model_note(model, "ablate")] if n),
    )


def ablation_records(model, task, batch, units: pd.DataFrame, spec: AblationSpec, calibration_mean=None):
    """(clean correct ``[prompt]``, knockout correct ``[prompt, unit]``, clean answer logit, knockout
    answer logit) of ``batch``, each unit of ``units`` mean-replaced in turn with the mean ``hook_z``
    of ``spec.n_calibration`` calibration prompts of ``task`` (or ``calibration_mean``)."""
    answer_pos = fixed_answer_position(batch)
    calib = task.calibration(spec.n_calibration, seed=spec.calibration_seed)
    if fixed_answer_position(calib) != answer_pos:
        raise UserInputError("calibration prompts must share the evaluation prompts' answer position")
    mean_z = calibration_mean if calibration_mean is not None else calibration_mean_z(
        model, calib.tokens, answer_pos, spec.batch_size)
    bar = progress_bar(spec.progress, batch.tokens.shape[0] * len(units), f"ablate ({spec.method})")
    # The fast path is the family's (model protocol: has_fast_ablation); both are tested equal to the hooked path.
    try:
        out = knockout_measures(model, batch.tokens, answer_pos, batch.answer, units, mean_z, spec.batch_size,
                                spec.method, bar)
    finally:
        if bar is not None:
            bar.close()
    return out[:4]

