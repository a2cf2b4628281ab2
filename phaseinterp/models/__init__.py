"""Compressed-attention models: compressor, attention, the hooked transformer."""

from phaseinterp.models.attention import CompressedAttention
from phaseinterp.models.cache import KVCache, LayerCache
from phaseinterp.models.compressor import Compressor, GateParameters
from phaseinterp.models.transformer import CheckpointError, CompressedTransformer, parameter_count

__all__ = [
    "CheckpointError",
    "CompressedAttention",
    "CompressedTransformer",
    "parameter_count",
    "Compressor",
    "GateParameters",
    "KVCache",
    "LayerCache",
]
