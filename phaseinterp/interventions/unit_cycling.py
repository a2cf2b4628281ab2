"""Gate cycling at the grain of one unit (docs/science.md, "Unit-level gate cycling").

Shift the gates of ONE unit (a layer's KV head, or the KV heads listed) and measure its own contribution
per phase, ``C_d(r) = m(shifted) - m(shifted, unit mean-replaced at the answer position)`` (``m``: mean
answer log-prob or accuracy at phase ``r``), against ``C_d(r) = C_0((r - d) mod S)``. `specialized_units`
picks units by a rule on a selection split; `gate_cycling_unit` scores one on held-out prompts."""

from __future__ import annotations


import functools
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Union, no_type_check

import numpy as np
import pandas as pd
import torch

from phaseinterp._checks import (DEFAULT_N_PER_RESIDUE, Spec, UnitCyclingOptions, check_fraction, check_int,
                                 check_is_model, check_n_per_residue, check_prompt_batch, experiment, listed)
from phaseinterp._files import progress_bar
from phaseinterp import stats
from phaseinterp.interventions._common import (check_calibrated_sweep, check_calibration_size, check_layers,
                                               cycling_note, fixed_answer_position, model_device)
from phaseinterp.interventions.ablation import AblationResult, ablate
from phaseinterp.interventions.cycling_stats import (contribution_displacements, movement_point, movement_scores,
                                                     phase_means_bootstrap, strictly_identified, unit_permutation_tests,
                                                     unit_score_arrays)
from phaseinterp.interventions.knockout import calibration_mean_z, mean_replacement_hook, shifted_knockouts
from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp.tasks import resolve_task
from phaseinterp.models.protocol import model_label as label_of, phase_model
from phaseinterp.interventions.gate_shifts import (check_kv_heads, check_shift, check_shifts, gate_shift,
                                                   mean_gate_logits, shift_targets, static_targets)

SELECTION_SEED = 1000  # the selection split's prompt seed; held-out scoring uses seed 0 by default


def unit_label(layers: Sequence[int], kv_heads: Optional[Sequence[int]]) -> str:
    heads = "" if kv_heads is None else "H" + ",".join(str(h) for h in kv_heads)
    return "+".join(f"L{layer}{heads}" for layer in layers)


