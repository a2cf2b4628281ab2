"""What every training loop's recipe shares: the optimizer fields and their checks, the warm-up + cosine
learning rate (`Recipe.lr_at`) and AdamW with weight decay on the matrices only (`adamw`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from phaseinterp._checks import check_int, check_real, check_seed, listed
from phaseinterp.errors import UserInputError
from phaseinterp.models.compressor import Compressor


class Recipe:
    """Mixin of the recipe dataclasses (`TrainConfig`, `PretrainConfig`, the zoo's `TinyRecipe`), whose
    fields include ``steps``, ``lr``, ``warmup_steps``, ``min_lr_ratio``, ``weight_decay`` and ``betas``."""

    def lr_at(self, step: int) -> float:
        """Linear warm-up ``lr (step + 1) / warmup_steps``, then cosine decay
        ``lr (m + (1 - m) (1 + cos(pi p)) / 2)`` with ``m = min_lr_ratio`` and
        ``p = min(1, (step - warmup_steps) / (steps - warmup_steps))``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserInputError(f"unknown {cls.__name__} fields {unknown}; valid fields: {sorted(known)}")
        return cls(**d)

    def _check_optimizer(self) -> None:
        """The shared fields in range (a one-line refusal naming the field), each stored as the Python
        number it equals (numpy numbers too: a manifest is JSON), ``betas`` as a tuple."""
        for name, low in (("steps", 1), ("warmup_steps", 0)):
            self._store(name, check_int(name, getattr(self, name), low))
        self._store("seed", check_seed("seed", self.seed))
        for name in ("lr", "grad_clip"):
            self._store(name, check_real(name, getattr(self, name), 0.0, low_open=True))
        self._store("min_lr_ratio", check_real("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0, high_open=False))
        self._store("weight_decay", check_real("weight_decay", self.weight_decay, 0.0))
        object.__setattr__(self, "betas", tuple(self.betas))

    def _check_periodic_block(self) -> None:
        """``periodic_block``, the (min, max) lengths of the periodic rows' blocks, stored as a pair of ints."""
        block = listed(self.periodic_block)
        if not isinstance(block, list) or len(block) != 2:
            raise UserInputError(f"periodic_block={self.periodic_block!r} must be a (min, max) pair of block lengths")
        low, high = (check_int("periodic_block", v, 1, why=" (a block length)") for v in block)
        if low > high:
            raise UserInputError(f"periodic_block={self.periodic_block} must satisfy 1 <= min <= max")
        self._store("periodic_block", (low, high))

    def _store(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the recipes are frozen dataclasses


def decayed_parameter_names(model, *, embedding: str = "W_E", decay_gates: bool = False) -> list[str]:
    """The parameters AdamW decays: the matrices, but the embedding (names containing ``embedding``) and,
    unless ``decay_gates``, the compressor's gate parameters (`Compressor.GATE_PARAMETERS`)."""
    gates = set() if decay_gates else {f"{prefix}.{name}" if prefix else name
                                       for prefix, module in model.named_modules() if isinstance(module, Compressor)
                                       for name in Compressor.GATE_PARAMETERS}
    return [n for n, p in model.named_parameters() if p.ndim >= 2 and embedding not in n and n not in gates]


def adamw(model, recipe: Recipe, *, embedding: str = "W_E", decay_gates: bool = False) -> torch.optim.AdamW:
    """AdamW at ``recipe.lr`` and ``recipe.betas`` in two groups, `decayed_parameter_names` (at
    ``recipe.weight_decay``) then the rest, each in ``named_parameters`` order: a saved optimizer state
    indexes its parameters so."""
    decayed = set(decayed_parameter_names(model, embedding=embedding, decay_gates=decay_gates))
    named = list(model.named_parameters())
    return torch.optim.AdamW([{"params": [p for n, p in named if n in decayed], "weight_decay": recipe.weight_decay},
                              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}],
                             lr=recipe.lr, betas=recipe.betas)
