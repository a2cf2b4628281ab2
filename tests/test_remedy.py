"""Staggered window grids through the interventions, and the remedy experiment's analyses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import make_model, small_task
from phaseinterp.experiments import RemedyResult, compare_remedy, memory_per_token
from phaseinterp.experiments.remedy import twin_run
from phaseinterp.interventions import shift_gates, gate_profile, ablate

TASK = small_task()
BASE = dict(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8,
            d_mlp=64, local_window=6, window=4, stride=4)


@pytest.fixture(scope="module")
def prompts():
    return TASK.generate(3, seed=0, strict=False)


@pytest.mark.parametrize("kw", [dict(window_offsets=(0, 2)), dict(window_offsets=((1, 3), (2, 0))),
                                dict(window_offsets=(1, 2), memory="uncompressed_tail"),
                                dict(window_offsets="staggered", compression="deepseek", gate="vector", window=8)])
def test_fast_ablation_equals_naive_on_staggered_grids(kw, prompts):
    model = make_model({**BASE, **kw})
    fast = ablate(model, TASK, prompts=prompts, n_calibration=16, progress=False)
    naive = ablate(model, TASK, prompts=prompts, n_calibration=16, method="naive", progress=False)
    np.testing.assert_allclose(fast.knockout_logit_answer, naive.knockout_logit_answer, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fast.clean_logit_answer, naive.clean_logit_answer, atol=1e-5, rtol=0)
    assert np.abs(fast.knockout_logit_answer - fast.clean_logit_answer[:, None]).max() > 1e-4


def test_gate_cycling_and_gate_phases_on_staggered_grids(prompts):
    model = make_model({**BASE, "window_offsets": (0, 2)})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = prompts.tokens[:4]
    with torch.no_grad():
        clean = model(tokens)
        with shift_gates(model, 1):
            shifted = model(tokens)
        assert (shifted - clean).abs().max() > 1e-5
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
        torch.testing.assert_close(model(tokens), clean, rtol=0, atol=0)
    slots = gate_profile(model, TASK, n_per_residue=1).slots
    head1 = slots[(slots.layer == 0) & (slots.kv_head == 1) & (slots.branch == "k")]
    assert head1.sort_values("slot").phase.tolist() == [2, 3, 0, 1]  # slot i of head 1 sits at phase (i + 2) mod 4


def test_memory_per_token_is_equal_up_to_the_last_window():
    base = memory_per_token(make_model(BASE))
    stag = memory_per_token(make_model({**BASE, "window_offsets": (0, 2)}))
    assert base["stored_bytes_per_token"] == stag["stored_bytes_per_token"] == 2 * 2 * 16 * 2 * 8 * 4 / 64
    assert base["entries_per_head_max"] == stag["entries_per_head_max"] == 16
    assert stag["entries_per_head_min"] == 15  # windows 2..5, ..., 58..61: 62..65 is not closed at 64


def _synthetic(curves_by_variant: dict, boundaries: dict, final: dict) -> RemedyResult:
    """A result from given per-phase curves (one residue per phase, seeds 0..2 identical)."""
    rows, prof = [], []
    for variant, table in curves_by_variant.items():
        for seed in range(3):
            for step, accs in table.items():
                for phase, acc in enumerate(accs):
                    rows.append(dict(variant=variant, seed=seed, step=step, residue=phase, phase=phase,
                                     accuracy=acc, n=48))
            for phase, acc in enumerate(final[variant]):
                prof.append(dict(variant=variant, seed=seed, phase=phase, accuracy=acc, n=288))
    memory = pd.DataFrame([dict(variant=v, seed=s, stored_bytes_per_token=128.0, closed_bytes_per_token=127.0,
                                entries_per_head_min=31.0, entries_per_head_max=32.0)
                           for v in curves_by_variant for s in range(3)])
    return RemedyResult(curves=pd.DataFrame(rows), profiles=pd.DataFrame(prof), memory=memory,
                        boundaries=boundaries, stride=4, steps=300, eval_every=100)


def test_remedy_analyses_on_known_curves(tmp_path):
    baseline = {100: [0.0, 0.0, 0.0, 0.0], 200: [0.9, 0.2, 0.95, 0.0], 300: [1.0, 0.85, 1.0, 0.02]}
    staggered = {100: [0.1, 0.0, 0.1, 0.0], 200: [0.9, 0.6, 0.9, 0.85], 300: [1.0, 0.95, 1.0, 0.97]}
    result = _synthetic({"baseline": baseline, "staggered": staggered}, {"baseline": [3], "staggered": [1, 3]},
                        {"baseline": [1.0, 0.9, 1.0, 0.0], "staggered": [1.0, 0.95, 1.0, 0.95]})
    learned = result.learned_steps().set_index(["variant", "seed", "phase"]).step
    assert learned[("baseline", 0, 0)] == 200 and learned[("baseline", 0, 1)] == 300
    assert np.isnan(learned[("baseline", 0, 3)])
    assert learned[("staggered", 1, 1)] == 300 and learned[("staggered", 1, 3)] == 200
    c = result.criteria()
    # staggered: boundary phases {1, 3} by 300, interior {0, 2} by 200: one interval later.
    assert c["boundary_minus_interior_learned_step_staggered"] == [100.0] * 3
    assert c["boundary_no_later_than_interior"]
    assert c["baseline_peak_gap_step"] == 300 and c["baseline_gap_at_peak"] == pytest.approx(0.98)
    assert c["staggered_gap_at_peak"] == pytest.approx(0.05) and c["staggered_gap_at_most_half"]
    assert c["mean_accuracy_staggered"] - c["mean_accuracy_baseline"] == pytest.approx(0.25)
    assert c["never_learned"] == [f"baseline seed {s} phase 3" for s in range(3)]
    loaded = RemedyResult.load(result.save(tmp_path / "remedy"))
    assert loaded == result and "baseline_peak_gap_step" in repr(result)
    assert isinstance(result.summary(), pd.DataFrame) and list(result.summary().index) == list(result.to_dict())
    assert result != replace(result, profiles=result.profiles.assign(accuracy=result.profiles.accuracy * 0.5))
    assert result != replace(result, boundaries={**result.boundaries, "staggered": [1]})
    assert len(result.to_frame()) == 24 and len(result.plot().data) == 8


def test_a_never_learned_boundary_fails_the_timing_claim():
    flat = {100: [0.9, 0.9, 0.9, 0.0], 200: [1.0, 1.0, 1.0, 0.0]}
    result = _synthetic({"baseline": flat, "staggered": flat}, {"baseline": [3], "staggered": [3]},
                        {"baseline": [1, 1, 1, 0], "staggered": [1, 1, 1, 0]})
    c = result.criteria()
    assert not c["boundary_no_later_than_interior"] and not c["staggered_gap_at_most_half"]
    assert c["mean_accuracy_within_2pp"]


def test_remedy_bad_requests(tmp_path):
    with pytest.raises(ValueError, match="seeds must be a non-empty list of seeds"):
        compare_remedy(tmp_path, seeds=())
    with pytest.raises(ValueError, match="variant='shifted' is not one of"):
        twin_run("shifted", 0, tmp_path)
    with pytest.raises(ValueError, match=r"stop_at=0 is out of range \(valid: 1..1500\)"):
        twin_run("baseline", 0, tmp_path, stop_at=0)


def test_train_share_checks_the_worker_and_the_command_line(tmp_path):
    from phaseinterp.cli import main
    from phaseinterp.experiments.remedy import train_share

    with pytest.raises(ValueError, match=r"worker=2 is out of range \(valid: 0..1\)"):
        train_share(tmp_path, 10, 2, 2)
    for argv in ([str(tmp_path), "ten", "0/1"], [str(tmp_path)], [str(tmp_path), "10", "2/2"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse: one line, exit 2
            main(["experiments", "remedy", *argv])
        assert exit_info.value.code == 2
    assert not any(tmp_path.iterdir()), "a refused command wrote nothing"


def test_twin_run_with_another_architecture_staggers_layers(tmp_path):
    """One-KV-head twins (the per-layer variant): both twins get the architecture; only the
    staggered one gets the offsets (layer l at l*S // n_layers)."""
    arch = {"n_kv_heads": 1, "payload": "shared"}
    runs = {v: twin_run(v, 0, tmp_path, offsets="staggered_layers", architecture=arch, stop_at=2)
            for v in ("baseline", "staggered")}
    for run in runs.values():
        assert run.model.cfg.n_kv_heads == 1 and run.model.cfg.payload == "shared"
    stag, base = runs["staggered"].model, runs["baseline"].model
    assert [stag.boundary_phases(layer) for layer in range(2)] == [(3,), (1,)]
    assert [base.boundary_phases(layer) for layer in range(2)] == [(3,), (3,)]
    with pytest.raises(ValueError, match="architecture key 'n_kv_head' is not"):  # a typo, refused before training
        twin_run("baseline", 1, tmp_path, architecture={"n_kv_head": 1}, stop_at=2)
    assert not (tmp_path / "baseline_seed1").exists()
    with pytest.raises(ValueError, match="n_kv_heads"):  # resuming a run with another architecture is refused
        twin_run("baseline", 0, tmp_path, architecture={"n_kv_heads": 2}, stop_at=3)
