"""`ablate`'s knockouts: the calibration mean of ``hook_z``, the mean-replacement hook, and the two
ways to run every unit's replacement at the answer position.

Cached path (`_cached_knockouts`): a prefill of the prompts' prefix, one step of the answer position on
a fork of the cache, then per layer its V units as V variants of that step from the layer on
(``model(resid, cache=cache.fork(V), start_at_layer=L)``); user hooks fire on the positions each call
computes (docs/hooks.md). Naive path (`_naive_knockouts`): a hooked full forward per unit; both equal to
1e-5. `shifted_knockouts` runs the layers below a unit once for several gate shifts of its layer."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from phaseinterp.errors import UserInputError
from phaseinterp.interventions._common import model_device
from phaseinterp.models.paths import hook_context
from phaseinterp.models.protocol import phase_model


class KnockoutOutputs(NamedTuple):
    """Per prompt, clean and with each unit mean-replaced: correctness (top-1 == answer), the
    answer's logit and its log-probability (log-softmax over the full vocabulary).
    Clean fields are ``[prompt]``, knockout fields ``[prompt, unit]``."""

    clean_correct: torch.Tensor
    knockout_correct: torch.Tensor
    clean_logit: torch.Tensor
    knockout_logit: torch.Tensor
    clean_logprob: torch.Tensor
    knockout_logprob: torch.Tensor


def knockout_measures(model, tokens, answer_pos: int, answer, units, mean_z, batch_size: int = 64,
                      method: str = "fast", bar=None) -> KnockoutOutputs:
    """Every unit's mean replacement at ``answer_pos`` (``units``: rows with ``layer`` and ``heads``;
    ``mean_z`` ``[layer, head, d_head]``). ``method="fast"``: the cached forward where the family has it
    (`PhaseModel.has_fast_ablation`), else the hooked full forward per unit, which ``"naive"`` always takes."""
    run = _cached_knockouts if method == "fast" and phase_model(model).has_fast_ablation else _naive_knockouts
    return run(model, tokens, answer_pos, torch.as_tensor(answer), units, mean_z, batch_size, bar)


def _answer_stats(logits: torch.Tensor, ans: torch.Tensor):
    """(correct, answer logit, answer log-prob) of ``logits`` ``[..., vocab]`` for answers broadcast to ``[...]``."""
    index = ans.reshape(ans.shape + (1,) * (logits.ndim - 1 - ans.ndim)).expand(logits.shape[:-1]).unsqueeze(-1)
    logit = logits.gather(-1, index)[..., 0]
    logprob = logit - logits.float().logsumexp(-1)
    return (logits.argmax(-1) == index[..., 0]).cpu(), logit.float().cpu(), logprob.float().cpu()


@torch.inference_mode()
def calibration_mean_z(model, tokens: torch.Tensor, answer_pos: int, batch_size: int = 64) -> torch.Tensor:
    """Mean ``hook_z`` at ``answer_pos`` over calibration prompts: ``[layer, head, d_head]``. Per prompt
    batch the cached forward, as the sweep runs it: a prefill of the prefix (``return_type="cache"``),
    then the answer position's step on a fork, where ``hook_z`` is read."""
    family = phase_model(model)
    names = [family.knockout_point(layer, 0).hook for layer in range(family.n_layers)]
    total, got = None, {}
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(model_device(model))
        cache = model.init_cache()
        if answer_pos > 0:
            model(chunk[:, :answer_pos], cache=cache, return_type="cache")
        with model.hooks(fwd_hooks=[(n, lambda z, hook: got.__setitem__(hook.name, z[:, -1])) for n in names]):
            model(chunk[:, answer_pos:], cache=cache.fork(), return_type=None)
        z = torch.stack([got[n] for n in names], 0).sum(1)  # [layer, head, d_head]
        total = z if total is None else total + z
    return total / tokens.shape[0]


