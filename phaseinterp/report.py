"""The report: phase profile (model + full-attention twin), mean replacement, gate cycling, gate
statistics, written as a self-contained folder (index.html, PNGs, CSVs, summary.json)."""

from __future__ import annotations

import html
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from phaseinterp.errors import UserInputError
from phaseinterp._files import atomic_write_text, check_output_dir
from phaseinterp.tasks import resolve_task
from phaseinterp.results import dumps


@dataclass
class ReportSettings:
    """Prompt counts of each report section (per residue; the zoo task has R = 24 residues),
    calibration prompts, gate shifts (None: every distinct shift mod S) and PNG export."""

    n_per_residue: int = 250
    ablation_per_residue: int = 72
    cycling_per_residue: int = 250
    n_calibration: int = 256
    shifts: Optional[tuple[int, ...]] = None  # None: every distinct shift mod S
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
            lines.append(f"gate cycling on {cyc.get('model_used', cyc.get('model'))} (shifts {cyc.get('shifts')}, "
                         f"{cyc.get('points_per_shift')} points per shift): "
                         f"R^2 of the prediction (boundary excluded, pooled) = {_num(cyc.get('r2_pooled'))}; "
                         f"squared correlation = {_num(cyc.get('corr2_pooled'))}; "
                         f"shift identified in {cyc.get('identified')} "
                         f"(permutation p = {_num(cyc.get('identification_p'))})")
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


def _num(value) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"


def check_model_source(model_or_name) -> None:
    """Raise a ValueError unless ``model_or_name`` is a model object, a checkpoint directory or
    the name of a zoo model whose checkpoint ships (cheap: reads no weights)."""
    from phaseinterp import zoo

    if not isinstance(model_or_name, (str, Path)):
        return
    path = Path(model_or_name)
    if (path / "config.json").is_file():
        return
    name = str(model_or_name)
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    hf_shipped = hf_zoo.available()
    shipped = zoo.available()  # both families
    if name in shipped:
        if name in hf_shipped:
            import importlib.util

            if importlib.util.find_spec("transformers") is None:
                raise UserInputError(f"zoo model {name!r} is a Hugging Face DeepSeek-V4 checkpoint and needs transformers "
                                 "(the 'hf' extra: pip install -e '.[hf]')")
        return
    if name in zoo.ENTRIES:
        raise UserInputError(f"zoo model {name!r} is a recipe without a shipped checkpoint; build it with "
                         f"`phaseinterp zoo build {name}` (shipped: {', '.join(shipped)})")
    if path.is_dir():
        raise UserInputError(f"directory {name!r} is not a checkpoint (no config.json in it)")
    if path.exists():
        raise UserInputError(f"model {name!r} is a file; pass a checkpoint directory or a zoo name")
    raise UserInputError(f"model {name!r} is neither a shipped zoo model ({', '.join(shipped)}) nor a checkpoint "
                     f"directory (with config.json){nearest_name(name, list(zoo.ENTRIES) + hf_shipped)}")


def nearest_name(name: str, names) -> str:
    """``"; did you mean 'w4s4'?"`` for the closest of ``names`` to ``name`` (case-insensitive), or ""."""
    import difflib

    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def peek_model(model_or_name):
    """What the config says about a model, without loading its weights: an object with ``cfg``
    (`CompressedConfig`) and ``metadata`` (task, zoo name), or None when that cannot be read cheaply
    (a model object is returned as is; Hugging Face checkpoints return None). Lets callers refuse
    a layer out of range or a wrong stride before a load that can take many seconds."""
    import json
    from types import SimpleNamespace

    from phaseinterp import zoo
    from phaseinterp.config import CompressedConfig

    if not isinstance(model_or_name, (str, Path)):
        return model_or_name
    path = Path(model_or_name)
    if not (path / "config.json").is_file():
        path = zoo.CHECKPOINT_DIR / str(model_or_name)
    try:
        config = json.loads((path / "config.json").read_text())
        if config.get("model_type") == "deepseek_v4":
            return _peek_hf(path, config)
        return SimpleNamespace(cfg=CompressedConfig.from_dict(config["model"]), metadata=config.get("metadata", {}))
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None  # not a checkpoint this can read (or no transformers), or a broken one: loading reports it


def _peek_hf(path: Path, config: dict):
    """A Hugging Face DeepSeek-V4 checkpoint's `DeepseekV4HookedConfig` and phaseinterp metadata from
    its config.json and sidecar (transformers' config class only: no weights are read)."""
    import json
    from types import SimpleNamespace

    from transformers import DeepseekV4Config

    from phaseinterp.models.hf.config import DeepseekV4HookedConfig
    from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE

    hf_config = DeepseekV4Config.from_dict({k: v for k, v in config.items() if k != "model_type"})
    sidecar = path / SIDECAR_FILE
    metadata = json.loads(sidecar.read_text()).get("metadata", {}) if sidecar.is_file() else {}
    return SimpleNamespace(cfg=DeepseekV4HookedConfig.from_hf(hf_config, name=path.name), metadata=metadata)


def check_report_dir(out_dir: Union[str, Path]) -> Path:
    """``out_dir`` as a Path if a report can be written there: it does not exist, is empty, or holds
    a previous report (index.html + summary.json of `build_report`), which the new report replaces
    whole. Any other non-empty folder is a ValueError naming it (nothing of the user's is mixed with
    or deleted by a report). Creates nothing."""
    import json

    out = check_output_dir(out_dir)
    if not out.is_dir() or not any(out.iterdir()):
        return out
    try:
        previous = json.loads((out / "summary.json").read_text())
        is_report = (out / "index.html").is_file() and isinstance(previous, dict) and "profiles" in previous
    except (OSError, ValueError):
        is_report = False
    if not is_report:
        shown = sorted(p.name for p in out.iterdir())[:3]
        raise UserInputError(f"output directory {str(out)!r} is not empty and holds no previous report (it has "
                         f"{', '.join(shown)}{', ...' if len(list(out.iterdir())) > 3 else ''}); pass a new or "
                         "empty folder, or a previous report's folder to replace it")
    return out


