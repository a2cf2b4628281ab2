"""Interventions: fast ablation == naive, exact restoration, gate-shift algebra, statistics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import phaseinterp as pi
from phaseinterp import CompressedTransformer
from phaseinterp.interventions import (
    AblationResult,
    CyclingResult,
    shift_gates,
    gate_cycling_profile,
    gate_profile,
    ablate,
    shifted_copy,
)
from phaseinterp.interventions.cycling_stats import cycling_scores
from phaseinterp.interventions.gate_shifts import canonical_shifts
from conftest import make_model, small_task

TASK = small_task()
BASE = dict(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_head=8,
            d_mlp=64, local_window=6)


def make(**kw) -> CompressedTransformer:
    return make_model({**BASE, **kw})


@pytest.fixture(scope="module")
def prompts():
    return TASK.generate(3, seed=0, strict=False)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_state(model, state):
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


# ------------------------------------------------------------- mean ablation
@pytest.mark.parametrize("kw", [
    dict(window=4, stride=4),
    dict(window=8, stride=4, compression="deepseek", gate="vector"),
    dict(window=4, stride=2, memory="uncompressed_tail"),
    dict(compression=None),
])
@pytest.mark.parametrize("scope", ["kv_head", "layer"])
def test_fast_ablation_equals_naive(kw, scope, prompts):
    model = make(**kw)
    fast = ablate(model, TASK, prompts=prompts, scope=scope, n_calibration=16, progress=False)
    naive = ablate(model, TASK, prompts=prompts, scope=scope, n_calibration=16, method="naive",
                          progress=False)
    np.testing.assert_allclose(fast.clean_logit_answer, naive.clean_logit_answer, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fast.knockout_logit_answer, naive.knockout_logit_answer, atol=1e-5, rtol=0)
    assert (fast.knockout_correct == naive.knockout_correct).all()
    # The knockout really changes something.
    assert np.abs(fast.knockout_logit_answer - fast.clean_logit_answer[:, None]).max() > 1e-4


def test_ablation_units_and_custom_heads(prompts):
    model = make(window=4, stride=4)
    res = ablate(model, TASK, layer=1, prompts=prompts, n_calibration=8, progress=False)
    assert res.units.to_dict(orient="list") == {"layer": [1, 1], "kv_head": [0, 1], "heads": [(0, 1), (2, 3)]}
    assert res.relative_change.shape == (2, 4)
    assert list(res.relative_change.columns) == [0, 1, 2, 3]
    custom = ablate(model, TASK, layer=[0, 2], heads=[[3]], prompts=prompts, n_calibration=8, progress=False)
    assert list(custom.units.layer) == [0, 2] and list(custom.units.heads) == [(3,), (3,)]


def test_ablation_bad_requests(prompts):
    model = make(window=4, stride=4)
    with pytest.raises(ValueError, match=r"layer=9 is out of range for a 3-layer model \(0..2\)"):
        ablate(model, TASK, layer=9, prompts=prompts, progress=False)
    with pytest.raises(ValueError, match="scope='head' is not one of"):
        ablate(model, TASK, scope="head", prompts=prompts, progress=False)
    with pytest.raises(ValueError, match="query head ids must be in 0..3"):
        ablate(model, TASK, heads=[[4]], prompts=prompts, progress=False)
    with pytest.raises(ValueError, match="no stored evaluation task"):
        ablate(model, layer=0, progress=False)


def _hand_made_ablation() -> AblationResult:
    """2 units, stride 4, R = 8, 10 prompts per residue: unit 0 kills phases 1-2 only."""
    residue = np.repeat(np.arange(8), 10)
    clean = np.ones(residue.size, dtype=bool)
    knocked = np.ones((residue.size, 2), dtype=bool)
    knocked[np.isin(residue % 4, [1, 2]), 0] = False
    knocked[(residue % 4 == 3) & (np.arange(residue.size) % 10 < 2), 1] = False
    units = pd.DataFrame({"layer": [0, 0], "kv_head": [0, 1], "heads": [(0, 1), (2, 3)]})
    return AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=knocked,
                          residue_modulus=8, stride=4, scope="kv_head", model_label="hand-made")


def test_relative_change_folding_and_specialization():
    res = _hand_made_ablation()
    rel = res.relative_change
    np.testing.assert_allclose(rel.loc[(0, 0)].to_numpy(), [0, -100, -100, 0])
    np.testing.assert_allclose(rel.loc[(0, 1)].to_numpy(), [0, 0, 0, -20])
    spec = res.specialization(threshold=-50).set_index("kv_head")
    assert spec.loc[0, "phases"] == [1, 2] and spec.loc[0, "contiguous"] and spec.loc[0, "concentration"] == 1.0
    assert spec.loc[1, "n_phases"] == 0
    frame = res.to_frame(n_boot=200)
    row = frame[(frame.kv_head == 0) & (frame.phase == 1)].iloc[0]
    assert row.relative_change == -100 and row.ci_low == -100 and row.ci_high == -100


def test_a_phase_s_relative_change_is_the_mean_of_its_residues_as_the_paper_folds():
    """Residue 0 goes 10/10 -> 0/10 and residue 4 (the same phase) 1/10 -> 1/10: the paper's fold (each
    residue's relative change, then the phase's mean) gives -50%, in `relative_change`, `phase_tests`,
    `to_frame` and `specialization` alike; pooling the prompts would give -90.9%. A residue with no clean
    answer right has no relative change and is left out of its phase's mean."""
    residue = np.repeat(np.arange(8), 10)
    clean = np.ones(residue.size, dtype=bool)
    clean[(residue == 4) & (np.arange(residue.size) % 10 > 0)] = False  # residue 4: 1 of 10 right
    knocked = clean[:, None].copy()
    knocked[residue == 0, 0] = False
    units = pd.DataFrame({"layer": [0], "kv_head": [0], "heads": [(0,)]})
    res = AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=knocked,
                         residue_modulus=8, stride=4, scope="kv_head")
    assert res.relative_change.loc[(0, 0), 0] == pytest.approx(-50.0)
    assert res.phase_tests().set_index("phase").loc[0, "relative_change"] == pytest.approx(-50.0)
    row = res.to_frame(n_boot=200).set_index("phase").loc[0]
    assert row.relative_change == pytest.approx(-50.0) and row.clean_accuracy == pytest.approx(0.55)
    assert row.change_pp == pytest.approx(-50.0) and row.ci_low <= -50.0 <= row.ci_high
    assert res.clean.loc[0] == pytest.approx(0.55) and res.absolute_change.loc[(0, 0), 0] == pytest.approx(-50.0)
    assert res.specialization(threshold=-50).iloc[0].worst_change == pytest.approx(-50.0)
    clean[residue == 4] = False  # residue 4 never right: phase 0's change is residue 0's alone
    res = AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=clean[:, None] & knocked,
                         residue_modulus=8, stride=4, scope="kv_head")
    assert res.relative_change.loc[(0, 0), 0] == pytest.approx(-100.0)


