"""Gate cycling at the grain of one unit (issue 20): scores that can fail, interventions that
restore, the rule that picks units, and the measured claim on the shipped paper-depth model.

The `deep` tests are regression snapshots of `deep12-w8s8-1kv-shared-equal` (seed 0, the
shipped checkpoint) on held-out prompts (seed 0, 72 per residue = 216 per phase) after the
rule picks the units on a selection split (seed 1000): they assert what benchmarks/RESULTS.md
"Gate cycling at unit grain" records (`python benchmarks/cycling_table.py --models deep12-w8s8-1kv-shared-equal`).
"""

from __future__ import annotations

import contextlib

import functools
import itertools
import os

import numpy as np
import pandas as pd
import pytest
import torch

import phaseinterp as pi
from phaseinterp.interventions.cycling_stats import (
    poisson_binomial_tail,
    strictly_identified,
    unit_permutation_tests,
    unit_score_arrays,
)
from phaseinterp.interventions.gate_shifts import shift_gates, mean_gate_logits, shift_static_gates
from phaseinterp.interventions.knockout import calibration_mean_z, knockout_measures, shifted_knockouts
from phaseinterp.interventions.unit_cycling import _joint_knockout, _layer_units

SHIFTS = (-3, -2, -1, 1, 2, 3)
C0 = np.array([0.0, -0.1, 0.05, 0.0, 0.1, 2.0, 2.8, -0.05])  # a unit serving phases 5 and 6


# ------------------------------------------------------------------ the scores
def _moved(c0, shifts, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([np.roll(c0, d) + rng.normal(0, noise, c0.size) for d in shifts])


def test_a_unit_that_moves_with_its_gates_scores_high_and_is_identified():
    c = _moved(C0, SHIFTS)
    arr = unit_score_arrays(C0, c, SHIFTS, boundary=7)
    assert (arr["r2"] > 0.95).all(), arr["r2"]
    tests = unit_permutation_tests(C0, c, SHIFTS)
    assert tests["identified"].all() and tests["exact"] and tests["n_arrangements"] == 40320
    assert tests["identification_p"] < 1e-4
    assert np.allclose(tests["identification_null"], 1 / 8, atol=0.01)  # chance of naming the shift by luck


def test_a_deliberately_wrong_prediction_scores_low():
    """The same observations scored against the opposite shift -d: negative R², nothing identified."""
    c = _moved(C0, SHIFTS)
    wrong = [-d for d in SHIFTS]
    arr = unit_score_arrays(C0, c, wrong, boundary=7)
    assert (arr["r2"] < 0).all(), arr["r2"]
    assert not strictly_identified(arr["ss_res_by_hypothesis"], wrong).any()
    # and a unit that moved by -d while the experiment applied +d
    tests = unit_permutation_tests(C0, _moved(C0, wrong), SHIFTS)
    assert tests["n_identified"] == 0 and tests["identification_p"] == 1.0


def test_right_place_wrong_size_is_negative_but_identified():
    """Parameter-free: a contribution 5x smaller than predicted fails R², while identification
    (which hypothesis fits best) still names the shift."""
    c = _moved(C0 / 5, SHIFTS, noise=0.01)
    arr = unit_score_arrays(C0, c, SHIFTS, boundary=7)
    assert (arr["r2"] < 0).all()
    assert strictly_identified(arr["ss_res_by_hypothesis"], SHIFTS).all()


def test_a_flat_unit_identifies_nothing():
    zero = np.zeros(8)
    tests = unit_permutation_tests(zero, np.zeros((6, 8)), SHIFTS)
    assert tests["n_identified"] == 0 and tests["identification_p"] == 1.0
    assert np.isnan(unit_score_arrays(zero, np.zeros((6, 8)), SHIFTS, 7)["r2"]).all()


def test_poisson_binomial_tail_matches_enumeration():
    ps = [0.1, 0.3, 0.125, 0.5]
    for k in range(6):
        brute = sum(np.prod([p if b else 1 - p for p, b in zip(ps, bits)])
                    for bits in itertools.product([0, 1], repeat=len(ps)) if sum(bits) >= k)
        assert poisson_binomial_tail(ps, k) == pytest.approx(brute)


def test_permutation_p_is_exact_at_s4():
    c0 = np.array([0.0, 0.2, 1.5, 0.1])
    tests = unit_permutation_tests(c0, _moved(c0, [-1, 1, 2], noise=0.0), [-1, 1, 2])
    assert tests["exact"] and tests["n_arrangements"] == 24
    assert (tests["r2_p"] >= 1 / 24).all() and (tests["r2_p"] <= 1 / 24 + 1e-12).all()


# ------------------------------------------------------------ the interventions
@functools.cache
def zoo_model(name):
    return pi.zoo.load(name)


def test_cycle_gates_kv_heads_moves_only_that_head_and_restores():
    model = zoo_model("w8s4-deepseek")
    bias = model.blocks[1].attn.compressor.position_bias
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with shift_gates(model, 1, layers=1, kv_heads=[1]):
        assert torch.equal(bias[:, :, 0], before["blocks.1.attn.compressor.position_bias"][:, :, 0])
        assert torch.equal(bias[:, :, 1], torch.roll(before["blocks.1.attn.compressor.position_bias"][:, :, 1], 1, 0))
        assert torch.equal(model.blocks[0].attn.compressor.position_bias,
                           before["blocks.0.attn.compressor.position_bias"])
    with pytest.raises(RuntimeError, match="inside"):
        with shift_gates(model, 2, layers=[0, 1], kv_heads=0):
            raise RuntimeError("inside")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"kv_heads=2 is out of range \(valid: 0\.\.1\)"):
        with shift_gates(model, 1, layers=1, kv_heads=2):
            pass


