"""The confirmatory pipeline: alternative ablations, held-out nomination, one-call `confirm`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats

from phaseinterp import CompressedTransformer
from phaseinterp.errors import UserInputError
from phaseinterp.interventions import AblationResult, ConfirmResult, ablate, confirm, replacement_ablation
from phaseinterp.interventions.confirm import ablation_agreement, confirm_nominations, nominate_heads
from phaseinterp.interventions.gate_stats import GateProfile
from conftest import make_model, small_task

TASK = small_task()
BASE = dict(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8,
            d_mlp=64, local_window=6, window=4, stride=4)


def make(**kw) -> CompressedTransformer:
    return make_model({**BASE, **kw}, randomize=("b_k", "b_v"), scale=3.0)


@pytest.fixture(scope="module")
def prompts():
    return TASK.generate(16, seed=0)


def test_norm_matched_and_resample_ablations_match_a_direct_reference(prompts):
    model = make()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    calib = TASK.calibration(8, seed=1)
    pos = int(prompts.answer_pos[0])
    _, cache = model.run_with_cache(calib.tokens[:, : pos + 1], names_filter=lambda n: n.endswith("hook_z"))
    calib_z = torch.stack([cache[f"blocks.{layer}.attn.hook_z"][:, pos] for layer in range(2)], 1)  # [cal, layer, head, d]
    mean = calib_z.mean(0)
    donors = torch.as_tensor(np.random.default_rng(0).integers(0, 8, len(prompts.answer)))
    heads = [2, 3]  # KV head 1 of layer 1

    def reference(kind):
        def hook(z, hook):
            z = z.clone()
            if kind == "resample":
                z[:, pos, heads] = calib_z[donors, 1][:, heads]
            else:
                orig = z[:, pos, heads]
                z[:, pos, heads] = mean[1, heads] * orig.norm(dim=-1, keepdim=True) / mean[1, heads].norm(dim=-1, keepdim=True)
            return z
        logits = model.run_with_hooks(prompts.tokens[:, : pos + 1], fwd_hooks=[("blocks.1.attn.hook_z", hook)])
        return (logits[:, pos].argmax(-1) == prompts.answer).numpy()

    base = ablate(model, TASK, n_calibration=8, prompts=prompts, progress=False)
    for kind in ("resample", "norm_matched"):
        res = replacement_ablation(model, TASK, method=kind, n_calibration=8, prompts=prompts)
        assert isinstance(res, AblationResult) and res.knockout_correct.shape == (len(prompts.answer), 4)
        np.testing.assert_array_equal(res.clean_correct, base.clean_correct)
        np.testing.assert_array_equal(res.knockout_correct[:, 3], reference(kind))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    with pytest.raises(ValueError, match="method='zero'"):
        replacement_ablation(model, TASK, method="zero", prompts=prompts)


def _ablation(hurt_cells, U=3, S=4, n=40) -> AblationResult:
    """Hand-made: every prompt right when clean; a unit's knockout wipes out its hurt phases."""
    residue = np.repeat(np.arange(S), n)
    clean = np.ones(residue.size, dtype=bool)
    knocked = np.ones((residue.size, U), dtype=bool)
    for u, g in hurt_cells:
        knocked[residue == g, u] = False
    units = pd.DataFrame({"layer": list(range(U)), "kv_head": [0] * U, "heads": [(0,)] * U})
    return AblationResult(units=units, residue=residue, clean_correct=clean, knockout_correct=knocked,
                          residue_modulus=S, stride=S, scope="kv_head")


def test_nominations_scored_against_random_heads():
    ablation = _ablation([(0, 1), (1, 2), (2, 0), (2, 1)])  # 4 hurt cells of 12
    nominations = pd.DataFrame({"layer": [0, 1, 2], "kv_head": [0, 0, 0], "preferred_phase": [1, 2, 3],
                                "preferred_alpha": [0.9] * 3, "concentration": [1.2] * 3,
                                "nominated": [True, True, True]})
    table, stats = confirm_nominations(nominations, ablation)
    assert table.hit.tolist() == [True, True, False]
    assert stats["n_hits"] == 2 and stats["hit_rate"] == pytest.approx(2 / 3)
    assert stats["chance_rate"] == pytest.approx(4 / 12)
    assert stats["p_value"] == pytest.approx(scipy_stats.hypergeom.sf(1, 12, 4, 3))
    # Same units, random phase: unit hit probabilities 1/4, 1/4, 2/4.
    p = [0.25, 0.25, 0.5]
    at_least_two = p[0] * p[1] + p[0] * p[2] + p[1] * p[2] - 2 * p[0] * p[1] * p[2]
    assert stats["p_same_units"] == pytest.approx(at_least_two)
    worse = confirm_nominations(nominations.assign(preferred_phase=[3, 3, 3]), ablation)[1]
    assert worse["n_hits"] == 0 and worse["p_value"] == pytest.approx(1.0)


