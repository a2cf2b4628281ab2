"""Figures for the mechanistic experiments: head x phase heatmaps, gate cycling, gate profiles, training curves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaseinterp._checks import check_name, check_real

FONT = dict(family="Helvetica, Arial, sans-serif", size=13)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def style(fig: go.Figure, title: str | None = None, width: int = 760, height: int = 460) -> go.Figure:
    """The house style: white template, one font, compact margins (paper-ready at 2x scale). A
    title longer than the figure is wide is wrapped at spaces (plotly draws a title on one line and
    cuts it at the figure's edge), with the top margin grown by a line per extra line."""
    lines = wrap_title(title, width) if title else []
    fig.update_layout(template="plotly_white", font=FONT, width=width, height=height + 20 * max(len(lines) - 1, 0),
                      margin=dict(l=70, r=30, t=(70 + 20 * (len(lines) - 1)) if title else 30, b=60),
                      title=dict(text="<br>".join(lines), x=0.02) if title else None,
                      legend=dict(bgcolor="rgba(255,255,255,0.7)"))
    return fig


def error_bars(value, lower, upper) -> dict:
    """Plotly's asymmetric error bars for ``value``, from ``lower`` to ``upper``."""
    return dict(type="data", symmetric=False, array=upper - value, arrayminus=value - lower, thickness=1)


def wrap_title(title: str, width: int, font_size: float = 17) -> list[str]:
    """``title`` split at spaces into lines that fit a figure ``width`` px wide (a title's font is
    larger than the body's: plotly's default 17 px at body 13 px), by a conservative 0.6 em per
    character; a title that already holds ``<br>`` breaks is kept as its author split it."""
    font_size = check_real("font_size", font_size, 0.0, low_open=True, why=" (px)")
    if "<br>" in title:
        return title.split("<br>")
    per_line = max(int((width * 0.96 - 20) / (0.6 * font_size)), 20)
    lines: list[str] = []
    for word in title.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= per_line:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def specialization_heatmap(result, level: str = "phase", zmax: float | None = None, title: str | None = None,
                           value: str = "auto", min_clean: float = 0.10) -> go.Figure:
    """Knockout change of accuracy per (layer, KV head) x phase; diverging, centred on 0.

    ``value``: ``"pp"``, ``"relative"`` or ``"auto"`` (pp when any phase's clean accuracy is below
    ``min_clean``, else relative); buttons switch between the two. At ``level="phase"`` cells marked *
    are significant after Holm's correction (``result.phase_tests()``); the boundary phase S-1 is marked."""
    check_name("value", value, ("auto", "pp", "relative"))
    check_name("level", level, ("phase", "residue"))
    if zmax is not None:
        zmax = check_real("zmax", zmax, 0.0, low_open=True, why=" or None (the data's largest change)")
    min_clean = check_real("min_clean", min_clean, 0.0, 1.0, high_open=False, why=" (a clean accuracy)")
    rel = result.relative_change if level == "phase" else result.relative_change_residue
    published = getattr(result, "published", False)  # a published map: no prompts, so no tests to mark
    if level == "phase":
        pp = result.absolute_change
    elif published:
        pp = pd.DataFrame(result._published_values(False, absolute=True), index=rel.index, columns=rel.columns)
    else:
        groups = result.residue
        pp_values = np.stack([100 * (result.knockout_correct[groups == g].mean(0) - result.clean_correct[groups == g].mean())
                              if (groups == g).any() else np.full(len(result.units), np.nan)
                              for g in range(result.residue_modulus)], 1)
        pp = pd.DataFrame(pp_values, index=rel.index, columns=rel.columns)
    low_baseline = bool((result.clean.reindex(range(result.stride)).to_numpy(dtype=float) < min_clean).any())
    if published and not np.isfinite(pp.to_numpy(dtype=float)).any():
        low_baseline = False  # no clean profile published: only the relative map exists
    shown = ("pp" if low_baseline else "relative") if value == "auto" else value
    units = result.units.reset_index(drop=True)
    labels = []
    for u in units.itertuples():
        head = "layer" if u.kv_head == -1 and len(u.heads) > 1 else (f"KV{u.kv_head}" if u.kv_head >= 0 else "set")
        labels.append(f"L{u.layer} {head} (q{','.join(map(str, u.heads))})")
    marks = np.full(rel.shape, "", dtype=object)
    if level == "phase" and not published:
        tests = result.phase_tests()
        sig = tests.significant.to_numpy().reshape(result.stride, len(units)).T
        marks[sig] = "*"
    z = {"relative": rel.to_numpy(dtype=float), "pp": pp.to_numpy(dtype=float)}
    bounds = {}
    for key, values in z.items():
        finite = np.abs(values[np.isfinite(values)])
        bounds[key] = max(zmax if zmax is not None else (float(finite.max()) if finite.size else 100.0), 1.0)
    unit_label = {"relative": "Δ acc (% of clean)", "pp": "Δ acc (pp)"}
    fig = go.Figure(go.Heatmap(
        z=z[shown], x=list(rel.columns), y=labels, zmin=-bounds[shown], zmax=bounds[shown], zmid=0,
        colorscale="RdBu", colorbar=dict(title=unit_label[shown]), text=marks, texttemplate="%{text}",
        customdata=np.stack([z["pp"], z["relative"]], -1),
        hovertemplate=level + " %{x}<br>%{y}<br>%{customdata[0]:.1f} pp (%{customdata[1]:.1f}% of clean)"
        "<extra></extra>",
    ))
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=0.0, xanchor="left", y=-0.22, yanchor="top", showactive=True,
        active=0 if shown == "pp" else 1,
        buttons=[dict(label=unit_label[key], method="restyle",
                      args=[{"z": [z[key]], "zmin": [-bounds[key]], "zmax": [bounds[key]],
                             "colorbar.title.text": unit_label[key]}]) for key in ("pp", "relative")],
    )])
    # Layer separators.
    layers = units.layer.to_numpy()
    for i in range(1, len(layers)):
        if layers[i] != layers[i - 1]:
            fig.add_hline(y=i - 0.5, line=dict(color="black", width=2))
    if level == "phase":
        boundary = result.stride - 1
        fig.add_vrect(x0=boundary - 0.5, x1=boundary + 0.5, line=dict(color="black", width=2, dash="dot"),
                      fillcolor="rgba(0,0,0,0)")
        fig.add_annotation(x=boundary, y=1.02, yref="paper", text="boundary", showarrow=False, font=dict(size=11))
    fig.update_xaxes(title=level, dtick=1)
    fig.update_yaxes(autorange="reversed")
    note = " (* significant, Holm over units x phases)" if level == "phase" and not published else ""
    if published:
        note = " (published map)"
    style(fig, title or f"Mean replacement of z at the answer: {result.model_label}{note}",
          height=max(380, 40 * len(labels) + 220))
    fig.update_layout(margin=dict(b=120))  # room for the pp / relative buttons under the axis
    return fig