@dataclass(frozen=True, eq=False, repr=False)
class UnitCyclingResult(Result):
    """`gate_cycling_unit(...)`'s result: one unit's contribution per phase under each gate shift.

    Per shift ``d`` (0 = unshifted) and prompt: ``measure_shifted`` (answer log-prob or 0/1 correctness
    with the unit's gates shifted by ``d``) and ``measure_knocked`` (the same with the unit mean-replaced
    at the answer position, the mean under the same shift); ``contribution()`` averages their difference
    per phase: ``C_d(r)``. ``scores`` compare ``C_d`` with ``C_0((r - d) mod S)`` (R² over all S phases and
    without the boundary, identification, exact permutation p-values); ``intervals()`` bootstraps prompts."""

    shifts: tuple[int, ...]
    residue: np.ndarray
    measure_shifted: np.ndarray  # [shift, prompt]
    measure_knocked: np.ndarray  # [shift, prompt]
    correct_shifted: np.ndarray  # [shift, prompt] top-1 correctness of the shifted model
    residue_modulus: int
    stride: int
    layers: tuple[int, ...]
    kv_heads: Optional[tuple[int, ...]]
    measure: str = "logprob"
    mode: str = "roll"
    model_label: str = ""
    n_calibration: int = 0
    n_boot: int = 1000
    seed: int = 0
    premise_recorded: tuple[str, ...] = ()  # from the model when it ran (`cycling_fitness`)

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of ``C_d(r) = C_0((r - d) mod S)`` that fail: the model is fit for gate cycling
        (``premise_recorded``), ``C_0`` differs between phases beyond 3 standard errors, and no shift drops
        the accuracy below half the unshifted one. With any failing, ``identified`` is not claimed."""
        notes = list(super().premise_notes)
        phases = self.residue % self.stride
        values = self.measure_shifted[0] - self.measure_knocked[0]
        means = self._phase_means(values[None])[0]
        se = np.array([values[phases == r].std(ddof=1) / np.sqrt(max((phases == r).sum(), 1))
                       if (phases == r).sum() > 1 else np.nan for r in range(self.stride)])
        gap = stats.mean_gap_note(means, se, f"unit {self.unit}'s unshifted contribution ({self.measure})")
        notes += [gap] if gap else []
        accuracy = self.correct_shifted.mean(1)
        for d in self.scored_shifts:
            note = stats.collapse_note(float(accuracy[0]), float(accuracy[list(self.shifts).index(d)]),
                                       f"shifting unit {self.unit} by {d:+d}")
            notes += [note] if note else []
        return tuple(notes)

    # ---------------------------------------------------------------- numbers
    @property
    def unit(self) -> str:
        return unit_label(self.layers, self.kv_heads)

    @property
    def boundary_phase(self) -> int:
        return self.stride - 1

    @property
    def scored_shifts(self) -> tuple[int, ...]:
        """Applied shifts, distinct and nonzero mod S (the first listed of ``d``, ``d - S`` counts)."""
        seen: dict[int, int] = {}
        for d in self.shifts:
            if d % self.stride:
                seen.setdefault(d % self.stride, d)
        return tuple(seen.values())

    def _phase_means(self, values: np.ndarray, index: Optional[np.ndarray] = None) -> np.ndarray:
        phases = self.residue % self.stride
        if index is not None:
            values, phases = values[:, index], phases[index]
        return np.stack([values[:, phases == r].mean(1) for r in range(self.stride)], 1)

    def contribution(self, index: Optional[np.ndarray] = None) -> pd.DataFrame:
        """``C_d(r)``: the unit's mean contribution per shift (rows) x phase (columns)."""
        c = self._phase_means(self.measure_shifted - self.measure_knocked, index)
        frame = pd.DataFrame(c, index=pd.Index(self.shifts, name="shift"))
        frame.columns.name = "phase"
        return frame

    def accuracy(self) -> pd.DataFrame:
        """Top-1 accuracy of the shifted model (the unit intact) per shift x phase."""
        frame = pd.DataFrame(self._phase_means(self.correct_shifted.astype(float)),
                             index=pd.Index(self.shifts, name="shift"))
        frame.columns.name = "phase"
        return frame

    def _arrays(self, index=None) -> tuple[np.ndarray, np.ndarray, list[int]]:
        c = self.contribution(index)
        scored = list(self.scored_shifts)
        return c.loc[0].to_numpy(), c.loc[scored].to_numpy(), scored

    @functools.cached_property
    def scores(self) -> dict:
        """Point estimates and exact permutation tests (`unit_permutation_tests`).

        ``per_shift`` columns: ``shift``, ``r2`` (all S phases), ``r2_no_boundary``, ``corr2``, ``mae``,
        ``boundary_observed`` / ``boundary_predicted``, ``peak_phase`` / ``predicted_peak``,
        ``hypothesis_<k>`` (R² of hypothesised shift k), ``best`` (signed), ``identified``, ``r2_p``,
        ``identification_null``. Pooled: ``r2_pooled``, ``n_identified`` of ``n_shifts``,
        ``identification_p``, ``movement_r2`` / ``movement_corr2`` (NaN with fewer than 2 shifts)."""
        c0, c, scored = self._arrays()
        S, boundary = self.stride, self.boundary_phase
        if not scored:
            raise UserInputError("no shift to score (every shift is 0 mod S)")
        arr = unit_score_arrays(c0, c, scored, boundary)
        tests = unit_permutation_tests(c0, c, scored, seed=self.seed)
        rows = []
        for k, d in enumerate(scored):
            ss = arr["ss_res_by_hypothesis"][k]
            best = int(np.argmin(ss))
            pred = np.roll(c0, d)
            row = dict(shift=int(d), r2=float(arr["r2"][k]), r2_no_boundary=float(arr["r2_no_boundary"][k]),
                       corr2=float(arr["corr2"][k]), mae=float(arr["mae"][k]),
                       boundary_observed=float(c[k][boundary]), boundary_predicted=float(pred[boundary]),
                       peak_phase=int(np.argmax(c[k])), predicted_peak=int(np.argmax(pred)),
                       best=best - S if best > S // 2 else best, identified=bool(tests["identified"][k]),
                       r2_p=float(tests["r2_p"][k]), identification_null=float(tests["identification_null"][k]),
                       n_points=S)
            tot = arr["ss_tot"][k]
            row.update({f"hypothesis_{h}": float(1 - ss[h] / tot) if tot > 1e-12 else float("nan") for h in range(S)})
            rows.append(row)
        per_shift = pd.DataFrame(rows)
        movement_r2, movement_corr2 = movement_point(per_shift["best"], scored, S)
        return dict(per_shift=per_shift, r2_pooled=float(arr["r2_pooled"]), n_shifts=len(scored),
                    n_identified=tests["n_identified"], identification_p=tests["identification_p"],
                    movement_r2=movement_r2, movement_corr2=movement_corr2,
                    permutations_exact=tests["exact"], n_arrangements=tests["n_arrangements"])

    def movement(self, confidence: float = 0.95) -> dict:
        """Movement R² (docs/science.md, "Movement R²"): did the unit's contribution peak move by the
        applied shift?

        Per scored shift the displacement is ``best`` in ``scores`` (the argmax of the circular
        cross-correlation of ``C_d`` with ``C_0``, in (-S/2, S/2], boundary phase kept), with a percentile
        bootstrap interval from the resamples of `intervals`. Over the shifts: ``movement_r2 = 1 - sum (delta -
        d)^2 / sum (delta - mean delta)^2``, ``movement_r2_ci``, ``movement_corr2``; `movement_scores` has every
        column. Raises `UserInputError` with fewer than 2 scored shifts."""
        confidence = check_fraction("confidence", confidence)  # before the bootstrap
        scored = list(self.scored_shifts)
        point = self.scores["per_shift"].set_index("shift").loc[scored, "best"].to_numpy(int)
        return movement_scores(point, scored, self.stride, bootstrap=self._boot["displacement"],
                               confidence=confidence)

    def identification(self) -> pd.DataFrame:
        """Rows = applied shift, columns = hypothesised shift 0..S-1 (R² of that hypothesis), plus
        the best hypothesis, whether it is the applied one, and the chance of that by luck. When a
        premise fails (``premise_notes``) ``identified`` is replaced by ``premise`` ("fails")."""
        ps = self.scores["per_shift"].set_index("shift")
        table = ps[[f"hypothesis_{k}" for k in range(self.stride)]].copy()
        table.columns = pd.Index(range(self.stride), name="hypothesised shift")
        table["best"] = ps["best"] % self.stride
        if self.premise_holds:
            table["identified"] = ps["identified"]
        else:
            table["premise"] = "fails"
        table["chance"] = ps["identification_null"]
        return table

    def _bootstrap(self) -> dict[str, np.ndarray]:
        """Paired bootstrap over prompts (resampled within residue groups, the same draw for every
        shift): contributions ``[B, shift, S]`` and every score per replicate."""
        values = self.measure_shifted - self.measure_knocked  # [shift, prompt]
        c_all = phase_means_bootstrap(values, self.residue, self.residue_modulus, self.stride, self.n_boot,
                                      np.random.default_rng(self.seed))
        order = list(self.shifts)
        scored = list(self.scored_shifts)
        c0 = c_all[:, order.index(0)]
        c = c_all[:, [order.index(d) for d in scored]]
        arr = unit_score_arrays(c0, c, scored, self.boundary_phase)
        arr["identified"] = strictly_identified(arr["ss_res_by_hypothesis"], scored)
        arr["displacement"] = contribution_displacements(arr["ss_res_by_hypothesis"])
        arr["contribution"] = c_all
        return arr

    @functools.cached_property
    def _boot(self) -> dict[str, np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return self._bootstrap()

    def intervals(self, confidence: float = 0.95) -> pd.DataFrame:
        """Percentile bootstrap intervals (``n_boot`` resamples of the prompts within residue groups,
        paired across shifts) of every score: per shift ``r2``, ``r2_no_boundary``, ``corr2``,
        ``mae``; pooled ``r2_pooled`` and ``n_identified``."""
        check_fraction("confidence", confidence)
        arr, a = self._boot, (1 - confidence) / 2
        rows = {}
        for k, d in enumerate(self.scored_shifts):
            for col in ("r2", "r2_no_boundary", "corr2", "mae"):
                rows[f"{col}[{d}]"] = arr[col][:, k]
        rows["r2_pooled"] = arr["r2_pooled"]
        rows["n_identified"] = arr["identified"].sum(-1).astype(float)
        return pd.DataFrame({name: (np.nanquantile(v, a), np.nanquantile(v, 1 - a)) if np.isfinite(v).any()
                             else (np.nan, np.nan) for name, v in rows.items()}, index=["low", "high"]).T

    def profile_frame(self, confidence: float = 0.95) -> pd.DataFrame:
        """Per shift x phase: the observed contribution with its bootstrap interval and the
        prediction ``C_0((r - d) mod S)`` (what ``.plot()`` draws)."""
        confidence = check_fraction("confidence", confidence)
        c = self.contribution()
        c0 = c.loc[0].to_numpy()
        boot, a = self._boot["contribution"], (1 - confidence) / 2
        rows = []
        for k, d in enumerate(self.shifts):
            pred = np.roll(c0, d)
            for r in range(self.stride):
                rows.append(dict(shift=int(d), phase=r, contribution=float(c.iloc[k, r]), predicted=float(pred[r]),
                                 low=float(np.quantile(boot[:, k, r], a)), high=float(np.quantile(boot[:, k, r], 1 - a)),
                                 boundary=r == self.boundary_phase))
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """Tidy per-prompt rows: shift, prompt, residue, phase, the measure shifted and knocked out,
        the contribution (their difference), and the shifted model's correctness."""
        D, N = self.measure_shifted.shape
        return pd.DataFrame(dict(
            shift=np.repeat(np.asarray(self.shifts), N), prompt=np.tile(np.arange(N), D),
            residue=np.tile(self.residue, D), phase=np.tile(self.residue % self.stride, D),
            measure_shifted=self.measure_shifted.reshape(-1), measure_knocked=self.measure_knocked.reshape(-1),
            contribution=(self.measure_shifted - self.measure_knocked).reshape(-1),
            correct_shifted=self.correct_shifted.reshape(-1).astype(bool),
        ))

    def to_dict(self) -> dict:
        """Headline numbers: the unit, shift mode and measure, pooled R² and movement R² with their 95%
        intervals, ``premise`` / ``premise_notes``, identification and its exact joint p, R² per shift and
        where the contribution peaks per shift."""
        s = self.scores
        ps = s["per_shift"].set_index("shift")
        iv = self.intervals()
        by = lambda col, cast=float: {int(d): cast(ps.loc[d, col]) for d in ps.index}  # noqa: E731
        movement = self.movement() if s["n_shifts"] >= 2 else None
        c0 = self.contribution().loc[0].to_numpy()
        notes = self.premise_notes
        return {
            "model": self.model_label, "unit": self.unit, "mode": self.mode, "measure": self.measure,
            "shifts": [int(d) for d in ps.index], "points_per_shift": self.stride,
            "n_prompts": int(self.residue.size),
            "r2_pooled": s["r2_pooled"],
            "r2_pooled_ci": [float(iv.loc["r2_pooled", "low"]), float(iv.loc["r2_pooled", "high"])],
            "movement_r2": s["movement_r2"],
            "movement_r2_ci": movement["movement_r2_ci"] if movement else [float("nan")] * 2,
            **premise_entries(notes),
            **({"identified": f"{s['n_identified']} of {s['n_shifts']}"} if not notes
               else {"identification": "not claimed: the premise fails (premise_notes)"}),
            "r2_by_shift": by("r2"), "r2_no_boundary_by_shift": by("r2_no_boundary"),
            "identification_p": s["identification_p"],
            "movement_corr2": s["movement_corr2"],
            "best_hypothesis_by_shift": by("best", int),
            "displacement_ci_by_shift": ({int(r.shift): [int(r.low), int(r.high)]
                                          for r in movement["per_shift"].itertuples()} if movement else {}),
            "unshifted_peak_phase": int(np.argmax(c0)),
            "peak_phase_by_shift": by("peak_phase", int),
            "boundary_observed_by_shift": by("boundary_observed"),
        }

    def plot(self, **kwargs):
        return plotting().unit_cycling_figure(self, **kwargs)


# ---------------------------------------------------------------- the experiment
def _layer_units(model, layers: list[int], kv_heads: Optional[list[int]]) -> pd.DataFrame:
    """One knockout row per layer: the query heads that read the unit's KV heads in that layer."""
    family = phase_model(model)
    kv = kv_heads[0] if kv_heads is not None and len(kv_heads) == 1 else -1
    rows = []
    for layer in layers:
        groups = family.kv_heads(layer)
        heads = sorted({h for k in (kv_heads if kv_heads is not None else groups) for h in groups[k]})
        rows.append(dict(layer=layer, kv_head=kv, heads=tuple(heads)))
    return pd.DataFrame(rows)


@torch.inference_mode()
def _joint_knockout(model, tokens, answer_pos, answer, units: pd.DataFrame, mean_z, batch_size):
    """Knock out every row of ``units`` at once (a unit spanning several layers): two forwards per
    batch. Returns (clean log-prob, clean correct, knocked log-prob, knocked correct) per prompt."""
    device = model_device(model)
    hooks = [mean_replacement_hook(model, unit.layer, unit.heads, mean_z, answer_pos) for unit in units.itertuples()]
    answer = torch.as_tensor(answer)
    out: list[list[torch.Tensor]] = [[], [], [], []]
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i: i + batch_size, : answer_pos + 1].to(device)
        ans = answer[i: i + batch_size].to(device)[:, None]
        for k, logits in enumerate((model(chunk)[:, answer_pos],
                                    model.run_with_hooks(chunk, fwd_hooks=hooks)[:, answer_pos])):
            out[2 * k].append(logits.float().log_softmax(-1).gather(1, ans)[:, 0].cpu())
            out[2 * k + 1].append((logits.argmax(-1) == ans[:, 0]).cpu())
    clean_lp, clean_ok, ko_lp, ko_ok = (torch.cat(x) for x in out)
    return clean_lp, clean_ok, ko_lp, ko_ok