def _layer_variants(model, clean_logits, ans, by_layer, units, mean_z, answer_pos: int, bar, variants):
    """The clean answer (``clean_logits`` ``[n, vocab]``) and each unit of ``by_layer`` mean-replaced
    (`mean_replacement_hook`), a layer's V units as V variants of each prompt: ``variants(layer, V,
    hook)`` gives their logits ``[n, V, vocab]``. Returns (clean ok, logit, log-prob; knocked ok,
    logit, log-prob ``[n, unit]``)."""
    clean = _answer_stats(clean_logits, ans)
    n = ans.shape[0]
    out_ok = torch.zeros(n, len(units), dtype=torch.bool)
    out_logit = torch.zeros(n, len(units))
    out_lp = torch.zeros(n, len(units))
    for layer, unit_idx in by_layer.items():
        hook = mean_replacement_hook(model, layer, [units.heads.iloc[u] for u in unit_idx], mean_z, answer_pos)
        ok, logit, lp = _answer_stats(variants(layer, len(unit_idx), hook), ans)
        out_ok[:, unit_idx], out_logit[:, unit_idx], out_lp[:, unit_idx] = ok, logit, lp
        if bar is not None:
            bar.update(n * len(unit_idx))
    return clean, (out_ok, out_logit, out_lp)


def _per_batch(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar, start):
    """`KnockoutOutputs` of every unit, per prompt batch: ``start(chunk, layers)`` gives the batch's
    clean logits and its ``variants`` function (`_layer_variants`)."""
    device = model_device(model)
    by_layer = {layer: [int(i) for i in grp.index] for layer, grp in units.groupby("layer")}
    parts = []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(device)
        clean, variants = start(chunk, list(by_layer))
        parts.append(_layer_variants(model, clean, answer[i : i + batch_size].to(device), by_layer, units, mean_z,
                                     answer_pos, bar, variants))
    return _collect(parts)


def _collect(parts) -> KnockoutOutputs:
    """`KnockoutOutputs` from per-batch ``(clean, knocked)`` triples."""
    clean = [torch.cat(x) for x in zip(*[c for c, _ in parts])]
    knocked = [torch.cat(x) for x in zip(*[k for _, k in parts])]
    return KnockoutOutputs(clean[0], knocked[0], clean[1], knocked[1], clean[2], knocked[2])


def shares_lower_layers(model) -> bool:
    """Whether `shifted_knockouts` runs the layers below the edited one once for every variant
    (the cached forward, both families); elsewhere it reruns every layer per variant."""
    return phase_model(model).has_fast_ablation


class _Step(NamedTuple):
    """A prompt batch's prefill (``cache``, positions ``0 .. p - 1``) and the answer position's
    residual entering each layer (``resid_pre[layer]`` ``[n, 1, ...]``), with the clean logits and
    the keywords a step from a layer takes besides the residual (`PhaseModel.layer_inputs`)."""

    cache: object
    resid_pre: dict
    clean: torch.Tensor
    inputs: dict


def _prefill_and_step(model, chunk: torch.Tensor, layers, cache=None, start_at_layer: int = 0, resid=None,
                      resid_p=None) -> _Step:
    """`_Step` of ``chunk`` ``[n, p + 1]``: the prefix into ``cache`` (a new one by default; from
    ``start_at_layer`` on with the prefix's residual ``resid`` entering it), then the answer position
    on a fork (from ``start_at_layer`` with ``resid_p``), keeping the residual entering ``layers``."""
    p = chunk.shape[1] - 1
    cache = model.init_cache() if cache is None else cache
    if p > 0:
        if start_at_layer:
            model(resid, cache=cache, start_at_layer=start_at_layer, return_type="cache",
                  **phase_model(model).layer_inputs(chunk[:, :p]))
        else:
            model(chunk[:, :p], cache=cache, return_type="cache")
    cache.freeze()  # internal, never edited in place: the variant steps share one gather of the prefix
    kept: dict = {}
    family = phase_model(model)
    names = {layer: family.resid_pre_hook(layer) for layer in layers}
    with model.hooks():
        # the residual as it enters each layer, before a user's hooks on that point (prepended, and a copy
        # an in-place hook cannot reach): the variant steps restart there and run those hooks themselves
        for name in names.values():
            model.hook_dict[name].add_hook(lambda t, hook: kept.__setitem__(hook.name, t.clone()),
                                           level=model.context_level, prepend=True)
        if start_at_layer:
            logits = model(resid_p, cache=cache.fork(), start_at_layer=start_at_layer,
                           **family.layer_inputs(chunk[:, p:]))
        else:
            logits = model(chunk[:, p:], cache=cache.fork())
    resid_pre = {layer: kept[name] for layer, name in names.items()}
    return _Step(cache, resid_pre, logits[:, -1], family.layer_inputs(chunk[:, p:]))


