"""Cyclic gate shifts (docs/science.md section 2): move the gates' slot preferences, watch the weak spots move.

In a W = S model, `cycle_gates` replaces the offset-specific gate parameters by their
circular shift ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}`` (payload maps
untouched). Prediction: ``A_d(r) = A_0((r - d) mod S)``. `gate_cycling` measures it.

DeepSeek kernel: ``gate_proj`` is shared by the slots of a half, so the offset-specific
parameter is ``position_bias``; a shift rolls it by ``d`` within each S-block (for
W = 2S both halves move together, which shifts the preferred phase by ``d``).
"""

from __future__ import annotations

import copy
import functools
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import einops
import numpy as np
import pandas as pd
import torch
from torch import Tensor

from phaseinterp._checks import check_int, check_n_per_residue
from phaseinterp._files import progress_bar
from phaseinterp.interventions._common import (
    check_layers,
    fixed_answer_position,
    model_device,
    resolve_task,
)
from phaseinterp.models.protocol import phase_model
from phaseinterp.interventions.cycling_stats import (  # noqa: F401  (re-exported)
    _hypothesis_scores,
    _permutation_p,
    coefficient_of_determination,
    cycling_scores,
    displacement,
    squared_correlation,
)
from phaseinterp.errors import UserInputError
from phaseinterp.results import Result


def _shift_targets(model, layers: list[int], branch: str) -> list[tuple[torch.nn.Parameter, int, Optional[int]]]:
    """(parameter, slot axis, KV-head axis or None) triples a shift rolls; raises where a shift
    has no defined meaning. The KV-head axis is None where the layer has one shared KV head (the
    Hugging Face DeepSeek-V4 layout). The model protocol names them (`PhaseModel.gate_targets`)."""
    family = phase_model(model)
    return [(t.parameter, t.slot_axis, t.kv_axis) for layer in layers for t in family.gate_targets(layer, branch)]


def _check_shift(shift) -> int:
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
        raise UserInputError(f"shift={shift!r} must be an integer number of slots")
    return int(shift)


def check_kv_heads(model, kv_heads) -> Optional[list[int]]:
    """``None`` (every KV head), one index or a non-empty list of distinct indices in
    ``0..n_kv_heads-1``; anything else is a ValueError naming the value."""
    import numbers

    if kv_heads is None:
        return None
    n = model.cfg.n_kv_heads
    values = [kv_heads] if isinstance(kv_heads, numbers.Integral) and not isinstance(kv_heads, bool) else kv_heads
    if not isinstance(values, (list, tuple, range, np.ndarray)) or len(values) == 0:
        raise UserInputError(f"kv_heads={kv_heads!r} must be a KV-head index in 0..{n - 1}, a non-empty list of them, "
                         "or None for every KV head")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not (0 <= v < n):
            raise UserInputError(f"kv_heads={v!r} is out of range for a model with {n} KV head(s) per layer (0..{n - 1})")
        if int(v) in out:
            raise UserInputError(f"kv_heads={list(values)!r} repeats KV head {int(v)}; list each once")
        out.append(int(v))
    return out


def _rolled(original: Tensor, shift: int, axis: int, kv_axis: Optional[int], kv_heads: Optional[list[int]]) -> Tensor:
    """``original`` rolled by ``shift`` along its slot axis, for the listed KV heads only (all when None)."""
    rolled = torch.roll(original, shifts=shift, dims=axis)
    if kv_heads is None or kv_axis is None:
        return rolled
    index = torch.as_tensor(kv_heads, device=original.device)
    return original.index_copy(kv_axis, index, rolled.index_select(kv_axis, index))


@contextmanager
def _parameters_replaced(pairs: list[tuple[torch.nn.Parameter, Tensor]]) -> Iterator:
    """Write each new value into its parameter for the ``with`` block; restore bit-exactly on exit, also on errors."""
    saved = [p.detach().clone() for p, _ in pairs]
    try:
        with torch.no_grad():
            for p, value in pairs:
                p.copy_(value)
        yield
    finally:
        with torch.no_grad():
            for (p, _), original in zip(pairs, saved):
                p.copy_(original)