class GateCyclingChecks:
    """The checks both gate-cycling specs share (`CyclingSpec`, `UnitCyclingSpec`: their options are
    `phaseinterp._checks.GateCyclingOptions`), and those against the model."""

    def validate(self) -> None:
        """Shifts and the size; mode, seed, batch_size ...: their declarations (GateCyclingOptions)."""
        if self.shifts is not None:
            shifts = listed(self.shifts)
            if not isinstance(shifts, list) or not shifts:
                raise UserInputError(f"shifts={self.shifts!r} must be a non-empty list of non-zero integer shifts")
            for d in shifts:
                check_shift(d)
        if self.n_per_residue is not None:
            check_n_per_residue(self.n_per_residue)

    def check_model(self, model) -> None:
        """Layers and KV heads in range; each shift non-zero mod the model's stride."""
        check_layers(model, self.layers)
        check_kv_heads(model, self.kv_heads)
        check_shifts(self.shifts, model.cfg.stride)

    def prepare(self, model, task, prompts, branch: str = "both") -> tuple:
        """The checks before any work (eval mode, the task, layers, KV heads, the gates to move, shifts,
        the given prompts); returns ``(task, layers, kv_heads, shifts)``, normalized."""
        if getattr(model, "training", False):
            raise UserInputError("gate cycling needs the model in eval mode; call model.eval() first")
        task = resolve_task(model, task)
        layers = check_layers(model, self.layers)
        heads = check_kv_heads(model, self.kv_heads)
        if self.mode == "static":
            static_targets(model, layers)
        else:
            shift_targets(model, layers, branch)
        shifts = check_shifts(self.shifts, model.cfg.stride)
        if prompts is not None:
            self.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
            check_prompt_batch(prompts)
        return task, layers, heads, shifts


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class UnitCyclingSpec(GateCyclingChecks, UnitCyclingOptions):
    """`gate_cycling_unit`'s options, checked when made; their meanings are its parameters."""

    def validate(self) -> None:
        if self.layers is None:
            raise UserInputError("gate_cycling_unit shifts and knocks out one unit: name it with layers=[...] (and "
                                 "kv_heads=...); phaseinterp.specialized_units(model, task) picks units by a rule")
        super().validate()

    def check_task(self, task) -> None:
        modulus = task.residue_modulus
        check_n_per_residue(self.n_per_residue, modulus)
        check_calibration_size(self.n_calibration, modulus)



