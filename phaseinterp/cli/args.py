"""``phaseinterp``'s argument parser (`build_parser`), standard library only. The experiments' flags are
made from their option declarations (`add_options`), and a flag given where it does nothing is refused
from the same declarations (`check_flag_needs`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Optional

from phaseinterp._checks import (DEFAULT_N_PER_RESIDUE, GIVEN, N_PER_RESIDUE_HELP, AblationOptions, Contains, ConformanceOptions,
                                 CyclingOptions, GateProfileOptions, OneOf, ProfileOptions, UnitCyclingOptions,
                                 SEED_MAX, cli_fields, dest_of, flag_of, option)  # standard library only, like this module
from phaseinterp import __version__
from phaseinterp.errors import UserInputError


class UsageError(UserInputError):
    """Bad command-line input: reported in one line, exit code 2."""


# The command options beside the experiments' (`phaseinterp._checks.ProfileOptions` ...), declared the same
# way (`option`): the flags of a command are made from its options classes (`add_options`), and what each
# flag needs or excludes is read from its declaration by `check_flag_needs`. Declarations only, never made:
# no __init__ or __eq__ is generated (`phaseinterp --help` stays fast).
_declared = dataclasses.dataclass(init=False, repr=False, eq=False)


@_declared
class DeviceOptions:
    device: Optional[str] = option(None, "torch device, e.g. cpu, cuda, cuda:1, mps (default: cpu); must exist on "
                                   "this machine", excludes=("engine", "the served model runs where it is served"))


@_declared
class OutputOptions:
    out: Optional[str] = option(None, "directory to write {what} to; must not exist yet or be empty{default}",
                                excludes=("list", "--list prints the published runs and writes nothing"))
    overwrite: bool = option(False, "replace a previous output of the same kind in --out (whole and atomically; a saved "
                             "result's folder that also holds other files is refused); anything else there is never "
                             "replaced", needs=(("out", GIVEN), ("paper_figure", GIVEN)))


@_declared
class EngineOptions:
    engine: Optional[str] = option(None, "ask an OpenAI-compatible server (vLLM, SGLang: /v1/completions with token-id "
                                   "prompts and logprobs) instead of running MODEL here, e.g. http://localhost:8000 "
                                   "(default: in process)", metavar="URL")
    model_name: Optional[str] = option(None, "with --engine: the model name the server serves (required)",
                                       needs=("engine", GIVEN))
    tokenizer: Optional[str] = option(None, "with --engine and no MODEL: a Hugging Face tokenizer folder; the task is "
                                      "then a needle task laid out in its ids (--seq-len; --stride required)",
                                      metavar="DIR", needs=("engine", GIVEN))
    seq_len: int = option(8192, "with --tokenizer: the needle prompts' length in tokens (default: 8192)",
                          parse="positive", needs=("tokenizer", GIVEN))
    top_logprobs: int = option(20, "with --engine: log-probs asked per prompt; a prompt is correct when its answer is "
                               "the argmax of those reported (vLLM caps it at --max-logprobs, default 20) (default: 20)",
                               parse="positive", needs=("engine", GIVEN))
    d_vocab: Optional[int] = option(None, "with --engine: the served model's vocabulary size (default: MODEL's, or "
                                    "the tokenizer's)", parse="positive", needs=("engine", GIVEN))
    retries: int = option(3, "with --engine: further tries of a request that fails (unreachable, HTTP 5xx), waiting "
                          "1, 2, 4 ... s (default: 3)", parse="non_negative", needs=("engine", GIVEN))
    timeout: float = option(600.0, "with --engine: seconds to wait for one request's answer (default: 600)",
                            parse="positive_float", needs=("engine", GIVEN))


@_declared
class LayoutOptions:
    padding: Optional[str] = option(None, "how records are moved to each residue (default: the task's own)",
                                    choices=("prefix", "in_sequence"))


@_declared
class ScaleOptions:
    shard_dir: Optional[str] = option(None, "write each finished chunk of prompts here (atomically) and resume from "
                                      "it on a rerun; required under torchrun / accelerate launch, where each process "
                                      "takes a slice of the prompts and process 0 merges them (default: one process, "
                                      "no shards)")
    chunk_size: int = option(64, "prompts per shard file; with profile --engine, prompts per request (default: 64)",
                             parse="positive", needs=(("shard_dir", GIVEN), ("engine", GIVEN)))
    query_chunk: Optional[int] = option(None, "attention queries per chunk for long prompts: memory linear in the "
                                        "prompt length, same numbers (default: the model's 'auto': forwards over more "
                                        "than 2,048 new tokens are chunked to a bounded score block, shorter ones run "
                                        "all at once)", parse="positive",
                                        excludes=("engine", "the served model runs its own attention"))


@_declared
class CompareOptions:
    paper: Optional[str] = option(None, "also print {what} beside the published run RUN in the same statistic "
                                  "(phaseinterp.paper.compare), {runs} (default: none)", metavar="RUN")
    paper_padding: Optional[str] = option(None, "with --paper: the published evaluation to compare with (default: "
                                          "prefix)", choices=("prefix", "in-sequence"), needs=("paper", GIVEN))
    paper_figure: Optional[str] = option(None, "with --paper: also write the comparison's figure here (.html, the default "
                                         "without a suffix; .png, .svg or .pdf with kaleido and Chromium) (default: "
                                         "none)", metavar="PATH",
                                         needs=("paper", GIVEN))


@_declared
class CycleOptions:
    score: str = option("profile", "profile: whole-model accuracy per phase vs A_0((r-d) mod S); unit: the unit named "
                        "by --layer (and --kv-heads) shifted alone, its own contribution vs C_0((r-d) mod S) (default: "
                        "profile)", choices=("profile", "unit"),
                        selects={"profile": CyclingOptions, "unit": UnitCyclingOptions})
    baseline: Optional[str] = option(None, "profile score: a profile of this model on the same prompts, written by "
                                     "`phaseinterp profile MODEL --out DIR`; its per-prompt results are the unshifted "
                                     "row, so that pass is not run again (checked first on one batch) (default: none)",
                                     metavar="DIR", needs=("score", "profile"),
                                     excludes=("shard_dir", "a sharded run computes the unshifted row in its shards"))


@_declared
class PaperOptions:
    list: bool = option(False, "print the published runs (phaseinterp.paper.runs()) and exit")
    no_static: bool = option(False, "HTML only: skip the PNGs (they need kaleido and Chromium)",
                             excludes=("list", "--list prints the published runs and draws nothing"))


@_declared
class PlanOptions:
    plan: bool = option(False, "print the per-device memory (parameters, gradients, optimizer state, activations and "
                        "logits per row and per device) and whether it fits --device-memory, naming the micro-batch or "
                        "activation checkpointing that would; no data, tokenizer or --out needed; exits 2 when it does "
                        "not fit (phaseinterp.train.plan)")
    device_memory: Optional[float] = option(None, "with --plan: GiB per device (default: this machine's CUDA device, "
                                            "else 80 for a GPU)", parse="positive_float", metavar="GIB",
                                            needs=("plan", GIVEN))


def add_options(p: argparse.ArgumentParser, *classes, skip: tuple = (), **fill) -> None:
    """The flags of ``classes``' options that the command line takes, each once (the first class
    declaring it); ``fill``: the help's blanks, and per flag argparse settings that differ on this command.
    The classes are kept in the parsed arguments (``declared``, ``skipped``) for `check_flag_needs`."""
    seen = {a.dest for a in p._actions} | set(skip)
    words = {k: v for k, v in fill.items() if not isinstance(v, dict)}
    for cls in classes:
        for field in cli_fields(cls):
            dest, meta = dest_of(field), field.metadata
            if dest in seen:
                continue
            seen.add(dest)
            kwargs = {"dest": dest, "default": field.default, "help": meta["help"].format(**words) if words else
                      meta["help"], "metavar": meta.get("metavar"), "choices": meta.get("choices")}
            if meta.get("parse") == "ints":
                kwargs.update(type=_int_list(dest if dest.endswith("s") else dest + "s"), nargs="+", action=_Extend)
            elif field.default is False:
                kwargs["action"] = "store_true"
            else:
                kwargs.update(type=PARSERS.get(meta.get("parse")), nargs="+" if meta.get("many") else None)
            kwargs.update(fill[dest] if isinstance(fill.get(dest), dict) else {})
            p.add_argument(flag_of(field), **{k: v for k, v in kwargs.items() if v is not None})
    p.set_defaults(declared=(p.get_default("declared") or ()) + classes, skipped=(p.get_default("skipped") or ()) + skip)


def given_flags(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The dests of the options written in ``argv`` (``--flag v``, ``--flag=v`` or an unambiguous
    prefix, as argparse reads them) for the subcommand parser ``parser``: "given", as opposed to
    left at their defaults, which a parsed namespace cannot tell apart."""
    strings = {s: a.dest for a in parser._actions for s in a.option_strings if s.startswith("--")}
    given = set()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        key = token.split("=", 1)[0]
        if key in strings:
            given.add(strings[key])
            continue
        matches = {dest for s, dest in strings.items() if s.startswith(key)}
        if len(matches) == 1:
            given |= matches
    return given


