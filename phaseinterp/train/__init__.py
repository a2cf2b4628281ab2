"""Training from scratch: both model families' loops, and pretraining on natural text.

- `phaseinterp.train.compressed`: the own `CompressedTransformer` (`train`, `TrainConfig`,
  curricula, task mixtures, exact resume, phase-resolved curves);
- `phaseinterp.train.pretrain`: next-token pretraining on natural text (`pretrain`, `PretrainConfig`), one
  process or FSDP2 under torchrun, distributed checkpoints; `corpus` (local text, JSONL, parquet, saved
  datasets -> a memory-mapped token file) and `tokenizer` (`TextTokenizer`, `train_tokenizer`);
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
from phaseinterp.train.pretrain import PretrainConfig, PretrainResult, pretrain
from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

__all__ = ["CurriculumStage", "PretrainConfig", "PretrainResult", "TextTokenizer", "TrainConfig", "TrainResult",
           "TrainingDiverged", "latest_checkpoint", "periodic_rows", "pretrain", "train", "train_tiny", "train_tokenizer"]
