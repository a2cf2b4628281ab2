"""The report: phase profile (model + full-attention twin), mean replacement, gate cycling, gate
statistics, written as a self-contained folder (index.html, PNGs, CSVs, summary.json)."""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from phaseinterp._files import atomic_write_text, json_default
from phaseinterp.interventions._common import resolve_task


@dataclass
class ReportSettings:
    n_per_residue: int = 250
    ablation_per_residue: int = 72
    cycling_per_residue: int = 250
    n_calibration: int = 256
    shifts: tuple[int, ...] = (-3, -2, -1, 1, 2, 3)
    gate_per_residue: int = 8
    export_static: bool = True

    @classmethod
    def quick(cls) -> "ReportSettings":
        return cls(n_per_residue=72, ablation_per_residue=72, cycling_per_residue=72, n_calibration=128,
                   shifts=(-1, 1), gate_per_residue=4)


@dataclass
class Report:
    out_dir: Path
    summary: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def table(self) -> str:
        """The short summary table printed by ``phaseinterp demo``."""
        lines = ["| model | mean | worst phase (acc) | phase gap | residue gap | period |", "|---|---|---|---|---|---|"]
        for p in self.summary["profiles"]:
            period = p["period"] if p["period"] is not None else "none"
            lines.append(f"| {p['label']} | {p['mean']:.3f} | {','.join(map(str, p['worst_phases']))} "
                         f"({p['worst_phase_accuracy']:.3f}) | {100 * p['phase_gap']:.1f} pp | "
                         f"{100 * p['gap']:.1f} pp | {period} (p={p['period_p_value']:.3f}) |")
        abl = self.summary.get("ablation")
        if abl:
            heads = abl["specialized_heads"][:4] or ["none at <= -50%"]
            lines.append(f"\nspecialized KV heads (knockout <= -50% on <= 3 adjacent phases): {'; '.join(heads)}")
        cyc = self.summary.get("cycling")
        if cyc:
            lines.append(f"gate cycling: R^2 (boundary excluded, pooled) = {cyc['r2_pooled_excl_boundary']:.3f}; "
                         f"weak-spot displacement slope = {cyc['displacement_slope']:.2f} "
                         f"(R^2 {cyc['displacement_r2']:.2f})")
            if self.summary.get("config", {}).get("payload") == "per_slot":
                lines.append("  note: this model has a payload map per slot, so a shifted gate reads a map never "
                             "trained for its slot; see the w4s4-1kv-shared zoo model (shared payload) for the "
                             "paper's cycling experiment")
        elif self.summary.get("cycling_skipped"):
            lines.append(f"gate cycling skipped: {self.summary['cycling_skipped']}")
        return "\n".join(lines)


def load_model(model_or_name, device=None):
    """A model object, a zoo name or a checkpoint directory -> a model in eval mode."""
    from phaseinterp import zoo
    from phaseinterp.models import CompressedTransformer

    if not isinstance(model_or_name, (str, Path)):
        model = model_or_name
    elif (Path(model_or_name) / "config.json").is_file():
        model = CompressedTransformer.from_pretrained(Path(model_or_name), device=device)
    elif str(model_or_name) in zoo.ENTRIES:
        model = zoo.load(str(model_or_name), device=device)
    else:
        raise ValueError(
            f"model {str(model_or_name)!r} is neither a zoo name ({', '.join(sorted(zoo.ENTRIES))}) "
            "nor a checkpoint directory (with config.json)"
        )
    model.eval()
    return model


