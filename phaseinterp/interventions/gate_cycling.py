"""The gate-cycling experiment scored on the whole profile (docs/science.md section 2): `gate_cycling_profile`
tests ``A_d(r) = A_0((r - d) mod S)`` with the gates shifted by `shift_gates`; one unit's own contribution
is `gate_cycling_unit` (`phaseinterp.interventions.unit_cycling`)."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Union, no_type_check

import numpy as np
import pandas as pd
import torch

from phaseinterp._checks import DEFAULT_N_PER_RESIDUE, check_fraction, check_n_per_residue
from phaseinterp._files import progress_bar
from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp.interventions._common import cycling_note, fixed_answer_position, model_device
from phaseinterp.interventions.cycling_stats import (attainable_note, cycling_scores, movement_scores,
                                                     phase_means_bootstrap, profile_displacements)
from phaseinterp.interventions.gate_shifts import gate_shift, mean_gate_logits
from phaseinterp import stats
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp._checks import CyclingOptions, experiment
from phaseinterp.interventions.unit_cycling import GateCyclingChecks
from phaseinterp.models.protocol import model_label as label_of, phase_model
from phaseinterp.profile import PhaseProfile


@dataclass(frozen=True, eq=False, repr=False)
class CyclingResult(Result):
    """`gate_cycling_profile`'s result: per-prompt correctness under each gate shift (shift 0 = unshifted).

    Accuracies are fractions; R² scores are coefficients of determination (1 perfect, 0 the mean,
    negative worse); non-finite scores become None in ``to_dict()``."""

    shifts: tuple[int, ...]
    residue: np.ndarray
    correct: np.ndarray  # [shift, prompt], shift order as in ``shifts``
    residue_modulus: int
    stride: int
    model_label: str = ""
    n_boot: int = 1000
    seed: int = 0
    mode: str = "roll"
    premise_recorded: tuple[str, ...] = ()  # from the model when it ran (`cycling_fitness`)

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of ``A_d(r) = A_0((r - d) mod S)`` that fail: the model is fit for gate cycling
        (``premise_recorded``), the unshifted profile has a phase gap beyond 3 standard errors, and no shift
        drops the accuracy below half the unshifted one. With any failing, ``identified`` is not claimed."""
        acc = self.phase_accuracy()
        phases = self.residue % self.stride
        n = np.array([(phases == r).sum() for r in range(self.stride)])
        notes = list(super().premise_notes)
        gap = stats.phase_gap_note(acc.loc[0].to_numpy(), n, "the unshifted profile")
        notes += [gap] if gap else []
        mean = self.correct.mean(1)
        for d in self.scored_shifts:
            note = stats.collapse_note(float(mean[0]), float(mean[list(self.shifts).index(d)]), f"shift {d:+d}")
            notes += [note] if note else []
        return tuple(notes)

    def phase_accuracy(self, index: Optional[np.ndarray] = None) -> pd.DataFrame:
        """Accuracy per shift (rows) x phase (columns)."""
        phases = self.residue % self.stride
        correct = self.correct if index is None else self.correct[:, index]
        phases = phases if index is None else phases[index]
        acc = np.stack([correct[:, phases == r].mean(1) for r in range(self.stride)], 1)
        frame = pd.DataFrame(acc, index=pd.Index(self.shifts, name="shift"))
        frame.columns.name = "phase"
        return frame

    @property
    def scored_shifts(self) -> tuple[int, ...]:
        """The shifts that are scored: distinct and nonzero mod S (the first of ``d``, ``d - S``
        listed counts; the other is the same intervention and would count its points twice)."""
        seen: dict[int, int] = {}
        for d in self.shifts:
            if d % self.stride:
                seen.setdefault(d % self.stride, d)
        return tuple(seen.values())

    def _scores_for(self, index=None, n_permutations: int = 0) -> dict:
        acc = self.phase_accuracy(index)
        return cycling_scores(acc.loc[0].to_numpy(), {d: acc.loc[d].to_numpy() for d in self.scored_shifts},
                              n_permutations=n_permutations, seed=self.seed)

    @functools.cached_property
    def scores(self) -> dict:
        """Point estimates (`cycling_scores` lists every column): the ``per_shift`` table (headline ``r2``
        on the S-1 non-boundary phases), pooled ``r2_pooled``/``corr2_pooled``, the joint
        ``identification_p``, and ``movement_r2`` / ``movement_corr2`` (`movement`)."""
        return self._scores_for(n_permutations=9999)

    def movement(self, confidence: float = 0.95) -> dict:
        """Movement R² (docs/science.md, "Movement R²"): did the weak spot move by the applied shift?

        Per scored shift d the displacement is the ``displacement`` column of ``scores`` (the best of the S
        hypotheses ``A_0((r - k) mod S)`` on the S-1 non-boundary phases, in (-S/2, S/2]), with a percentile
        bootstrap interval (``n_boot`` resamples within residue groups, paired across shifts). Over the
        shifts: ``movement_r2 = 1 - sum (delta - d)^2 / sum (delta - mean delta)^2``, ``movement_r2_ci`` and
        ``movement_corr2``; `movement_scores` has every column. Raises `UserInputError` with fewer than 2
        scored shifts."""
        confidence = check_fraction("confidence", confidence)  # before the bootstrap
        scored = list(self.scored_shifts)
        point = self.scores["per_shift"].set_index("shift").loc[scored, "displacement"].to_numpy(int)
        acc = phase_means_bootstrap(self.correct.astype(float), self.residue, self.residue_modulus, self.stride,
                                    self.n_boot, np.random.default_rng(self.seed))  # [B, shift, S]
        order = list(self.shifts)
        boot = profile_displacements(acc[:, order.index(0)], acc[:, [order.index(d) for d in scored]])
        return movement_scores(point, scored, self.stride, bootstrap=boot, confidence=confidence)

    def identification(self) -> pd.DataFrame:
        """Rows = applied shift, columns = hypothesised shift ``0..S-1`` (that hypothesis' score), plus the
        best hypothesis, whether it is the applied one (mod S) and the permutation p. When a premise fails
        the ``identified`` column is replaced by ``premise`` ("fails")."""
        ps = self.scores["per_shift"].set_index("shift")
        table = ps[[f"hypothesis_{k}" for k in range(self.stride)]].copy()
        table.columns = pd.Index(range(self.stride), name="hypothesised shift")
        table["best"] = [int(ps.loc[d, "displacement"]) % self.stride for d in ps.index]
        if self.premise_holds:
            table["identified"] = ps["identified"]
        else:
            table["premise"] = "fails"
        table["p"] = ps["identification_p"]
        return table

    def intervals(self, confidence: float = 0.95) -> pd.DataFrame:
        """Bootstrap intervals (prompts resampled within residue groups, paired across shifts)."""
        confidence = check_fraction("confidence", confidence)  # before the bootstrap
        rng = np.random.default_rng(self.seed)
        groups = [np.flatnonzero(self.residue == r) for r in range(self.residue_modulus)]
        samples = []
        columns = ["r2", "r2_all", "r2_interior", "corr2", "mae", "mean_drop"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(self.n_boot):
                idx = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups if g.size])
                s = self._scores_for(idx)
                row = s["per_shift"].set_index("shift")[columns]
                flat = {f"{c}[{d}]": row.loc[d, c] for d in row.index for c in row.columns}
                flat.update(r2_pooled=s["r2_pooled"], corr2_pooled=s["corr2_pooled"],
                            n_identified=s["n_identified"])
                samples.append(flat)
        boot = pd.DataFrame(samples)
        a = (1 - confidence) / 2
        return pd.DataFrame({"low": boot.quantile(a), "high": boot.quantile(1 - a)})

    def to_frame(self) -> pd.DataFrame:
        acc = self.phase_accuracy()
        tidy = acc.stack().rename("accuracy").reset_index()
        acc0 = acc.loc[0].to_numpy()
        tidy["predicted"] = [acc0[(r - d) % self.stride] for d, r in zip(tidy["shift"], tidy["phase"])]
        return tidy

    def to_dict(self) -> dict:
        """Headline scores (`cycling_scores`), JSON-ready: ``r2_*`` (boundary excluded), ``corr2_*``,
        ``movement_r2`` with its interval (NaN with fewer than 2 shifts) and ``identified``; when a premise
        fails, ``identification`` ("not claimed") and ``premise`` / ``premise_notes`` say why."""
        s = self.scores
        ps = s["per_shift"].set_index("shift")
        by = lambda col, cast=float: {int(d): cast(ps.loc[d, col]) for d in ps.index}  # noqa: E731
        movement = self.movement() if s["n_shifts"] >= 2 else None
        notes = self.premise_notes
        return {
            "model": self.model_label,
            "shifts": [int(d) for d in ps.index],
            "points_per_shift": self.stride - 1,
            "r2_pooled": s["r2_pooled"],
            "movement_r2": s["movement_r2"],
            "movement_r2_ci": movement["movement_r2_ci"] if movement else [float("nan")] * 2,
            **premise_entries(notes),
            **({"identified": f"{s['n_identified']} of {s['n_shifts']}"} if not notes
               else {"identification": "not claimed: the premise fails (premise_notes)"}),
            "r2_by_shift": by("r2"),
            "corr2_pooled": s["corr2_pooled"],
            "corr2_by_shift": by("corr2"),
            "r2_all_by_shift": by("r2_all"),
            "r2_interior_by_shift": by("r2_interior"),
            "mae_by_shift": by("mae"),
            "mean_drop_by_shift": by("mean_drop"),
            "displacement_by_shift": by("displacement", int),
            "identification_p": s["identification_p"],
            "movement_corr2": s["movement_corr2"],
            "displacement_ci_by_shift": ({int(r.shift): [int(r.low), int(r.high)]
                                          for r in movement["per_shift"].itertuples()} if movement else {}),
            "identification_p_by_shift": by("identification_p") if "identification_p" in ps else {},
            "identification_p_min_attainable": s.get("identification_min_p", float("nan")),
            **({"identification_by_shift": note} if (note := attainable_note(
                "identification per shift", s.get("identification_min_p_by_shift", float("nan")),
                design=f"{self.stride - 1} points per shift: {math.factorial(self.stride - 1)} arrangements"))
               else {}),
            "boundary_rank_by_shift": by("boundary_rank", int),
        }

    def plot(self, **kwargs):
        return plotting().gate_cycling_figure(self, **kwargs)


