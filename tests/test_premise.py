"""Every experiment says when its premise fails, or refuses up front (issue 45, class 1).

The walk runs each experiment on a model outside its premise: gate cycling on ``w4s4-staggered``
(its shifted gates collapse every phase) and on ``w4s4`` (a payload map per slot: a negative
control), anything about phase on the full-attention twin ``full``, and results whose own data
break the logic (a collapsed or flat profile, a flow that did not converge, a remedy without a gap
to remedy). A failed premise must show in ``premise_notes``, ``to_dict()``, ``summary()`` and the
CLI's output, and "identified" must not be claimed.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp.errors import UserInputError
from phaseinterp.interventions import CyclingResult
from phaseinterp.interventions.ablation import AblationResult

N = 8  # prompts per residue: a best-effort placement (strict=False) keeps the walk fast


@pytest.fixture(scope="module")
def zoo_models():
    models = {name: pi.zoo.load(name) for name in ("w4s4", "w4s4-staggered", "full")}
    task = pi.tasks.resolve_task(models["w4s4"])
    return models, task, task.generate(N, seed=0, strict=False)


def assert_fails_without_claim(result, *phrases: str) -> None:
    """The premise fails, every phrase is in its notes, and no identification is claimed anywhere."""
    notes = " ".join(result.premise_notes)
    assert not result.premise_holds and result.premise_notes, type(result).__name__
    for phrase in phrases:
        assert phrase in notes, (phrase, notes)
    d = result.to_dict()
    assert d["premise"] == "PREMISE FAILS" and d["premise_notes"] == list(result.premise_notes)
    table = result.summary()
    assert table.loc["premise", "value"] == "PREMISE FAILS"
    assert result.premise_notes[0] in table.loc["premise_notes", "value"]  # in full, never cut
    assert "identified" not in d and "identified" not in table.index
    if hasattr(result, "identification"):
        assert "identified" not in result.identification().columns


# ------------------------------------------------------------------ the instances of the issue
@pytest.mark.zoo("w4s4-staggered")
def test_cycling_w4s4_staggered_collapses_and_claims_nothing(zoo_models):
    models, task, prompts = zoo_models
    r = pi.gate_cycling_profile(models["w4s4-staggered"], task, [1], prompts=prompts, progress=False, n_boot=20)
    assert r.phase_accuracy().loc[1].max() < 0.05  # every phase collapses
    assert_fails_without_claim(r, "negative control", "payload map per slot", "shift +1 collapses accuracy")
    assert "not claimed" in r.to_dict()["identification"]


@pytest.mark.zoo("w4s4")
def test_cycling_w4s4_is_labelled_a_negative_control(zoo_models):
    models, task, prompts = zoo_models
    r = pi.gate_cycling_profile(models["w4s4"], task, [1], prompts=prompts, progress=False, n_boot=20)
    assert_fails_without_claim(r, "negative control", "payload map per slot")
    unit = pi.gate_cycling_unit(models["w4s4"], task, [1], layers=[0], kv_heads=[0], prompts=prompts,
                                progress=False, n_boot=20, n_calibration=48)
    assert_fails_without_claim(unit, "negative control")


@pytest.mark.zoo("w4s4-staggered")
def test_cycle_cli_prints_the_failed_premise_and_no_identification(capsys):
    """The command line prints the failed premise and its notes (w4s4's own notes, the negative control
    without a collapse, are the result's: test_cycling_w4s4_is_labelled_a_negative_control)."""
    from phaseinterp.cli import main

    name, phrases = "w4s4-staggered", ["negative control", "collapses accuracy"]

    assert main(["cycle", name, "--shifts", "1", "--n-per-residue", "72"]) == 0
    captured = capsys.readouterr()
    assert "PREMISE FAILS" in captured.out and "premise fails" in captured.err
    for phrase in phrases:
        assert phrase in captured.out
    assert "identified" not in captured.out


# ------------------------------------------------------------------ the walk: phase on full attention
@pytest.mark.zoo("full")
def test_every_phase_experiment_on_full_attention_notes_or_refuses(zoo_models):
    models, task, prompts = zoo_models
    full = models["full"]
    noted = [pi.ablate(full, task, layer=0, prompts=prompts, n_calibration=48, progress=False),
             pi.interventions.replacement_ablation(full, task, method="resample", layer=0, prompts=prompts, n_calibration=48)]
    for r in noted:
        assert not r.premise_holds and "full-attention model" in r.premise_notes[0]
        assert r.to_dict()["premise"] == "PREMISE FAILS"
    refused = {
        "gate_cycling_profile": lambda: pi.gate_cycling_profile(full, task, [1], prompts=prompts, progress=False),
        "gate_cycling_unit": lambda: pi.gate_cycling_unit(full, task, [1], layers=[0], prompts=prompts,
                                                          progress=False),
        "confirm": lambda: pi.interventions.confirm(full, task, prompts=prompts, progress=False),
        "gate_profile": lambda: pi.gate_profile(full, task, prompts=prompts),
        "indexer_phase": lambda: pi.indexer_phase(full, task, prompts=prompts),
        "force_target_selection": lambda: pi.force_target_selection(full, task, prompts=prompts),
    }
    for name, run in refused.items():
        with pytest.raises(UserInputError):
            run()
            pytest.fail(f"{name} ran on full attention without refusing")


@pytest.mark.zoo("w4s4")
def test_a_fit_premise_reports_holds(zoo_models):
    models, task, prompts = zoo_models
    r = pi.ablate(models["w4s4"], task, layer=0, prompts=prompts, n_calibration=48, progress=False)
    assert r.premise_holds and r.to_dict()["premise"] == "holds" and r.to_dict()["premise_notes"] == []


# ------------------------------------------------------------------ the walk: results whose data break the logic
def _cycling(acc_by_shift: dict, n: int = 96, stride: int = 4, recorded=()) -> CyclingResult:
    residue = np.repeat(np.arange(stride), n)
    rng = np.random.default_rng(0)
    correct = np.stack([np.concatenate([rng.random(n) < a for a in accs]) for accs in acc_by_shift.values()])
    return CyclingResult(shifts=tuple(acc_by_shift), residue=residue, correct=correct, residue_modulus=stride,
                         stride=stride, n_boot=20, premise_recorded=tuple(recorded))


def test_cycling_premise_from_its_own_data():
    moved = _cycling({0: [0.9, 0.9, 0.9, 0.3], 1: [0.3, 0.9, 0.9, 0.9]})
    assert moved.premise_holds and moved.to_dict()["identified"] == "1 of 1"
    flat = _cycling({0: [1.0, 1.0, 1.0, 1.0], 1: [1.0, 1.0, 1.0, 1.0]})
    assert_fails_without_claim(flat, "no phase gap")
    collapsed = _cycling({0: [0.9, 0.9, 0.9, 0.3], 1: [0.0, 0.01, 0.0, 0.0]})
    assert_fails_without_claim(collapsed, "shift +1 collapses accuracy")


def test_a_collapsed_profile_cannot_show_specialization():
    stride, n = 4, 60
    residue = np.repeat(np.arange(stride), n)
    clean = np.zeros(stride * n, bool)
    clean[::30] = True  # 2 of 60 right per phase: every phase collapsed
    units = pd.DataFrame({"layer": [0], "kv_head": [0], "heads": [[0]]})
    r = AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=clean[:, None],
                       residue_modulus=stride, stride=stride, scope="kv_head")
    assert not r.premise_holds and "below 10% at every phase" in r.premise_notes[0]
    one_weak = clean.copy()
    one_weak[n:] = True  # only phase 0 weak (as a boundary phase often is): no failure
    assert AblationResult(units=units, residue=residue, clean_correct=one_weak, knockout_correct=one_weak[:, None],
                          residue_modulus=stride, stride=stride, scope="kv_head").premise_holds


