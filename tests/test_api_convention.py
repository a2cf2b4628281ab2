"""Issue 35, item 8: one argument convention and one default size across the public functions.

The convention: a function's subject is positional (the model, then what the call is about: the task,
the tokens, the shift or shifts, the modes); every option is keyword-only. Every function that measures
accuracy by phase defaults to `DEFAULT_N_PER_RESIDUE` prompts per residue, so an experiment's clean
profile is the profile `phase_profile(model)` gives.
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp import parallel
from phaseinterp.cli.args import build_parser

# The positional parameters each public function may have (its subject). A new public function must be
# added here, which asks its author which of its parameters are the subject.
SUBJECT = {
    "load": ["name_or_path"],
    "load_hf": ["path"],
    "from_hf": ["hf_model"],
    "phase_profile": ["model", "task"],
    "engine_profile": ["engine", "task"],
    "profile_from_lm_eval": ["path"],
    "ablate": ["model", "task"],
    "specialized_units": ["model", "task"],
    "gate_profile": ["model", "task"],
    "gate_cycling_profile": ["model", "task", "shifts"],
    "gate_cycling_unit": ["model", "task", "shifts"],
    "indexer_phase": ["model", "task"],
    "force_target_selection": ["model", "task"],
    "conformance": ["model", "task", "modes"],
    "shift_gates": ["model", "shift"],
    "shifted_copy": ["model", "shift"],
    "shift_static_gates": ["model", "shift"],
    "mean_gate_logits": ["model", "tokens"],
    "keep_freed_memory": [],
}

# n_per_residue defaults that are not DEFAULT_N_PER_RESIDUE, each with its reason.
OWN_SIZE = {
    "gate_profile": (8, "reads every window of every prompt, not one answer per prompt; no moment matching"),
    "conformance": (8, "each prompt is shown at every answer phase: n * R * S sequences per mode"),
}


def _public_functions():
    return {name: getattr(pi, name) for name in dir(pi) if inspect.isfunction(getattr(pi, name))}  # no deprecated alias


def _positional(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_every_public_function_takes_only_its_subject_by_position():
    functions = _public_functions()
    assert set(functions) == set(SUBJECT), "a public function was added or removed: state its subject in SUBJECT"
    wrong = {name: _positional(fn) for name, fn in functions.items() if _positional(fn) != SUBJECT[name]}
    assert not wrong, f"options that are positional (make them keyword-only): {wrong}"


def test_the_sharded_variants_follow_the_same_convention():
    for name in parallel.__all__:
        fn = getattr(parallel, name)
        if name.startswith("sharded_") and inspect.isfunction(fn):
            assert _positional(fn) in (["model", "task"], ["model", "task", "shifts"]), (name, _positional(fn))


def test_one_default_size_for_every_accuracy_by_phase_function():
    assert pi.DEFAULT_N_PER_RESIDUE == 72
    checked = 0
    for name, fn in _public_functions().items():
        parameter = inspect.signature(fn).parameters.get("n_per_residue")
        if parameter is None:
            continue
        checked += 1
        if name in OWN_SIZE:
            assert parameter.default == OWN_SIZE[name][0], name
        elif name == "gate_cycling_profile":
            assert parameter.default is None  # the baseline's size if one is given, else the default (below)
        else:
            assert parameter.default == pi.DEFAULT_N_PER_RESIDUE, (name, parameter.default)
    assert checked >= 9
    for name in ("sharded_profile", "sharded_ablate"):
        assert inspect.signature(getattr(parallel, name)).parameters["n_per_residue"].default == pi.DEFAULT_N_PER_RESIDUE
    assert inspect.signature(parallel.sharded_gate_cycling_profile).parameters["n_per_residue"].default is None


def test_the_command_line_takes_the_same_default():
    parser = build_parser()
    assert parser.parse_args(["profile", "w4s4"]).n_per_residue == pi.DEFAULT_N_PER_RESIDUE
    assert parser.parse_args(["ablate", "w4s4"]).n_per_residue == pi.DEFAULT_N_PER_RESIDUE
    assert parser.parse_args(["cycle", "w4s4"]).n_per_residue is None  # then the baseline's size, else the default


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


@pytest.fixture(scope="module")
def default_profile(w4s4):
    return pi.phase_profile(w4s4, progress=False)  # the task stored with the model, the default size


def test_phase_profile_takes_the_models_task_like_every_experiment(w4s4, default_profile):
    explicit = pi.phase_profile(w4s4, pi.zoo.task_for(w4s4), n_per_residue=72, progress=False)
    pd.testing.assert_frame_equal(default_profile.records, explicit.records, check_exact=True)
    assert len(default_profile.records) == 72 * 24


def test_an_experiments_clean_run_is_the_default_profile(w4s4, default_profile):
    """What one default buys: ``ablate(model)``'s clean prompts and ``gate_cycling_profile(model)``'s
    unshifted row are the prompts and answers of ``phase_profile(model)``, prompt for prompt (with 0.2's
    250 against 72 they were different prompts)."""
    correct = default_profile.records["correct"].to_numpy()
    ablation = pi.ablate(w4s4, layer=1, progress=False)
    assert np.array_equal(ablation.residue, default_profile.records["residue"].to_numpy())
    assert np.array_equal(np.asarray(ablation.clean_correct, bool), correct)
    cycling = pi.gate_cycling_profile(w4s4, shifts=[1], progress=False)
    assert np.array_equal(np.asarray(cycling.correct[0], bool), correct)
    # baseline=default_profile giving the same rows as this rerun: tests/test_interventions.py,
    # test_gate_cycling_takes_the_baseline_size_by_default and test_gate_cycling_reuses_a_profile_*


def test_phase_profile_refuses_an_engine_naming_engine_profile():
    from phaseinterp.engines import CacheEngine

    with pytest.raises(pi.errors.UserInputError, match=r"is an engine .* phaseinterp\.engine_profile\(engine, task"):
        pi.phase_profile(CacheEngine(pi.load("w4s4")), stride=4, progress=False)


# ------------------------------------------------------------------ options by position
def test_an_option_by_position_is_python_s_type_error(w4s4):
    """0.3's one-release shim (an option that 0.3 made keyword-only, still passed by position) is gone
    in 0.4 (docs/migration.md): Python refuses the call, the sharded variants alike."""
    task = pi.zoo.task_for(w4s4)
    with pytest.raises(TypeError, match="positional"):
        pi.phase_profile(w4s4, task, 72)
    with pytest.raises(TypeError, match="positional"):
        pi.shift_gates(w4s4, 1, [0])
    with pytest.raises(pi.errors.UserInputError, match="sharded_profile: too many positional arguments"):
        parallel.sharded_profile(w4s4, task, 72, out_dir="unused")
    assert _positional(parallel.sharded_profile) == ["model", "task"]
