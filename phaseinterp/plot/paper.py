"""Figures of the paper's published numbers (`phaseinterp.paper`), drawn with the toolkit's house style,
and of any result beside them (`phaseinterp.paper.compare`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaseinterp.plot.compare import DASHES, SYMBOLS, profiles_figure
from phaseinterp.plot.mechanisms import PALETTE, cycling_panels, error_bars, interval_band, style


# ------------------------------------------------------------------ one result each
def needles_figure(profiles, title: str | None = None) -> go.Figure:
    """DeepSeek needle accuracy by residue mod 8 (128K tokens), one panel per model, Wilson intervals
    from the counts; the residues of the boundary phase S - 1 marked."""
    cols = len(profiles)
    fig = make_subplots(rows=1, cols=cols, shared_yaxes=True, horizontal_spacing=0.02,
                        subplot_titles=[p.label.split(" (paper")[0].replace("DeepSeek-", "") + f"<br>gap {100 * p.gap:.1f} pp"
                                        for p in profiles])
    for i, p in enumerate(profiles):
        r = np.arange(p.modulus)
        boundary = r % p.stride == p.stride - 1
        colors = ["#d62728" if b else "#1f77b4" for b in boundary]
        fig.add_trace(go.Bar(x=r, y=100 * p.residue_accuracy, marker_color=colors, showlegend=False, error_y=error_bars(
            100 * p.residue_accuracy, 100 * p.residue_lower, 100 * p.residue_upper)), row=1, col=i + 1)
        fig.update_xaxes(title_text="residue mod 8" if i == cols // 2 else None, dtick=1, row=1, col=i + 1)
    fig.update_yaxes(title_text="needle accuracy (%)", range=[0, 102], row=1, col=1)
    fig.add_annotation(text="red: residues of the boundary phase S - 1", xref="paper", yref="paper", x=0, y=-0.28,
                       showarrow=False, font=dict(size=11), xanchor="left")
    style(fig, title or "DeepSeek-V4 needles at 128K tokens by target residue (published; Wilson 95%)",
          width=1100, height=420)
    fig.update_layout(margin=dict(b=100))
    return fig


def runs_figure(groups: dict, baselines, padding: str, title: str | None = None) -> go.Figure:
    """The controlled runs' 24-residue profiles, one panel per group, each beside the full-attention
    baselines (grey); 95% bootstrap bands as published."""
    names = list(groups)
    cols = 3
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=names, vertical_spacing=0.12,
                        horizontal_spacing=0.04)
    r = np.arange(24)
    shown = set()
    for g, name in enumerate(names):
        row, col = g // cols + 1, g % cols + 1
        for j, b in enumerate(baselines):
            label = b.label.split(" (paper")[0]
            fig.add_trace(go.Scatter(x=r, y=100 * b.residue_accuracy, mode="lines", name=label,
                                     legendgroup="baselines", legendgrouptitle_text="Full attention" if j == 0 else None,
                                     showlegend=label not in shown, line=dict(color="#999", width=1, dash=DASHES[j])),
                          row=row, col=col)
            shown.add(label)
        for i, p in enumerate(groups[name]):
            color = PALETTE[i % len(PALETTE)]
            label = p.label.split(" (paper")[0]
            interval_band(fig, r, 100 * p.residue_lower, 100 * p.residue_upper, color, row, col)
            fig.add_trace(go.Scatter(x=r, y=100 * p.residue_accuracy, mode="lines+markers", name=label,
                                     line=dict(color=color, width=1.6), marker=dict(size=4, symbol=SYMBOLS[i]),
                                     legendgroup=name, legendgrouptitle_text=name if i == 0 else None,
                                     showlegend=True), row=row, col=col)
        fig.update_xaxes(dtick=4, row=row, col=col, title_text="source-key position mod 24" if row == rows else None)
    for row in range(1, rows + 1):
        fig.update_yaxes(range=[0, 100], row=row, col=1, title_text="accuracy (%)")
    style(fig, title or f"The 23 controlled runs by residue beside full attention (published, {padding} padding)",
          width=1250, height=400 * rows + 60)
    # one legend group per panel, titled as the panel (colours repeat from panel to panel)
    fig.update_layout(legend=dict(orientation="v", x=1.01, y=1, font=dict(size=10), tracegroupgap=4,
                                  grouptitlefont=dict(size=11)), margin=dict(r=260))
    return fig


def gates_figure(gates, layers=None, title: str | None = None) -> go.Figure:
    """Per (layer, KV head): the key gate (and value gate, rolled to the key's phase) beside the
    knockout folded to phases. Default layers: the paper's highlighted ones, else the heads whose
    knockout costs at least half of some phase's accuracy; at most six (layer, KV head) panels."""
    a = gates.alignment()
    if layers is None:
        layers = list(gates.highlight) or list(a[a.worst_knockout <= -50].layer.unique()[:6]) or [0]
    pairs = [(layer, h) for layer in layers for h in range(gates.kv_heads)][:6]  # six panels fit a page
    fig = make_subplots(rows=2, cols=len(pairs), shared_yaxes="rows", vertical_spacing=0.14,
                        subplot_titles=[f"L{layer} KV{h}" for layer, h in pairs])
    kg, vg, ko = gates._array("key_gate"), gates._array("value_gate"), gates._array("knockout")
    s = np.arange(gates.stride)
    for i, (layer, h) in enumerate(pairs):
        first = i == 0
        fig.add_trace(go.Bar(x=s, y=kg[layer, h], name="key gate", marker_color=PALETTE[0], legendgroup="k",
                             showlegend=first), row=1, col=i + 1)
        fig.add_trace(go.Scatter(x=s, y=vg[layer, h], mode="lines+markers", name="value gate (phase + 1)",
                                 line=dict(color=PALETTE[1]), legendgroup="v", showlegend=first), row=1, col=i + 1)
        fig.add_hline(y=1, line=dict(dash="dot", color="grey"), row=1, col=i + 1)
        fig.add_trace(go.Bar(x=s, y=ko[layer, h], name="knockout (% of clean)", marker_color=PALETTE[2],
                             legendgroup="ko", showlegend=first), row=2, col=i + 1)
        fig.update_xaxes(dtick=1 if gates.stride <= 8 else 2, title_text="phase", row=2, col=i + 1)
    fig.update_yaxes(title_text="gate / uniform share", row=1, col=1)
    fig.update_yaxes(title_text="relative change (%)", range=[-105, 30], row=2, col=1)
    style(fig, title or f"Gates beside knockouts: {gates.model_label}", width=min(1250, max(640, 190 * len(pairs) + 180)),
          height=560)
    fig.update_layout(legend=dict(orientation="h", y=-0.16, x=0), margin=dict(b=110))
    return fig


def cycling_figure(cycling, title: str | None = None) -> go.Figure:
    """`cycling_panels` of a `PublishedCycling` in % (95% bands as published), titled with the paper's R²
    range over shifts (squared correlation without the last phase), computed here."""
    frame = cycling.to_frame()
    profiles = cycling.profiles.copy()
    profiles[["observed", "predicted", "lower", "upper"]] *= 100
    scores = (f"paper R² {frame.corr2.min():.2f}..{frame.corr2.max():.2f} "
              f"(published {frame.paper_r2.min():.2f}..{frame.paper_r2.max():.2f})")
    return cycling_panels(profiles, cycling.shifts, cycling.stride, scores,
                          title or f"Gate cycling: {cycling.model_label}", percent=True)


def concentration_figure(points: pd.DataFrame, trajectory: pd.DataFrame | None = None,
                         title: str | None = None) -> go.Figure:
    """The concentration plane: each head's key gate, static effective number of offsets exp(H(E[alpha]))
    against the per-window E[exp(H(alpha))] (1 = one offset, W = uniform), one colour per group of runs;
    the baseline's three heads' training paths as lines."""
    fig = go.Figure()
    for i, (group, sub) in enumerate(points.groupby("group", sort=False)):
        fig.add_trace(go.Scatter(x=sub.static, y=sub.per_window, mode="markers", name=group,
                                 marker=dict(size=5, color=PALETTE[i % len(PALETTE)], symbol=SYMBOLS[i % len(SYMBOLS)],
                                             opacity=0.7),
                                 text=[f"{r.name} L{r.layer} KV{r.kv_head}" for r in sub.itertuples()]))
    if trajectory is not None and len(trajectory):
        for j, (layer, path) in enumerate(trajectory.groupby("layer")):
            path = path.sort_values("point")
            fig.add_trace(go.Scatter(x=path.static, y=path.per_window, mode="lines", name=f"baseline L{layer} in training",
                                     line=dict(color="#333", width=1.2, dash=DASHES[j % len(DASHES)])))
            fig.add_trace(go.Scatter(x=path.static.iloc[-1:], y=path.per_window.iloc[-1:], mode="markers",
                                     marker=dict(color="#333", size=9, symbol="star"), showlegend=False))
    top = float(max(points.static.max(), points.per_window.max())) + 0.3
    fig.add_trace(go.Scatter(x=[1, top], y=[1, top], mode="lines", line=dict(dash="dot", color="grey"),
                             name="per-window = static"))
    fig.update_xaxes(title_text="static exp(H(E[α])) of the key gate", range=[0.9, top])
    fig.update_yaxes(title_text="per-window E[exp(H(α))]", range=[0.9, top])
    style(fig, title or "The concentration plane (published; digitized from the paper's figure)", width=900,
          height=640)
    fig.update_layout(legend=dict(x=1.02, y=1, font=dict(size=11)), margin=dict(r=230))
    return fig


# ------------------------------------------------------------------ comparisons
def comparison_figure(comparison, title: str | None = None) -> go.Figure:
    """A `PaperComparison`: the two profiles by residue and by common phase (profiles), the two knockout
    maps folded to the common phases side by side (knockout), or the paper's R² per shift for both
    (cycling)."""
    if comparison.kind == "profile":
        return profiles_figure(list(comparison.profiles), title=title or (
            f"{comparison.model_label} beside the paper's {comparison.run} ({comparison.padding}): "
            f"{comparison.modulus} residues, {comparison.fold} phases"))
    if comparison.kind == "knockout":
        detail = comparison.detail
        models = list(dict.fromkeys(detail.model))
        fig = make_subplots(rows=1, cols=2, subplot_titles=models, horizontal_spacing=0.18)
        for i, m in enumerate(models):
            sub = detail[detail.model == m]
            grid = sub.pivot_table(index=["layer", "kv_head"], columns="phase", values="relative_change", sort=True)
            fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns),
                                     y=[f"L{a} KV{b}" if b >= 0 else f"L{a}" for a, b in grid.index],
                                     zmin=-100, zmax=100, zmid=0, colorscale="RdBu", showscale=i == 1,
                                     colorbar=dict(title="Δ acc (% of clean)")), row=1, col=i + 1)
            fig.update_yaxes(autorange="reversed", row=1, col=i + 1)
            fig.update_xaxes(title_text="phase", dtick=1, row=1, col=i + 1)
        n = max(detail.groupby("model").apply(lambda s: len(s[["layer", "kv_head"]].drop_duplicates())))
        return style(fig, title or f"Knockout maps on {comparison.fold} phases: {comparison.model_label} beside "
                     f"the paper's {comparison.run}", width=1100, height=max(420, 16 * n + 200))
    detail = comparison.detail
    fig = go.Figure()
    for i, (m, sub) in enumerate(detail.groupby("model", sort=False)):
        fig.add_trace(go.Scatter(x=sub["shift"], y=sub.paper_r2, mode="markers+lines", name=f"{m}: paper's R²",
                                 marker=dict(size=9, color=PALETTE[i]), line=dict(color=PALETTE[i])))
        fig.add_trace(go.Scatter(x=sub["shift"], y=sub.r2, mode="markers", name=f"{m}: strict R² (no fit)",
                                 marker=dict(size=9, color=PALETTE[i], symbol="x")))
    fig.update_xaxes(title_text="gate shift d", dtick=1)
    fig.update_yaxes(title_text="R² per shift", range=[min(-0.05, float(np.nanmin(detail.r2)) - 0.05), 1.05])
    style(fig, title or f"Gate cycling per shift: {comparison.model_label} beside the paper's {comparison.run}",
          width=900, height=480)
    fig.update_layout(legend=dict(orientation="h", y=-0.2), margin=dict(b=120))
    return fig
