"""Interventions: per-KV-head mean replacement, cyclic gate shifts, gate statistics."""

from phaseinterp.interventions.ablation import AblationResult, ablate, calibration_mean_z, mean_ablation
from phaseinterp.interventions.gate_cycling import CyclingResult, cycle_gates, gate_cycling, shifted_copy
from phaseinterp.interventions.gate_stats import GateProfile, gate_profile

__all__ = [
    "AblationResult",
    "CyclingResult",
    "GateProfile",
    "ablate",
    "calibration_mean_z",
    "cycle_gates",
    "gate_cycling",
    "gate_profile",
    "mean_ablation",
    "shifted_copy",
]