def load_model(model_or_name, device=None):
    """A model object, a zoo name or a checkpoint directory -> a model in eval mode."""
    from phaseinterp import zoo
    from phaseinterp._checks import check_device
    from phaseinterp.models import CompressedTransformer

    device = check_device(device)
    check_model_source(model_or_name)
    if not isinstance(model_or_name, (str, Path)):
        model = model_or_name
    elif (Path(model_or_name) / "config.json").is_file():
        model = CompressedTransformer.from_pretrained(Path(model_or_name), device=device)
    else:
        model = zoo.load(str(model_or_name), device=device)
    model.eval()
    return model


def build_report(model, out_dir: Union[str, Path], *, twin=None, settings: Optional[ReportSettings] = None,
                 task=None, device=None, progress: bool = True, log=print, deepseek_v4=None,
                 remedy=None) -> Report:
    """Run every experiment on ``model`` (and the phase profile on ``twin``) and write the folder.

    ``model`` / ``twin``: model objects, shipped zoo names or checkpoint directories (``twin``
    default None: no twin; never ``model`` itself). ``out_dir``: a path that does not exist yet,
    an empty folder, or the folder of a previous report, which is replaced whole: the new report
    is built in a hidden folder beside it and renamed into place at the end, so no file of the
    previous run survives and an interrupted run leaves the previous report as it was. Any other
    non-empty folder is refused. It is checked, and both models are loaded, before anything is
    computed or written. ``settings``
    (default `ReportSettings()`; `ReportSettings.quick()` for a one-minute run) sets the prompt
    counts. ``task`` default: the model's stored task. ``device``: as in `load_model`.
    ``deepseek_v4`` (default None): a wrapped Hugging Face DeepSeek-V4 (`phaseinterp.from_hf`) or the
    name of a shipped HF-format zoo model (``dsv4-tiny``): adds its phase profile, the wrapper's
    logit check against plain transformers, its layer schedule and phase through the indexer.
    ``remedy`` (default None): the zoo name of a staggered-window model (``w4s4-staggered``):
    adds the remedy section (its phase profile beside its shared-grid twin's, each KV head's
    boundary phase, measured KV memory per token; `phaseinterp.report_remedy`).
    Returns a `Report`; the folder holds index.html, data/*.csv, summary.json (strict JSON) and,
    when kaleido and a Chromium are present, one PNG per figure (the HTML says when and why not).
    """
    final = check_report_dir(out_dir)
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


def check_twin(model, twin) -> None:
    """A ValueError when ``twin`` is ``model`` itself (the same object, zoo name or checkpoint folder)."""
    if twin is None:
        return
    if twin is model or (isinstance(model, (str, Path)) and isinstance(twin, (str, Path))
                         and _model_path(model) == _model_path(twin)):
        raise UserInputError(f"twin={str(twin) if isinstance(twin, (str, Path)) else type(twin).__name__!r} is the "
                         "model itself: a model is never its own twin; pass its full-attention twin (the zoo's "
                         "compressed models: 'full') or twin=None")


def _model_path(name: Union[str, Path]) -> Path:
    from phaseinterp import zoo

    path = Path(name)
    if not (path / "config.json").is_file() and (zoo.CHECKPOINT_DIR / str(name)).is_dir():
        path = zoo.CHECKPOINT_DIR / str(name)
    return path.resolve()


def _staging_dir(final: Path) -> Path:
    """An empty hidden folder beside ``final`` (same file system, so a rename moves it into place)."""
    import tempfile

    from phaseinterp._files import normal_mode

    final.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.building-"))
    os.chmod(path, normal_mode(directory=True))  # mkdtemp's 0o700 would survive the rename
    return path


def _replace_dir(staging: Path, final: Path) -> None:
    """Move ``staging`` to ``final``. A previous report there is exchanged with the new one in one
    atomic step where the system allows it (`exchange_paths`), then deleted; elsewhere it is moved
    aside first (two renames: for an instant ``final`` is missing)."""
    from phaseinterp._files import exchange_paths

    if final.exists() and exchange_paths(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous report
    elif final.exists():
        old = final.parent / f".{final.name}.previous-{os.getpid()}"
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)


class PromptSets:
    """Each prompt set of a report generated once and shared by the sections that use it:
    ``get(task, n_per_residue, seed)`` is ``task.generate(n_per_residue, seed=seed)``, the same
    batch every time it is asked for (tasks are frozen dataclasses, so equal tasks share)."""

    def __init__(self):
        self._sets: dict[tuple, Any] = {}

    def get(self, task, n_per_residue: int, seed: int = 0):
        key = (task, n_per_residue, seed)
        if key not in self._sets:
            self._sets[key] = task.generate(n_per_residue, seed=seed)
        return self._sets[key]


class SectionClock:
    """Seconds per report section (``summary["section_seconds"]``, printed by ``phaseinterp demo``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, name: str) -> None:
        """Charge the time since the previous lap to ``name`` (added up when a name repeats)."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._start
        self._start = now


