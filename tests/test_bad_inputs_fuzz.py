"""A fuzzer drawn from the declarations (issue 58): every option of every experiment spec (its dataclass
fields), every flag the command line declares with what it needs or excludes (`phaseinterp._checks.option`
on the options classes a command's flags are made from: `phaseinterp.cli.args.declared_needs`), every kind of name (hook points, layer indices, zoo names, presets,
shifts) and every path case of the one path door (`phaseinterp._files.check_write_target` /
`check_path_roles`). Each draw must give a `UserInputError` (exit 2 on the command line) that names the
field or value, before any model work (a time budget per case shows it), or a correct result.

Hypothesis draws the values; the fast tier runs a fixed-seed sample (``PHASEINTERP_FUZZ58_EXAMPLES``,
default 25 per test), the slow tier (``-m slow``) every declared case and 300 draws per test. The counts
(``COUNTS``) are printed after the file's tests by the `report_counts` fixture (RESULTS, "Bad inputs", quotes them):

    python -m pytest tests/test_bad_inputs_fuzz.py -n 0 -s -p no:randomly
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phaseinterp as pi
from phaseinterp.cli import main
from phaseinterp._checks import GIVEN
from phaseinterp.cli.args import build_parser, declared_needs
from phaseinterp.engines.check import ConformanceSpec
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.ablation import AblationSpec
from phaseinterp.interventions.confirm import ConfirmSpec, ReplacementSpec
from phaseinterp.interventions.gate_cycling import CyclingSpec
from phaseinterp.interventions.gate_stats import GateProfileSpec
from phaseinterp.interventions.indexer import IndexerSpec
from phaseinterp.interventions.unit_cycling import SelectionSpec, UnitCyclingSpec
from phaseinterp.models.loading import peek
from phaseinterp.profile import ProfileSpec
from typecheck import as_user

EXAMPLES = int(os.environ.get("PHASEINTERP_FUZZ58_EXAMPLES", "25"))
FAST = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=300)
BUDGET_S = 2.0  # a refusal comes before any model work: each case within this (a forward would not)
COUNTS: collections.Counter = collections.Counter()

SPECS = [ProfileSpec, AblationSpec, CyclingSpec, UnitCyclingSpec, GateProfileSpec, ConformanceSpec, SelectionSpec,
         IndexerSpec, ReplacementSpec, ConfirmSpec]
FIELDS = [(spec, f.name) for spec in SPECS for f in dataclasses.fields(spec)]
# what a spec needs beside the drawn option (gate_cycling_unit names its unit)
BASE = {UnitCyclingSpec: {"layers": [0]}}


class Opaque:
    """A value of no type any option takes."""

    def __repr__(self) -> str:
        return "Opaque()"


# The declared cases of an option's value: wrong types, out of range, None, strings, numpy scalars.
CASES = {"None": None, "string": "x", "numeric string": "3", "negative": -1, "zero": 0, "huge": 10**12,
         "fraction": 2.5, "NaN": math.nan, "inf": math.inf, "bool": True, "list": [1, 2], "empty list": [],
         "object": Opaque(), "numpy int": np.int64(3), "numpy float": np.float64(0.5), "dict": {"a": 1}}
values = st.one_of(st.sampled_from(list(CASES.values())), st.integers(-10**13, 10**13), st.floats(allow_nan=True),
                   st.text(max_size=5), st.lists(st.integers(-3, 30), max_size=3),
                   st.integers(-3, 30).map(np.int64), st.floats(-2, 2).map(np.float64))




@pytest.fixture(scope="module")
def described():
    return peek("w4s4")  # the config only: what the command line checks before the weights load


def _names_it(message: str, name: str, value) -> bool:
    """The message names the field (or one of its items: ``layer=`` for ``layers``) or shows the value."""
    stems = {name, name.rstrip("s"), name.removesuffix("es"), name.split("_")[0]}
    return any(stem and stem in message for stem in stems) or repr(value) in message or str(value) in message


def _option_case(spec_type, name, value, model) -> str:
    """One option drawn: "refused" (named), "accepted" (a spec that also passes the model's checks or is
    refused there by name); anything else fails the test."""
    started = time.monotonic()
    try:
        with as_user():
            spec = spec_type(**{**BASE.get(spec_type, {}), name: value})
            spec.check_model(model)
        outcome = "accepted"
    except UserInputError as err:
        message = str(err)
        assert "\n" not in message.strip(), message
        if spec_type is IndexerSpec and "no indexer" in message:
            outcome = "refused (model)"  # w4s4 has no CSA layer: the model is what is named
        else:
            assert _names_it(message, name, value), f"{spec_type.__name__}({name}={value!r}): {message}"
            outcome = "refused"
    assert time.monotonic() - started < BUDGET_S
    return outcome


@pytest.mark.parametrize("spec_type, name", FIELDS, ids=[f"{s.__name__}.{n}" for s, n in FIELDS])
def test_every_option_takes_every_declared_case(spec_type, name, described):
    for value in CASES.values():
        outcome = _option_case(spec_type, name, value, described)
        COUNTS[f"options x cases: {outcome}"] += 1


@pytest.mark.parametrize("spec_type, name", FIELDS, ids=[f"{s.__name__}.{n}" for s, n in FIELDS])
@FAST
@given(value=values)
def test_every_option_takes_drawn_values(spec_type, name, value, described):
    COUNTS[f"options x drawn: {_option_case(spec_type, name, value, described)}"] += 1


@pytest.mark.slow
@SLOW
@given(field=st.sampled_from(FIELDS), value=values)
def test_every_option_takes_many_drawn_values(field, value, described):
    COUNTS[f"options x drawn (slow): {_option_case(*field, value, described)}"] += 1


def test_every_declared_need_is_refused_naming_both():
    for spec_type in SPECS:
        for name, ((other, _want),) in {f.name: f.metadata["needs"] for f in dataclasses.fields(spec_type)
                                        if f.metadata.get("needs")}.items():
            setting = {"hold": 3, "length_modulus": 4, "dtypes": ("float16",), "n_bootstrap": 50}[name]
            wrong = {"axis": "target", "modes": ("decode",), "interval": "wilson"}[other]
            with pytest.raises(UserInputError) as err:
                spec_type(**{name: setting, other: wrong})
            assert f"{name}=" in str(err.value) and other in str(err.value)
            COUNTS["combinations: refused"] += 1
        for name, (other,) in {f.name: f.metadata["excludes"] for f in dataclasses.fields(spec_type)
                               if f.metadata.get("excludes")}.items():
            with pytest.raises(UserInputError, match=f"{name}=.*replaces {other}="):
                spec_type(**{name: [[0]], other: "layer"})
            COUNTS["combinations: refused"] += 1


# ------------------------------------------------------------------ the command line's flags
# Every flag of the experiment commands and what it does (the flag walk's fixture): "spec" (fills the
# command's spec: its records change), "needs" (declared with what it needs: refused without it),
# or where else it acts. A new flag fails `test_every_flag_is_declared` until it is listed here.
FLAGS = {
    "profile": {"model": "the model run", "device": "where it runs (refused with --engine)",
                "engine": "the served model asked instead", "label": "spec", "n_per_residue": "spec",
                "stride": "spec", "padding": "the task's layout", "axis": "spec", "hold": "spec (needs --axis length)",
                "length_modulus": "spec (needs --axis length)", "seed": "spec", "out": "where the result is saved",
                "shard_dir": "the shard folder (resume, torchrun)", "query_chunk": "the model's attention chunks "
                "(refused with --engine)", "paper": "the published run compared with"},
    "ablate": {"model": "the model run", "device": "where it runs", "layer": "spec", "scope": "spec",
               "n_per_residue": "spec", "n_calibration": "spec", "method": "spec", "out": "where it is saved",
               "shard_dir": "the shard folder", "query_chunk": "the model's attention chunks",
               "paper": "the published run compared with"},
    "cycle": {"model": "the model run", "device": "where it runs", "shifts": "spec", "layer": "spec", "branch": "spec",
              "score": "which spec (profile or unit)", "kv_heads": "spec", "mode": "spec", "measure": "spec (unit)",
              "baseline": "the unshifted row read from a profile", "n_per_residue": "spec",
              "out": "where it is saved", "shard_dir": "the shard folder", "query_chunk": "the model's attention chunks",
              "paper": "the published run compared with"},
    "gates": {"model": "the model run", "device": "where it runs", "n_per_residue": "spec", "out": "where it is saved"},
    "conformance": {"model": "the model run", "device": "where it runs", "modes": "spec", "dtypes": "spec",
                    "n_per_residue": "spec", "chunk": "spec", "seed": "spec", "out": "where it is saved"},
    "merge": {"dir": "the shard folder read", "out": "where it is saved"},
}


# The other commands' flags, each of which acts wherever given (what it changes: the command's docs).
FLAGS.update({name: {dest: "acts" for dest in dests.split()} for name, dests in {
    "demo": "model twin out overwrite quick full no_static deepseek_v4 remedy device",
    "report": "model device twin out overwrite quick full no_static", "check-report": "dir",
    "screenshot": "dir png overwrite", "paper": "list no_static out overwrite",
    "lm-eval-task": "model n_per_residue seed name out overwrite",
    "train": "zoo_recipe compression window stride gate n_layers n_kv_heads steps batch_size lr seed resume device out",
    "tokenizer train": "data vocab_size out overwrite", "zoo list": "markdown",
    "zoo build": "name out_dir device no_install threads steps",
    "zoo export": "name layout fp8 fp8_scales experts dtype max_shard_size out overwrite",
    "memory-plan": "config tokens", "experiments remedy": "runs stop share seeds offsets kv_heads payload",
}.items()})
# pretrain's flags and what each changes in a run (`test_every_pretrain_flag_alone_changes_the_run_or_is_refused`
# walks them): "record" (the run's pretrain.json: its model, recipe, data or tokenizer), or where else it acts.
FLAGS["pretrain"] = {
    "preset": "record (the architecture)", "paper_run": "record (a published run's architecture; refused beside "
    "--preset)", "overrides": "record (--set: one architecture field)", "config": "record (a JSON file's fields)",
    "data": "record (the corpus)", "tokenizer": "record (the tokenizer and d_vocab)",
    "seq_len": "record", "global_batch": "record", "micro_batch": "record", "steps": "record", "seed": "record",
    "lr": "record", "needle_fraction": "record", "max_minutes": "record", "keep_every": "record",
    "activation_checkpointing": "record", "compile": "record", "bf16": "record", "fp32": "record",
    "nproc": "the processes torchrun launches", "resume": "continues the run in --out (refused without one)",
    "plan": "prints the memory plan and writes nothing", "device_memory": "the plan's device (needs --plan)",
    "out": "where the run is written",
}


def _leaf_parsers(parser=None, prefix=""):
    """(command words, parser) of every subcommand, nested ones (``zoo build``) included."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaf_parsers(sub, f"{prefix} {name}")


