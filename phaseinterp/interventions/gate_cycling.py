"""Cyclic gate shifts (SCIENCE.md section 2): move the gates' slot preferences, watch the weak spots move.

In a W = S model, `cycle_gates` replaces the offset-specific gate parameters by their
circular shift ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}`` (payload maps
untouched). Prediction: ``A_d(r) = A_0((r - d) mod S)``. `gate_cycling` measures it.

DeepSeek kernel: ``gate_proj`` is shared by the slots of a half, so the offset-specific
parameter is ``position_bias``; a shift rolls it by ``d`` within each S-block (for
W = 2S both halves move together, which shifts the preferred phase by ``d``).
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

from phaseinterp._files import progress_bar
from phaseinterp.interventions._common import (
    check_layers,
    fixed_answer_position,
    load_arrays,
    model_device,
    resolve_task,
    save_arrays,
)


def _shift_targets(model, layers: list[int], branch: str) -> list[tuple[torch.nn.Parameter, int]]:
    """(parameter, slot axis) pairs a shift rolls; raises where a shift has no defined meaning."""
    cfg = model.cfg
    if not cfg.is_compressed:
        raise ValueError("cycle_gates: the full-attention model (compression=None) has no gates to shift")
    if branch not in ("both", "k", "v"):
        raise ValueError(f"branch={branch!r} is not one of ('both', 'k', 'v')")
    targets = []
    for layer in layers:
        comp = model.blocks[layer].attn.compressor
        if cfg.compression == "deepseek":
            if branch != "both":
                raise ValueError("cycle_gates: the deepseek kernel has one gate for K and V; use branch='both'")
            targets.append((comp.position_bias, 0))
            continue
        if cfg.window != cfg.stride:
            raise ValueError(
                f"cycle_gates is defined for W = S (got window={cfg.window}, stride={cfg.stride}): "
                "with overlapping gated windows a slot is not a phase"
            )
        if cfg.gate == "uniform":
            raise ValueError("cycle_gates: gate='uniform' has no offset-specific gate parameters to shift")
        if cfg.tie_kv_gates and branch != "both":
            raise ValueError(f"cycle_gates: K and V gates are tied; branch={branch!r} cannot shift one alone")
        branches = ("k",) if cfg.tie_kv_gates else (("k", "v") if branch == "both" else (branch,))
        for br in branches:
            targets.append((getattr(comp, f"Z_{br}"), 0))
            bias = getattr(comp, f"b_{br}", None)
            if bias is not None:
                targets.append((bias, 0))
    return targets


def _check_shift(shift) -> int:
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
        raise ValueError(f"shift={shift!r} must be an integer number of slots")
    return int(shift)


@contextmanager
def cycle_gates(model, shift: int, layers: Union[int, Sequence[int], None] = None, branch: str = "both") -> Iterator:
    """Context manager: gates of ``layers`` circularly shifted by ``shift`` slots.

    Restores every parameter bit-exactly on exit, also when the body raises.
    """
    shift = _check_shift(shift)
    targets = _shift_targets(model, check_layers(model, layers), branch)
    saved = [p.detach().clone() for p, _ in targets]
    try:
        with torch.no_grad():
            for (p, axis), original in zip(targets, saved):
                p.copy_(torch.roll(original, shifts=shift, dims=axis))
        yield model
    finally:
        with torch.no_grad():
            for (p, _), original in zip(targets, saved):
                p.copy_(original)


def shifted_copy(model, shift: int, layers: Union[int, Sequence[int], None] = None, branch: str = "both"):
    """A deep copy of ``model`` with its gates permanently shifted (the original is untouched)."""
    twin = copy.deepcopy(model)
    shift = _check_shift(shift)
    targets = _shift_targets(twin, check_layers(twin, layers), branch)
    with torch.no_grad():
        for p, axis in targets:
            p.copy_(torch.roll(p.detach().clone(), shifts=shift, dims=axis))
    return twin


# ---------------------------------------------------------------- the experiment
def _r2(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def displacement(acc0: np.ndarray, acc: np.ndarray) -> int:
    """How far the phase profile moved: the circular shift ``k`` (signed, in (-S/2, S/2])
    for which ``A_0((r - k) mod S)`` best matches ``acc`` (least squares) over the phases
    that are neither the boundary ``S-1`` nor where the boundary maps to, ``(S-1+k) mod S``:
    the boundary stays weak whatever the shift, so it must not vote."""
    S = len(acc0)
    errors = []
    for k in range(S):
        keep = [r for r in range(S) if r not in (S - 1, (S - 1 + k) % S)]
        errors.append(np.mean((acc[keep] - np.roll(acc0, k)[keep]) ** 2) if keep else np.inf)
    k = int(np.argmin(errors))
    return k - S if k > S // 2 else k


def _scores(acc0: np.ndarray, acc: dict[int, np.ndarray], S: int) -> dict:
    """Prediction scores of ``A_d(r) = A_0((r-d) mod S)`` for the given per-phase accuracies."""
    boundary = S - 1
    rows, pooled_pred, pooled_obs = [], [], []
    for d, a in acc.items():
        predicted = np.roll(acc0, d) - acc0  # A_0((r-d) mod S) - A_0(r)
        observed = a - acc0
        not_boundary = np.array([r for r in range(S) if r != boundary])
        interior = np.array([r for r in range(S) if r not in (boundary, (boundary + d) % S)])
        pooled_pred.append(predicted[not_boundary])
        pooled_obs.append(observed[not_boundary])
        disp = displacement(acc0, a)
        rows.append(dict(
            shift=d, r2=_r2(predicted[not_boundary], observed[not_boundary]), r2_all=_r2(predicted, observed),
            r2_interior=_r2(predicted[interior], observed[interior]) if len(interior) >= 3 else np.nan,
            mae=float(np.abs(predicted - observed).mean()), displacement=disp,
            boundary_accuracy=float(a[boundary]), boundary_rank=int((a < a[boundary]).sum()),
        ))
    per_shift = pd.DataFrame(rows)
    pooled = _r2(np.concatenate(pooled_pred), np.concatenate(pooled_obs)) if pooled_pred else np.nan
    shifts = per_shift["shift"].to_numpy(dtype=float)
    disp = per_shift["displacement"].to_numpy(dtype=float)
    ok = np.isfinite(disp)
    # Circular-linear fit: unwrap each displacement to the branch nearest the shift, then
    # a least-squares line displacement ~ slope * shift + c.
    unwrapped = disp[ok] + S * np.round((shifts[ok] - disp[ok]) / S)
    if ok.sum() >= 3 and np.std(unwrapped) > 0:
        slope, intercept = np.polyfit(shifts[ok], unwrapped, 1)
        fit_r2 = _r2(shifts[ok], unwrapped)
    else:
        slope, intercept, fit_r2 = np.nan, np.nan, np.nan
    return dict(per_shift=per_shift, r2_pooled=pooled, displacement_slope=float(slope),
                displacement_intercept=float(intercept), displacement_r2=float(fit_r2))


@dataclass(frozen=True)
class CyclingResult:
    """Per-prompt correctness under each gate shift (shift 0 = the unshifted model)."""

    shifts: tuple[int, ...]
    residue: np.ndarray
    correct: np.ndarray  # [shift, prompt], shift order as in ``shifts``
    residue_modulus: int
    stride: int
    model_label: str = ""
    n_boot: int = 1000
    seed: int = 0

    def phase_accuracy(self, index: Optional[np.ndarray] = None) -> pd.DataFrame:
        """Accuracy per shift (rows) x phase (columns)."""
        phases = self.residue % self.stride
        correct = self.correct if index is None else self.correct[:, index]
        phases = phases if index is None else phases[index]
        acc = np.stack([correct[:, phases == r].mean(1) for r in range(self.stride)], 1)
        frame = pd.DataFrame(acc, index=pd.Index(self.shifts, name="shift"))
        frame.columns.name = "phase"
        return frame

    def _scores_for(self, index=None) -> dict:
        acc = self.phase_accuracy(index)
        return _scores(acc.loc[0].to_numpy(), {d: acc.loc[d].to_numpy() for d in self.shifts if d != 0}, self.stride)

    @property
    def scores(self) -> dict:
        """Point estimates: ``per_shift`` table (R², all-phase R², interior R², MAE,
        displacement, boundary accuracy and rank) and pooled R² (boundary excluded)."""
        return self._scores_for()

    def intervals(self, confidence: float = 0.95) -> pd.DataFrame:
        """Bootstrap intervals (prompts resampled within residue groups, paired across shifts)."""
        rng = np.random.default_rng(self.seed)
        groups = [np.flatnonzero(self.residue == r) for r in range(self.residue_modulus)]
        samples = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(self.n_boot):
                idx = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups if g.size])
                s = self._scores_for(idx)
                row = s["per_shift"].set_index("shift")[["r2", "r2_all", "r2_interior", "mae", "displacement"]]
                flat = {f"{c}[{d}]": row.loc[d, c] for d in row.index for c in row.columns}
                flat.update(r2_pooled=s["r2_pooled"], displacement_r2=s["displacement_r2"],
                            displacement_slope=s["displacement_slope"])
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

    def summary(self) -> dict:
        s = self.scores
        ps = s["per_shift"].set_index("shift")
        return {
            "model": self.model_label,
            "r2_pooled_excl_boundary": s["r2_pooled"],
            "r2_by_shift": {int(d): float(ps.loc[d, "r2"]) for d in ps.index},
            "displacement_slope": s["displacement_slope"],
            "displacement_r2": s["displacement_r2"],
            "boundary_rank_by_shift": {int(d): int(ps.loc[d, "boundary_rank"]) for d in ps.index},
        }

    def plot(self, **kwargs):
        from phaseinterp.plot import gate_cycling_figure

        return gate_cycling_figure(self, **kwargs)

    def save(self, directory: Union[str, Path]) -> Path:
        meta = {"kind": "CyclingResult", "shifts": list(self.shifts), "residue_modulus": self.residue_modulus,
                "stride": self.stride, "model_label": self.model_label, "n_boot": self.n_boot, "seed": self.seed}
        return save_arrays(Path(directory), {"residue": self.residue, "correct": self.correct}, meta)

    @classmethod
    def load(cls, directory: Union[str, Path]) -> "CyclingResult":
        arrays, meta = load_arrays(Path(directory))
        if meta.get("kind") != "CyclingResult":
            raise ValueError(f"{directory} does not hold a CyclingResult (kind={meta.get('kind')!r})")
        return cls(shifts=tuple(meta["shifts"]), residue=arrays["residue"], correct=arrays["correct"],
                   residue_modulus=meta["residue_modulus"], stride=meta["stride"], model_label=meta["model_label"],
                   n_boot=meta["n_boot"], seed=meta["seed"])


@torch.inference_mode()
def _correct(model, batch, answer_pos: int, batch_size: int) -> np.ndarray:
    device = model_device(model)
    out = []
    for i in range(0, batch.tokens.shape[0], batch_size):
        tokens = batch.tokens[i : i + batch_size, : answer_pos + 1].to(device)
        logits = model(tokens)[:, answer_pos]
        out.append((logits.argmax(-1).cpu() == torch.as_tensor(batch.answer[i : i + batch_size])).numpy())
    return np.concatenate(out)


def gate_cycling(
    model,
    task=None,
    shifts: Sequence[int] = (-3, -2, -1, 1, 2, 3),
    *,
    layers: Union[int, Sequence[int], None] = None,
    branch: str = "both",
    n_per_residue: int = 72,
    seed: int = 0,
    batch_size: int = 128,
    n_boot: int = 1000,
    progress: bool = True,
    prompts=None,
) -> CyclingResult:
    """Accuracy per phase with the gates shifted by each of ``shifts`` (and unshifted)."""
    task = resolve_task(model, task)
    layers_list = check_layers(model, layers)
    _shift_targets(model, layers_list, branch)  # validate before any work
    shifts = tuple(dict.fromkeys([0] + [_check_shift(d) for d in shifts]))
    batch = prompts if prompts is not None else task.generate(n_per_residue, seed=seed)
    answer_pos = fixed_answer_position(batch)
    bar = progress_bar(progress, len(shifts), "gate cycling")
    rows = []
    try:
        for d in shifts:
            with cycle_gates(model, d, layers_list, branch):
                rows.append(_correct(model, batch, answer_pos, batch_size))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return CyclingResult(shifts=shifts, residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
                         correct=np.stack(rows), residue_modulus=task.residue_modulus, stride=model.cfg.stride,
                         model_label=model.cfg.label, n_boot=n_boot, seed=seed)
