"""phaseinterp: mechanistic interpretability of chunk-compressed attention (phase sensitivity)."""

from phaseinterp import phase
from phaseinterp.config import CompressedConfig
from phaseinterp.models import CheckpointError, CompressedTransformer, KVCache

__version__ = "0.1.0"

__all__ = ["CheckpointError", "CompressedConfig", "CompressedTransformer", "KVCache", "phase"]