def _flag(dest: str) -> str:
    return "MODEL" if dest == "model" else f"--{dest.replace('_', '-')}"


def declared_needs(classes) -> tuple[dict, dict]:
    """``({dest: ((dest it needs, value), ...)}, {dest: (dest it excludes, why)})`` of a command's options
    classes, from their declarations alone: each option's ``needs`` and ``excludes`` (named by dest), and
    where an option ``selects`` the options class (``cycle --score``), a flag that only some of the
    selected classes take needs the values that select them."""
    fields: dict = {}
    for cls in classes:
        for field in cli_fields(cls):
            fields.setdefault(dest_of(field), field)
    names = {f.name: dest for dest, f in fields.items()}
    needs = {dest: [(names.get(o, o), want) for o, want in f.metadata.get("needs", ())] for dest, f in fields.items()}
    excludes = {dest: (names.get(f.metadata["excludes"][0], f.metadata["excludes"][0]), f.metadata["excludes"][-1])
                for dest, f in fields.items() if f.metadata.get("excludes")}
    for selector, field in fields.items():
        for dest in fields:
            takers = [value for value, cls in field.metadata.get("selects", {}).items()
                      if dest in {dest_of(f) for f in cli_fields(cls)}]
            if 0 < len(takers) < len(field.metadata["selects"]):
                needs[dest].append((selector, takers[0] if len(takers) == 1 else OneOf(tuple(takers))))
    return {dest: tuple(alts) for dest, alts in needs.items() if alts}, excludes


