"""Plotly figures for phaseinterp results (imported on the first ``plot()``: `phaseinterp.results.plotting`).

Every function returns a ``plotly.graph_objects.Figure``; `save` writes HTML and, through
kaleido and a local Chromium, PNG/SVG/PDF offline.
"""

from phaseinterp.plot import compare, conformance, export, mechanisms, paper, profile, theory
from phaseinterp.plot.compare import profiles_figure
from phaseinterp.plot.export import save
from phaseinterp.plot.mechanisms import (gate_cycling_figure, gate_profile_figure, specialization_heatmap, style,
                                         pretrain_curves, training_curves, unit_cycling_figure)
from phaseinterp.plot.profile import plot_docstring, plot_profile, plot_two_axis

__all__ = ["compare", "conformance", "export", "mechanisms", "paper", "profile", "theory", "gate_cycling_figure",
           "gate_profile_figure", "plot_docstring", "plot_profile", "plot_two_axis", "profiles_figure", "save",
           "specialization_heatmap", "style", "pretrain_curves", "training_curves", "unit_cycling_figure"]
