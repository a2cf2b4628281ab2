"""Training from scratch on CPU: both model families' loops.

- `phaseinterp.train.compressed`: the own `CompressedTransformer` (`train`, `TrainConfig`,
  curricula, task mixtures, exact resume, phase-resolved curves);
- `phaseinterp.train.deepseek_v4`: the tiny Hugging Face DeepSeek-V4s (`train_tiny`, with the
  Lightning Indexer's KL loss); their recipes live in `phaseinterp.zoo.deepseek_v4`.

``phaseinterp.train.train`` etc. are the own family's loop (imported on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {name: "phaseinterp.train.compressed" for name in
          ("train", "TrainConfig", "TrainResult", "CurriculumStage", "TrainingDiverged", "latest_checkpoint",
           "periodic_rows")} | {"train_tiny": "phaseinterp.train.deepseek_v4"}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'phaseinterp.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


__all__ = sorted(_NAMES)