def test_forced_selection_that_changes_nothing_says_so():
    from phaseinterp.interventions.indexer import ForcedSelectionResult

    n = 40
    records = pd.DataFrame({"prompt": np.arange(4 * n), "residue": np.repeat(np.arange(4), n),
                            "phase": np.repeat(np.arange(4), n), "target_pos": np.arange(4 * n),
                            "clean_correct": np.repeat([1, 1, 1, 0], n).astype(bool),
                            "forced_correct": np.repeat([1, 1, 1, 0], n).astype(bool),
                            "missed": np.zeros(4 * n, bool), "changed": np.zeros(4 * n, bool)})
    r = ForcedSelectionResult(records=records, stride=4, layers=(0,), top_k=4)
    assert not r.premise_holds and "forcing changed no selection" in r.premise_notes[0]


def test_remedy_without_a_baseline_gap_says_so():
    from tests.test_remedy import _synthetic

    flat = [0.9, 0.9, 0.9, 0.9]
    r = _synthetic({"baseline": {100: flat}, "staggered": {100: flat}}, {"baseline": [3], "staggered": [1, 3]},
                   {"baseline": flat, "staggered": flat})
    assert not r.premise_holds and "no phase gap" in r.premise_notes[0]
    assert list(r.summary().index) == list(r.to_dict())