@contextmanager
def cycle_gates(model, shift: int, layers: Union[int, Sequence[int], None] = None, branch: str = "both",
                kv_heads: Union[int, Sequence[int], None] = None) -> Iterator:
    """Context manager (the intervention; `gate_cycling` is the experiment): inside the
    ``with`` block the gates of ``layers`` are circularly shifted by ``shift`` slots.

    ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}`` with ``d = shift`` (an integer,
    any sign; payload maps untouched; docs/science.md, "Gate cycling"). ``layers``: None
    (default: every layer), one index or a list of distinct indices. ``kv_heads``: None
    (default: every KV head of those layers) or the KV heads whose gates move (one unit's
    gates: the others keep theirs). ``branch``: ``"both"`` (default), ``"k"`` or ``"v"`` (the
    DeepSeek kernel and tied gates allow only "both"). Defined for W = S gated models and the
    DeepSeek kernel. Restores every parameter bit-exactly on exit, also when the body raises.
    """
    shift = _check_shift(shift)
    heads = check_kv_heads(model, kv_heads)
    targets = _shift_targets(model, check_layers(model, layers), branch)
    pairs = [(p, _rolled(p.detach().clone(), shift, axis, kv_axis, heads)) for p, axis, kv_axis in targets]
    with _parameters_replaced(pairs):
        yield model


def shifted_copy(model, shift: int, layers: Union[int, Sequence[int], None] = None, branch: str = "both",
                 kv_heads: Union[int, Sequence[int], None] = None):
    """A deep copy of ``model`` with its gates permanently shifted by ``shift`` slots (the
    original is untouched); ``layers``, ``branch`` and ``kv_heads`` as in `cycle_gates`."""
    twin = copy.deepcopy(model)
    shift = _check_shift(shift)
    heads = check_kv_heads(twin, kv_heads)
    targets = _shift_targets(twin, check_layers(twin, layers), branch)
    with torch.no_grad():
        for p, axis, kv_axis in targets:
            p.copy_(_rolled(p.detach().clone(), shift, axis, kv_axis, heads))
    return twin


# ---------------------------------------------------------------- the static-part shift
def _static_targets(model, layers: list[int]) -> list[tuple[int, str, torch.nn.Parameter, str, Optional[int]]]:
    """(layer, gate-logit hook, bias parameter, layout, KV-head axis) for the static-part shift.

    Layouts map the per-slot mean logit ``[slot, kv_head(, d_head)]`` onto the bias parameter:
    ``"slot"`` (gated kernel: ``b`` is ``[W, kv_head(, d_head)]``), ``"own_deepseek"``
    (``position_bias`` ``[S, half, kv_head, d_head]``, slot = half * S + i) and ``"hf"``
    (HF ``position_bias`` ``[S, half * d_head]``, one KV head)."""
    family = phase_model(model)
    _shift_targets(model, layers, "both")  # the same validity rules as the roll
    out = []
    for layer in layers:
        biases = [t for t in family.gate_targets(layer, "both") if t.layout != "slot_weight"]
        if not biases:
            raise UserInputError("mode='static' shifts the gate bias; this model has gate_bias=False (no b_i to "
                             "move): use mode='roll'")
        out += [(layer, t.hook, t.parameter, t.layout, t.kv_axis) for t in biases]
    return out


@torch.inference_mode()
def mean_gate_logits(model, tokens: Tensor, layers: Union[int, Sequence[int], None] = None,
                     batch_size: int = 64) -> dict[str, Tensor]:
    """Per slot, the mean gate logit over every closed window of ``tokens`` ``[batch, pos]``:
    the prompt-independent part of each slot's gate (docs/science.md, "the static-part shift").

    Returns ``{hook name: [slot, kv_head(, d_head)]}`` for each gate-logit hook of ``layers``
    (entries whose logit is -inf, such as the older half of DeepSeek-V4's partial entry 0,
    are left out of the mean)."""
    targets = _static_targets(model, check_layers(model, layers))
    names = sorted({t[1] for t in targets})
    sums: dict[str, Tensor] = {}
    counts: dict[str, Tensor] = {}
    device = model_device(model)
    for i in range(0, tokens.shape[0], batch_size):
        _, cache = model.run_with_cache(tokens[i: i + batch_size].to(device), names_filter=names, return_type=None,
                                        return_cache_object=False)
        for name in names:
            x = cache[name].float().flatten(0, 1)  # [batch * entry, slot, ...]
            ok = torch.isfinite(x)
            sums[name] = sums.get(name, 0) + torch.where(ok, x, torch.zeros_like(x)).sum(0)
            counts[name] = counts.get(name, 0) + ok.sum(0)
    return {name: sums[name] / counts[name].clamp(min=1) for name in names}


