"""``phaseinterp``: the command line. Every subcommand mirrors a Python function (``phaseinterp --help``
lists them; docs/cli.md has each): ``profile`` -> `phase_profile` (``--engine URL``: a served model),
``ablate`` -> `ablate`, ``cycle`` -> `gate_cycling`, ``gates`` -> `gate_profile`, ``demo`` / ``report`` ->
`build_report`, ``train`` / ``pretrain`` / ``tokenizer`` -> `phaseinterp.train`, ``zoo``, ``merge``,
``conformance``, ``check-report`` / ``screenshot``, ``paper``, ``memory-plan``, ``experiments``.

MODEL is a zoo name or a checkpoint directory. Bad arguments exit with code 2 and a one-line message
naming the value, before any expensive work or write. Only the standard library is imported at the
top, so ``--help`` answers at once."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from phaseinterp.cli.args import build_parser, given_flags
from phaseinterp.errors import EngineError, UserInputError  # standard library only, like this package


def __getattr__(name: str):
    """``phaseinterp.cli.commands`` on first use (it loads torch; ``--help`` does not need it)."""
    if name == "commands":
        return importlib.import_module("phaseinterp.cli.commands")
    raise AttributeError(f"module 'phaseinterp.cli' has no attribute {name!r}")


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    text = re.sub(r"\s*\(or pass strict=False[^)]*\)", "", text)  # the CLI has no such flag
    text = re.sub(r"\s*\(valid: \[[^\]]{200,}\]\)", "", text)
    return " ".join(text.split())


def _user_errors() -> tuple[type, ...]:
    """What the user can fix (one line, exit 2): bad input, a missing or unusable file, a broken
    checkpoint or figure export. Any other exception (a bug) keeps its traceback."""
    errors: list[type] = [UserInputError, EngineError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                          FileExistsError, PermissionError]
    models = sys.modules.get("phaseinterp.models.transformer")
    if models is not None:
        errors.append(models.CheckpointError)
    export = sys.modules.get("phaseinterp.plot.export")
    if export is not None:
        errors.append(export.ExportError)
    return tuple(errors)


def _interrupted(args) -> str:
    """What an interrupt leaves behind, for the command that ran (never a promise it did not keep)."""
    if args.command == "train" or (args.command == "zoo" and args.zoo_command == "build"):
        if args.command == "train":
            run, again = Path(args.out), "rerun with --resume to continue"
        else:
            from phaseinterp import zoo

            run_name = zoo.ENTRIES[args.name].run if args.name in zoo.ENTRIES else None  # HF DeepSeek-V4: NAME
            run = Path(args.out_dir) if args.out_dir else Path("runs") / "zoo" / (run_name or args.name)
            again = "rerun the same command to continue"
        latest = run / "checkpoints" / "LATEST"
        if latest.is_file():
            return f"interrupted; the last checkpoint in {run / 'checkpoints'} ({latest.read_text().strip()}) is intact: {again}"
        return f"interrupted before the first checkpoint; nothing in {run} to resume"
    if args.command == "pretrain":  # the run folder holds its settings and data before its first checkpoint
        run = Path(args.out).expanduser()
        latest = run / "checkpoints" / "LATEST"
        if latest.is_file():
            return (f"interrupted; the last checkpoint in {run / 'checkpoints'} ({latest.read_text().strip()}) is "
                    "intact: rerun with --resume to continue")
        if (run / "pretrain.json").is_file():
            return (f"interrupted before the first checkpoint; {run} keeps the run's settings (pretrain.json) and "
                    "tokenized data: rerun with --resume to start from them")
        return f"interrupted before the run's settings were written; nothing in {run} to resume"
    if args.command == "experiments":
        return f"interrupted; the runs in {args.runs} keep their last checkpoints: rerun the same command to resume"
    if getattr(args, "shard_dir", None):
        return f"interrupted; the finished shards in {args.shard_dir} are kept: rerun the same command to resume"
    if args.command in ("demo", "report"):
        return f"interrupted; {args.out} was not changed (a report is moved into place only when complete)"
    if getattr(args, "out", None):  # results, tokenizers, exports, lm-eval tasks: moved into place when complete
        return f"interrupted; nothing was written to {args.out}"
    return "interrupted"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv == ["zoo"]:  # the list of commands, as --help prints it
        (parser if not argv else parser._subparsers._group_actions[0].choices["zoo"]).print_help()
        return 0
    args = parser.parse_args(argv)
    subparsers = parser._subparsers._group_actions[0].choices
    args.given = given_flags(subparsers[args.command], argv[1:]) if args.command in subparsers else set()
    from phaseinterp.cli import commands  # after parsing: --help answers without torch

    try:
        return commands.run(args)
    except KeyboardInterrupt:
        print(f"phaseinterp: {_interrupted(args)}", file=sys.stderr)
        return 130
    except Exception as err:
        if not isinstance(err, _user_errors()):
            raise
        print(f"phaseinterp: error: {_one_line(err)}", file=sys.stderr)
        return 2

