"""Science claims on the shipped checkpoints (evaluation only): issue 4's acceptance criteria.

Every figure comes from `phase_profile` with 250 prompts per residue (R = 24). Claims are
about phases (residues folded mod S) and significance; see benchmarks/RESULTS.md.
"""

from __future__ import annotations

import numpy as np
import pytest

import phaseinterp as pi

N_PER_RESIDUE = 250
COMPRESSED_CORE = ["w4s4", "w8s8", "w8s4-deepseek"]


def _available(name):
    return pytest.mark.skipif(name not in pi.zoo.available(), reason=f"{name} not built")


_cache: dict = {}


def profile(name):
    if name not in _cache:
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        _cache[name] = pi.phase_profile(model, task, N_PER_RESIDUE, seed=0, label=name, progress=False)
    return _cache[name]


def test_zoo_lists_and_loads():
    assert {"w4s4", "full"} <= set(pi.zoo.available())
    model = pi.zoo.load("w4s4")
    assert not model.training and model.metadata["zoo_name"] == "w4s4"
    assert model.metadata["command"] == "phaseinterp zoo build w4s4"
    with pytest.raises(ValueError, match="unknown zoo model"):
        pi.zoo.load("w5s5")


def test_every_zoo_model_uses_one_recipe():
    recipes = {name: pi.zoo.load(name).metadata["train_config"] for name in pi.zoo.available()}
    first = next(iter(recipes.values()))
    for name, recipe in recipes.items():
        assert recipe == first, f"{name} was trained with a different recipe"


@pytest.mark.parametrize("name", COMPRESSED_CORE)
def test_compressed_core_models_show_phase_sensitivity(name):
    if name not in pi.zoo.available():
        pytest.skip(f"{name} not built")
    p = profile(name)
    S = p.stride
    assert p.mean >= 0.60, f"{name} did not learn the task: mean {p.mean:.3f}"
    assert p.period == S and p.period_p_value < 0.05, (p.period, p.period_p_value)
    worst = int(np.nanargmin(p.phase_accuracy))
    best = int(np.nanargmax(p.phase_accuracy))
    assert p.phase_gap >= 0.05
    assert p.phase_upper[worst] < p.phase_lower[best], "best and worst phase intervals overlap"
    model = pi.zoo.load(name)
    if model.cfg.window == model.cfg.stride:
        two_worst = set(np.argsort(p.phase_accuracy)[:2].tolist())
        assert S - 1 in two_worst, f"boundary phase {S - 1} not among the worst phases {two_worst}"


@_available("full")
def test_full_attention_twin_is_phase_flat():
    p = profile("full")
    assert p.mean >= 0.60, f"full-attention twin did not learn the task: mean {p.mean:.3f}"
    assert p.period is None, f"full attention shows a significant period {p.period} (p={p.period_p_value})"
    assert p.homogeneity_p_value > 0.05
    assert p.phase_gap <= 0.03
    if "w4s4" in pi.zoo.available():
        assert abs(p.mean - profile("w4s4").mean) <= 0.10
