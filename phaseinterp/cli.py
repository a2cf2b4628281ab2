"""``phaseinterp``: the command line. Every subcommand mirrors a Python function.

    phaseinterp demo    [--model NAME] [--out DIR] [--quick]      -> phaseinterp.report.build_report
    phaseinterp profile MODEL [--n-per-residue N] [--out DIR]     -> phaseinterp.phase_profile
    phaseinterp ablate  MODEL [--layer L ...] [--scope ...]       -> phaseinterp.ablate
    phaseinterp cycle   MODEL [--shifts ...]                      -> phaseinterp.gate_cycling
    phaseinterp gates   MODEL                                     -> phaseinterp.gate_profile
    phaseinterp report  MODEL [--twin MODEL] --out DIR            -> phaseinterp.report.build_report
    phaseinterp train   --out DIR [architecture and run options]  -> phaseinterp.train.train
    phaseinterp zoo list | build NAME                             -> phaseinterp.zoo

MODEL is a zoo name (``phaseinterp zoo list``) or a checkpoint directory. Bad arguments
exit with code 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence


class UsageError(Exception):
    """Bad user input: reported in one line, exit code 2."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit code 2
        self.exit(2, f"phaseinterp: error: {message}\n")


def _model_arg(p):
    p.add_argument("model", help="zoo name (see `phaseinterp zoo list`) or checkpoint directory")
    p.add_argument("--device", default=None, help="torch device (default: the checkpoint's, i.e. cpu)")