@pytest.mark.parametrize("command", [c for c, _ in _leaf_parsers()])
def test_every_flag_is_declared(command):
    """Each flag acts (the fixture says where) or is declared with what it needs: none is left inert. A new
    flag fails here until it is listed in FLAGS or declared with what it needs (`declared_needs`)."""
    parser = dict(_leaf_parsers())[command]
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    undeclared = sorted(dests - set(FLAGS.get(command, {})) - set(declared_needs(parser.get_default("declared") or ())[0]))
    assert not undeclared, f"{command}: flags neither listed in FLAGS nor declared with their needs: {undeclared}"
    COUNTS["flags declared"] += len(dests)


SPEC_FLAGS = [(command, dest, value) for command, dest, value in [
    ("profile", "n_per_residue", "80"), ("profile", "seed", "3"), ("profile", "stride", "2"), ("profile", "label", "x"),
    ("profile", "axis", "length"), ("ablate", "layer", "1"), ("ablate", "scope", "layer"),
    ("ablate", "n_calibration", "48"), ("ablate", "method", "naive"), ("cycle", "shifts", "1"),
    ("cycle", "layer", "0"), ("cycle", "branch", "k"), ("cycle", "mode", "static"), ("gates", "n_per_residue", "3"),
    ("conformance", "modes", "decode"), ("conformance", "seed", "2"), ("conformance", "chunk", "8")]]