def test_specialization_needs_a_change_that_survives_the_multiplicity_correction():
    """Unit 1 loses 7 of 60 prompts at phase 1 (-11.7%, 7 discordant pairs all one way): p = 0.016
    alone, 0.16 after Holm over 3 units x 4 phases. With threshold -10% it is hurt only without
    the correction; unit 0's wipe-out of phases 1-2 survives either correction."""
    residue = np.repeat(np.arange(8), 30)  # 60 prompts per phase
    clean = np.ones(residue.size, dtype=bool)
    knocked = np.ones((residue.size, 3), dtype=bool)
    knocked[np.isin(residue % 4, [1, 2]), 0] = False
    knocked[np.flatnonzero(residue % 4 == 1)[:7], 1] = False
    units = pd.DataFrame({"layer": [0, 0, 1], "kv_head": [0, 1, 0], "heads": [(0,), (1,), (0,)]})
    res = AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=knocked,
                         residue_modulus=8, stride=4, scope="kv_head")
    tests = res.phase_tests("holm").set_index(["layer", "kv_head", "phase"])
    cell = tests.loc[(0, 1, 1)]
    assert cell.change_pp == pytest.approx(-100 * 7 / 60) and cell.relative_change == pytest.approx(-100 * 7 / 60)
    assert cell.p_value == pytest.approx(2 * 0.5 ** 7) and cell.p_value < 0.05
    assert cell.p_adjusted == pytest.approx(10 * 2 * 0.5 ** 7) and not cell.significant  # Holm rank 3 of 12
    assert cell.ci_low_pp < 0 < cell.ci_high_pp  # the adjusted interval includes zero
    wiped = tests.loc[(0, 0, 1)]
    assert wiped.significant and wiped.ci_high_pp < 0 and wiped.change_pp == -100
    for method in ("holm", "bh"):
        spec = res.specialization(threshold=-10, correction=method).set_index(["layer", "kv_head"])
        assert spec.loc[(0, 0), "phases"] == [1, 2]
        assert spec.loc[(0, 1), "n_phases"] == 0, method
    # Every interval excludes zero exactly when the adjusted test rejects.
    t = res.phase_tests("bh")
    assert ((t.ci_high_pp < 0) | (t.ci_low_pp > 0)).tolist() == t.significant.tolist()
    np.testing.assert_allclose(res.absolute_change.loc[(0, 1)].to_numpy(), [0, -100 * 7 / 60, 0, 0])
    with pytest.raises(ValueError, match="method='bonferroni'"):
        res.phase_tests("bonferroni")


