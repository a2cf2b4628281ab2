"""Science claims on the shipped checkpoints (evaluation only): issue 4's acceptance criteria.

Every figure comes from `phase_profile` with 250 prompts per residue (R = 24). Claims are
about phases (residues folded mod S) and significance; see benchmarks/RESULTS.md.
"""

from __future__ import annotations

import numpy as np
import pytest

import phaseinterp as pi

N_PER_RESIDUE = 250
COMPRESSED_CORE = ["w4s4", "w8s8-4kv", "w8s4-deepseek"]  # stride 4, a second stride (8), the DeepSeek kernel
VARIANTS = ["w6s6", "w6s6-4kv", "w4s4-1kv-shared"]


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


def test_at_least_two_strides_ship():
    strides = {pi.zoo.load(n).cfg.stride for n in pi.zoo.available() if pi.zoo.load(n).cfg.is_compressed}
    assert len(strides) >= 2, strides


@pytest.mark.parametrize("name", VARIANTS)
def test_shipped_variants_learned_the_task(name):
    if name not in pi.zoo.available():
        pytest.skip(f"{name} not built")
    p = profile(name)
    assert p.mean >= 0.50, f"{name}: mean {p.mean:.3f}"


@_available("w4s4")
def test_w4s4_heads_specialize_on_single_phases():
    """Issue 5: at least one KV head whose knockout (<= -50%) concentrates on <= 3 adjacent phases."""
    model = pi.zoo.load("w4s4")
    result = pi.ablate(model, n_per_residue=72, n_calibration=128, progress=False)
    spec = result.specialization(threshold=-50)
    strong = spec[(spec.n_phases >= 1) & (spec.n_phases <= 3) & spec.contiguous]
    assert len(strong) >= 1, spec
    assert (strong.worst_change <= -90).any()


@_available("w4s4-1kv-shared")
def test_gate_cycling_moves_the_weak_spots():
    """Issue 5: R^2 (boundary excluded) >= 0.8 for shifts +-1 on a W = S model whose non-boundary
    phases differ by >= 10 pp; the boundary phase stays among the two weakest under every shift."""
    model = pi.zoo.load("w4s4-1kv-shared")
    p = profile("w4s4-1kv-shared")
    interior = p.phase_accuracy[:-1]
    assert interior.max() - interior.min() >= 0.10
    result = pi.gate_cycling(model, shifts=(-1, 1), n_per_residue=N_PER_RESIDUE, progress=False, n_boot=50)
    per_shift = result.scores["per_shift"].set_index("shift")
    assert per_shift.loc[1, "r2"] >= 0.8 and per_shift.loc[-1, "r2"] >= 0.8, per_shift
    assert per_shift.loc[1, "displacement"] == 1 and per_shift.loc[-1, "displacement"] == -1
    assert (per_shift.boundary_rank <= 1).all()


@_available("w4s4")
def test_one_line_calls_run_with_defaults():
    """`phaseinterp.ablate(model, layer=...)` and friends run exactly as written on a zoo model."""
    model = pi.zoo.load("w4s4")
    result = pi.ablate(model, layer=1, progress=False)
    assert result.relative_change.shape == (2, 4)
    cycling = pi.gate_cycling(model, shifts=(1,), progress=False, n_boot=10)
    assert cycling.correct.shape[0] == 2
    assert len(pi.gate_profile(model).heads) == 2 * 2 * 2