@pytest.mark.parametrize("command, dest, value", SPEC_FLAGS)
def test_a_spec_flag_alone_changes_the_spec(command, dest, value):
    """Setting a "spec" flag alone changes the spec the command runs (so its records), never nothing."""
    from phaseinterp.cli import commands

    flag = f"--{dest.replace('_', '-')}"
    plain = build_parser().parse_args([command, "w4s4"])
    given = build_parser().parse_args([command, "w4s4", flag, value])
    spec_type = commands._spec_type(given)
    with as_user():
        assert spec_type.from_args(given) != spec_type.from_args(plain), f"{command} {flag} {value} changed nothing"
    COUNTS["flags x alone: changes the spec"] += 1


VALUES = {"tokenizer": "{t}", "measure": "accuracy", "branch": "k", "dtypes": "float16", "paper_padding": "prefix",
          "paper_figure": "{t}/f.html", "engine": "http://localhost:9", "device": "cpu", "out": "{t}/o"}
POSITIONAL = {"merge": ["{t}"], "paper": [], "pretrain": ["--preset", "tiny"]}  # before its flags (default: a model)


def _written(parser, dest):
    """``[flag]`` or ``[flag, value]`` as a user writes ``dest`` on the command ``parser``'s line."""
    action = next(a for a in parser._actions if a.dest == dest)
    return [action.option_strings[0]] + ([] if action.nargs == 0 else [VALUES.get(dest, "5")])


def _needs_cases():
    """Every declared need and exclusion of every command that can fail there (a need of an --out that is
    required or has a default always holds)."""
    for command, parser in _leaf_parsers():
        actions = {a.dest: a for a in parser._actions}
        needs, excludes = declared_needs(parser.get_default("declared") or ())
        for dest, alternatives in needs.items():
            alternatives = tuple(alt for alt in alternatives if alt[0] in actions)
            if dest not in actions or not alternatives or any(actions[o].required or actions[o].default not in (None, False)
                                       for o, want in alternatives if want is GIVEN):
                continue
            argv = [*command.split(), *POSITIONAL.get(command, ["w4s4"]), *_written(parser, dest)]
            if command == "cycle" and dest in ("branch", "baseline"):
                argv += ["--score", "unit", "--layer", "0"]
            if command == "conformance" and dest == "dtypes":
                argv += ["--modes", "decode"]
            flag = _written(parser, dest)[0]
            yield pytest.param(argv, flag, alternatives, id=f"{command} {flag}")
        for dest, (other, _) in excludes.items():
            if other not in actions or dest not in actions:
                continue
            argv = [*command.split(), *POSITIONAL.get(command, ["w4s4"]), *_written(parser, other),
                    *_written(parser, dest)]
            if other == "engine":
                argv += ["--model-name", "m"]
            flag, with_flag = _written(parser, dest)[0], _written(parser, other)[0]
            yield pytest.param(argv, flag, ((other, GIVEN),), id=f"{command} {flag} with {with_flag}")


