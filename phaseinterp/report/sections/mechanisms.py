"""The mechanism sections of an own-family compressed model: per-KV-head mean replacement, gate
cycling (every layer's gates shifted, then one unit at a time), and gate statistics."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

from phaseinterp import zoo
from phaseinterp._files import atomic_write_text
from phaseinterp.interventions import (ablate, cycling_fitness, gate_cycling_profile, gate_cycling_unit, gate_profile,
                                       specialized_units)
from phaseinterp.report.models import as_model, model_label
from phaseinterp.report.page import fmt, frame_html
from phaseinterp.report.section import PromptSets, ReportContext, Section
from phaseinterp.tasks import resolve_task


def _not_compressed(ctx: ReportContext) -> Optional[str]:
    return None if ctx.model.cfg.is_compressed else ""  # a full-attention model: nothing to say


class MeanReplacement(Section):
    """Each KV head (every layer) replaced by its calibration mean, accuracy change per phase."""

    name = "mean replacement"
    skip_reason = staticmethod(_not_compressed)

    def compute(self, ctx: ReportContext):
        s = ctx.settings
        ctx.log(f"[2/4] per-KV-head mean replacement: every layer, {s.ablation_per_residue} prompts per residue")
        return ablate(ctx.model, ctx.task, n_calibration=s.n_calibration, progress=ctx.progress,
                      prompts=ctx.prompts.get(ctx.task, s.ablation_per_residue))

    def render(self, ctx: ReportContext, abl) -> None:
        spec = abl.specialization()
        atomic_write_text(ctx.out / "data" / "ablation.csv", abl.to_frame().to_csv(index=False))
        atomic_write_text(ctx.out / "data" / "ablation_specialization.csv", spec.to_csv(index=False))
        ctx.summary["ablation"] = abl.to_dict()
        ctx.figures["ablation_heatmap"] = abl.plot()
        ctx.tables["ablation_heatmap"] = abl.summary().to_html(border=0)
        ctx.tables["ablation_heatmap"] += frame_html(spec, "Specialization per unit (relative change, %)")


class GateCycling(Section):
    """Every layer's gates shifted by d slots, scored against the unshifted profile moved by d.

    Gate cycling runs on a model fit for it (W = S gates, payload shared across slots): with a
    payload map per slot a shifted gate reads maps never trained for its slot (a collapse, not a
    test). A zoo model that is not fit is replaced by the shipped shared-payload model of its
    stride; any other model runs it as a negative control, labelled as such."""

    name = "gate cycling"
    skip_reason = staticmethod(_not_compressed)

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        model, task, settings = ctx.model, ctx.task, ctx.settings
        fit, why = cycling_fitness(model)
        cyc_model, cyc_name, cyc_task, cyc_reason, negative = model, model_label(model), task, why, not fit
        if not fit:
            cyc_reason = f"NEGATIVE CONTROL: {why}"
            zoo_name = getattr(model, "metadata", {}).get("zoo_name")
            substitute = zoo.cycling_model_for(model.cfg.stride) if zoo_name and model.cfg.is_compressed else None
            if substitute is not None:
                cyc_model, cyc_name, negative = as_model(substitute, ctx.device), substitute, False
                cyc_task = resolve_task(cyc_model)
                cyc_reason = (f"{model_label(model)} is not fit for gate cycling ({why}); the experiment runs on "
                              f"{substitute}, the shipped W = S = {model.cfg.stride} model whose payload is shared "
                              f"across slots, as DeepSeek's kv_proj")
        ctx.log(f"[3/4] gate cycling on {cyc_name}: shifts "
                f"{list(settings.shifts) if settings.shifts else 'every distinct shift mod S'}")
        result = {"model": cyc_model, "name": cyc_name, "task": cyc_task, "reason": cyc_reason,
                  "negative": negative, "cycling": None, "error": None}
        try:
            result["cycling"] = gate_cycling_profile(cyc_model, cyc_task, settings.shifts, progress=ctx.progress,
                                                     n_boot=200,
                                             prompts=ctx.prompts.get(cyc_task, settings.cycling_per_residue))
        except ValueError as err:
            result["error"] = str(err)
        return result

    def render(self, ctx: ReportContext, result: dict[str, Any]) -> None:
        cyc, name, reason, negative = result["cycling"], result["name"], result["reason"], result["negative"]
        if cyc is None:
            ctx.summary["cycling_skipped"] = result["error"]
            ctx.log(f"      skipped: {result['error']}")
            return
        atomic_write_text(ctx.out / "data" / "cycling.csv", cyc.to_frame().to_csv(index=False))
        atomic_write_text(ctx.out / "data" / "cycling_scores.csv", cyc.scores["per_shift"].to_csv(index=False))
        ctx.summary["cycling"] = cyc.to_dict() | {"model_used": name, "why_this_model": reason,
                                                  "negative_control": negative}
        ctx.figures["gate_cycling"] = cyc.plot(title=f"Gate cycling: {name}" + (" (NEGATIVE CONTROL)" if negative
                                                                                  else ""))
        ctx.tables["gate_cycling"] = _cycling_html(cyc, name, reason, negative) + cyc.summary().to_html(border=0)


class UnitCycling(Section):
    """One unit's gates shifted alone, its own contribution scored (on the gate-cycling model; the
    units are picked by `specialized_units`' rule)."""

    name = "unit-level gate cycling"
    inputs = ("gate cycling",)

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        cyc = ctx.results["gate cycling"]
        return None if cyc["cycling"] is not None and not cyc["negative"] else ""

    def compute(self, ctx: ReportContext) -> dict:
        cyc = ctx.results["gate cycling"]
        ctx.log(f"      unit-level gate cycling on {cyc['name']}: units picked by specialized_units' rule")
        ablation = ctx.results.get("mean replacement") if cyc["model"] is ctx.model else None
        return _unit_cycling(cyc["model"], cyc["task"], ablation, ctx.settings, ctx.progress, ctx.out, ctx.prompts)

    def render(self, ctx: ReportContext, unit: dict) -> None:
        ctx.summary["unit_cycling"] = unit["summary"]
        ctx.tables["unit_cycling"] = unit["html"]
        if unit["figure"] is not None:
            ctx.figures["unit_cycling"] = unit["figure"]


