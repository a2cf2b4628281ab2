"""The "beside the paper" section: the model's phase profile beside the published runs of its geometry
(`phaseinterp.paper.counterparts`, each set beside it by `phaseinterp.paper.compare`); without a run of
its geometry, beside the nearest ones, and without a common fold, each on its own phases, saying so."""

from __future__ import annotations

import html
from typing import Any, Optional

import numpy as np
import pandas as pd

from phaseinterp import paper
from phaseinterp._files import atomic_write_text
from phaseinterp.plot import profiles_figure
from phaseinterp.report.models import model_label
from phaseinterp.report.page import table_html
from phaseinterp.report.section import ReportContext, Section

# published evaluation the model is compared with: the paper's headline (and the only one of the baselines)
PADDING = "prefix"


class BesideThePaper(Section):
    """The report's phase profile beside the published runs of the model's geometry (no new forward)."""

    name = "beside the paper"
    inputs = ("phase profiles",)

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        cfg = ctx.model.cfg
        if not all(hasattr(cfg, attr) for attr in ("stride", "n_kv_heads", "is_compressed")):
            return "the model's config names no stride and KV heads to match with the paper's runs"
        return None

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        return beside_paper(ctx.results["phase profiles"][0], ctx.model.cfg, model_label(ctx.model))

    def render(self, ctx: ReportContext, result: dict[str, Any]) -> None:
        considered = result["candidates"].assign(picked=lambda c: c.id.isin(result["runs"].id),
                                                 drawn=lambda c: c.id.isin(result["drawn"]))
        atomic_write_text(ctx.out / "data" / "paper_runs.csv", considered.to_csv(index=False))
        atomic_write_text(ctx.out / "data" / "paper_comparison.csv", result["table"].to_csv(index=False))
        atomic_write_text(ctx.out / "data" / "paper_comparison_phases.csv", result["detail"].to_csv(index=False))
        ctx.summary["paper"] = {
            "geometry": result["geometry"], "match": result["match"], "statement": result["statement"],
            "padding": PADDING, "runs": list(result["runs"].id), "drawn": result["drawn"],
            "nearest": result["nearest"], "comparisons": [c.to_dict() for c in result["comparisons"]]}
        ctx.figures["paper"] = result["figure"]
        ctx.tables["paper"] = _html(result)


def _geometry(cfg) -> str:
    kv = int(cfg.n_kv_heads)
    heads = f"{kv} KV head{'s' if kv != 1 else ''}"
    if not cfg.is_compressed:
        return f"full attention, {heads}"
    return f"W{getattr(cfg, 'window', '?')}/S{cfg.stride}, {heads}"


