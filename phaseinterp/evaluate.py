"""Alias of `phaseinterp.profile` (the phase profile's old module name), kept so old imports work."""

from phaseinterp.profile import INTERVALS, PhaseProfile, phase_profile, profile_from_records

__all__ = ["INTERVALS", "PhaseProfile", "phase_profile", "profile_from_records"]