def gate_cycling_figure(result, title: str | None = None) -> go.Figure:
    """`cycling_panels` of a `GateCyclingResult`, titled with the headline R² (1 - SS_res/SS_tot, no fitted
    slope or intercept), the squared correlation and how many shifts the identification test recovers
    (see `phaseinterp.interventions.gate_cycling.cycling_scores`)."""
    scores = result.scores
    frame = result.to_frame().rename(columns={"accuracy": "observed"})
    base = frame.loc[frame["shift"] == 0].set_index("phase")["observed"]
    frame["observed_change"] = frame["observed"] - frame["phase"].map(base)
    frame["predicted_change"] = frame["predicted"] - frame["phase"].map(base)
    words = (f"R² {scores['r2_pooled']:.2f} (no fit, boundary excl.), r² {scores['corr2_pooled']:.2f} (fitted line), "
             + (f"{scores['n_identified']}/{scores['n_shifts']} shifts identified" if result.premise_holds
                else "PREMISE FAILS: not evidence"))
    return cycling_panels(frame, list(result.phase_accuracy().index), result.stride, words,
                          title or f"Gate cycling: {result.model_label}")


def interval_band(fig, x, lower, upper, color, row=None, col=None) -> None:
    """A shaded interval band (skipped where the interval is not known)."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    if not np.isfinite(lower).any():
        return
    kw = dict(row=row, col=col) if row else {}
    fig.add_trace(go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[upper, lower[::-1]], fill="toself", line=dict(width=0),
                             fillcolor=color, opacity=0.18, hoverinfo="skip", showlegend=False), **kw)


def cycling_panels(frame: pd.DataFrame, shifts, stride: int, scores: str, title: str, *,
                   percent: bool = False) -> go.Figure:
    """Gate cycling in two panels, one colour per shift d of ``shifts`` (0: unshifted). ``frame``: a row
    per shift and phase with the ``observed`` accuracy, the ``predicted`` A₀((r−d) mod S), their changes
    from A₀(r) (``observed_change``, ``predicted_change``) and, where known, an interval (``lower``,
    ``upper``); fractions, or % and pp with ``percent``. Left: accuracy per phase, observed (solid, its
    interval shaded) and predicted (dashed). Right, ``scores`` in its title: observed against predicted
    change (x: the boundary phase S−1), the dotted diagonal being the parameter-free prediction."""
    scale, pp = (100, " (pp)") if percent else (1, "")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "accuracy per phase<br>observed (solid), predicted (dashed)",
        "observed vs predicted change (x: boundary phase)<br>" + scores))
    for i, d in enumerate(shifts):
        sub = frame[frame["shift"] == d].sort_values("phase")
        color, name = PALETTE[i % len(PALETTE)], f"shift {d:+d}" if d else "unshifted"
        if {"lower", "upper"} <= set(sub):
            interval_band(fig, sub.phase.to_numpy(), sub.lower, sub.upper, color, 1, 1)
        if d:  # drawn before the observed line: the legend entry and the report's series style are the observed
            fig.add_trace(go.Scatter(x=sub.phase, y=sub.predicted, mode="lines", name=f"{name} predicted",
                                     legendgroup=name, showlegend=False, line=dict(color=color, dash="dash", width=1)),
                          row=1, col=1)
            for boundary, symbol in ((False, "circle"), (True, "x")):
                part = sub[(sub.phase == stride - 1) == boundary]
                fig.add_trace(go.Scatter(x=part.predicted_change, y=part.observed_change, mode="markers",
                                         marker=dict(color=color, symbol=symbol, size=8), legendgroup=name,
                                         showlegend=False, text=[f"{name}, phase {r}" for r in part.phase]),
                              row=1, col=2)
        fig.add_trace(go.Scatter(x=sub.phase, y=sub.observed, mode="lines+markers", name=name, legendgroup=name,
                                 line=dict(color=color, dash="solid", width=3 if d == 0 else 1.5)), row=1, col=1)
    changes = frame[frame["shift"] != 0]
    lim = float(np.nanmax(np.abs(np.r_[changes.observed_change, changes.predicted_change, 0.05 * scale]))) * 1.1
    fig.add_trace(go.Scatter(x=[-lim, lim], y=[-lim, lim], mode="lines", line=dict(dash="dot", color="grey"),
                             showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="phase", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="accuracy" + (" (%)" if percent else ""), range=[0, 1.02 * scale], row=1, col=1)
    fig.update_xaxes(title_text="predicted change A₀((r−d) mod S) − A₀(r)" + pp, row=1, col=2)
    fig.update_yaxes(title_text="observed change" + pp, row=1, col=2)
    style(fig, title, width=1100, height=480)
    fig.layout.margin.t += 25  # the panels' titles take two lines
    return fig


def unit_cycling_figure(result, title: str | None = None) -> go.Figure:
    """One panel per gate shift: the unit's contribution per phase ``C_d(r)`` (solid, with 95%
    bootstrap intervals) and the parameter-free prediction ``C_0((r - d) mod S)`` (dashed,
    open markers); the boundary phase is marked. Panel titles give R² (all S phases) and
    the best hypothesised shift (see `UnitCyclingResult.scores`)."""
    frame = result.profile_frame()
    ps = result.scores["per_shift"].set_index("shift")
    shifts = list(result.shifts)
    cols = min(4, len(shifts))
    rows = -(-len(shifts) // cols)
    titles = []
    for d in shifts:
        if d == 0:
            titles.append("unshifted: C₀")
        elif d in ps.index:
            titles.append(f"shift {d:+d}: R² {ps.loc[d, 'r2']:.2f}, best {int(ps.loc[d, 'best']):+d}"
                          + (" ✓" if ps.loc[d, "identified"] and result.premise_holds else ""))
        else:
            titles.append(f"shift {d:+d} (same as another mod S)")
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True)
    unit = "answer log-prob" if result.measure == "logprob" else "accuracy"
    for i, d in enumerate(shifts):
        row, col = i // cols + 1, i % cols + 1
        sub = frame[frame["shift"] == d]
        first = i == 0
        fig.add_trace(go.Scatter(x=sub.phase, y=sub.contribution, mode="lines+markers", name="observed C_d(r)",
                                 legendgroup="obs", showlegend=first, line=dict(color=PALETTE[0], width=2),
                                 error_y=error_bars(sub.contribution, sub.low, sub.high)),
                      row=row, col=col)
        if d != 0:
            fig.add_trace(go.Scatter(x=sub.phase, y=sub.predicted, mode="lines+markers", name="predicted C₀((r−d) mod S)",
                                     legendgroup="pred", showlegend=i == 1,
                                     line=dict(color=PALETTE[1], dash="dash", width=2),
                                     marker=dict(symbol="circle-open", size=9)), row=row, col=col)
        b = sub[sub.boundary]
        fig.add_trace(go.Scatter(x=b.phase, y=b.contribution, mode="markers", name="boundary phase",
                                 legendgroup="boundary", showlegend=first,
                                 marker=dict(symbol="x", size=11, color="#444")), row=row, col=col)
        fig.update_xaxes(dtick=1, title_text="phase" if row == rows else None, row=row, col=col)
    fig.update_yaxes(title_text=f"contribution ({unit})", col=1)
    name = title or f"Unit-level gate cycling: {result.model_label}, unit {result.unit} ({result.mode})"
    return style(fig, name, width=min(1100, 320 * cols + 120), height=300 * rows + 140)  # fits the report's page


def gate_profile_figure(profile, branch: str = "k", title: str | None = None) -> go.Figure:
    """Left: E[alpha] per slot for each (layer, KV head). Right: static vs per-window concentration.

    One legend per panel, one meaning each: the left legend names the (layer, KV head) lines,
    the right legend the branch (k or v) of each head's marker."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"E[alpha] per slot ({branch} branch)",
                                                        "concentration (effective number of slots)"))
    slots = profile.slots[profile.slots.branch == branch]
    for i, ((layer, kv), grp) in enumerate(slots.groupby(["layer", "kv_head"])):
        fig.add_trace(go.Scatter(x=grp.slot, y=grp.mean_alpha, mode="lines+markers", name=f"L{layer} KV{kv}",
                                 legend="legend", line=dict(color=PALETTE[i % len(PALETTE)])), row=1, col=1)
    fig.add_hline(y=1 / profile.window, line=dict(dash="dot", color="grey"), row=1, col=1)
    heads = profile.heads
    for j, (br, symbol) in enumerate((("k", "circle"), ("v", "diamond"))):
        sub = heads[heads.branch == br]
        if sub.empty:
            continue
        fig.add_trace(go.Scatter(
            x=sub.static_concentration, y=sub.window_concentration, mode="markers", name=f"{br} branch",
            legend="legend2", marker=dict(size=9, symbol=symbol, color=PALETTE[j]),
            text=[f"L{r.layer} KV{r.kv_head} {r.branch}" for r in sub.itertuples()],
        ), row=1, col=2)
    fig.add_trace(go.Scatter(x=[1, profile.window], y=[1, profile.window], mode="lines",
                             line=dict(dash="dash", color="grey"), showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="slot", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="E[alpha]", row=1, col=1)
    fig.update_xaxes(title_text="static exp(H(E[alpha]))", range=[0.9, profile.window + 0.1], row=1, col=2)
    fig.update_yaxes(title_text="per-window E[exp(H(alpha))]", range=[0.9, profile.window + 0.1], row=1, col=2)
    style(fig, title or f"Gate statistics: {profile.model_label}", width=1100, height=520)
    # Each legend sits under its own panel, so a reader never matches a colour across panels.
    fig.update_layout(
        margin=dict(b=130),
        legend=dict(title=dict(text="(layer, KV head)"), orientation="h", x=0.0, y=-0.2, xanchor="left",
                    yanchor="top"),
        legend2=dict(title=dict(text="branch"), orientation="h", x=0.55, y=-0.2, xanchor="left", yanchor="top",
                     bgcolor="rgba(255,255,255,0.7)"),
    )
    return fig


def training_curves(curves: pd.DataFrame, log: pd.DataFrame | None = None, stride: int | None = None,
                    title: str | None = None) -> go.Figure:
    """Held-out accuracy per phase over training (the boundary phase is learned last), and the
    loss when a training log is given."""
    with_loss = log is not None and not log.empty
    fig = make_subplots(rows=1, cols=2 if with_loss else 1,
                        subplot_titles=("held-out accuracy by phase", "training loss") if with_loss else None)
    if not curves.empty:
        by_phase = curves.groupby(["step", "phase"]).accuracy.mean().reset_index()
        n_phase = int(by_phase.phase.max()) + 1
        for phase, grp in by_phase.groupby("phase"):
            boundary = stride is not None and phase == stride - 1 or (stride is None and phase == n_phase - 1)
            fig.add_trace(go.Scatter(x=grp.step, y=grp.accuracy, mode="lines+markers",
                                     name=f"phase {phase}" + (" (boundary)" if boundary else ""),
                                     line=dict(color=PALETTE[int(phase) % len(PALETTE)], width=3 if boundary else 1.5,
                                               dash="dash" if boundary else "solid")), row=1, col=1)
    if with_loss:
        smooth = log.loss.rolling(20, min_periods=1).mean()
        fig.add_trace(go.Scatter(x=log.step, y=smooth, mode="lines", name="loss (20-step mean)",
                                 line=dict(color="#444")), row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=1, col=1)
    if with_loss:
        fig.update_xaxes(title_text="step", row=1, col=2)
        fig.update_yaxes(title_text="loss", row=1, col=2)
    return style(fig, title or "Phase-resolved learning curves", width=1100 if with_loss else 700, height=440)


def pretrain_curves(curves: pd.DataFrame, title: str | None = None) -> go.Figure:
    """A pretraining run's ``curves.csv`` against training tokens: the loss (left) and the held-out
    needle probe's mean accuracy and phase gap (best - worst phase; right)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("training loss", "needle probe"))
    smooth = curves.loss.rolling(20, min_periods=1).mean()
    fig.add_trace(go.Scatter(x=curves.tokens, y=smooth, mode="lines", name="loss (20-step mean)",
                             line=dict(color="#444")), row=1, col=1)
    probed = curves.dropna(subset=["probe_mean"]) if "probe_mean" in curves else curves.iloc[:0]
    for column, name, color in (("probe_mean", "mean accuracy", PALETTE[0]), ("probe_gap", "phase gap", PALETTE[1])):
        if column in probed:
            fig.add_trace(go.Scatter(x=probed.tokens, y=probed[column], mode="lines+markers", name=name,
                                     line=dict(color=color)), row=1, col=2)
    fig.update_xaxes(title_text="training tokens", row=1, col=1)
    fig.update_xaxes(title_text="training tokens", row=1, col=2)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=1, col=2)
    return style(fig, title or "Pretraining: loss and phase gap", width=1100, height=440)


def remedy_curves(phase_curves: pd.DataFrame, boundaries: dict, variants: tuple[str, ...]) -> go.Figure:
    """Held-out accuracy by phase during training (mean over seeds), one panel per variant of
    `phaseinterp.experiments.remedy`; each variant's boundary phases dotted."""
    pc = phase_curves.groupby(["variant", "step", "phase"]).accuracy.mean().reset_index()
    fig = make_subplots(rows=1, cols=len(variants), shared_yaxes=True, subplot_titles=variants)
    for col, variant in enumerate(variants, start=1):
        for phase, grp in pc[pc.variant == variant].groupby("phase"):
            name = f"phase {phase}" + (" (boundary)" if phase in boundaries[variant] else "")
            fig.add_trace(go.Scatter(x=grp.step, y=grp.accuracy, mode="lines", name=name,
                                     legendgroup=str(phase), showlegend=col == 1,
                                     line=dict(dash="dot" if phase in boundaries[variant] else "solid")),
                          row=1, col=col)
    fig.update_layout(title="held-out accuracy by phase during training (mean over seeds)")
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=1, col=1)
    return fig