class GateStatistics(Section):
    """Which slot each gate weights most and how peaked it is; aligned with the knockout map."""

    name = "gate statistics"
    inputs = ("mean replacement",)

    def compute(self, ctx: ReportContext):
        ctx.log("[4/4] gate statistics")
        return gate_profile(ctx.model, ctx.task, n_per_residue=ctx.settings.gate_per_residue)

    def render(self, ctx: ReportContext, gp) -> None:
        out = ctx.out
        atomic_write_text(out / "data" / "gate_slots.csv", gp.slots.to_csv(index=False))
        atomic_write_text(out / "data" / "gate_heads.csv", gp.heads.to_csv(index=False))
        align = gp.alignment(ctx.results["mean replacement"])
        atomic_write_text(out / "data" / "gate_alignment.csv", align.to_csv(index=False))
        ctx.summary["gates"] = {"heads": gp.heads.to_dict(orient="records"),
                                "alignment_mean_correlation": float(align.correlation.mean()) if len(align) else None}
        ctx.figures["gate_profile"] = gp.plot()
        ctx.tables["gate_profile"] = frame_html(gp.heads, "Per head and branch")


UNIT_SCORE_SEED = 1  # held-out prompts of the unit-level score (the report's ablation used seed 0)


def _unit_cycling(model, task, ablation, settings, progress, out: Path, prompts: PromptSets) -> dict:
    """Unit-level gate cycling for the report: `specialized_units` picks units by its rule (on the
    report's own ablation, seed 0, when it is of this model; else on its selection split, seed
    1000), then the first specialized unit and the negative control are each cycled alone and
    scored on held-out prompts (seed 1) against C_0((r - d) mod S)."""
    selection = (specialized_units(model, task, ablation=ablation, progress=progress) if ablation is not None else
                 specialized_units(model, task, n_per_residue=settings.ablation_per_residue,
                                   n_calibration=settings.n_calibration, progress=progress))
    atomic_write_text(out / "data" / "unit_selection.csv", selection.table.to_csv(index=False))
    picked = selection.units("specialized")[:1] + selection.units("control")
    where = "the report's mean-replacement run (seed 0)" if ablation is not None else \
        f"a selection split (seed {selection.selection_seed})"
    parts = [f"<p><b>Which unit.</b> Picked by a rule fixed in code (<code>phaseinterp.specialized_units</code>) on "
             f"{html.escape(where)}: {html.escape(selection.rule)}. Each picked unit's gates are shifted alone and "
             f"its own contribution per phase, C<sub>d</sub>(r) = m(shifted) &minus; m(shifted, unit mean-replaced) "
             f"(m = mean answer log-prob), is scored on held-out prompts (seed {UNIT_SCORE_SEED}) against "
             f"C<sub>0</sub>((r&minus;d) mod S). This is the right score when one unit of many is shifted; the "
             f"whole-profile score above shifts every layer at once.</p>"]
    summary: dict[str, Any] = {"rule": selection.rule, "selection": selection.to_dict(), "units": []}
    figure = None
    if not selection.units("specialized"):
        parts.append("<p class='note'>No unit passes the rule on this model: no knockout hurts 1..3 adjacent "
                     "phases (not all of them) and nowhere else (see unit_selection.csv).</p>")
    for u in picked:
        r = gate_cycling_unit(model, task, settings.shifts, layers=u["layers"], kv_heads=u["kv_heads"],
                         seed=UNIT_SCORE_SEED, n_calibration=settings.n_calibration, n_boot=200, progress=progress,
                         prompts=prompts.get(task, settings.ablation_per_residue, UNIT_SCORE_SEED))
        atomic_write_text(out / "data" / f"unit_cycling_{u['label']}.csv", r.profile_frame().to_csv(index=False))
        s, d = r.scores, r.to_dict()
        summary["units"].append({"unit": u["label"], "role": u["role"], "hurt_phases": u["hurt_phases"]} | d)
        if figure is None and u["role"] == "specialized":
            figure = r.plot(title=f"Unit-level gate cycling: {u['label']} (knockout hurts phases {u['hurt_phases']})")
        low, high = d["r2_pooled_ci"]
        role = ("specialized unit" if u["role"] == "specialized" else
                "negative control (its knockout hurts no phase: it must not be identified)")
        parts.append(
            f"<p><b>{html.escape(u['label'])}</b>, {role}; knockout hurts phases {u['hurt_phases'] or 'none'}. "
            f"Shift identified (the applied shift is strictly the best of the {r.stride} hypotheses) for "
            f"<b>{s['n_identified']} of {s['n_shifts']}</b> shifts; exact joint p = {s['identification_p']:.2g} "
            f"(chance per shift about 1/{r.stride}). Parameter-free R² over all {r.stride} phases, pooled: "
            f"{s['r2_pooled']:.2f} [{low:.2f}, {high:.2f}] (negative when the shifted contribution has the right "
            f"place but not the size of the unshifted one).</p>")
        if not r.premise_holds:
            parts.append(_premise_html(r))
        parts.append(_movement_html(r, "the unit's contribution peak"))
        parts.append(r.identification().to_html(border=0, float_format=fmt))
    return {"summary": summary, "html": "".join(parts), "figure": figure}


