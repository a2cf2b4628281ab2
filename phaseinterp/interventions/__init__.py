"""Interventions: per-KV-head mean replacement (and resample / norm-matched ablations), cyclic gate shifts
(whole-profile and unit-level, roll and static-part), gate statistics, and the confirmatory pipeline (`confirm`)."""

from phaseinterp.interventions.ablation import AblationResult, AblationSpec, ablate, calibration_mean_z
from phaseinterp.interventions.confirm import ConfirmResult, ConfirmSpec, ReplacementSpec, confirm, replacement_ablation
from phaseinterp.interventions.cycling_stats import cycling_scores, movement_scores
from phaseinterp.interventions.gate_cycling import CyclingResult, CyclingSpec, gate_cycling_profile
from phaseinterp.interventions.gate_shifts import (cycling_fitness, mean_gate_logits, shift_gates, shift_static_gates,
                                                   shifted_copy)
from phaseinterp.interventions.gate_stats import GateProfile, GateProfileSpec, gate_profile
from phaseinterp.interventions.unit_cycling import (SelectionSpec, UnitCyclingResult, UnitCyclingSpec, UnitSelection,
                                                   gate_cycling_unit, specialized_units)

__all__ = ["AblationResult", "AblationSpec", "CyclingSpec", "UnitCyclingSpec", "ConfirmResult", "ConfirmSpec",
           "ReplacementSpec", "SelectionSpec", "CyclingResult", "GateProfile", "GateProfileSpec", "ablate",
           "calibration_mean_z", "confirm", "cycling_fitness", "cycling_scores", "gate_cycling_profile",
           "gate_cycling_unit", "gate_profile", "replacement_ablation", "mean_gate_logits", "movement_scores",
           "shift_gates", "shift_static_gates", "shifted_copy", "specialized_units", "UnitCyclingResult",
           "UnitSelection"]
