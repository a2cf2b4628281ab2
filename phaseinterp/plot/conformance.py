"""The conformance heatmap: setting x phase, colour = log10 of the largest log-prob difference."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaseinterp.plot.mechanisms import style


def conformance_figure(result, title: str | None = None) -> go.Figure:
    """Left: every setting x answer phase; right: chunked prefill per cut phase and warm settings
    per shared-prefix phase (when measured).
    Colour: the max |d log p|; text: the verdict's statistic (max or mean) and pass/FAIL."""
    table = result.table
    kinds = [k for k in ("answer", "cut") if (table["kind"] == k).any()]
    cut_modes = set(table.loc[table["kind"] == "cut", "mode"])  # a warm setting's cut: where its cached prefix ends
    cut_title = " / ".join(name for name, present in (("prefill cut", cut_modes - {"warm"}),
                                                      ("shared-prefix length", "warm" in cut_modes)) if present)
    fig = make_subplots(rows=1, cols=max(1, len(kinds)), horizontal_spacing=0.12,
                        subplot_titles=[f"answer phase (mod {result.stride})" if k == "answer"
                                        else f"{cut_title} phase (mod {result.cut_period})" for k in kinds])
    for col, kind in enumerate(kinds, start=1):
        rows = table[table["kind"] == kind]
        settings = [s for s in result.settings if s in set(rows["setting"])]
        phases = sorted(set(rows["phase"]))
        z = np.full((len(settings), len(phases)), np.nan)
        text = np.full(z.shape, "", dtype=object)
        for _, r in rows.iterrows():
            i, j = settings.index(r["setting"]), phases.index(r["phase"])
            z[i, j] = np.log10(max(r["max_abs_diff"], 1e-9))
            value = r["max_abs_diff"] if r["statistic"] == "max" else r["mean_abs_diff"]
            text[i, j] = f"{r['statistic']} {value:.1e}<br>{'pass' if r['passed'] else 'FAIL'}"
        fig.add_trace(go.Heatmap(z=z, x=[str(p) for p in phases], y=settings, text=text, texttemplate="%{text}",
                                 colorscale="Reds", zmin=-7, zmax=1, showscale=col == len(kinds),
                                 colorbar=dict(title="log10 max|Δ log p|")), row=1, col=col)
    fig = style(fig, title or f"Conformance with the reference forward: {result.label}",
                width=380 + 420 * len(kinds), height=200 + 40 * len(result.settings))
    return fig