def confirm_figure(result, title: str | None = None) -> go.Figure:
    """`ConfirmResult` at a glance. Left: change of accuracy (pp) per unit x phase under each
    ablation method (mean replacement, resample, norm-matched mean), * where significant after
    the multiplicity correction. Right: gate-nominated (unit, phase) claims on the held-out
    split, hit or miss, with the hit rate against chance."""
    tests = result.ablation_tests
    methods = list(dict.fromkeys(tests["method"]))
    fig = make_subplots(rows=1, cols=len(methods) + 1, horizontal_spacing=0.06,
                        subplot_titles=[f"{m} (pp)" for m in methods] + [
                            f"nominated heads: {result.n_hits}/{result.n_nominated} confirmed "
                            f"(chance {result.chance_rate:.0%}, p={result.nomination_p:.3g})"])
    bound = max(float(np.nanmax(np.abs(tests.change_pp.to_numpy(dtype=float)))) if len(tests) else 1.0, 1.0)
    for i, method in enumerate(methods):
        sub = tests[tests.method == method]
        grid = sub.pivot_table(index=["layer", "kv_head"], columns="phase", values="change_pp", aggfunc="first")
        sig = sub.pivot_table(index=["layer", "kv_head"], columns="phase", values="significant", aggfunc="first")
        labels = [f"L{layer} KV{kv}" for layer, kv in grid.index]
        fig.add_trace(go.Heatmap(z=grid.to_numpy(dtype=float), x=list(grid.columns), y=labels, zmin=-bound, zmax=bound,
                                 zmid=0, colorscale="RdBu", showscale=i == 0, colorbar=dict(title="Δ acc (pp)", x=-0.12),
                                 text=np.where(sig.to_numpy(dtype=bool), "*", ""), texttemplate="%{text}",
                                 hovertemplate="phase %{x}<br>%{y}<br>%{z:.1f} pp<extra>" + method + "</extra>"),
                      row=1, col=i + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=i == 0, row=1, col=i + 1)
        fig.update_xaxes(title_text="phase", dtick=1, row=1, col=i + 1)
    nom = result.nominations
    chosen = nom[nom.nominated] if len(nom) else nom
    if len(chosen):
        fig.add_trace(go.Scatter(
            x=chosen.preferred_phase, y=[f"L{r.layer} KV{r.kv_head}" for r in chosen.itertuples()], mode="markers",
            marker=dict(size=16, symbol=["circle" if h else "x" for h in chosen.hit],
                        color=["#2ca02c" if h else "#d62728" for h in chosen.hit]),
            text=[f"{r.change_pp:.1f} pp, adjusted p={r.p_adjusted:.2g}" for r in chosen.itertuples()],
            hovertemplate="%{y} nominated for phase %{x}<br>%{text}<extra></extra>", showlegend=False),
            row=1, col=len(methods) + 1)
    fig.update_xaxes(title_text="nominated phase", dtick=1, range=[-0.5, result.stride - 0.5], row=1,
                     col=len(methods) + 1)
    fig.update_yaxes(autorange="reversed", row=1, col=len(methods) + 1)
    return style(fig, title or f"Confirmatory tests: {result.model_label}", width=1250, height=440)