def _build_report(model, final: Path, staging: list, *, twin, settings, task, device, progress, log, deepseek_v4,
                  remedy) -> Report:
    """`build_report`'s work: everything is written to a staging folder (appended to ``staging``)."""
    from phaseinterp.interventions import ablate, gate_cycling, gate_profile
    from phaseinterp.plot import export, profiles_figure
    from phaseinterp.profile import phase_profile

    t0 = time.time()
    clock, prompts = SectionClock(), PromptSets()
    settings = settings or ReportSettings()
    model = load_model(model, device)
    own_task = task is None  # the model's stored task: its profile can be reused by the remedy section
    task = resolve_task(model, task)
    twin = load_model(twin, device) if twin is not None else None
    if deepseek_v4 is not None:
        from phaseinterp.report_deepseek_v4 import deepseek_v4_report, load_deepseek_v4

        dsv4 = load_deepseek_v4(deepseek_v4, device)
    if remedy is not None:
        from phaseinterp.report_remedy import check_remedy, remedy_report

        check_remedy(remedy)
    staging.append(_staging_dir(final))
    out = staging[0]
    (out / "data").mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    summary: dict[str, Any] = {"model": model.cfg.label, "config": model.cfg.to_dict(),
                               "task": task.to_dict() if hasattr(task, "to_dict") else repr(task),
                               "settings": settings.__dict__ | {"shifts": list(settings.shifts or ())}}

    clock.lap("load models")
    log(f"[1/4] phase profile: {settings.n_per_residue} prompts x {task.residue_modulus} residues")
    profile_prompts = prompts.get(task, settings.n_per_residue)
    profiles = [phase_profile(model, profile_prompts, label=_label(model), progress=progress)]
    if twin is not None:
        profiles.append(phase_profile(twin, profile_prompts, stride=model.cfg.stride, label=_label(twin),
                                      progress=progress))
    clock.lap("phase profiles")
    names = [data_name(model)] + ([data_name(twin)] if twin is not None else [])
    controls = _training_controls(model, twin, task, settings, device, progress, profiles, names, prompts)
    for p, name in zip(profiles, names):
        write_profile_csvs(out, name, p)
    summary["profiles"] = [p.to_dict() for p in profiles]
    figures["phase_profile"] = profiles_figure(profiles)
    if controls:
        summary["training_controls"] = controls
        tables["phase_profile"] = _controls_html(controls)
    clock.lap("training controls")

    if model.cfg.is_compressed:
        log(f"[2/4] per-KV-head mean replacement: every layer, {settings.ablation_per_residue} prompts per residue")
        abl = ablate(model, task, n_per_residue=settings.ablation_per_residue, n_calibration=settings.n_calibration,
                     progress=progress, prompts=prompts.get(task, settings.ablation_per_residue))
        spec = abl.specialization()
        atomic_write_text(out / "data" / "ablation.csv", abl.to_frame().to_csv(index=False))
        atomic_write_text(out / "data" / "ablation_specialization.csv", spec.to_csv(index=False))
        summary["ablation"] = abl.to_dict()
        figures["ablation_heatmap"] = abl.plot()
        tables["ablation_heatmap"] = abl.summary().to_html(border=0)
        tables["ablation_heatmap"] += _frame_html(spec, "Specialization per unit (relative change, %)")
        clock.lap("mean replacement")

        from phaseinterp import zoo
        from phaseinterp.interventions import cycling_fitness

        # Gate cycling runs on a model fit for it (W = S gates, payload shared across slots): with a
        # payload map per slot a shifted gate reads maps never trained for its slot (a collapse,
        # not a test). A zoo model that is not fit is replaced by the shipped shared-payload model
        # of its stride; any other model runs it as a negative control, labelled as such.
        fit, why = cycling_fitness(model)
        cyc_model, cyc_name, cyc_task, cyc_reason, negative = model, _label(model), task, why, not fit
        if not fit:
            cyc_reason = f"NEGATIVE CONTROL: {why}"
            zoo_name = getattr(model, "metadata", {}).get("zoo_name")
            substitute = zoo.cycling_model_for(model.cfg.stride) if zoo_name and model.cfg.is_compressed else None
            if substitute is not None:
                cyc_model, cyc_name, negative = load_model(substitute, device), substitute, False
                cyc_task = resolve_task(cyc_model)
                cyc_reason = (f"{_label(model)} is not fit for gate cycling ({why}); the experiment runs on "
                              f"{substitute}, the shipped W = S = {model.cfg.stride} model whose payload is shared "
                              f"across slots, as DeepSeek's kv_proj")
        log(f"[3/4] gate cycling on {cyc_name}: shifts "
            f"{list(settings.shifts) if settings.shifts else 'every distinct shift mod S'}")
        try:
            cyc = gate_cycling(cyc_model, cyc_task, settings.shifts, n_per_residue=settings.cycling_per_residue,
                               progress=progress, n_boot=200,
                               prompts=prompts.get(cyc_task, settings.cycling_per_residue))
            atomic_write_text(out / "data" / "cycling.csv", cyc.to_frame().to_csv(index=False))
            atomic_write_text(out / "data" / "cycling_scores.csv", cyc.scores["per_shift"].to_csv(index=False))
            summary["cycling"] = cyc.to_dict() | {"model_used": cyc_name, "why_this_model": cyc_reason,
                                                  "negative_control": negative}
            figures["gate_cycling"] = cyc.plot(title=f"Gate cycling: {cyc_name}"
                                               + (" (NEGATIVE CONTROL)" if negative else ""))
            tables["gate_cycling"] = (_cycling_html(cyc, cyc_name, cyc_reason, negative)
                                      + cyc.summary().to_html(border=0))
        except ValueError as err:
            summary["cycling_skipped"] = str(err)
            log(f"      skipped: {err}")
        clock.lap("gate cycling")
        if not negative and "cycling" in summary:
            log(f"      unit-level gate cycling on {cyc_name}: units picked by specialized_units' rule")
            unit = _unit_cycling(cyc_model, cyc_task, abl if cyc_model is model else None, settings, progress, out,
                                 prompts)
            summary["unit_cycling"] = unit["summary"]
            tables["unit_cycling"] = unit["html"]
            if unit["figure"] is not None:
                figures["unit_cycling"] = unit["figure"]

            clock.lap("unit-level gate cycling")

        log("[4/4] gate statistics")
        gp = gate_profile(model, task, n_per_residue=settings.gate_per_residue)
        atomic_write_text(out / "data" / "gate_slots.csv", gp.slots.to_csv(index=False))
        atomic_write_text(out / "data" / "gate_heads.csv", gp.heads.to_csv(index=False))
        align = gp.alignment(abl)
        atomic_write_text(out / "data" / "gate_alignment.csv", align.to_csv(index=False))
        summary["gates"] = {"heads": gp.heads.to_dict(orient="records"),
                            "alignment_mean_correlation": float(align.correlation.mean()) if len(align) else None}
        figures["gate_profile"] = gp.plot()
        tables["gate_profile"] = _frame_html(gp.heads, "Per head and branch")
        clock.lap("gate statistics")

    from phaseinterp.report_conformance import conformance_report  # issue 24: light, own family only

    conformance_report(model, task, out, summary, figures, tables, log)
    clock.lap("conformance")

    if deepseek_v4 is not None:
        deepseek_v4_report(dsv4, settings, out, summary, figures, tables, progress, log)
        clock.lap("DeepSeek-V4")

    if remedy is not None:
        zoo_name = getattr(model, "metadata", {}).get("zoo_name")
        reuse = {zoo_name: profiles[0]} if zoo_name and own_task else {}  # same task, n_per_residue, seed 0
        remedy_report(remedy, settings, out, summary, figures, tables, progress, log, reuse=reuse, device=device,
                      prompts=prompts)
        clock.lap("remedy")

    for fig in figures.values():
        tidy_figure(fig)
    static = _static_export(settings, figures, out, export)
    if static["skipped"]:
        log(f"      PNG export skipped: {static['skipped']}; the report has interactive HTML figures and CSVs")
    summary["static_images"] = static["written"]
    summary["static_skipped"] = static["skipped"]
    clock.lap("PNG export")
    summary["section_seconds"] = clock.seconds
    summary["seconds"] = time.time() - t0
    atomic_write_text(out / "summary.json", dumps(summary, indent=2))
    atomic_write_text(out / "index.html", _html(summary, figures, tables, static))
    return Report(out_dir=final, summary=summary, figures=figures, seconds=summary["seconds"])


