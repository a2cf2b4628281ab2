"""Training from scratch on CPU: both model families' loops.

- `phaseinterp.train.compressed`: the own `CompressedTransformer` (`train`, `TrainConfig`,
  curricula, task mixtures, exact resume, phase-resolved curves);
- `phaseinterp.train.deepseek_v4`: the tiny Hugging Face DeepSeek-V4s (`train_tiny`, with the
  Lightning Indexer's KL loss); their recipes live in `phaseinterp.zoo.deepseek_v4`.

``import phaseinterp`` loads this package on first use (``pi.train``).
"""

from phaseinterp.train.compressed import (
    CurriculumStage,
    TrainConfig,
    TrainingDiverged,
    TrainResult,
    latest_checkpoint,
    periodic_rows,
    train,
)
from phaseinterp.train.deepseek_v4 import train_tiny

__all__ = ["CurriculumStage", "TrainConfig", "TrainResult", "TrainingDiverged", "latest_checkpoint", "periodic_rows",
           "train", "train_tiny"]
