"""Shared plumbing for interventions: default tasks, layer checks, prompt batches, paired bootstrap."""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch

from phaseinterp._checks import MAX_PROMPTS, check_fraction, check_indices, check_int, check_seed, check_layer, check_n_per_residue
from phaseinterp.errors import UserInputError
from phaseinterp.models.protocol import phase_model


def model_device(model, device=None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return next(model.parameters()).device


def check_layers(model, layer, name: str = "layer") -> list[int]:
    """``None`` (every layer), one layer index, or a non-empty sequence of distinct indices
    in ``0..n_layers-1`` (`check_indices`); anything else is a `UserInputError` naming the value."""
    n = model.cfg.n_layers
    if layer is None:
        return list(range(n))
    return check_indices(name, layer, 0, n - 1, unit="layer", each=lambda v: check_layer(v, n, name))


def check_calibration_size(n_calibration, modulus: int) -> int:
    """``n_calibration`` in ``R..MAX_PROMPTS``: a calibration mean over every residue at least once."""
    return check_int("n_calibration", n_calibration, modulus, MAX_PROMPTS,
                     why=f": the mean needs at least one calibration prompt per residue (R={modulus})")


def check_calibrated_sweep(spec) -> None:
    """The options every mean- or donor-replacement spec shares, each on its own: ``n_per_residue``,
    ``n_calibration`` (at most MAX_PROMPTS; its floor R needs the task: `check_calibration_size`),
    ``seed`` and ``calibration_seed`` (>= 0) and ``batch_size`` (>= 1)."""
    check_n_per_residue(spec.n_per_residue)
    check_int("n_calibration", spec.n_calibration, 1, MAX_PROMPTS)
    check_seed("seed", spec.seed)
    check_seed("calibration_seed", spec.calibration_seed)
    check_int("batch_size", spec.batch_size, 1)


def fixed_answer_position(batch) -> int:
    positions = torch.as_tensor(batch.answer_pos)
    if positions.numel() == 0:
        raise UserInputError("the task produced no prompts")
    if not bool((positions == positions.flatten()[0]).all()):
        raise UserInputError("prompts must share one answer position (the task's fixed query position)")
    return int(positions.flatten()[0])


def paired_bootstrap_relative_change(
    clean: np.ndarray, knocked: np.ndarray, groups: np.ndarray, n_groups: int, fold: Optional[int],
    n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Relative change ``100 (knockout - clean) / clean`` per group with percentile intervals.

    ``clean`` ``[prompt]`` and ``knocked`` ``[prompt, unit]`` are 0/1 correctness; prompts
    are resampled within each residue group, pairing clean and knockout. With ``fold`` each
    phase ``group % fold`` is the mean of its residue groups' relative changes (the paper's
    fold), in the estimate and in every replicate; a residue whose clean accuracy is 0 has no
    relative change and is left out of its phase's mean. Returns ``(estimate, low, high)``,
    each ``[unit, group]``; NaN where no residue of the group has a clean answer right.
    """
    confidence = check_fraction("confidence", confidence)
    n_groups = check_int("n_groups", n_groups, 1, why=" (residue groups)")
    fold = None if fold is None else check_int("fold", fold, 1, why=" (phases to fold the groups into; None: no folding)")
    if fold and n_groups % fold:
        raise UserInputError(f"fold={fold} must divide n_groups={n_groups} (residue groups fold into phases)")
    n_boot = check_int("n_boot", n_boot, 1, why=" (bootstrap replicates)")
    seed = check_seed("seed", seed)
    rng = np.random.default_rng(seed)
    n_units = knocked.shape[1]
    clean_sum = np.zeros((n_boot, n_groups))
    ko_sum = np.zeros((n_boot, n_units, n_groups))
    clean_pt = np.zeros(n_groups)
    ko_pt = np.zeros((n_units, n_groups))
    for g in range(n_groups):
        idx = np.flatnonzero(groups == g)
        if idx.size == 0:
            continue
        clean_pt[g] = clean[idx].sum()
        ko_pt[:, g] = knocked[idx].sum(0)
        draw = idx[rng.integers(0, idx.size, size=(n_boot, idx.size))]
        clean_sum[:, g] = clean[draw].sum(1)
        ko_sum[:, :, g] = knocked[draw].sum(1)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a phase none of whose residues has a clean answer right
        estimate = np.where(clean_pt[None] > 0, 100 * (ko_pt - clean_pt[None]) / clean_pt[None], np.nan)
        boot = np.where(clean_sum[:, None] > 0, 100 * (ko_sum - clean_sum[:, None]) / clean_sum[:, None], np.nan)
        if fold:
            estimate = np.nanmean(estimate.reshape(n_units, -1, fold), axis=1)
            boot = np.nanmean(boot.reshape(n_boot, n_units, -1, fold), axis=2)
        alpha = (1 - confidence) / 2
        low = np.nanquantile(boot, alpha, axis=0) if np.isfinite(boot).any() else np.full_like(estimate, np.nan)
        high = np.nanquantile(boot, 1 - alpha, axis=0) if np.isfinite(boot).any() else np.full_like(estimate, np.nan)
    return estimate, low, high


def phase_model_note(model, experiment: str) -> Optional[str]:
    """A premise note (`Result.premise_notes`) when ``model`` has no compression grid (full
    attention): its "phases" are positions mod S by label only, so a phase-resolved result on it
    is a control, not a measurement of phase structure. None for a compressed model."""
    if phase_model(model).is_compressed:
        return None
    return (f"{experiment} on a full-attention model: it has no compression windows, so its phases are positions "
            "mod S by label only; read the result as a control, not as phase structure")


def cycling_note(model) -> Optional[str]:
    """A premise note when gate cycling is not meaningful on ``model`` (`cycling_fitness`:
    offset-specific gates AND payloads shared across slots; docs/science.md, "Gate cycling"): the
    run is a negative control. None for a fit model."""
    fit, why = phase_model(model).cycling_fitness()
    return None if fit else f"not fit for gate cycling, so this run is a negative control: {why}"
