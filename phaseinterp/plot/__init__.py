"""Plotly figures for phaseinterp results (imported lazily by the results' ``plot()`` methods)."""

from phaseinterp.plot.profile import plot_docstring, plot_profile

__all__ = ["plot_docstring", "plot_profile"]
