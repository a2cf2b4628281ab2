"""The prompt-length axis: the target's residue held fixed while the prompt's length residue varies.

The task lays out its prompts ``R - 1`` tokens shorter (``T' = T - (R - 1)``, moment-matched by target
residue), and a prompt of target residue ``r`` gets ``d = (hold - r) mod R`` fillers right after its head:
its target moves to residue ``hold``, its length becomes ``T' + d``, and the target-to-answer distance
keeps its matched moments. ``axis="both"`` shifts a task shortened by ``S - 1`` by each ``d`` in
``0..S-1``, covering every (target phase, length phase) cell."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from phaseinterp._checks import AXES, check_int
from phaseinterp.errors import UserInputError
from phaseinterp.tasks.batches import TaskBatch



@dataclass(frozen=True)
class LengthPadding:
    """Where a task's prompts can take extra filler, and which tokens: ``insert_at`` (after the head),
    ``pool`` (filler token ids), ``contiguous`` (take a contiguous span of ``pool``, a text, instead of
    drawing ids independently)."""

    insert_at: int
    pool: np.ndarray
    contiguous: bool = False


def check_axis(axis: Any) -> str:
    if axis not in AXES:
        raise UserInputError(f"axis={axis!r} is not one of {AXES} (target: the target's residue varies, length: the "
                             "prompt length's residue varies with the target's held fixed, both: the two crossed)")
    return axis


def length_padding(task: Any, tokenizer: Any = None) -> LengthPadding:
    """The task's `LengthPadding` (its ``length_padding(tokenizer)``), or an error naming the task."""
    method = getattr(task, "length_padding", None)
    if method is None:
        raise UserInputError(f"{type(task).__name__} does not say where filler can be inserted, so it has no prompt-"
                             "length axis (KeyValueRetrieval, NeedleRetrieval and TextNeedle do); use axis='target'")
    return method(tokenizer)


def _shortened(task: Any, by: int) -> Any:
    """``task`` with ``seq_len`` lowered by ``by`` (its own checks say when that no longer fits)."""
    if not (dataclasses.is_dataclass(task) and hasattr(task, "seq_len")):
        raise UserInputError(f"axis='length' or 'both' needs a task with a seq_len to lay prompts out shorter; got "
                             f"{type(task).__name__} (a ready TaskBatch has none: pass the task)")
    if task.seq_len - by < 8:
        raise UserInputError(f"seq_len={task.seq_len} leaves no room for {by} shift tokens on the length axis")
    try:
        return dataclasses.replace(task, seq_len=task.seq_len - by)
    except UserInputError as err:
        raise UserInputError(f"on the length axis the prompts are laid out {by} tokens shorter (seq_len "
                             f"{task.seq_len - by}) and shifted back to at most {task.seq_len}: {err}") from None


def shift_prompts(batch: TaskBatch, shifts: np.ndarray, padding: LengthPadding, seed: int,
                  width: int) -> TaskBatch:
    """Each prompt ``i`` with ``shifts[i]`` filler tokens inserted at ``padding.insert_at``, padded on the right
    (after its answer position, which a causal model never reads) to ``width`` tokens. ``meta`` gains
    ``shift``, ``prompt_len``, ``target_residue`` and ``length_residue`` (mod R); ``target_pos`` and
    ``distance`` follow the shift."""
    R = batch.residue_modulus
    n, T = batch.tokens.shape
    shifts = np.asarray(shifts, dtype=np.int64)
    if shifts.shape != (n,) or shifts.min() < 0 or int(shifts.max()) + T > width:
        raise UserInputError("shifts must be one non-negative count per prompt that fits the width")
    rng = np.random.default_rng([seed, 0x1E9])
    old = batch.tokens.numpy()
    out = np.empty((n, width), dtype=old.dtype)
    at, pool = padding.insert_at, padding.pool
    for i, d in enumerate(shifts):
        if padding.contiguous:
            start = int(rng.integers(0, len(pool) - (width - T) + 1))
            fill = pool[start:start + width - T]
        else:
            fill = rng.choice(pool, size=width - T)
        out[i, :at] = old[i, :at]
        out[i, at:at + d] = fill[:d]
        out[i, at + d:T + d] = old[i, at:]
        out[i, T + d:] = fill[d:]
    answer_pos = batch.answer_pos + torch.as_tensor(shifts)
    meta = batch.meta.copy()
    meta["target_pos"] = meta["target_pos"].to_numpy() + shifts
    meta["shift"] = shifts
    meta["prompt_len"] = answer_pos.numpy() + 1
    meta["target_residue"] = meta["target_pos"] % R
    meta["length_residue"] = meta["prompt_len"] % R
    if "distance" in meta:
        meta["distance"] = answer_pos.numpy() - meta["target_pos"].to_numpy()
    return dataclasses.replace(batch, tokens=torch.as_tensor(out), answer_pos=answer_pos, meta=meta)


