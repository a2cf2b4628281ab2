"""Engines (`Engine`: ``tokens [batch, pos] -> next-token log-probs [batch, d_vocab]``), the phase-resolved
`conformance` check against the reference forward, and `engine_profile`, the phase profile of a served model."""

from phaseinterp.engines.adapters import (CacheEngine, Engine, TransformersEngine, WarmEngine, cast_copy,
                                          chunked_pieces, decode_pieces, engine_for, full_pieces)
from phaseinterp.engines.check import (ConformanceSpec, DEFAULT_MODES, DEFAULT_TOLERANCE, DTYPES, MODES, conformance,
                                       cut_period, phase_table)
from phaseinterp.engines.llama_cpp import LlamaCppEngine  # llama_cpp itself is imported on first use
from phaseinterp.engines.openai import OpenAIEngine
from phaseinterp.engines.profile import engine_profile
from phaseinterp.engines.result import ConformanceResult

__all__ = ["CacheEngine", "ConformanceResult", "ConformanceSpec", "DEFAULT_MODES", "DEFAULT_TOLERANCE", "DTYPES", "Engine", "LlamaCppEngine",
           "MODES", "OpenAIEngine", "TransformersEngine", "WarmEngine", "cast_copy", "chunked_pieces", "conformance", "cut_period", "decode_pieces",
           "engine_for", "engine_profile", "full_pieces", "phase_table"]