def _static_export(settings: ReportSettings, figures: dict, out: Path, export) -> dict[str, Any]:
    """Write one PNG per figure when possible; otherwise say why (never fail the report over PNGs)."""
    if not settings.export_static:
        return {"written": [], "skipped": "PNG export turned off (--no-static / export_static=False)"}
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return {"written": [], "skipped": "kaleido is not installed (pip install 'phaseinterp[export]')"}
    if export.find_browser() is None:
        return {"written": [], "skipped": "no Chromium for kaleido was found (apt-get install chromium, or set "
                                          "BROWSER_PATH)"}
    try:  # every PNG from one kaleido (one Chromium) session
        export.save_static({out / f"{name}.png": fig for name, fig in figures.items()})
    except export.ExportError as err:
        return {"written": [], "skipped": f"kaleido failed: {' '.join(str(err).split())[:300]}"}
    return {"written": [f"{name}.png" for name in figures], "skipped": None}


def data_name(model) -> str:
    """The one name a model's files in ``data/`` carry: its zoo name, else its config label, as a slug
    (``profile_w4s4_phases.csv``, ``profile_w4s4_staggered_phases.csv``)."""
    return _slug(getattr(model, "metadata", {}).get("zoo_name") or getattr(model.cfg, "label", type(model).__name__))


def write_profile_csvs(out: Path, name: str, profile, parts=("residues", "phases", "prompts")) -> None:
    """``data/profile_<name>_<part>.csv`` for each of ``parts`` (``name``: a `data_name`)."""
    frames = {"residues": profile.residue_frame, "phases": profile.phase_frame, "prompts": profile.to_frame}
    for part in parts:
        atomic_write_text(out / "data" / f"profile_{name}_{part}.csv", frames[part]().to_csv(index=False))


def _training_controls(model, twin, task, settings, device, progress, profiles, data_names, prompts) -> list[dict]:
    """Profile the equal-step and final-step pairs of ``model``'s zoo run (`zoo.training_controls`),
    reusing ``profiles`` already measured (``data_names``: their `data_name`s, extended in step with
    ``profiles``); returns one row per pair for the report."""
    from phaseinterp import zoo
    from phaseinterp.profile import phase_profile

    pairs = zoo.training_controls(getattr(model, "metadata", {}).get("zoo_name", ""))
    if not pairs or not all(n in zoo.available() for pair in pairs.values() for n in pair):
        return []
    by_name = {}
    for m, p in ((model, profiles[0]), (twin, profiles[1] if twin is not None else None)):
        if m is not None and getattr(m, "metadata", {}).get("zoo_name"):
            by_name[m.metadata["zoo_name"]] = p
    rows = []
    for kind, names in pairs.items():
        row: dict[str, Any] = {"pair": kind}
        for role, name in zip(("compressed", "twin"), names):
            if name not in by_name:
                m = load_model(name, device)
                by_name[name] = phase_profile(m, prompts.get(task, settings.n_per_residue), stride=model.cfg.stride,
                                              label=f"{name} (step {m.metadata.get('step')})", progress=progress)
                profiles.append(by_name[name])
                data_names.append(data_name(m))
            p = by_name[name]
            row.update({role: name, f"{role}_step": zoo.snapshot_step(name), f"{role}_mean": p.mean,
                        f"{role}_worst_phase_accuracy": float(min(p.phase_accuracy)),
                        f"{role}_phase_gap": p.phase_gap, f"{role}_period": p.period})
        rows.append(row)
    return rows