def _static_delta(mean_logit: Tensor, shift: int, layout: str, bias: Tensor) -> Tensor:
    """``roll(mu, d) - mu`` per slot, laid out like ``bias`` (the shift moves within each S-block)."""
    S = bias.shape[0]
    if layout == "slot":
        mu = mean_logit
    elif layout == "own_deepseek":
        mu = einops.rearrange(mean_logit, "(half s) k d -> s half k d", s=S)
    else:
        mu = einops.rearrange(mean_logit, "(half s) 1 d -> s (half d)", s=S)
    mu = mu.to(bias.dtype).to(bias.device)
    return torch.roll(mu, shifts=shift, dims=0) - mu


@contextmanager
def shift_static_gates(model, shift: int, layers: Union[int, Sequence[int], None], mean_logits: dict[str, Tensor],
                       kv_heads: Union[int, Sequence[int], None] = None) -> Iterator:
    """Context manager: shift only the prompt-independent part of each slot's gate logit.

    With ``mu_i`` the mean gate logit of slot ``i`` (`mean_gate_logits`, over calibration
    prompts), the bias becomes ``b~_i = b_i + mu_{(i-d) mod W} - mu_i``: each slot's mean
    preference moves by ``d`` slots while the prompt-dependent part ``Z_i h - E[Z_i h]`` stays
    with its slot (docs/science.md explains why this differs from rolling ``Z`` and ``b``).
    ``kv_heads`` as in `cycle_gates`. Restores every parameter bit-exactly on exit."""
    shift = _check_shift(shift)
    heads = check_kv_heads(model, kv_heads)
    pairs = []
    for layer, name, bias, layout, kv_axis in _static_targets(model, check_layers(model, layers)):
        if name not in mean_logits:
            raise UserInputError(f"mean_logits has no entry for {name!r}: compute it with mean_gate_logits(model, "
                             f"tokens, layers={layer})")
        delta = _static_delta(mean_logits[name], shift, layout, bias)
        if heads is not None and kv_axis is not None:
            keep = torch.zeros(bias.shape[kv_axis], dtype=torch.bool, device=bias.device)
            keep[heads] = True
            shape = [1] * bias.ndim
            shape[kv_axis] = -1
            delta = delta * keep.reshape(shape).to(delta.dtype)
        pairs.append((bias, bias.detach() + delta))
    with _parameters_replaced(pairs):
        yield model


def cycling_fitness(model) -> tuple[bool, str]:
    """Whether gate cycling is a meaningful experiment on ``model``, and why (one sentence).

    It needs offset-specific gate parameters (W = S gated with scalar or vector gates, or the
    DeepSeek kernel's ``position_bias``) AND payloads shared across slots: with a payload map
    ``C_i`` per slot, a shifted gate weights maps never trained for that slot, so every phase
    collapses and the scores measure that collapse, not the weak spots moving (docs/science.md,
    "Gate cycling"). Such a run is a negative control, to be labelled as one."""
    cfg = model.cfg
    if not cfg.is_compressed:
        return False, "full attention has no gates to shift"
    if cfg.compression == "deepseek":
        return True, "DeepSeek kernel: one kv_proj shared by every slot, gate preferences in position_bias"
    if cfg.window != cfg.stride:
        return False, f"W={cfg.window} != S={cfg.stride}: with overlapping gated windows a slot is not a phase"
    if cfg.gate == "uniform":
        return False, "uniform gates have no offset-specific parameters"
    if getattr(cfg, "payload", "per_slot") != "shared":
        return False, ("payload map per slot: a shifted gate reads maps never trained for its slot, so every "
                       "phase collapses; a run there is a negative control, not a test of the prediction")
    return True, "W = S gates with one payload map shared by every slot (as DeepSeek's kv_proj)"


