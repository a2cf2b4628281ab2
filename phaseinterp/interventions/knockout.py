"""The knockout engines behind `ablate`: the calibration mean of ``hook_z`` and two ways to run
every unit's mean replacement at the answer position.

Fast path: a knockout at the final position changes nothing at earlier positions, so the clean
prefix is run once and only the final position is recomputed, for the layers at and after the
knocked-out one, with every unit of a layer as one batch of variants. `_fast_knockouts` (own
family) keeps a KV cache and calls `CompressedAttention.forward_last`; `_fast_knockouts_deepseek_v4`
keeps one clean full forward's per-layer activations and calls
`phaseinterp.models.hf.last_position.block_forward_last`. Naive path (`_naive_knockouts`): a hooked
full forward per unit, the reference both fast paths equal to 1e-5. Which engine runs is the
model protocol's answer (`PhaseModel.has_fast_ablation`, `family`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from phaseinterp.interventions._common import model_device
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
    ``mean_z`` ``[layer, head, d_head]``). ``method="fast"`` uses the family's cached-prefix path
    where the model protocol has one (`PhaseModel.has_fast_ablation`), else the hooked full forward
    per unit; ``"naive"`` always takes the hooked path. Both agree to 1e-5 (tests)."""
    family = phase_model(model)
    fast = method == "fast" and family.has_fast_ablation
    run = FAST_ENGINES[family.family] if fast else _naive_knockouts
    return run(model, tokens, answer_pos, torch.as_tensor(answer), units, mean_z, batch_size, bar)


def _answer_stats(logits: torch.Tensor, ans: torch.Tensor):
    """(correct, answer logit, answer log-prob) of ``logits`` ``[..., vocab]`` for answers broadcast to ``[...]``."""
    index = ans.reshape(ans.shape + (1,) * (logits.ndim - 1 - ans.ndim)).expand(logits.shape[:-1]).unsqueeze(-1)
    logit = logits.gather(-1, index)[..., 0]
    logprob = logit - logits.float().logsumexp(-1)
    return (logits.argmax(-1) == index[..., 0]).cpu(), logit.float().cpu(), logprob.float().cpu()


@torch.inference_mode()
def calibration_mean_z(model, tokens: torch.Tensor, answer_pos: int, batch_size: int = 64) -> torch.Tensor:
    """Mean ``hook_z`` at ``answer_pos`` over calibration prompts: ``[layer, head, d_head]``."""
    family = phase_model(model)
    names = [family.knockout_point(l, 0).hook for l in range(family.n_layers)]
    total = None
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(model_device(model))
        _, cache = model.run_with_cache(chunk, names_filter=names, return_type=None, return_cache_object=False)
        z = torch.stack([cache[n][:, answer_pos] for n in names], 0).sum(1)  # [layer, head, d_head]
        total = z if total is None else total + z
    return total / tokens.shape[0]


@torch.inference_mode()
def _fast_knockouts(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar):
    """(clean correct [N], knockout correct [N, U], clean answer logit [N], knockout answer logit [N, U])."""
    cfg = model.cfg
    device = model_device(model)
    by_layer = {layer: [int(i) for i in grp.index] for layer, grp in units.groupby("layer")}
    clean_ok, ko_ok, clean_logit, ko_logit, clean_lp, ko_lp = [], [], [], [], [], []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(device)
        ans = answer[i : i + batch_size].to(device)
        n = chunk.shape[0]
        cache = model.init_cache()
        if answer_pos > 0:
            model(chunk[:, :answer_pos], cache=cache, return_type=None)
        else:
            cache.layers = [_empty_layer_cache(model, n, device) for _ in range(cfg.n_layers)]
        resid = model.W_E[chunk[:, answer_pos]][:, None]
        resid_pre = []
        for layer, block in enumerate(model.blocks):
            resid_pre.append(resid)
            resid = block.forward_last(resid, cache.layers[layer])
        ok, logit, lp = _answer_stats(model.unembed(resid)[:, 0], ans)
        clean_ok.append(ok)
        clean_logit.append(logit)
        clean_lp.append(lp)
        out_ok = torch.zeros(n, len(units), dtype=torch.bool)
        out_logit = torch.zeros(n, len(units))
        out_lp = torch.zeros(n, len(units))
        for layer, unit_idx in by_layer.items():
            mask = torch.zeros(len(unit_idx), cfg.n_heads, dtype=torch.bool, device=device)
            for v, u in enumerate(unit_idx):
                mask[v, list(units.heads.iloc[u])] = True
            r = resid_pre[layer].expand(-1, len(unit_idx), -1)
            r = model.blocks[layer].forward_last(r, cache.layers[layer], (mask, mean_z[layer]))
            for later in range(layer + 1, cfg.n_layers):
                r = model.blocks[later].forward_last(r, cache.layers[later])
            ok, logit, lp = _answer_stats(model.unembed(r), ans)  # logits [n, variant, vocab]
            out_ok[:, unit_idx], out_logit[:, unit_idx], out_lp[:, unit_idx] = ok, logit, lp
            if bar is not None:
                bar.update(n * len(unit_idx))
        ko_ok.append(out_ok)
        ko_logit.append(out_logit)
        ko_lp.append(out_lp)
    return KnockoutOutputs(torch.cat(clean_ok), torch.cat(ko_ok), torch.cat(clean_logit), torch.cat(ko_logit),
                           torch.cat(clean_lp), torch.cat(ko_lp))