def _movement_html(result, what: str) -> str:
    """The movement R² (docs/science.md, "Movement R²") in words, beside the strict R² and identification."""
    s = result.scores
    if s["n_shifts"] < 2:
        return (f"<p><b>Movement R²</b> (did {what} move by the applied shift?): not defined with "
                f"{s['n_shifts']} shift distinct mod S (one point).</p>")
    m = result.movement()
    low, high = m["movement_r2_ci"]
    moves = ", ".join(f"{r.shift:+d} &rarr; {r.displacement:+d} [{r.low:+d}, {r.high:+d}]"
                      for r in m["per_shift"].itertuples())
    return (f"<p><b>Movement R²</b> (the paper's figure: did {what} move by the applied shift?): "
            f"<b>{m['movement_r2']:.2f}</b> [{low:.2f}, {high:.2f}] over {m['n_points']} shifts (1 &minus; "
            f"&Sigma;(&delta; &minus; d)&sup2; / &Sigma;(&delta; &minus; mean &delta;)&sup2;; &minus;inf when &delta; "
            f"never changes); squared correlation {m['movement_corr2']:.2f}. Applied &rarr; measured displacement "
            f"&delta; (the best of the {result.stride} hypotheses, in (&minus;S/2, S/2], no unwrapping toward the "
            f"applied shift) [95% bootstrap interval]: {moves}. It asks only where the spot went; the strict R² asks "
            f"whether the whole profile is the rolled clean one, identification whether the applied shift is the "
            f"best hypothesis.</p>")