@pytest.mark.parametrize("argv, flag, alternatives", list(_needs_cases()))
def test_a_flag_that_cannot_act_exits_2_before_any_work(argv, flag, alternatives, tmp_path, capsys, monkeypatch):
    from phaseinterp.cli import commands

    monkeypatch.setattr(commands.loading, "load", lambda *a, **k: pytest.fail("the model loaded"))
    started = time.monotonic()
    code = main([a.replace("{t}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and flag in err, err
    assert any(f"--{other.replace('_', '-')}" in err for other, _ in alternatives), err
    assert time.monotonic() - started < BUDGET_S
    COUNTS["flags x needs: exit 2"] += 1


# ------------------------------------------------------------------ pretrain's flags, each alone
@pytest.fixture(scope="module")
def pretrain_inputs(tmp_path_factory):
    """What the pretrain walk changes one at a time: two corpora (pydoc's topics, on every Python), two
    tokenizers and two recipe files; ``base``: a tiny run of 2 steps of 2 x 64 tokens, ``{out}`` its folder."""
    pytest.importorskip("tokenizers")
    import json

    from pydoc_data.topics import topics

    from phaseinterp.train.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("pretrain-walk")
    paragraphs = [p for k in sorted(topics) for p in topics[k].split("\n\n") if len(p) > 80]
    for name, part in (("a.jsonl", paragraphs[:1200]), ("b.jsonl", paragraphs[300:])):
        (root / name).write_text("".join(json.dumps({"text": p}) + "\n" for p in part))
    with as_user():
        train_tokenizer(root / "a.jsonl", 640, root / "tok-a", progress=False)  # >= 32 single-token words: the probe
        train_tokenizer(root / "a.jsonl", 700, root / "tok-b", progress=False)
    recipe = {"warmup_steps": 1, "probe_every": 2, "probe_per_residue": 1, "checkpoint_every": 2}
    (root / "recipe.json").write_text(json.dumps({"train": recipe}))
    (root / "recipe-lr.json").write_text(json.dumps({"train": {**recipe, "lr": 0.01}}))
    base = ["pretrain", "--preset", "tiny", "--data", str(root / "a.jsonl"), "--tokenizer", str(root / "tok-a"),
            "--seq-len", "64", "--global-batch", "2", "--steps", "2", "--config", str(root / "recipe.json"),
            "--out", "{out}"]
    return {"root": root, "base": base}


# Each pretrain flag set alone on the base run: (the flag and value replacing the base's, or added; what must
# follow). "record": the run's pretrain.json differs from the base run's; "refused": exit 2 naming the flag;
# "launch": torchrun is started with that many processes; "plan": the plan is printed and nothing written;
# "where": the run is written to the other folder.
PRETRAIN_WALK = {
    "preset": (["--preset", "cpu-small"], "record"), "paper_run": (["--paper-run", "kvc_w8s8_1kv_baseline"], "refused"),
    "overrides": (["--set", "gate=vector"], "record"), "config": (["--config", "{root}/recipe-lr.json"], "record"),
    "data": (["--data", "{root}/b.jsonl"], "record"), "tokenizer": (["--tokenizer", "{root}/tok-b"], "record"),
    "seq_len": (["--seq-len", "128"], "record"), "global_batch": (["--global-batch", "4"], "record"),
    "micro_batch": (["--micro-batch", "1"], "record"), "steps": (["--steps", "3"], "record"),
    "seed": (["--seed", "1"], "record"), "lr": (["--lr", "0.01"], "record"),
    "needle_fraction": (["--needle-fraction", "0.5"], "record"), "max_minutes": (["--max-minutes", "5"], "record"),
    "keep_every": (["--keep-every", "1"], "record"), "activation_checkpointing": (["--activation-checkpointing"], "record"),
    "compile": (["--compile"], "record"), "bf16": (["--bf16"], "record"), "fp32": (["--fp32"], "record"),
    "nproc": (["--nproc", "2"], "launch"), "resume": (["--resume"], "refused"), "plan": (["--plan"], "plan"),
    "device_memory": (["--device-memory", "40"], "refused"), "out": (["--out", "{root}/elsewhere-{case}"], "where"),
}
# The flags whose change alters the numbers a CPU step computes (the rest change speed, memory, what is kept,
# or a GPU's precision: their run trains the same model, and the record says how it ran).
NUMERIC = {"preset", "overrides", "config", "data", "tokenizer", "seq_len", "global_batch", "steps", "seed", "lr",
           "needle_fraction", "bf16"}


def _pretrain_argv(inputs, dest, out):
    """The base argv with ``dest``'s change (None: the base run), its folder ``out``."""
    argv = list(inputs["base"])
    if dest is not None:
        change = [a.replace("{root}", str(inputs["root"])).replace("{case}", dest) for a in PRETRAIN_WALK[dest][0]]
        if change[0] in argv and len(change) == 2:
            argv[argv.index(change[0]) + 1] = change[1]
        else:
            argv += change
    return [a.replace("{out}", str(out)) for a in argv]


def _pretrain_run(inputs, dest, out, stub=True):
    """(exit code, stdout, stderr, pretrain.json or None, torchrun commands started) of one walk case; with
    ``stub`` the training itself is replaced (every check, the record and the tokenized data are real)."""
    import io
    import json
    import types
    from contextlib import redirect_stderr, redirect_stdout

    import pandas as pd

    from phaseinterp.cli import commands

    launched, stdout, stderr = [], io.StringIO(), io.StringIO()
    argv = _pretrain_argv(inputs, dest, out)
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(stdout), redirect_stderr(stderr):
        if stub:
            patch.setattr(commands, "pretrain", lambda *a, **k: types.SimpleNamespace(model=None, curves=pd.DataFrame()))
        patch.setattr(commands.subprocess, "call", lambda command, **k: launched.append(command) or 0)
        patch.setenv("PHASEINTERP_NO_PROGRESS", "1")
        code = main(argv)
    folder = Path(argv[argv.index("--out") + 1])
    record = json.loads((folder / "pretrain.json").read_text()) if (folder / "pretrain.json").is_file() else None
    return code, stdout.getvalue(), stderr.getvalue(), record, launched


@pytest.fixture(scope="module")
def pretrain_base(pretrain_inputs, tmp_path_factory):
    """The base run's record (training stubbed)."""
    code, _, err, record, _ = _pretrain_run(pretrain_inputs, None, tmp_path_factory.mktemp("pretrain-base") / "run")
    assert code == 0 and record is not None, err
    return record


@pytest.mark.parametrize("dest", list(PRETRAIN_WALK))
def test_every_pretrain_flag_alone_changes_the_run_or_is_refused(dest, pretrain_inputs, pretrain_base, tmp_path):
    """The flag walk of ``pretrain`` (issue 57's flags, now settled): each flag set alone on a tiny run either
    changes what the run records and trains (pretrain.json: model, recipe, data, tokenizer), launches the
    processes it names, prints the plan instead, or exits 2 naming itself; never a run equal to the base one.
    The training is stubbed here (every check, the record and the tokenized corpus are real);
    `test_a_pretrain_flag_changes_the_trained_model` and the slow tier train for real."""
    outcome = PRETRAIN_WALK[dest][1]
    code, out, err, record, launched = _pretrain_run(pretrain_inputs, dest, tmp_path / "run")
    flag = PRETRAIN_WALK[dest][0][0]
    if outcome == "refused":
        assert code == 2 and flag in err and record is None, err
    elif outcome == "record":
        assert code == 0, err
        changed = {part for part in ("model", "train", "data", "tokenizer") if record[part] != pretrain_base[part]}
        assert changed, f"pretrain {flag} changed nothing in pretrain.json"
    elif outcome == "launch":
        assert code == 0 and len(launched) == 1 and "--nproc-per-node=2" in launched[0], (err, launched)
    elif outcome == "plan":
        assert code == 0 and out.startswith("plan:") and not (tmp_path / "run").exists(), (out, err)
    else:  # where: the same run, written elsewhere
        assert code == 0 and record == pretrain_base and not (tmp_path / "run").exists(), err
    COUNTS[f"pretrain flags alone: {outcome}"] += 1


def _trained(inputs, dest, out):
    """The record and final weights of a real run (2 steps) with ``dest``'s change (None: the base run)."""
    from safetensors.torch import load_file

    code, _, err, record, _ = _pretrain_run(inputs, dest, out, stub=False)
    assert code == 0, err
    argv = _pretrain_argv(inputs, dest, out)
    return record, load_file(Path(argv[argv.index("--out") + 1]) / "model.safetensors")


def _differs(a, b) -> bool:
    """Whether two runs' weights differ beyond float summation order. Micro-batches add the gradient in
    another order; AdamW divides each update by the gradient's own scale, so where a gradient is near zero
    that order moves the weight by up to the step size: isolated weights (1 of 40,160 on an AVX2 CPU),
    never most of them. A real change moves nearly every weight (over 98% for --lr or --global-batch)."""
    import torch

    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return True
    moved = sum(int((~torch.isclose(a[k], b[k], rtol=1e-4, atol=1e-6)).sum()) for k in a)
    return moved > 0.01 * sum(a[k].numel() for k in a)


@pytest.fixture(scope="module")
def trained_base(pretrain_inputs, tmp_path_factory):
    """The base run's final weights, trained for real."""
    return _trained(pretrain_inputs, None, tmp_path_factory.mktemp("pretrain-trained") / "base")[1]


def test_a_pretrain_flag_changes_the_trained_model(pretrain_inputs, trained_base, tmp_path):
    """The fast tier's sample of real training: --seed alone changes the weights the run ends with."""
    record, weights = _trained(pretrain_inputs, "seed", tmp_path / "seed")
    assert record["train"]["seed"] == 1 and _differs(weights, trained_base)
    COUNTS["pretrain flags alone, trained: the model changes"] += 1


@pytest.mark.slow
@pytest.mark.parametrize("dest", [d for d, (_, outcome) in PRETRAIN_WALK.items() if outcome == "record" and d != "compile"])
def test_every_pretrain_flag_alone_changes_the_trained_run(dest, pretrain_inputs, trained_base, tmp_path):
    """The slow tier: each "record" flag trained for real (2 steps; --compile, which needs a C compiler for
    torch.compile on the CPU and only changes speed, is left to the stubbed walk). A flag of `NUMERIC` changes
    the weights; the others train the same model (to float summation order) and record how."""
    _, weights = _trained(pretrain_inputs, dest, tmp_path / dest)
    assert _differs(weights, trained_base) == (dest in NUMERIC), dest
    COUNTS["pretrain flags alone, trained (slow)"] += 1


# ------------------------------------------------------------------ names at their doors
def _mutations(name: str):
    """Near misses of a real name: a letter dropped, doubled or swapped, a case change, a digit bumped."""
    out = {name[:-1], name + name[-1], name.upper(), name.replace("_", "-"), name.replace(".", "_")}
    if len(name) > 3:
        out.add(name[:2] + name[3] + name[2] + name[4:])
    digits = [i for i, c in enumerate(name) if c.isdigit()]
    if digits:
        i = digits[0]
        out.add(name[:i] + "9" + name[i + 1:])
    return sorted(n for n in out if n and n != name)


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


def _refused_naming(call, shown: str, kind: str) -> None:
    started = time.monotonic()
    with as_user(), pytest.raises(UserInputError) as err:
        call()
    assert shown in str(err.value), str(err.value)
    assert time.monotonic() - started < BUDGET_S
    COUNTS[f"names x cases: {kind}"] += 1


@FAST
@given(data=st.data())
def test_a_near_miss_hook_name_is_refused_naming_it(data, w4s4):
    import torch

    real = data.draw(st.sampled_from(sorted(w4s4.hook_dict)))
    name = data.draw(st.sampled_from(_mutations(real)))
    if name in w4s4.hook_dict:
        return
    tokens = torch.zeros(1, 4, dtype=torch.long)
    where = data.draw(st.sampled_from(["fwd_hooks", "names_filter", "hooks"]))
    if where == "fwd_hooks":
        call = lambda: w4s4.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: None)])  # noqa: E731
    elif where == "names_filter":
        call = lambda: w4s4.run_with_cache(tokens, names_filter=[name])  # noqa: E731
    else:
        def call():
            with w4s4.hooks(fwd_hooks=[(name, lambda x, hook: None)]):
                pass
    _refused_naming(call, repr(name), f"hook names ({where})")
    assert not any(h.fwd_hooks for h in w4s4.hook_dict.values())  # nothing left attached


