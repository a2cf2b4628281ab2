"""Figures for the phase profile (accuracy vs residue, folded phases) and the docstring probe."""

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from phaseinterp.plot.mechanisms import error_bars


def plot_profile(profile: Any) -> go.Figure:
    """Left: accuracy per residue with intervals, coloured by phase. Right: per phase, worst phase(s) outlined."""
    residues, phases = profile.residue_frame(), profile.phase_frame()
    colors = [qualitative.Plotly[s % len(qualitative.Plotly)] for s in range(profile.stride)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.7, 0.3],
                        subplot_titles=(f"by residue (mod {profile.modulus})", f"by phase (mod {profile.stride})"))
    for s in range(profile.stride):
        part = residues[residues["phase"] == s]
        fig.add_trace(go.Scatter(x=part["residue"], y=part["accuracy"], mode="markers", name=f"phase {s}",
                                 legendgroup=f"phase {s}", marker={"color": colors[s], "size": 9},
                                 error_y=error_bars(part["accuracy"], part["lower"], part["upper"])), row=1, col=1)
    fig.add_trace(go.Scatter(x=residues["residue"], y=residues["accuracy"], mode="lines",
                             line={"color": "lightgray"}, showlegend=False), row=1, col=1)
    fig.add_hline(y=profile.mean, line_dash="dot", line_color="gray", row=1, col=1)
    outline = ["black" if w else "rgba(0,0,0,0)" for w in phases["worst"]]
    fig.add_trace(go.Bar(x=phases["phase"], y=phases["accuracy"],
                         marker={"color": colors, "line": {"color": outline, "width": 3}},
                         error_y=error_bars(phases["accuracy"], phases["lower"], phases["upper"]), showlegend=False),
                  row=1, col=2)
    fig.update_layout(
        title=(f"{profile.label}: mean {profile.mean:.1%}, worst phase(s) {list(profile.worst_phases)} "
               f"at {np.nanmin(profile.phase_accuracy):.1%}, gap {profile.gap:.1%} (residues) / "
               f"{profile.phase_gap:.1%} (phases), period {_period_words(profile)} (p = {profile.period_p_value:.3g})"),
        yaxis={"title": "top-1 accuracy", "range": [0, 1.02]}, yaxis2={"range": [0, 1.02]},
        xaxis={"title": "prompt-length residue" if getattr(profile, "axis", "target") == "length" else "target residue",
               "dtick": profile.stride},
        xaxis2={"title": "phase", "dtick": 1}, template="plotly_white")
    return fig


def plot_two_axis(result: Any) -> go.Figure:
    """Heatmap of accuracy: target phase (rows) x prompt-length phase (columns), prompt counts on hover."""
    table = result.table()
    fig = go.Figure(go.Heatmap(
        z=table.to_numpy(), x=[str(c) for c in table.columns], y=[str(r) for r in table.index], zmin=0, zmax=1,
        colorscale="Viridis", colorbar={"title": "top-1"}, customdata=result.cell_n,
        hovertemplate="target phase %{y}, length phase %{x}: %{z:.1%} of %{customdata} prompts<extra></extra>",
    ))
    t, ell = result.target, result.length
    fig.update_layout(
        title=(f"{result.label}: target-phase gap {t.phase_gap:.1%} (period {_period_words(t)}), "
               f"length-phase gap {ell.phase_gap:.1%} (period {_period_words(ell)})"),
        xaxis={"title": "prompt-length phase"}, yaxis={"title": "target phase", "autorange": "reversed"},
        template="plotly_white",
    )
    return fig


def plot_docstring(result: Any) -> go.Figure:
    """Log-probability margin (right - wrong) vs docstring length, one line per filler family."""
    frame = result.to_frame()
    fig = go.Figure()
    for family, part in frame.groupby("family", sort=False):
        fig.add_trace(go.Scatter(x=part["length"], y=part["margin"], mode="lines+markers", name=str(family)))
    fig.add_hline(y=0, line_color="gray", line_dash="dot")
    fig.update_layout(title=f"{result.label}: log p({result.right!r}) - log p({result.wrong!r}) vs docstring length",
                      xaxis={"title": "docstring length (tokens)", "dtick": 1}, yaxis={"title": "margin (nats)"},
                      template="plotly_white")
    return fig


def _period_words(profile) -> str:
    """A profile's period for a title: the period, "none", or "undetermined at this design" (the test
    could not reach significance with these residues: `PhaseProfile.period_undetermined`)."""
    if getattr(profile, "period_undetermined", False):
        return "undetermined at this design"
    return "none" if profile.period is None else str(profile.period)
