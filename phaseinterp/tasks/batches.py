"""The batches tasks hand out: `TaskBatch` (prompts to score) and `TrainBatch` (training prompts)."""

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError


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
            raise UserInputError(f"meta has {len(self.meta)} rows but there are {self.tokens.shape[0]} prompts")
        bad = (self.answer_pos < 0) | (self.answer_pos >= self.tokens.shape[1])
        if bool(bad.any()):
            raise UserInputError(f"answer_pos must lie in 0..{self.tokens.shape[1] - 1}")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __repr__(self) -> str:  # sizes, never the token tensor
        positions = sorted({int(p) for p in self.answer_pos.unique()[:4]})
        return (f"TaskBatch({len(self)} prompts x {self.seq_len} tokens, R={self.residue_modulus}, "
                f"answer at {positions if len(positions) < 4 else 'several positions'}; "
                f"columns .tokens .answer .answer_pos .meta .moments)")

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

    def __repr__(self) -> str:  # sizes, never the token tensor
        return f"TrainBatch({self.tokens.shape[0]} rows x {self.tokens.shape[1]} tokens)"


def residue_groups(residues: Any, modulus: int) -> list[int]:
    """The residue groups to generate: ``residues`` (each in ``0..modulus-1``), or every one when None."""
    groups = list(range(modulus)) if residues is None else list(residues)
    for r in groups:
        check_int("residue", r, 0, modulus - 1)
    return groups


def joined_residue_groups(parts: list, n_per_residue: int, stride: Any) -> tuple[Any, Any, pd.DataFrame]:
    """(tokens, answers, meta) of per-residue ``(tokens, answers, meta)`` parts, concatenated: mapping ids
    made unique across residues, and a ``phase`` column (``target_pos mod stride``) when ``stride`` is given."""
    tokens = np.concatenate([p[0] for p in parts])
    answers = np.concatenate([p[1] for p in parts])
    meta = pd.concat([p[2] for p in parts], ignore_index=True)
    meta["mapping_id"] = meta["residue"] * n_per_residue + meta["mapping_id"]
    if stride is not None:
        meta.insert(meta.columns.get_loc("residue") + 1, "phase", meta["target_pos"] % stride)
    return tokens, answers, meta


def final_position_batch(task: Any, tokens: Any, answers: Any, meta: pd.DataFrame,
                         moments: pd.DataFrame) -> TaskBatch:
    """A `TaskBatch` of prompts answered at their last position: ``tokens`` ``[batch, pos]``, ``answers``
    ``[batch, answer_token]`` (the first is the scored one; ``meta["answer"]`` is set to it), for a task
    with ``seq_len``, ``residue_modulus`` and ``to_dict()``."""
    answer_tokens = torch.as_tensor(np.ascontiguousarray(answers), dtype=torch.long)
    meta["answer"] = np.asarray(answers)[:, 0]
    return TaskBatch(
        tokens=torch.as_tensor(tokens, dtype=torch.long),
        answer=answer_tokens[:, 0].clone(),
        answer_pos=torch.full((len(tokens),), task.seq_len - 1, dtype=torch.long),
        meta=meta,
        moments=moments,
        residue_modulus=task.residue_modulus,
        answer_tokens=answer_tokens,
        task=task.to_dict(),
    )


def observed_moments(meta: pd.DataFrame) -> pd.DataFrame:
    """Count, mean and (population) std of the target position per residue (unmatched prompts)."""
    grouped = meta.groupby("residue")["target_pos"]
    return pd.DataFrame({"n": grouped.size(), "mean": grouped.mean(), "std": grouped.std(ddof=0)}).reset_index()