def check_flag_needs(args, given: set[str]) -> None:
    """Refuse a flag given where it does nothing (what the command's options classes declare it needs or
    excludes: `declared_needs`), naming both flags, before any work."""
    needs, excludes = declared_needs(getattr(args, "declared", ()))
    for dest in sorted(given):
        alternatives = tuple(alt for alt in needs.get(dest, ()) if hasattr(args, alt[0]))  # this command's flags
        if alternatives and not any(_holds(getattr(args, other, None), want) for other, want in alternatives):
            wanted = " or ".join(_flag(other) if want is GIVEN else _want_words(other, want)
                                 for other, want in alternatives)
            here = "; ".join(f"{_flag(other)} {_shown(getattr(args, other, None))}" for other, _ in alternatives)
            raise UsageError(f"{_flag(dest)} applies to {wanted} only (here {here}), where it would do nothing; "
                             f"drop {_flag(dest)} or add {wanted}")
        other, why = excludes.get(dest, (None, None))
        if other and _holds(getattr(args, other, None), GIVEN):
            raise UsageError(f"{_flag(dest)} does nothing with {_flag(other)} ({why}); drop {_flag(dest)}")


def _holds(value, want) -> bool:
    if want is GIVEN:
        return value is not None and value is not False
    holds = getattr(want, "holds", None)
    return holds(value) if holds is not None else value == want


def _want_words(other: str, want) -> str:
    if isinstance(want, Contains):
        return f"{_flag(other)} including {want.value}"
    return f"{_flag(other)} {' or '.join(map(str, want.values)) if isinstance(want, OneOf) else want}"


