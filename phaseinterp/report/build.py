"""Building a report: `build_report` checks its inputs, loads the models, runs the sections
(`SECTIONS`, each on the section protocol of `phaseinterp.report.section`), exports PNGs in one
kaleido session and writes the folder (index.html, PNGs, data/*.csv, summary.json) in a staging
folder that replaces the target in one step."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from phaseinterp._files import atomic_write_text, check_write_target, move_into_place, staging_dir
from phaseinterp.models.protocol import model_label
from phaseinterp.plot import export
from phaseinterp.report.models import as_model, check_twin
from phaseinterp.report.page import num, page_html, period_words, tidy_figure
from phaseinterp.report.section import ReportContext, SectionClock, run_sections
from phaseinterp.report.sections.conformance import Conformance
from phaseinterp.report.sections.deepseek_v4 import DeepseekV4, load_deepseek_v4
from phaseinterp.report.sections.mechanisms import GateCycling, GateStatistics, MeanReplacement, UnitCycling
from phaseinterp.report.sections.paper import BesideThePaper
from phaseinterp.report.sections.profile import PhaseProfiles, PromptLength, TrainingControls
from phaseinterp.report.sections.remedy import Remedy, check_remedy
from phaseinterp.results import dumps
from phaseinterp.tasks import resolve_task

# The report's sections, in page order; each declares the earlier sections it reads.
SECTIONS = (PhaseProfiles(), TrainingControls(), PromptLength(), BesideThePaper(), MeanReplacement(), GateCycling(),
            UnitCycling(), GateStatistics(), Conformance(), DeepseekV4(), Remedy())


@dataclass
class ReportSettings:
    """Prompt counts of each report section (per residue), calibration prompts, gate shifts (None:
    every distinct shift mod S) and PNG export. `full()` is the paper's 250 per residue (``--full``),
    `quick()` also cuts the shifts to +-1 and the calibration prompts."""

    n_per_residue: int = 72
    ablation_per_residue: int = 72
    cycling_per_residue: int = 72
    n_calibration: int = 256
    shifts: Optional[tuple[int, ...]] = None  # None: every distinct shift mod S
    gate_per_residue: int = 8
    export_static: bool = True

    @classmethod
    def full(cls) -> "ReportSettings":
        """250 prompts per residue for the profiles and gate cycling (6,000 prompts each)."""
        return cls(n_per_residue=250, cycling_per_residue=250)

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
            lines.append(f"| {p['label']} | {p['mean']:.3f} | {','.join(map(str, p['worst_phases']))} "
                         f"({p['worst_phase_accuracy']:.3f}) | {100 * p['phase_gap']:.1f} pp | "
                         f"{100 * p['gap']:.1f} pp | {period_words(p, 'undetermined')} (p={p['period_p_value']:.3f}) |")
        res = self.summary.get("resolution") or []
        if res:
            sizes = sorted({r["n_per_residue"] for r in res})
            resolved = [r["model"] for r in res if r["verdict"] == "separated"]
            lines.append(f"\nphase gap resolved (worst/best-phase intervals disjoint) at {'/'.join(map(str, sizes))} "
                         f"prompts per residue: {', '.join(resolved) or 'none'}; the others' intervals overlap "
                         f"(--full: 250 per residue)")
        abl = self.summary.get("ablation")
        if abl:
            heads = abl["specialized_heads"][:4] or ["none at <= -50%"]
            lines.append(f"\nspecialized KV heads (knockout <= -50% on <= 3 adjacent phases): {'; '.join(heads)}")
        cyc = self.summary.get("cycling")
        if cyc:
            lines.append(f"gate cycling on {cyc.get('model_used', cyc.get('model'))} (shifts {cyc.get('shifts')}, "
                         f"{cyc.get('points_per_shift')} points per shift): "
                         f"R^2 of the prediction (boundary excluded, pooled) = {num(cyc.get('r2_pooled'))}; "
                         f"squared correlation = {num(cyc.get('corr2_pooled'))}; "
                         + (f"shift identified in {cyc['identified']} " if "identified" in cyc
                            else "shift identification not claimed (premise fails) ") +
                         f"(permutation p = {num(cyc.get('identification_p'))})")
            if cyc.get("why_this_model"):
                lines.append(f"  why this model: {cyc['why_this_model']}")
        elif self.summary.get("cycling_skipped"):
            lines.append(f"gate cycling skipped: {self.summary['cycling_skipped']}")
        remedy = self.summary.get("remedy")
        if remedy:
            base, stag = remedy["rows"]
            lines.append(f"remedy: {stag['model']} (staggered windows) vs {base['model']} (shared grid), step "
                         f"{stag['step']}: mean {stag['mean']:.3f} vs {base['mean']:.3f}, phase gap "
                         f"{100 * stag['phase_gap']:.1f} vs {100 * base['phase_gap']:.1f} pp, KV memory "
                         f"{stag['stored_bytes_per_token']:.0f} vs {base['stored_bytes_per_token']:.0f} B/token")
        return "\n".join(lines)


def check_report_dir(out_dir: Union[str, Path], overwrite: bool = False) -> Path:
    """``out_dir`` as a Path if a report can be written there: absent, empty, or (``overwrite=True``)
    holding a previous report, which is replaced whole; anything else is a UserInputError
    (`phaseinterp._files.check_write_target`). Creates nothing."""
    return check_write_target(out_dir, "report", overwrite=overwrite, name="out_dir")


def build_report(model, out_dir: Union[str, Path], *, twin=None, settings: Optional[ReportSettings] = None,
                 task=None, device=None, progress: bool = True, log=print, deepseek_v4=None,
                 remedy=None, overwrite: bool = False) -> Report:
    """Run every experiment on ``model`` (and the phase profile on ``twin``) and write the folder.

    ``model`` / ``twin``: model objects, zoo names or checkpoint directories (``twin`` never ``model``).
    ``out_dir``: absent, empty, or with ``overwrite=True`` a previous report, replaced whole in one rename
    at the end; anything else is refused. Inputs are checked and models loaded before anything is
    computed or written. ``settings``: `ReportSettings` (`ReportSettings.quick()` for a short run).
    ``task``: default the model's stored one. ``device``: as in `phaseinterp.load`. ``deepseek_v4``: a
    wrapped HF DeepSeek-V4 or a zoo name (``dsv4-tiny``), adding its section. ``remedy``: the zoo name of a
    staggered-window model (``w4s4-staggered``), adding the remedy section.
    Returns a `Report`; the folder holds index.html, data/*.csv, summary.json and, when kaleido and a
    Chromium are present, one PNG per figure."""
    final = check_report_dir(out_dir, overwrite)
    check_twin(model, twin)
    staging: list[Path] = []
    try:
        report = _build_report(model, final, staging, twin=twin, settings=settings, task=task, device=device,
                               progress=progress, log=log, deepseek_v4=deepseek_v4, remedy=remedy)
        _replace_dir(staging[0], final)
        return report
    finally:
        if staging and staging[0].exists():  # interrupted or failed: the previous report stays as it was
            shutil.rmtree(staging[0], ignore_errors=True)


_staging_dir = staging_dir  # the shared helpers of phaseinterp._files (one rule for every writer)
_replace_dir = move_into_place


def _build_report(model, final: Path, staging: list, *, twin, settings, task, device, progress, log, deepseek_v4,
                  remedy) -> Report:
    """`build_report`'s work: everything is written to a staging folder (appended to ``staging``)."""
    t0 = time.time()
    clock = SectionClock()
    settings = settings or ReportSettings()
    model = as_model(model, device)
    own_task = task is None  # the model's stored task: its profile can be reused by the remedy section
    task = resolve_task(model, task)
    twin = as_model(twin, device) if twin is not None else None
    dsv4 = None
    if deepseek_v4 is not None:
        dsv4 = load_deepseek_v4(deepseek_v4, device)
    if remedy is not None:
        check_remedy(remedy)
    staging.append(_staging_dir(final))
    out = staging[0]
    (out / "data").mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(model=model, task=task, settings=settings, out=out, twin=twin, device=device,
                        progress=progress, log=log, own_task=own_task, deepseek_v4=dsv4, remedy=remedy)
    ctx.summary.update({"model": model_label(model), "config": model.cfg.to_dict(),
                        "task": task.to_dict() if hasattr(task, "to_dict") else repr(task),
                        "settings": settings.__dict__ | {"shifts": list(settings.shifts or ())}})
    clock.lap("load models")
    # the inputs are loaded and checked: kaleido's browser starts now, while the sections run
    with export.static_session(settings.export_static):
        run_sections(list(SECTIONS), ctx, clock)
        summary, figures = ctx.summary, ctx.figures
        for fig in figures.values():
            tidy_figure(fig)
        static = _static_export(settings, figures, out, export)
    if static["skipped"]:
        log(f"      PNG export skipped: {static['skipped']}; the report has interactive HTML figures and CSVs")
    summary["static_images"] = static["written"]
    summary["static_skipped"] = static["skipped"]
    clock.lap("PNG export")
    summary["resolution"] = resolution(summary["profiles"])
    summary["section_seconds"] = clock.seconds
    summary["seconds"] = time.time() - t0
    atomic_write_text(out / "summary.json", dumps(summary, indent=2))
    atomic_write_text(out / "index.html", page_html(summary, figures, ctx.tables, static))
    return Report(out_dir=final, summary=summary, figures=figures, seconds=summary["seconds"])


def resolution(profiles: list[dict]) -> list[dict]:
    """For each reported phase profile (`PhaseProfile.to_dict`): "separated" when its worst- and
    best-phase intervals are disjoint (its phase gap is resolved at the report's size), else
    "overlapping" (no phase gap this many prompts can resolve: a flat profile reads so, and a
    smaller gap needs more prompts, ``--full``)."""
    rows = []
    for p in profiles:
        worst, best = p["worst_phase_interval"], p["best_phase_interval"]
        rows.append({"model": p["label"], "n_per_residue": p["n_per_residue"], "worst_phase": p["worst_phases"][0],
                     "worst_interval": worst, "best_phase": p["best_phase"], "best_interval": best,
                     "phase_gap": p["phase_gap"], "verdict": "separated" if worst[1] < best[0] else "overlapping"})
    return rows


def _static_export(settings: ReportSettings, figures: dict, out: Path, export) -> dict[str, Any]:
    """Write one PNG per figure when possible; otherwise say why (never fail the report over PNGs)."""
    if not settings.export_static:
        return {"written": [], "skipped": "PNG export turned off (--no-static / export_static=False)"}
    if export.load_kaleido() is None:
        return {"written": [], "skipped": "kaleido is not installed (pip install 'phaseinterp[export]')"}
    if export.find_browser() is None:
        return {"written": [], "skipped": "no Chromium for kaleido was found (apt-get install chromium, or set "
                                          "BROWSER_PATH)"}
    try:  # every PNG from one kaleido (one Chromium) session
        export.save_static({out / f"{name}.png": fig for name, fig in figures.items()})
    except export.ExportError as err:
        return {"written": [], "skipped": f"kaleido failed: {' '.join(str(err).split())[:300]}"}
    return {"written": [f"{name}.png" for name in figures], "skipped": None}