def test_a_flow_that_did_not_converge_says_so():
    from phaseinterp import theory

    model = theory.IdealizedInductionModel(N=6, S=3, L=2, heads=2)
    run = theory.gradient_flow(model, rho=0.3, seed=0, t_max=1.0, stop_at=None)
    assert not run.premise_holds and "not every head reached 0.95" in run.premise_notes[-1]


def test_a_result_saved_before_the_premise_field_loads_and_is_checked(tmp_path):
    from phaseinterp import results

    r = _cycling({0: [0.9, 0.9, 0.9, 0.3], 1: [0.0, 0.01, 0.0, 0.0]}, recorded=["not fit: a note"])
    r.save(tmp_path / "c")
    meta_path, arrays = tmp_path / "c" / "meta.json", (tmp_path / "c" / "arrays.npz").read_bytes()
    meta = json.loads(meta_path.read_text())
    del meta["fields"]["premise_recorded"]  # as an older version wrote it
    meta["content_sha256"] = results._content_hash(meta, arrays)
    meta_path.write_text(json.dumps(meta))
    old = CyclingResult.load(tmp_path / "c")
    assert old.premise_recorded == () and any("collapses" in n for n in old.premise_notes)
    r.save(tmp_path / "d")
    assert CyclingResult.load(tmp_path / "d").premise_notes == r.premise_notes


def test_uniform_gates_have_no_preferred_slot():
    from phaseinterp.interventions import GateProfile

    slots = pd.DataFrame([dict(layer=0, kv_head=0, branch="k", slot=s, phase=s, mean_alpha=0.25, static_alpha=0.25)
                          for s in range(4)])
    heads = pd.DataFrame([dict(layer=0, kv_head=0, branch="k", preferred_slot=0, static_concentration=4.0,
                               window_concentration=4.0)])
    assert_fails_without_claim(GateProfile(slots=slots, heads=heads, window=4, stride=4), "every gate is uniform")
    peaked = heads.assign(window_concentration=1.5)
    assert GateProfile(slots=slots, heads=peaked, window=4, stride=4).premise_holds