@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(UnitCyclingSpec)
def gate_cycling_unit(
    model,
    task=None,
    shifts: Optional[Sequence[int]] = None,
    *,
    layers: Union[int, Sequence[int], None] = None,
    kv_heads: Union[int, Sequence[int], None] = None,
    measure: str = "logprob",
    mode: str = "roll",
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    seed: int = 0,
    n_calibration: int = 256,
    calibration_seed: int = 1,
    batch_size: int = 64,
    n_boot: int = 1000,
    progress: bool = True,
    prompts=None,
    spec: Optional[UnitCyclingSpec] = None,
) -> UnitCyclingResult:
    """Gate cycling scored on ONE unit's own contribution (docs/science.md, "Unit-level gate cycling").

    Shift the gates of one unit (``layers``, optionally ``kv_heads``) by each of ``shifts`` and measure
    ``C_d(r) = m(shifted) - m(shifted, unit mean-replaced)`` per phase (``measure``: ``"logprob"`` or
    ``"accuracy"``) against ``C_d(r) = C_0((r - d) mod S)``. The other options are `gate_cycling_profile`'s
    (``n_calibration`` also sizes the mean replacement); ``spec``: a ready `UnitCyclingSpec` (not both).
    Returns a `UnitCyclingResult`."""
    check_is_model(model)
    task, layers_list, heads, shifts = spec.prepare(model, task, prompts)
    if prompts is None:
        spec.check_task(task)
    else:
        check_calibration_size(spec.n_calibration, task.residue_modulus)
    batch = prompts if prompts is not None else task.generate(spec.n_per_residue, seed=spec.seed)
    shifted, knocked, correct = unit_cycling_records(model, task, batch, shifts, layers_list, heads, spec)
    return UnitCyclingResult(
        shifts=tuple(shifts), residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
        measure_shifted=np.stack(shifted), measure_knocked=np.stack(knocked), correct_shifted=np.stack(correct),
        residue_modulus=task.residue_modulus, stride=model.cfg.stride, layers=tuple(layers_list),
        kv_heads=None if heads is None else tuple(heads), measure=spec.measure, mode=spec.mode,
        model_label=label_of(model), n_calibration=spec.n_calibration, n_boot=spec.n_boot, seed=spec.seed,
        premise_recorded=tuple(n for n in [cycling_note(model)] if n),
    )