@pytest.mark.parametrize("name", ["w4s4-1kv-shared", "w8s4-deepseek", "dsv4-tiny"])
def test_static_shift_moves_each_slots_mean_logit_by_d(name):
    """Under `shift_static_gates(d)` the mean gate logit of slot i (same prompts) is the unshifted
    mean of slot (i - d) mod S, within each S-block; parameters restore bit-exactly."""
    model = zoo_model(name)
    tokens = pi.zoo.task_for(model).calibration(24, seed=1).tokens
    layer = 0
    mu = mean_gate_logits(model, tokens, layers=layer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    S = model.cfg.stride
    for d in (1, -2):
        with shift_static_gates(model, d, layers=layer, mean_logits=mu):
            moved = mean_gate_logits(model, tokens, layers=layer)
        for name_, m in mu.items():
            blocks = m.reshape((-1, S) + m.shape[1:])  # [half, s, ...]: slot = half * S + s
            expected = torch.roll(blocks, d, dims=1).reshape(m.shape)
            torch.testing.assert_close(moved[name_], expected, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_joint_knockout_equals_the_fast_path():
    """The several-layer knockout path (hooked forwards) equals the cached fast path on one layer."""
    model = zoo_model("w4s4-1kv-shared")
    task = pi.zoo.task_for(model)
    batch = task.generate(72, seed=3)
    tokens, answer = batch.tokens[:96], torch.as_tensor(batch.answer[:96])
    pos = int(batch.answer_pos[0])
    mean_z = calibration_mean_z(model, task.calibration(48, seed=1).tokens, pos)
    units = _layer_units(model, [1], None)
    fast = knockout_measures(model, tokens, pos, answer, units, mean_z, 32)
    lp, ok, lp_k, ok_k = _joint_knockout(model, tokens, pos, answer, units, mean_z, 32)
    torch.testing.assert_close(lp, fast.clean_logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_k, fast.knockout_logprob[:, 0], atol=1e-5, rtol=0)
    assert torch.equal(ok, fast.clean_correct) and torch.equal(ok_k, fast.knockout_correct[:, 0])


@pytest.mark.parametrize("name, layer, mode", [("w4s4-1kv-shared", 1, "roll"), ("w4s4-1kv-shared", 0, "static"),
                                               pytest.param("deep12-w8s8-1kv-shared-equal", 11, "roll",
                                                            marks=pytest.mark.slow),
                                               ("dsv4-tiny", 1, "roll")])
def test_shared_lower_layers_equal_the_per_shift_loop_bit_for_bit(name, layer, mode):
    """`shifted_knockouts` (layers below the shifted one run once for every shift) gives exactly what
    calibrating and knocking out inside each shift gives: the same operations on the same batches."""
    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    batch = task.generate(1, seed=0, strict=False)
    pos = int(batch.answer_pos[0])
    calib = task.calibration(task.residue_modulus, seed=1).tokens[:, : pos + 1]
    units = _layer_units(model, [layer], None)
    mu = mean_gate_logits(model, calib, layers=[layer]) if mode == "static" else None
    shift = (lambda d: shift_static_gates(model, d, layers=[layer], mean_logits=mu)) if mode == "static" else (
        lambda d: shift_gates(model, d, layers=[layer]))
    unshifted = shift
    shift = lambda d: contextlib.nullcontext(model) if d == 0 else unshifted(d)  # noqa: E731 (0 mod S is refused)
    shifts = (0, 1, -2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shared = shifted_knockouts(model, batch.tokens, pos, batch.answer, units, [lambda d=d: shift(d) for d in shifts],
                               calib, 10)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for d, got in zip(shifts, shared):
        with shift(d):
            want = knockout_measures(model, batch.tokens, pos, batch.answer, units,
                                     calibration_mean_z(model, calib, pos, 10), 10)
        for field in want._fields:
            assert torch.equal(getattr(got, field), getattr(want, field)), (d, field)
    assert not torch.equal(shared[0].clean_logprob, shared[1].clean_logprob)  # the shift did something


# ------------------------------------------------------------ the experiment API
@functools.cache
def small_prompts():
    batch = pi.zoo.task_for(zoo_model("w4s4-1kv-shared")).generate(72, seed=0)
    return batch.subset(np.arange(0, len(batch), 12))  # 6 per residue: the API, not the science


@functools.cache
def small_unit_result(measure="logprob", mode="roll"):
    model = zoo_model("w4s4-1kv-shared")
    return pi.gate_cycling_unit(model, shifts=[-1, 1, 2], layers=[1], measure=measure, mode=mode,
                           n_calibration=24, n_boot=50, progress=False, prompts=small_prompts())


def test_unit_result_protocol(tmp_path):
    r = small_unit_result()
    assert isinstance(r, pi.UnitCyclingResult) and r.unit == "L1" and r.stride == 4
    frame = r.to_frame()
    n = r.residue.size
    assert len(frame) == 4 * n and set(frame["shift"]) == {0, -1, 1, 2}
    means = frame.groupby(["shift", "phase"]).contribution.mean().unstack()
    np.testing.assert_allclose(means.loc[r.contribution().index].to_numpy(), r.contribution().to_numpy())
    ps = r.scores["per_shift"]
    assert list(ps["shift"]) == [-1, 1, 2] and ps.n_points.eq(4).all()
    assert {"r2", "r2_no_boundary", "boundary_observed", "boundary_predicted", "best", "identified", "r2_p"} <= set(ps)
    iv = r.intervals()
    assert {"r2[-1]", "r2_pooled", "n_identified"} <= set(iv.index) and (iv.low <= iv.high).all()
    assert "unit" in r.summary().index and "L1" in repr(r)
    assert pi.UnitCyclingResult.load(r.save(tmp_path / "r")) == r
    fig = r.plot()
    dashed = [t for t in fig.data if t.line is not None and t.line.dash == "dash"]
    assert len(dashed) == 3  # one prediction per applied shift, drawn dashed over the observed line
    profile = r.profile_frame()
    assert (profile.low <= profile.contribution + 1e-9).all() and (profile.contribution <= profile.high + 1e-9).all()


def test_unit_measure_accuracy_and_static_mode():
    r = small_unit_result(measure="accuracy")
    assert set(np.unique(r.measure_shifted - r.measure_knocked)) <= {-1.0, 0.0, 1.0}
    # shift 0 is the unshifted model in either mode: identical measurements
    roll, static = small_unit_result(), small_unit_result(mode="static")
    np.testing.assert_allclose(static.measure_shifted[0], roll.measure_shifted[0], atol=1e-5)
    assert static.mode == "static" and not np.allclose(static.measure_shifted[1], roll.measure_shifted[1])


def test_unit_cycling_runs_on_the_hf_family():
    model = zoo_model("dsv4-tiny")
    task = pi.zoo.task_for(model)
    prompts = task.generate(72, seed=0)
    sub = prompts.subset(np.arange(0, len(prompts), 24))  # every residue, 3 prompts each
    r = pi.gate_cycling_unit(model, task, shifts=[1], layers=[0], n_calibration=task.residue_modulus,
                        n_boot=20, progress=False, prompts=sub)
    assert r.stride == model.cfg.stride and np.isfinite(r.contribution().to_numpy()).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(), r"name it with layers="),
    (dict(layers=[1], mode="spin"), r"mode='spin' is not one of"),
    (dict(layers=[1], measure="loss"), r"measure='loss' is not one of"),
    (dict(layers=[1], kv_heads=3), r"kv_heads=3 is out of range \(valid: 0\.\.0\)"),
    (dict(layers=[7]), r"layer=7 is out of range for a 2-layer model"),
    (dict(layers=[1], n_calibration=3), r"n_calibration=3 is out of range"),
])
def test_bad_unit_cycling_inputs_fail_before_work(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pi.gate_cycling_unit(zoo_model("w4s4-1kv-shared"), shifts=[1], progress=False, **kwargs)


def test_static_mode_needs_a_gate_bias():
    from conftest import make_model

    model = make_model(dict(n_layers=1, window=4, stride=4, gate_bias=False, payload="shared"))
    with pytest.raises(ValueError, match="gate_bias=False"):
        mean_gate_logits(model, torch.zeros(1, 8, dtype=torch.long), layers=0)


def test_specialized_units_rule_on_a_known_ablation():
    """The rule reads the ablation only: a unit hurt on 2 adjacent phases is specialized, one hurt
    nowhere with the smallest change is the control, one hurt everywhere is neither."""
    rng = np.random.default_rng(0)
    residue = np.repeat(np.arange(8), 200)
    phase = residue % 4
    clean = np.ones(residue.size, bool)
    ko = np.stack([~np.isin(phase, [1, 2]), np.zeros(residue.size, bool), rng.random(residue.size) < 0.99], 1)
    units = pd.DataFrame([dict(layer=0, kv_head=0, heads=(0, 1)), dict(layer=1, kv_head=0, heads=(0, 1)),
                          dict(layer=1, kv_head=1, heads=(2, 3))])
    ablation = pi.AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=ko,
                                 residue_modulus=8, stride=4, scope="kv_head")
    model = zoo_model("w4s4")  # 2 layers x 2 KV heads, W = S = 4: every unit cyclable
    sel = pi.specialized_units(model, ablation=ablation)
    roles = dict(zip(zip(sel.table.layer, sel.table.kv_head), sel.table.role))
    assert roles == {(0, 0): "specialized", (1, 0): "", (1, 1): "control"}
    assert [u["label"] for u in sel.units()] == ["L0H0", "L1H1"]
    assert sel.units("specialized")[0]["hurt_phases"] == [1, 2]
    # a unit hurt at every phase is not specialized, even when S <= max_phases allows the count
    everywhere = pi.AblationResult(units=units.iloc[:1], residue=residue, clean_correct=clean,
                                   knockout_correct=np.zeros((residue.size, 1), bool), residue_modulus=8, stride=4,
                                   scope="kv_head")
    wide = pi.specialized_units(model, ablation=everywhere, max_phases=4)
    assert wide.table.role.tolist() == [""]
    assert wide.rule.startswith("specialized: knockout hurts 1..3 adjacent phases of 4")  # the rule as applied


