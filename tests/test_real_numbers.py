"""The real-number class of bad inputs, beyond the recipes, plan, theory model and engine options that
`tests/test_bad_inputs.py` covers: every float a public function or field takes (tolerances, timeouts,
fractions, scales, thresholds, confidence and significance levels) refuses NaN, infinities, bools,
strings and out-of-range values by name with the valid range (`phaseinterp._checks.check_real`),
before any work; numpy numbers are taken as the Python numbers they equal."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import phaseinterp as pi
import phaseinterp.interventions._common
import phaseinterp.interventions.cycling_stats
import phaseinterp.models.hf.memory
import phaseinterp.plot.export
import phaseinterp.plot.mechanisms
import phaseinterp.report.check
import phaseinterp.tasks.identifier
import phaseinterp.tasks.placement
from phaseinterp import stats, theory
from phaseinterp.errors import UserInputError
from phaseinterp.interventions import AblationResult
from phaseinterp.interventions.confirm import nominate_heads
from phaseinterp.interventions.gate_cycling import CyclingResult
from typecheck import as_user

NAN, INF = float("nan"), float("inf")
PROFILE = np.tile([0.9, 0.2, 0.8, 0.7], 6)  # R = 24, period 4


def _ablation() -> AblationResult:
    S, U, n = 4, 2, 20
    residue = np.repeat(np.arange(S), n)
    knocked = np.ones((residue.size, U), dtype=bool)
    knocked[residue == 1, 0] = False
    units = pd.DataFrame({"layer": [0, 1], "kv_head": [0, 0], "heads": [(0,), (0,)]})
    return AblationResult(units=units, residue=residue, clean_correct=np.ones(residue.size, dtype=bool),
                          knockout_correct=knocked, residue_modulus=S, stride=S, scope="kv_head")


def _cycling() -> CyclingResult:
    S, R, n = 4, 8, 10
    residue = np.repeat(np.arange(R), n)
    rng = np.random.default_rng(0)
    correct = rng.random((3, residue.size)) < 0.7
    return CyclingResult(shifts=(0, 1, 2), residue=residue, correct=correct, residue_modulus=R, stride=S, n_boot=20)


def _unit_cycling() -> pi.UnitCyclingResult:
    S, n = 4, 10
    residue = np.repeat(np.arange(2 * S), n)
    shifted = np.random.default_rng(0).normal(size=(3, residue.size))
    return pi.UnitCyclingResult(shifts=(0, 1, 2), residue=residue, measure_shifted=shifted,
                                measure_knocked=np.zeros_like(shifted), correct_shifted=np.ones_like(shifted, bool),
                                residue_modulus=2 * S, stride=S, layers=(0,), kv_heads=None, n_boot=20)


def _gates():
    from phaseinterp.interventions import GateProfile

    slots = [dict(layer=0, kv_head=0, branch="k", slot=s, phase=s, mean_alpha=0.25, static_alpha=0.25) for s in range(4)]
    heads = [dict(layer=0, kv_head=0, branch="k", preferred_slot=0, static_concentration=4.0)]
    return GateProfile(slots=pd.DataFrame(slots), heads=pd.DataFrame(heads), window=4, stride=4)


def _curves(step_accuracy) -> pd.DataFrame:
    return pd.DataFrame([dict(step=s, residue=r, phase=r % 4, accuracy=a, n=8)
                         for s, a in step_accuracy for r in range(8)])


def _tiny_theory():
    return theory.IdealizedInductionModel(N=6, S=3, L=2, heads=2, gamma=2.0, beta=4.0)


@pytest.fixture(scope="module")
def flow():
    model = _tiny_theory()
    return theory.gradient_flow(model, rho=0.3, seed=0, t_max=5.0, stop_at=None,
                                population=model.population(n_samples=32, seed=0))


def _tiny_recipe(**knobs):
    from phaseinterp.zoo.deepseek_v4 import TinyRecipe

    return TinyRecipe("probe", "a recipe that is never trained", **knobs)


def _remedy(**fields):
    from phaseinterp.experiments.remedy import RemedyResult

    empty = pd.DataFrame()
    return RemedyResult(curves=empty, profiles=empty, memory=empty, boundaries={}, stride=4, steps=10, eval_every=5,
                        **fields)


def _refine(step_size):
    from phaseinterp.theory.search import refine

    model = _tiny_theory()
    p = torch.full((1, model.heads, model.S), 1.0 / model.S, dtype=torch.float64)
    return refine(model, p, p.clone(), model.population(n_samples=16, seed=0), steps=1, step_size=step_size)


class _Tokenizer:
    sha256, vocab_size, eos_id = "stub", 256, None

    def encode_batch(self, texts):
        return [list(t.encode()) for t in texts]


def _corpus(tmp_path, fraction):
    from phaseinterp.train.corpus import tokenize_corpus

    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for i in range(10):
        (data / f"{i}.txt").write_text(f"document {i}\n")
    return tokenize_corpus(data, _Tokenizer(), tmp_path / "tokens", heldout_fraction=fraction, progress=False)


def _emb():
    return theory.model.equiangular_embeddings(4, 0.1, 0.0)


# (call, the refusal's words): each is accepted, answered wrongly or refused elsewhere (a numpy or type
# error, another message) by the code before the real-number checks.
CASES = [
    # phaseinterp.stats
    (lambda tmp: stats.detect_period(PROFILE, min_share=True), r"^min_share=True must be a finite number$"),
    (lambda tmp: stats.detect_period(PROFILE, min_share="0.9"), r"^min_share='0.9' must be a finite number$"),
    # moment matching
    (lambda tmp: pi.tasks.placement.match_target_moments(0, 127, 8, 64, mean_tolerance=NAN),
     r"^mean_tolerance=nan must be a finite number$"),
    (lambda tmp: pi.tasks.placement.match_target_moments(0, 127, 8, 64, std_tolerance=-1),
     r"^std_tolerance=-1 must be > 0 \(std spread relative to the target std\)$"),
    (lambda tmp: pi.tasks.identifier.select_matched([np.arange(0, 40, 4) + r for r in range(4)], 3, 4,
                                                    mean_tolerance=0), r"^mean_tolerance=0 must be > 0"),
    # the model config
    (lambda tmp: pi.CompressedConfig(d_vocab=16, n_ctx=16, d_model=8, n_layers=1, n_heads=1, d_head=8, d_mlp=8, n_kv_heads=1,
                                     init_std=NAN), r"^init_std=nan must be a finite number$"),
    (lambda tmp: pi.CompressedConfig(d_vocab=16, n_ctx=16, d_model=8, n_layers=1, n_heads=1, d_head=8, d_mlp=8, n_kv_heads=1,
                                     init_std=-0.02), r"^init_std=-0.02 must be > 0 \(the std of the initial weights\)$"),
    # engines
    (lambda tmp: pi.OpenAIEngine("http://localhost:9", "m", 16, timeout=-1),
     r"^timeout=-1 must be > 0 \(seconds per request\)$"),
    (lambda tmp: pi.OpenAIEngine("http://localhost:9", "m", 16, timeout="60"), r"^timeout='60' must be a finite number$"),
    (lambda tmp: pi.OpenAIEngine("http://localhost:9", "m", 16).served_models(timeout=NAN),
     r"^timeout=nan must be a finite number$"),
    (lambda tmp: pi.engines.llama_prebuilt.check_loads(tmp, timeout=0), r"^timeout=0 must be > 0 \(seconds\)$"),
    (lambda tmp: pi.profile_from_lm_eval(tmp / "missing", confidence=NAN), r"^confidence=nan must be a number in"),
    # report checks
    (lambda tmp: pi.report.check.check_page(tmp / "missing", timeout=INF), r"^timeout=inf must be a finite number$"),
    (lambda tmp: pi.report.check.first_screen_png(tmp / "missing", tmp / "shot.png", timeout=0),
     r"^timeout=0 must be > 0"),
    # the zoo
    (lambda tmp: pi.zoo.equal_training_step(_curves([(1, 0.9)]), _curves([(1, 0.9)]), min_mean=True),
     r"^min_mean=True must be a finite number$"),
    (lambda tmp: _tiny_recipe(lr=NAN), r"^lr=nan must be a finite number$"),
    (lambda tmp: _tiny_recipe(easy_until=1.5), r"^easy_until=1.5 is out of range \[0, 1\]"),
    (lambda tmp: _tiny_recipe(dense_fraction=-0.1), r"^dense_fraction=-0.1 is out of range \[0, 1\]"),
    (lambda tmp: _tiny_recipe(partial_rotary_factor=0), r"^partial_rotary_factor=0 is out of range \(0, 1\]"),
    (lambda tmp: _tiny_recipe(indexer_loss_weight=-1), r"^indexer_loss_weight=-1 must be >= 0$"),
    (lambda tmp: _tiny_recipe(periodic_fraction=1.0), r"^periodic_fraction=1 is out of range \[0, 1\)"),
    # training data
    (lambda tmp: _corpus(tmp, NAN), r"^heldout_fraction=nan must be a finite number$"),
    (lambda tmp: _corpus(tmp, 1.5), r"^heldout_fraction=1.5 is out of range \[0, 1\]"),
    # memory estimates
    (lambda tmp: pi.models.hf.memory.MemoryEstimate(10, 4, 1).weight_gib(NAN),
     r"^bytes_per_param=nan must be a finite number$"),
    (lambda tmp: pi.models.hf.memory.MemoryEstimate(10, 4, 1).weight_gib(2.0, -1.0),
     r"^expert_bytes_per_param=-1 must be > 0 \(bytes per parameter\)$"),
    (lambda tmp: pi.models.hf.memory.estimate_forward_memory(tmp / "missing", 128, weight_bytes=0),
     r"^weight_bytes=0 must be > 0"),
    (lambda tmp: pi.models.hf.memory.memory_plan(tmp / "missing", expert_weight_bytes=INF),
     r"^expert_weight_bytes=inf must be a finite number$"),
    # the idealized model
    (lambda tmp: theory.flow.integrate(lambda y: -y, torch.ones(2), NAN), r"^t_max=nan must be a finite number$"),
    (lambda tmp: theory.flow.integrate(lambda y: -y, torch.ones(2), 1.0, first_step=True),
     r"^first_step=True must be a finite number$"),
    (lambda tmp: theory.flow.integrate(lambda y: -y, torch.ones(2), 1.0, max_step=NAN),
     r"^max_step=nan must be a finite number$"),
    (lambda tmp: theory.gradient_flow(_tiny_theory(), t_max=1.0, rtol="1e-7"), r"^rtol='1e-7' must be a finite number$"),
    (lambda tmp: theory.flow_seeds(_tiny_theory(), [], threshold=NAN), r"^threshold=nan must be a finite number$"),
    (lambda tmp: _refine(NAN), r"^step_size=nan must be a finite number$"),
    (lambda tmp: theory.model.gram_deviation(_emb(), NAN), r"^kappa=nan must be a finite number$"),
    (lambda tmp: theory.model.check_equiangular(_emb(), 0.1, NAN), r"^eps=nan must be a finite number$"),
    # interventions
    (lambda tmp: _ablation().specialization(threshold=NAN), r"^threshold=nan must be a finite number$"),
    (lambda tmp: _ablation().specialization(threshold=10), r"^threshold=10 is out of range \[-100, 0\]"),
    (lambda tmp: _ablation().specialization(min_clean="0.1"), r"^min_clean='0.1' must be a finite number$"),
    (lambda tmp: _unit_cycling().profile_frame(confidence=1.5), r"^confidence=1.5 must be a number in \(0, 1\)$"),
    (lambda tmp: _cycling().intervals(confidence=NAN), r"^confidence=nan must be a number in \(0, 1\)$"),
    (lambda tmp: pi.interventions.cycling_stats.attainable_note("test", 0.5, alpha=NAN),
     r"^alpha=nan must be a number in \(0, 1\)$"),
    (lambda tmp: pi.interventions._common.paired_bootstrap_relative_change(
        np.ones(8, bool), np.ones((8, 1), bool), np.arange(8) % 2, 2, None, n_boot=10, confidence=NAN),
     r"^confidence=nan must be a number in \(0, 1\)$"),
    (lambda tmp: nominate_heads(_gates(), max_concentration=NAN),
     r"^max_concentration=nan must be a finite number$"),
    (lambda tmp: nominate_heads(_gates(), max_concentration=True),
     r"^max_concentration=True must be a finite number$"),
    # figures
    (lambda tmp: pi.plot.export.save(go.Figure(), tmp / "figure.html", scale=NAN), r"^scale=nan must be a finite number$"),
    (lambda tmp: pi.plot.export.save_static({}, scale=-1), r"^scale=-1 must be > 0"),
    (lambda tmp: pi.plot.mechanisms.wrap_title("a title", 400, font_size=0), r"^font_size=0 must be > 0"),
    (lambda tmp: pi.plot.mechanisms.specialization_heatmap(_ablation(), zmax=NAN), r"^zmax=nan must be a finite number$"),
    (lambda tmp: pi.plot.mechanisms.specialization_heatmap(_ablation(), min_clean=True),
     r"^min_clean=True must be a finite number$"),
    # experiments
    (lambda tmp: _remedy(threshold=NAN), r"^threshold=nan must be a finite number$"),
]


@pytest.mark.parametrize("call, words", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_a_bad_real_number_is_refused_by_name_with_its_range(call, words, tmp_path):
    with as_user(), pytest.raises(UserInputError, match=words):
        call(tmp_path)
    assert not (tmp_path / "figure.html").exists() and not (tmp_path / "tokens").exists()  # before any work


@pytest.mark.parametrize("method", ["reached", "time_to", "choice_times", "slot_fixed"])
def test_a_flow_result_refuses_a_probability_outside_its_range(flow, method):
    for bad, words in ((NAN, "must be a finite number"), (1.5, r"is out of range \[0, 1"), (True, "must be a finite")):
        with as_user(), pytest.raises(UserInputError, match=words):
            getattr(flow, method)(bad)
    if method in ("choice_times", "slot_fixed"):  # a slot is chosen when its probability exceeds choose_at < 1
        with as_user(), pytest.raises(UserInputError, match=r"choose_at=1 is out of range \[0, 1\)"):
            getattr(flow, method)(1.0)


def test_the_confidence_is_refused_before_the_bootstrap(monkeypatch):
    unit = _unit_cycling()
    with as_user(), pytest.raises(UserInputError, match="confidence=2"):
        unit.movement(confidence=2)
    assert "_boot" not in unit.__dict__  # the bootstrap (a cached property) never ran

    def no_bootstrap(*args, **kwargs):
        raise AssertionError("the bootstrap ran before the confidence was checked")

    monkeypatch.setattr(pi.interventions.gate_cycling, "phase_means_bootstrap", no_bootstrap)
    with as_user(), pytest.raises(UserInputError, match="confidence=True"):
        _cycling().movement(confidence=True)


def test_numpy_numbers_are_taken_as_the_python_numbers_they_equal(tmp_path, flow):
    with as_user():
        period = stats.detect_period(PROFILE, alpha=np.float32(0.05), min_share=np.float64(0.9))
        placement = pi.tasks.placement.match_target_moments(0, 127, 8, 64, mean_tolerance=np.float32(0.5),
                                                            std_tolerance=np.float64(0.01))
        recipe = _tiny_recipe(lr=np.float32(1e-3), easy_until=np.float64(0.5), partial_rotary_factor=np.float32(0.5),
                              indexer_loss_weight=np.float64(0.2), periodic_fraction=np.float32(0.25))
        corpus = _corpus(tmp_path, np.float32(0.5))
        engine = pi.OpenAIEngine("http://localhost:9", "m", 16, timeout=np.float32(5))
        remedy = _remedy(threshold=np.float32(0.75))
        step = pi.zoo.equal_training_step(_curves([(1, 0.5), (2, 0.9)]), _curves([(1, 0.9), (2, 0.9)]),
                                          min_mean=np.float32(0.85))
        gib = pi.models.hf.memory.MemoryEstimate(2**30, 0, 1).weight_gib(np.float32(2.0), np.float64(1.0))
        spec = _ablation().specialization(threshold=np.float64(-50), min_clean=np.float32(0.1), alpha=np.float32(0.05))
        nominated = nominate_heads(_gates(), max_concentration=np.float64(4.0))
        reached = flow.reached(np.float32(0.0)), flow.choice_times(np.float64(0.0))
        out = pi.plot.export.save(go.Figure(), tmp_path / "figure.html", scale=np.float64(2.0))
    assert type(period.alpha) is float and type(period.min_share) is float and period.period == 4
    assert type(placement.mean_tolerance) is float and type(placement.std_tolerance) is float and placement.exact
    saved = json.loads(json.dumps(dataclasses.asdict(recipe)))  # was a TypeError on numpy numbers
    assert saved["lr"] == float(np.float32(1e-3)) and saved["easy_until"] == 0.5
    assert type(recipe.partial_rotary_factor) is float and type(recipe.periodic_fraction) is float
    assert corpus.manifest["heldout_fraction"] == 0.5  # the manifest is JSON: was a TypeError on np.float32
    assert type(engine.timeout) is float and engine.timeout == 5.0
    assert type(remedy.threshold) is float and remedy.threshold == 0.75
    assert step == 2 and gib == 2.0
    assert len(spec) == 2 and bool(nominated.nominated.all())
    assert reached[0] is True and not math.isnan(reached[1][0])
    assert out[0].is_file()