def unit_cycling_records(model, task, batch, shifts, layers_list: list[int], heads: Optional[list[int]],
                         spec: UnitCyclingSpec) -> tuple[list, list, list]:
    """Per shift: the unit's measure with the gates shifted, the same with the unit mean-replaced
    (the mean under the same shift), and the shifted model's correctness; one array per shift."""
    batch_size, mode, measure = spec.batch_size, spec.mode, spec.measure
    answer_pos = fixed_answer_position(batch)
    calib = task.calibration(spec.n_calibration, seed=spec.calibration_seed)
    if fixed_answer_position(calib) != answer_pos:
        raise UserInputError("calibration prompts must share the evaluation prompts' answer position")
    calib_tokens = calib.tokens[:, : answer_pos + 1]
    units = _layer_units(model, layers_list, heads)
    mean_logits = mean_gate_logits(model, calib_tokens, layers=layers_list, batch_size=batch_size) if mode == "static" else None
    def variant(d):
        return lambda: gate_shift(model, d, mode, layers_list, heads, mean_logits=mean_logits)

    bar = progress_bar(spec.progress, len(shifts) * len(batch), f"unit gate cycling ({unit_label(layers_list, heads)})")
    shifted, knocked, correct = [], [], []

    def keep(lp_s, ok_s, lp_k, ok_k):
        if measure == "accuracy":
            shifted.append(ok_s.numpy().astype(float))
            knocked.append(ok_k.numpy().astype(float))
        else:
            shifted.append(lp_s.numpy().astype(float))
            knocked.append(lp_k.numpy().astype(float))
        correct.append(ok_s.numpy().astype(bool))

    try:
        if len(layers_list) == 1:
            # one layer: the layers below it do not change with the shift; they run once for every shift
            # where the family allows (`shifted_knockouts`), and the last position uses the cached prefix
            for out in shifted_knockouts(model, batch.tokens, answer_pos, batch.answer, units,
                                         [variant(d) for d in shifts], calib_tokens, batch_size, bar):
                keep(out.clean_logprob, out.clean_correct, out.knockout_logprob[:, 0], out.knockout_correct[:, 0])
        else:
            for d in shifts:
                with variant(d)():
                    mean_z = calibration_mean_z(model, calib_tokens, answer_pos, batch_size)
                    keep(*_joint_knockout(model, batch.tokens, answer_pos, batch.answer, units, mean_z, batch_size))
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return shifted, knocked, correct


