"""The integer class of bad inputs, beyond the experiments' options (checked by their options dataclasses)
and the recipes, plan and theory model that `tests/test_bad_inputs.py` covers: every count, size, seed,
width, length or step a public function or field takes refuses 1.5 (never truncated to 1), bools,
strings and out-of-range values by name with the valid range (`phaseinterp._checks.check_int`), before
any work; numpy integers are taken as the Python ints they equal."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

import phaseinterp as pi
import phaseinterp.interventions._common
import phaseinterp.interventions.cycling_stats
import phaseinterp.models.hf.memory
import phaseinterp.report.check
import phaseinterp.report.page
import phaseinterp.tasks.docstring
import phaseinterp.tasks.hf_tokenizer
import phaseinterp.tasks.identifier
import phaseinterp.tasks.placement
import phaseinterp.theory.results
import phaseinterp.theory.search
import phaseinterp.zoo.deepseek_v4
from phaseinterp import stats, theory
from phaseinterp.errors import UserInputError
from test_real_numbers import _ablation  # the same small ablation result
from typecheck import as_user

PROFILE = np.tile([0.9, 0.2, 0.8, 0.7], 6)  # R = 24, period 4
memory = pi.models.hf.memory


def _tiny_theory():
    return theory.IdealizedInductionModel(N=6, S=3, L=2, heads=2, gamma=2.0, beta=4.0)


def _tiny_recipe(**knobs):
    return pi.zoo.deepseek_v4.TinyRecipe("probe", "a recipe that is never trained", **knobs)


def _paired(**kwargs):
    settings = dict(n_groups=2, fold=None, n_boot=10, seed=0) | kwargs
    return pi.interventions._common.paired_bootstrap_relative_change(
        np.ones(8, bool), np.ones((8, 1), bool), np.arange(8) % 2, settings.pop("n_groups"), settings.pop("fold"),
        **settings)


def _refine(steps):
    model = _tiny_theory()
    p = torch.full((1, model.heads, model.S), 1.0 / model.S, dtype=torch.float64)
    return theory.search.refine(model, p, p.clone(), model.population(n_samples=16, seed=0), steps=steps)


def _matched(n=3, modulus=4):
    return pi.tasks.identifier.select_matched([np.arange(0, 40, 4) + r for r in range(4)], n, modulus)


def _forward(**kwargs):
    return memory.estimate_forward_memory(None, 128, **kwargs)


# (call, the refusal's words): each is accepted (1.5 taken as 1, a bool as 0/1, a negative count as none),
# answered wrongly or refused elsewhere (a numpy/torch error, another message) by the code before the checks.
CASES = [
    # phaseinterp.stats
    (lambda tmp: stats.detect_period(PROFILE, n_permutations=True), r"^n_permutations=True must be an integer >= 1"),
    (lambda tmp: stats.detect_period(PROFILE, n_permutations=0), r"^n_permutations=0 must be an integer >= 1"),
    (lambda tmp: stats.detect_period(PROFILE, seed=1.5), r"^seed=1.5 must be an integer in 0..2\*\*64 - 1"),
    (lambda tmp: stats.detect_period(PROFILE, periods=[4, 1.5]), r"^periods=1.5 must be an integer >= 2"),
    (lambda tmp: stats.detect_period(PROFILE, periods=["4"]), r"^periods='4' must be an integer >= 2"),
    (lambda tmp: stats.cluster_bootstrap(np.ones(4), np.arange(4), n_replicates=1.5),
     r"^n_replicates=1.5 must be an integer >= 1$"),
    (lambda tmp: stats.cluster_bootstrap(np.ones(4), np.arange(4), n_groups=True), r"^n_groups=True must be an integer"),
    (lambda tmp: stats.cluster_bootstrap(np.ones(4), np.arange(4), seed=-1), r"^seed=-1 must be an integer in 0..2\*\*64 - 1"),
    # report checks: refused before Chromium is looked for
    (lambda tmp: pi.report.check.check_page(tmp / "missing", width=1.5), r"^width=1.5 must be an integer >= 1"),
    (lambda tmp: pi.report.check.check_page(tmp / "missing", height=0), r"^height=0 must be an integer >= 1"),
    (lambda tmp: pi.report.check.first_screen_png(tmp / "missing", tmp / "shot.png", width=True),
     r"^width=True must be an integer >= 1"),
    (lambda tmp: pi.report.check.first_screen_png(tmp / "missing", tmp / "shot.png", height="900"),
     r"^height='900' must be an integer >= 1"),
    (lambda tmp: pi.report.page.frame_html(pd.DataFrame({"a": range(3)}), "caption", max_rows=1.5),
     r"^max_rows=1.5 must be an integer >= 1"),
    # memory estimates
    (lambda tmp: _forward(act_bytes=1.5), r"^act_bytes=1.5 must be an integer >= 1 \(bytes per activation value\)$"),
    (lambda tmp: _forward(act_bytes=0), r"^act_bytes=0 must be an integer >= 1"),
    (lambda tmp: memory.ablation_state_bytes(None, 1.5), r"^seq_len=1.5 must be an integer >= 1$"),
    (lambda tmp: memory.ablation_state_bytes(None, 128, batch=-1), r"^batch=-1 must be an integer >= 1$"),
    (lambda tmp: memory.ablation_state_bytes(None, 128, act_bytes=True), r"^act_bytes=True must be an integer >= 1"),
    (lambda tmp: memory.devices_needed(_forward(), 1.5), r"^device_gb=1.5 must be an integer >= 1"),
    (lambda tmp: memory.devices_needed(_forward(), 80, state=-1), r"^state=-1 must be an integer >= 0"),
    # the idealized model
    (lambda tmp: theory.flow_seeds(_tiny_theory(), [0, 1.5], t_max=1.0), r"^seeds=1.5 must be an integer >= 0"),
    (lambda tmp: theory.flow_seeds(_tiny_theory(), [True], t_max=1.0), r"^seeds=True must be an integer >= 0"),
    (lambda tmp: theory.flow.integrate(lambda y: -y, torch.ones(2), 1.0, max_steps=1.5),
     r"^max_steps=1.5 must be an integer >= 1"),
    (lambda tmp: theory.flow.integrate(lambda y: -y, torch.ones(2), 1.0, max_steps=0),
     r"^max_steps=0 must be an integer >= 1"),
    (lambda tmp: theory.equiangular_embeddings(4, 0.1, 0.0, seed=1.5), r"^seed=1.5 must be an integer in 0..2\*\*64 - 1"),
    (lambda tmp: _tiny_theory().population(n_samples=16, seed=True), r"^seed=True must be an integer in 0..2\*\*64 - 1"),
    (lambda tmp: theory.search.global_search(_tiny_theory(), n_random=2, n_refine_best=1, steps=1, seed="0"),
     r"^seed='0' must be an integer in 0..2\*\*64 - 1"),
    (lambda tmp: _refine(1.5), r"^steps=1.5 must be an integer >= 0"),
    (lambda tmp: _refine(-1), r"^steps=-1 must be an integer >= 0"),
    (lambda tmp: theory.chance_collision(1.5, 3), r"^heads=1.5 must be an integer >= 1$"),
    (lambda tmp: theory.chance_collision(2, 0), r"^slots=0 must be an integer >= 1$"),
    # moment matching
    (lambda tmp: pi.tasks.placement.match_target_moments(1.5, 127, 8, 64), r"^lo=1.5 must be an integer >= 0"),
    (lambda tmp: pi.tasks.placement.match_target_moments(0, True, 8, 64), r"^hi=True must be an integer >= 0"),
    (lambda tmp: _matched(n=1.5), r"^n=1.5 must be an integer >= 1"),
    (lambda tmp: _matched(n=-1), r"^n=-1 must be an integer >= 1"),
    (lambda tmp: _matched(modulus=3), r"^positions has 4 residue groups; modulus=3 needs one per residue$"),
    # tasks
    (lambda tmp: pi.tasks.docstring.DocstringProbe(lengths=(24, 25.5)), r"^lengths=25.5 must be an integer >= 0"),
    (lambda tmp: pi.tasks.docstring.DocstringProbe(lengths=(True,)), r"^lengths=True must be an integer >= 0"),
    (lambda tmp: pi.tasks.docstring.DocstringProbe(lengths="24"), r"^lengths='24' must be a non-empty set"),
    (lambda tmp: pi.tasks.hf_tokenizer.tokenizer_config(pi.tasks.vocab.Vocab.build(), 1.5),
     r"^model_max_length=1.5 must be an integer >= 1$"),
    # interventions
    (lambda tmp: _paired(n_boot=1.5), r"^n_boot=1.5 must be an integer >= 1"),
    (lambda tmp: _paired(n_boot=True), r"^n_boot=True must be an integer >= 1"),
    (lambda tmp: _paired(seed=1.5), r"^seed=1.5 must be an integer in 0..2\*\*64 - 1"),
    (lambda tmp: _paired(n_groups=1.5), r"^n_groups=1.5 must be an integer >= 1"),
    (lambda tmp: _paired(fold=0), r"^fold=0 must be an integer >= 1"),
    (lambda tmp: _ablation().to_frame(n_boot=0), r"^n_boot=0 must be an integer >= 1"),
    (lambda tmp: pi.interventions.cycling_stats.cycling_scores(np.ones(4), {1: np.ones(4)}, n_permutations=1.5),
     r"^n_permutations=1.5 must be an integer >= 0"),
    (lambda tmp: pi.interventions.cycling_stats.cycling_scores(np.ones(4), {1: np.ones(4)}, n_permutations=-1),
     r"^n_permutations=-1 must be an integer >= 0"),
    (lambda tmp: pi.interventions.cycling_stats.unit_permutation_tests(np.ones(4), np.ones((1, 4)), [1], limit=0),
     r"^limit=0 must be an integer >= 1"),
    (lambda tmp: pi.interventions.cycling_stats.unit_permutation_tests(np.ones(4), np.ones((1, 4)), [1], seed=1.5),
     r"^seed=1.5 must be an integer in 0..2\*\*64 - 1"),
    # the zoo
    (lambda tmp: pi.zoo.cycling_model_for(4.5), r"^stride=4.5 must be an integer >= 1$"),
    (lambda tmp: pi.zoo.build("no-such-model", tmp / "run", threads=1.5), r"^threads=1.5 must be an integer >= 1"),
    (lambda tmp: pi.zoo.deepseek_v4.build("dsv4-tiny", tmp / "run", threads=0), r"^threads=0 must be an integer >= 1"),
    (lambda tmp: _tiny_recipe(csa_rate=1.5), r"^csa_rate=1.5 must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(hidden_size=0), r"^hidden_size=0 must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(num_attention_heads=True), r"^num_attention_heads=True must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(index_topk=-1), r"^index_topk=-1 must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(hc_sinkhorn_iters="5"), r"^hc_sinkhorn_iters='5' must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(batch_size=1.5), r"^batch_size=1.5 must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(eval_every=0), r"^eval_every=0 must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(probe_per_residue=True), r"^probe_per_residue=True must be an integer >= 1$"),
    (lambda tmp: _tiny_recipe(periodic_block=(4, 48.5)), r"^periodic_block=48.5 must be an integer >= 1"),
    (lambda tmp: _tiny_recipe(periodic_block=(0, 48)), r"^periodic_block=0 must be an integer >= 1"),
    (lambda tmp: _tiny_recipe(periodic_block=(48, 4)), r"^periodic_block=\(48, 4\) must satisfy 1 <= min <= max$"),
    (lambda tmp: _tiny_recipe(periodic_block=4), r"^periodic_block=4 must be a \(min, max\) pair"),
]


@pytest.mark.parametrize("call, words", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_a_bad_integer_is_refused_by_name_with_its_range(call, words, tmp_path):
    with as_user(), pytest.raises(UserInputError, match=words):
        call(tmp_path)
    assert not (tmp_path / "run").exists() and not (tmp_path / "shot.png").exists()  # before any work


def test_numpy_integers_are_taken_as_the_python_ints_they_equal():
    i64, i32 = np.int64, np.int32
    with as_user():
        period = stats.detect_period(PROFILE, periods=[i64(4), i32(8)], n_permutations=i64(99), seed=i32(1))
        boot = stats.cluster_bootstrap(np.ones(4), np.arange(4), n_groups=i64(1), n_replicates=i32(5), seed=i64(1))
        forward = memory.estimate_forward_memory(None, 128, act_bytes=i64(2))
        assert forward.peak == memory.estimate_forward_memory(None, 128, act_bytes=2).peak
        state = memory.ablation_state_bytes(None, i64(128), batch=i32(1), act_bytes=i64(2))
        assert state == memory.ablation_state_bytes(None, 128) and type(state) is int
        assert memory.devices_needed(forward, i64(80), state=i32(0)) == memory.devices_needed(forward, 80)
        model = _tiny_theory()
        sweep = theory.flow_seeds(model, np.arange(2), t_max=1.0, stop_at=None)
        emb = theory.equiangular_embeddings(4, 0.1, 0.0, seed=i64(3))
        assert torch.equal(emb, theory.equiangular_embeddings(4, 0.1, 0.0, seed=3))
        assert torch.equal(model.population(n_samples=16, seed=i64(2)).tokens, model.population(n_samples=16, seed=2).tokens)
        assert _refine(i64(1))[2].shape == (1,)
        assert theory.chance_collision(i64(2), i32(3)) == theory.chance_collision(2, 3)
        placed = pi.tasks.placement.match_target_moments(i64(0), i32(127), 8, 64)
        counts, _ = _matched(n=i64(3), modulus=i32(4))
        probe = pi.tasks.docstring.DocstringProbe(lengths=np.arange(24, 28))
        config = pi.tasks.hf_tokenizer.tokenizer_config(pi.tasks.vocab.Vocab.build(), i64(128))
        est, _, _ = _paired(n_groups=i64(2), fold=i32(2), n_boot=i64(10), seed=i32(0))
        frame = _ablation().to_frame(n_boot=i64(10), seed=i32(0))
        scores = pi.interventions.cycling_stats.cycling_scores(np.arange(4.0), {1: np.ones(4)}, n_permutations=i64(5),
                                                               seed=i32(0))
        tests = pi.interventions.cycling_stats.unit_permutation_tests(np.arange(4.0), np.ones((1, 4)), [1],
                                                                      limit=i64(24), seed=i32(0))
        html = pi.report.page.frame_html(pd.DataFrame({"a": range(3)}), "caption", max_rows=i64(2))
        assert pi.zoo.cycling_model_for(i64(4)) == pi.zoo.cycling_model_for(4)
        recipe = _tiny_recipe(csa_rate=i64(4), hidden_size=i32(64), batch_size=i64(32), eval_every=i32(100),
                              periodic_block=np.array([4, 48]))
    assert period.period == 4 and sorted(period.p_values) == [4, 8]
    assert boot.n_replicates == 5 and type(boot.n_replicates) is int
    assert sweep.seeds == [0, 1] and all(type(s) is int for s in sweep.seeds)
    assert placed.exact or placed.within_tolerance
    assert len(counts) == 4
    assert probe.lengths == (24, 25, 26, 27) and all(type(n) is int for n in probe.lengths)
    assert json.loads(json.dumps(config))["model_max_length"] == 128  # a TypeError on np.int64 before
    assert est.shape == (1, 2) and len(frame) == 8
    assert "per_shift" in scores and tests
    assert "... 1 more rows" in html
    saved = json.loads(json.dumps(dataclasses.asdict(recipe)))  # the recipe is saved as JSON
    assert saved["csa_rate"] == 4 and saved["periodic_block"] == [4, 48]
    assert recipe.periodic_block == (4, 48) and type(recipe.hidden_size) is int and type(recipe.batch_size) is int
    assert recipe == _tiny_recipe()


@pytest.mark.parametrize("call, words", [
    (lambda: __import__("phaseinterp.paper.compare", fromlist=["x"]).counterparts(pi.load("w4s4").cfg, residues=-1),
     r"residues=-1 must be an integer >= 1"),
    (lambda: __import__("phaseinterp.paper.compare", fromlist=["x"]).counterparts(pi.load("w4s4").cfg, stride=1.5),
     r"stride=1\.5 must be an integer >= 1"),
    (lambda: __import__("phaseinterp.engines.lm_eval", fromlist=["x"]).profile_from_lm_eval("/nonexistent",
                                                                                         n_bootstrap=True),
     r"n_bootstrap=True must be an integer >= 1"),
    (lambda: __import__("phaseinterp.profile", fromlist=["x"]).profile_from_records(
        pd.DataFrame({"residue": [0, 1], "correct": [True, False]}), 2, 2, seed=-1), r"seed=-1 must be an integer in 0..2\*\*64 - 1"),
    (lambda: __import__("phaseinterp.train.pretrain", fromlist=["x"]).load_snapshot("/nonexistent", step=1.5),
     r"step=1\.5 must be an integer >= 0"),
    (lambda: __import__("phaseinterp.experiments.remedy", fromlist=["x"]).train_share("/nonexistent", True, 0, 1),
     r"stop_at=True must be an integer >= 1"),  # trained all six twins to step 1
    (lambda: __import__("phaseinterp.experiments.remedy", fromlist=["x"]).train_share("/nonexistent", 10, 1.5, 2),
     r"worker=1\.5 must be an integer"),  # trained nothing, silently
])
def test_the_paper_lm_eval_records_and_snapshot_doors_refuse_bad_integers_first(call, words):
    """Checked before any file is read or any run is compared (counterparts took residues=-1 and
    stride=1.5; the records' resampling counts reached numpy; load_snapshot took step=True as 1)."""
    with pytest.raises(UserInputError, match=words):
        with as_user():
            call()


SEED_DOORS = {
    "CompressedConfig": lambda s: pi.CompressedConfig(d_vocab=32, n_ctx=16, d_model=16, n_layers=1, n_heads=2,
                                                      n_kv_heads=1, d_head=8, d_mlp=16, window=4, stride=4, seed=s),
    "detect_period": lambda s: pi.stats.detect_period([0.0, 1.0] * 12, seed=s, n_permutations=9),
    "ProfileSpec": lambda s: pi.ProfileSpec(seed=s),
    "AblationSpec.calibration_seed": lambda s: pi.AblationSpec(calibration_seed=s),
    "TrainConfig": lambda s: pi.train.TrainConfig(seed=s),
}


@pytest.mark.parametrize("door", sorted(SEED_DOORS))
def test_a_seed_is_what_torch_s_generators_take(door):
    """A seed is an integer in 0..2**64 - 1 everywhere (torch's generators overflowed past it, deep in
    the work); the largest one is taken."""
    with pytest.raises(ValueError, match=r"seed=18446744073709551616 must be an integer in 0..2\*\*64 - 1 \(a seed"):
        SEED_DOORS[door](2**64)
    SEED_DOORS[door](2**64 - 1)


def test_the_cli_s_seeds_are_checked_by_the_parser(capsys):
    from phaseinterp.cli import main

    for argv in (["train", "--seed", str(2**64), "--steps", "1"], ["profile", "w4s4", "--seed", str(2**64)]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "must be in 0..2**64 - 1 (a seed)" in capsys.readouterr().err
