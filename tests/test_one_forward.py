"""One forward per family: with a user's hook attached, every experiment gives the hooked full
forward's numbers (computed here from ``model(tokens)`` under the same hook), or refuses naming the
hook. Hypothesis draws the hook point (any of the model's) and the edit, for both model families."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phaseinterp as pi
from phaseinterp.interventions._common import fixed_answer_position
from phaseinterp.interventions.confirm import confirm
from phaseinterp.models.protocol import phase_model

FAMILIES = [pytest.param("w4s4", marks=pytest.mark.zoo("w4s4")),
            pytest.param("dsv4-tiny", marks=pytest.mark.zoo("dsv4-tiny"))]
PROPERTY = settings(max_examples=10, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def edit(kind: str, factor: float):
    """A shape-keeping edit of whatever the hook point carries, written to the hook rule
    (docs/hooks.md): scale it all, or only index 1 of its second axis (a position, an entry or a
    window on the point's own layout), found through ``hook.ctx`` (``entry_range`` for the
    compressor's points, ``query_range`` for the others) wherever a call starts."""

    def scale(x, hook):
        if not x.is_floating_point():  # indices (the indexer's selection): nothing to scale
            return x
        if kind == "all" or x.ndim < 2:
            return x * factor
        a, b = hook.ctx.get("entry_range") or hook.ctx.get("query_range") or (0, x.shape[1])
        if x.shape[1] != b - a:  # an axis that is not this call's positions or entries (heads): index 1
            a, b = 0, x.shape[1]
        if not a <= 1 < b:
            return x
        x = x.clone()
        x[:, 1 - a] = x[:, 1 - a] * factor
        return x

    return scale


def hooked_answers(model, tokens, answer_pos: int, answer, hooks) -> np.ndarray:
    """Top-1 == answer at ``answer_pos`` from the hooked full forward, one prompt at a time."""
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(tokens[:, : answer_pos + 1])[:, answer_pos]
    return (logits.argmax(-1).cpu() == torch.as_tensor(answer)).numpy()


def replace_z(layer: int, heads, mean_z, answer_pos: int):
    """The mean replacement written from its definition: ``hook_z`` of ``heads`` at the answer position."""

    def fn(z, hook):
        z = z.clone()
        z[:, answer_pos, heads] = mean_z[layer, heads].to(z.dtype)
        return z

    return f"blocks.{layer}.attn.hook_z", fn


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_every_experiment_gives_the_hooked_full_forward_s_numbers(zoo_model, name):
    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    prompts = task.generate(1, seed=0, strict=False)
    p = fixed_answer_position(prompts)
    tokens, answer = prompts.tokens, prompts.answer
    calib = task.calibration(24, seed=1)
    layer = model.cfg.n_layers - 1
    names = sorted(model.hook_dict)
    family = phase_model(model)

    @PROPERTY
    @given(point=st.sampled_from(names), kind=st.sampled_from(["all", "one"]), factor=st.sampled_from([0.5, 1.7]))
    def check(point, kind, factor):
        hook = (point, edit(kind, factor))
        clean = hooked_answers(model, tokens, p, answer, [hook])
        with model.hooks(fwd_hooks=[hook]):
            # last_logits
            with torch.no_grad():
                torch.testing.assert_close(model.last_logits(tokens[:, : p + 1]), model(tokens[:, : p + 1])[:, -1],
                                           rtol=1e-5, atol=1e-5)
            # phase_profile
            profile = pi.phase_profile(model, prompts, progress=False, n_bootstrap=10, n_permutations=9)
            assert (profile.records.correct.to_numpy() == clean).all(), point
            # ablate, clean and every unit's knockout, on the mean taken under the hook too
            z_name = family.knockout_point(layer, 0).hook
            with torch.no_grad():
                _, cache = model.run_with_cache(calib.tokens[:, : p + 1], names_filter=[z_name],
                                                return_cache_object=False)
            mean_z = torch.zeros((model.cfg.n_layers,) + tuple(cache[z_name].shape[2:]))
            mean_z[layer] = cache[z_name][:, p].mean(0).cpu()
            result = pi.ablate(model, task, layer=layer, prompts=prompts, calibration_mean=mean_z, n_calibration=24,
                               progress=False)
            assert (result.clean_correct == clean).all(), point
        for u, unit in enumerate(result.units.itertuples()):
            knocked = hooked_answers(model, tokens, p, answer, [hook, replace_z(layer, list(unit.heads), mean_z, p)])
            assert (result.knockout_correct[:, u] == knocked).all(), (point, unit)
        if not family.compressed_layers:
            return
        # gate cycling: the unshifted and the shifted model, each under the hook
        with pi.shift_gates(model, 1):
            shifted = hooked_answers(model, tokens, p, answer, [hook])
        with model.hooks(fwd_hooks=[hook]):
            cycling = pi.gate_cycling_profile(model, task, shifts=[1], prompts=prompts, n_calibration=24,
                                              n_boot=10, progress=False)
            unit = pi.gate_cycling_unit(model, task, shifts=[1], layers=family.compressed_layers[-1],
                                        measure="accuracy", prompts=prompts, n_calibration=24, n_boot=10,
                                        progress=False)
        assert (cycling.correct[0] == clean).all() and (cycling.correct[1] == shifted).all(), point
        layer_shift = family.compressed_layers[-1]
        with pi.shift_gates(model, 1, layers=layer_shift):
            shifted_one = hooked_answers(model, tokens, p, answer, [hook])
        assert (unit.correct_shifted[0] == clean).all() and (unit.correct_shifted[1] == shifted_one).all(), point
        # conformance compares implementations of the stored model: it refuses, naming the hook
        with model.hooks(fwd_hooks=[hook]):
            with pytest.raises(ValueError, match=rf"conformance cannot honour the hooks attached at {point}"):
                pi.conformance(model, task, n_per_residue=1, progress=False)

    check()
    assert not any(point.has_hooks() for point in model.hook_dict.values())


@pytest.mark.slow
@pytest.mark.zoo("w4s4")
def test_confirm_under_a_hook_reads_the_hooked_model(zoo_model):
    """`confirm`'s clean accuracy by phase is the hooked full forward's (a hook halving the first
    block's output, the case a review found `ablate` ignoring)."""
    model = zoo_model("w4s4")
    task = pi.zoo.task_for(model)
    prompts = task.generate(2, seed=0, strict=False)
    nominate = task.generate(1, seed=2, strict=False)
    p = fixed_answer_position(prompts)
    hook = ("blocks.0.hook_resid_post", lambda x, hook: 0.5 * x)
    clean = hooked_answers(model, prompts.tokens, p, prompts.answer, [hook])
    phase = prompts.meta.target_pos.to_numpy() % model.cfg.stride
    expected = [clean[phase == f].mean() for f in range(model.cfg.stride)]
    unhooked = hooked_answers(model, prompts.tokens, p, prompts.answer, [])
    assert clean.mean() != unhooked.mean()  # the hook changes the answers
    with model.hooks(fwd_hooks=[hook]):
        result = confirm(model, task, prompts=prompts, nomination_prompts=nominate, n_calibration=24,
                         methods=("mean",), cycling=False, progress=False)
    np.testing.assert_allclose(np.asarray(result.phase_accuracy, dtype=float), expected)


@pytest.mark.zoo("w4s4")
def test_ablate_honours_a_user_s_hook_the_review_s_case(zoo_model):
    """A hook halving ``blocks.0.hook_resid_post``: `ablate`'s clean accuracy is `phase_profile`'s
    under the same hook (both run the cached forward, the hook firing on every call)."""
    model = zoo_model("w4s4")
    task = pi.zoo.task_for(model)
    prompts = task.generate(2, seed=0, strict=False)
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: 0.5 * x)]):
        profile = pi.phase_profile(model, prompts, progress=False, n_bootstrap=10, n_permutations=9)
        result = pi.ablate(model, task, layer=1, prompts=prompts, n_calibration=24, progress=False)
    unhooked = pi.phase_profile(model, prompts, progress=False, n_bootstrap=10, n_permutations=9)
    assert result.clean_correct.mean() == pytest.approx(profile.records.correct.mean())
    assert profile.records.correct.mean() != unhooked.records.correct.mean()


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("in_place", [False, True], ids=["returns", "in-place"])
def test_a_hook_on_the_knocked_layer_s_input_fires_once_in_the_fast_sweep(zoo_model, name, in_place):
    """The sweep restarts each variant at the knocked layer with the residual entering it: that residual
    is taken before a user's hook on ``hook_resid_pre`` of that layer (the restart runs the hook), so the
    fast sweep's knockout logits are the naive one's (a hooked full forward per unit). A review found the
    hook applied twice: knockout logits off by 3.2 (w4s4) and 2.2 (dsv4-tiny)."""
    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    prompts = task.generate(1, seed=0, strict=False)
    layer = model.cfg.n_layers - 1

    def halve(x, hook):
        if in_place:
            x.mul_(0.5)
            return None
        return 0.5 * x

    with model.hooks(fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", halve)]):
        fast, naive = (pi.ablate(model, task, layer=layer, prompts=prompts, n_calibration=24, method=m, progress=False)
                       for m in ("fast", "naive"))
    unhooked = pi.ablate(model, task, layer=layer, prompts=prompts, n_calibration=24, method="naive", progress=False)
    scale = float(np.abs(naive.knockout_logit_answer).max())
    assert float(np.abs(fast.knockout_logit_answer - naive.knockout_logit_answer).max()) <= 1e-4 * scale
    assert float(np.abs(unhooked.knockout_logit_answer - naive.knockout_logit_answer).max()) > 1e-2 * scale
    assert (fast.clean_correct == naive.clean_correct).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_a_per_prompt_hook_finds_its_prompt_in_the_variant_steps(zoo_model, name):
    """The sweep's variant steps hold each prompt V times (prompt-major) and say so in
    ``hook.ctx["variants"]``: a hook editing prompt 0 only, written with it, gives the naive sweep's
    knockout logits, and leaves the other prompts' alone."""
    model = zoo_model(name)
    task = pi.zoo.task_for(model)
    prompts = task.generate(1, seed=0, strict=False)
    last = model.cfg.n_layers - 1
    seen = set()

    def zero_prompt_0(x, hook):
        V = hook.ctx.get("variants", 1)
        seen.add(V)
        x = x.clone()
        x[:V, -1] = 0.0
        return x

    layer = 0
    with model.hooks(fwd_hooks=[(f"blocks.{last}.hook_resid_post", zero_prompt_0)]):
        fast, naive = (pi.ablate(model, task, layer=layer, prompts=prompts, n_calibration=24, method=m, progress=False)
                       for m in ("fast", "naive"))
    V = model.cfg.n_key_value_heads if name == "w4s4" else 1  # the units of one layer (DeepSeek-V4: one KV head)
    assert fast.knockout_logit_answer.shape[1] == V and V in seen and (V > 1 or name != "w4s4")
    unhooked = pi.ablate(model, task, layer=layer, prompts=prompts, n_calibration=24, method="naive", progress=False)
    scale = float(np.abs(naive.knockout_logit_answer).max())
    np.testing.assert_allclose(fast.knockout_logit_answer, naive.knockout_logit_answer, atol=1e-4 * scale, rtol=0)
    moved = np.abs(unhooked.knockout_logit_answer - naive.knockout_logit_answer).max(axis=1) > 1e-3 * scale
    assert moved[0] and not moved[1:].any()


@pytest.mark.parametrize("name", FAMILIES)
def test_an_in_process_engine_runs_the_hooks_or_refuses_them(zoo_model, name):
    """`engine_for(model)` under a hook: the own family's reference engine is the hooked forward;
    a cached schedule, and DeepSeek-V4's engine (transformers' own forward, which the wrapper's hooks
    never reach), refuse naming the hook instead of answering as if it were not there."""
    from phaseinterp.engines.adapters import decode_pieces, engine_for

    model = zoo_model(name)
    tokens = pi.zoo.task_for(model).generate(1, seed=0, strict=False).tokens[:2]
    hook = ("blocks.0.hook_resid_post", lambda x, hook: 0.5 * x)
    with model.hooks(fwd_hooks=[hook]):
        hooked = torch.log_softmax(model(tokens)[:, -1].float(), -1)
        engines = [engine_for(model), engine_for(model, decode_pieces)]
        for engine in engines[name == "w4s4":]:
            with pytest.raises(ValueError, match="cannot honour the hooks attached at blocks.0.hook_resid_post"):
                engine(tokens)
        if name == "w4s4":
            torch.testing.assert_close(engines[0](tokens), hooked)
    assert (engines[0](tokens) - hooked).abs().max() > 1e-2  # the hook moved the answer


@pytest.mark.parametrize("name", FAMILIES)
def test_a_call_that_raises_leaves_the_cache_as_it_was(zoo_model, name):
    """A step interrupted by a hook (inside the layers, or at the final norm after every layer extended the
    cache) puts the cache back: the retry feeds the tokens once and equals the full forward. At the final
    norm the retry used to feed them twice (0.79 and 1.74 away from the full forward)."""
    model = zoo_model(name)
    x = torch.randint(0, model.cfg.d_vocab, (1, 41), generator=torch.Generator().manual_seed(0))

    def interrupt(t, hook):
        raise KeyboardInterrupt

    with torch.no_grad():
        full = model(x)[:, -1]
        for point in ("blocks.1.attn.hook_z", "ln_final.hook_normalized"):
            cache = model.init_cache()
            model(x[:, :40], cache=cache)
            with pytest.raises(KeyboardInterrupt), model.hooks(fwd_hooks=[(point, interrupt)]):
                model(x[:, 40:], cache=cache)
            assert cache.length == 40 and {lc.n_tokens for lc in cache.layers} == {40}
            torch.testing.assert_close(model(x[:, 40:], cache=cache)[:, -1], full, atol=1e-4, rtol=1e-4)
            fork = cache.fork()
            with pytest.raises(KeyboardInterrupt), model.hooks(fwd_hooks=[(point, interrupt)]):
                model(x[:, 40:], cache=fork)
            assert not fork.spent  # a fork whose call raised can take its call again