def length_moments(meta: pd.DataFrame, group: str) -> pd.DataFrame:
    """Count, mean and (population) std of the target-to-answer distance per ``group`` value."""
    distance = meta["prompt_len"] - 1 - meta["target_pos"]
    grouped = distance.groupby(meta[group])
    return pd.DataFrame({"residue": grouped.size().index, "n": grouped.size().to_numpy(),
                         "mean": grouped.mean().to_numpy(), "std": grouped.std(ddof=0).to_numpy()})


def _laid_out(task: Any, by: int, n_per_residue: int, tokenizer: Any) -> Any:
    """``task`` shortened by ``by`` tokens, its moment-matched placement for ``n_per_residue`` checked."""
    short = _shortened(task, by)
    placement = getattr(short, "placement", None)
    if placement is not None:
        try:
            placement(n_per_residue, **({} if tokenizer is None else {"tokenizer": tokenizer}))
        except UserInputError as err:
            raise UserInputError(f"on the length axis the prompts are laid out {by} tokens shorter (seq_len "
                                 f"{short.seq_len}): {err}") from None
    return short


def length_modulus_for(task: Any, stride: int, length_modulus: int | None = None, n_per_residue: int = 1,
                       tokenizer: Any = None) -> int:
    """The length axis's modulus M: ``length_modulus`` when given (a multiple of S dividing R), else R when
    the task's prompts can be laid out (moments matched for ``n_per_residue``) R - 1 tokens shorter, else
    the largest such divisor of R they can (decided by the layout alone, before any prompt is scored)."""
    R = task.residue_modulus
    options = [m for m in range(R, 0, -1) if R % m == 0 and m % stride == 0]
    if length_modulus is not None:
        check_int("length_modulus", length_modulus, 1)
        if length_modulus not in options:
            raise UserInputError(f"length_modulus={length_modulus} must be a multiple of the stride S={stride} that "
                                 f"divides R={R} (valid: {sorted(options)})")
        _laid_out(task, length_modulus - 1, n_per_residue, tokenizer)
        return length_modulus
    for m in options[:-1]:
        try:
            _laid_out(task, m - 1, n_per_residue, tokenizer)
        except UserInputError:
            continue
        return m
    _laid_out(task, stride - 1, n_per_residue, tokenizer)  # the smallest: its own error when even it fails
    return stride


def length_axis_batch(task: Any, n_per_residue: int, *, seed: int, stride: int, axis: str, hold: int = 0,
                      tokenizer: Any = None, length_modulus: int | None = None) -> TaskBatch:
    """The prompts of ``axis`` ("length" or "both", see the module doc). On the length axis
    ``meta.residue`` is the prompt length mod M (`length_modulus_for`; the batch's
    ``residue_modulus`` is M), for "both" the target residue mod R (``length_residue`` beside it)."""
    check_axis(axis)
    if axis == "target":
        raise UserInputError("the target axis is the task's own generate()")
    R = task.residue_modulus
    check_int("hold", hold, 0, R - 1)
    padding = length_padding(task, tokenizer)
    M = length_modulus_for(task, stride, length_modulus, n_per_residue, tokenizer) if axis == "length" else stride
    short = _laid_out(task, M - 1, n_per_residue, tokenizer)
    extra = {} if tokenizer is None else {"tokenizer": tokenizer}
    base = short.generate(n_per_residue, seed=seed, **extra)
    base_residue = base.meta["residue"].to_numpy()
    if axis == "length":
        shifts = (hold - base_residue) % R
        base = base.subset(np.flatnonzero(shifts < M))  # the M target-residue groups that reach residue hold
        shifts = shifts[shifts < M]
        batch = shift_prompts(base, shifts, padding, seed, short.seq_len + M - 1)
        batch.meta["residue"] = batch.meta["prompt_len"] % M
        order = np.argsort(batch.meta["residue"].to_numpy(), kind="stable")  # residue-major, as generate() is
        batch = batch.subset(order)
        return dataclasses.replace(batch, moments=length_moments(batch.meta, "residue"), residue_modulus=M)
    copies = np.repeat(np.arange(stride), len(base))
    tiled = TaskBatch(tokens=base.tokens.repeat(stride, 1), answer=base.answer.repeat(stride),
                      answer_pos=base.answer_pos.repeat(stride),
                      meta=pd.concat([base.meta] * stride, ignore_index=True), moments=base.moments,
                      residue_modulus=R,
                      answer_tokens=None if base.answer_tokens is None else base.answer_tokens.repeat(stride, 1),
                      task=base.task)
    batch = shift_prompts(tiled, copies, padding, seed, short.seq_len + stride - 1)
    batch.meta["residue"] = batch.meta["target_residue"]
    return dataclasses.replace(batch, moments=length_moments(batch.meta, "residue"))


__all__ = ["AXES", "LengthPadding", "check_axis", "length_axis_batch", "length_modulus_for", "length_padding",
           "shift_prompts"]