def test_a_confirmation_carries_its_parts_failed_premises():
    """An untrained model: its mean ablation's profile collapses, and confirm says so (with the part named)."""
    from phaseinterp import CompressedConfig, CompressedTransformer
    from phaseinterp.tasks import KeyValueRetrieval

    task = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
    model = CompressedTransformer(CompressedConfig(d_vocab=task.vocab.size, n_ctx=64, d_model=32, n_layers=2,
                                                   n_heads=2, n_kv_heads=1, d_head=16, d_mlp=64, window=4, stride=4,
                                                   local_window=8)).eval()
    r = pi.interventions.confirm(model, task, n_calibration=8, prompts=task.generate(12, seed=0, strict=False),
                                 nomination_prompts=task.generate(2, seed=2, strict=False), progress=False)
    assert_fails_without_claim(r, "mean ablation: ", "below 10% at every phase")


# ------------------------------------------------------------------ the walk covers every result class
# Each result class whose experiment has a premise -> the tests above that run it with the premise failing.
PREMISE_WALKED = {
    "CyclingResult": ["test_cycling_w4s4_staggered_collapses_and_claims_nothing", "test_cycling_premise_from_its_own_data"],
    "UnitCyclingResult": ["test_cycling_w4s4_is_labelled_a_negative_control"],
    "AblationResult": ["test_every_phase_experiment_on_full_attention_notes_or_refuses",
                       "test_a_collapsed_profile_cannot_show_specialization"],
    "GateProfile": ["test_uniform_gates_have_no_preferred_slot"],
    "ConfirmResult": ["test_a_confirmation_carries_its_parts_failed_premises"],
    "ForcedSelectionResult": ["test_forced_selection_that_changes_nothing_says_so"],
    "RemedyResult": ["test_remedy_without_a_baseline_gap_says_so"],
    "FlowResult": ["test_a_flow_that_did_not_converge_says_so"],
}
# Result classes without a premise check, each with the reason.
NO_PREMISE = {
    "PhaseProfile": "a measurement: a flat or collapsed profile is its answer (no period, the homogeneity p-value)",
    "PaperGates": "published numbers (phaseinterp.paper): no experiment was run here",
    "PaperCycling": "published numbers; the paper's premises are the paper's (its R² and the toolkit's beside it)",
    "PaperComparison": "a comparison with published numbers: each side keeps its own premise (the result compared)",
    "TwoAxisProfile": "two measurements (its PhaseProfiles): a flat axis is its answer",
    "ConformanceResult": "a comparison of two implementations: any difference is its answer",
    "DocstringResult": "a measurement of margins: no experiment's logic assumed",
    "IndexerPhaseResult": "a measurement of the indexer's selections; indexer_phase refuses a model without CSA layers",
    "UnitSelection": "a rule applied to an ablation (whose premise is the AblationResult's); it names no effect",
    "FlowSweep": "reports its runs' premises as numbers: fraction_reached and monotone_fraction",
    "SearchResult": "an exhaustive search: its claim (holds / margin) is computed, not assumed",
    "SearchGrid": "a list of SearchResults",
}


def test_every_result_class_with_a_premise_is_walked():
    """A result class that checks a premise (its own ``premise_notes`` or a ``premise_recorded`` field) is
    walked above with the premise failing; every other result class is listed with the reason it has none."""
    import dataclasses
    import importlib
    import pkgutil

    import phaseinterp
    from phaseinterp.results import _KINDS, Result

    for info in pkgutil.walk_packages(phaseinterp.__path__, "phaseinterp."):
        if not info.name.endswith("__main__"):
            try:
                importlib.import_module(info.name)
            except ImportError:
                continue
    classes = {cls.__name__: cls for cls in _KINDS.values() if cls.__module__.startswith("phaseinterp.")}
    checks = {name for name, cls in classes.items()
              if cls.premise_notes is not Result.premise_notes or "premise_recorded" in {f.name for f in dataclasses.fields(cls)}}
    assert checks == set(PREMISE_WALKED), (checks ^ set(PREMISE_WALKED))
    assert set(classes) - checks == set(NO_PREMISE), (set(classes) - checks) ^ set(NO_PREMISE)
    for tests in PREMISE_WALKED.values():
        for test in tests:
            assert callable(globals().get(test)), test
