"""phaseinterp: mechanistic interpretability of chunk-compressed attention (phase sensitivity).

    import phaseinterp as pi
    model = pi.load("w4s4")                          # a zoo name or a checkpoint folder, either family
    logits, cache = model.run_with_cache(tokens)     # TransformerLens hooks
    profile = pi.phase_profile(model)                # accuracy by phase on the model's stored task
    result = pi.ablate(model, layer=1)               # per-KV-head mean replacement

Names are imported on first use (``import phaseinterp`` itself loads neither torch nor
plotly), so the command line answers ``--help`` at once.
"""

import importlib as _importlib

__version__ = "0.3.0"

_SUBMODULES = {"phase", "stats", "tasks", "zoo", "plot", "report", "results", "profile", "errors",
               "interventions", "models", "config", "train", "theory", "cli", "engines", "parallel", "experiments",
               "paper"}  # paper: the paper's published numbers (phaseinterp.paper)
_NAMES = {
    "CompressedConfig": "phaseinterp.config",
    "DEFAULT_N_PER_RESIDUE": "phaseinterp._checks",  # every accuracy-by-phase function's default size
    "load": "phaseinterp.models.loading",  # one loader: zoo names, own checkpoints, HF DeepSeek-V4 folders
    "PhaseProfile": "phaseinterp.profile",
    "TwoAxisProfile": "phaseinterp.profile",
    "phase_profile": "phaseinterp.profile",
    "ProfileSpec": "phaseinterp.profile",
    "engine_profile": "phaseinterp.engines.profile",  # phase_profile of a served model (journaled, retried)
    "profile_from_lm_eval": "phaseinterp.engines.lm_eval",  # lm-eval's logged samples as a PhaseProfile
    "AblationResult": "phaseinterp.interventions",
    "AblationSpec": "phaseinterp.interventions",  # each experiment's options, checked once (phaseinterp._checks.Spec)
    "CyclingSpec": "phaseinterp.interventions",
    "UnitCyclingSpec": "phaseinterp.interventions",
    "ConformanceSpec": "phaseinterp.engines",
    "CyclingResult": "phaseinterp.interventions",
    "GateProfile": "phaseinterp.interventions",
    "GateProfileSpec": "phaseinterp.interventions",
    "ablate": "phaseinterp.interventions",
    "shift_gates": "phaseinterp.interventions",
    "gate_cycling_profile": "phaseinterp.interventions",
    "gate_cycling_unit": "phaseinterp.interventions",
    "gate_profile": "phaseinterp.interventions",
    "shifted_copy": "phaseinterp.interventions",
    "shift_static_gates": "phaseinterp.interventions",
    "mean_gate_logits": "phaseinterp.interventions",
    "specialized_units": "phaseinterp.interventions",
    "SelectionSpec": "phaseinterp.interventions",
    "UnitCyclingResult": "phaseinterp.interventions",
    "UnitSelection": "phaseinterp.interventions",
    "CheckpointError": "phaseinterp.models",
    "CompressedTransformer": "phaseinterp.models",
    "KVCache": "phaseinterp.models",
    "from_hf": "phaseinterp.models.hf",  # DeepSeek-V4 via transformers (optional extra [hf])
    "load_hf": "phaseinterp.models.hf",
    "indexer_phase": "phaseinterp.interventions.indexer",
    "IndexerPhaseResult": "phaseinterp.interventions.indexer",
    "IndexerSpec": "phaseinterp.interventions.indexer",
    "force_target_selection": "phaseinterp.interventions.indexer",
    "ForcedSelectionResult": "phaseinterp.interventions.indexer",
    "conformance": "phaseinterp.engines",  # implementations compared per phase
    "ConformanceResult": "phaseinterp.engines",
    "OpenAIEngine": "phaseinterp.engines",
    "keep_freed_memory": "phaseinterp.models.allocator",  # CPU speed: glibc keeps freed memory
}


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(_importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"phaseinterp.{name}")
    else:
        raise AttributeError(f"module 'phaseinterp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    """The public surface only: the lazy names, the packages and ``__version__`` (no import plumbing)."""
    return sorted(set(_NAMES) | _SUBMODULES | {"__version__"})


__all__ = [
    "AblationResult",
    "AblationSpec",
    "CyclingSpec",
    "UnitCyclingSpec",
    "ConformanceSpec",
    "CheckpointError",
    "CompressedConfig",
    "CompressedTransformer",
    "DEFAULT_N_PER_RESIDUE",
    "CyclingResult",
    "GateProfile",
    "GateProfileSpec",
    "SelectionSpec",
    "KVCache",
    "load",
    "load_hf",
    "PhaseProfile",
    "TwoAxisProfile",
    "ablate",
    "shift_gates",
    "from_hf",
    "indexer_phase",
    "IndexerPhaseResult",
    "IndexerSpec",
    "force_target_selection",
    "ForcedSelectionResult",
    "ConformanceResult",
    "OpenAIEngine",
    "conformance",
    "gate_cycling_profile",
    "gate_cycling_unit",
    "gate_profile",
    "phase",
    "phase_profile",
    "ProfileSpec",
    "engine_profile",
    "shifted_copy",
    "shift_static_gates",
    "mean_gate_logits",
    "specialized_units",
    "UnitCyclingResult",
    "UnitSelection",
    "stats",
    "tasks",
    "theory",
    "paper",
    "zoo",
]