def _pick(candidates: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """``(match, runs)``: the runs of the model's geometry ("same geometry"); else the nearest that share a
    fold with the profile ("nearest"), or the nearest of those that do ("nearest with a common fold");
    else the nearest, shown on their own phases ("no common fold")."""
    same = candidates[candidates.same_geometry]
    if len(same):
        return "same geometry", same
    foldable = candidates[candidates.common_fold.notna()]
    nearest = foldable[foldable["rank"] == 0]
    if len(nearest):
        return "nearest", nearest
    if len(foldable):
        return "nearest with a common fold", foldable[foldable["rank"] == foldable["rank"].min()]
    return "no common fold", candidates[candidates["rank"] == 0]


def _names(runs: pd.DataFrame) -> str:
    return "; ".join(f"{r.id} ({r.geometry}{'' if r.plain else ', ' + r.variant})" for r in runs.itertuples())


def beside_paper(profile, cfg, label: Optional[str] = None) -> dict[str, Any]:
    """``profile`` (a measured `PhaseProfile` of a model of config ``cfg``) beside the published runs that
    `_pick` chooses: the comparisons (`phaseinterp.paper.compare`), one table row per model and fold,
    the phase detail, the figure and the statement the page prints above the table."""
    label = label or profile.label
    candidates = paper.counterparts(cfg, residues=profile.modulus, stride=profile.stride)
    match, runs = _pick(candidates)
    nearest = candidates[candidates["rank"] == 0]
    drawn_runs = runs[runs.plain] if runs.plain.any() else runs
    geometry = _geometry(cfg)
    comparisons = [] if match == "no common fold" else [paper.compare(profile, run, PADDING) for run in runs.id]
    rows, detail, seen = [], [], set()
    for run, c in zip(runs.itertuples(), comparisons):
        mine, theirs = c.to_frame().iloc[0].to_dict(), c.to_frame().iloc[1].to_dict()
        if (c.modulus, c.fold) not in seen:
            seen.add((c.modulus, c.fold))
            rows.append(dict(mine, paper_run="", geometry=geometry, variant="this model", compared_on=_on(c)))
        rows.append(dict(theirs, paper_run=run.id, geometry=run.geometry, variant=run.variant, compared_on=_on(c)))
        detail.append(c.detail.assign(paper_run=run.id))
    if match == "no common fold":  # each profile's own numbers on its own residues and phases
        rows = [_own_row(profile, "", geometry, "this model")] + [
            _own_row(paper.profile(r.id, PADDING), r.id, r.geometry, r.variant) for r in runs.itertuples()]
    table = pd.DataFrame(rows)
    figure = _figure(profile, label, runs, drawn_runs, comparisons, match)
    return dict(geometry=geometry, match=match, candidates=candidates, runs=runs, drawn=list(drawn_runs.id), nearest=list(nearest.id),
                comparisons=comparisons, table=table,
                detail=pd.concat(detail, ignore_index=True) if detail else pd.DataFrame(),
                figure=figure, statement=_statement(label, geometry, match, runs, drawn_runs, nearest, profile),
                notes=list(dict.fromkeys(n for c in comparisons for n in c.notes)))


def _on(comparison) -> str:
    return f"{comparison.modulus} residues, {comparison.fold} phases"


def _own_row(p, run: str, geometry: str, variant: str) -> dict:
    worst = int(p.worst_phases[0])
    return dict(model=p.label, source="published" if p.published else "measured", stride=p.stride,
                residues=p.modulus, mean_pct=100 * p.mean, worst_phase=worst,
                worst_phase_pct=100 * float(p.phase_accuracy[worst]), phase_gap_pp=100 * p.phase_gap,
                gap_pp=100 * p.gap, period=p.period if p.period is not None else np.nan, paper_run=run,
                geometry=geometry, variant=variant, compared_on=f"own: {p.modulus} residues, {p.stride} phases")


def _figure(profile, label: str, runs: pd.DataFrame, drawn: pd.DataFrame, comparisons: list, match: str):
    folds = {(c.modulus, c.fold) for c in comparisons}
    by_run = dict(zip(runs.id, comparisons))
    if len(folds) == 1:
        (modulus, fold), = folds
        first = comparisons[0]
        shown = [first.profiles[0]] + [by_run[r].profiles[1] for r in drawn.id]
        title = (f"{label} beside the paper's runs ({PADDING} padding): {modulus} residues, {fold} phases")
    else:  # no fold, or several: each profile on its own residues and phases
        shown = [profile] + [paper.profile(r, PADDING) for r in drawn.id]
        title = f"{label} beside the paper's nearest runs, each on its own phases"
    if match != "same geometry":
        title += " (not the same geometry)"
    return profiles_figure(shown, title=title)


def _statement(label, geometry, match, runs, drawn, nearest, profile) -> str:
    more = len(runs) - len(drawn)
    drawn_words = (f"The figure draws the model beside {', '.join(drawn.id)}"
                   + (f"; the table also lists the {more} variant run{'s' if more != 1 else ''} of this geometry "
                      "(a change beyond W, S and KV heads)." if more else "."))
    same_stat = ("Each published run is set beside the model in the same statistic (phaseinterp.paper.compare, "
                 f"the paper's {PADDING}-padding evaluation): both profiles are averaged to their common residues "
                 "and folded to the least common multiple of the two strides, so no model's phases are mixed.")
    caveat = ("The paper's runs are 28-layer models of the Qwen3-0.6B shape trained by the paper's authors; "
              f"{label} is measured here on this report's prompts: the same statistic, not the same models.")
    if match == "same geometry":
        head = f"The paper published {len(runs)} run{'s' if len(runs) != 1 else ''} with this model's geometry " \
               f"({geometry}): {', '.join(runs.id)}."
        return " ".join((head, same_stat, drawn_words, caveat))
    head = f"No published run has this model's geometry ({geometry}). The nearest: {_names(nearest)}."
    if match == "nearest":
        return " ".join((head, "The model is set beside them instead; read the difference in geometry first.",
                         same_stat, drawn_words, caveat))
    if match == "nearest with a common fold":
        return " ".join((head, f"None of them shares a fold with this profile ({profile.modulus} residues, stride "
                               f"{profile.stride}: the least common multiple of the strides must divide the common "
                               f"residues); the nearest that do: {_names(runs)}.", same_stat, drawn_words, caveat))
    return " ".join((head, f"No published run shares a fold with this profile ({profile.modulus} residues, stride "
                           f"{profile.stride}: the least common multiple of the strides must divide the common "
                           "residues), so phaseinterp.paper.compare cannot set them in the same statistic. The "
                           "figure and the table show each profile on its own residues and phases: read them side "
                           "by side, not as one statistic.", caveat))


def _known(*values) -> bool:
    return all(v is not None and v == v for v in values)


def _html(result: dict[str, Any]) -> str:
    """The statement, one row per model (accuracies as fractions, gaps in pp, published 95% intervals in
    brackets where the comparison is on the published residues) and the comparisons' notes."""
    rows = []
    for r in result["table"].to_dict(orient="records"):
        name = f"{r['paper_run']}: {r['model']}" if r["paper_run"] else r["model"]
        lower, upper = r.get("mean_pct_lower"), r.get("mean_pct_upper")
        mean = f"{r['mean_pct'] / 100:.3f}" + (f" [{lower / 100:.3f}, {upper / 100:.3f}]" if _known(lower, upper) else "")
        lower, upper = r.get("gap_pp_lower"), r.get("gap_pp_upper")
        gap = f"{r['gap_pp']:.1f} pp" + (f" [{lower:.1f}, {upper:.1f}]" if _known(lower, upper) else "")
        period = str(int(r["period"])) if _known(r["period"]) else "none"
        rows.append((html.escape(name), r["source"], html.escape(r["geometry"]), html.escape(r["variant"]),
                     html.escape(r["compared_on"]), mean, f"{r['worst_phase']} ({r['worst_phase_pct'] / 100:.3f})",
                     f"{r['phase_gap_pp']:.1f} pp", gap, period))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result["notes"])
    return (f"<p>{html.escape(result['statement'])}</p>"
            + table_html(("model", "source", "geometry", "variant", "compared on", "mean", "worst phase", "phase gap",
                          "residue gap", "period"), rows, left=(0, 1, 2, 3))
            + (f"<ul>{notes}</ul>" if notes else "")
            + "<p>Every number is in <code>data/paper_comparison.csv</code> (one row per model and fold) and "
              "<code>data/paper_comparison_phases.csv</code> (per phase); every published run considered, nearest "
              "geometry first, with the ones picked, in <code>data/paper_runs.csv</code>.</p>")


__all__ = ["BesideThePaper", "beside_paper"]