@FAST
@given(layer=st.one_of(st.integers(-5, -1), st.integers(2, 40), st.sampled_from([1.0, "0", True, None, 2**63])))
def test_a_layer_index_out_of_range_is_refused_naming_the_range(layer, w4s4):
    _refused_naming(lambda: pi.ablate(w4s4, layer=[layer] if layer is not None else []), "layer=", "layer indices")


@FAST
@given(data=st.data())
def test_a_near_miss_zoo_name_or_preset_is_refused_listing_choices(data):
    from phaseinterp.config import PRESETS, preset

    zoo_name = data.draw(st.sampled_from(sorted(pi.zoo.available())))
    miss = data.draw(st.sampled_from(_mutations(zoo_name)))
    if miss not in pi.zoo.available() and not Path(miss).exists():
        _refused_naming(lambda: pi.load(miss), repr(miss), "zoo names")
    name = data.draw(st.sampled_from(sorted(PRESETS)))
    miss = data.draw(st.sampled_from(_mutations(name)))
    if miss not in PRESETS:
        _refused_naming(lambda: preset(miss), repr(miss), "presets")


@FAST
@given(shift=st.one_of(st.integers(-12, 12).filter(lambda d: d % 4 == 0), st.sampled_from([1.5, "1", None, True])))
def test_a_shift_that_moves_nothing_is_refused(shift, w4s4):
    _refused_naming(lambda: pi.gate_cycling_profile(w4s4, shifts=[shift]), "shift", "shifts")