# ---------------------------------------------------------------- which units
@dataclass(frozen=True, eq=False, repr=False)
class UnitSelection(Result):
    """`specialized_units`'s result: which units the rule picked, on which prompts, and why.

    ``table``: one row per candidate unit (layer, kv_head, query heads, hurt phases on the selection
    split, longest adjacent run, worst change in pp, whether its gates can be cycled) and its ``role``:
    ``"specialized"``, ``"control"`` or ``""``."""

    table: pd.DataFrame
    rule: str
    model_label: str = ""
    selection_seed: int = SELECTION_SEED
    n_per_residue: int = DEFAULT_N_PER_RESIDUE
    max_phases: int = 3

    @property
    def specialized(self) -> pd.DataFrame:
        return self.table[self.table.role == "specialized"].reset_index(drop=True)

    @property
    def control(self) -> pd.DataFrame:
        return self.table[self.table.role == "control"].reset_index(drop=True)

    def units(self, role: Optional[str] = None) -> list[dict]:
        """``[{"layers": [l], "kv_heads": [h] or None, "role", "label", "hurt_phases"}]`` per picked unit
        (``layers`` and ``kv_heads`` are `gate_cycling`'s arguments)."""
        rows = self.table[self.table.role != ""] if role is None else self.table[self.table.role == role]
        return [dict(layers=[int(r.layer)], kv_heads=None if r.kv_head < 0 else [int(r.kv_head)], role=r.role,
                     label=f"L{int(r.layer)}H{int(r.kv_head)}" if r.kv_head >= 0 else f"L{int(r.layer)}",
                     hurt_phases=[int(g) for g in r.hurt_phases])
                for r in rows.itertuples()]

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def to_dict(self) -> dict:
        label = lambda r: f"L{int(r.layer)}H{int(r.kv_head)}"  # noqa: E731
        return {
            "model": self.model_label, "rule": self.rule,
            "selection_prompts": f"seed {self.selection_seed}, {self.n_per_residue} per residue",
            "specialized": [f"{label(r)}: phases {list(r.phases)}" for r in self.specialized.itertuples()],
            "control": [f"{label(r)}: largest change {r.largest_change_pp:.1f} pp" for r in self.control.itertuples()],
        }

    def plot(self, **kwargs):
        import plotly.graph_objects as go

        t = self.table
        fig = go.Figure(go.Bar(x=[f"L{r.layer}H{r.kv_head}" for r in t.itertuples()], y=t.n_hurt,
                               marker_color=["#d62728" if r == "specialized" else "#7f7f7f" if r == "control"
                                             else "#1f77b4" for r in t.role],
                               text=list(t.role), hovertext=[str(list(p)) for p in t.hurt_phases]))
        fig.update_layout(title=kwargs.get("title", f"Unit selection: {self.model_label}"),
                          xaxis_title="unit", yaxis_title="phases hurt by the knockout", template="plotly_white")
        return fig


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
@dataclass(frozen=True)
class SelectionSpec(Spec):
    """`specialized_units`' options, checked when made; their meanings are its parameters."""

    layers: Union[int, Sequence[int], None] = None
    max_phases: int = 3
    n_per_residue: int = DEFAULT_N_PER_RESIDUE
    seed: int = SELECTION_SEED
    n_calibration: int = 256
    calibration_seed: int = 1
    batch_size: int = 64
    progress: bool = True

    SWEEP = ("layers", "n_per_residue", "seed", "n_calibration", "calibration_seed", "batch_size")  # `ablate`'s

    def validate(self) -> None:
        check_int("max_phases", self.max_phases, 1)
        check_calibrated_sweep(self)

    def check_model(self, model) -> None:
        """A compressed model (the full-attention twin has no gates to cycle); layers in range."""
        if not model.cfg.is_compressed:
            raise UserInputError("specialized_units: the full-attention model has no gates to cycle")
        check_layers(model, self.layers)

    def check_task(self, task) -> None:
        """The selection sweep's prompt count and calibration set (``n_calibration >= R``)."""
        check_n_per_residue(self.n_per_residue, task.residue_modulus)
        check_calibration_size(self.n_calibration, task.residue_modulus)


