"""Figures for the idealized induction model: gate trajectories, seed sweeps, the Theorem-1 search."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaseinterp.plot.mechanisms import PALETTE, style


def flow_figure(result, worst_chunk: bool = False, title: str | None = None) -> go.Figure:
    """One run: p^K(r) and p^V(r) per head over time (one line per slot; the head's final slot
    solid), the loss, and the concentration exp(H(p)) per head and branch (log time axis)."""
    p = result.min_p if worst_chunk else result.mean_p
    t = np.maximum(result.t, result.t[1] * 1e-2 if len(result.t) > 1 else 1e-3)  # log axis: move t = 0 off zero
    H, S = result.heads, result.S
    slots = result.slots()
    cols = max(2, H)
    half = cols // 2
    head_row = [{} for _ in range(H)] + [None] * (cols - H)
    bottom = [{"colspan": half}] + [None] * (half - 1) + [{"colspan": cols - half}] + [None] * (cols - half - 1)
    titles = ([f"head {h}: p^K" for h in range(H)] + [f"head {h}: p^V" for h in range(H)]
              + ["loss", "concentration exp(H(p)): uniform = S, one-hot = 1"])
    fig = make_subplots(rows=3, cols=cols, specs=[head_row, list(head_row), bottom], subplot_titles=titles,
                        vertical_spacing=0.1)
    for h in range(H):
        for branch, row, chosen in ((0, 1, slots[h]), (1, 2, slots[h] + 1)):
            for r in range(S):
                fig.add_trace(go.Scatter(
                    x=t, y=p[:, h, branch, r], mode="lines", name=f"slot {r}", legendgroup=f"slot {r}",
                    showlegend=(h == 0 and branch == 0), line=dict(color=PALETTE[r % len(PALETTE)],
                                                                    width=3 if r == chosen else 1.5,
                                                                    dash="solid" if r == chosen else "dot"),
                ), row=row, col=h + 1)
            fig.update_yaxes(range=[0, 1.02], row=row, col=h + 1)
    fig.add_trace(go.Scatter(x=t, y=result.loss, mode="lines", name="loss", line=dict(color="black"),
                             showlegend=False), row=3, col=1)
    conc = result.concentration()
    for h in range(H):
        for branch, dash in ((0, "solid"), (1, "dash")):
            fig.add_trace(go.Scatter(x=t, y=conc[:, h, branch], mode="lines", name=f"head {h} {'KV'[branch]}",
                                     showlegend=False, line=dict(color=PALETTE[(h + 4) % len(PALETTE)], dash=dash)),
                          row=3, col=half + 1)
    fig.update_xaxes(type="log", title="flow time t")
    kind = "worst chunk" if worst_chunk else "population mean"
    s = result.to_dict()
    return style(fig, title or (f"Gradient flow, N={s['N']} S={s['S']} L={s['L']} m={s['heads']}, seed {s['seed']}: "
                                f"slots {slots} ({kind})"), width=max(760, 330 * cols), height=820)


def sweep_figure(sweep, title: str | None = None) -> go.Figure:
    """Across seeds: the final slot chosen by each head, the worst-chunk p^K(r_h) and p^V(r_h+1)
    reached, and how often heads collide compared with independent uniform choice."""
    df = sweep.to_frame()
    s = sweep.to_dict()
    H = s["heads"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=["slot chosen (count over seeds)",
                                                        "reached p (worst chunk)", "collisions"])
    for h in range(H):
        counts = np.bincount([slots[h] for slots in df.slots], minlength=s["S"] - 1)
        fig.add_trace(go.Bar(x=list(range(s["S"] - 1)), y=counts, name=f"head {h}",
                             marker_color=PALETTE[h % len(PALETTE)]), row=1, col=1)
    fig.add_trace(go.Scatter(x=df.min_p_key, y=df.min_p_value, mode="markers", text=[f"seed {x}" for x in df.seed],
                             name="runs", marker=dict(color=np.where(df.reached, PALETTE[2], PALETTE[1]), size=9)),
                  row=1, col=2)
    fig.add_vline(x=sweep.threshold, line=dict(dash="dot"), row=1, col=2)
    fig.add_hline(y=sweep.threshold, line=dict(dash="dot"), row=1, col=2)
    fig.add_trace(go.Bar(x=["observed", "independent uniform"], y=[s["collision_frequency"], s["chance_collision"]],
                         marker_color=[PALETTE[0], "#999999"], showlegend=False), row=1, col=3)
    fig.update_xaxes(title="key slot r_h", dtick=1, row=1, col=1)
    fig.update_xaxes(title="min_h p^K(r_h)", row=1, col=2)
    fig.update_yaxes(title="min_h p^V(r_h+1)", row=1, col=2)
    fig.update_yaxes(title="fraction of seeds", range=[0, 1], row=1, col=3)
    fig.update_layout(barmode="group")
    return style(fig, title or (f"{s['seeds']} seeds: {s['fraction_reached']:.0%} reach {s['threshold']:g}, "
                                f"collisions {s['collision_frequency']:.0%}"), width=1100, height=420)


def search_figure(result, top: int = 20, title: str | None = None) -> go.Figure:
    """The ``top`` lowest one-hot assignments (claimed form in colour) and the losses local
    refinement reached (random starts vs one-hot starts), against the best one-hot loss."""
    df = result.one_hot.head(top)
    labels = [f"K{list(a)} V{list(b)}" for a, b in zip(df.key_slots, df.value_slots)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=["one-hot assignments (lowest first)", "local refinement"])
    fig.add_trace(go.Bar(x=labels, y=df.loss, marker_color=np.where(df.claimed_form, PALETTE[0], "#bbbbbb"),
                         showlegend=False), row=1, col=1)
    if len(result.refined):
        for i, start in enumerate(["one_hot", "random"]):
            sub = result.refined[result.refined.start == start]
            fig.add_trace(go.Box(y=sub.loss, name=start, boxpoints="all", marker_color=PALETTE[i + 1],
                                 showlegend=False), row=1, col=2)
    fig.add_hline(y=result.best_one_hot_loss, line=dict(dash="dot"), row=1, col=2)
    fig.update_yaxes(title="population loss", row=1, col=1)
    s = result.to_dict()
    return style(fig, title or f"Theorem-1 search, N={s['N']} S={s['S']} m={s['heads']}: holds={s['holds']}",
                 width=1000, height=460)


def search_grid_figure(grid, title: str | None = None) -> go.Figure:
    """Per grid point: margin of the claimed form over the best other one-hot assignment, and
    the gap between the best refined loss and the best one-hot loss (negative: refinement beat
    every one-hot assignment, so the minimizer is not one-hot)."""
    df = grid.to_frame()
    labels = [f"N={r.N} S={r.S} m={r.heads}" for r in df.itertuples()]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=df.margin, name="margin over other one-hot", marker_color=PALETTE[0]))
    fig.add_trace(go.Bar(x=labels, y=df.best_refined_loss - df.best_loss, name="refined - best one-hot",
                         marker_color=PALETTE[1]))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="loss difference")
    s = grid.to_dict()
    return style(fig, title or f"Theorem 1 over the grid: holds at {s['holds']}/{s['grid_points']} points")