def _premise_html(result) -> str:
    """A result's failed premises (`Result.premise_notes`) as a note: its scores are no evidence."""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in result.premise_notes)
    return f"<p class='note'>Premise fails: these scores are not evidence for the prediction.</p><ul>{items}</ul>"


def _cycling_html(cyc, name: str, reason: str, negative: bool = False) -> str:
    """Which model gate cycling ran on and why, and its scores in words (the numbers the figure shows)."""
    s = cyc.scores
    ps = s["per_shift"]
    per = "; ".join(f"shift {int(r.shift):+d}: R² {r.r2:.2f}, r² {r.corr2:.2f}, best hypothesis "
                    f"{int(r.displacement):+d}{' (identified)' if r.identified else ' (NOT identified)'}"
                    for r in ps.itertuples())
    text = (f"<p><b>Model: {html.escape(name)}.</b> {html.escape(reason)}.</p>"
            f"<p>Prediction A<sub>d</sub>(r) = A<sub>0</sub>((r&minus;d) mod S), scored on the per-phase accuracy "
            f"changes of the {cyc.stride - 1} non-boundary phases per shift (distinct shifts mod S only). "
            f"Headline R² = 1 &minus; SS<sub>res</sub>/SS<sub>tot</sub> of the parameter-free prediction, pooled "
            f"over {len(ps) * (cyc.stride - 1)} points: <b>{s['r2_pooled']:.2f}</b>; squared correlation with a "
            f"fitted line: {s['corr2_pooled']:.2f}. {html.escape(per)}. Shift identification: "
            f"{s['n_identified']} of {s['n_shifts']} applied shifts are the best of the {cyc.stride} hypotheses; "
            f"joint permutation p = {s['identification_p']:.3g}.</p>" + _movement_html(cyc, "the weak spot"))
    if negative:
        text += ("<p class='note'>Negative control: this model is not fit for the experiment (see above); its "
                 "scores measure the collapse of every phase, not the paper's prediction.</p>")
    elif not cyc.premise_holds:
        text += _premise_html(cyc)
    elif s["r2_pooled"] != s["r2_pooled"] or s["r2_pooled"] < 0.5 or s["n_identified"] < s["n_shifts"]:
        text += ("<p class='note'>The whole-profile prediction fails on this model. It shifts every layer's gates "
                 "at once, which can break units that serve every phase; whether a single unit's phase moves with "
                 "its gates is the unit-level score below.</p>")
    return text + cyc.identification().to_html(border=0, float_format=fmt)