# ---------------------------------------------------------------- the scores (statistics: cycling_stats)
def canonical_shifts(shifts: Sequence[int], period: int) -> tuple[int, ...]:
    """Distinct nonzero shifts mod ``period``, each as its representative in (-period/2, period/2], sorted.

    With W = S, rolling the gates by ``d`` and by ``d - S`` is one intervention: counting both
    would score every observation twice."""
    out = set()
    for d in shifts:
        d = _check_shift(d) % period
        if d:
            out.add(d - period if d > period // 2 else d)
    return tuple(sorted(out))


@dataclass(frozen=True, eq=False, repr=False)
class CyclingResult(Result):
    """`gate_cycling`'s result: per-prompt correctness under each gate shift (shift 0 = the unshifted model).

    Accuracies are fractions in [0, 1]; R² scores are coefficients of determination (1 is a
    perfect prediction, 0 no better than the mean, negative worse). ``summary()`` is the
    readable table, ``to_dict()`` its numbers (non-finite scores become None in JSON),
    ``save(dir)``/``load(dir)`` the shared result format.
    """

    shifts: tuple[int, ...]
    residue: np.ndarray
    correct: np.ndarray  # [shift, prompt], shift order as in ``shifts``
    residue_modulus: int
    stride: int
    model_label: str = ""
    n_boot: int = 1000
    seed: int = 0
    mode: str = "roll"

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
        """Point estimates (see `cycling_scores` for every column and how many points it rests
        on): ``per_shift`` table (headline ``r2`` = coefficient of determination of the
        parameter-free prediction on the S-1 non-boundary phases; ``corr2`` the squared
        correlation; all-phase and interior versions; MAE; mean drop; the score of every
        hypothesised shift, the circular displacement, identification and its permutation p),
        pooled ``r2_pooled``/``corr2_pooled`` and the joint ``identification_p``."""
        return self._scores_for(n_permutations=9999)

    def identification(self) -> pd.DataFrame:
        """Shift-identification table: rows = applied shift, columns = hypothesised shift
        ``0..S-1``, values = headline score of that hypothesis (S-1 points each); plus the best
        hypothesis, whether it is the applied one (mod S), and the permutation p."""
        ps = self.scores["per_shift"].set_index("shift")
        table = ps[[f"hypothesis_{k}" for k in range(self.stride)]].copy()
        table.columns = pd.Index(range(self.stride), name="hypothesised shift")
        table["best"] = [int(ps.loc[d, "displacement"]) % self.stride for d in ps.index]
        table["identified"] = ps["identified"]
        table["p"] = ps["identification_p"]
        return table

    def intervals(self, confidence: float = 0.95) -> pd.DataFrame:
        """Bootstrap intervals (prompts resampled within residue groups, paired across shifts)."""
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
        """Headline scores (see ``scores`` / `cycling_scores`); keys are JSON-ready. ``r2_*`` is
        the coefficient of determination of the parameter-free prediction (boundary excluded;
        S-1 points per shift), ``corr2_*`` the squared correlation (slope and intercept fitted)."""
        s = self.scores
        ps = s["per_shift"].set_index("shift")
        by = lambda col, cast=float: {int(d): cast(ps.loc[d, col]) for d in ps.index}  # noqa: E731
        return {
            "model": self.model_label,
            "shifts": [int(d) for d in ps.index],
            "points_per_shift": self.stride - 1,
            "r2_pooled": s["r2_pooled"],
            "r2_by_shift": by("r2"),
            "corr2_pooled": s["corr2_pooled"],
            "corr2_by_shift": by("corr2"),
            "r2_all_by_shift": by("r2_all"),
            "r2_interior_by_shift": by("r2_interior"),
            "mae_by_shift": by("mae"),
            "mean_drop_by_shift": by("mean_drop"),
            "displacement_by_shift": by("displacement", int),
            "identified": f"{s['n_identified']} of {s['n_shifts']}",
            "identification_p": s["identification_p"],
            "identification_p_by_shift": by("identification_p") if "identification_p" in ps else {},
            "boundary_rank_by_shift": by("boundary_rank", int),
        }

    def plot(self, **kwargs):
        from phaseinterp.plot import gate_cycling_figure

        return gate_cycling_figure(self, **kwargs)


@torch.inference_mode()
def _correct(model, batch, answer_pos: int, batch_size: int) -> np.ndarray:
    device = model_device(model)
    out = []
    for i in range(0, batch.tokens.shape[0], batch_size):
        tokens = batch.tokens[i : i + batch_size, : answer_pos + 1].to(device)
        logits = model(tokens)[:, answer_pos]
        out.append((logits.argmax(-1).cpu() == torch.as_tensor(batch.answer[i : i + batch_size])).numpy())
    return np.concatenate(out)


def _check_shifts(shifts, S: int) -> tuple[int, ...]:
    """``(0, *requested)``: the unshifted model first, then each requested shift once (validated)."""
    if shifts is None:
        shifts = canonical_shifts(range(1, S), S)
    if isinstance(shifts, (int, np.integer)) and not isinstance(shifts, bool):
        shifts = [shifts]
    if isinstance(shifts, (str, bytes)) or not hasattr(shifts, "__iter__"):
        raise UserInputError(f"shifts={shifts!r} must be a list of non-zero integer shifts")
    shifts = list(shifts)
    requested = [_check_shift(d) for d in shifts]
    if not requested:
        raise UserInputError(f"shifts={list(shifts)!r} is empty; pass at least one shift in 1..{S - 1} (mod S={S})")
    for d in requested:
        if d % S == 0:
            raise UserInputError(
                f"shift={d} is 0 mod S={S}: it moves nothing (the unshifted model is always measured); "
                f"use shifts in 1..{S - 1} or their negatives"
            )
    return tuple(dict.fromkeys([0] + requested))


def gate_cycling(
    model,
    task=None,
    shifts: Optional[Sequence[int]] = None,
    *,
    layers: Union[int, Sequence[int], None] = None,
    kv_heads: Union[int, Sequence[int], None] = None,
    score: str = "profile",
    measure: str = "logprob",
    mode: str = "roll",
    branch: str = "both",
    n_per_residue: int = 72,
    seed: int = 0,
    n_calibration: int = 256,
    calibration_seed: int = 1,
    batch_size: int = 128,
    n_boot: int = 1000,
    progress: bool = True,
    prompts=None,
):
    """The gate-cycling experiment (`cycle_gates` is the context manager it uses).

    Two scores (docs/science.md, "Gate cycling" and "Unit-level gate cycling"):

    - ``score="profile"`` (default): accuracy per phase of the whole model with the gates of
      ``layers`` shifted by each of ``shifts``, plus the unshifted model (shift 0), against
      ``A_d(r) = A_0((r - d) mod S)``. The right score when EVERY unit is shifted (the default
      ``layers=None`` shifts every layer); returns a `CyclingResult`.
    - ``score="unit"``: shift ONE unit (``layers`` and optionally ``kv_heads``) and measure its
      own contribution per phase, ``C_d(r) = m(shifted) - m(shifted, unit mean-replaced)``
      (``measure``: ``"logprob"``, the mean answer log-prob, default, or ``"accuracy"``), against
      ``C_d(r) = C_0((r - d) mod S)``; returns a `UnitCyclingResult`. When one unit of many is
      shifted the whole-profile prediction cannot hold (the other units still serve their
      phases): use this score there. `specialized_units` picks units by a rule.

    Parameters:
        model: a W = S gated model or a DeepSeek-kernel model (own or Hugging Face), in eval mode.
        task: default: the evaluation task stored with the model.
        shifts: non-zero shifts in slots (default None: every distinct shift mod S, as its
            representative in (-S/2, S/2], e.g. -1, 1, 2 for S = 4); each must be non-zero mod S (a
            shift by S moves nothing); shifts equal mod S are measured but scored once. With S = 4 a per-shift score
            rests on 3 phases (profile) or 4 (unit); S = 8 models give firmer scores.
        layers: None (profile score only: every layer), one index or a list of distinct indices.
        kv_heads: None (every KV head of ``layers``) or the KV heads whose gates move.
        score: ``"profile"`` or ``"unit"`` (see above).
        measure: the unit score's measure, ``"logprob"`` (default) or ``"accuracy"``.
        mode: ``"roll"`` (default: roll the gate parameters, ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}``)
            or ``"static"`` (shift only the prompt-independent part of each slot's gate logit,
            `shift_static_gates`, with the mean logits over ``n_calibration`` calibration prompts).
        branch: ``"both"`` (default), ``"k"`` or ``"v"`` (profile score, roll mode).
        n_per_residue: prompts per residue (default 72; for the zoo task 72, 77, 80 and every size
            from 86 work; at most 500,000 prompts per call).
        seed: prompt seed (default 0), also the bootstrap seed.
        n_calibration / calibration_seed: calibration prompts (disjoint mappings) for the unit
            score's mean replacement and the static mode's mean logits (default 256, seed 1).
        batch_size: prompts per forward pass (default 128).
        n_boot: bootstrap replicates of the result's ``intervals`` (default 1000).
        progress: show a progress bar (default True).
        prompts: a pre-generated ``task.generate(...)`` batch to reuse across calls.
    """
    if score not in ("profile", "unit"):
        raise UserInputError(f"score={score!r} is not one of ('profile', 'unit')")
    if mode not in ("roll", "static"):
        raise UserInputError(f"mode={mode!r} is not one of ('roll', 'static')")
    if score == "unit":
        if branch != "both":
            raise UserInputError(f"branch={branch!r}: score='unit' shifts the unit's K and V gates together (branch='both')")
        from phaseinterp.interventions.unit_cycling import unit_gate_cycling

        return unit_gate_cycling(model, task, shifts, layers=layers, kv_heads=kv_heads, measure=measure, mode=mode,
                                 n_per_residue=n_per_residue, seed=seed, n_calibration=n_calibration,
                                 calibration_seed=calibration_seed, batch_size=batch_size, n_boot=n_boot,
                                 progress=progress, prompts=prompts)
    if measure != "logprob":
        raise UserInputError(f"measure={measure!r}: the profile score reads accuracy per phase; measure applies to "
                         "score='unit'")
    task = resolve_task(model, task)
    layers_list = check_layers(model, layers)
    heads = check_kv_heads(model, kv_heads)
    if mode == "static":
        if branch != "both":
            raise UserInputError(f"branch={branch!r}: mode='static' moves the K and V gates together (branch='both')")
        _static_targets(model, layers_list)
    else:
        _shift_targets(model, layers_list, branch)  # validate before any work
    check_int("batch_size", batch_size, 1)
    check_int("n_boot", n_boot, 1)
    S = model.cfg.stride
    shifts = _check_shifts(shifts, S)
    if prompts is None:
        check_n_per_residue(n_per_residue, task.residue_modulus)
    elif len(prompts) == 0:
        raise UserInputError("prompts holds 0 prompts")
    batch = prompts if prompts is not None else task.generate(n_per_residue, seed=seed)
    answer_pos = fixed_answer_position(batch)
    mean_logits = None
    if mode == "static":
        calib = task.calibration(n_calibration, seed=calibration_seed)
        mean_logits = mean_gate_logits(model, calib.tokens[:, : answer_pos + 1], layers_list, batch_size)
    bar = progress_bar(progress, len(shifts), "gate cycling")
    rows = []
    try:
        for d in shifts:
            context = (shift_static_gates(model, d, layers_list, mean_logits, heads) if mode == "static"
                       else cycle_gates(model, d, layers_list, branch, heads))
            with context:
                rows.append(_correct(model, batch, answer_pos, batch_size))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return CyclingResult(shifts=shifts, residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
                         correct=np.stack(rows), residue_modulus=task.residue_modulus, stride=model.cfg.stride,
                         model_label=model.cfg.label, n_boot=n_boot, seed=seed, mode=mode)