def _answer_logits(model, tokens: torch.Tensor, answer_pos: int) -> torch.Tensor:
    return phase_model(model).answer_logits(tokens[:, : answer_pos + 1].to(model_device(model)))


@torch.inference_mode()
def _correct(model, batch, answer_pos: int, batch_size: int) -> np.ndarray:
    out = []
    for i in range(0, batch.tokens.shape[0], batch_size):
        logits = _answer_logits(model, batch.tokens[i : i + batch_size], answer_pos)
        out.append((logits.argmax(-1).cpu() == torch.as_tensor(batch.answer[i : i + batch_size])).numpy())
    return np.concatenate(out)


@torch.inference_mode()
def _baseline_correct(model, baseline, batch, answer_pos: int, batch_size: int) -> np.ndarray:
    """The unshifted row from ``baseline`` (a `PhaseProfile`), after checking that it profiled these
    prompts (its records) and this model (the first batch rerun: same predictions, log-probs to 1e-4)."""
    if not isinstance(baseline, PhaseProfile):
        raise UserInputError(f"baseline must be a PhaseProfile (phase_profile(model, prompts)), got "
                             f"{type(baseline).__name__}")
    records, n = baseline.records, len(batch)
    missing = [c for c in ("predicted", "answer_logprob", "correct") if c not in records]
    if missing:
        raise UserInputError(f"baseline's records lack {missing}: pass a profile made by phase_profile, which records "
                             "each prompt's prediction")
    if len(records) != n:
        raise UserInputError(f"baseline profiles {len(records)} prompts but gate cycling runs {n}: profile the same "
                             "prompts (the same n_per_residue and seed, or one batch passed as prompts= to both)")
    meta = batch.meta.reset_index(drop=True)
    columns = [(c, meta[c].to_numpy()) for c in meta.columns] + [("answer", batch.answer.numpy())]
    for name, values in columns:
        if name not in records or not np.array_equal(records[name].to_numpy(), values):
            raise UserInputError(f"baseline's records differ from the prompts in {name!r}: it profiled other prompts "
                                 "(the same n_per_residue and seed, or one batch passed as prompts= to both)")
    k = min(batch_size, n)
    logits = _answer_logits(model, batch.tokens[:k], answer_pos).float()
    predicted = logits.argmax(-1).cpu().numpy()
    logprob = logits.log_softmax(-1).gather(1, batch.answer[:k, None].to(logits.device).long())[:, 0].cpu().numpy()
    recorded, recorded_logprob = records["predicted"].to_numpy()[:k], records["answer_logprob"].to_numpy()[:k]
    off = ~np.isclose(logprob, recorded_logprob, rtol=0, atol=1e-4)  # -inf matches -inf
    gap = float(np.nan_to_num(np.abs(logprob[off] - recorded_logprob[off]), nan=np.inf).max(initial=0.0))
    if not np.array_equal(predicted, recorded) or off.any():
        changed = int((predicted != recorded).sum())
        raise UserInputError(f"baseline does not match this model: rerun unshifted on the first {k} prompts it "
                             f"predicts {changed} answer(s) differently and the answer log-probs differ by up to "
                             f"{gap:.2g} (at most 1e-4 allowed); profile this model, unshifted, on these prompts")
    return records["correct"].to_numpy().astype(bool)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class CyclingSpec(GateCyclingChecks, CyclingOptions):
    """`gate_cycling_profile`'s options, checked when made; their meanings are its parameters
    (``n_per_residue=None``: the baseline profile's size, else the default)."""

    def validate(self) -> None:
        super().validate()  # branch: its declared choices (CyclingOptions)
        if self.mode == "static" and self.branch != "both":
            raise UserInputError(f"branch={self.branch!r}: mode='static' moves the K and V gates together (branch='both')")

    def size(self, task, baseline=None) -> int:
        """Prompts per residue: ``n_per_residue``, else the baseline profile's, else the default."""
        n = _default_size(self.n_per_residue, baseline, task.residue_modulus)
        return check_n_per_residue(n, task.residue_modulus)

    def check_task(self, task) -> None:
        self.size(task)