def _empty_layer_cache(model, n, device):
    from phaseinterp.models.attention import LayerCache

    cfg = model.cfg
    z = lambda *s: torch.zeros(*s, device=device)  # noqa: E731
    return LayerCache(z(n, 0, cfg.d_model), z(n, 0, cfg.n_kv_heads, cfg.d_head), z(n, 0, cfg.n_kv_heads, cfg.d_head),
                      z(n, 0, cfg.n_kv_heads, cfg.d_head), z(n, 0, cfg.n_kv_heads, cfg.d_head),
                      z(n, 0, cfg.n_kv_heads, cfg.d_head))


def mean_replacement_hook(model, layer: int, heads, mean_z, answer_pos: int) -> tuple:
    """``(hook name, hook function)`` that replaces ``hook_z`` of the query ``heads`` of ``layer`` at
    ``answer_pos`` by their calibration mean ``mean_z[layer, heads]`` (the mean-replacement point of
    the model protocol); for ``run_with_hooks(..., fwd_hooks=[...])``."""
    heads = list(heads)

    def replace(z, hook):
        z = z.clone()
        z[:, answer_pos, heads] = mean_z[layer, heads].to(z.dtype)
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


@torch.inference_mode()
def _fast_knockouts_deepseek_v4(model, tokens, answer_pos, answer, units, mean_z, batch_size, bar):
    """The fast path on a wrapped DeepSeek-V4: one clean full forward per prompt batch keeps every
    layer's activations (`clean_states`); each unit then reruns only the answer position through
    its layer and the later ones (`block_forward_last`), a layer's units as one batch of variants."""
    from phaseinterp.models.hf.last_position import _rope, block_forward_last, clean_states, logits_last

    device = model_device(model)
    H = model.cfg.n_heads
    by_layer = {layer: [int(i) for i in grp.index] for layer, grp in units.groupby("layer")}
    clean_ok, ko_ok, clean_logit, ko_logit, clean_lp, ko_lp = [], [], [], [], [], []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(device)
        ans = answer[i : i + batch_size].to(device)
        n = chunk.shape[0]
        logits, states = clean_states(model, chunk)
        ok, logit, lp = _answer_stats(logits[:, answer_pos], ans)
        clean_ok.append(ok)
        clean_logit.append(logit)
        clean_lp.append(lp)
        rope = _rope(model, answer_pos, states[0].attn_in)
        out_ok = torch.zeros(n, len(units), dtype=torch.bool)
        out_logit = torch.zeros(n, len(units))
        out_lp = torch.zeros(n, len(units))
        for layer, unit_idx in by_layer.items():
            V = len(unit_idx)
            mask = torch.zeros(V, H, dtype=torch.bool, device=device)
            for v, u in enumerate(unit_idx):
                mask[v, list(units.heads.iloc[u])] = True
            mask = mask.repeat(n, 1)  # row r: prompt r // V, variant r % V
            token = chunk[:, answer_pos:].repeat_interleave(V, 0)
            streams = states[layer].resid_pre[:, answer_pos:].repeat_interleave(V, 0)
            for later in range(layer, model.cfg.n_layers):
                state = states[later] if V == 1 else states[later].repeat(V)
                streams = block_forward_last(model.blocks[later], state, streams, token, rope,
                                             (mask, mean_z[layer]) if later == layer else None)
            lg = logits_last(model, streams)[:, 0].reshape(n, V, -1)
            ok, logit, lp = _answer_stats(lg, ans)
            out_ok[:, unit_idx], out_logit[:, unit_idx], out_lp[:, unit_idx] = ok, logit, lp
            if bar is not None:
                bar.update(n * V)
        ko_ok.append(out_ok)
        ko_logit.append(out_logit)
        ko_lp.append(out_lp)
    return KnockoutOutputs(torch.cat(clean_ok), torch.cat(ko_ok), torch.cat(clean_logit), torch.cat(ko_logit),
                           torch.cat(clean_lp), torch.cat(ko_lp))


FAST_ENGINES = {"compressed": _fast_knockouts, "deepseek_v4": _fast_knockouts_deepseek_v4}