def test_heatmap_shows_percentage_points_where_a_baseline_is_near_zero():
    res = _hand_made_ablation()
    assert res.plot().data[0].colorbar.title.text == "Δ acc (% of clean)"  # every baseline is 100%
    clean = res.clean_correct.copy()
    clean[(res.residue % 4 == 3) & (np.arange(res.residue.size) % 10 >= 1)] = False  # phase 3 at 10% -> 1 of 20
    clean[(res.residue % 4 == 3)] = np.arange(int((res.residue % 4 == 3).sum())) == 0
    low = AblationResult(units=res.units, residue=res.residue, clean_correct=clean,
                         knockout_correct=res.knockout_correct & clean[:, None], residue_modulus=8, stride=4,
                         scope="kv_head")
    fig = low.plot()
    assert fig.data[0].colorbar.title.text == "Δ acc (pp)"
    np.testing.assert_allclose(fig.data[0].z, low.absolute_change.to_numpy())
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["Δ acc (pp)", "Δ acc (% of clean)"]
    assert low.plot(value="relative").data[0].colorbar.title.text == "Δ acc (% of clean)"
    with pytest.raises(ValueError, match="value='percent'"):
        low.plot(value="percent")


def test_ablation_result_round_trip(tmp_path):
    res = _hand_made_ablation()
    res.save(tmp_path / "abl")
    back = AblationResult.load(tmp_path / "abl")
    pd.testing.assert_frame_equal(back.relative_change, res.relative_change)
    (tmp_path / "abl" / "arrays.npz").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(ValueError, match="changed after it was saved"):
        AblationResult.load(tmp_path / "abl")
    meta = json.loads((tmp_path / "abl" / "meta.json").read_text())
    del meta["content_sha256"]  # a save without the hash: the arrays file itself is checked
    (tmp_path / "abl" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        AblationResult.load(tmp_path / "abl")


# --------------------------------------------------------------- gate cycling
@pytest.mark.parametrize("kw", [dict(window=4, stride=4), dict(window=4, stride=4, gate="vector"),
                                dict(window=4, stride=4, tie_kv_gates=True),
                                dict(window=8, stride=4, compression="deepseek", gate="vector")])
def test_cycle_gates_restores_exactly(kw):
    model = make(**kw)
    tokens = torch.randint(0, TASK.vocab.size, (2, 40))
    state, logits = _state(model), model(tokens)
    with shift_gates(model, 1):
        shifted = model(tokens)
    assert (shifted - logits).abs().max() > 1e-5
    _assert_same_state(model, state)
    assert torch.equal(model(tokens), logits)
    with pytest.raises(RuntimeError, match="boom"):
        with shift_gates(model, 2, layers=[0, 2]):
            raise RuntimeError("boom")
    _assert_same_state(model, state)
    assert torch.equal(model(tokens), logits)


def test_shift_algebra():
    model = make(window=4, stride=4)
    state = _state(model)
    for no_op in (0, 4, -8):  # 0 mod S moves nothing: refused as gate_cycling and the CLI refuse it
        with pytest.raises(ValueError, match=f"shift={no_op} is 0 mod S=4"):
            shifted_copy(model, no_op)
        with pytest.raises(ValueError, match=f"shift={no_op} is 0 mod S=4"):
            shift_gates(model, no_op).__enter__()
    there_and_back = shifted_copy(shifted_copy(model, 3), -3)
    _assert_same_state(there_and_back, state)
    one = shifted_copy(model, 1, layers=0, branch="k")
    Z, Z1 = model.blocks[0].attn.compressor.Z_k, one.blocks[0].attn.compressor.Z_k
    for i in range(4):
        assert torch.equal(Z1[i], Z[(i - 1) % 4])  # Z~_i = Z_{(i-d) mod W}
    assert torch.equal(one.blocks[0].attn.compressor.C_k, model.blocks[0].attn.compressor.C_k)  # payload untouched
    assert torch.equal(one.blocks[0].attn.compressor.Z_v, model.blocks[0].attn.compressor.Z_v)  # branch k only
    assert torch.equal(one.blocks[1].attn.compressor.Z_k, model.blocks[1].attn.compressor.Z_k)
    _assert_same_state(model, state)


@pytest.mark.parametrize("kw, match", [
    (dict(window=8, stride=4), "defined for W = S"),
    (dict(window=4, stride=4, gate="uniform"), "no offset-specific gate parameters"),
    (dict(compression=None), "no gates to shift"),
    (dict(window=4, stride=4, tie_kv_gates=True), "tied"),
])
def test_cycle_gates_refuses_undefined_layouts(kw, match):
    model = make(**kw)
    branch = "k" if kw.get("tie_kv_gates") else "both"
    with pytest.raises(ValueError, match=match):
        with shift_gates(model, 1, branch=branch):
            pass


def _synthetic_cycling(acc0: np.ndarray, n: int = 200) -> CyclingResult:
    """Prompts whose accuracy under shift d is exactly A_0((r-d) mod S), boundary kept weak."""
    S, R = len(acc0), 2 * len(acc0)
    residue = np.repeat(np.arange(R), n)
    shifts = (0, -1, 1, 2)
    rows = []
    for d in shifts:
        acc = np.roll(acc0, d)
        acc[S - 1] = acc0[S - 1]
        k = np.round(acc[residue % S] * n).astype(int)
        rows.append(np.concatenate([np.arange(n) < k[r * n] for r in range(R)]))
    return CyclingResult(shifts=shifts, residue=residue, correct=np.stack(rows), residue_modulus=R, stride=S,
                         n_boot=50)


def test_cycling_scores_on_a_known_answer():
    res = _synthetic_cycling(np.array([0.9, 0.4, 0.8, 0.2, 0.95, 0.85, 0.9, 0.1]))
    s = res.scores
    assert s["r2_pooled"] > 0.8 and s["corr2_pooled"] > 0.8
    per = s["per_shift"].set_index("shift")
    assert per.displacement.to_dict() == {-1: -1, 1: 1, 2: 2}
    assert per.identified.all() and s["n_identified"] == 3
    assert (per.n_points == 7).all()
    assert (per.boundary_rank == 0).all()  # the boundary stays the worst phase
    ci = res.intervals()
    assert 0.9 <= ci.loc["r2_pooled", "low"] <= ci.loc["r2_pooled", "high"] <= 1.0
    table = res.identification()
    assert list(table.columns[:8]) == list(range(8)) and table.identified.all()


def _changes(acc0, d, scale=1.0):
    """A profile whose change from acc0 is ``scale`` x the predicted change under shift d."""
    return acc0 + scale * (np.roll(acc0, d) - acc0)


def test_headline_r2_fails_a_prediction_of_the_wrong_size_that_correlation_forgives():
    acc0 = np.array([0.9, 0.3, 0.7, 0.05])
    exact = cycling_scores(acc0, {1: _changes(acc0, 1)})["per_shift"].iloc[0]
    assert exact.r2 == pytest.approx(1.0) and exact.corr2 == pytest.approx(1.0)
    small = cycling_scores(acc0, {1: _changes(acc0, 1, 0.2)})["per_shift"].iloc[0]
    assert small.corr2 == pytest.approx(1.0)  # the squared correlation cannot see the scale
    assert small.slope == pytest.approx(0.2)
    assert small.r2 < 0.0  # 1 - SS_res/SS_tot: a change 5x smaller than predicted fails
    assert small.mean_drop == pytest.approx(0.2 * exact.mean_drop)
    # The w4s4-1kv-shared profile: r2 0.23 for +1 while corr2 was 0.996.
    base = np.array([0.886, 0.808, 0.990, 0.017])
    plus_one = cycling_scores(base, {1: np.array([0.000, 0.574, 0.539, 0.001])})["per_shift"].iloc[0]
    assert plus_one.r2 == pytest.approx(0.23, abs=0.01) and plus_one.corr2 > 0.99


def test_shift_identification_picks_the_applied_shift_and_rejects_the_wrong_one():
    acc0 = np.array([0.9, 0.4, 0.8, 0.2, 0.95, 0.85, 0.9, 0.1])
    observed = {d: _changes(acc0, d) for d in (-1, 1, 2)}
    s = cycling_scores(acc0, observed, n_permutations=999)
    per = s["per_shift"].set_index("shift")
    for d in (-1, 1, 2):
        scores = per.loc[d, [f"hypothesis_{k}" for k in range(8)]].to_numpy(dtype=float)
        assert int(np.argmax(scores)) == d % 8 and per.loc[d, "identified"]
        assert scores[(d + 1) % 8] < scores[d % 8] - 0.5  # the wrong hypothesis loses clearly
    assert s["identification_p"] < 0.01 and (per.identification_p < 0.05).all()
    # Label the same observations with the wrong applied shift: identification fails.
    wrong = cycling_scores(acc0, {2: observed[1], -1: observed[2]}, n_permutations=999)
    wper = wrong["per_shift"].set_index("shift")
    assert not wper.identified.any() and wrong["n_identified"] == 0
    assert wper.displacement.to_dict() == {2: 1, -1: 2}
    assert wrong["identification_p"] > 0.5 and (wper.r2 < 0).all()
    # S = 4: per-shift p cannot go below 1/6 (3! arrangements), jointly 1/216.
    acc4 = np.array([0.9, 0.3, 0.7, 0.05])
    s4 = cycling_scores(acc4, {d: _changes(acc4, d) for d in (-1, 1, 2)}, n_permutations=999)
    assert s4["per_shift"].identification_p.min() == pytest.approx(1 / 6)
    assert s4["identification_p"] == pytest.approx(1 / 216)


def test_shifts_are_counted_once_mod_s():
    assert canonical_shifts((-3, -2, -1, 1, 2, 3), 4) == (-1, 1, 2)
    assert canonical_shifts(range(1, 8), 8) == (-3, -2, -1, 1, 2, 3, 4)
    acc0 = np.array([0.9, 0.4, 0.8, 0.2, 0.95, 0.85, 0.9, 0.1])
    S, R, n = 8, 8, 50
    residue = np.repeat(np.arange(R), n)
    rows = [np.concatenate([np.arange(n) < round(a * n) for a in _changes(acc0, d)]) for d in (0, 1, -7)]
    res = CyclingResult(shifts=(0, 1, -7), residue=residue, correct=np.stack(rows), residue_modulus=R, stride=S)
    assert res.scored_shifts == (1,) and res.scores["n_shifts"] == 1


def test_gate_cycling_runs_and_round_trips(tmp_path, prompts):
    model = make(window=4, stride=4)
    res = gate_cycling_profile(model, TASK, shifts=(1, -1), prompts=prompts, progress=False)
    assert res.shifts == (0, 1, -1) and res.correct.shape == (3, len(prompts.answer))
    res.save(tmp_path / "cyc")
    back = CyclingResult.load(tmp_path / "cyc")
    assert back.shifts == res.shifts and (back.correct == res.correct).all()


def test_the_0_3_names_are_gone():
    """0.4 removed 0.3's deprecated aliases (docs/migration.md): only the new names exist."""
    listed = dir(pi)
    assert {"shift_gates", "gate_cycling_profile", "gate_cycling_unit", "ablate"} <= set(listed)
    for old in ("cycle_gates", "gate_cycling", "mean_ablation"):
        assert not hasattr(pi, old) and old not in pi.interventions.__all__, old
        assert not callable(getattr(pi.interventions, old, None)), old  # gate_cycling: the module only


def test_gate_cycling_takes_the_baseline_size_by_default(prompts):
    """``baseline=phase_profile(model)`` works as is: without ``n_per_residue`` gate_cycling_profile
    profiles as many prompts per residue as the baseline did (issue 35: 250 against 72 failed)."""
    model = make(window=4, stride=4)
    n = 16  # a size the task moment-matches (exactly at multiples of 64; 16 within the tolerance), not the default 72
    baseline = pi.phase_profile(model, TASK, n_per_residue=n, progress=False)
    reused = gate_cycling_profile(model, TASK, shifts=(1,), baseline=baseline, n_boot=10, progress=False)
    rerun = gate_cycling_profile(model, TASK, shifts=(1,), n_per_residue=n, n_boot=10, progress=False)
    assert reused.correct.shape == rerun.correct.shape == (2, n * TASK.residue_modulus)
    assert np.array_equal(reused.correct, rerun.correct)


# ---------------------------------------------------------------- gate stats
def test_gate_profile_uniform_and_one_hot(prompts):
    uniform = gate_profile(make(window=4, stride=4, gate="uniform"), TASK, prompts=prompts)
    np.testing.assert_allclose(uniform.slots.mean_alpha, 0.25, atol=1e-6)
    np.testing.assert_allclose(uniform.heads.window_concentration, 4.0, atol=1e-5)
    model = make(window=4, stride=4, gate_bias=True)
    with torch.no_grad():
        for block in model.blocks:
            for br in ("k", "v"):
                getattr(block.attn.compressor, f"Z_{br}").zero_()
                b = getattr(block.attn.compressor, f"b_{br}")
                b.zero_()
                b[2] = 50.0  # every head puts all weight on slot 2
    prof = gate_profile(model, TASK, prompts=prompts)
    assert (prof.heads.preferred_slot == 2).all() and (prof.heads.static_preferred_slot == 2).all()
    np.testing.assert_allclose(prof.heads.window_concentration, 1.0, atol=1e-4)
    np.testing.assert_allclose(prof.heads.static_concentration, 1.0, atol=1e-4)
    assert prof.mean_alpha("k").shape == (3, 2, 4)


@pytest.mark.parametrize("name", ["w4s4-1kv-shared", "dsv4-tiny"])
def test_gate_cycling_reuses_a_profile_of_the_same_model_and_prompts(zoo_model, name, tmp_path):
    """``baseline=`` takes the shift-0 row from a phase profile: the same result as rerunning it, on
    both families, also from a saved profile; a profile of other prompts or of another model (here
    the same model with its gates shifted for good) is refused before the shifted passes run."""
    import phaseinterp as pi
    from phaseinterp.profile import PhaseProfile

    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    pick = np.arange(0, 72 * task.residue_modulus, 24)  # 3 prompts per residue
    batch = task.generate(72, seed=0).subset(pick)
    profile = pi.phase_profile(model, batch, progress=False)
    run = lambda **kw: gate_cycling_profile(model, task, shifts=(1,), prompts=batch, n_boot=10, progress=False, **kw)  # noqa: E731
    plain = run()
    assert plain.correct[0].any() and not plain.correct[0].all()  # a row the comparison can get wrong
    np.testing.assert_array_equal(run(baseline=profile).correct, plain.correct)
    profile.save(tmp_path / "profile")
    np.testing.assert_array_equal(run(baseline=PhaseProfile.load(tmp_path / "profile")).correct, plain.correct)

    other_prompts = task.generate(72, seed=1).subset(pick)
    with pytest.raises(ValueError, match="differ from the prompts"):
        run(baseline=pi.phase_profile(model, other_prompts, progress=False))
    with pytest.raises(ValueError, match=f"profiles 24 prompts but gate cycling runs {len(batch)}"):
        one_each = batch.subset((batch.meta.groupby("residue").cumcount() < 1).to_numpy())  # every residue, once
        run(baseline=pi.phase_profile(model, one_each, progress=False))
    moved = shifted_copy(model, 1)
    with pytest.raises(ValueError, match="does not match this model"):
        run(baseline=pi.phase_profile(moved, batch, progress=False))
    with pytest.raises(ValueError, match="must be a PhaseProfile"):
        run(baseline=plain)


# ------------------------------------------------- a user's hook_z ablation is the built-in fast ablation
@pytest.mark.parametrize("name", [pytest.param("w4s4", marks=pytest.mark.zoo("w4s4")),
                                  pytest.param("dsv4-tiny", marks=pytest.mark.zoo("dsv4-tiny"))])
def test_a_user_s_hook_z_ablation_equals_the_built_in_fast_ablation(zoo_model, name):
    """Mean replacement written by a user, TransformerLens style (a ``blocks.{l}.attn.hook_z`` hook
    under ``model.hooks`` around ``last_logits``, finding the answer position through
    ``hook.ctx["query_range"]``) gives `ablate`'s knockout logits to 1e-5. In both families
    `last_logits` is the cached forward: the hook sees the prefill, then the step. The sweep reruns
    only the answer position over a cached prefix: other matmul shapes, so the float32 sums round
    differently."""
    import phaseinterp as pi
    from phaseinterp.interventions._common import fixed_answer_position
    from phaseinterp.interventions.knockout import calibration_mean_z

    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    prompts = task.generate(1, seed=0, strict=False)
    answer_pos = fixed_answer_position(prompts)
    mean_z = calibration_mean_z(model, task.calibration(task.residue_modulus, seed=1).tokens, answer_pos)
    layer = model.cfg.n_layers - 2
    tokens = prompts.tokens[:, : answer_pos + 1]
    answer = torch.as_tensor(prompts.answer)
    batched = pi.ablate(model, task, layer=layer, prompts=prompts, calibration_mean=mean_z, n_calibration=64,
                        batch_size=len(prompts), progress=False)
    for u, unit in enumerate(batched.units.itertuples()):
        heads, seen = list(unit.heads), []

        def mean_replace(z, hook, heads=heads, seen=seen):  # what a user writes, by the hook rule
            seen.append(tuple(z.shape))
            a, _ = hook.ctx.get("query_range", (0, z.shape[1]))
            if not a <= answer_pos < a + z.shape[1]:
                return z
            z = z.clone()
            z[:, answer_pos - a, heads] = mean_z[layer, heads].to(z.dtype)
            return z

        with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", mean_replace)]):
            logits = model.last_logits(tokens)
        shape = (len(prompts), model.cfg.n_heads, model.cfg.d_head)
        assert seen == [(shape[0], n) + shape[1:] for n in (answer_pos, 1)]
        user = logits.float().gather(-1, answer[:, None].to(logits.device))[:, 0].cpu()
        torch.testing.assert_close(user, torch.as_tensor(batched.knockout_logit_answer[:, u]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", ["roll", "static"])
def test_a_shift_beyond_a_machine_integer_is_its_residue_mod_the_window(prompts, mode):
    """A shift rolls W slots, so 4 * 10**20 + 1 on a W = 4 model is shift 1 (it overflowed torch.roll
    after the unshifted pass)."""
    model = make(window=4, stride=4)
    big, one = (gate_cycling_profile(model, TASK, shifts=(d,), prompts=prompts, mode=mode, n_calibration=8, n_boot=10,
                                     progress=False) for d in (4 * 10**20 + 1, 1))
    assert big.shifts == (0, 4 * 10**20 + 1)
    np.testing.assert_array_equal(big.to_frame().drop(columns="shift").to_numpy(),
                                  one.to_frame().drop(columns="shift").to_numpy())