SERVED = ("w4s4-served", "qwen3-0.6b-kv")  # the stand-in server's models


@pytest.fixture(scope="module")
def served():
    """A stand-in OpenAI-compatible server: ``GET /v1/models`` lists `SERVED`; every completion is refused
    with HTTP 404 (as vLLM answers a model it does not serve). ``posts`` counts the completions asked."""
    import http.server
    import json
    import threading
    from types import SimpleNamespace

    posts = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path.rstrip("/") == "/v1/models":
                self._answer(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in SERVED]})
            else:
                self._answer(404, {"error": "no such path"})

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posts.append(self.path)
            self._answer(404, {"error": {"message": "The model does not exist.", "type": "NotFoundError"}})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}", posts=posts)
    server.shutdown()
    server.server_close()


@FAST
@given(data=st.data())
def test_a_near_miss_engine_model_name_is_refused_listing_the_served_ones(data, served, capsys):
    """``--model-name`` / ``OpenAIEngine(model=)`` resolved against the names the server lists (GET /v1/models)
    by the shared name door: before any prompt on the command line, and on the first refused request in Python."""
    import torch

    from phaseinterp.engines import OpenAIEngine

    name = data.draw(st.sampled_from(_mutations(data.draw(st.sampled_from(SERVED)))))
    where = data.draw(st.sampled_from(["check_model_name", "a request", "CLI"]))
    listed = f"is not one of {SERVED!r}"
    if where == "CLI":
        before = len(served.posts)
        started = time.monotonic()
        code = main(["profile", "w4s4", "--engine", served.url, "--model-name", name, "--n-per-residue", "72"])
        err = capsys.readouterr().err
        assert code == 2 and f"--model-name={name!r} {listed}" in err, err
        assert len(served.posts) == before and time.monotonic() - started < BUDGET_S  # no prompt was sent
    else:
        engine = OpenAIEngine(served.url, name, d_vocab=64, timeout=5)
        call = engine.check_model_name if where == "check_model_name" else \
            (lambda: engine(torch.zeros(1, 4, dtype=torch.long)))
        _refused_naming(call, f"model={name!r} {listed}", f"engine model names ({where})")
        return
    COUNTS["names x cases: engine model names (CLI)"] += 1


def test_a_served_model_name_is_accepted_and_a_near_miss_suggests_it(served):
    from phaseinterp.engines import OpenAIEngine

    OpenAIEngine(served.url, "w4s4-served", d_vocab=64).check_model_name()  # listed: accepted
    with as_user(), pytest.raises(UserInputError, match=r"model='w4s4-servd' is not one of .*; did you mean "
                                                        r"'w4s4-served'\?"):
        OpenAIEngine(served.url, "w4s4-servd", d_vocab=64).check_model_name()
    with as_user(), pytest.raises(UserInputError, match=r"model='' must be the served model's name"):
        OpenAIEngine(served.url, "", d_vocab=64)