# ------------------------------------------------------------ the shipped deep model
DEEP_EQ = "deep12-w8s8-1kv-shared-equal"
_deep_missing = DEEP_EQ not in pi.zoo.available()
if _deep_missing and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI=true: the shipped checkpoint {DEEP_EQ!r} is missing (phaseinterp zoo build {DEEP_EQ})")
deep = pytest.mark.skipif(_deep_missing, reason=f"{DEEP_EQ} is not built")
slow = pytest.mark.slow


@functools.cache
def deep_selection():
    return pi.specialized_units(zoo_model(DEEP_EQ), progress=False)


@functools.cache
def deep_cycled(role):
    unit = deep_selection().units(role)[0]
    return pi.gate_cycling_unit(zoo_model(DEEP_EQ), shifts=SHIFTS, layers=unit["layers"], kv_heads=unit["kv_heads"], n_boot=200, progress=False)


@slow
@deep
def test_deep_rule_picks_layer_11_and_a_quiet_control():
    sel = deep_selection()
    assert [u["label"] for u in sel.units("specialized")] == ["L11H0"], sel.table.to_string()
    assert sel.units("specialized")[0]["hurt_phases"] == [5, 6]
    control = sel.units("control")
    assert len(control) == 1 and control[0]["hurt_phases"] == []


