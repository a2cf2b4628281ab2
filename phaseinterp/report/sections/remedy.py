"""The remedy report section: a staggered-window zoo model (``w4s4-staggered``) beside its shared-grid twin
(``zoo.entry(name).baseline``): both phase profiles, each KV head's boundary phase per layer, and the
measured KV-cache memory per token of both."""

from __future__ import annotations

import html
from types import SimpleNamespace
from typing import Any, Optional

import pandas as pd

from phaseinterp import zoo
from phaseinterp._files import atomic_write_text
from phaseinterp.errors import UserInputError
from phaseinterp.experiments.remedy import memory_per_token
from phaseinterp.plot import profiles_figure
from phaseinterp.profile import phase_profile
from phaseinterp.report.models import data_name
from phaseinterp.report.section import ReportContext, Section, write_profile_csvs
from phaseinterp.tasks import resolve_task


def check_remedy(name: str) -> tuple[str, str]:
    """``(staggered, baseline)`` zoo names for a shipped staggered model, or ValueError naming the choices."""
    shipped = set(zoo.available())
    pairs = {n: e.baseline for n, e in zoo.ENTRIES.items() if e.baseline is not None}
    if name not in pairs:
        raise UserInputError(f"remedy={name!r} is not a staggered-window zoo model (known: {', '.join(sorted(pairs))})")
    missing = [n for n in (name, pairs[name]) if n not in shipped]
    if missing:
        raise UserInputError(f"remedy={name!r} needs the shipped zoo models {', '.join(missing)} "
                         f"(build with `phaseinterp zoo build NAME`)")
    return name, pairs[name]


def _heads(model) -> pd.DataFrame:
    rows = []
    for layer in range(model.cfg.n_layers):
        for head, (offset, boundary) in enumerate(zip(model.window_offsets(layer), model.boundary_phases(layer))):
            rows.append({"layer": layer, "kv_head": head, "window_offset": int(offset), "boundary_phase": int(boundary)})
    return pd.DataFrame(rows)


class Remedy(Section):
    """The remedy pair's phase profiles, boundary phases and KV memory."""

    name = "remedy"

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        return None if ctx.remedy is not None else ""

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        """Both models' profiles (on the report's shared prompt sets), KV memory and boundary phases, baseline
        first; the report's own profile is reused when it is the same zoo model on its stored task."""
        staggered_name, baseline_name = check_remedy(ctx.remedy)
        zoo_name = getattr(ctx.model, "metadata", {}).get("zoo_name")
        measured = ctx.results.get("phase profiles")
        reuse = {zoo_name: measured[0]} if zoo_name and ctx.own_task and measured else {}
        rows, profiles, heads = [], [], []
        for role, name in (("baseline", baseline_name), ("staggered", staggered_name)):
            model = zoo.load(name, device=ctx.device)
            task = resolve_task(model)
            if name in reuse:
                profile = reuse[name]
            else:
                ctx.log(f"[remedy] {name}: phase profile, {ctx.settings.n_per_residue} prompts x "
                        f"{task.residue_modulus} residues")
                profile = phase_profile(model, ctx.prompts.get(task, ctx.settings.n_per_residue),
                                        label=f"{name} ({role})", progress=ctx.progress)
            profiles.append(profile)
            memory = memory_per_token(model)
            boundaries = sorted({int(b) for layer in range(model.cfg.n_layers) for b in model.boundary_phases(layer)})
            heads.append(_heads(model).assign(model=name))
            rows.append({"role": role, "model": name, "step": model.metadata.get("step"), "mean": profile.mean,
                         "worst_phase": int(profile.worst_phases[0]) if len(profile.worst_phases) else None,
                         "worst_phase_accuracy": float(min(profile.phase_accuracy)), "phase_gap": profile.phase_gap,
                         "period": profile.period, "boundary_phases": boundaries,
                         "boundary_accuracy": [float(profile.phase_accuracy[b]) for b in boundaries],
                         "stored_bytes_per_token": memory["stored_bytes_per_token"],
                         "closed_bytes_per_token": memory["closed_bytes_per_token"]})
        return {"names": (baseline_name, staggered_name), "rows": rows, "profiles": profiles, "heads": heads,
                "reuse": reuse}

    def render(self, ctx: ReportContext, result: dict[str, Any]) -> None:
        out, summary, rows, profiles = ctx.out, ctx.summary, result["rows"], result["profiles"]
        baseline_name, staggered_name = result["names"]
        table = pd.DataFrame(rows)
        head_table = pd.concat(result["heads"], ignore_index=True)
        atomic_write_text(out / "data" / "remedy.csv", table.to_csv(index=False))
        atomic_write_text(out / "data" / "remedy_heads.csv", head_table.to_csv(index=False))
        for p, row in zip(profiles, rows):
            if row["model"] in result["reuse"]:  # the report wrote it under the same name
                continue
            name = data_name(SimpleNamespace(metadata={"zoo_name": row["model"]}))
            if (out / "data" / f"profile_{name}_phases.csv").exists():  # that model's profile on another task
                name += "_own_task"
            write_profile_csvs(out, name, p, parts=("residues", "phases"))
        summary["remedy"] = {"pair": [baseline_name, staggered_name], "rows": table.to_dict(orient="records"),
                             "profiles": [p.to_dict() for p in profiles]}
        ctx.figures["remedy_profile"] = profiles_figure(profiles)
        gap_ratio = rows[1]["phase_gap"] / rows[0]["phase_gap"] if rows[0]["phase_gap"] > 0 else float("nan")
        shown = table.assign(mean=lambda t: (100 * t["mean"]).round(1),
                             phase_gap=lambda t: (100 * t.phase_gap).round(1),
                             worst_phase_accuracy=lambda t: (100 * t.worst_phase_accuracy).round(1),
                             boundary_accuracy=lambda t: t.boundary_accuracy.map(
                                 lambda v: [round(100 * x, 1) for x in v]))
        ctx.tables["remedy_profile"] = (
            f"<p>A remedy beyond the paper: <b>{html.escape(staggered_name)}</b> gives each KV head its own window grid "
            f"(KV head h compresses windows starting at j*S + o_h), so a record that straddles one head's window "
            f"boundary is interior for another; <b>{html.escape(baseline_name)}</b> is its twin on the shared grid "
            f"(same backbone, recipe, seed and step). Phases are those of the shared stride. Accuracies in %, "
            f"phase gap in pp; memory is the KV cache measured after {summary.get('config', {}).get('n_ctx', 'n_ctx')} "
            f"tokens. Staggered / baseline phase gap: {gap_ratio:.2f}. One seed per model here; the three-seed "
            f"comparison is <code>phaseinterp.experiments.compare_remedy</code> (benchmarks/RESULTS.md).</p>"
            + shown.to_html(index=False, border=0)
            + "<h3>Boundary phase of each KV head</h3>" + head_table.to_html(index=False, border=0))


__all__ = ["Remedy", "check_remedy"]