@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(CyclingSpec)
def gate_cycling_profile(
    model,
    task=None,
    shifts: Optional[Sequence[int]] = None,
    *,
    layers: Union[int, Sequence[int], None] = None,
    kv_heads: Union[int, Sequence[int], None] = None,
    mode: str = "roll",
    branch: str = "both",
    n_per_residue: Optional[int] = None,
    seed: int = 0,
    n_calibration: int = 256,
    calibration_seed: int = 1,
    batch_size: int = 64,
    n_boot: int = 1000,
    progress: bool = True,
    prompts=None,
    baseline=None,
    spec: Optional[CyclingSpec] = None,
) -> "CyclingResult":
    """Gate cycling scored on the whole accuracy profile (docs/science.md, "Gate cycling"): accuracy
    per phase with the gates of ``layers`` shifted by each of ``shifts`` (`shift_gates`), plus the
    unshifted model (shift 0), against ``A_d(r) = A_0((r - d) mod S)``. Right when EVERY unit is shifted;
    for one unit of many use `gate_cycling_unit`.

    Parameters:
        model: a W = S gated model or a DeepSeek-kernel model (own or Hugging Face), in eval mode.
        task: default: the evaluation task stored with the model.
        shifts: shifts in slots, each non-zero mod S (default: every distinct shift mod S, as its
            representative in (-S/2, S/2]); shifts equal mod S are measured but scored once.
        layers: None (every layer), one index or a list of distinct indices.
        kv_heads: None (every KV head of ``layers``) or the KV heads whose gates move.
        mode: ``"roll"`` (roll the gate parameters, ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}``)
            or ``"static"`` (shift only the prompt-independent part of each slot's gate logit,
            `shift_static_gates`, with mean logits over ``n_calibration`` calibration prompts).
        branch: ``"both"``, ``"k"`` or ``"v"`` (roll mode).
        n_per_residue: prompts per residue (default: the baseline's size when ``baseline`` is given,
            else 72; at most 500,000 prompts per call).
        seed: prompt seed, also the bootstrap seed.
        n_boot: bootstrap replicates of the result's ``intervals``.
        prompts: a pre-generated ``task.generate(...)`` batch to reuse across calls.
        spec: a ready `CyclingSpec` instead of the options above (not both).
        baseline: a `PhaseProfile` of this model, unshifted, on the same prompts; its per-prompt
            correctness becomes the shift-0 row. Its records must list the same prompts, and the
            unshifted model rerun on the first batch must predict the recorded tokens with answer
            log-probs within 1e-4; otherwise a `UserInputError` says what differs.

    Returns a `CyclingResult`. On a model not fit for the experiment (`cycling_fitness`) it runs as a
    negative control and ``premise_notes`` say so; ``identified`` is then not claimed."""
    task, layers_list, heads, shifts = spec.prepare(model, task, prompts, spec.branch)
    batch = prompts if prompts is not None else task.generate(spec.size(task, baseline), seed=spec.seed)
    rows = cycling_records(model, task, batch, shifts, layers_list, heads, spec, baseline)
    return CyclingResult(shifts=shifts, residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
                         correct=np.stack(rows), residue_modulus=task.residue_modulus, stride=model.cfg.stride,
                         model_label=label_of(model), n_boot=spec.n_boot, seed=spec.seed, mode=spec.mode,
                         premise_recorded=tuple(n for n in [cycling_note(model)] if n))


