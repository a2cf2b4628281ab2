"""Several phase profiles on one figure (compressed vs full attention, strides, padding)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaseinterp.plot.mechanisms import PALETTE, error_bars, style

DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star", "triangle-down")


def profiles_figure(profiles: Sequence, title: str | None = None) -> go.Figure:
    """Accuracy by residue (left) and by phase (right) with 95% intervals, one colour, dash and
    marker per model (two models with equal accuracies stay visible: neither line hides the other);
    each legend entry carries the model's detected period."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38],
                        subplot_titles=("accuracy by residue (mod R)", "accuracy by phase (mod S)"))
    for i, p in enumerate(profiles):
        color = PALETTE[i % len(PALETTE)]
        line = dict(color=color, dash=DASHES[i % len(DASHES)])
        marker = dict(symbol=SYMBOLS[i % len(SYMBOLS)], size=7)
        period = (f"period {p.period}" if p.period is not None else "period undetermined at this design"
                  if getattr(p, "period_undetermined", False) else "no significant period")
        name = f"{p.label} (mean {p.mean:.2f}, {period})"
        r = np.arange(p.modulus)
        fig.add_trace(go.Scatter(
            x=r, y=p.residue_accuracy, mode="lines+markers", name=name, legendgroup=str(i), line=line,
            marker=marker,
            error_y=error_bars(p.residue_accuracy, p.residue_lower, p.residue_upper),
        ), row=1, col=1)
        s = np.arange(p.stride)
        fig.add_trace(go.Scatter(
            x=s, y=p.phase_accuracy, mode="lines+markers", name=name, legendgroup=str(i), showlegend=False,
            line=line, marker=marker,
            error_y=error_bars(p.phase_accuracy, p.phase_lower, p.phase_upper),
        ), row=1, col=2)
    fig.update_xaxes(title_text="target residue", dtick=2, row=1, col=1)
    fig.update_xaxes(title_text="target phase", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="top-1 accuracy", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.22))
    return style(fig, title or "Accuracy by position phase", width=1100, height=500)