def _step_variants(model, step: _Step):
    """``variants(layer, V, hook)`` of `_layer_variants` over ``step``: the answer position's step
    from ``layer`` on, V variants of each prompt over a fork of the prefill, ``hook`` attached."""

    def variants(layer: int, V: int, hook) -> torch.Tensor:
        inputs = {k: v.repeat_interleave(V, 0) for k, v in step.inputs.items()}
        # rows are prompt-major, V per prompt: a per-prompt hook finds its prompt as row // V
        with model.hooks(fwd_hooks=[hook]), hook_context(model.hook_dict.values(), "variants", V):
            logits = model(step.resid_pre[layer].repeat_interleave(V, 0), cache=step.cache.fork(V),
                           start_at_layer=layer, **inputs)
        return logits[:, -1].reshape(-1, V, logits.shape[-1])

    return variants


@torch.inference_mode()
def _cached_knockouts(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar):
    """Every unit's knockout through the cached forward, per prompt batch (module docstring)."""

    def start(chunk, layers):
        step = _prefill_and_step(model, chunk, layers)
        return step.clean, _step_variants(model, step)

    return _per_batch(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar, start)


@torch.inference_mode()
def shifted_knockouts(model, tokens, answer_pos: int, answer, units, variants, calib_tokens, batch_size: int = 64,
                      bar=None):
    """`calibration_mean_z` and `knockout_measures` for the units of ONE layer ``L`` under several
    ``variants`` (zero-argument context-manager factories changing only layer ``L``, the mean taken under
    the same variant). Returns one `KnockoutOutputs` per variant.

    On the own family (`shares_lower_layers`) layers ``0 .. L-1`` run once per batch (``stop_at_layer=L``)
    and each variant reruns ``L ..`` on a copy of that cache, bit-identical to the per-variant loop used
    elsewhere. ``bar`` (optional) advances by one per prompt and variant."""
    layers = sorted({int(layer) for layer in units.layer})
    if len(layers) != 1:
        raise UserInputError(f"shifted_knockouts takes the units of one layer, got layers {layers}")
    L = layers[0]
    if not shares_lower_layers(model):
        out = []
        for variant in variants:
            with variant():
                mean_z = calibration_mean_z(model, calib_tokens, answer_pos, batch_size)
                out.append(knockout_measures(model, tokens, answer_pos, answer, units, mean_z, batch_size))
            if bar is not None:
                bar.update(tokens.shape[0])
        return out
    device = model_device(model)
    mean_zs = _shifted_mean_z(model, calib_tokens, answer_pos, L, variants, batch_size)
    answer = torch.as_tensor(answer)
    by_layer = {L: [int(i) for i in units.index]}
    parts: list[list] = [[] for _ in variants]
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(device)
        ans = answer[i : i + batch_size].to(device)
        p = chunk.shape[1] - 1
        lower = model.init_cache()
        resid = resid_p = None
        if L > 0:  # layers 0 .. L-1 once: the prefix, then the answer position on a fork
            resid = model(chunk[:, :p], cache=lower, stop_at_layer=L) if p > 0 else None
            resid_p = model(chunk[:, p:], cache=lower.fork(), stop_at_layer=L)
        for k, variant in enumerate(variants):
            with variant():
                step = _prefill_and_step(model, chunk, [L], cache=lower.copy(), start_at_layer=L, resid=resid,
                                         resid_p=resid_p)
                parts[k].append(_layer_variants(model, step.clean, ans, by_layer, units, mean_zs[k], answer_pos, None,
                                                _step_variants(model, step)))
            if bar is not None:
                bar.update(chunk.shape[0])
    return [_collect(p) for p in parts]