def _shown(value) -> str:
    if value is None or value is False:
        return "not given"
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _parse_number(text: str, kind: type, ok, bound: str):
    """``text`` as ``kind`` (int or float) satisfying ``ok``, else an argparse error naming the value."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text} must be {bound}")
    return value


def _int_list(what: str):
    """An argparse type for one or more integers given as ``1 2`` or ``1,2`` (or both): a list."""
    def parse(text: str) -> list[int]:
        values = []
        for part in text.split(","):
            try:
                values.append(int(part))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{part!r} is not an integer (separate {what} with spaces or commas: 1 2 or 1,2)") from None
        return values
    return parse


class _Extend(argparse.Action):
    """Collect every value of ``nargs="+"`` options whose type returns lists into one flat list."""

    def __call__(self, parser, namespace, values, option_string=None):
        flat = list(getattr(namespace, self.dest, None) or [])
        for value in values:
            flat.extend(value)
        setattr(namespace, self.dest, flat)


def _positive(text: str) -> int:
    return _parse_number(text, int, lambda v: v >= 1, ">= 1")


def _non_negative(text: str) -> int:
    return _parse_number(text, int, lambda v: v >= 0, ">= 0")


def _seed(text: str) -> int:
    return _parse_number(text, int, lambda v: 0 <= v <= SEED_MAX, "in 0..2**64 - 1 (a seed)")


def _positive_float(text: str) -> float:
    return _parse_number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def _share(text: str) -> tuple[int, int]:
    """``W/N`` (worker W, 0-based, of N) as a pair of integers."""
    parts = text.split("/")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not W/N: two integers, worker W (0-based) of N, e.g. 0/2")
    worker, n_workers = (int(part) for part in parts)
    if n_workers < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: N = {n_workers} workers must be >= 1")
    if not 0 <= worker < n_workers:
        raise argparse.ArgumentTypeError(f"worker {worker} is out of range 0..{n_workers - 1} for {n_workers} workers")
    return worker, n_workers


PARSERS = {"positive": _positive, "non_negative": _non_negative, "seed": _seed, "positive_float": _positive_float}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit code 2
        self.exit(2, f"phaseinterp: error: {message}\n")


def _model_arg(p, *options):
    p.add_argument("model", help="zoo name with a shipped checkpoint (see `phaseinterp zoo list`) or a checkpoint "
                                 "directory (config.json + model.safetensors)")
    add_options(p, DeviceOptions, *options)


def _out_arg(p, default: Optional[str] = None, required: bool = False, what: str = "the result",
             overwrite: bool = True, when: str = ""):
    """``--out`` (and ``--overwrite``); ``when`` says when it is needed where that is neither always nor never."""
    default_text = (f" (default: {default})" if default else " (required)" if required else
                    f" ({when})" if when else " (default: print only)")
    add_options(p, OutputOptions, skip=() if overwrite else ("overwrite",), what=what, default=default_text,
                out={"default": default, "required": required or None})


def _paper_args(p, what: str, runs: str = "e.g. kvc_w8s8_1kv_baseline or DeepSeek-V4-Flash-Base (`phaseinterp "
                                           "paper --list` names them)"):
    add_options(p, CompareOptions, what=what, runs=runs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaseinterp", description="Phase sensitivity of chunk-compressed attention: "
                     "accuracy by position phase, mean replacement, gate cycling, gate statistics.")
    parser.add_argument("--version", action="version", version=f"phaseinterp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("demo", help="report for a shipped zoo model and its full-attention twin",
                       description="Write the full report (phase profile, mean replacement, gate cycling, gate "
                       "statistics) for a shipped zoo model and its full-attention twin.")
    p.add_argument("--model", default="w4s4", help="zoo model with a shipped checkpoint (default: w4s4)")
    p.add_argument("--twin", default="full",
                   help="full-attention twin: zoo name or checkpoint directory, 'none' to skip (default: full)")
    _out_arg(p, default="phaseinterp-report", what="the report (index.html, PNGs, CSVs, summary.json)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shifts +-1 only, 128 calibration prompts and 4 gate "
                                                           "prompts per residue")
    size.add_argument("--full", action="store_true", help="250 prompts per residue for the profiles and gate cycling "
                                                          "(default 72: the report checks its intervals separate)")
    p.add_argument("--no-static", action="store_true", help="skip PNG export even if kaleido and Chromium exist")
    p.add_argument("--deepseek-v4", default="dsv4-tiny",
                   help="shipped HF DeepSeek-V4 zoo model for the report's DeepSeek-V4 section, 'none' to skip "
                   "(default: dsv4-tiny)")
    p.add_argument("--remedy", default="w4s4-staggered",
                   help="staggered-window zoo model for the report's remedy section (beside its shared-grid twin), "
                   "'none' to skip (default: w4s4-staggered)")
    add_options(p, DeviceOptions)

    p = sub.add_parser("report", help="the full report for any model",
                       description="Write the full report for any model (zoo name or checkpoint directory).")
    _model_arg(p)
    p.add_argument("--twin", default=None, help="a full-attention twin to profile beside it (default: none)")
    _out_arg(p, required=True, what="the report (index.html, PNGs, CSVs, summary.json)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shifts +-1 only, 128 calibration prompts and 4 gate "
                                                           "prompts per residue")
    size.add_argument("--full", action="store_true", help="250 prompts per residue for the profiles and gate cycling "
                                                          "(default 72: the report checks its intervals separate)")
    p.add_argument("--no-static", action="store_true", help="skip PNG export even if kaleido and Chromium exist")

    p = sub.add_parser("check-report", help="render a written report in headless Chromium and list what is "
                       "wrong (phaseinterp.report.check)",
                       description="Load DIR/index.html in headless Chromium (networking off) and list the figures "
                       "that drew nothing, the elements that stick out of the page and the texts that say None, nan "
                       "or [] where a value belongs; exit 1 when anything is listed. Needs a Chromium (chromium, "
                       "chromium-browser, google-chrome or BROWSER_PATH).")
    p.add_argument("dir", help="a report folder written by `phaseinterp demo` or `phaseinterp report` (or its "
                               "index.html)")

    p = sub.add_parser("screenshot", help="the first screen of a written report as a PNG "
                       "(phaseinterp.report.check.first_screen_png)",
                       description="Render DIR/index.html in headless Chromium and write its first screen as a PNG "
                       "(README's picture). Needs a Chromium, as check-report.")
    p.add_argument("dir", help="a report folder written by `phaseinterp demo` or `phaseinterp report`")
    p.add_argument("png", help="the PNG file to write (its folder is made if missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing PNG (without it, an existing file is refused before Chromium starts)")

    p = sub.add_parser("paper", help="every figure of the paper's published numbers (phaseinterp.paper)",
                       description="Write each figure the paper's published numbers support (DeepSeek needles by "
                       "residue; the 23 controlled runs beside the full-attention baselines; knockout maps; gates "
                       "beside knockouts; gate cycling observed against predicted; the concentration plane) as HTML "
                       "and offline PNG, all on DIR/index.html (check it with `phaseinterp check-report DIR`). "
                       "--list prints the published runs instead.")
    add_options(p, PaperOptions)
    _out_arg(p, what="the figures (index.html, one .html and .png per figure, summary.json)", when="needed but with "
             "--list")

    p = sub.add_parser("profile", help="accuracy by residue and phase (phaseinterp.phase_profile)",
                       description="Top-1 retrieval accuracy by target residue (mod R) and phase (mod S), of a "
                       "model in this process or (--engine) of a model behind an OpenAI-compatible server.")
    p.add_argument("model", nargs="?", default=None,
                   help="zoo name with a shipped checkpoint (see `phaseinterp zoo list`) or a checkpoint directory "
                        "(config.json + model.safetensors); with --engine, the served model's task, vocabulary, "
                        "stride and label (or pass --tokenizer instead)")
    add_options(p, DeviceOptions, EngineOptions, ProfileOptions, LayoutOptions)
    _out_arg(p, what="the profile (meta.json + arrays.npz)")
    add_options(p, ScaleOptions)
    _paper_args(p, "the profile (mean, worst phase, gap, period)")

    p = sub.add_parser("lm-eval-task", help="write MODEL's task as an lm-evaluation-harness task folder "
                       "(phaseinterp.engines.lm_eval.write_lm_eval_task)",
                       description="Write the prompts of MODEL's task (task.generate(N, seed)) as a task that "
                       "`lm_eval --include_path DIR --tasks NAME` runs on any backend (hf, vllm, local-completions): "
                       "a loglikelihood request of the one-token answer, acc = the answer is the top-1 next token. "
                       "Read lm-eval's --log_samples output back with phaseinterp.profile_from_lm_eval(OUT).")
    p.add_argument("model", help="zoo name (see `phaseinterp zoo list`) or a checkpoint directory: its stored "
                                 "task, stride and name")
    p.add_argument("--n-per-residue", type=_positive, default=DEFAULT_N_PER_RESIDUE,
                   help=N_PER_RESIDUE_HELP + f" (default: {DEFAULT_N_PER_RESIDUE}, as every experiment)")
    p.add_argument("--seed", type=_seed, default=0, help="prompt seed, >= 0 (default: 0)")
    p.add_argument("--name", default=None,
                   help="the lm-eval task name: a letter, then letters, digits and _ (default: phaseinterp_<model>)")
    _out_arg(p, required=True, what="the task (NAME.yaml, prompts.jsonl, prompts.py, lm_eval_task.json)")

    p = sub.add_parser("ablate", help="per-KV-head mean replacement (phaseinterp.ablate)",
                       description="Replace each KV head's per-head outputs (hook_z) at the answer position by "
                       "their calibration mean; print the RELATIVE accuracy change in percent per phase.")
    _model_arg(p, AblationOptions)
    _out_arg(p, what="the result (meta.json + arrays.npz)")
    add_options(p, ScaleOptions)
    _paper_args(p, "the knockout map (specialized units, the phases they cover)")

    p = sub.add_parser("cycle", help="cyclic gate shifts (phaseinterp.gate_cycling)",
                       description="Shift the gates' slot preferences by each shift and measure accuracy per "
                       "phase (W = S gated or DeepSeek-kernel models).")
    _model_arg(p, CycleOptions, CyclingOptions, UnitCyclingOptions)
    _out_arg(p, what="the result (meta.json + arrays.npz)")
    add_options(p, ScaleOptions)
    _paper_args(p, "the profile score's R² per shift (the paper's statistic and the stricter one)",
                "one of the 5 published gate-cycling runs, e.g. kvc_w12s12_4kv (phaseinterp.paper.cycling_runs() "
                "names them)")

    p = sub.add_parser("merge", help="combine the shard files of a --shard-dir run (phaseinterp.parallel.merge)",
                       description="Rebuild a sharded profile / ablate / cycle result from DIR's run.json and "
                       "shard files alone; refuses shards of another run (model hash, task, seed, settings), "
                       "naming the field, and names the prompts still missing.")
    p.add_argument("dir", help="the --shard-dir of a profile, ablate or cycle run")
    _out_arg(p, what="the merged result (meta.json + arrays.npz)")

    p = sub.add_parser("gates", help="gate statistics (phaseinterp.gate_profile)",
                       description="Where each compressor gate puts its weight, and how concentrated it is.")
    _model_arg(p, GateProfileOptions)
    _out_arg(p, what="the result (meta.json + arrays.npz)")

    p = sub.add_parser("conformance", help="decode / chunked prefill / dtype vs the reference, per phase "
                       "(phaseinterp.conformance)",
                       description="Run the same phase-controlled prompts through the reference forward and through "
                       "token-by-token decoding with the model's own cache, chunked prefill cut at every phase, and "
                       "bfloat16/float16; print max and mean |difference of next-token log-probs|, top-1 agreement and "
                       "the accuracy difference per answer phase (and per cut phase), with a verdict per phase.")
    _model_arg(p, ConformanceOptions)
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
    p.add_argument("--seed", type=_seed, default=None, help="training seed >= 0 (default: the recipe's)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out; refuses a changed architecture, recipe or step count")
    add_options(p, DeviceOptions)
    _out_arg(p, required=True, what="checkpoints, logs and the final model", overwrite=False)

    p = sub.add_parser("pretrain", help="next-token pretraining on natural text (phaseinterp.train.pretrain)",
                       description="Pretrain a preset architecture (or its full twin: --set compression=none) on local "
                       "text with a tokenizer folder; --nproc K launches torchrun (FSDP2). --resume continues the run "
                       "in --out with the same settings.")
    p.add_argument("--preset", default=None, help="architecture: tiny, cpu-small, qwen3-100m or qwen3-0.6b "
                   "(phaseinterp.config.PRESETS); this or --paper-run")
    p.add_argument("--paper-run", default=None, metavar="RUN",
                   help="a published controlled run's architecture (phaseinterp.paper.config: the Qwen3-0.6B "
                        "backbone with the run's W, S, KV heads, variant and seed; e.g. kvc_w8s8_1kv_baseline, "
                        "full_attn_1kv); recorded in pretrain.json; instead of --preset, --set and --config's model")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="change one architecture field (a sweep axis: window, stride, n_kv_heads, gate, payload, "
                        "positional, memory, local_window, window_offsets; compression=none for the twin); repeatable")
    p.add_argument("--config", default=None, help='a JSON file {"model": {field: value}, "train": {field: value}} '
                   "for anything else (flags given on the command line win)")
    p.add_argument("--data", default=None, help="a text, JSONL or parquet file, a folder of them, or a datasets "
                   "folder written by save_to_disk (required but with --plan)")
    p.add_argument("--tokenizer", default=None, help="a folder with tokenizer.json (`phaseinterp tokenizer train`; "
                   "required but with --plan, where it only sets d_vocab)")
    p.add_argument("--seq-len", type=_positive, default=None, help="tokens per training sequence, a multiple of "
                   "the stride (default: 512)")
    p.add_argument("--global-batch", type=_positive, default=None,
                   help="sequences per optimizer step over all processes (default: 16)")
    p.add_argument("--micro-batch", type=_positive, default=None,
                   help="sequences per forward on each process; the rest by gradient accumulation (default: all)")
    p.add_argument("--steps", type=_positive, default=None, help="optimizer steps (default: 1000)")
    p.add_argument("--seed", type=_seed, default=None, help="model and data-order seed (default: 0)")
    p.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate (default: 3e-3)")
    p.add_argument("--needle-fraction", type=float, default=None,
                   help="share of each batch's rows that are natural-text needle prompts, 0..1 (default: 0)")
    p.add_argument("--max-minutes", type=_positive_float, default=None,
                   help="stop (checkpointed) after this much wall time (default: run every step)")
    p.add_argument("--keep-every", type=_positive, default=None,
                   help="also keep every checkpoint whose step is a multiple of this (default: only the newest two)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in the backward")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true",
                           help="bfloat16 mixed precision on any device, CPU included (autocast; with --nproc, FSDP2's "
                                "bf16 parameters and fp32 reductions); recorded in the run (default: bf16 on CUDA, "
                                "fp32 on CPU)")
    precision.add_argument("--fp32", action="store_true", help="no mixed precision, on CUDA either")
    p.add_argument("--nproc", type=_positive, default=1,
                   help="processes (torchrun): at most the CUDA devices, or the CPU cores without CUDA (default: 1)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out; refuses changed settings")
    add_options(p, PlanOptions)
    _out_arg(p, what="the run (checkpoints, curves, the final model)", overwrite=False, when="needed but with --plan")

    p = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer on local text")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True, parser_class=_Parser, metavar="TOKENIZER_COMMAND")
    t = tsub.add_parser("train", help="train a BPE tokenizer (phaseinterp.train.tokenizer.train_tokenizer)")
    t.add_argument("--data", required=True, help="a text, JSONL or parquet file, or a folder of them")
    t.add_argument("--vocab-size", type=_positive, required=True, help="tokens in the vocabulary, >= 260")
    _out_arg(t, required=True, what="tokenizer.json and tokenizer_config.json")

    p = sub.add_parser("zoo", help="list or rebuild the zoo models", description="The zoo: shipped checkpoints "
                       "and recipes without a shipped checkpoint.")
    zsub = p.add_subparsers(dest="zoo_command", required=True, parser_class=_Parser, metavar="ZOO_COMMAND")
    z = zsub.add_parser("list", help="every zoo name, whether its checkpoint ships, and how to rebuild it")
    z.add_argument("--markdown", action="store_true", help="print the README's zoo table instead")
    b = zsub.add_parser("build", help="retrain a zoo model with the shared recipe and install it")
    b.add_argument("name", help="a zoo name (see `phaseinterp zoo list`)")
    b.add_argument("--out-dir", default=None, help="run directory (default: runs/zoo/NAME)")
    add_options(b, DeviceOptions)
    b.add_argument("--no-install", action="store_true", help="train only; do not copy the snapshot into the package")
    b.add_argument("--threads", type=_positive, default=1,
                   help="CPU threads (default: 1, which reproduces the shipped checkpoints bit for bit)")
    b.add_argument("--steps", type=_positive, default=None,
                   help="HF DeepSeek-V4 recipes only (dsv4-tiny ...): train this many steps instead of the "
                        "recipe's, e.g. for a quick check (default: the recipe's)")
    e = zsub.add_parser("export", help="write a shipped HF DeepSeek-V4 zoo model in DeepSeek's released layout",
                        description="Write a shipped tiny DeepSeek-V4 (dsv4-tiny, dsv4.1-tiny, dsv4-tiny-fp8) with DeepSeek's own "
                        "tensor names, sharded safetensors + index, the release's config fields and (--fp8) FP8 e4m3 "
                        "weights with 128x128 block scales: a fixture for loading real checkpoints with load_hf.")
    e.add_argument("name", help="a shipped HF DeepSeek-V4 zoo name (dsv4-tiny, dsv4.1-tiny, dsv4-tiny-fp8)")
    e.add_argument("--layout", required=True, help="tensor layout to write (valid: deepseek)")
    e.add_argument("--fp8", action="store_true", help="FP8 e4m3 + block scales where the release quantizes")
    e.add_argument("--fp8-scales", default=None,
                   help="FP8 block scales: pow2 (powers of two, scale_fmt ue8m0, DeepSeek-V4's format; the default) "
                   "or exact (float32 max|w|/448, scale_fmt float); needs --fp8")
    e.add_argument("--experts", default=None,
                   help="routed experts: fp4 (MXFP4 as DeepSeek-V4 releases them, what llama.cpp's converter needs; "
                   "the default), fp8 (FP8 blocks, needs --fp8) or float (unquantized)")
    e.add_argument("--dtype", default=None, help="dtype of the other tensors: float32 or bfloat16 (default: the model's)")
    e.add_argument("--max-shard-size", default="256KB", help="largest shard, e.g. 256KB, 5GB (default: 256KB)")
    _out_arg(e, required=True, what="the exported checkpoint")

    p = sub.add_parser("memory-plan", help="parameters, weight memory and devices a DeepSeek-V4 config needs "
                       "(phaseinterp.models.hf.memory)",
                       description="Count a DeepSeek-V4 config's parameters on PyTorch's meta device (no weights "
                       "read) and print the weight memory at bf16, fp8 / fp4 experts and fp32; with --tokens, also "
                       "the activations and the 80 GB / 141 GB devices a phase profile and a one-layer ablation "
                       "need at those prompt lengths. Needs Hugging Face transformers (the 'hf' extra).")
    p.add_argument("config", nargs="?", default=None,
                   help="a config.json or a checkpoint directory (default: transformers' DeepseekV4Config(), the "
                        "V4-Flash shape)")
    p.add_argument("--tokens", type=_int_list("lengths"), nargs="+", action=_Extend, default=None,
                   help="prompt lengths in tokens for the device plan, e.g. 131072 1048576 (default: no plan)")

    p = sub.add_parser("experiments", help="studies beyond the paper (phaseinterp.experiments)",
                       description="The studies of phaseinterp.experiments that train many runs.")
    xsub = p.add_subparsers(dest="experiment", required=True, parser_class=_Parser, metavar="EXPERIMENT")
    x = xsub.add_parser("remedy", help="one worker's share of the staggered-window remedy's twin runs",
                        description="Train worker W of N's share of the baseline and staggered twins of "
                        "phaseinterp.experiments.compare_remedy, each to STOP steps of the zoo recipe, in "
                        "RUNS/<variant>_seed<seed> (one thread; N workers train the set in parallel). Runs resume "
                        "where they stopped. --offsets, --kv-heads and --payload change both twins alike.")
    x.add_argument("runs", metavar="RUNS", help="folder of the twin runs (made if missing; its runs resume)")
    x.add_argument("stop", metavar="STOP", type=_positive, help="train each run to this step (at most the recipe's)")
    x.add_argument("share", metavar="W/N", type=_share, help="worker W (0-based) of N workers, e.g. 0/2")
    x.add_argument("seeds", metavar="SEED", type=_seed, nargs="*", default=[0, 1, 2],
                   help="training seeds of the twins (default: 0 1 2)")
    x.add_argument("--offsets", default="staggered", choices=["staggered", "staggered_layers"],
                   help="the staggered twin's window offsets; staggered_layers for one-KV-head models "
                        "(default: staggered)")
    x.add_argument("--kv-heads", type=_positive, default=None, help="KV heads of both twins (default: the recipe's)")
    x.add_argument("--payload", default=None, choices=["per_slot", "shared"],
                   help="the compressor payload of both twins (default: the recipe's)")
    return parser
