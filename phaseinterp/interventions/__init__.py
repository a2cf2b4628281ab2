"""Interventions: per-KV-head mean replacement (and resample / norm-matched ablations), cyclic gate shifts,
gate statistics, and the confirmatory pipeline (`confirm`)."""

from phaseinterp.interventions.ablation import AblationResult, ablate, calibration_mean_z, mean_ablation
from phaseinterp.interventions.confirm import ConfirmResult, confirm, replacement_ablation
from phaseinterp.interventions.gate_cycling import (
    CyclingResult,
    cycle_gates,
    cycling_fitness,
    cycling_scores,
    gate_cycling,
    shifted_copy,
)
from phaseinterp.interventions.gate_stats import GateProfile, gate_profile

__all__ = [
    "AblationResult",
    "ConfirmResult",
    "CyclingResult",
    "GateProfile",
    "ablate",
    "calibration_mean_z",
    "confirm",
    "cycle_gates",
    "cycling_fitness",
    "cycling_scores",
    "gate_cycling",
    "gate_profile",
    "mean_ablation",
    "replacement_ablation",
    "shifted_copy",
]