def test_nominate_heads_from_a_gate_profile():
    slots, heads = [], []
    for kv, slot in ((0, 2), (1, None)):
        alpha = np.full(4, 0.25) if slot is None else np.eye(4)[slot] * 0.97 + 0.0075
        for s in range(4):
            slots.append(dict(layer=0, kv_head=kv, branch="k", slot=s, phase=s, mean_alpha=alpha[s], static_alpha=0.25))
        heads.append(dict(layer=0, kv_head=kv, branch="k", preferred_slot=int(alpha.argmax()),
                          static_concentration=float(np.exp(-(alpha * np.log(alpha)).sum()))))
    gates = GateProfile(slots=pd.DataFrame(slots), heads=pd.DataFrame(heads), window=4, stride=4)
    table = nominate_heads(gates).set_index("kv_head")
    assert table.loc[0, "nominated"] and table.loc[0, "preferred_phase"] == 2
    assert not table.loc[1, "nominated"]  # a uniform gate (4 effective slots > W/2) nominates nothing


def test_agreement_of_identical_and_different_ablations():
    a, b = _ablation([(0, 1), (1, 2)]), _ablation([(0, 1), (1, 3)])
    table = ablation_agreement({"mean": a, "same": a, "other": b}).set_index(["method_a", "method_b"])
    assert table.loc[("mean", "same"), "correlation_pp"] == pytest.approx(1.0)
    assert table.loc[("mean", "same"), "significance_agreement"] == 1.0 and table.loc[("mean", "same"), "same_specialization"]
    assert table.loc[("mean", "other"), "significance_agreement"] == pytest.approx(10 / 12)
    assert not table.loc[("mean", "other"), "same_specialization"]


@pytest.mark.parametrize("payload", ["per_slot", "shared"])
def test_confirm_runs_end_to_end_and_round_trips(payload, prompts, tmp_path):
    model = make(payload=payload)
    nomination = TASK.generate(2, seed=2, strict=False)
    res = confirm(model, TASK, n_calibration=8, prompts=prompts, nomination_prompts=nomination, progress=False)
    assert isinstance(res, ConfirmResult)
    assert set(res.ablation_tests.method) == {"mean", "resample", "norm_matched"}
    assert len(res.ablation_tests) == 3 * 4 * 4 and len(res.agreement) == 3
    assert res.n_nominated == int(res.nominations.nominated.sum())
    if payload == "per_slot":
        assert len(res.cycling) == 0 and "payload map per slot" in res.cycling_note
    else:
        assert res.cycling["shift"].tolist() == [-1, 1, 2] and "identification_p" in res.cycling
    text = repr(res)
    assert text.startswith("<ConfirmResult") and len(text.splitlines()) <= 18
    assert "nominated_confirmed" in res.to_dict()
    assert len(res.plot().data) >= 3
    back = ConfirmResult.load(res.save(tmp_path / "confirm"))
    assert back == res
    assert isinstance(res.summary(), pd.DataFrame) and list(res.summary().index) == list(res.to_dict())
    assert res != replace(res, n_hits=res.n_hits + 1)
    assert res != replace(res, ablation_tests=res.ablation_tests.iloc[1:])


def test_confirm_checks_every_split_before_a_forward(prompts):
    """Each split's size is checked against the task before any prompt is made or any forward runs."""
    model = make()
    calls = []
    handle = model.blocks[0].register_forward_hook(lambda *_: calls.append(1))
    nomination = TASK.generate(2, seed=2, strict=False)
    try:
        cases = [
            (dict(n_calibration=4), "n_calibration=4 is out of range (valid: 8..500000)"),
            (dict(n_calibration=8, nominate_per_residue=3, nomination_prompts=nomination),
             "nominate_per_residue=3 does not apply here: nomination_prompts= gives the nomination prompts"),
            (dict(n_calibration=8, nominate_per_residue=10**6), "nominate_per_residue=1000000"),
            (dict(n_calibration=8, alpha=0.0), "alpha=0.0 must be a number in (0, 1)"),
            (dict(n_calibration=8, max_concentration=float("inf")), "max_concentration=inf must be a finite number"),
        ]
        for options, match in cases:
            with pytest.raises(UserInputError) as info:
                confirm(model, TASK, prompts=prompts, progress=False, **options)
            assert match in str(info.value), str(info.value)
        with pytest.raises(UserInputError, match=r"n_calibration=4 is out of range \(valid: 8\.\.500000\)"):
            replacement_ablation(model, TASK, n_calibration=4, prompts=prompts)
    finally:
        handle.remove()
    assert not calls


def test_confirm_refuses_bad_requests(prompts):
    model = make()
    with pytest.raises(ValueError, match="must differ"):
        confirm(model, TASK, seed=3, nomination_seed=3, prompts=prompts)
    with pytest.raises(ValueError, match="correction='fdr'"):
        confirm(model, TASK, correction="fdr", prompts=prompts)
    with pytest.raises(ValueError, match="must include 'mean'"):
        confirm(model, TASK, methods=("resample",), prompts=prompts)
    with pytest.raises(ValueError, match="overlap"):
        confirm(model, TASK, n_calibration=8, prompts=prompts, nomination_prompts=prompts, progress=False)
    with pytest.raises(ValueError, match="no gates"):
        confirm(make(compression=None), TASK, prompts=prompts)
