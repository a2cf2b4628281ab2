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
import math
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

N_PER_RESIDUE_HELP = ("prompts per residue group (x R = 24 residues for the zoo task); moment matching needs 72, "
                      "77, 80 or any size from 86 for the zoo task; at most 500,000 prompts in all")


class UsageError(ValueError):
    """Bad user input: reported in one line, exit code 2."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit code 2
        self.exit(2, f"phaseinterp: error: {message}\n")


def _model_arg(p):
    p.add_argument("model", help="zoo name with a shipped checkpoint (see `phaseinterp zoo list`) or a checkpoint "
                                 "directory (config.json + model.safetensors)")
    _device_arg(p)


def _device_arg(p):
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu, cuda, cuda:1, mps (default: cpu); must exist on this machine")


def _out_arg(p, default: Optional[str] = None, required: bool = False, what: str = "the result"):
    default_text = f" (default: {default})" if default else (" (required)" if required else " (default: print only)")
    p.add_argument("--out", default=default, required=required,
                   help=f"directory to write {what} to; must be a directory or not exist yet{default_text}")


def _scale_args(p):
    p.add_argument("--shard-dir", default=None,
                   help="write each finished chunk of prompts here (atomically) and resume from it on a rerun; "
                        "required under torchrun / accelerate launch, where each process takes a slice of the "
                        "prompts and process 0 merges them (default: one process, no shards)")
    p.add_argument("--chunk-size", type=_positive, default=64, help="prompts per shard file (default: 64)")
    p.add_argument("--query-chunk", type=_positive, default=None,
                   help="attention queries per chunk for long prompts: memory linear in the prompt length, same "
                        "numbers (default: all at once)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaseinterp", description="Phase sensitivity of chunk-compressed attention: "
                     "accuracy by position phase, mean replacement, gate cycling, gate statistics.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("demo", help="report for a shipped zoo model and its full-attention twin",
                       description="Write the full report (phase profile, mean replacement, gate cycling, gate "
                       "statistics) for a shipped zoo model and its full-attention twin.")
    p.add_argument("--model", default="w4s4", help="zoo model with a shipped checkpoint (default: w4s4)")
    p.add_argument("--twin", default="full",
                   help="full-attention twin: zoo name or checkpoint directory, 'none' to skip (default: full)")
    _out_arg(p, default="phaseinterp-report", what="the report (index.html, PNGs, CSVs, summary.json)")
    p.add_argument("--quick", action="store_true", help="72 prompts per residue everywhere (about a minute)")
    p.add_argument("--no-static", action="store_true", help="skip PNG export even if kaleido and Chromium exist")
    p.add_argument("--deepseek-v4", default="dsv4-tiny",
                   help="shipped HF DeepSeek-V4 zoo model for the report's DeepSeek-V4 section, 'none' to skip "
                   "(default: dsv4-tiny)")
    _device_arg(p)

    p = sub.add_parser("report", help="the full report for any model",
                       description="Write the full report for any model (zoo name or checkpoint directory).")
    _model_arg(p)
    p.add_argument("--twin", default=None, help="a full-attention twin to profile beside it (default: none)")
    _out_arg(p, required=True, what="the report (index.html, PNGs, CSVs, summary.json)")
    p.add_argument("--quick", action="store_true", help="72 prompts per residue everywhere (about a minute)")
    p.add_argument("--no-static", action="store_true", help="skip PNG export even if kaleido and Chromium exist")

    p = sub.add_parser("profile", help="accuracy by residue and phase (phaseinterp.phase_profile)",
                       description="Top-1 retrieval accuracy by target residue (mod R) and phase (mod S).")
    _model_arg(p)
    p.add_argument("--n-per-residue", type=_positive, default=250, help=N_PER_RESIDUE_HELP + " (default: 250)")
    p.add_argument("--stride", type=_positive, default=None,
                   help="fold residues to phases with this stride; must divide R (default: the model's)")
    p.add_argument("--padding", choices=["prefix", "in_sequence"], default=None,
                   help="how records are moved to each residue (default: the task's own)")
    p.add_argument("--seed", type=_non_negative, default=0, help="prompt seed, >= 0 (default: 0)")
    _out_arg(p, what="the profile (meta.json + arrays.npz)")
    _scale_args(p)

    p = sub.add_parser("ablate", help="per-KV-head mean replacement (phaseinterp.ablate)",
                       description="Replace each KV head's per-head outputs (hook_z) at the answer position by "
                       "their calibration mean; print the RELATIVE accuracy change in percent per phase.")
    _model_arg(p)
    p.add_argument("--layer", type=int, nargs="+", default=None,
                   help="distinct layer indices in 0..n_layers-1 (default: every layer)")
    p.add_argument("--scope", choices=["kv_head", "layer"], default="kv_head",
                   help="one unit per KV head, or one per whole layer (default: kv_head)")
    p.add_argument("--n-per-residue", type=_positive, default=72, help=N_PER_RESIDUE_HELP + " (default: 72)")
    p.add_argument("--n-calibration", type=_positive, default=256,
                   help="calibration prompts for the mean; at least R (one per residue) (default: 256)")
    p.add_argument("--method", choices=["fast", "naive"], default="fast",
                   help="fast (answer position only, equals naive to 1e-5) or naive (default: fast)")
    _out_arg(p, what="the result (meta.json + arrays.npz)")
    _scale_args(p)

    p = sub.add_parser("cycle", help="cyclic gate shifts (phaseinterp.gate_cycling)",
                       description="Shift the gates' slot preferences by each shift and measure accuracy per "
                       "phase (W = S gated or DeepSeek-kernel models).")
    _model_arg(p)
    p.add_argument("--shifts", type=int, nargs="+", default=None,
                   help="shifts in slots, each non-zero mod S (default: every distinct shift mod S, e.g. "
                        "-1 1 2 for S = 4)")
    p.add_argument("--layer", type=int, nargs="+", default=None,
                   help="distinct layer indices to shift (default: every layer)")
    p.add_argument("--branch", choices=["both", "k", "v"], default="both",
                   help="shift the key gates, the value gates or both (default: both)")
    p.add_argument("--n-per-residue", type=_positive, default=250, help=N_PER_RESIDUE_HELP + " (default: 250)")
    _out_arg(p, what="the result (meta.json + arrays.npz)")
    _scale_args(p)

    p = sub.add_parser("merge", help="combine the shard files of a --shard-dir run (phaseinterp.distributed.merge)",
                       description="Rebuild a sharded profile / ablate / cycle result from DIR's run.json and "
                       "shard files alone; refuses shards of another run (model hash, task, seed, settings), "
                       "naming the field, and names the prompts still missing.")
    p.add_argument("dir", help="the --shard-dir of a profile, ablate or cycle run")
    _out_arg(p, what="the merged result (meta.json + arrays.npz)")

    p = sub.add_parser("gates", help="gate statistics (phaseinterp.gate_profile)",
                       description="Where each compressor gate puts its weight, and how concentrated it is.")
    _model_arg(p)
    p.add_argument("--n-per-residue", type=_positive, default=8,
                   help="prompts per residue; any size works here (no moment matching) (default: 8)")
    _out_arg(p, what="the result (meta.json + arrays.npz)")

    p = sub.add_parser("train", help="train a model from scratch (phaseinterp.train)",
                       description="Train a model with a zoo recipe (default: w4s4's), changing the options given. "
                       "--resume continues a run in --out with the same architecture and recipe.")
    p.add_argument("--zoo-recipe", default=None, help="start from this zoo entry's settings (default: w4s4)")
    p.add_argument("--compression", choices=["gated", "deepseek", "none"], default=None,
                   help="compressor kind; none = the full-attention twin (default: the recipe's)")
    p.add_argument("--window", type=_positive, default=None, help="compression window W (default: the recipe's)")
    p.add_argument("--stride", type=_positive, default=None,
                   help="compression stride S; must divide the task's R = 24 (default: the recipe's)")
    p.add_argument("--gate", choices=["scalar", "vector", "uniform"], default=None,
                   help="gate type (default: the recipe's)")
    p.add_argument("--n-layers", type=_positive, default=None, help="number of layers (default: the recipe's)")
    p.add_argument("--n-kv-heads", type=_positive, default=None,
                   help="KV heads; must divide the query heads (default: the recipe's)")
    p.add_argument("--steps", type=_positive, default=None, help="training steps (default: the recipe's, 1500)")
    p.add_argument("--batch-size", type=_positive, default=None, help="sequences per step (default: the recipe's)")
    p.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate > 0 (default: the recipe's)")
    p.add_argument("--seed", type=_non_negative, default=None, help="training seed >= 0 (default: the recipe's)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out; refuses a changed architecture, recipe or step count")
    _device_arg(p)
    _out_arg(p, required=True, what="checkpoints, logs and the final model")

    p = sub.add_parser("zoo", help="list or rebuild the zoo models", description="The zoo: shipped checkpoints "
                       "and recipes without a shipped checkpoint.")
    zsub = p.add_subparsers(dest="zoo_command", required=True, parser_class=_Parser, metavar="ZOO_COMMAND")
    z = zsub.add_parser("list", help="every zoo name, whether its checkpoint ships, and how to rebuild it")
    z.add_argument("--markdown", action="store_true", help="print the README's zoo table instead")
    b = zsub.add_parser("build", help="retrain a zoo model with the shared recipe and install it")
    b.add_argument("name", help="a zoo name (see `phaseinterp zoo list`)")
    b.add_argument("--out-dir", default=None, help="run directory (default: runs/zoo/NAME)")
    _device_arg(b)
    b.add_argument("--no-install", action="store_true", help="train only; do not copy the snapshot into the package")
    b.add_argument("--threads", type=_positive, default=1,
                   help="CPU threads (default: 1, which reproduces the shipped checkpoints bit for bit)")
    return parser


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
        settings = report_module.ReportSettings.quick() if args.quick else report_module.ReportSettings()
        settings.export_static = not args.no_static
        rep = report_module.build_report(args.model, args.out, twin=twin, settings=settings,
                                         device=getattr(args, "device", None), deepseek_v4=dsv4)
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
