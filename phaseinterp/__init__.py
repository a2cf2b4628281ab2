"""phaseinterp: mechanistic interpretability of chunk-compressed attention (phase sensitivity).

    import phaseinterp as pi
    model = pi.zoo.load("w4s4")                      # a shipped compressed model
    logits, cache = model.run_with_cache(tokens)     # TransformerLens hooks
    profile = pi.phase_profile(model, pi.zoo.task_for(model))
    result = pi.ablate(model, layer=1)               # per-KV-head mean replacement
"""

from phaseinterp import phase, stats, tasks, zoo
from phaseinterp.config import CompressedConfig
from phaseinterp.evaluate import PhaseProfile, phase_profile
from phaseinterp.interventions import (
    AblationResult,
    CyclingResult,
    GateProfile,
    ablate,
    cycle_gates,
    gate_cycling,
    gate_profile,
    mean_ablation,
    shifted_copy,
)
from phaseinterp.models import CheckpointError, CompressedTransformer, KVCache

__version__ = "0.1.0"

__all__ = [
    "AblationResult",
    "CheckpointError",
    "CompressedConfig",
    "CompressedTransformer",
    "CyclingResult",
    "GateProfile",
    "KVCache",
    "PhaseProfile",
    "ablate",
    "cycle_gates",
    "gate_cycling",
    "gate_profile",
    "mean_ablation",
    "phase",
    "phase_profile",
    "shifted_copy",
    "stats",
    "tasks",
    "zoo",
]