@slow
@deep
def test_deep_layer_11_phase_moves_with_its_gates():
    r = deep_cycled("specialized")
    s = r.scores
    assert s["n_identified"] >= 5 and s["identification_p"] < 0.01, s["per_shift"].to_string()
    low, high = r.intervals().loc["r2_pooled"]
    assert low <= s["r2_pooled"] <= high  # reported with its interval, whatever it is
    # unshifted, layer 11 contributes at phases 5 and 6 (answer log-prob)
    assert set(np.argsort(r.contribution().loc[0].to_numpy())[-2:]) == {5, 6}


@slow
@deep
def test_deep_negative_control_is_not_identified():
    r = deep_cycled("control")
    assert r.scores["n_identified"] <= 2, r.scores["per_shift"].to_string()
    assert r.scores["identification_p"] > 0.05


# ------------------------------------------------------------ the command line
@pytest.mark.parametrize("argv, match", [
    (["cycle", "w4s4-1kv-shared", "--score", "unit"], "--score unit needs the unit: --layer L"),
    (["cycle", "w4s4-1kv-shared", "--score", "unit", "--layer", "1", "--kv-heads", "3"],
     r"kv_heads=3 is out of range \(valid: 0\.\.0\) for a model with 1 KV head\(s\) per layer"),
    (["cycle", "w4s4-1kv-shared", "--score", "unit", "--layer", "1", "--shard-dir", "x"], "--shard-dir runs the profile"),
])
def test_cli_unit_cycling_bad_input(argv, match, capsys, tmp_path, monkeypatch):
    from phaseinterp.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    import re

    assert re.search(match, capsys.readouterr().err)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_cli_unit_cycling_writes_a_loadable_result(tmp_path, capsys):
    from phaseinterp.cli import main

    out = tmp_path / "unit"
    assert main(["cycle", "w4s4-1kv-shared", "--score", "unit", "--layer", "1", "--shifts", "1,2",
                 "--n-per-residue", "72", "--out", str(out)]) == 0
    r = pi.UnitCyclingResult.load(out)
    assert r.unit == "L1" and r.shifts == (0, 1, 2)
    out_text = capsys.readouterr().out
    # shifting L1 by +1 collapses this model's accuracy: the CLI says the premise fails and
    # claims no identification, in the printed summary and in the saved result
    assert not r.premise_holds and r.premise_notes
    assert "PREMISE FAILS" in out_text and "not claimed: the premise fails" in out_text
    assert "identified" not in out_text