def _shifted_mean_z(model, tokens, answer_pos: int, layer: int, variants, batch_size: int) -> list[torch.Tensor]:
    """`calibration_mean_z` under each variant, layer ``layer`` only (the other layers are NaN): the
    same prefill and answer step, the layers below ``layer`` run once per batch."""
    family = phase_model(model)
    name = family.knockout_point(layer, 0).hook
    device = model_device(model)
    totals: list = [None] * len(variants)
    got: list[torch.Tensor] = []
    p = answer_pos
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : p + 1].to(device).long()
        lower = model.init_cache()
        if layer > 0:  # layers 0 .. layer-1 once: the prefix, then the answer position on a fork
            prefix = model(chunk[:, :p], cache=lower, stop_at_layer=layer) if p > 0 else None
            step = model(chunk[:, p:], cache=lower.fork(), stop_at_layer=layer)
            at_layer = dict(start_at_layer=layer, stop_at_layer=layer + 1)
            prefix_inputs, step_inputs = family.layer_inputs(chunk[:, :p]), family.layer_inputs(chunk[:, p:])
        else:
            prefix, step, at_layer, prefix_inputs, step_inputs = chunk[:, :p], chunk[:, p:], dict(stop_at_layer=1), {}, {}
        for k, variant in enumerate(variants):
            with variant():
                cache = lower.copy()
                if p > 0:
                    model(prefix, cache=cache, **at_layer, **prefix_inputs)
                with model.hooks(fwd_hooks=[(name, lambda z, hook: got.append(z[:, -1]))]):
                    model(step, cache=cache.fork(), **at_layer, **step_inputs)
            z = torch.stack([got.pop()], 0).sum(1)[0]  # [head, d_head], summed as calibration_mean_z sums
            totals[k] = z if totals[k] is None else totals[k] + z
    out = []
    for total in totals:
        mean = torch.full((model.cfg.n_layers,) + tuple(total.shape), float("nan"), device=total.device,
                          dtype=total.dtype)
        mean[layer] = total / tokens.shape[0]
        out.append(mean)
    return out


def mean_replacement_hook(model, layer: int, heads, mean_z, answer_pos: int) -> tuple:
    """``(hook name, hook function)`` replacing ``hook_z`` of the query ``heads`` of ``layer`` at
    ``answer_pos`` by ``mean_z[layer, heads]`` (``mean_z`` ``[layer, head, d_head]``), for
    ``run_with_hooks(..., fwd_hooks=[...])`` or ``model.hooks(...)``.

    It finds ``answer_pos`` through ``hook.ctx["query_range"] == (a, b)`` and leaves ``z`` alone when the
    position is not among them. ``heads``: one unit's query-head ids, or one list per variant (row ``r``
    of ``z`` is prompt ``r // V``, variant ``r % V``)."""
    groups = [list(g) for g in heads] if heads and not isinstance(heads[0], (int, np.integer)) else [list(heads)]
    mask = torch.zeros(len(groups), model.cfg.n_heads, dtype=torch.bool)
    for v, group in enumerate(groups):
        mask[v, group] = True
    mean = mean_z[layer]  # [head, d_head]

    def replace(z, hook):
        a, b = hook.ctx.get("query_range", (0, z.shape[1]))
        if not a <= answer_pos < b:
            return z
        rows = mask.to(z.device).repeat(z.shape[0] // len(groups), 1)  # [batch, head]
        z = z.clone()
        i = answer_pos - a
        z[:, i] = torch.where(rows[:, :, None], mean.to(z.device, z.dtype), z[:, i])
        return z

    return phase_model(model).knockout_point(int(layer), 0).hook, replace


@torch.inference_mode()
def _naive_knockouts(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar):
    """One hooked full forward per unit (the obviously-correct reference for the fast path)."""
    device = model_device(model)
    clean_ok, ko_ok, clean_logit, ko_logit, clean_lp, ko_lp = [], [], [], [], [], []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(device)
        ans = answer[i : i + batch_size].to(device)
        ok, logit, lp = _answer_stats(model(chunk)[:, answer_pos], ans)
        clean_ok.append(ok)
        clean_logit.append(logit)
        clean_lp.append(lp)
        oks, lgs, lps = [], [], []
        for unit in units.itertuples():
            lg = model.run_with_hooks(chunk, fwd_hooks=[mean_replacement_hook(model, unit.layer, unit.heads, mean_z,
                                                                               answer_pos)])[:, answer_pos]
            ok, logit, lp = _answer_stats(lg, ans)
            oks.append(ok)
            lgs.append(logit)
            lps.append(lp)
            if bar is not None:
                bar.update(chunk.shape[0])
        ko_ok.append(torch.stack(oks, 1))
        ko_logit.append(torch.stack(lgs, 1))
        ko_lp.append(torch.stack(lps, 1))
    return KnockoutOutputs(torch.cat(clean_ok), torch.cat(ko_ok), torch.cat(clean_logit), torch.cat(ko_logit),
                           torch.cat(clean_lp), torch.cat(ko_lp))