def _column_doors():
    """Every argument that names a column or a level of a result's table, with its valid names: (call with
    the name, the argument, the valid names)."""
    import pandas as pd

    from phaseinterp.engines.result import ConformanceResult
    from phaseinterp.interventions.indexer import RATES, IndexerPhaseResult
    from phaseinterp.plot.mechanisms import specialization_heatmap

    knockout = pi.paper.knockout("kvc_w8s8_1kv_baseline")
    indexer = IndexerPhaseResult(records=pd.DataFrame(), stride=4, residue_modulus=8, top_k=8)
    conformance = ConformanceResult(**{f.name: None for f in dataclasses.fields(ConformanceResult)
                                       if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
                                    | {"settings": ("decode", "chunked_prefill", "bfloat16")})
    return [
        (lambda v: knockout.to_frame(level=v), "level", ("phase", "residue")),
        (lambda v: indexer.to_frame(level=v), "level", ("phase", "residue")),
        (lambda v: indexer.to_frame(metric=v), "metric", RATES),
        (lambda v: indexer.plot(metric=v), "metric", RATES),
        (lambda v: specialization_heatmap(knockout, level=v), "level", ("phase", "residue")),
        (lambda v: specialization_heatmap(knockout, value=v), "value", ("auto", "pp", "relative")),
        (lambda v: conformance.failing_phases(v), "setting", ("decode", "chunked_prefill", "bfloat16")),
        (lambda v: conformance.failing_phases("decode", kind=v), "kind", ("answer", "cut")),
    ]


@FAST
@given(data=st.data())
def test_a_near_miss_column_or_level_is_refused_listing_the_valid_ones(data):
    doors = _column_doors()
    index = data.draw(st.integers(0, len(doors) - 1))
    call, argument, valid = doors[index]
    name = data.draw(st.sampled_from(_mutations(data.draw(st.sampled_from(valid)))))
    if name in valid:
        return
    _refused_naming(lambda: call(name), f"{argument}={name!r} is not one of {tuple(valid)!r}", "columns and levels")


def test_a_misspelt_column_suggests_the_nearest():
    call, _, _ = _column_doors()[0]
    with as_user(), pytest.raises(UserInputError, match=r"level='phsae' is not one of \('phase', 'residue'\); did you "
                                                        r"mean 'phase'\?"):
        call("phsae")


# ------------------------------------------------------------------ paths at one door
PATH_CASES = ["missing", "tilde", "file", "empty folder", "non-empty folder", "same kind", "same kind, overwrite",
              "link to folder", "dangling link", "below a file", "inside another output", "same as an input"]


def _profile():
    import pandas as pd

    from phaseinterp.profile import profile_from_records

    residues = np.repeat(np.arange(8), 4)
    return profile_from_records(pd.DataFrame({"residue": residues, "correct": residues % 4 != 3}), 8, 4,
                                n_permutations=9)


def _path_case(case: str, tmp: Path, monkeypatch) -> tuple[Path, dict, str | None]:
    """(the path to write, save's options, the words of the refusal or None when it must succeed)."""
    target = tmp / "out"
    if case == "tilde":
        monkeypatch.setenv("HOME", str(tmp))
        return Path("~/out"), {}, None
    if case == "file":
        target.write_text("x")
        return target, {}, "is an existing file"
    if case == "empty folder":
        target.mkdir()
    if case == "non-empty folder":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
        return target, {}, "is not empty"
    if case.startswith("same kind"):
        _profile().save(target)
        return (target, {"overwrite": True}, None) if "overwrite" in case else (target, {}, "already holds")
    if case == "link to folder":
        (tmp / "real").mkdir()
        target.symlink_to(tmp / "real")
    if case == "dangling link":
        target.symlink_to(tmp / "gone")
        return target, {}, "dangling link"
    if case == "below a file":
        (tmp / "f").write_text("x")
        return tmp / "f" / "out", {}, "is a file"
    return target, {}, None


@pytest.mark.parametrize("case", [c for c in PATH_CASES if not c.startswith(("inside", "same as"))])
def test_every_path_case_of_a_save(case, tmp_path, monkeypatch):
    target, options, refusal = _path_case(case, tmp_path, monkeypatch)
    profile = _profile()
    started = time.monotonic()
    if refusal is None:
        written = profile.save(target, **options)
        assert type(profile).load(written).period_verdict == profile.period_verdict
        assert "~" not in str(written) and not (Path.cwd() / "~").exists()
        COUNTS["paths x cases: written"] += 1
    else:
        with pytest.raises(UserInputError, match=refusal):
            profile.save(target, **options)
        COUNTS["paths x cases: refused"] += 1
    assert time.monotonic() - started < BUDGET_S
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("case", PATH_CASES)
def test_every_path_case_of_a_command(case, tmp_path, capsys, monkeypatch):
    """The same cases through the command line (`gates --out`), stopped where the checks end."""
    from phaseinterp.cli import commands

    target, options, refusal = _path_case(case, tmp_path, monkeypatch) if case not in (
        "inside another output", "same as an input") else (tmp_path / "out", {}, None)
    argv = ["gates", "w4s4", "--out", str(target)]
    if case == "same kind" or case == "same kind, overwrite":
        argv[0] = "profile"
    if options.get("overwrite"):
        argv.append("--overwrite")
    if case == "inside another output":
        argv = ["profile", "w4s4", "--out", str(tmp_path / "out"), "--shard-dir", str(tmp_path / "out" / "s")]
        refusal = "is inside --out"
    if case == "same as an input":
        (tmp_path / "base").mkdir()
        argv = ["cycle", "w4s4", "--baseline", str(tmp_path / "base"), "--out", str(tmp_path / "base")]
        refusal = "is the input --baseline"
    monkeypatch.setitem(commands.COMMANDS, argv[0], lambda args: 0)  # the checks only: no model work
    started = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    if refusal is None:
        assert code == 0, err
        COUNTS["paths x cases (CLI): accepted"] += 1
    else:
        assert code == 2 and refusal.split(" (")[0] in err, err
        COUNTS["paths x cases (CLI): exit 2"] += 1
    assert time.monotonic() - started < BUDGET_S


# ------------------------------------------------------------------ input paths at the readers' door
def _py(reader):
    """A Python reader called with the path, as a user calls it."""
    def call(path, tmp):
        with as_user():
            reader(path, tmp)
    return call


def _reader_calls():
    from phaseinterp.engines import LlamaCppEngine
    from phaseinterp.parallel import merge
    from phaseinterp.train.corpus import source_files
    from phaseinterp.train.pretrain import load_snapshot
    from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

    load = pi.load  # taken before the test replaces the command line's loader
    return {
        "phaseinterp.load": (_py(lambda p, t: load(p)), "model", "folder"),
        "PhaseProfile.load": (_py(lambda p, t: pi.PhaseProfile.load(p)), "directory", "folder"),
        "TextTokenizer": (_py(lambda p, t: TextTokenizer(p)), "tokenizer", "folder"),
        "source_files": (_py(lambda p, t: source_files(p)), "data", "any"),
        "train_tokenizer": (_py(lambda p, t: train_tokenizer(p, 300, t / "tok-out", progress=False)), "data", "any"),
        "profile_from_lm_eval": (_py(lambda p, t: pi.profile_from_lm_eval(p)), "output_dir", "any"),
        "merge": (_py(lambda p, t: merge(p)), "directory", "folder"),
        "load_snapshot": (_py(lambda p, t: load_snapshot(p)), "run_dir", "folder"),
        "LlamaCppEngine": (_py(lambda p, t: LlamaCppEngine(p)), "gguf_path", "file"),
        "CompressedTransformer.from_pretrained": (_py(lambda p, t: pi.CompressedTransformer.from_pretrained(p)),
                                                  "directory", "folder"),
        "load_hf": (_py(lambda p, t: pi.load_hf(p)), "path", "folder"),
        "zoo.run_curves": (_py(lambda p, t: pi.zoo.run_curves("w4s4", p)), "run_dir", "folder"),
        # the command line: exit 2, the flag named
        "MODEL": (["profile", "{p}"], "MODEL", "folder"),
        "--twin": (["report", "w4s4", "--twin", "{p}", "--out", "{t}/r"], "--twin", "folder"),
        "--baseline": (["cycle", "w4s4", "--baseline", "{p}"], "--baseline", "folder"),
        "merge DIR": (["merge", "{p}"], "DIR", "folder"),
        "check-report DIR": (["check-report", "{p}"], "DIR", "any"),
        "screenshot DIR": (["screenshot", "{p}", "{t}/shot.png"], "DIR", "any"),
        "pretrain --data": (["pretrain", "--preset", "tiny", "--data", "{p}", "--out", "{t}/run"], "--data", "any"),
        "pretrain --tokenizer": (["pretrain", "--preset", "tiny", "--tokenizer", "{p}", "--plan"], "--tokenizer",
                                 "folder"),
        "pretrain --config": (["pretrain", "--preset", "tiny", "--config", "{p}", "--plan"], "--config", "file"),
        "tokenizer train --data": (["tokenizer", "train", "--data", "{p}", "--vocab-size", "300", "--out", "{t}/tok"],
                                   "--data", "any"),
        "memory-plan CONFIG": (["memory-plan", "{p}"], "CONFIG", "any"),
        "profile --engine --tokenizer": (["profile", "--engine", "http://127.0.0.1:9", "--model-name", "m",
                                          "--tokenizer", "{p}", "--stride", "4"], "--tokenizer", "folder"),
    }


READERS = list(_reader_calls())
# Each path case: (what applies to: expected kinds, the words of the refusal).
READ_CASES = {
    "missing": (("folder", "file", "any"), "does not exist"),
    "~ missing": (("folder", "file", "any"), "does not exist"),
    "below a missing folder": (("folder", "file", "any"), "does not exist (nor does its folder"),
    "dangling link": (("folder", "file", "any"), "dangling link"),
    "file for a folder": (("folder",), "is a file, not a folder"),
    "folder for a file": (("file",), "is a folder, not a file"),
    "empty folder": (("folder", "any"), "is an empty folder"),
    "unreadable": (("folder", "file", "any"), "cannot be read (permission denied)"),
    "not a path": (("folder", "file", "any"), "is not a"),
}


def _read_case(case: str, expect: str, tmp: Path, monkeypatch):
    """(the path to pass, the path as the message must show it)."""
    if case == "missing":
        return tmp / "nope", repr(str(tmp / "nope"))
    if case == "~ missing":
        monkeypatch.setenv("HOME", str(tmp))
        return "~/nope", f"'~/nope' (= {str(tmp / 'nope')!r})"
    if case == "below a missing folder":
        return tmp / "no" / "nope", repr(str(tmp / "no" / "nope"))
    if case == "dangling link":
        (tmp / "link").symlink_to(tmp / "gone")
        return tmp / "link", repr(str(tmp / "link"))
    if case == "file for a folder":
        (tmp / "f.txt").write_text("text")
        return tmp / "f.txt", repr(str(tmp / "f.txt"))
    if case in ("folder for a file", "empty folder"):
        (tmp / "d").mkdir()
        if case == "folder for a file":
            (tmp / "d" / "x.txt").write_text("x")
        return tmp / "d", repr(str(tmp / "d"))
    if case == "unreadable":
        target = tmp / ("u.gguf" if expect == "file" else "u")
        if expect == "file":
            target.write_text("x")
        else:
            target.mkdir()
            (target / "x.txt").write_text("x")
        if os.geteuid() == 0:  # root reads everything: the permission bits are what the door is told
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == target else real(p, mode, **k))
        else:
            target.chmod(0)
        return target, repr(str(target))
    return "", "''"  # not a path (the command line's empty argument; Python's 3 below)