@applies_only(SelectionSpec.SWEEP, unless=when_given("ablation", "ablation= is the sweep already run on its own prompts"))
@experiment(SelectionSpec)
def specialized_units(
    model,
    task=None,
    *,
    layers: Union[int, Sequence[int], None] = None,
    max_phases: int = 3,
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    seed: int = SELECTION_SEED,
    n_calibration: int = 256,
    calibration_seed: int = 1,
    batch_size: int = 64,
    progress: bool = True,
    ablation=None,
    spec: Optional[SelectionSpec] = None,
) -> UnitSelection:
    """Pick the units to cycle by a rule fixed in code, on a selection split of prompts.

    Runs `ablate` on ``n_per_residue`` prompts of ``seed`` (a split apart from `gate_cycling`'s held-out
    seed 0) and reads `AblationResult.specialization`. Rule:

    - **specialized**: hurt on 1..``max_phases`` adjacent phases (circularly), fewer than S, gates cyclable;
    - **control**: among cyclable units hurt on no phase, the one with the smallest largest absolute
      change (pp; ties: the lowest layer).

    ``ablation``: a precomputed `AblationResult` on the selection split (the sweep's options then do not
    apply). ``spec``: a ready `SelectionSpec` (not both). Returns a `UnitSelection`;
    ``.units("specialized")`` gives `gate_cycling` arguments."""
    check_is_model(model)
    spec.check_model(model)
    if ablation is None:
        spec.check_task(resolve_task(model, task))
        ablation = ablate(model, task, layer=spec.layers, n_per_residue=spec.n_per_residue,
                          n_calibration=spec.n_calibration, seed=spec.seed, calibration_seed=spec.calibration_seed,
                          batch_size=spec.batch_size, progress=spec.progress)
    else:
        spec.refuse_changed(SelectionSpec.SWEEP, "ablation= is the sweep already run on its own prompts")
        if not isinstance(ablation, AblationResult):
            raise UserInputError(f"ablation must be an AblationResult (ablate(model, ...)), got {type(ablation).__name__}")
        if ablation.stride != phase_model(model).stride:  # another model's sweep
            raise UserInputError(f"ablation= was measured at stride S={ablation.stride}, this model's is "
                                 f"S={phase_model(model).stride}: pass ablate(model, ...) of this model")
        check_layers(model, sorted(set(ablation.units.layer.tolist())), "ablation's layer")
    max_phases, seed = spec.max_phases, spec.seed
    specialization = ablation.specialization()
    absolute = ablation.absolute_change

    def cyclable(layer: int) -> bool:
        try:
            shift_targets(model, [layer], "both")
            return True
        except ValueError:
            return False

    rows = []
    for r in specialization.itertuples():
        rows.append(dict(layer=int(r.layer), kv_head=int(r.kv_head), heads=tuple(r.heads), phases=tuple(r.phases),
                         hurt_phases=tuple(r.hurt_phases), n_hurt=len(r.hurt_phases), contiguous=bool(r.contiguous),
                         largest_change_pp=float(np.nanmax(np.abs(absolute.loc[(r.layer, r.kv_head)].to_numpy()))),
                         cyclable=cyclable(int(r.layer)), role=""))
    table = pd.DataFrame(rows)
    S = model.cfg.stride
    # a unit hurt at every phase serves all of them (at S <= max_phases "1..3 adjacent" would admit it)
    most = min(max_phases, S - 1)  # the rule as applied: never every phase
    special = (table.n_hurt >= 1) & (table.n_hurt <= most) & table.contiguous & table.cyclable
    table.loc[special, "role"] = "specialized"
    quiet = table[(table.n_hurt == 0) & table.cyclable]
    if len(quiet):
        pick = quiet.sort_values(["largest_change_pp", "layer", "kv_head"]).index[0]
        table.loc[pick, "role"] = "control"
    rule = (f"specialized: knockout hurts 1..{most} adjacent phases of {S} (Holm-significant, <= -50% relative, "
            f"clean >= 10%), and nowhere else; control: a cyclable unit hurt on no phase with the smallest largest "
            f"|change| (pp)")
    return UnitSelection(table=table, rule=rule, model_label=label_of(model), selection_seed=seed,
                         n_per_residue=int(ablation.residue.size // ablation.residue_modulus), max_phases=max_phases)
