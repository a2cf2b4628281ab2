"""Issue 13: the paper-depth zoo recipes and the toolkit's calls on a 12-layer, one-KV-head model.

The recipes ``deep12-w8s8-1kv-shared`` (12 layers, one KV head per layer, W = S = 8, scalar
gates, payload shared across slots) and ``deep12-full`` (its full-attention twin). The first
half checks what holds for the architecture at its seeded initialisation (nothing is trained
here): the recipes and their snapshot rules, and that `phaseinterp.ablate(model, layer=9)` and
gate cycling for shifts +-1, +-2, +-3 run on 12 layers. The claims on the shipped checkpoints
are in `test_zoo_deep_claims.py`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

import phaseinterp as pi
from phaseinterp import zoo
from phaseinterp.interventions.cycling_stats import cycling_scores

DEEP = "deep12-w8s8-1kv-shared"
TWIN = "deep12-full"


@functools.cache
def deep_model():
    e = zoo.entry(DEEP)
    task = e.task_object()
    model = pi.CompressedTransformer(e.model_config(task.vocab.size)).eval()
    return model, task, task.generate(2, seed=0, strict=False)  # 48 prompts: the calls' shapes, not accuracy


def test_deep_recipes_are_the_paper_depth_pair():
    e, t = zoo.entry(DEEP), zoo.entry(TWIN)
    cfg, twin = e.model_config(100), t.model_config(100)
    assert cfg.n_layers >= 12 and cfg.n_kv_heads == 1 and cfg.n_heads == 4
    assert cfg.compression == "gated" and cfg.window == cfg.stride == 8 and cfg.payload == "shared"
    assert twin.compression is None and twin.stride == 8
    for field in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "d_mlp", "n_ctx", "local_window",
                  "qk_norm", "positional"):
        assert getattr(twin, field) == getattr(cfg, field), field
    # one recipe for the pair: the zoo recipe with the deep schedule (zoo.DEEP_TRAIN) and nothing else
    assert e.train_config() == t.train_config()
    shared = zoo.ENTRIES["w4s4"].train_config()
    assert dataclasses.replace(e.train_config(), **{k: getattr(shared, k) for k in zoo.DEEP_TRAIN}) == shared
    assert e.train_config().steps == 3000 and e.train_config().stage_at(1799) == shared.stage_at(0)
    assert e.task_object().to_dict() == t.task_object().to_dict()


def test_deep_snapshot_rules():
    """The final-step pair ships both runs' final step; the equal-training pair the step
    `zoo.equal_training_step` computes from the two runs' curves (rules fixed before training)."""
    assert zoo.training_controls(DEEP) == {"equal-step": (f"{DEEP}-equal", f"{TWIN}-equal"),
                                           "final-step": (DEEP, TWIN)}
    steps = zoo.entry(DEEP).train_config().steps
    assert zoo.snapshot_step(DEEP) == zoo.snapshot_step(TWIN) == steps
    assert zoo.entry(f"{DEEP}-equal").run == DEEP and zoo.entry(f"{TWIN}-equal").run == TWIN


def test_ablate_layer_9_returns_the_head_by_phase_map():
    model, task, prompts = deep_model()
    result = pi.ablate(model, task, layer=9, prompts=prompts, n_calibration=24, progress=False)
    assert list(result.units.layer) == [9] and list(result.units.kv_head) == [0]
    assert result.units.heads.iloc[0] == (0, 1, 2, 3)  # one KV head: every query head reads it
    assert result.knockout_correct.shape == (prompts.tokens.shape[0], 1)
    grid = result.absolute_change  # percentage points; relative change is undefined at 0% clean accuracy
    assert grid.shape == (1, 8) and list(grid.columns) == list(range(8))
    assert np.isfinite(grid.to_numpy()).all()


def test_ablation_sweeps_every_layer_of_the_deep_model():
    model, task, prompts = deep_model()
    result = pi.ablate(model, task, prompts=prompts, n_calibration=24, progress=False)
    assert list(result.units.layer) == list(range(12))
    naive = pi.ablate(model, task, layer=9, prompts=prompts, n_calibration=24, method="naive",
                      progress=False)
    fast = result.knockout_logit_answer[:, [9]]
    np.testing.assert_allclose(fast, naive.knockout_logit_answer, atol=1e-4)


def test_gate_cycling_runs_for_shifts_up_to_three():
    model, task, prompts = deep_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = pi.gate_cycling_profile(model, task, shifts=(-3, -2, -1, 1, 2, 3), prompts=prompts, n_boot=10, progress=False)
    acc = result.phase_accuracy()
    assert acc.shape == (7, 8) and list(acc.index) == [0, -3, -2, -1, 1, 2, 3]
    scores = cycling_scores(acc.loc[0].to_numpy(), {d: acc.loc[d].to_numpy() for d in result.scored_shifts})
    assert sorted(scores["per_shift"]["shift"]) == [-3, -2, -1, 1, 2, 3]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "gate cycling must restore the model exactly"