def _controls_html(rows: list[dict]) -> str:
    def pct(v):
        return f"{100 * v:.1f}%"

    body = "".join(
        f"<tr><td style='text-align:left'>{html.escape(r['pair'])}</td><td>{r['compressed_step']}</td>"
        f"<td style='text-align:left'>{html.escape(r['compressed'])}</td><td>{pct(r['compressed_mean'])}</td>"
        f"<td>{pct(r['compressed_worst_phase_accuracy'])}</td><td style='text-align:left'>{html.escape(r['twin'])}</td>"
        f"<td>{pct(r['twin_mean'])}</td><td>{pct(r['twin_worst_phase_accuracy'])}</td>"
        f"<td>{100 * r['twin_phase_gap']:.1f} pp</td></tr>" for r in rows)
    return ("<h3>Equal-training controls</h3><p>The compressed model and its full-attention twin at the SAME "
            "training step: the step at which both have first learned the task (held-out probe mean >= 60%, "
            "computed from the training curves by <code>phaseinterp.zoo.equal_training_step</code>), and the "
            "final step.</p><table><tr><th>pair</th><th>step</th><th>compressed</th><th>mean</th><th>worst phase"
            "</th><th>twin</th><th>mean</th><th>worst phase</th><th>twin phase gap</th></tr>" + body + "</table>")


UNIT_SCORE_SEED = 1  # held-out prompts of the unit-level score (the report's ablation used seed 0)


def _unit_cycling(model, task, ablation, settings, progress, out: Path, prompts: PromptSets) -> dict:
    """Unit-level gate cycling for the report: `specialized_units` picks units by its rule (on the
    report's own ablation, seed 0, when it is of this model; else on its selection split, seed
    1000), then the first specialized unit and the negative control are each cycled alone and
    scored on held-out prompts (seed 1) against C_0((r - d) mod S)."""
    from phaseinterp.interventions import gate_cycling, specialized_units

    selection = specialized_units(model, task, ablation=ablation, n_per_residue=settings.ablation_per_residue,
                                  n_calibration=settings.n_calibration, progress=progress)
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
        r = gate_cycling(model, task, settings.shifts, layers=u["layers"], kv_heads=u["kv_heads"], score="unit",
                         n_per_residue=settings.ablation_per_residue, seed=UNIT_SCORE_SEED,
                         n_calibration=settings.n_calibration, n_boot=200, progress=progress,
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
        parts.append(r.identification().to_html(border=0, float_format=_fmt))
    return {"summary": summary, "html": "".join(parts), "figure": figure}


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
            f"fitted line (the paper's figure): {s['corr2_pooled']:.2f}. {html.escape(per)}. Shift identification: "
            f"{s['n_identified']} of {s['n_shifts']} applied shifts are the best of the {cyc.stride} hypotheses; "
            f"joint permutation p = {s['identification_p']:.3g}.</p>")
    if negative:
        text += ("<p class='note'>Negative control: this model is not fit for the experiment (see above); its "
                 "scores measure the collapse of every phase, not the paper's prediction.</p>")
    elif s["r2_pooled"] != s["r2_pooled"] or s["r2_pooled"] < 0.5 or s["n_identified"] < s["n_shifts"]:
        text += ("<p class='note'>The whole-profile prediction fails on this model. It shifts every layer's gates "
                 "at once, which can break units that serve every phase; whether a single unit's phase moves with "
                 "its gates is the unit-level score below.</p>")
    return text + cyc.identification().to_html(border=0, float_format=_fmt)


def _label(model) -> str:
    name = getattr(model, "metadata", {}).get("zoo_name")
    return f"{name} ({model.cfg.label})" if name else model.cfg.label


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def _frame_html(frame, caption: str, max_rows: int = 40) -> str:
    shown = frame.head(max_rows)
    more = f"<p>... {len(frame) - max_rows} more rows in the CSV</p>" if len(frame) > max_rows else ""
    return f"<h3>{html.escape(caption)}</h3>" + shown.to_html(index=False, border=0, float_format=_fmt) + more


def _fmt(value: float) -> str:
    return f"{value:.3g}"


