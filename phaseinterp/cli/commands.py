"""The commands behind ``phaseinterp``: checks before any work (`_preflight`), then one function per
subcommand (``_cmd_profile``, ``_cmd_cycle`` ...), dispatched by `run` from `COMMANDS`. `phaseinterp.cli.main`
imports this module only after the arguments parse, so ``--help`` loads neither torch nor plotly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

from phaseinterp import parallel, zoo
from phaseinterp import report as report_module
from phaseinterp import train as training
from phaseinterp._checks import check_device, parse_size
from phaseinterp._files import check_output_dir, check_path_roles, check_read_path, check_write_target, expand_user
from phaseinterp.cli.args import UsageError, check_flag_needs
from phaseinterp.cli.paper_run import BACKBONE as PAPER_BACKBONE
from phaseinterp.cli.paper_run import default_paper_run, paper_run_settings
from phaseinterp.cli.engine import served_profile
from phaseinterp.config import preset
from phaseinterp.engines import conformance
from phaseinterp.engines.check import ConformanceSpec
from phaseinterp.engines.lm_eval import write_lm_eval_task
from phaseinterp.experiments import remedy as remedy_module
from phaseinterp.interventions import ablate, gate_cycling_profile, gate_cycling_unit, gate_profile
from phaseinterp.interventions.ablation import AblationSpec
from phaseinterp.interventions.gate_stats import GateProfileSpec
from phaseinterp.interventions.gate_cycling import CyclingSpec
from phaseinterp.interventions.unit_cycling import UnitCyclingSpec
from phaseinterp.interventions._common import check_layers
from phaseinterp.interventions.gate_cycling import _default_size
from phaseinterp.models import loading
from phaseinterp.models.allocator import keep_freed_memory
from phaseinterp.models.protocol import phase_model
from phaseinterp.models.hf import export as hf_export
from phaseinterp.models.hf import memory as hf_memory
from phaseinterp.models.hf.export import DEFAULT_FP8_SCALES, EXPERT_FORMATS, EXPORT_LAYOUTS, FP8_SCALES
from phaseinterp.models.loading import check_source, peek
from phaseinterp.parallel import merge, sharded_ablate, sharded_gate_cycling_profile, sharded_profile
from phaseinterp.plot import pretrain_curves, save
from phaseinterp.plot.export import figure_targets
from phaseinterp.profile import PhaseProfile, ProfileSpec, phase_profile
from phaseinterp.report import check as report_check
from phaseinterp.report.paper import write_paper_figures
from phaseinterp import paper as paper_module
from phaseinterp.report.sections.remedy import check_remedy
from phaseinterp.tasks import resolve_task
from phaseinterp.train.plan import plan_memory
from phaseinterp.train.pretrain import (EXECUTION_FIELDS, RUN_FILE, PretrainConfig, check_nproc, prepare, preset_recipe,
                                        pretrain)
from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer
from phaseinterp.zoo import deepseek_v4 as hf_zoo


# ------------------------------------------------------------------- the zoo
def zoo_rows() -> list[tuple[str, str, str]]:
    """(name, status, description) for every zoo entry; status is "shipped" or "recipe only"."""
    return [(name, "shipped" if shipped else "recipe only", description)
            for name, shipped, description, _ in zoo.catalog()]


def zoo_markdown() -> str:
    """The README's zoo table (tests check that README.md contains exactly this)."""
    lines = ["| name | checkpoint | what |", "|---|---|---|"]
    for name, status, description in zoo_rows():
        lines.append(f"| `{name}` | {status} | {description.replace('|', '/')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- checks
# What each command writes to --out, for the shared write rule (`phaseinterp._files.check_write_target`);
# merge's result kind is known only from its run header, so its save checks it.
OUT_KINDS = {"demo": "report", "report": "report", "profile": "PhaseProfile result", "ablate": "AblationResult result",
             "gates": "GateProfile result", "conformance": "ConformanceResult result", "train": "training run",
             "pretrain": "pretraining run", "tokenizer": "tokenizer", "lm-eval-task": "lm-eval task",
             "paper": "report"}


def _out_kind(args) -> Optional[str]:
    if args.command == "cycle":
        return "UnitCyclingResult result" if args.score == "unit" else "CyclingResult result"
    if args.command == "zoo" and getattr(args, "zoo_command", None) == "export":
        return "Hugging Face checkpoint"
    return OUT_KINDS.get(args.command)


def _check_out(args) -> None:
    """--out and --out-dir, before any work: a path a folder can be made at, and (the shared rule)
    nothing there that this command would replace without --overwrite."""
    for attr in ("out", "out_dir"):
        value = getattr(args, attr, None)
        if value is None:
            continue
        kind = _out_kind(args) if attr == "out" else None
        if kind is None or kind in ("training run", "pretraining run"):  # --resume decides; zoo build resumes
            check_output_dir(value)
        else:
            check_write_target(value, kind, overwrite=getattr(args, "overwrite", False), name=f"--{attr.replace('_', '-')}")


# The paths each command reads besides MODEL (a zoo name or a folder: `check_source`), judged at the
# readers' door (`phaseinterp._files.check_read_path`: missing, a file for a folder or the reverse, an
# empty folder, a dangling link, unreadable) before any work: command -> {dest: (expect, what it must be)}.
_REPORT = {"dir": ("any", "a report folder written by `phaseinterp demo` or `phaseinterp report` (or its index.html)")}
READ_PATHS: dict[str, dict[str, tuple[str, str]]] = {
    "check-report": _REPORT,
    "screenshot": _REPORT,
    "merge": {"dir": ("folder", "the --shard-dir of a profile, ablate or cycle run (run.json + shards/)")},
    "cycle": {"baseline": ("folder", "a profile folder written by `phaseinterp profile MODEL --out DIR`")},
    "profile": {"tokenizer": ("folder", "a Hugging Face tokenizer folder (tokenizer.json or the files "
                                        "save_pretrained writes)")},
    "pretrain": {"config": ("file", 'a JSON file {"model": {...}, "train": {...}}'),
                 "data": ("any", "a text, JSONL or parquet file, a folder of them, or a datasets folder"),
                 "tokenizer": ("folder", "a tokenizer folder with tokenizer.json (`phaseinterp tokenizer train`)")},
    "tokenizer": {"data": ("any", "a text, JSONL or parquet file, a folder of them, or a datasets folder")},
    "memory-plan": {"config": ("any", "a DeepSeek-V4 config.json or a checkpoint folder holding one")},
}


def _read_flag(command: str, dest: str) -> str:
    """How the user wrote the path argument ``dest``: DIR / CONFIG for positionals, else its flag."""
    if dest == "dir" or (command == "memory-plan" and dest == "config"):
        return dest.upper()
    return f"--{dest.replace('_', '-')}"


def _check_inputs(args) -> None:
    """Every path a command reads, at the readers' door, before any work: `READ_PATHS`, and MODEL or
    --twin where written as a path (a zoo name is checked by `check_source` in the command)."""
    given = getattr(args, "as_given", {})
    for dest, (expect, what) in READ_PATHS.get(args.command, {}).items():
        if getattr(args, dest, None) is not None:
            check_read_path(given.get(dest, getattr(args, dest)), what, name=_read_flag(args.command, dest),
                            expect=expect)
    for dest in ("model", "twin"):
        value = given.get(dest)
        if (args.command, dest) != ("demo", "model") and value is not None and value != "none" and loading.looks_like_path(value) \
                and value not in zoo.available():
            check_read_path(value, f"a checkpoint folder or a zoo name; accepted: {loading.ACCEPTED}",
                            name="MODEL" if dest == "model" else "--twin")


def _spec_type(args):
    """The experiment spec a command fills from its arguments (None: the command has none)."""
    if args.command == "cycle":
        return UnitCyclingSpec if args.score == "unit" else CyclingSpec
    return SPECS.get(args.command)


SPECS = {"profile": ProfileSpec, "ablate": AblationSpec, "conformance": ConformanceSpec, "gates": GateProfileSpec}


def _preflight(args) -> None:
    """Before the weights load (a load can take many seconds): the command's experiment spec filled
    from its arguments (``args.spec``: every option checked as the Python function checks it, by the
    same code), then the spec's checks that need the model's config (layer indices, strides, shifts,
    read from config.json) and its stored task (prompt counts it can lay out)."""
    if args.command == "cycle" and args.baseline is not None:  # model-independent: before anything loads
        args.baseline_profile = PhaseProfile.load(args.baseline)  # a missing or corrupt folder: one line
    if args.command == "cycle" and args.score == "unit":
        if args.shard_dir is not None:
            raise UsageError("--shard-dir runs the profile score only; drop --score unit or --shard-dir")
        if args.layer is None:
            raise UsageError("--score unit needs the unit: --layer L (and --kv-heads H)")
    spec_type = _spec_type(args)
    args.spec = None if spec_type is None else spec_type.from_args(args)  # the model loads onto --device itself
    described = peek(args.model)
    if described is None:  # not readable from config.json alone: checked after loading
        return
    cfg = described.cfg
    if args.spec is not None:
        args.spec.check_model(described)
    elif getattr(args, "layer", None) is not None:
        check_layers(described, args.layer)
    task = None
    if isinstance(described.metadata.get("task"), dict):
        task = resolve_task(described)
    if task is not None:
        _check_task(args, task, getattr(args, "stride", None) or cfg.stride)
    if args.command == "profile":
        _check_own_stride(args.stride, cfg)


def _check_task(args, task, stride: Optional[int] = None) -> None:
    """The spec's checks of the (stored) task, once the cycle's size is known (``args.spec`` takes it);
    --padding changes the task's layout, so its placement is then checked by the run itself."""
    if args.command == "cycle" and args.n_per_residue is None:
        _default_cycle_size(args, task)
    if args.command == "cycle":
        args.spec = args.spec.replace(n_per_residue=args.n_per_residue)
    if args.command == "profile":
        args.spec.check_task(task, stride)
    elif args.spec is not None:
        args.spec.check_task(task)
    if args.command in ("profile", "ablate", "cycle") and getattr(args, "padding", None) is None \
            and hasattr(task, "placement"):
        task.placement(args.spec.n_per_residue, strict=True)


def _check_own_stride(stride: Optional[int], cfg) -> None:
    """``profile --stride`` of a compressed model must be its own stride (another one mixes its phases)."""
    own = getattr(cfg, "stride", None)
    if stride is not None and getattr(cfg, "is_compressed", False) and own is not None and stride != own:
        raise UsageError(f"--stride {stride} is not the model's own stride S={own}: folding a compressed model by "
                         f"another stride mixes its phases and hides the phase gap; omit --stride (or pass --stride "
                         f"{own}), or re-fold deliberately in Python with phaseinterp.phase_profile(model, task, "
                         f"stride={stride}), whose label says so")


def _default_cycle_size(args, task) -> None:
    """``cycle`` without --n-per-residue: the --baseline profile's size, else the library's default
    (as `gate_cycling_profile` / `gate_cycling_unit`), so ``profile MODEL --out P && cycle MODEL
    --baseline P`` profiles the same prompts."""
    args.n_per_residue = _default_size(None, getattr(args, "baseline_profile", None), task.residue_modulus)


# ------------------------------------------------------------------ commands
def _save(out: Optional[str], result, overwrite: bool = False) -> None:
    if out:
        print(f"saved to {result.save(Path(out), overwrite=overwrite)}")


# The arguments that name paths: those a command writes, those it reads (a zoo name passes unchanged).
OUTPUT_PATHS = ("out", "out_dir", "shard_dir", "png", "paper_figure")
INPUT_PATHS = ("model", "twin", "dir", "baseline", "data", "tokenizer", "config", "runs")


def _check_paths(args) -> None:
    """Every path argument read once: ``~`` expanded (``--out=~/x``: the shell leaves it after ``=``),
    then outputs that collide with each other or with an input refused (`check_path_roles`)."""
    args.as_given = {}  # the paths as the user wrote them, for messages that show both (`check_read_path`)
    for attr in OUTPUT_PATHS + INPUT_PATHS:
        if isinstance(getattr(args, attr, None), str):
            args.as_given[attr] = getattr(args, attr)
            setattr(args, attr, expand_user(getattr(args, attr)))
    flag = lambda attr: "DIR" if attr in ("dir", "runs") else ("MODEL" if attr == "model" else  # noqa: E731
                                                                  f"--{attr.replace('_', '-')}")
    check_path_roles({flag(a): getattr(args, a, None) for a in OUTPUT_PATHS},
                     {flag(a): getattr(args, a, None) for a in INPUT_PATHS if a != "runs"})


def run(args) -> int:
    """Run the parsed command ``args``; returns the exit code (bad input raises, `main` reports it).
    The checks every command shares come first (paths, --out, --device), then the command's own
    function from `COMMANDS`."""
    _check_paths(args)
    check_flag_needs(args, getattr(args, "given", set()))  # a flag given where it does nothing, before any work
    _check_out(args)
    _check_inputs(args)
    if getattr(args, "device", None) is not None:
        check_device(args.device)
    if args.command == "profile":
        default_paper_run(args)  # a run pretrained with --paper-run: --paper defaults to that published run
    if args.command in ("profile", "ablate", "cycle"):
        _check_paper(args)
    return COMMANDS[args.command](args)


# ------------------------------------------------------------------ the paper
def _check_paper(args) -> None:
    """--paper RUN (and --paper-padding, --paper-figure), before any work: a published run (one line naming
    the valid ones), a padding it was evaluated with, a figure path that may be written."""
    if args.paper is None:  # --paper-padding and --paper-figure need it: `check_flag_needs`
        return
    if getattr(args, "engine", None) is not None:
        raise UsageError("--paper compares a profile run here; with --engine save it (--out DIR) and compare in Python: "
                         "phaseinterp.paper.compare(PhaseProfile.load(DIR), RUN)")
    if args.command == "cycle" and args.score == "unit":
        raise UsageError("--paper compares the profile score (the paper's statistic is per shift on the whole profile); "
                         "drop --score unit or --paper")
    if args.command == "cycle":  # the gate-cycling runs (kvc_w12s12_4kv has no other published data)
        if args.paper_padding not in (None, "prefix"):
            raise UsageError(f"--paper-padding {args.paper_padding}: the published gate cycling is under prefix "
                             "padding; drop --paper-padding or give prefix")
        paper_module.cycling(args.paper)  # a bad name: one line naming the published gate-cycling runs
    else:
        run = paper_module.resolve(args.paper)  # a bad name: one line naming the valid ones
        if args.command == "ablate":
            paper_module.knockout(run, args.paper_padding)
        else:
            paper_module.profile(run, args.paper_padding, n_permutations=1)
    if args.paper_figure is not None:
        figure_targets(args.paper_figure, overwrite=args.overwrite, name="--paper-figure")


def _print_paper(args, result) -> None:
    """The result beside the published run ``--paper`` (`phaseinterp.paper.compare`): the table, its notes,
    and (--paper-figure) the figure."""
    comparison = paper_module.compare(result, args.paper, args.paper_padding)
    table = comparison.to_frame().set_index("model").T
    print(f"\nbeside the paper's {comparison.run} ({comparison.padding}; {comparison.kind}"
          + (f", {comparison.modulus} residues, {comparison.fold} phases" if comparison.kind == "profile" else "") + "):")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    for note in comparison.notes:
        print(f"  note: {note}")
    if args.paper_figure is not None:
        for path in save(comparison.plot(), args.paper_figure, overwrite=args.overwrite, name="--paper-figure"):
            print(f"wrote {path}")


def _cmd_paper(args) -> int:
    """``phaseinterp paper --out DIR``: every figure of the paper's published numbers (or --list: the runs)."""
    if args.list:
        runs = paper_module.runs()
        print(runs[["id", "name", "kind", "W", "S", "kv_heads", "mean_pct", "gap_pp"]].to_string(index=False))
        return 0
    if args.out is None:
        raise UsageError("paper needs --out DIR (a new or empty folder for the figures), or --list")
    written = write_paper_figures(args.out, static=not args.no_static, overwrite=args.overwrite)
    print(f"wrote {written['figures']} figures ({'HTML and PNG' if not args.no_static else 'HTML'}) and index.html "
          f"to {written['out']}; check the page with: phaseinterp check-report {written['out']}")
    return 0


# ------------------------------------------------------------------ reports
def _cmd_demo(args) -> int:
    """``phaseinterp demo``: the report for a shipped zoo model and its full-attention twin."""
    keep_freed_memory()
    if args.model not in zoo.available():
        raise UsageError(f"--model {args.model!r} is not a shipped zoo model (shipped: "
                         f"{', '.join(zoo.available())}); use `phaseinterp report DIR` for a checkpoint")
    return _write_report(args)


def _cmd_report(args) -> int:
    """``phaseinterp report MODEL --out DIR``: the report for any model."""
    keep_freed_memory()
    check_source(args.model, name="MODEL")
    return _write_report(args)


def _write_report(args) -> int:
    """The report of demo and report: their sections' options checked, then `build_report`."""
    twin = None if (args.twin in (None, "none")) else args.twin
    if twin is not None:
        check_source(twin, name="--twin")
        try:
            report_module.check_twin(args.model, twin)
        except ValueError as err:
            if "model itself" not in str(err):  # a compressed twin or another backbone: the check's own words
                raise UsageError(f"--twin {twin}: {err}") from None
            raise UsageError(f"--twin {twin} is the model itself ({args.model}): a model is never its own twin; "
                             "pass a different model as --twin (a full-attention twin), or --twin none") from None
    report_module.check_report_dir(args.out, args.overwrite)
    dsv4 = getattr(args, "deepseek_v4", None)
    dsv4 = None if dsv4 in (None, "none") else dsv4
    if dsv4 is not None:
        if dsv4 not in hf_zoo.available():
            raise UsageError(f"--deepseek-v4 {dsv4!r} is not a shipped HF DeepSeek-V4 zoo model (shipped: "
                             f"{', '.join(hf_zoo.available()) or 'none'}; 'none' skips the section)")
        if importlib.util.find_spec("transformers") is None:
            raise UsageError(f"--deepseek-v4 {dsv4!r} needs Hugging Face transformers (the 'hf' extra: "
                             "pip install -e '.[hf]'); '--deepseek-v4 none' skips the section")
    remedy = getattr(args, "remedy", None)
    remedy = None if remedy in (None, "none") else remedy
    if remedy is not None:
        try:
            check_remedy(remedy)
        except ValueError as err:
            raise UsageError(f"--remedy: {err}; '--remedy none' skips the section") from None
    settings = (report_module.ReportSettings.quick() if args.quick else report_module.ReportSettings.full()
                if args.full else report_module.ReportSettings())
    settings.export_static = not args.no_static
    rep = report_module.build_report(args.model, args.out, twin=twin, settings=settings,
                                     device=getattr(args, "device", None), deepseek_v4=dsv4,
                                     remedy=remedy, overwrite=args.overwrite)
    print(rep.table())
    sections = rep.summary.get("section_seconds", {})
    print("\nseconds per section: " + ", ".join(f"{name} {sec:.1f}" for name, sec in sections.items()))
    print(f"report written to {Path(args.out).resolve() / 'index.html'} in {rep.seconds:.0f} s")
    return 0


def _cmd_check_report(args) -> int:
    """``phaseinterp check-report DIR``: render a written report in headless Chromium and list what
    is wrong (`phaseinterp.report.check`); exit 1 when something is."""
    result = report_check.check_page(args.dir)
    found = report_check.problems(result)
    print("\n".join(found) or f"ok: {len(result['figures'])} figures drew, nothing overflows, no None/nan/[] texts")
    return 1 if found else 0


def _cmd_screenshot(args) -> int:
    """``phaseinterp screenshot DIR PNG``: the first screen of a written report as a PNG."""
    print(f"wrote {report_check.first_screen_png(args.dir, args.png, overwrite=args.overwrite)}")
    return 0


# ------------------------------------------- experiments on one loaded model
def _load_for_experiment(args):
    """(model, task) for profile / ablate / cycle / gates: the model's name and the settings that
    depend on its config checked before the weights load, then the launch (--shard-dir, torchrun)."""
    check_source(args.model, name="MODEL")
    _preflight(args)
    if getattr(args, "shard_dir", None) is not None or "WORLD_SIZE" in os.environ:
        launch = parallel.launch_info()
        if launch.world_size > 1 and args.shard_dir is None:
            raise UsageError(f"{args.command} runs in {launch.world_size} processes: pass --shard-dir DIR "
                             "(each process writes its prompts' results there; process 0 merges them)")
        if args.shard_dir is not None:
            check_write_target(args.shard_dir, "shard folder", overwrite=True, name="--shard-dir",
                               flag="the same run's shard folder", staged=False)  # a previous run is resumed
        if launch.world_size > 1 and args.device in (None, "cuda"):
            args.device = str(parallel.rank_device(launch))  # one GPU per process
    model = loading.load(args.model, device=args.device)
    if getattr(args, "query_chunk", None) is not None:
        if not hasattr(model, "set_query_chunk"):
            raise UsageError(f"--query-chunk: {args.model!r} is not a phaseinterp CompressedTransformer")
        model.set_query_chunk(args.query_chunk)
    task = resolve_task(model)
    if getattr(args, "paper", None) is not None and args.command in ("profile", "ablate"):
        # a published run with no common fold is refused before the experiment, not after it
        paper_module.check_fold(task.residue_modulus, phase_model(model).stride, args.paper, what=repr(args.model),
                                kind="knockout" if args.command == "ablate" else "profile")
    return model, task


def _finish(args, result) -> int:
    """Print a result's summary and save it to --out; a sharded run's other processes (no result)
    only exit, their prompts being in the shards."""
    if result is None:
        return 0
    print(result.summary().to_string(header=False))
    _print_premise(result)
    _save(args.out, result, args.overwrite)
    if getattr(args, "paper", None) is not None:
        _print_paper(args, result)
    return 0


def _print_premise(result) -> None:
    """Each failed premise of the experiment, in full, after its table (stdout, where the numbers
    are), and one line on stderr so a pipeline that keeps only stdout's numbers still hears of it.
    The exit code stays 0: the run did what was asked, and the result records why it is no evidence."""
    notes = getattr(result, "premise_notes", ())
    if not notes:
        return
    print(f"PREMISE FAILS ({len(notes)}): these numbers are not evidence for the experiment's claim")
    for note in notes:
        print(f"  - {note}")
    print(f"phaseinterp: premise fails: {notes[0]}" + (f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""),
          file=sys.stderr)


def _cmd_profile(args) -> int:
    """``phaseinterp profile``: accuracy by residue and phase, in process or (--engine) of a served model."""
    keep_freed_memory()
    if args.engine is not None or args.model is None:
        return served_profile(args)
    model, task = _load_for_experiment(args)
    if args.padding:
        task = replace(task, padding=args.padding)
    _check_own_stride(args.stride, model.cfg)
    _check_task(args, task, args.spec.stride_of(model))
    spec = args.spec.replace(label=args.label or report_module.model_label(model))
    if args.shard_dir is not None:
        if args.axis != "target":
            raise UsageError(f"--axis {args.axis} is not sharded yet (--shard-dir runs the target axis); drop one")
        result = sharded_profile(model, task, out_dir=args.shard_dir, chunk_size=args.chunk_size, spec=spec)
    else:
        result = phase_profile(model, task, spec=spec)
    return _finish(args, result)


def _cmd_lm_eval_task(args) -> int:
    """``phaseinterp lm-eval-task MODEL --out DIR``: MODEL's task as an lm-evaluation-harness task folder."""
    check_source(args.model, name="MODEL")
    out = write_lm_eval_task(args.model, args.out, n_per_residue=args.n_per_residue, seed=args.seed, name=args.name,
                             overwrite=args.overwrite)
    name = next(out.glob("*.yaml")).stem
    print(f"wrote lm-eval task {name!r} to {out}; run it with\n"
          f"  lm_eval --model hf --model_args pretrained=MODEL_DIR --include_path {out} --tasks {name} "
          f"--log_samples --output_path OUT\nand read it with phaseinterp.profile_from_lm_eval(OUT)")
    return 0


def _cmd_ablate(args) -> int:
    """``phaseinterp ablate MODEL``: per-KV-head (or per-layer) mean replacement."""
    keep_freed_memory()
    model, task = _load_for_experiment(args)
    _check_task(args, task)
    if args.shard_dir is not None:
        result = sharded_ablate(model, task, out_dir=args.shard_dir, chunk_size=args.chunk_size, spec=args.spec)
        if result is None:  # not process 0: its prompts are in the shards
            return 0
    else:
        result = ablate(model, task, spec=args.spec)
    print("relative change of accuracy, % of the clean accuracy, per (layer, kv_head) x phase:")
    print(result.relative_change.round(1).to_string())
    return _finish(args, result)


def _cmd_cycle(args) -> int:
    """``phaseinterp cycle MODEL``: cyclic gate shifts, the profile score or (--score unit) one unit's."""
    keep_freed_memory()
    model, task = _load_for_experiment(args)
    _check_task(args, task)
    if args.score == "unit":
        result = gate_cycling_unit(model, task, spec=args.spec)
        print(f"unit {result.unit}: contribution per shift x phase ({args.measure}):")
        print(result.contribution().round(3).to_string())
        print(result.identification().round(3).to_string())
        return _finish(args, result)
    if args.shard_dir is not None:
        result = sharded_gate_cycling_profile(model, task, out_dir=args.shard_dir, chunk_size=args.chunk_size,
                                              spec=args.spec)
        if result is None:  # not process 0: its prompts are in the shards
            return 0
    else:
        result = gate_cycling_profile(model, task, spec=args.spec, baseline=getattr(args, "baseline_profile", None))
    print("accuracy per shift x phase:")
    print(result.phase_accuracy().round(3).to_string())
    return _finish(args, result)


def _cmd_gates(args) -> int:
    """``phaseinterp gates MODEL``: where each compressor gate puts its weight."""
    keep_freed_memory()
    model, task = _load_for_experiment(args)
    result = gate_profile(model, task, spec=args.spec)
    print(result.heads.round(3).to_string(index=False))
    return _finish(args, result)


def _cmd_merge(args) -> int:
    """``phaseinterp merge DIR``: a sharded run's result rebuilt from its shard files."""
    keep_freed_memory()
    return _finish(args, merge(args.dir))


def _cmd_conformance(args) -> int:
    """``phaseinterp conformance MODEL``: `phaseinterp.engines.conformance`."""
    keep_freed_memory()
    check_source(args.model, name="MODEL")
    _preflight(args)
    model = loading.load(args.model, device=args.device)
    result = conformance(model, resolve_task(model), spec=args.spec)
    columns = ["setting", "kind", "phase", "n", "max_abs_diff", "mean_abs_diff", "agreement", "accuracy_diff",
               "accuracy_diff_lower", "accuracy_diff_upper", "statistic", "tolerance", "passed"]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(result.table[columns].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print()
    return _finish(args, result)


# ------------------------------------------------------------------- the zoo and training
def _cmd_zoo(args) -> int:
    """``phaseinterp zoo list | build | export``."""
    return ZOO_COMMANDS[args.zoo_command](args)


def _zoo_list(args) -> int:
    if args.markdown:
        print(zoo_markdown())
        return 0
    for name, shipped, description, command in zoo.catalog():
        status = "shipped" if shipped else "recipe only"
        print(f"{name:24s} {status:12s} {description}\n{'':24s} {'':12s} rebuild: {command}")
    return 0


def _zoo_build(args) -> int:
    """``phaseinterp zoo build NAME``: either family's recipe, trained and installed."""
    keep_freed_memory()
    if args.name in hf_zoo.RECIPES:  # the HF-format DeepSeek-V4s train with their own loop, on the CPU
        if args.device is not None and check_device(args.device).type != "cpu":
            raise UsageError(f"--device {args.device}: the HF DeepSeek-V4 recipes ({', '.join(hf_zoo.RECIPES)}) train "
                             "on the CPU only (--threads 1 reproduces the shipped checkpoint bit for bit); drop "
                             "--device, or pass --device cpu")
        source = hf_zoo.build(args.name, args.out_dir, install=not args.no_install, threads=args.threads,
                              steps=args.steps)
        print(f"built {args.name}: {source}")
        return 0
    zoo.entry(args.name)
    if args.steps is not None:
        raise UsageError(f"--steps shortens an HF DeepSeek-V4 recipe ({', '.join(hf_zoo.RECIPES)}) only; "
                         f"`phaseinterp train --zoo-recipe {args.name} --steps N --out DIR` trains {args.name}'s "
                         "recipe for N steps")
    source = zoo.build(args.name, args.out_dir, device=args.device, install=not args.no_install,
                       threads=args.threads)
    print(f"built {args.name}: snapshot {source}")
    return 0


def _zoo_export(args) -> int:
    """``phaseinterp zoo export NAME --layout deepseek [--fp8 [--fp8-scales pow2|exact]] [--experts fp4|fp8|float] --out DIR`
    (every argument checked before loading)."""
    keep_freed_memory()
    shipped = hf_zoo.available()
    if args.name not in shipped:
        raise UsageError(f"zoo export: {args.name!r} is not a shipped HF DeepSeek-V4 zoo model (valid: {shipped})")
    if args.layout not in EXPORT_LAYOUTS:
        raise UsageError(f"--layout {args.layout!r} is not supported (valid: {', '.join(EXPORT_LAYOUTS)})")
    if args.fp8_scales is not None and args.fp8_scales not in FP8_SCALES:
        raise UsageError(f"--fp8-scales {args.fp8_scales!r} is not supported (valid: {', '.join(FP8_SCALES)})")
    if args.fp8_scales is not None and not args.fp8:
        raise UsageError("--fp8-scales needs --fp8 (only FP8 weights have block scales)")
    if args.experts is not None and args.experts not in EXPERT_FORMATS:
        raise UsageError(f"--experts {args.experts!r} is not supported (valid: {', '.join(EXPERT_FORMATS)})")
    if args.experts == "fp8" and not args.fp8:
        raise UsageError("--experts fp8 needs --fp8 (FP8 expert blocks are part of an FP8 export)")
    dtypes = {"float32": "float32", "bfloat16": "bfloat16"}
    if args.dtype is not None and args.dtype not in dtypes:
        raise UsageError(f"--dtype {args.dtype!r} is not supported (valid: {', '.join(dtypes)})")
    try:
        parse_size(args.max_shard_size, "--max-shard-size")
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = check_write_target(args.out, "Hugging Face checkpoint", overwrite=args.overwrite, name="--out")

    model = hf_zoo.load(args.name)
    result = hf_export.export_release(model, out, fp8=args.fp8, fp8_scales=args.fp8_scales or DEFAULT_FP8_SCALES,
                            layout=args.layout, max_shard_bytes=args.max_shard_size, overwrite=args.overwrite, experts=args.experts,
                            dtype=None if args.dtype is None else getattr(torch, dtypes[args.dtype]))
    fp8 = f", FP8 ({args.fp8_scales or DEFAULT_FP8_SCALES} scales)" if args.fp8 else ""
    print(f"exported {args.name} ({args.layout} layout{fp8}): {result}")
    return 0


def _cmd_train(args) -> int:
    """``phaseinterp train --out DIR``: a model trained from scratch with a zoo recipe, changed by the options."""
    keep_freed_memory()
    e = zoo.entry(args.zoo_recipe or "w4s4")
    task = e.task_object()
    changes = {k: v for k, v in dict(window=args.window, stride=args.stride, gate=args.gate,
                                      n_layers=args.n_layers, n_kv_heads=args.n_kv_heads).items() if v is not None}
    if args.compression is not None:
        changes["compression"] = None if args.compression == "none" else args.compression
        if args.compression == "deepseek" and args.gate is None:
            changes["gate"] = "vector"
    if task.residue_modulus % changes.get("stride", e.compression.get("stride", 1)):
        stride = changes.get("stride", e.compression.get("stride"))
        divisors = [d for d in range(1, task.residue_modulus + 1) if task.residue_modulus % d == 0]
        raise UsageError(f"--stride {stride} does not divide the task's R={task.residue_modulus}: the model could "
                         f"not be profiled by phase (valid strides: {divisors})")
    config = e.model_config(task.vocab.size).replace(**changes)
    final = Path(args.out) / "final"
    if args.resume and not (Path(args.out) / "checkpoints" / "LATEST").is_file():
        raise UsageError(f"--resume: --out {args.out!r} holds no run to resume (no checkpoints/LATEST); drop --resume "
                         "to start a new run there")
    if not args.resume and (Path(args.out) / "checkpoints" / "LATEST").is_file():
        raise UsageError(f"--out {args.out!r} already holds a run; pass --resume to continue it or choose a new --out")
    result = training.train(config, task, train_config=e.train_config(), steps=args.steps, batch_size=args.batch_size,
                   lr=args.lr, seed=args.seed, device=args.device, out_dir=args.out, resume=args.resume)
    result.model.save_pretrained(final, overwrite=args.resume)  # a resumed run writes its final model again
    print(f"trained {result.model.cfg.label}: final loss {result.log.loss.iloc[-1]:.4f}; model saved to {final}")
    return 0




# ------------------------------------------------------------------- pretraining
def _parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise UsageError(f"--set {text!r} is not FIELD=VALUE (e.g. --set stride=8, --set compression=none)")
    key, value = (part.strip() for part in text.split("=", 1))
    if value.lower() in ("none", "null"):
        return key, None
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _pretrain_settings(args):
    """The architecture and recipe a `pretrain` command asks for: --config, then --set and the flags."""
    file = {}
    if args.config is not None:
        try:  # the readers' door has judged the path (`READ_PATHS`)
            file = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as err:
            raise UsageError(f"--config {args.config!r} is not a readable JSON file ({err})") from None
        if not isinstance(file, dict) or set(file) - {"model", "train"}:
            raise UsageError(f'--config {args.config!r} must be a JSON object with "model" and/or "train" entries '
                             f"(found: {sorted(file) if isinstance(file, dict) else type(file).__name__})")
    paper_run, paper_model, paper_train = paper_run_settings(args, file)  # --paper-run (or None, None, {})
    model = dict(file.get("model", {})) if paper_run is None else paper_model
    model.update(dict(_parse_override(t) for t in args.overrides))
    if args.tokenizer is not None:
        model.setdefault("d_vocab", TextTokenizer(args.tokenizer).vocab_size)
    # the recipe's base: the run's own record on --resume (its execution settings aside), else the preset's
    base = {**preset_recipe(args.preset or PAPER_BACKBONE), **paper_train}
    record = Path(args.out) / RUN_FILE if args.out is not None else None
    if args.resume and record is not None and record.is_file():
        try:
            recorded = json.loads(record.read_text()).get("train", {})
        except (OSError, ValueError):
            recorded = {}
        base = {k: v for k, v in recorded.items() if k not in EXECUTION_FIELDS}
    flags = dict(seq_len=args.seq_len, global_batch=args.global_batch, micro_batch=args.micro_batch, steps=args.steps,
                 seed=args.seed, lr=args.lr, needle_fraction=args.needle_fraction, max_minutes=args.max_minutes,
                 keep_every=args.keep_every)
    train = {**base, **file.get("train", {}), **{k: v for k, v in flags.items() if v is not None}}
    if args.activation_checkpointing:
        train["activation_checkpointing"] = True
    if args.compile:
        train["compile"] = True
    if args.bf16:
        train.update(bf16=True, cpu_bf16=True)
    if args.fp32:
        train.update(bf16=False, cpu_bf16=False)
    tc = PretrainConfig.from_dict(train)
    config = preset(args.preset or PAPER_BACKBONE, **model)
    if config.n_ctx < tc.seq_len and "n_ctx" not in model:
        config = config.replace(n_ctx=tc.seq_len)
    config = config.replace(seed=tc.seed)
    return config, tc


def _cmd_pretrain(args) -> int:
    """``phaseinterp pretrain``: every check and the tokenized corpus in this process, then the run here
    (one process, or this is a torchrun worker) or under torchrun (``--nproc K``)."""
    if args.resume and not args.plan and args.out is not None and "LOCAL_RANK" not in os.environ \
            and not (Path(args.out) / RUN_FILE).is_file():
        raise UsageError(f"--resume: --out {args.out!r} holds no run to resume (no {RUN_FILE}); drop --resume to start "
                         "a new run there")
    config, tc = _pretrain_settings(args)
    if args.plan:
        return _pretrain_plan(args, config, tc)
    for flag, value in (("--data", args.data), ("--tokenizer", args.tokenizer), ("--out", args.out)):
        if value is None:
            raise UsageError(f"pretrain needs {flag} (only --plan runs without --data, --tokenizer and --out)")
    worker = "LOCAL_RANK" in os.environ
    if not worker:
        check_nproc(args.nproc)
        if tc.global_batch % args.nproc:
            raise UsageError(f"--global-batch {tc.global_batch} is not divisible by --nproc {args.nproc}")
        prepare(config, args.data, args.tokenizer, tc, args.out, resume=args.resume, paper_run=args.paper_run and
                paper_module.resolve(args.paper_run))
    if args.nproc > 1 and not worker:
        argv, skip = [], False
        for a in sys.argv[1:]:  # the workers know their count from torchrun (and torchrun would read --nproc)
            if skip or a.startswith("--nproc="):
                skip = False
                continue
            if a == "--nproc":
                skip = True
                continue
            argv.append(a)
        if "--resume" not in argv:
            argv.append("--resume")  # the settings were checked and recorded above; the workers continue them
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                   "-m", "phaseinterp", *argv]
        return subprocess.call(command)
    keep_freed_memory()
    # prepare() has checked and recorded the settings (here, or in the process that launched the workers)
    result = pretrain(config, args.data, args.tokenizer, tc, out_dir=args.out, resume=True)
    if result.model is not None and len(result.curves):
        save(pretrain_curves(result.curves), Path(args.out) / "curves.html", overwrite=True)  # the run's own figure
        last = result.curves.iloc[-1]
        print(f"pretrained {config.label}: step {int(last.step)}, {int(last.tokens):,} tokens, loss {last.loss:.4f}; "
              f"the folder {args.out} loads with phaseinterp.load and profiles with `phaseinterp profile {args.out}`")
    return 0


def _pretrain_plan(args, config, tc) -> int:
    """``phaseinterp pretrain --plan``: the per-device memory of the run asked for (`plan_memory`), for
    --nproc devices (not this machine's: a GPU run is planned from a CPU machine); exits 2 when it does not fit."""
    plan = plan_memory(config, tc, nproc=args.nproc, device_gib=args.device_memory)
    what = args.preset if args.paper_run is None else f"paper run {paper_module.resolve(args.paper_run)}"
    print(f"plan: {config.label}, {what} (d_vocab {config.d_vocab:,}); lr {tc.lr:g}, warm-up "
          f"{tc.warmup_steps} steps, {tc.steps:,} steps of {tc.global_batch} x {tc.seq_len} tokens "
          f"({tc.steps * tc.global_batch * tc.seq_len / 1e6:,.0f}M tokens)")
    print(plan.table())
    if not plan.fits:
        print(f"pretrain --plan: the run needs {plan.total / 2**30:.1f} GiB per device, more than "
              f"{plan.usable / 2**30:.1f} GiB usable of {plan.device_bytes / 2**30:.1f}; {plan.advice}", file=sys.stderr)
        return 2
    return 0


def _cmd_tokenizer(args) -> int:
    out = train_tokenizer(args.data, args.vocab_size, args.out, overwrite=args.overwrite)
    print(f"wrote {out / 'tokenizer.json'}")
    return 0


# ------------------------------------------------------------------- DeepSeek-V4 sizes and experiments
def _check_deepseek_v4_config(config: Optional[str]) -> None:
    """memory-plan's CONFIG: a readable DeepSeek-V4 config.json (or a folder holding one); another
    model's config would otherwise be read as DeepSeek-V4's defaults plus unused fields."""
    if config is None:
        return
    path = Path(config)  # the readers' door has judged it (`READ_PATHS`): a file, or a folder with something in it
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise UsageError(f"CONFIG={config!r} is a folder without config.json; pass a DeepSeek-V4 config.json or a "
                         "checkpoint folder holding one")
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{path} is not a JSON config ({err})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type != "deepseek_v4":
        raise UsageError(f"{path}: model_type={model_type!r} is not a DeepSeek-V4 config (memory-plan counts "
                         "model_type='deepseek_v4' only)")


def _cmd_memory_plan(args) -> int:
    """``phaseinterp memory-plan [CONFIG]``: parameter counts and weight memory of a DeepSeek-V4 config
    (`phaseinterp.models.hf.memory.estimate_memory`), with --tokens also the devices one forward and one
    ablation need (`memory_plan`); from config.json alone, no weights read."""
    _check_deepseek_v4_config(args.config)
    bad = [n for n in args.tokens or () if n < 1]
    if bad:
        raise UsageError(f"--tokens {bad[0]} must be >= 1 (a prompt length in tokens)")
    if importlib.util.find_spec("transformers") is None:
        raise UsageError("memory-plan needs Hugging Face transformers (the 'hf' extra: pip install -e '.[hf]')")
    print(hf_memory.format_estimate(hf_memory.estimate_memory(args.config)))
    if args.tokens:
        print()
        with pd.option_context("display.width", 200):
            print(pd.DataFrame(hf_memory.memory_plan(args.config, tuple(args.tokens))).round(3).to_string(index=False))
    return 0


def _cmd_experiments(args) -> int:
    """``phaseinterp experiments EXPERIMENT ...``: the studies of `phaseinterp.experiments`."""
    return EXPERIMENTS[args.experiment](args)


def _experiments_remedy(args) -> int:
    """``phaseinterp experiments remedy RUNS STOP W/N [SEED ...]``: one worker's share of the remedy's
    twin runs (`phaseinterp.experiments.remedy.train_share`), one thread; runs resume where they stopped."""
    torch.set_num_threads(1)
    worker, n_workers = args.share
    architecture = {k: v for k, v in (("n_kv_heads", args.kv_heads), ("payload", args.payload)) if v is not None}
    try:
        remedy_module.train_share(args.runs, args.stop, worker, n_workers, tuple(args.seeds), offsets=args.offsets,
                    architecture=architecture or None)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return 0


ZOO_COMMANDS = {"list": _zoo_list, "build": _zoo_build, "export": _zoo_export}
EXPERIMENTS = {"remedy": _experiments_remedy}

# Every ``phaseinterp`` subcommand (`phaseinterp.cli.args.build_parser`) and the function that runs it.
COMMANDS = {
    "demo": _cmd_demo, "report": _cmd_report, "check-report": _cmd_check_report, "screenshot": _cmd_screenshot,
    "profile": _cmd_profile, "ablate": _cmd_ablate, "cycle": _cmd_cycle, "gates": _cmd_gates, "merge": _cmd_merge,
    "conformance": _cmd_conformance, "train": _cmd_train, "zoo": _cmd_zoo, "memory-plan": _cmd_memory_plan,
    "experiments": _cmd_experiments, "pretrain": _cmd_pretrain, "tokenizer": _cmd_tokenizer,
    "lm-eval-task": _cmd_lm_eval_task, "paper": _cmd_paper,
}
