"""``phaseinterp``: the command line. Every subcommand mirrors a Python function.

    phaseinterp demo    [--model NAME] [--out DIR] [--quick]      -> phaseinterp.report.build_report
    phaseinterp profile MODEL [--n-per-residue N] [--out DIR]     -> phaseinterp.phase_profile
    phaseinterp ablate  MODEL [--layer L ...] [--scope ...]       -> phaseinterp.ablate
    phaseinterp cycle   MODEL [--shifts ...]                      -> phaseinterp.gate_cycling
    phaseinterp gates   MODEL                                     -> phaseinterp.gate_profile
    phaseinterp report  MODEL [--twin MODEL] --out DIR            -> phaseinterp.report.build_report
    phaseinterp train   --out DIR [architecture and run options]  -> phaseinterp.train.train
    phaseinterp zoo list [--markdown] | build NAME                -> phaseinterp.zoo
    phaseinterp merge DIR [--out DIR]                             -> phaseinterp.distributed.merge

profile, ablate and cycle also run data-parallel under ``torchrun --nproc-per-node N -m
phaseinterp ... --shard-dir DIR`` (phaseinterp.distributed).

MODEL is a zoo name (``phaseinterp zoo list``) or a checkpoint directory. Bad arguments
exit with code 2 and a one-line message naming the value, checked before any expensive
work and before anything is written. This module imports only the standard library at
the top, so ``--help`` answers at once; torch and plotly load when a command runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from phaseinterp.cli_args import (  # noqa: F401  (re-exported: the public import path)
    N_PER_RESIDUE_HELP, _device_arg, _model_arg, _non_negative, _out_arg, _Parser, _positive, _positive_float,
    _scale_args, build_parser)


class UsageError(ValueError):
    """Bad user input: reported in one line, exit code 2."""


# ------------------------------------------------------------------- the zoo
def zoo_rows() -> list[tuple[str, str, str]]:
    """(name, status, description) for every zoo entry; status is "shipped" or "recipe only"."""
    from phaseinterp import zoo

    shipped = set(zoo.available())
    return [(name, "shipped" if name in shipped else "recipe only", e.description) for name, e in zoo.ENTRIES.items()]


def zoo_markdown() -> str:
    """The README's zoo table (tests check that README.md contains exactly this)."""
    lines = ["| name | checkpoint | what |", "|---|---|---|"]
    for name, status, description in zoo_rows():
        lines.append(f"| `{name}` | {status} | {description.replace('|', '/')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- checks
def _check_out(args) -> None:
    from phaseinterp._files import check_output_dir

    for attr in ("out", "out_dir"):
        value = getattr(args, attr, None)
        if value is not None:
            check_output_dir(value)


def _check_model_name(name: str) -> None:
    """A zoo name with a shipped checkpoint or a checkpoint directory; checked before any work."""
    from phaseinterp.report import check_model_source

    check_model_source(name)


def _check_placement(task, n_per_residue: int) -> None:
    """Refuse sizes the task cannot moment-match (or too large) before generating anything."""
    from phaseinterp._checks import check_n_per_residue

    check_n_per_residue(n_per_residue, task.residue_modulus)
    if hasattr(task, "placement"):
        task.placement(n_per_residue, strict=True)


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    text = re.sub(r"\s*\(or pass strict=False[^)]*\)", "", text)  # the CLI has no such flag
    text = re.sub(r"\s*\(valid: \[[^\]]{200,}\]\)", "", text)
    return " ".join(text.split())


def _user_errors() -> tuple[type, ...]:
    errors: list[type] = [ValueError, OSError, UsageError]
    models = sys.modules.get("phaseinterp.models.transformer")
    if models is not None:
        errors.append(models.CheckpointError)
    export = sys.modules.get("phaseinterp.plot.export")
    if export is not None:
        errors.append(export.ExportError)
    return tuple(errors)


# ------------------------------------------------------------------ commands
def _print_table(result) -> None:
    print(result.summary().to_string(header=False))


def _save(out: Optional[str], result) -> None:
    if out:
        print(f"saved to {result.save(Path(out))}")


def _run(args) -> int:
    _check_out(args)
    if getattr(args, "device", None) is not None:
        from phaseinterp._checks import check_device

        check_device(args.device)
    if args.command == "zoo":
        return _zoo(args)
    if args.command == "train":
        return _train(args)
    if args.command == "merge":
        from phaseinterp.distributed import merge

        result = merge(args.dir)
        _print_table(result)
        _save(args.out, result)
        return 0
    if args.command in ("demo", "report"):
        from phaseinterp import report as report_module

        twin = None if (args.twin in (None, "none")) else args.twin
        if args.command == "demo":
            from phaseinterp import zoo

            if args.model not in zoo.available():
                raise UsageError(f"--model {args.model!r} is not a shipped zoo model (shipped: "
                                 f"{', '.join(zoo.available())}); use `phaseinterp report DIR` for a checkpoint")
        else:
            _check_model_name(args.model)
        if twin is not None:
            _check_model_name(twin)
        dsv4 = getattr(args, "deepseek_v4", None)
        dsv4 = None if dsv4 in (None, "none") else dsv4
        if dsv4 is not None:
            from phaseinterp.zoo import deepseek_v4 as hf_zoo

            if dsv4 not in hf_zoo.available():
                raise UsageError(f"--deepseek-v4 {dsv4!r} is not a shipped HF DeepSeek-V4 zoo model (shipped: "
                                 f"{', '.join(hf_zoo.available()) or 'none'}; 'none' skips the section)")
            import importlib.util

            if importlib.util.find_spec("transformers") is None:
                raise UsageError(f"--deepseek-v4 {dsv4!r} needs Hugging Face transformers (the 'hf' extra: "
                                 "pip install -e '.[hf]'); '--deepseek-v4 none' skips the section")
        remedy = getattr(args, "remedy", None)
        remedy = None if remedy in (None, "none") else remedy
        if remedy is not None:
            from phaseinterp.report_remedy import check_remedy

            try:
                check_remedy(remedy)
            except ValueError as err:
                raise UsageError(f"--remedy: {err}; '--remedy none' skips the section") from None
        settings = report_module.ReportSettings.quick() if args.quick else report_module.ReportSettings()
        settings.export_static = not args.no_static
        rep = report_module.build_report(args.model, args.out, twin=twin, settings=settings,
                                         device=getattr(args, "device", None), deepseek_v4=dsv4,
                                         remedy=remedy)
        print(rep.table())
        print(f"\nreport written to {Path(args.out).resolve() / 'index.html'} in {rep.seconds:.0f} s")
        return 0

    _check_model_name(args.model)
    from phaseinterp import report as report_module
    from phaseinterp.tasks import resolve_task

    if getattr(args, "shard_dir", None) is not None or "WORLD_SIZE" in os.environ:
        from phaseinterp import distributed

        launch = distributed.launch_info()
        if launch.world_size > 1 and args.shard_dir is None:
            raise UsageError(f"{args.command} runs in {launch.world_size} processes: pass --shard-dir DIR "
                             "(each process writes its prompts' results there; process 0 merges them)")
        if args.shard_dir is not None:
            _check_out(argparse.Namespace(out=args.shard_dir))
        if launch.world_size > 1 and args.device in (None, "cuda"):
            args.device = str(distributed.rank_device(launch))  # one GPU per process
    model = report_module.load_model(args.model, args.device)
    if getattr(args, "query_chunk", None) is not None:
        if not hasattr(model, "set_query_chunk"):
            raise UsageError(f"--query-chunk: {args.model!r} is not a phaseinterp CompressedTransformer")
        model.set_query_chunk(args.query_chunk)
    task = resolve_task(model)
    if args.command == "profile":
        from dataclasses import replace

        from phaseinterp.profile import phase_profile

        if args.padding:
            task = replace(task, padding=args.padding)
        stride = args.stride or model.cfg.stride
        if task.residue_modulus % stride:
            divisors = [d for d in range(1, task.residue_modulus + 1) if task.residue_modulus % d == 0]
            raise UsageError(f"--stride {stride} does not divide the task's R={task.residue_modulus} "
                             f"(valid: {divisors})")
        _check_placement(task, args.n_per_residue)
        if args.shard_dir is not None:
            from phaseinterp.distributed import sharded_profile

            result = sharded_profile(model, task, args.n_per_residue, out_dir=args.shard_dir, seed=args.seed,
                                     chunk_size=args.chunk_size, stride=args.stride, label=report_module._label(model))
        else:
            result = phase_profile(model, task, args.n_per_residue, seed=args.seed, stride=args.stride,
                                   label=report_module._label(model))
    elif args.command == "ablate":
        from phaseinterp.interventions import ablate

        _check_placement(task, args.n_per_residue)
        if args.shard_dir is not None:
            from phaseinterp.distributed import sharded_ablate

            result = sharded_ablate(model, task, out_dir=args.shard_dir, chunk_size=args.chunk_size, layer=args.layer,
                                    scope=args.scope, n_per_residue=args.n_per_residue,
                                    n_calibration=args.n_calibration, method=args.method)
            if result is None:  # not process 0: its prompts are in the shards
                return 0
        else:
            result = ablate(model, task, layer=args.layer, scope=args.scope, n_per_residue=args.n_per_residue,
                            n_calibration=args.n_calibration, method=args.method)
        print("relative change of accuracy, % of the clean accuracy, per (layer, kv_head) x phase:")
        print(result.relative_change.round(1).to_string())
    elif args.command == "cycle":
        from phaseinterp.interventions import gate_cycling

        _check_placement(task, args.n_per_residue)
        if args.shard_dir is not None:
            from phaseinterp.distributed import sharded_gate_cycling

            result = sharded_gate_cycling(model, task, args.shifts, out_dir=args.shard_dir, chunk_size=args.chunk_size,
                                          layers=args.layer, branch=args.branch, n_per_residue=args.n_per_residue)
            if result is None:  # not process 0: its prompts are in the shards
                return 0
        else:
            result = gate_cycling(model, task, args.shifts, layers=args.layer, branch=args.branch,
                                  n_per_residue=args.n_per_residue)
        print("accuracy per shift x phase:")
        print(result.phase_accuracy().round(3).to_string())
    else:  # gates
        from phaseinterp._checks import check_n_per_residue
        from phaseinterp.interventions import gate_profile

        check_n_per_residue(args.n_per_residue, task.residue_modulus)
        result = gate_profile(model, task, n_per_residue=args.n_per_residue)
        print(result.heads.round(3).to_string(index=False))
    if result is None:  # a sharded profile on a process other than 0
        return 0
    _print_table(result)
    _save(args.out, result)
    return 0


def _zoo(args) -> int:
    from phaseinterp import zoo

    if args.zoo_command == "list":
        if args.markdown:
            print(zoo_markdown())
            return 0
        for name, status, description in zoo_rows():
            print(f"{name:24s} {status:12s} {description}\n{'':24s} {'':12s} rebuild: {zoo.ENTRIES[name].command}")
        return 0
    zoo.entry(args.name)
    source = zoo.build(args.name, args.out_dir, device=args.device, install=not args.no_install,
                       threads=args.threads)
    print(f"built {args.name}: snapshot {source}")
    return 0


def _train(args) -> int:
    from phaseinterp import zoo

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
    if not args.resume and (Path(args.out) / "checkpoints" / "LATEST").is_file():
        raise UsageError(f"--out {args.out!r} already holds a run; pass --resume to continue it or choose a new --out")
    from phaseinterp.train import train

    result = train(config, task, train_config=e.train_config(), steps=args.steps, batch_size=args.batch_size,
                   lr=args.lr, seed=args.seed, device=args.device, out_dir=args.out, resume=args.resume)
    result.model.save_pretrained(final)
    print(f"trained {result.model.cfg.label}: final loss {result.log.loss.iloc[-1]:.4f}; model saved to {final}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("phaseinterp: interrupted (checkpoints written so far are intact)", file=sys.stderr)
        return 130
    except Exception as err:
        if not isinstance(err, _user_errors()):
            raise
        print(f"phaseinterp: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