# One line per statistic the report shows (a table column or row label): the report prints the
# meaning of each one that appears in a section, right under that section's tables.
MEANINGS: dict[str, str] = {
    "mean": "top-1 accuracy over all prompts, every phase weighted equally by design (1.0 = every answer right)",
    "worst phase": "the phase with the lowest accuracy, and that accuracy in brackets",
    "phase gap": "best minus worst accuracy across phases, in percentage points: 0 means phase does not matter",
    "residue gap": "best minus worst accuracy across the R residues (position mod R); noisier than the phase gap, "
                   "since each residue has fewer prompts",
    "period (p)": "the period the residue profile repeats with, and the permutation-test p-value that it is "
                  "chance; 'none' means no period is significant",
    "n_prompts": "prompts measured (every residue group equally)",
    "scope": "what one replaced unit is: one KV head (with its query heads) or a whole layer",
    "shifts": "the gate shifts applied, in slots (distinct mod S)",
    "clean_accuracy": "accuracy with nothing replaced (the baseline every relative change is measured against)",
    "specialized_heads": "units whose knockout hurts (significantly, by at least 50% of the clean accuracy) only "
                         "at 1 to 3 adjacent phases, with those phases",
    "multi_phase_units": "units that hurt phases that are not adjacent, or more than 3 of them",
    "test": "the significance test behind 'hurt', corrected for testing every unit at every phase",
    "heads": "the query heads that read this KV head (all are replaced together)",
    "phases": "the longest run of adjacent phases the unit's knockout hurts",
    "n_phases": "how many phases are in that run (0: the unit serves no phase on its own)",
    "contiguous": "True when every hurt phase lies in that one run",
    "concentration": "the share of the unit's total relative loss that falls on that run (1 = all of it)",
    "worst_change": "the largest relative drop of accuracy, % of the clean accuracy (-100 = wiped out)",
    "worst_change_pp": "the same drop in percentage points of accuracy",
    "hurt_phases": "every phase where the knockout hurts, adjacent or not",
    "preferred_slot": "the window slot the gate puts the most weight on, averaged over the task's windows",
    "static_preferred_slot": "the slot the gate's parameters alone favour (softmax of the bias / position_bias)",
    "static_concentration": "effective number of slots of the average gate, exp(entropy): 1 = one slot, W = uniform",
    "window_concentration": "effective number of slots per window, averaged: how peaked each single gate is",
    "bias_concentration": "effective number of slots of the parameters-only gate",
    "rate": "for the indexer: the share of prompts whose target entry the indexer keeps (the metric column "
            "names which); for DeepSeek-V4 layers: tokens per compressed entry",
    "slots_per_entry": "tokens each compressed entry reads (its window)",
    "lower": "lower end of the 95% Wilson interval of the rate",
    "upper": "upper end of the 95% Wilson interval of the rate",
    "value_selected_rate": "share of prompts where an entry holding the answer token is among the indexer's top k",
    "key_selected_rate": "the same for the target key token",
    "pair_selected_rate": "share of prompts where one selected entry holds both key and answer",
    "mean_value_rank": "average rank of the best entry holding the answer among the closed entries (0 = top)",
    "mean_closed": "average number of closed compressed entries the indexer chooses from",
    "worst_phase_accuracy": "accuracy at the worst phase (%)",
    "boundary_phases": "the phases at the KV heads' own window boundaries (the last slot of a window)",
    "boundary_accuracy": "accuracy at each of those boundary phases (%)",
    "stored_bytes_per_token": "KV-cache bytes per token this implementation holds after n_ctx tokens (K and V)",
    "section": "a part of this report, in the order it ran (Run time table)",
    "seconds": "wall-clock seconds that part took on this machine, models loaded once at the start",
    "closed_bytes_per_token": "the same, counting only entries whose window has closed",
    "window_offset": "where the KV head's window grid starts (0 = the shared grid)",
    "boundary_phase": "that KV head's boundary phase: (offset + S - 1) mod S",
    "r2_pooled": "R² = 1 - SS_res/SS_tot of the parameter-free prediction over every shift's interior phases; 1 = "
                 "exact, 0 = no better than the mean change, negative = worse than that",
    "r2_by_shift": "the same R² for each shift alone (S - 1 points each)",
    "corr2_pooled": "squared correlation of predicted and observed changes (a fitted line: slope and intercept "
                    "free), the paper's figure",
    "corr2_by_shift": "the same per shift",
    "r2_all_by_shift": "R² on every phase including the boundary phase (the boundary stays weak under every shift, "
                       "so this is usually low)",
    "r2_interior_by_shift": "R² leaving out both boundary phases; with S = 4 it rests on 2 points, so it can be "
                            "hugely negative when the observed changes are nearly equal",
    "mae_by_shift": "mean absolute error of the predicted accuracy changes",
    "mean_drop_by_shift": "how much the mean accuracy falls under the shift",
    "displacement_by_shift": "the hypothesised shift that explains the observed profile best",
    "identified": "how many applied shifts are the best of the S hypotheses",
    "identification_p": "permutation p-value of identifying that many shifts by chance",
    "identification_p_by_shift": "the same p-value per shift",
    "boundary_rank_by_shift": "rank of the boundary phase's accuracy under the shift (0 = the weakest phase)",
    "points_per_shift": "phases each per-shift score rests on",
    "hypothesised shift": "columns 0..S-1: R² of the hypothesis that the unit's phase moved by that many slots "
                          "(its contribution C_0((r - d') mod S) against the observed one)",
    "best": "the hypothesised shift that fits the observed contribution best (smallest residual)",
    "kind": "conformance: 'answer' rows group prompts by the answer position's phase, 'cut' rows by the phase "
            "at which the prefill was cut",
    "max_abs_diff": "the largest |difference| of next-token log-probs between this implementation and the full "
                    "forward, over the vocabulary and the prompts of that phase",
    "mean_abs_diff": "the same difference averaged over the vocabulary and the prompts",
    "agreement": "share of prompts whose top-1 next token is the same as the full forward's",
    "accuracy_diff": "answer accuracy of this implementation minus the full forward's (0 = same answers)",
    "statistic": "which difference the verdict reads (max or mean |d log p|)",
    "tolerance": "the largest value of that statistic that passes",
    "passed": "True when the statistic is within the tolerance at this phase",
    "chance": "the probability of identifying the applied shift by luck, exact over every arrangement of the S "
              "phase values (about 1/S)",
}


