"""The phase profile sections: the model (and its full-attention twin) on the report's prompts, and the
equal-training controls of a zoo model (its compressed/twin pairs at the same training step)."""

from __future__ import annotations

import html
from typing import Any, Optional

from phaseinterp import zoo
from phaseinterp._files import atomic_write_text
from phaseinterp.plot import profiles_figure
from phaseinterp.profile import phase_profile
from phaseinterp.report.models import as_model, data_name, model_label
from phaseinterp.report.page import table_html
from phaseinterp.report.section import ReportContext, Section, write_profile_csvs


class PhaseProfiles(Section):
    """Accuracy by phase of the model and its twin (folded by the model's stride), on one prompt set."""

    name = "phase profiles"

    def compute(self, ctx: ReportContext) -> list:
        model, task, settings = ctx.model, ctx.task, ctx.settings
        ctx.log(f"[1/4] phase profile: {settings.n_per_residue} prompts x {task.residue_modulus} residues")
        prompts = ctx.prompts.get(task, settings.n_per_residue)
        profiles = [phase_profile(model, prompts, label=model_label(model), progress=ctx.progress)]
        if ctx.twin is not None:
            profiles.append(phase_profile(ctx.twin, prompts, stride=model.cfg.stride, label=model_label(ctx.twin),
                                          progress=ctx.progress))
        return profiles

    def render(self, ctx: ReportContext, profiles: list) -> None:
        models = [ctx.model] + ([ctx.twin] if ctx.twin is not None else [])
        for p, m in zip(profiles, models):
            write_profile_csvs(ctx.out, data_name(m), p)
        ctx.summary["profiles"] = [p.to_dict() for p in profiles]
        ctx.figures["phase_profile"] = profiles_figure(profiles)


class TrainingControls(Section):
    """The zoo run's equal-step and final-step pairs (`zoo.training_controls`), profiled on the same prompts
    (reusing the profiles already measured); their profiles join the phase-profile figure."""

    name = "training controls"
    inputs = ("phase profiles",)

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        pairs = zoo.training_controls(getattr(ctx.model, "metadata", {}).get("zoo_name", ""))
        if not pairs or not all(n in zoo.available() for pair in pairs.values() for n in pair):
            return ""  # not a zoo model with controls: nothing to say
        return None

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        """One row per pair; the profiles of the pairs' models not measured yet, with their `data_name`s."""
        by_name = {m.metadata["zoo_name"]: p for m, p in zip((ctx.model, ctx.twin), ctx.results["phase profiles"])
                   if getattr(m, "metadata", {}).get("zoo_name")}
        rows, profiles, names = [], [], []
        for kind, pair in zoo.training_controls(ctx.model.metadata["zoo_name"]).items():
            row: dict[str, Any] = {"pair": kind}
            for role, name in zip(("compressed", "twin"), pair):
                if name not in by_name:
                    m = as_model(name, ctx.device)
                    by_name[name] = phase_profile(m, ctx.prompts.get(ctx.task, ctx.settings.n_per_residue),
                                                  stride=ctx.model.cfg.stride, progress=ctx.progress,
                                                  label=f"{name} (step {m.metadata.get('step')})")
                    profiles.append(by_name[name])
                    names.append(data_name(m))
                p = by_name[name]
                row.update({role: name, f"{role}_step": zoo.snapshot_step(name), f"{role}_mean": p.mean,
                            f"{role}_worst_phase_accuracy": float(min(p.phase_accuracy)),
                            f"{role}_phase_gap": p.phase_gap, f"{role}_period": p.period})
            rows.append(row)
        return {"rows": rows, "profiles": profiles, "names": names,
                "all": list(ctx.results["phase profiles"]) + profiles}

    def render(self, ctx: ReportContext, result: dict[str, Any]) -> None:
        for p, name in zip(result["profiles"], result["names"]):
            write_profile_csvs(ctx.out, name, p)
        ctx.summary["profiles"] += [p.to_dict() for p in result["profiles"]]
        ctx.figures["phase_profile"] = profiles_figure(result["all"])
        ctx.summary["training_controls"] = result["rows"]
        ctx.tables["phase_profile"] = _controls_html(result["rows"])


def _controls_html(rows: list[dict]) -> str:
    def pct(v):
        return f"{100 * v:.1f}%"

    return ("<h3>Equal-training controls</h3><p>The compressed model and its full-attention twin at the SAME "
            "training step: the step at which both have first learned the task (held-out probe mean >= 60%, "
            "computed from the training curves by <code>phaseinterp.zoo.equal_training_step</code>), and the "
            "final step.</p>" + table_html(
                ("pair", "step", "compressed", "mean", "worst phase", "twin", "mean", "worst phase", "twin phase gap"),
                [(html.escape(r["pair"]), r["compressed_step"], html.escape(r["compressed"]), pct(r["compressed_mean"]),
                  pct(r["compressed_worst_phase_accuracy"]), html.escape(r["twin"]), pct(r["twin_mean"]),
                  pct(r["twin_worst_phase_accuracy"]), f"{100 * r['twin_phase_gap']:.1f} pp") for r in rows],
                left=(0, 2, 5)))


class PromptLength(Section):
    """The model's accuracy by target phase x prompt-length phase (``phase_profile(axis="both")``): a
    weak spot of the model follows the target (rows), a length-keyed implementation bug follows the
    prompt's length (columns)."""

    name = "prompt length"

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        if getattr(ctx.model.cfg, "stride", None) is None or not hasattr(ctx.task, "length_padding"):
            return "the task has no prompt-length axis"
        return None

    def compute(self, ctx: ReportContext) -> Any:
        n = ctx.settings.n_per_residue
        ctx.log(f"prompt-length axis: {n} prompts x {ctx.task.residue_modulus} residues x {ctx.model.cfg.stride} lengths")
        return phase_profile(ctx.model, ctx.task, n_per_residue=n, axis="both", label=model_label(ctx.model),
                             progress=ctx.progress)

    def render(self, ctx: ReportContext, result: Any) -> None:
        atomic_write_text(ctx.out / "data" / f"prompt_length_{data_name(ctx.model)}.csv", result.table().to_csv())
        ctx.summary["prompt_length"] = result.to_dict()
        ctx.figures["prompt_length"] = result.plot()
        ctx.tables["prompt_length"] = table_html(
            ("axis", "phase gap", "period", "homogeneity p"),
            [(axis, f"{100 * p.phase_gap:.1f} pp", p.period_verdict, f"{p.homogeneity_p_value:.3g}")
             for axis, p in (("target phase", result.target), ("prompt-length phase", result.length))])