@pytest.mark.parametrize("case", list(READ_CASES))
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_judges_every_path_case_at_the_door(reader, case, tmp_path, capsys, monkeypatch):
    """Each reader of a user's path (`phaseinterp._files.check_read_path`'s list) with each case: one
    `UserInputError` (exit 2 on the command line) naming the argument, the path as given (and as
    expanded, for ``~``) and the case, before anything is read or loaded."""
    call, name, expect = _reader_calls()[reader]
    applies, words = READ_CASES[case]
    if expect not in applies:
        pytest.skip(f"{case} is not a case of a reader that takes {expect}")
    from phaseinterp.cli import commands

    monkeypatch.setattr(commands.loading, "load", lambda *a, **k: pytest.fail("the model loaded"))
    (tmp_path / "w").mkdir()
    path, shown = _read_case(case, expect, tmp_path / "w", monkeypatch)
    started = time.monotonic()
    if callable(call):
        with pytest.raises(UserInputError) as err:
            call(3 if case == "not a path" else path, tmp_path)
        message = str(err.value)
        if case == "not a path":
            shown = "3"
    else:
        code = main([a.replace("{p}", str(path)).replace("{t}", str(tmp_path)) for a in call])
        message = capsys.readouterr().err
        assert code == 2, message
    assert f"{name}={shown}" in message and words in message, message
    assert "\n" not in message.strip() and "Traceback" not in message
    assert time.monotonic() - started < BUDGET_S
    COUNTS[f"paths x cases (readers): refused ({'CLI' if not callable(call) else 'Python'})"] += 1


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    """The counts RESULTS quotes, printed after the file's tests, capture or not (a fixture's teardown, not
    a test: it checks nothing)."""
    yield
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\nissue-58 fuzzer counts:")
        for key in sorted(COUNTS):
            print(f"  {key}: {COUNTS[key]}")