def _meanings_html(section_html: str) -> str:
    """One line per statistic that appears as a table header in ``section_html``."""
    import re

    shown = {html.unescape(t).strip() for t in re.findall(r"<th[^>]*>(.*?)</th>", section_html, flags=re.S)}
    lines = [f"<li><b>{html.escape(term)}</b>: {html.escape(meaning)}</li>"
             for term, meaning in MEANINGS.items() if term in shown]
    return f"<details open class='meanings'><summary>What the numbers mean</summary><ul>{''.join(lines)}</ul></details>" \
        if lines else ""


READING_GUIDE = (
    "<h2>How to read this report</h2>"
    "<p>Models that compress their KV cache in chunks of S tokens (DeepSeek-V4 style) store a token inside one "
    "compressed entry, at some slot of its window. The token's <b>phase</b> is its position mod S: which slot of a "
    "window it falls in. Every experiment here asks whether retrieval depends on that phase. Each prompt lists "
    "key-value records and asks for the value of one key; the target record is moved through every residue "
    "(position mod R, R a multiple of S) while the prompt length and the mean and spread of target positions stay "
    "the same, so phase is the only thing that changes.</p>"
    "<p><b>Look first</b> at the summary table and the first figure: a compressed model with a phase effect has a "
    "large <i>phase gap</i> and a <i>worst phase</i> far below its mean, repeating with the stride as period; its "
    "full-attention twin (same backbone and training, no compression) should be flat. A good mean can hide a "
    "near-zero worst phase, so read both. Then: <b>head x phase specialization</b> replaces one KV head at a time by "
    "its average output and shows at which phases accuracy drops (a head that matters at only one or two adjacent "
    "phases is phase-specialized); <b>gate cycling</b> rotates the compressor's gate parameters by d slots and "
    "tests the prediction that the weak spots move by d, first with every layer's gates rotated (the whole "
    "profile), then one unit at a time (does that unit's own contribution move with its gates?); "
    "<b>gate statistics</b> show which slot each gate "
    "weights most and how peaked it is. Sections after these cover a Hugging Face DeepSeek-V4 architecture "
    "and a remedy beyond the paper, when the report includes them. Under each table, 'What the numbers mean' "
    "defines every statistic it shows; every number is also in <code>data/*.csv</code> and "
    "<code>summary.json</code>.</p>")


def _tidy_tables(text: str) -> str:
    """Product tables, whoever built them: no pandas header row that only names the index (its name
    moves into the corner cell), and no cell that reads None, nan or [] where a value belongs."""
    import re

    def header(match: re.Match) -> str:
        thead = match.group(0)
        rows = re.findall(r"<tr[^>]*>.*?</tr>", thead, flags=re.S)
        if len(rows) < 2:
            return thead
        cells = re.findall(r"<th[^>]*>(.*?)</th>", rows[-1], flags=re.S)
        if len(cells) < 2 or any(c.strip() for c in cells[1:]):
            return thead
        name = cells[0].strip()
        first = rows[0]
        corner = re.match(r"(<tr[^>]*>\s*<th[^>]*>)(.*?)(</th>)", first, flags=re.S)
        if corner and name:
            label = f"{name} \\ {corner.group(2).strip()}" if corner.group(2).strip() else name
            first = corner.group(1) + label + corner.group(3) + first[corner.end():]
        return thead.replace(rows[0], first).replace(rows[-1], "")

    text = re.sub(r"<thead>.*?</thead>", header, text, flags=re.S)
    text = re.sub(r"(?<![\w.])nan\b", "n/a", text)  # an undefined score (e.g. R² of a flat profile)
    text = re.sub(r"(<td[^>]*>)\s*(None|nan|NaN|&lt;NA&gt;)\s*(</td>)", r"\1n/a\3", text)
    return re.sub(r"(<td[^>]*>)\s*\[\]\s*(</td>)", r"\1none\2", text)


def tidy_figure(fig) -> None:
    """House style for every report figure: integer ticks on phase and slot axes (phases are
    integers), and overlapping line series told apart by dash and marker, not colour alone."""
    import re

    from phaseinterp.plot.compare import DASHES, SYMBOLS

    layout = fig.layout
    if layout.title and layout.title.text:
        layout.title.text = re.sub(r"(?<![\w.])nan\b", "n/a", layout.title.text)  # an undefined score
    for annotation in layout.annotations or ():
        if annotation.text:
            annotation.text = re.sub(r"(?<![\w.])nan\b", "n/a", annotation.text)
    for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        axis = layout[name]
        title = (axis.title.text or "").lower() if axis.title else ""
        is_position = re.search(r"\b(phase|slot)\b", title) and not re.search(r"gap|accuracy|rate|change|%", title)
        if is_position and axis.type not in ("category", "log"):
            axis.update(tick0=0, dtick=1)
    styles: dict[tuple, dict] = {}  # subplot -> series (legend group or name) -> style index
    for trace in fig.data:
        if trace.type != "scatter" or "lines" not in (trace.mode or "lines"):
            continue
        series = trace.legendgroup or (trace.name if trace.showlegend is not False else None)
        if series is None:
            continue  # an unnamed reference line (a diagonal, a mean)
        subplot = styles.setdefault((trace.xaxis or "x", trace.yaxis or "y"), {})
        i = subplot.setdefault(series, len(subplot))
        if i == 0:
            continue  # the first series keeps its style
        if not trace.line.dash:
            trace.line.dash = DASHES[i % len(DASHES)]
        if "markers" in (trace.mode or "") and not trace.marker.symbol:
            trace.marker.symbol = SYMBOLS[i % len(SYMBOLS)]


