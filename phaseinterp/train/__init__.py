"""Training from scratch: `compressed` (the own `CompressedTransformer`: `train`, `TrainConfig`),
`pretrain` (natural text, one process or FSDP2: `pretrain`, `PretrainConfig`; with `corpus` and
`tokenizer`) and `deepseek_v4` (the tiny Hugging Face DeepSeek-V4s: `train_tiny`); what the three share
is in `recipe` (the learning-rate schedule, AdamW) and `checkpoints`."""

from phaseinterp.train.checkpoints import latest_checkpoint
from phaseinterp.train.compressed import (CurriculumStage, TrainConfig, TrainingDiverged, TrainResult, periodic_rows,
                                          train)
from phaseinterp.train.deepseek_v4 import train_tiny
from phaseinterp.train.pretrain import PretrainConfig, PretrainResult, pretrain
from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

__all__ = ["CurriculumStage", "PretrainConfig", "PretrainResult", "TextTokenizer", "TrainConfig", "TrainResult",
           "TrainingDiverged", "latest_checkpoint", "periodic_rows", "pretrain", "train", "train_tiny", "train_tokenizer"]