def _out_arg(p, default: Optional[str] = None, required: bool = False):
    p.add_argument("--out", default=default, required=required, help="output directory")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaseinterp", description="Phase sensitivity of chunk-compressed attention.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("demo", help="report for a shipped zoo model and its full-attention twin")
    p.add_argument("--model", default="w4s4", help="zoo model (default w4s4)")
    p.add_argument("--twin", default="full", help="full-attention twin (zoo name or directory; 'none' to skip)")
    _out_arg(p, default="phaseinterp-report")
    p.add_argument("--quick", action="store_true", help="fewer prompts (about a minute)")
    p.add_argument("--no-static", action="store_true", help="skip PNG export even if kaleido/chromium exist")

    p = sub.add_parser("report", help="the full report for any model")
    _model_arg(p)
    p.add_argument("--twin", default=None, help="a full-attention twin to profile beside it")
    _out_arg(p, required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-static", action="store_true")

    p = sub.add_parser("profile", help="accuracy by residue and phase (phaseinterp.phase_profile)")
    _model_arg(p)
    p.add_argument("--n-per-residue", type=_positive, default=250)
    p.add_argument("--stride", type=_positive, default=None, help="fold to this stride (default: the model's)")
    p.add_argument("--padding", choices=["prefix", "in_sequence"], default=None)
    p.add_argument("--seed", type=int, default=0)
    _out_arg(p)

    p = sub.add_parser("ablate", help="per-KV-head mean replacement (phaseinterp.ablate)")
    _model_arg(p)
    p.add_argument("--layer", type=int, nargs="+", default=None, help="layers (default: all)")
    p.add_argument("--scope", choices=["kv_head", "layer"], default="kv_head")
    p.add_argument("--n-per-residue", type=_positive, default=72)
    p.add_argument("--n-calibration", type=_positive, default=256)
    p.add_argument("--method", choices=["fast", "naive"], default="fast")
    _out_arg(p)

    p = sub.add_parser("cycle", help="cyclic gate shifts (phaseinterp.gate_cycling)")
    _model_arg(p)
    p.add_argument("--shifts", type=int, nargs="+", default=[-3, -2, -1, 1, 2, 3])
    p.add_argument("--layer", type=int, nargs="+", default=None)
    p.add_argument("--branch", choices=["both", "k", "v"], default="both")
    p.add_argument("--n-per-residue", type=_positive, default=250)
    _out_arg(p)

    p = sub.add_parser("gates", help="gate statistics (phaseinterp.gate_profile)")
    _model_arg(p)
    p.add_argument("--n-per-residue", type=_positive, default=8)
    _out_arg(p)

    p = sub.add_parser("train", help="train a model from scratch (phaseinterp.train)")
    p.add_argument("--zoo-recipe", default=None, help="start from a zoo entry's settings")
    p.add_argument("--compression", choices=["gated", "deepseek", "none"], default=None)
    p.add_argument("--window", type=_positive, default=None)
    p.add_argument("--stride", type=_positive, default=None)
    p.add_argument("--gate", choices=["scalar", "vector", "uniform"], default=None)
    p.add_argument("--n-layers", type=_positive, default=None)
    p.add_argument("--n-kv-heads", type=_positive, default=None)
    p.add_argument("--steps", type=_positive, default=None)
    p.add_argument("--batch-size", type=_positive, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--device", default=None)
    _out_arg(p, required=True)

    p = sub.add_parser("zoo", help="list or rebuild the shipped models")
    zsub = p.add_subparsers(dest="zoo_command", required=True, parser_class=_Parser)
    zsub.add_parser("list", help="the zoo and which checkpoints ship")
    b = zsub.add_parser("build", help="retrain a zoo model with the shared recipe and install it")
    b.add_argument("name")
    b.add_argument("--out-dir", default=None, help="run directory (default runs/zoo/NAME)")
    b.add_argument("--device", default=None)
    b.add_argument("--no-install", action="store_true")
    b.add_argument("--threads", type=_positive, default=1,
                   help="CPU threads (1 reproduces the shipped checkpoints bit for bit)")
    return parser


def _write(out: Optional[str], result, summary: dict) -> None:
    print(json.dumps(summary, indent=2, default=str))
    if out:
        path = result.save(Path(out))
        print(f"saved to {path}")


def _run(args) -> int:
    from phaseinterp import report as report_module

    if args.command in ("demo", "report"):
        settings = report_module.ReportSettings.quick() if args.quick else report_module.ReportSettings()
        settings.export_static = not args.no_static
        model = args.model
        twin = None if (args.twin in (None, "none")) else args.twin
        rep = report_module.build_report(model, args.out, twin=twin, settings=settings,
                                         device=getattr(args, "device", None))
        print(rep.table())
        print(f"\nreport written to {Path(args.out).resolve() / 'index.html'} in {rep.seconds:.0f} s")
        return 0
    if args.command == "zoo":
        from phaseinterp import zoo

        if args.zoo_command == "list":
            shipped = set(zoo.available())
            for name, e in zoo.ENTRIES.items():
                mark = "shipped" if name in shipped else "not built"
                print(f"{name:16s} {mark:10s} {e.description}\n{'':16s} rebuild: {e.command}")
            return 0
        zoo.entry(args.name)
        source = zoo.build(args.name, args.out_dir, device=args.device, install=not args.no_install,
                           threads=args.threads)
        print(f"built {args.name}: snapshot {source}")
        return 0
    if args.command == "train":
        return _train(args)

    model = report_module.load_model(args.model, args.device)
    from phaseinterp.interventions._common import resolve_task

    task = resolve_task(model)
    if args.command == "profile":
        from dataclasses import replace

        from phaseinterp.evaluate import phase_profile

        if args.padding:
            task = replace(task, padding=args.padding)
        prof = phase_profile(model, task, args.n_per_residue, seed=args.seed, stride=args.stride,
                             label=report_module._label(model))
        _write(args.out, prof, prof.summary())
    elif args.command == "ablate":
        from phaseinterp.interventions import mean_ablation

        res = mean_ablation(model, task, layer=args.layer, scope=args.scope, n_per_residue=args.n_per_residue,
                            n_calibration=args.n_calibration, method=args.method)
        print(res.relative_change.round(1).to_string())
        _write(args.out, res, res.summary())
    elif args.command == "cycle":
        from phaseinterp.interventions import gate_cycling

        res = gate_cycling(model, task, args.shifts, layers=args.layer, branch=args.branch,
                           n_per_residue=args.n_per_residue)
        print(res.phase_accuracy().round(3).to_string())
        _write(args.out, res, res.summary())
    elif args.command == "gates":
        from phaseinterp.interventions import gate_profile

        res = gate_profile(model, task, n_per_residue=args.n_per_residue)
        print(res.heads.round(3).to_string(index=False))
        if args.out:
            print(f"saved to {res.save(Path(args.out))}")
    return 0


def _train(args) -> int:
    from phaseinterp import zoo
    from phaseinterp.train import train

    e = zoo.entry(args.zoo_recipe or "w4s4")
    task = e.task_object()
    changes = {k: v for k, v in dict(window=args.window, stride=args.stride, gate=args.gate,
                                      n_layers=args.n_layers, n_kv_heads=args.n_kv_heads).items() if v is not None}
    if args.compression is not None:
        changes["compression"] = None if args.compression == "none" else args.compression
        if args.compression == "deepseek" and args.gate is None:
            changes["gate"] = "vector"
    config = e.model_config(task.vocab.size).replace(**changes)
    result = train(config, task, train_config=e.train_config(), steps=args.steps, batch_size=args.batch_size,
                   lr=args.lr, seed=args.seed, device=args.device, out_dir=args.out, resume=args.resume)
    final = Path(args.out) / "final"
    result.model.save_pretrained(final)
    print(f"trained {config.label}: final loss {result.log.loss.iloc[-1]:.4f}; model saved to {final}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("phaseinterp: interrupted (checkpoints written so far are intact)", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"phaseinterp: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