def build_report(model, out_dir: Union[str, Path], *, twin=None, settings: Optional[ReportSettings] = None,
                 task=None, device=None, progress: bool = True, log=print) -> Report:
    """Run every experiment on ``model`` (and the phase profile on ``twin``) and write the folder."""
    from phaseinterp.evaluate import phase_profile
    from phaseinterp.interventions import gate_cycling, gate_profile, mean_ablation
    from phaseinterp.plot import export, profiles_figure

    t0 = time.time()
    settings = settings or ReportSettings()
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    model = load_model(model, device)
    task = resolve_task(model, task)
    twin = load_model(twin, device) if twin is not None else None
    figures: dict[str, Any] = {}
    summary: dict[str, Any] = {"model": model.cfg.label, "config": model.cfg.to_dict(),
                               "task": task.to_dict() if hasattr(task, "to_dict") else repr(task),
                               "settings": settings.__dict__ | {"shifts": list(settings.shifts)}}

    log(f"[1/4] phase profile: {settings.n_per_residue} prompts x {task.residue_modulus} residues")
    profiles = [phase_profile(model, task, settings.n_per_residue, label=_label(model), progress=progress)]
    if twin is not None:
        profiles.append(phase_profile(twin, task, settings.n_per_residue, stride=model.cfg.stride,
                                      label=_label(twin), progress=progress))
    for p in profiles:
        slug = _slug(p.label)
        atomic_write_text(out / "data" / f"profile_{slug}_residues.csv", p.residue_frame().to_csv(index=False))
        atomic_write_text(out / "data" / f"profile_{slug}_phases.csv", p.phase_frame().to_csv(index=False))
        atomic_write_text(out / "data" / f"profile_{slug}_prompts.csv", p.to_frame().to_csv(index=False))
    summary["profiles"] = [p.summary() for p in profiles]
    figures["phase_profile"] = profiles_figure(profiles)

    if model.cfg.is_compressed:
        log(f"[2/4] per-KV-head mean replacement: every layer, {settings.ablation_per_residue} prompts per residue")
        abl = mean_ablation(model, task, n_per_residue=settings.ablation_per_residue,
                            n_calibration=settings.n_calibration, progress=progress)
        atomic_write_text(out / "data" / "ablation.csv", abl.to_frame().to_csv(index=False))
        atomic_write_text(out / "data" / "ablation_specialization.csv", abl.specialization().to_csv(index=False))
        summary["ablation"] = abl.summary()
        figures["ablation_heatmap"] = abl.plot()

        log(f"[3/4] gate cycling: shifts {list(settings.shifts)}")
        try:
            cyc = gate_cycling(model, task, settings.shifts, n_per_residue=settings.cycling_per_residue,
                               progress=progress, n_boot=200)
            atomic_write_text(out / "data" / "cycling.csv", cyc.to_frame().to_csv(index=False))
            atomic_write_text(out / "data" / "cycling_scores.csv", cyc.scores["per_shift"].to_csv(index=False))
            summary["cycling"] = cyc.summary()
            figures["gate_cycling"] = cyc.plot()
        except ValueError as err:
            summary["cycling_skipped"] = str(err)
            log(f"      skipped: {err}")

        log("[4/4] gate statistics")
        gp = gate_profile(model, task, n_per_residue=settings.gate_per_residue)
        atomic_write_text(out / "data" / "gate_slots.csv", gp.slots.to_csv(index=False))
        atomic_write_text(out / "data" / "gate_heads.csv", gp.heads.to_csv(index=False))
        align = gp.alignment(abl)
        atomic_write_text(out / "data" / "gate_alignment.csv", align.to_csv(index=False))
        summary["gates"] = {"heads": gp.heads.to_dict(orient="records"),
                            "alignment_mean_correlation": float(align.correlation.mean()) if len(align) else None}
        figures["gate_profile"] = gp.plot()

    static_ok = settings.export_static and export.static_export_available()
    if settings.export_static and not static_ok:
        log("      PNG export skipped: needs `pip install 'phaseinterp[export]'` and a Chromium "
            "(apt-get install chromium); the report has interactive HTML figures and CSVs")
    for name, fig in figures.items():
        if static_ok:
            export.save(fig, out / f"{name}.png")
    summary["static_images"] = bool(static_ok)
    summary["seconds"] = time.time() - t0
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=json_default))
    atomic_write_text(out / "index.html", _html(summary, figures, static_ok))
    return Report(out_dir=out, summary=summary, figures=figures, seconds=summary["seconds"])


def _label(model) -> str:
    name = getattr(model, "metadata", {}).get("zoo_name")
    return f"{name} ({model.cfg.label})" if name else model.cfg.label


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def _html(summary: dict, figures: dict, static_ok: bool) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>phaseinterp report</title>",
        "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1150px;margin:24px auto;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "h2{margin-top:36px}pre{background:#f6f6f6;padding:8px;overflow:auto}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
        f"<h1>phaseinterp report: {html.escape(summary['model'])}</h1>",
        "<p>Accuracy by target phase (position mod stride) with position statistics held fixed, "
        "per-KV-head mean replacement, cyclic gate shifts and gate statistics. Every number is in "
        "<code>data/*.csv</code> and <code>summary.json</code>.</p>",
        "<h2>Summary</h2><table><tr><th>model</th><th>mean</th><th>worst phase</th><th>phase gap</th>"
        "<th>residue gap</th><th>period (p)</th></tr>",
    ]
    for p in summary["profiles"]:
        parts.append(
            f"<tr><td style='text-align:left'>{html.escape(p['label'])}</td><td>{p['mean']:.3f}</td>"
            f"<td>{','.join(map(str, p['worst_phases']))} ({p['worst_phase_accuracy']:.3f})</td>"
            f"<td>{100 * p['phase_gap']:.1f} pp</td><td>{100 * p['gap']:.1f} pp</td>"
            f"<td>{p['period'] if p['period'] is not None else 'none'} ({p['period_p_value']:.3f})</td></tr>")
    parts.append("</table>")
    titles = {"phase_profile": "Accuracy by phase", "ablation_heatmap": "Head x phase specialization",
              "gate_cycling": "Gate cycling", "gate_profile": "Gate statistics"}
    for i, (name, fig) in enumerate(figures.items()):
        parts.append(f"<h2>{titles.get(name, name)}</h2>")
        parts.append(pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"fig-{name}"))
        if static_ok:
            parts.append(f"<p><a href='{name}.png'>{name}.png</a></p>")
    if "cycling_skipped" in summary:
        parts.append(f"<p>Gate cycling skipped: {html.escape(summary['cycling_skipped'])}</p>")
    parts.append(f"<h2>Raw summary</h2><pre>{html.escape(json.dumps(summary, indent=2, default=json_default)[:20000])}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)