def cycling_records(model, task, batch, shifts: tuple[int, ...], layers: list[int], kv_heads: Optional[list[int]],
                    spec: CyclingSpec, baseline=None) -> list[np.ndarray]:
    """Per-prompt correctness of ``batch`` under each of ``shifts`` (0: the unshifted model, or the
    ``baseline`` profile's records when given), one boolean array per shift."""
    answer_pos = fixed_answer_position(batch)
    unshifted = None if baseline is None else _baseline_correct(model, baseline, batch, answer_pos, spec.batch_size)
    mean_logits = None
    if spec.mode == "static":
        calib = task.calibration(spec.n_calibration, seed=spec.calibration_seed)
        mean_logits = mean_gate_logits(model, calib.tokens[:, : answer_pos + 1], layers=layers,
                                       batch_size=spec.batch_size)
    bar = progress_bar(spec.progress, len(shifts), "gate cycling")
    rows = []
    try:
        for d in shifts:
            if d == 0 and unshifted is not None:
                rows.append(unshifted)
                if bar is not None:
                    bar.update(1)
                continue
            with gate_shift(model, d, spec.mode, layers, kv_heads, spec.branch, mean_logits):
                rows.append(_correct(model, batch, answer_pos, spec.batch_size))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows


def _default_size(n_per_residue, baseline, modulus: int):
    """``n_per_residue``, or when None the baseline's prompts per residue (else the default)."""
    if n_per_residue is not None:
        return n_per_residue
    if baseline is not None and hasattr(baseline, "records") and len(baseline.records) % modulus == 0:
        return len(baseline.records) // modulus
    return DEFAULT_N_PER_RESIDUE