def _html(summary: dict, figures: dict, tables: dict, static: dict) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>phaseinterp report</title>",
        "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1150px;margin:24px auto;padding:0 12px;"
        "color:#222}table{border-collapse:collapse;margin:8px 0;display:block;max-width:100%;overflow-x:auto}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}h2{margin-top:36px}"
        ".note{background:#fff6e0;border-left:4px solid #e0a000;padding:6px 10px}"
        ".meanings{font-size:90%;color:#444;margin:6px 0 12px}.meanings ul{margin:4px 0}"
        ".plotly-graph-div{max-width:100%}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
        f"<h1>phaseinterp report: {html.escape(summary['model'])}</h1>",
        "<p>Accuracy by target phase (position mod stride) with position statistics held fixed, "
        "per-KV-head mean replacement, cyclic gate shifts and gate statistics. Every number is in "
        "<code>data/*.csv</code> and <code>summary.json</code>.</p>",
        READING_GUIDE,
    ]
    if static.get("skipped"):
        parts.append(f"<p class='note'>PNG figures were not written: {html.escape(static['skipped'])}. "
                     "The interactive figures below and the CSVs hold everything.</p>")
    summary_table = ["<h2>Summary</h2><table><tr><th>model</th><th>mean</th><th>worst phase</th><th>phase gap</th>"
                     "<th>residue gap</th><th>period (p)</th></tr>"]
    for p in summary["profiles"]:
        worst = p["worst_phase_accuracy"]
        period = p["period"] if p["period"] is not None else "none"
        p_value = p["period_p_value"]
        summary_table.append(
            f"<tr><td style='text-align:left'>{html.escape(p['label'])}</td><td>{p['mean']:.3f}</td>"
            f"<td>{','.join(map(str, p['worst_phases']))} ({worst:.3f})</td>"
            f"<td>{100 * p['phase_gap']:.1f} pp</td><td>{100 * p['gap']:.1f} pp</td>"
            f"<td>{period} ({'n/a' if p_value is None or p_value != p_value else f'{p_value:.3f}'})</td></tr>")
    summary_table.append("</table>")
    parts.append("".join(summary_table) + _meanings_html("".join(summary_table)))
    parts.append(_settings_html(summary))
    parts.append(_timing_html(summary))
    titles = {"phase_profile": "Accuracy by phase", "ablation_heatmap": "Head x phase specialization",
              "gate_cycling": "Gate cycling: every layer's gates shifted (whole-profile score)",
              "unit_cycling": "Gate cycling, one unit at a time (unit-level score)",
              "gate_profile": "Gate statistics",
              "dsv4_profile": "DeepSeek-V4 (Hugging Face architecture): accuracy by phase",
              "dsv4_indexer_phase": "DeepSeek-V4: phase through the Lightning Indexer",
              "remedy_profile": "Beyond the paper: staggered compression windows at equal memory",
              "conformance": "Conformance: decoding, chunked prefill and bfloat16 against the full forward, per phase"}
    for name, fig in figures.items():
        parts.append(f"<h2>{titles.get(name, name)}</h2>")
        parts.append(pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"fig-{name}"))
        if name in tables:
            section = _tidy_tables(tables[name])
            parts.append(section + _meanings_html(section))
        if f"{name}.png" in static.get("written", []):
            parts.append(f"<p><a href='{name}.png'>{name}.png</a></p>")
    if "cycling_skipped" in summary:
        parts.append(f"<h2>Gate cycling</h2><p class='note'>Skipped: {html.escape(summary['cycling_skipped'])}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _timing_html(summary: dict) -> str:
    """The report's own run time and its split by section (``summary["section_seconds"]``)."""
    import torch

    if "seconds" not in summary:
        return ""
    sections = summary.get("section_seconds", {})
    body = "".join(f"<tr><td style='text-align:left'>{html.escape(name)}</td><td>{sec:.1f}</td></tr>"
                   for name, sec in sections.items())
    return (f"<h3>Run time</h3><p>This report took {summary['seconds']:.1f} s to build ({os.cpu_count()} CPU "
            f"cores visible, {torch.get_num_threads()} torch threads).</p>"
            f"<table><tr><th>section</th><th>seconds</th></tr>{body}</table>")


def _settings_html(summary: dict) -> str:
    """Model, task and run settings as small tables (the task without its vocabulary); the gate
    shifts are those that ran."""
    rows = []
    config = summary.get("config", {})
    for key in ("compression", "window", "stride", "gate", "payload", "n_layers", "n_heads", "n_kv_heads", "d_model"):
        if key in config:
            rows.append(("model", key, "none (full attention)" if key == "compression" and config[key] is None
                         else config[key]))
    task = summary.get("task")
    if isinstance(task, dict):
        for key, value in task.items():
            if key != "vocab" and not isinstance(value, (dict, list)):
                rows.append(("task", key, "none (no limit)" if value is None else value))
    for key, value in summary.get("settings", {}).items():
        if key == "shifts":
            cycling = summary.get("cycling")
            if cycling:
                value = (f"{', '.join(f'{d:+d}' for d in cycling['shifts'])} (on {cycling.get('model_used', cycling['model'])})")
            elif summary.get("cycling_skipped"):
                value = "gate cycling skipped (see its section)"
            else:
                value = "gate cycling not run (full-attention model)"
        rows.append(("run", key, value))
    body = "".join(f"<tr><td style='text-align:left'>{a}</td><td style='text-align:left'>{html.escape(str(b))}</td>"
                   f"<td style='text-align:left'>{html.escape(str(c))}</td></tr>" for a, b, c in rows)
    return f"<h3>Settings</h3><table><tr><th>what</th><th>setting</th><th>value</th></tr>{body}</table>"
