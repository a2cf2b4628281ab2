"""Experiments beyond the paper: functions of (settings) -> result objects."""

from phaseinterp.experiments.remedy import RemedyResult, compare_remedy, memory_per_token

__all__ = ["RemedyResult", "compare_remedy", "memory_per_token"]
